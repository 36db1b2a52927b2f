/* The seed experiment (DESIGN.md, seed/): a chain of dependent matrix
 * products queued on an engine thread's own stream, then (a) the bare clear
 * that drains only the default stream and (b) sl_sync_and_clear_cache on the
 * engine stream. Shared by `sluice bench memsync` and tests/test_seed.c. */
#ifndef SLUICE_BENCH_SEED_H
#define SLUICE_BENCH_SEED_H

#include <stdbool.h>
#include <stdint.h>

#include "sluice/rt.h"

#define SL_SEED_MAX_TRIALS 32

typedef struct sl_seed_trial {
  double bare_return_ms;     /* how long the bare clear took to return */
  double bare_inflight_ms;   /* engine work still running after it */
  double owning_return_ms;   /* how long sl_sync_and_clear_cache blocked */
  double owning_inflight_ms; /* work in flight at that clear */
  uint64_t bare_inflight_bytes;
  uint64_t owning_inflight_bytes;
  uint64_t bare_pending_tasks; /* engine tasks pending as the clear returned */
  uint64_t owning_pending_tasks;
  uint64_t owning_pending_before; /* engine tasks queued as the clear began */
} sl_seed_trial;

typedef struct sl_seed_result {
  sl_device_kind kind;
  int n;           /* matrix size */
  int chain_len;   /* products in the chain */
  double chain_ms; /* measured time of one chain, synchronously */
  int trials;
  sl_seed_trial t[SL_SEED_MAX_TRIALS];
  double idle_clear_us; /* median sl_sync_and_clear_cache on idle streams */
  /* the three streams, seen from the engine thread */
  uint32_t engine_stream_id, generation_stream_id, default_stream_id;
  char engine_stream[48], generation_stream[48], default_stream[48];
  bool streams_distinct;
  bool thread_streams_cleared; /* no stream left after the engine's exit */
  uint64_t clears;             /* clears counted by the allocator */
} sl_seed_result;

/* Runs the experiment on device `kind` (index 0) from a new engine thread.
 * `target_chain_ms` sizes the chain (about 70 ms in the seed). Returns
 * SL_ERR_NO_DEVICE / SL_ERR_UNSUPPORTED when the device is missing. */
sl_status sl_seed_run(sl_device_kind kind, int trials, double target_chain_ms,
                      int idle_iters, sl_seed_result *out);

#endif
