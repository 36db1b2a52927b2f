/* The CUDA backend of rt: streams, events, the allocator, the seed experiment
 * and the fatal-error path (I6), on a real GPU.
 *
 * Skips (exit 77) when sluice was built without CUDA or when no CUDA device
 * can be opened (no GPU, no driver); it touches CUDA only through
 * sl_device_get before deciding. `--debug` runs with runtime debug mode (I8)
 * on: released memory is poisoned and quarantined instead of cached. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>

#include "harness.h"
#include "seed.h"
#include "sluice/alloc.h"
#include "sluice/kern.h"
#include "sluice/memsync.h"
#include "sluice/rt.h"
#include "sluice/util.h"

#ifdef SLUICE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "rt/cuda/cuda_hooks.h"

static sl_device_t *g_dev;
static bool g_debug;

/* ---- helpers
 * ------------------------------------------------------------------ */

typedef struct spin_arg {
  sl_buf_t *b; /* may be NULL */
  float value;
  double ms;
} spin_arg;

static sl_status spin_task(const sl_task_ctx *ctx, void *p) {
  spin_arg *a = p;
  float *dst = a->b ? sl_buf_ptr(a->b) : NULL;
  size_t n = a->b ? sl_buf_size(a->b) / sizeof(float) : 0;
  return sl__cuda_test_spin_fill(ctx->native, dst, n, a->value, a->ms);
}

/* Queues `ms` of device time on s, then fills b (optional) with value. */
static sl_status spin(sl_stream_t *s, sl_buf_t *b, float value, double ms,
                      uint64_t *seq) {
  spin_arg a = {b, value, ms};
  return sl_stream_submit(s, spin_task, &a, sizeof a, b ? &b : NULL, b ? 1 : 0,
                          seq);
}

static double ms_since(uint64_t t0) {
  return sl_ns_to_ms(sl_now_ns() - t0);
}

static bool all_equal(const float *v, size_t n, float x) {
  for (size_t i = 0; i < n; i++)
    if (v[i] != x)
      return false;
  return true;
}

/* ---- streams
 * -------------------------------------------------------------------- */

static void test_streams(void) {
  sl_stream_t *def = sl_device_default_stream(g_dev);
  sl_stream_t *gen = sl_generation_stream(g_dev);
  sl_stream_t *eng = sl_thread_stream(g_dev);
  CHECK(eng != NULL);
  if (!eng)
    return;
  CHECK(def != gen && def != eng && gen != eng);
  CHECK(sl_stream_id(def) != sl_stream_id(gen));
  CHECK(sl_stream_id(def) != sl_stream_id(eng));
  CHECK(sl_stream_id(gen) != sl_stream_id(eng));
  CHECK(sl_thread_stream(g_dev) == eng); /* one per thread */

  cudaStream_t nd = sl_stream_native(def), ng = sl_stream_native(gen),
               ne = sl_stream_native(eng);
  CHECK(nd == cudaStreamLegacy);
  CHECK(ng != nd && ne != nd && ng != ne);
  unsigned flags = 0;
  CHECK(cudaStreamGetFlags(ne, &flags) == cudaSuccess);
  CHECK_MSG(flags & cudaStreamNonBlocking, "engine stream flags %u", flags);
  flags = 0;
  CHECK(cudaStreamGetFlags(ng, &flags) == cudaSuccess);
  CHECK_MSG(flags & cudaStreamNonBlocking, "generation stream flags %u", flags);

  /* draining the default stream leaves the engine's work running */
  uint64_t seq = 0;
  CHECK_OK(spin(eng, NULL, 0, 300.0, &seq));
  uint64_t t0 = sl_now_ns();
  CHECK_OK(sl_stream_sync(def));
  double def_ms = ms_since(t0);
  sl_stream_pending q = sl_stream_query(eng);
  fprintf(stderr, "default-stream drain: %.3f ms, engine tasks pending %llu\n",
          def_ms, (unsigned long long)q.tasks);
  CHECK_MSG(def_ms < 30.0, "%.3f ms", def_ms);
  CHECK_EQ_INT(q.tasks, 1);
  CHECK(!sl_stream_done(eng, seq));
  /* and draining the generation stream does not drain it either */
  CHECK_OK(sl_stream_sync(gen));
  CHECK(!sl_stream_done(eng, seq));
  CHECK_OK(sl_stream_sync(eng));
  double eng_ms = ms_since(t0);
  CHECK_MSG(eng_ms > 250.0, "%.1f ms", eng_ms);
  CHECK(sl_stream_done(eng, seq));
  CHECK_EQ_INT(sl_stream_query(eng).tasks, 0);
}

/* ---- sgemm against a CPU reference
 * --------------------------------------------- */

static void fill_random(float *v, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v[i] = (float)(x >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
  }
}

/* Runs one m×k · k×n product on s and returns the max relative error against
 * a double-precision reference, or -1 on a failure. */
static double sgemm_check(sl_stream_t *s, int m, int n, int k, float alpha,
                          uint64_t seed) {
  size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
  float *A = sl_malloc(na * sizeof *A), *B = sl_malloc(nb * sizeof *B),
        *C = sl_malloc(nc * sizeof *C);
  sl_buf_t *dA = NULL, *dB = NULL, *dC = NULL;
  double err = -1;
  if (!A || !B || !C)
    goto out;
  fill_random(A, na, seed);
  fill_random(B, nb, seed + 1);
  if (sl_buf_alloc(s, na * 4, &dA) != SL_OK ||
      sl_buf_alloc(s, nb * 4, &dB) != SL_OK ||
      sl_buf_alloc(s, nc * 4, &dC) != SL_OK)
    goto out;
  if (sl_buf_write(dA, 0, A, na * 4) != SL_OK ||
      sl_buf_write(dB, 0, B, nb * 4) != SL_OK ||
      sl_kern_sgemm(s, dA, dB, dC, m, n, k, alpha) != SL_OK ||
      sl_buf_read(dC, 0, C, nc * 4) != SL_OK)
    goto out;
  err = 0;
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double ref = 0, mag = 0;
      for (int kk = 0; kk < k; kk++) {
        double t = (double)A[(size_t)i * k + kk] * B[(size_t)kk * n + j];
        ref += t;
        mag += fabs(t);
      }
      ref *= alpha;
      double e = fabs(C[(size_t)i * n + j] - ref) / (fabs(alpha) * mag + 1e-30);
      if (e > err)
        err = e;
    }
out:
  sl_buf_release(dA);
  sl_buf_release(dB);
  sl_buf_release(dC);
  sl_free(A);
  sl_free(B);
  sl_free(C);
  return err;
}

static void test_sgemm(void) {
  sl_stream_t *s = sl_thread_stream(g_dev);
  static const int shapes[][3] = {
      {1, 1, 1}, {37, 53, 29}, {128, 64, 256}, {5, 300, 17}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    double e = sgemm_check(s, shapes[i][0], shapes[i][1], shapes[i][2],
                           i & 1 ? -0.5f : 1.0f, 7 + i);
    fprintf(stderr, "sgemm %dx%dx%d: max rel err %.2e\n", shapes[i][0],
            shapes[i][1], shapes[i][2], e);
    CHECK_MSG(e >= 0 && e < 1e-5, "shape %zu err %g", i, e);
  }
  /* bad shapes are refused before any device work */
  sl_buf_t *b;
  CHECK_OK(sl_buf_alloc(s, 64, &b));
  CHECK_EQ_INT(sl_kern_sgemm(s, b, b, b, 0, 4, 4, 1.0f), SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kern_sgemm(s, b, b, b, 8, 8, 8, 1.0f), SL_ERR_RANGE);
  sl_buf_release(b);
  CHECK_OK(sl_sync_and_clear_cache(s));
}

typedef struct worker {
  int id;
  double worst; /* max rel err seen, or -1 on a failure */
  uint32_t stream_id;
} worker;

static void *sgemm_worker(void *p) {
  worker *w = p;
  sl_stream_t *s = sl_thread_stream(g_dev);
  w->worst = s ? 0 : -1;
  w->stream_id = s ? sl_stream_id(s) : 0;
  for (int it = 0; it < 10 && w->worst >= 0; it++) {
    double e = sgemm_check(s, 64 + w->id, 48, 96, 1.0f + (float)it,
                           (uint64_t)(w->id * 100 + it));
    if (e < 0 || e > w->worst)
      w->worst = e;
  }
  if (s)
    sl_sync_and_clear_cache(s);
  sl_clear_thread_streams(); /* I5 */
  return NULL;
}

/* Several engine threads, each on its own stream with its own cuBLAS
 * handle, at once; their streams are gone after they exit. */
static void test_sgemm_threads(void) {
  enum { N = 4 };
  int before = sl_device_stream_count(g_dev);
  pthread_t th[N];
  worker w[N];
  for (int i = 0; i < N; i++) {
    w[i] = (worker){.id = i};
    CHECK(pthread_create(&th[i], NULL, sgemm_worker, &w[i]) == 0);
  }
  for (int i = 0; i < N; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < N; i++) {
    CHECK_MSG(w[i].worst >= 0 && w[i].worst < 1e-5, "thread %d err %g", i,
              w[i].worst);
    for (int j = 0; j < i; j++)
      CHECK(w[i].stream_id != w[j].stream_id);
  }
  CHECK_EQ_INT(sl_device_stream_count(g_dev), before);
}

/* ---- the allocator on CUDA
 * -------------------------------------------------------- */

static void test_allocator(void) {
  CHECK_OK(sl_drain_all_and_clear_cache(g_dev));
  sl_stream_t *A, *B;
  CHECK_OK(sl_stream_create(g_dev, "alloc-a", &A));
  CHECK_OK(sl_stream_create(g_dev, "alloc-b", &B));
  const size_t bytes = 1u << 20;

  sl_buf_t *b;
  CHECK_OK(sl_buf_alloc(A, bytes, &b));
  void *old_ptr = sl_buf_ptr(b);
  CHECK(sl_buf_owner(b) == A);
  CHECK(sl_footprint_bytes(g_dev) >= bytes);

  /* a use on B, still running when b is released */
  uint64_t seq;
  CHECK_OK(spin(B, b, 1.0f, 300.0, &seq));
  sl_alloc_stats s0 = sl_alloc_get_stats(g_dev);
  sl_buf_release(b);
  sl_alloc_collect(g_dev);
  sl_alloc_stats s1 = sl_alloc_get_stats(g_dev);
  CHECK(!sl_stream_done(B, seq)); /* precondition for what follows */
  CHECK_EQ_INT(s1.retiring - s0.retiring, bytes);
  CHECK_EQ_INT(s1.cache, s0.cache);

  /* RETIRING memory is not reused */
  sl_buf_t *b2;
  CHECK_OK(sl_buf_alloc(A, bytes, &b2));
  CHECK(sl_buf_ptr(b2) != old_ptr);

  /* a clear meanwhile frees nothing in use and sees the work in flight,
   * attributed to B (whose work it is), with nothing submitted to B */
  uint64_t b_submitted = sl_stream_query(B).submitted;
  CHECK_OK(sl_sync_and_clear_cache(A));
  sl_alloc_stats s2 = sl_alloc_get_stats(g_dev);
  CHECK_EQ_INT(s2.retiring, s1.retiring);
  CHECK_EQ_INT(s2.inflight_bytes_last, 0); /* nothing of A's */
  CHECK_EQ_INT(sl_stream_query(B).submitted, b_submitted);
  sl_stream_evidence evb = sl_stream_clear_evidence(B);
  CHECK_MSG(evb.others.bytes_last >= bytes, "%llu",
            (unsigned long long)evb.others.bytes_last);

  /* once B completes, b becomes CACHED (debug: quarantined) */
  CHECK_OK(sl_stream_sync(B));
  /* B's watch was stamped as it completed: about 300 ms were in flight */
  sl_alloc_stats s3 = sl_alloc_get_stats(g_dev);
  evb = sl_stream_clear_evidence(B);
  fprintf(stderr, "in flight at the clear (B's work): %.1f ms, %llu bytes\n",
          evb.others.ms_last, (unsigned long long)evb.others.bytes_last);
  CHECK_MSG(evb.others.ms_last > 150.0, "%.1f ms", evb.others.ms_last);
  sl_alloc_collect(g_dev);
  s3 = sl_alloc_get_stats(g_dev);
  CHECK_EQ_INT(s3.retiring, s0.retiring);
  if (!g_debug) {
    CHECK_EQ_INT(s3.cache - s2.cache, bytes);
    /* and is handed out again */
    sl_buf_t *b3;
    CHECK_OK(sl_buf_alloc(B, bytes, &b3));
    sl_alloc_stats s4 = sl_alloc_get_stats(g_dev);
    CHECK_EQ_INT(s4.cache_hits - s3.cache_hits, 1);
    CHECK(sl_buf_ptr(b3) == old_ptr);
    float v[4];
    CHECK_OK(sl_buf_read(b3, 0, v, sizeof v)); /* B's fill landed */
    CHECK(all_equal(v, 4, 1.0f));
    sl_buf_release(b3);
  }

  /* the memory limit */
  sl_alloc_stats s5 = sl_alloc_get_stats(g_dev);
  sl_alloc_set_limit(g_dev, s5.active + s5.retiring + bytes / 2);
  sl_buf_t *big = NULL;
  CHECK_EQ_INT(sl_buf_alloc(A, bytes, &big), SL_ERR_MEMORY_LIMIT);
  CHECK(big == NULL);
  CHECK_EQ_INT(sl_alloc_get_stats(g_dev).limit_failures - s5.limit_failures, 1);
  sl_alloc_set_limit(g_dev, 0);

  /* write / read round trip */
  float h[256], r[256];
  for (int i = 0; i < 256; i++)
    h[i] = (float)i * 0.25f;
  CHECK_OK(sl_buf_write(b2, 4096, h, sizeof h));
  CHECK_OK(sl_buf_read(b2, 4096, r, sizeof r));
  CHECK(memcmp(h, r, sizeof h) == 0);
  CHECK_EQ_INT(sl_buf_read(b2, bytes - 4, r, 8), SL_ERR_INVALID_ARG);

  sl_buf_release(b2);
  sl_stream_destroy(A);
  sl_stream_destroy(B);
  CHECK_OK(sl_drain_all_and_clear_cache(g_dev));
  sl_alloc_stats s6 = sl_alloc_get_stats(g_dev);
  CHECK_EQ_INT(s6.cache, 0);
  CHECK_EQ_INT(s6.retiring, 0);
}

/* ---- events across two streams
 * ------------------------------------------------- */

static void test_events(void) {
  sl_stream_t *A, *B;
  CHECK_OK(sl_stream_create(g_dev, "ev-a", &A));
  CHECK_OK(sl_stream_create(g_dev, "ev-b", &B));
  enum { N = 1 << 16 };
  float *h = sl_calloc(N, sizeof *h);
  sl_buf_t *buf;
  CHECK_OK(sl_buf_alloc(B, N * sizeof(float), &buf));
  CHECK_OK(sl_buf_write(buf, 0, h, N * sizeof(float))); /* zeros */

  /* A: 300 ms of work, then buf := 7 */
  CHECK_OK(spin(A, buf, 7.0f, 300.0, NULL));
  sl_event ev;
  CHECK_OK(sl_event_record(A, &ev));
  CHECK(!sl_event_done(ev));

  /* control: B, unordered with A, reads the old contents at once */
  uint64_t t0 = sl_now_ns();
  CHECK_OK(sl_buf_read(buf, 0, h, N * sizeof(float)));
  double ctl_ms = ms_since(t0);
  CHECK_MSG(all_equal(h, N, 0.0f), "h[0] = %g", h[0]);
  CHECK_MSG(ctl_ms < 100.0, "%.1f ms", ctl_ms);
  CHECK(!sl_event_done(ev));

  /* B waits for A's event: its read sees A's result */
  CHECK_OK(sl_stream_wait_event(B, ev));
  CHECK_OK(sl_buf_read(buf, 0, h, N * sizeof(float)));
  double ord_ms = ms_since(t0);
  CHECK_MSG(all_equal(h, N, 7.0f), "h[0] = %g", h[0]);
  CHECK_MSG(ord_ms > 200.0, "%.1f ms", ord_ms);
  CHECK(sl_event_done(ev));

  /* an event already done costs nothing and orders nothing */
  CHECK_OK(sl_stream_wait_event(B, ev));
  /* a wrong pairing is refused */
  sl_event cpu_ev;
  CHECK_OK(sl_event_record(sl_device_default_stream(sl_cpu_device()), &cpu_ev));
  CHECK_EQ_INT(sl_stream_wait_event(B, cpu_ev), SL_ERR_INVALID_ARG);

  sl_buf_release(buf);
  sl_free(h);
  sl_stream_destroy(A);
  sl_stream_destroy(B);
}

/* ---- thread streams (I5)
 * ---------------------------------------------------------- */

static void *busy_thread(void *p) {
  sl_stream_t *s = sl_thread_stream(g_dev);
  *(int *)p = s && spin(s, NULL, 0, 50.0, NULL) == SL_OK;
  sl_clear_thread_streams(); /* drains the 50 ms first */
  return NULL;
}

static void test_clear_thread_streams(void) {
  int before = sl_device_stream_count(g_dev);
  int ok = 0;
  pthread_t th;
  CHECK(pthread_create(&th, NULL, busy_thread, &ok) == 0);
  pthread_join(th, NULL);
  CHECK(ok);
  CHECK_EQ_INT(sl_device_stream_count(g_dev), before);

  /* this thread's own stream: made once, gone after the clear */
  sl_stream_t *mine = sl_thread_stream(g_dev);
  CHECK(mine != NULL);
  int with = sl_device_stream_count(g_dev);
  CHECK_OK(spin(mine, NULL, 0, 20.0, NULL));
  sl_clear_thread_streams();
  CHECK_EQ_INT(sl_device_stream_count(g_dev), with - 1);
  sl_stream_t *again = sl_thread_stream(g_dev);
  CHECK(again != NULL);
  CHECK_EQ_INT(sl_device_stream_count(g_dev), with);
  CHECK_EQ_INT(sl_stream_query(again).submitted, 0);
}

/* ---- the seed experiment
 * --------------------------------------------------------- */

/* Informational: does cudaFree wait for work queued on a non-blocking stream?
 * (If it does, a clear that actually frees memory waits for the whole
 * device, and the seed's bare clear reproduces the bug only with an empty
 * cache.) */
typedef struct alloc_job {
  sl_stream_t *s;
  _Atomic int go;
  double ms;
  sl_status st;
} alloc_job;

static void *alloc_body(void *p) {
  alloc_job *j = p;
  while (!atomic_load(&j->go))
    ;
  uint64_t t0 = sl_now_ns();
  sl_buf_t *b;
  j->st = sl_buf_alloc(j->s, 3u << 20, &b); /* a size not in the cache */
  j->ms = ms_since(t0);
  if (j->st == SL_OK)
    sl_buf_release(b);
  return NULL;
}

/* cudaFree waits for the whole device (and a concurrent cudaMalloc waits
 * with it). sluice's memory is stream-ordered and released outside the
 * allocator's mutex, so a clear that frees while another engine's work runs
 * neither waits for that work nor stalls a third thread's allocation. */
static void test_cudafree_outside_allocator_lock(void) {
  sl_stream_t *busy, *cl, *other;
  CHECK_OK(sl_stream_create(g_dev, "busy", &busy));
  CHECK_OK(sl_stream_create(g_dev, "clearer", &cl));
  CHECK_OK(sl_stream_create(g_dev, "allocator", &other));
  /* the premise: cudaFree with work queued waits for it */
  void *p = NULL;
  CHECK(cudaMalloc(&p, 1 << 20) == cudaSuccess);
  CHECK_OK(spin(busy, NULL, 0, 200.0, NULL));
  uint64_t t0 = sl_now_ns();
  CHECK(cudaFree(p) == cudaSuccess);
  double free_ms = ms_since(t0);
  fprintf(stderr, "cudaFree with 200 ms queued elsewhere: %.1f ms\n", free_ms);
  CHECK_MSG(free_ms > 100.0, "cudaFree returned after %.1f ms", free_ms);
  /* a cached buffer for the clear to free, 300 ms of work on `busy` */
  sl_buf_t *c;
  CHECK_OK(sl_buf_alloc(cl, 5u << 20, &c));
  sl_buf_release(c);
  CHECK_OK(spin(busy, NULL, 0, 300.0, NULL));
  uint64_t released0 = sl_alloc_get_stats(g_dev).bytes_released;
  alloc_job j = {other, 0, 0, SL_OK};
  pthread_t th;
  pthread_create(&th, NULL, alloc_body, &j);
  t0 = sl_now_ns();
  atomic_store(&j.go, 1);
  CHECK_OK(sl_sync_and_clear_cache(cl)); /* frees c; `busy` is not ours */
  double clear_ms = ms_since(t0);
  pthread_join(th, NULL);
  CHECK_OK(j.st);
  fprintf(stderr, "clear %.1f ms; a concurrent allocation %.1f ms\n", clear_ms,
          j.ms);
  CHECK_MSG(clear_ms < 150.0,
            "the clear waited %.1f ms for another "
            "stream's work",
            clear_ms);
  CHECK_MSG(j.ms < 150.0, "the allocation waited %.1f ms", j.ms);
  CHECK(sl_stream_query(busy).tasks > 0); /* `busy` was still running */
  /* and it did free c (the 3 MiB of the other thread may be cached now) */
  CHECK(sl_alloc_get_stats(g_dev).bytes_released - released0 >= (5u << 20));
  CHECK_OK(sl_stream_sync(busy));
  sl_stream_destroy(busy);
  sl_stream_destroy(cl);
  sl_stream_destroy(other);
}

static void test_seed_cuda(void) {
  static sl_seed_result r;
  /* start with an empty cache: freeing it would wait for the device */
  CHECK_OK(sl_drain_all_and_clear_cache(g_dev));
  CHECK_OK(sl_seed_run(SL_DEVICE_CUDA, 3, 70.0, 1000, &r));
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
    CHECK_MSG(t->bare_return_ms < 0.2 * r.chain_ms, "bare %.3f ms",
              t->bare_return_ms);
    CHECK_MSG(t->bare_inflight_ms > 0.5 * r.chain_ms, "in flight %.1f ms",
              t->bare_inflight_ms);
    CHECK(t->bare_inflight_bytes > 0);
    CHECK_MSG(t->owning_return_ms > 0.5 * r.chain_ms, "owning %.1f ms",
              t->owning_return_ms);
    CHECK(t->owning_inflight_ms == 0.0);
    CHECK_EQ_INT(t->owning_inflight_bytes, 0);
  }
  fprintf(stderr,
          "idle sl_sync_and_clear_cache: %.2f us (median; goal <= 50)\n",
          r.idle_clear_us);
  CHECK(r.idle_clear_us > 0);
}

/* ---- I6: a sticky device error ends the process
 * ------------------------------- */

static sl_status fault_task(const sl_task_ctx *ctx, void *arg) {
  return sl__cuda_test_fault_launch(ctx->native);
}

static void child_fault(void) {
  sl_device_t *dev;
  if (sl_device_get(SL_DEVICE_CUDA, 0, &dev) != SL_OK)
    exit(2);
  sl_stream_t *s = sl_thread_stream(dev);
  if (!s)
    exit(3);
  sl_stream_submit(s, fault_task, NULL, 0, NULL, 0, NULL);
  sl_stream_sync(s); /* must not return */
  fprintf(stderr, "child: the sync returned after an illegal address\n");
  exit(4);
}

static void test_fatal(void) {
  int ws = 0;
  char err[4096];
  uint64_t t0 = sl_now_ns();
  CHECK(sl_test_spawn_child("fault", &ws, err, sizeof err) == 0);
  fprintf(stderr, "child (%.0f ms) said: %s", ms_since(t0), err);
  CHECK_MSG(WIFEXITED(ws), "wait status %#x", ws);
  if (WIFEXITED(ws))
    CHECK_EQ_INT(WEXITSTATUS(ws), SL_EXIT_DEVICE_FATAL);
  CHECK(strstr(err, "FATAL device error") != NULL);
  CHECK(strstr(err, "cudaError") != NULL); /* the CUDA error is named */
}
#endif /* SLUICE_HAVE_CUDA */

int main(int argc, char **argv) {
#ifndef SLUICE_HAVE_CUDA
  (void)sl_test_current;
  fprintf(stderr, "skip: sluice was built without the CUDA backend\n");
  return 77;
#else
  SL_TEST_CHILDREN(argc, argv, {"fault", child_fault});
  g_debug = argc > 1 && strcmp(argv[1], "--debug") == 0;
  if (g_debug)
    sl_rt_set_debug(true);
  sl_status st = sl_device_get(SL_DEVICE_CUDA, 0, &g_dev);
  if (st != SL_OK) {
    fprintf(stderr, "skip: no CUDA device (%s)\n", sl_status_str(st));
    return 77;
  }
  RUN(test_streams);
  RUN(test_sgemm);
  RUN(test_sgemm_threads);
  RUN(test_allocator);
  RUN(test_events);
  RUN(test_clear_thread_streams);
  if (!g_debug) {
    RUN(test_cudafree_outside_allocator_lock);
    RUN(test_seed_cuda);
  }
  RUN(test_fatal);
  sl_clear_thread_streams();
  sl_rt_shutdown();
  return sl_test_finish();
#endif
}
