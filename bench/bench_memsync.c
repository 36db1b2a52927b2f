/* `sluice bench memsync`: the seed experiment as a benchmark; prints JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "seed.h"
#include "sluice/flags.h"
#include "sluice/util.h"

/* What `sluice bench memsync`'s command line says. */
typedef struct memsync_opts {
  const char *backend;
  int trials, idle;
  double chain_ms;
} memsync_opts;

#define AT(f) SL_FLAG_AT(memsync_opts, f)
static const sl_flag memsync_flags[] = {
    {SL_FLAG_CHOICE, "--backend", "cpu|cuda", AT(backend),
     .choices = "cpu|cuda", .help = "where the experiment runs"},
    {SL_FLAG_INT, "--trials", "N", AT(trials), 1, SL_SEED_MAX_TRIALS,
     .help = "trials of each scenario"},
    {SL_FLAG_DOUBLE, "--chain-ms", "MS", AT(chain_ms), 0.001, 9999.999,
     .help = "the length of the queued chain of work"},
    {SL_FLAG_INT, "--idle-iters", "N", AT(idle), 1, 1 << 30,
     .help = "clears on an idle stream"},
};
#undef AT

static const char memsync_head[] =
    "usage: sluice bench memsync [options]\n"
    "  the seed experiment (a cache clear while work is queued) as a\n"
    "  benchmark; prints JSON.\n";

int sl_bench_memsync_main(int argc, char **argv) {
  memsync_opts o = {
      .backend = "cpu", .trials = 3, .idle = 2000, .chain_ms = 70.0};
  bool help;
  int prc = sl_flags_parse("bench memsync", SL_FLAGS(memsync_flags), &o, argc,
                           argv, memsync_head, NULL, &help);
  if (prc || help)
    return prc;
  sl_device_kind kind =
      !strcmp(o.backend, "cuda") ? SL_DEVICE_CUDA : SL_DEVICE_CPU;
  int trials = o.trials, idle = o.idle;
  double chain_ms = o.chain_ms;
  sl_seed_result r;
  sl_status st = sl_seed_run(kind, trials, chain_ms, idle, &r);
  if (st != SL_OK) {
    fprintf(stderr, "sluice bench memsync: %s backend: %s\n",
            kind == SL_DEVICE_CUDA ? "cuda" : "cpu", sl_status_str(st));
    return 1;
  }
  printf("{\"bench\": \"memsync\", \"backend\": \"%s\", \"chain_ms\": %.3f, "
         "\"chain_len\": %d, \"matrix_n\": %d,\n",
         kind == SL_DEVICE_CUDA ? "cuda" : "cpu", r.chain_ms, r.chain_len, r.n);
  printf(" \"streams\": {\"engine\": \"%s\", \"generation\": \"%s\", "
         "\"default\": \"%s\", \"distinct\": %s},\n",
         r.engine_stream, r.generation_stream, r.default_stream,
         r.streams_distinct ? "true" : "false");
  printf(" \"trials\": [\n");
  for (int i = 0; i < r.trials; i++) {
    sl_seed_trial *t = &r.t[i];
    printf("  {\"bare_return_ms\": %.3f, \"bare_inflight_ms\": %.3f, "
           "\"bare_inflight_bytes\": %llu, \"owning_return_ms\": %.3f, "
           "\"owning_inflight_ms\": %.3f, \"owning_inflight_bytes\": %llu, "
           "\"bare_pending_tasks\": %llu, \"owning_pending_tasks\": %llu}%s\n",
           t->bare_return_ms, t->bare_inflight_ms,
           (unsigned long long)t->bare_inflight_bytes, t->owning_return_ms,
           t->owning_inflight_ms, (unsigned long long)t->owning_inflight_bytes,
           (unsigned long long)t->bare_pending_tasks,
           (unsigned long long)t->owning_pending_tasks,
           i + 1 < r.trials ? "," : "");
  }
  printf(" ],\n \"idle_clear_us\": %.3f, \"idle_iters\": %d, "
         "\"thread_streams_cleared\": %s}\n",
         r.idle_clear_us, idle, r.thread_streams_cleared ? "true" : "false");
  return 0;
}
