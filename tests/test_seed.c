/* The seed experiment on the CPU backend (DESIGN.md; seed/): a ~70 ms chain
 * of dependent matrix products on the engine thread's own stream.
 *   (a) the bare clear (default stream only) returns at once and leaves the
 *       chain in flight;
 *   (b) sl_sync_and_clear_cache(engine stream) blocks for the chain and leaves
 *       0.0 ms in flight.
 * Three trials. The engine, generation and default streams are distinct. */
#include "harness.h"
#include "seed.h"

static void test_seed_cpu(void) {
  sl_seed_result r;
  CHECK_OK(sl_seed_run(SL_DEVICE_CPU, 3, 70.0, 200, &r));
  fprintf(stderr, "chain: %d products of %dx%d, %.1f ms\n", r.chain_len, r.n,
          r.n, r.chain_ms);
  fprintf(stderr, "streams: engine %s, generation %s, default %s\n",
          r.engine_stream, r.generation_stream, r.default_stream);
  CHECK(r.streams_distinct);
  CHECK(r.thread_streams_cleared);
  CHECK_EQ_INT(r.trials, 3);
  CHECK(r.chain_ms > 10);
  for (int i = 0; i < r.trials; i++) {
    sl_seed_trial *t = &r.t[i];
    fprintf(stderr,
            "trial %d: bare returned %.3f ms, %.1f ms in flight (%llu B); "
            "owning blocked %.1f ms, %.3f ms in flight (%llu B)\n",
            i, t->bare_return_ms, t->bare_inflight_ms,
            (unsigned long long)t->bare_inflight_bytes, t->owning_return_ms,
            t->owning_inflight_ms,
            (unsigned long long)t->owning_inflight_bytes);
    /* (a) the bug, reproduced: the bare clear returned while the chain was
     * still queued on the engine stream, and the work ran on after it.
     * (Structural checks: the machine's speed varies, so no timing bound.) */
    CHECK_MSG(t->bare_pending_tasks > 0, "no engine work pending");
    CHECK_MSG(t->bare_inflight_ms > t->bare_return_ms,
              "in flight %.3f ms, returned after %.3f ms", t->bare_inflight_ms,
              t->bare_return_ms);
    CHECK(t->bare_inflight_bytes > 0);
    /* (b) the fix: blocks until the engine stream is empty; nothing in
     * flight at the clear */
    CHECK_EQ_INT(t->owning_pending_tasks, 0);
    /* it had the chain to wait for (not a no-op drain) */
    CHECK_MSG(t->owning_pending_before > 0, "nothing queued at the clear");
    CHECK(t->owning_inflight_ms == 0.0);
    CHECK_EQ_INT(t->owning_inflight_bytes, 0);
  }
  fprintf(stderr, "idle sl_sync_and_clear_cache: %.2f us (median)\n",
          r.idle_clear_us);
  CHECK(r.idle_clear_us > 0);
}

int main(void) {
  RUN(test_seed_cpu);
  sl_rt_shutdown();
  return sl_test_finish();
}
