/* Argument parsing shared by the subcommands. */
#include <errno.h>
#include <stdlib.h>

#include "cli.h"

bool sl_cli_parse_double(const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi))
    return false;
  *out = v;
  return true;
}
