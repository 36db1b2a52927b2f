/* Helpers shared by the bench subcommands. */
#include "bench.h"
#include "sluice/util.h"

bool sl_bench_parse_int(const char *s, int lo, int hi, int *out) {
  long v;
  if (!sl_parse_long(s, lo, hi, &v))
    return false;
  *out = (int)v;
  return true;
}
