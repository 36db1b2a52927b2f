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

#endif
