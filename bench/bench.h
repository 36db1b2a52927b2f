/* Entry points of `sluice bench <name>`; each returns a process exit code
 * and prints one JSON object on stdout. */
#ifndef SLUICE_BENCH_H
#define SLUICE_BENCH_H

#include <stdbool.h>

int sl_bench_memsync_main(int argc, char **argv);
int sl_bench_model_main(int argc, char **argv);
int sl_bench_prefix_main(int argc, char **argv);
int sl_bench_serve_main(int argc, char **argv);

#endif
