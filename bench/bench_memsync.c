/* `sluice bench memsync`: the seed experiment as a benchmark; prints JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "seed.h"
#include "sluice/util.h"

static void usage(void) {
  fprintf(stderr, "usage: sluice bench memsync [--backend cpu|cuda] "
                  "[--trials N] [--chain-ms MS] [--idle-iters N]\n");
}

int sl_bench_memsync_main(int argc, char **argv) {
  sl_device_kind kind = SL_DEVICE_CPU;
  int trials = 3, idle = 2000;
  double chain_ms = 70.0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--backend") == 0 && v) {
      if (strcmp(v, "cpu") == 0)
        kind = SL_DEVICE_CPU;
      else if (strcmp(v, "cuda") == 0)
        kind = SL_DEVICE_CUDA;
      else {
        fprintf(stderr, "sluice bench memsync: unknown backend '%s'\n", v);
        return 2;
      }
      i++;
    } else if (strcmp(a, "--trials") == 0 && v) {
      trials = atoi(v);
      i++;
    } else if (strcmp(a, "--chain-ms") == 0 && v) {
      chain_ms = atof(v);
      i++;
    } else if (strcmp(a, "--idle-iters") == 0 && v) {
      idle = atoi(v);
      i++;
    } else {
      usage();
      return 2;
    }
  }
  if (trials < 1 || trials > SL_SEED_MAX_TRIALS || idle < 1 ||
      !(chain_ms > 0 && chain_ms < 10000)) {
    fprintf(stderr,
            "sluice bench memsync: --trials must be 1..%d, "
            "--idle-iters >= 1, --chain-ms in (0, 10000)\n",
            SL_SEED_MAX_TRIALS);
    return 2;
  }
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
