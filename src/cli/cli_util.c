/* Argument parsing shared by the subcommands. */
#include <errno.h>
#include <stdio.h>
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

int sl_cli_no_value(const char *cmd, const char *opt) {
  fprintf(stderr, "sluice %s: %s needs a value\n", cmd, opt);
  return 2;
}

int sl_cli_bad_value(const char *cmd, const char *opt, const char *v) {
  fprintf(stderr, "sluice %s: bad value '%s' for %s\n", cmd, v, opt);
  return 2;
}
