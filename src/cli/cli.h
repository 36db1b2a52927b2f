/* Subcommands of the sluice binary; each returns a process exit code. */
#ifndef SLUICE_CLI_H
#define SLUICE_CLI_H

#include <stdbool.h>
#include <stddef.h>

#include "sluice/model.h"

int sl_cli_run_main(int argc, char **argv);
int sl_cli_tokenize_main(int argc, char **argv);
int sl_cli_serve_main(int argc, char **argv);
int sl_cli_models_main(int argc, char **argv);

/* Parse a whole decimal number within [lo, hi]; false on junk, overflow
 * or out of range (nothing stored then). Integers: sl_parse_long (util). */
bool sl_cli_parse_double(const char *s, double lo, double hi, double *out);

/* Print "sluice <cmd>: <opt> needs a value" and "sluice <cmd>: bad value
 * '<v>' for <opt>" to stderr; both return 2, the exit code of a usage
 * error. */
int sl_cli_no_value(const char *cmd, const char *opt);
int sl_cli_bad_value(const char *cmd, const char *opt, const char *v);

/* The two exits of a subcommand's option loop, for a loop with `a` (the
 * option), `v` (the argument after it, NULL at the end) and `i` (a's index
 * in argv) in scope; cmd names the subcommand ("run", "serve").
 * SL_CLI_NEED_VALUE returns 2 from the subcommand when a has no value, and
 * else steps i past it; SL_CLI_BAD_VALUE returns 2, v being no value for a. */
#define SL_CLI_NEED_VALUE(cmd)                                                 \
  do {                                                                         \
    if (!v)                                                                    \
      return sl_cli_no_value(cmd, a);                                          \
    i++;                                                                       \
  } while (0)
#define SL_CLI_BAD_VALUE(cmd) return sl_cli_bad_value(cmd, a, v)

#endif
