/* The unreleased-bytes estimator (I7) on synthetic footprint samples, the
 * guard formula, and the real CPU footprint. */
#include "harness.h"
#include "sluice/memsync.h"

#define MS 1000000ull
#define MB (1ull << 20)

static void test_steady_baseline_is_zero(void) {
  sl_unreleased_est e;
  sl_unreleased_init(&e, 0);
  CHECK_EQ_INT(e.window_ns, 10000 * MS);
  /* footprint = allocator bytes + a constant 50 MB of runtime overhead */
  for (int i = 0; i < 100; i++)
    CHECK_EQ_INT(sl_unreleased_update(&e, (uint64_t)i * 100 * MS,
                                      (uint64_t)(500 + i) * MB + 50 * MB,
                                      (uint64_t)(500 + i) * MB),
                 0);
  sl_unreleased_fini(&e);
}

static void test_release_lag(void) {
  sl_unreleased_est e;
  sl_unreleased_init(&e, 10000 * MS);
  uint64_t t = 0;
  for (; t < 2000 * MS; t += 100 * MS)
    sl_unreleased_update(&e, t, 1050 * MB, 1000 * MB);
  /* 300 MB freed; the OS keeps charging it for 300 ms */
  uint64_t u = sl_unreleased_update(&e, t, 1050 * MB, 700 * MB);
  CHECK_EQ_INT(u, 300 * MB);
  t += 100 * MS;
  CHECK_EQ_INT(sl_unreleased_update(&e, t, 1050 * MB, 700 * MB), 300 * MB);
  t += 100 * MS;
  CHECK_EQ_INT(sl_unreleased_update(&e, t, 900 * MB, 700 * MB), 150 * MB);
  t += 100 * MS;
  CHECK_EQ_INT(sl_unreleased_update(&e, t, 750 * MB, 700 * MB), 0);
  sl_unreleased_fini(&e);
}

static void test_spike(void) {
  sl_unreleased_est e;
  sl_unreleased_init(&e, 10000 * MS);
  uint64_t t = 0;
  for (int i = 0; i < 20; i++, t += 50 * MS)
    sl_unreleased_update(&e, t, 200 * MB, 100 * MB);
  /* one sample with a 1 GB spike in footprint only */
  CHECK_EQ_INT(sl_unreleased_update(&e, t, 1224 * MB, 100 * MB), 1024 * MB);
  t += 50 * MS;
  CHECK_EQ_INT(sl_unreleased_update(&e, t, 200 * MB, 100 * MB), 0);
  sl_unreleased_fini(&e);
}

static void test_window_forgets_old_minimum(void) {
  sl_unreleased_est e;
  sl_unreleased_init(&e, 10000 * MS);
  /* the residual was 10 MB, then the process grows a permanent 90 MB of
   * overhead: it reads as unreleased for 10 s, then the window forgets */
  sl_unreleased_update(&e, 0, 110 * MB, 100 * MB);
  uint64_t t = 1000 * MS;
  CHECK_EQ_INT(sl_unreleased_update(&e, t, 200 * MB, 100 * MB), 90 * MB);
  t = 9900 * MS;
  CHECK_EQ_INT(sl_unreleased_update(&e, t, 200 * MB, 100 * MB), 90 * MB);
  t = 10001 * MS;
  CHECK_EQ_INT(sl_unreleased_update(&e, t, 200 * MB, 100 * MB), 0);
  sl_unreleased_fini(&e);
}

static void test_many_samples_keep_exact_minimum(void) {
  sl_unreleased_est e;
  sl_unreleased_init(&e, 10000 * MS);
  /* 5000 samples at 1 ms, residual rising: the minimum (first sample) must
   * survive even though the ring holds far fewer entries */
  for (int i = 0; i < 5000; i++) {
    uint64_t u =
        sl_unreleased_update(&e, (uint64_t)i * MS, (uint64_t)(100 + i) * MB, 0);
    CHECK_EQ_INT(u, (uint64_t)i * MB);
  }
  sl_unreleased_fini(&e);
}

static void test_guard_formula(void) {
  CHECK_EQ_INT(sl_mem_guard_bytes(100, 50, 0), 100);
  CHECK_EQ_INT(sl_mem_guard_bytes(100, 300, 100), 200);
  CHECK_EQ_INT(sl_mem_guard_bytes(100, 300, 250), 100);
  CHECK_EQ_INT(sl_mem_guard_bytes(0, 10, 20), 0);
}

static void test_cpu_footprint(void) {
  uint64_t fp = sl_footprint_bytes(sl_cpu_device());
  CHECK(fp > 1 * MB);
  CHECK(fp < 64ull * 1024 * MB);
}

/* 1,200 rising samples over 12 s: the window's minimum is the sample 10 s
 * back, exactly (a fixed-size buffer of 256 got this wrong: 454 MB). */
static void test_long_rising_window_exact(void) {
  sl_unreleased_est e;
  sl_unreleased_init(&e, 10000 * MS);
  uint64_t u = 0;
  for (int i = 0; i < 1200; i++)
    u = sl_unreleased_update(&e, (uint64_t)i * 10 * MS,
                             (uint64_t)(2000 + i) * MB, 2000 * MB);
  /* at t = 11.99 s the window starts at 1.99 s: residual 199 MB */
  CHECK_EQ_INT(u, 1000 * MB);
  /* falling then rising again: the minimum moves with the window */
  for (int i = 0; i < 500; i++)
    u = sl_unreleased_update(&e, (uint64_t)(1200 + i) * 10 * MS,
                             (uint64_t)(3000 - 2 * i) * MB, 2000 * MB);
  CHECK_EQ_INT(u, 0);
  sl_unreleased_fini(&e);
}

int main(void) {
  RUN(test_steady_baseline_is_zero);
  RUN(test_release_lag);
  RUN(test_spike);
  RUN(test_window_forgets_old_minimum);
  RUN(test_many_samples_keep_exact_minimum);
  RUN(test_guard_formula);
  RUN(test_cpu_footprint);
  sl_rt_shutdown();
  RUN(test_long_rising_window_exact);
  return sl_test_finish();
}
