/* rt on the CPU backend: streams, events, the caching allocator, memsync,
 * thread streams, the store-worker race and a randomized stress test. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "sluice/alloc.h"
#include "sluice/memsync.h"
#include "sluice/rt.h"
#include "sluice/util.h"

static void sleep_ms(double ms) {
  struct timespec ts = {(time_t)(ms / 1000),
                        (long)((ms - (time_t)(ms / 1000) * 1000) * 1e6)};
  nanosleep(&ts, NULL);
}

/* ---- task helpers ---- */

typedef struct sleep_arg {
  double ms;
  _Atomic int *counter;
  int expect; /* counter value expected before this task */
  _Atomic int *order_errors;
} sleep_arg;

static sl_status sleep_task(const sl_task_ctx *ctx, void *p) {
  sleep_arg *a = p;
  if (a->ms > 0)
    sleep_ms(a->ms);
  if (a->counter) {
    int prev = atomic_fetch_add(a->counter, 1);
    if (a->order_errors && prev != a->expect)
      atomic_fetch_add(a->order_errors, 1);
  }
  return SL_OK;
}

typedef struct fill_arg {
  sl_buf_t *b;
  uint32_t value;
} fill_arg;

static sl_status fill_task(const sl_task_ctx *ctx, void *p) {
  fill_arg *a = p;
  uint32_t *d = sl_buf_ptr(a->b);
  size_t n = sl_buf_size(a->b) / 4;
  for (size_t i = 0; i < n; i++)
    d[i] = a->value + (uint32_t)i;
  return SL_OK;
}

typedef struct check_arg {
  sl_buf_t *b;
  uint32_t value;
  double delay_ms;
  _Atomic int *errors;
} check_arg;

static sl_status check_task(const sl_task_ctx *ctx, void *p) {
  check_arg *a = p;
  if (a->delay_ms > 0)
    sleep_ms(a->delay_ms);
  const uint32_t *d = sl_buf_ptr(a->b);
  size_t n = sl_buf_size(a->b) / 4;
  for (size_t i = 0; i < n; i++)
    if (d[i] != a->value + (uint32_t)i) {
      atomic_fetch_add(a->errors, 1);
      break;
    }
  return SL_OK;
}

/* ---- streams ---- */

static void test_three_streams_distinct(void) {
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *def = sl_device_default_stream(dev);
  sl_stream_t *gen = sl_generation_stream(dev);
  sl_stream_t *thr = sl_thread_stream(dev);
  CHECK(def && gen && thr);
  CHECK(def != gen && def != thr && gen != thr);
  CHECK(sl_stream_id(def) != sl_stream_id(thr));
  CHECK(sl_thread_stream(dev) == thr); /* one per thread, made once */
  /* draining the default stream does not drain the thread stream */
  sleep_arg s = {300, NULL, 0, NULL};
  uint64_t seq;
  CHECK_OK(sl_stream_submit(thr, sleep_task, &s, sizeof s, NULL, 0, &seq));
  uint64_t t0 = sl_now_ns();
  CHECK_OK(sl_stream_sync(def));
  CHECK(sl_ns_to_ms(sl_now_ns() - t0) < 150);
  CHECK(!sl_stream_done(thr, seq));
  CHECK(sl_stream_query(thr).tasks >= 1);
  CHECK_OK(sl_stream_sync(thr));
  CHECK(sl_stream_done(thr, seq));
  CHECK_EQ_INT(sl_stream_query(thr).tasks, 0);
  sl_clear_thread_streams();
}

static void test_in_order_and_timeline(void) {
  sl_stream_t *s;
  CHECK_OK(sl_stream_create(sl_cpu_device(), "order", &s));
  _Atomic int counter = 0, errs = 0;
  uint64_t last = 0;
  for (int i = 0; i < 200; i++) {
    sleep_arg a = {i % 50 == 0 ? 1.0 : 0.0, &counter, i, &errs};
    uint64_t seq;
    CHECK_OK(sl_stream_submit(s, sleep_task, &a, sizeof a, NULL, 0, &seq));
    CHECK_EQ_INT(seq, last + 1);
    last = seq;
  }
  sl_stream_pending p = sl_stream_query(s);
  CHECK_EQ_INT(p.submitted, 200);
  CHECK_OK(sl_stream_sync(s));
  CHECK_EQ_INT(atomic_load(&counter), 200);
  CHECK_EQ_INT(atomic_load(&errs), 0);
  CHECK_EQ_INT(sl_stream_query(s).completed, 200);
  CHECK(sl_stream_wait_seq(s, 201) == SL_ERR_INVALID_ARG);
  sl_stream_destroy(s);
}

static sl_status fail_task(const sl_task_ctx *ctx, void *p) {
  return SL_ERR_RANGE;
}

static void test_task_error_reported_once(void) {
  sl_stream_t *s;
  CHECK_OK(sl_stream_create(sl_cpu_device(), "err", &s));
  CHECK_OK(sl_stream_submit(s, fail_task, NULL, 0, NULL, 0, NULL));
  CHECK(sl_stream_sync(s) == SL_ERR_RANGE);
  CHECK_OK(sl_stream_sync(s));
  CHECK(sl_stream_submit(s, NULL, NULL, 0, NULL, 0, NULL) ==
        SL_ERR_INVALID_ARG);
  sl_stream_destroy(s);
}

static void test_events(void) {
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *a, *b;
  CHECK_OK(sl_stream_create(dev, "a", &a));
  CHECK_OK(sl_stream_create(dev, "b", &b));
  sl_buf_t *buf;
  CHECK_OK(sl_buf_alloc(a, 1 << 16, &buf));
  /* a: slow, then fill; b: waits on a's event, then checks the fill */
  sleep_arg s = {40, NULL, 0, NULL};
  CHECK_OK(sl_stream_submit(a, sleep_task, &s, sizeof s, NULL, 0, NULL));
  fill_arg f = {buf, 1234};
  CHECK_OK(sl_stream_submit(a, fill_task, &f, sizeof f, &buf, 1, NULL));
  sl_event ev;
  CHECK_OK(sl_event_record(a, &ev));
  CHECK(!sl_event_done(ev));
  CHECK_OK(sl_stream_wait_event(b, ev));
  _Atomic int errors = 0;
  check_arg c = {buf, 1234, 0, &errors};
  uint64_t seq;
  CHECK_OK(sl_stream_submit(b, check_task, &c, sizeof c, &buf, 1, &seq));
  CHECK_OK(sl_stream_wait_seq(b, seq));
  CHECK(sl_event_done(ev));
  CHECK_EQ_INT(atomic_load(&errors), 0);
  sl_buf_release(buf);
  sl_stream_destroy(a);
  sl_stream_destroy(b);
}

/* ---- allocator ---- */

static void test_alloc_retiring_until_uses_complete(void) {
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *own, *other;
  CHECK_OK(sl_stream_create(dev, "own", &own));
  CHECK_OK(sl_stream_create(dev, "other", &other));
  sl_alloc_stats s0 = sl_alloc_get_stats(dev);
  sl_buf_t *b;
  CHECK_OK(sl_buf_alloc(own, 100000, &b));
  CHECK(sl_buf_owner(b) == own);
  CHECK_EQ_INT(sl_buf_size(b), 100000);
  fill_arg f = {b, 7};
  CHECK_OK(sl_stream_submit(own, fill_task, &f, sizeof f, &b, 1, NULL));
  _Atomic int errors = 0;
  check_arg c = {b, 7, 400, &errors}; /* a slow use on another stream */
  sl_event ev;
  CHECK_OK(sl_event_record(own, &ev));
  CHECK_OK(sl_stream_wait_event(other, ev));
  CHECK_OK(sl_stream_submit(other, check_task, &c, sizeof c, &b, 1, NULL));
  sl_alloc_stats s1 = sl_alloc_get_stats(dev);
  CHECK(s1.active >= s0.active + 100000);
  sl_buf_release(b);
  sl_alloc_stats s2 = sl_alloc_get_stats(dev);
  CHECK_MSG(s2.retiring >= 100000, "retiring %llu",
            (unsigned long long)s2.retiring);
  /* the bare-minimum clear of this stream must not free it: the use on
   * `other` is still pending */
  sl_stream_evidence ev0 = sl_stream_clear_evidence(other);
  CHECK_OK(sl_sync_and_clear_cache(own));
  sl_alloc_stats s3 = sl_alloc_get_stats(dev);
  CHECK(s3.retiring >= 100000);
  /* the work in flight is `other`'s: attributed to it, not to this clear */
  CHECK_EQ_INT(s3.inflight_bytes_last, 0);
  sl_stream_evidence ev1 = sl_stream_clear_evidence(other);
  CHECK_EQ_INT(ev1.others.clears, ev0.others.clears + 1);
  CHECK_MSG(ev1.others.bytes_last >= 100000, "%llu",
            (unsigned long long)ev1.others.bytes_last);
  CHECK(ev1.others.tasks_last >= 1);
  CHECK_EQ_INT(sl_stream_clear_evidence(own).own.clears, 0);
  CHECK_OK(sl_stream_sync(other));
  /* stamped when `other` completed: about 400 ms after the clear */
  double ms = sl_stream_clear_evidence(other).others.ms_last;
  CHECK_MSG(ms > 200.0, "in flight %.1f ms", ms);
  CHECK_EQ_INT(atomic_load(&errors), 0);
  sl_alloc_collect(dev);
  sl_alloc_stats s4 = sl_alloc_get_stats(dev);
  CHECK_EQ_INT(s4.retiring, s0.retiring);
  /* now cached (or quarantined); a same-size allocation hits the cache */
  sl_buf_t *b2;
  CHECK_OK(sl_buf_alloc(own, 100000, &b2));
  if (!sl_rt_debug())
    CHECK_EQ_INT(sl_alloc_get_stats(dev).cache_hits, s4.cache_hits + 1);
  sl_buf_release(b2);
  CHECK_OK(sl_sync_and_clear_cache(own));
  sl_alloc_stats s5 = sl_alloc_get_stats(dev);
  CHECK_EQ_INT(s5.cache, 0);
  CHECK(s5.bytes_released > s0.bytes_released);
  CHECK_EQ_INT(s5.clears, s0.clears + 2);
  sl_stream_destroy(own);
  sl_stream_destroy(other);
}

static void test_alloc_limits(void) {
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *s = sl_generation_stream(dev);
  CHECK_OK(sl_drain_all_and_clear_cache(dev));
  sl_alloc_stats s0 = sl_alloc_get_stats(dev);
  sl_alloc_set_limit(dev, s0.active + s0.retiring + (8u << 20));
  sl_buf_t *a, *b, *c;
  CHECK_OK(sl_buf_alloc(s, 5u << 20, &a));
  CHECK(sl_buf_alloc(s, 5u << 20, &b) == SL_ERR_MEMORY_LIMIT);
  CHECK_EQ_INT(sl_alloc_get_stats(dev).limit_failures, s0.limit_failures + 1);
  CHECK(sl_buf_alloc(s, 0, &b) == SL_ERR_RANGE);
  CHECK(sl_buf_alloc(s, SIZE_MAX, &b) == SL_ERR_RANGE);
  sl_buf_release(a);
  /* the released 5 MiB sits in the cache; a different size must trim it */
  CHECK_OK(sl_buf_alloc(s, 7u << 20, &c));
  sl_alloc_stats s1 = sl_alloc_get_stats(dev);
  CHECK(s1.reserved <= s1.limit);
  sl_buf_release(c);
  sl_alloc_set_limit(dev, 0);
  /* cache limit */
  sl_alloc_set_cache_limit(dev, 1u << 20);
  sl_buf_t *bs[8];
  for (int i = 0; i < 8; i++)
    CHECK_OK(sl_buf_alloc(s, 300000 + (size_t)i * 70000, &bs[i]));
  for (int i = 0; i < 8; i++)
    sl_buf_release(bs[i]);
  sl_alloc_collect(dev);
  CHECK(sl_alloc_get_stats(dev).cache <= (1u << 20));
  sl_alloc_set_cache_limit(dev, 1ull << 30);
  CHECK_OK(sl_drain_all_and_clear_cache(dev));
}

static void test_peak_and_reserved(void) {
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *s = sl_generation_stream(dev);
  CHECK_OK(sl_drain_all_and_clear_cache(dev));
  sl_alloc_stats s0 = sl_alloc_get_stats(dev);
  sl_buf_t *b;
  CHECK_OK(sl_buf_alloc(s, 3u << 20, &b));
  sl_alloc_stats s1 = sl_alloc_get_stats(dev);
  CHECK(s1.peak >= s0.active + (3u << 20));
  CHECK(s1.reserved >= s1.active + s1.retiring + s1.cache);
  CHECK_EQ_INT(s1.allocs, s0.allocs + 1);
  sl_buf_release(b);
  CHECK_OK(sl_sync_and_clear_cache(s));
  CHECK_EQ_INT(sl_alloc_get_stats(dev).reserved,
               sl_alloc_get_stats(dev).active);
}

static void test_buf_read_write(void) {
  sl_stream_t *s = sl_generation_stream(sl_cpu_device());
  sl_buf_t *b;
  CHECK_OK(sl_buf_alloc(s, 1000, &b));
  char src[1000], dst[1000];
  for (int i = 0; i < 1000; i++)
    src[i] = (char)(i * 7);
  CHECK_OK(sl_buf_write(b, 0, src, 1000));
  CHECK_OK(sl_buf_read(b, 0, dst, 1000));
  CHECK(memcmp(src, dst, 1000) == 0);
  CHECK(sl_buf_read(b, 900, dst, 200) == SL_ERR_INVALID_ARG);
  sl_buf_release(b);
}

/* ---- memsync ---- */

/* A slow use of a buffer: what a clear must wait for. */
static void queue_slow_use(sl_stream_t *s, sl_buf_t *b, double ms,
                           uint64_t *seq) {
  check_arg c = {b, 11, ms, NULL};
  fill_arg f = {b, 11};
  static _Atomic int errors;
  c.errors = &errors;
  CHECK_OK(sl_stream_submit(s, fill_task, &f, sizeof f, &b, 1, NULL));
  CHECK_OK(sl_stream_submit(s, check_task, &c, sizeof c, &b, 1, seq));
}

static void test_owning_clear_drains_its_stream(void) {
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *eng = sl_thread_stream(dev);
  sl_buf_t *b;
  CHECK_OK(sl_buf_alloc(eng, 1u << 20, &b));
  uint64_t seq;
  queue_slow_use(eng, b, 100, &seq);
  CHECK(sl_stream_query(eng).tasks >= 1); /* real work is queued */
  uint64_t t0 = sl_now_ns();
  CHECK_OK(sl_sync_and_clear_cache(eng));
  double ms = sl_ns_to_ms(sl_now_ns() - t0);
  CHECK_MSG(ms >= 90, "returned after %.2f ms", ms);
  CHECK(sl_stream_done(eng, seq));
  /* nothing of the drained streams was in flight at the clear */
  sl_alloc_stats st = sl_alloc_get_stats(dev);
  CHECK_EQ_INT(st.inflight_bytes_last, 0);
  CHECK(st.inflight_ms_last == 0.0);
  CHECK_EQ_INT(sl_stream_clear_evidence(eng).own.clears, 0);
  sl_buf_release(b);
  sl_clear_thread_streams();
}

/* The clear drains the device default stream too (I3). */
static void test_clear_drains_default_stream(void) {
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *eng = sl_thread_stream(dev);
  sl_stream_t *def = sl_device_default_stream(dev);
  sl_buf_t *b;
  CHECK_OK(sl_buf_alloc(def, 1u << 20, &b));
  uint64_t seq;
  queue_slow_use(def, b, 150, &seq);
  CHECK(!sl_stream_done(def, seq));
  uint64_t own0 = sl_stream_clear_evidence(def).own.clears;
  CHECK_OK(sl_sync_and_clear_cache(eng));
  CHECK_MSG(sl_stream_done(def, seq),
            "the clear returned with default-stream work pending");
  CHECK_EQ_INT(sl_alloc_get_stats(dev).inflight_bytes_last, 0);
  CHECK_EQ_INT(sl_stream_clear_evidence(def).own.clears, own0);
  sl_buf_release(b);
  sl_clear_thread_streams();
}

static sl_status range_task(const sl_task_ctx *ctx, void *p) {
  return SL_ERR_RANGE;
}

/* A task's error survives the clear's drain: the clear reports it and the
 * owner's next sync still gets it, once. */
static void test_clear_keeps_stream_error(void) {
  sl_stream_t *s;
  CHECK_OK(sl_stream_create(sl_cpu_device(), "erring", &s));
  CHECK_OK(sl_stream_submit(s, range_task, NULL, 0, NULL, 0, NULL));
  CHECK_EQ_INT(sl_sync_and_clear_cache(s), SL_ERR_RANGE);
  CHECK_EQ_INT(sl_stream_sync(s), SL_ERR_RANGE);
  CHECK_EQ_INT(sl_stream_sync(s), SL_OK);
  /* drain_all reports it and leaves it to the stream's owner too */
  CHECK_OK(sl_stream_submit(s, range_task, NULL, 0, NULL, 0, NULL));
  CHECK_EQ_INT(sl_drain_all_and_clear_cache(sl_cpu_device()), SL_ERR_RANGE);
  CHECK_EQ_INT(sl_stream_sync(s), SL_ERR_RANGE);
  /* another stream's clear does not see or take it */
  CHECK_OK(sl_stream_submit(s, range_task, NULL, 0, NULL, 0, NULL));
  CHECK_OK(sl_stream_sync(s) == SL_ERR_RANGE ? SL_OK : SL_ERR_STATE);
  sl_stream_destroy(s);
}

/* One engine's clear submits nothing to another engine's stream, and the
 * work it finds there is attributed to that stream. */
static void test_clear_leaves_foreign_streams_alone(void) {
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *a, *b;
  CHECK_OK(sl_stream_create(dev, "engine-a", &a));
  CHECK_OK(sl_stream_create(dev, "engine-b", &b));
  sl_buf_t *buf;
  CHECK_OK(sl_buf_alloc(a, 1u << 20, &buf));
  uint64_t seq;
  queue_slow_use(a, buf, 200, &seq);
  sl_stream_pending before = sl_stream_query(a);
  sl_stream_evidence ea0 = sl_stream_clear_evidence(a);
  CHECK_OK(sl_sync_and_clear_cache(b));
  sl_stream_pending after = sl_stream_query(a);
  CHECK_EQ_INT(after.submitted, before.submitted); /* nothing added to A */
  CHECK(!sl_stream_done(a, seq));
  /* B's clear: nothing of its own in flight */
  CHECK_EQ_INT(sl_alloc_get_stats(dev).inflight_bytes_last, 0);
  CHECK_EQ_INT(sl_stream_clear_evidence(b).own.clears, 0);
  CHECK_EQ_INT(sl_stream_clear_evidence(b).others.clears, 0);
  /* A's work, on A's record */
  sl_stream_evidence ea1 = sl_stream_clear_evidence(a);
  CHECK_EQ_INT(ea1.others.clears, ea0.others.clears + 1);
  CHECK_MSG(ea1.others.bytes_last >= (1u << 20), "%llu",
            (unsigned long long)ea1.others.bytes_last);
  CHECK_OK(sl_stream_sync(a));
  sl_buf_release(buf);
  sl_stream_destroy(a);
  sl_stream_destroy(b);
}

typedef struct lock_ctx {
  sl_device_t *dev;
  _Atomic int started, done;
} lock_ctx;

static void *clear_body(void *p) {
  lock_ctx *c = p;
  sl_stream_t *s = sl_thread_stream(c->dev);
  atomic_store(&c->started, 1);
  sl_sync_and_clear_cache(s);
  atomic_store(&c->done, 1);
  sl_clear_thread_streams();
  return NULL;
}

/* The buffer-access lock excludes clears: a clear started while the store
 * worker holds it does not complete until it is let go. */
static void test_access_lock_excludes_clears(void) {
  lock_ctx c = {sl_cpu_device(), 0, 0};
  sl_buffer_access_lock(c.dev);
  sl_buffer_access_lock(c.dev); /* recursive */
  sl_buffer_access_unlock(c.dev);
  pthread_t th;
  pthread_create(&th, NULL, clear_body, &c);
  while (!atomic_load(&c.started))
    sleep_ms(1);
  sleep_ms(200);
  CHECK_MSG(!atomic_load(&c.done), "a clear ran under the access lock");
  sl_buffer_access_unlock(c.dev);
  pthread_join(th, NULL);
  CHECK(atomic_load(&c.done));
}

static void test_drain_all(void) {
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *a, *b;
  CHECK_OK(sl_stream_create(dev, "a", &a));
  CHECK_OK(sl_stream_create(dev, "b", &b));
  sleep_arg s = {30, NULL, 0, NULL};
  uint64_t sa, sb;
  CHECK_OK(sl_stream_submit(a, sleep_task, &s, sizeof s, NULL, 0, &sa));
  CHECK_OK(sl_stream_submit(b, sleep_task, &s, sizeof s, NULL, 0, &sb));
  CHECK_OK(sl_drain_all_and_clear_cache(dev));
  CHECK(sl_stream_done(a, sa) && sl_stream_done(b, sb));
  sl_stream_destroy(a);
  sl_stream_destroy(b);
}

static void *thread_streams_body(void *p) {
  sl_device_t *dev = p;
  sl_stream_t *s = sl_thread_stream(dev);
  sl_buf_t *b;
  if (sl_buf_alloc(s, 4096, &b) == SL_OK) {
    fill_arg f = {b, 1};
    sl_stream_submit(s, fill_task, &f, sizeof f, &b, 1, NULL);
    sl_buf_release(b);
  }
  sl_clear_thread_streams();
  return NULL;
}

static void test_clear_thread_streams(void) {
  sl_device_t *dev = sl_cpu_device();
  int before = sl_device_stream_count(dev);
  size_t live0 = sl_malloc_live_bytes();
  pthread_t th[8];
  for (int i = 0; i < 8; i++)
    pthread_create(&th[i], NULL, thread_streams_body, dev);
  for (int i = 0; i < 8; i++)
    pthread_join(th[i], NULL);
  CHECK_EQ_INT(sl_device_stream_count(dev), before);
  CHECK_OK(sl_drain_all_and_clear_cache(dev));
  /* every stream's host memory came back (debug mode keeps the structs of
   * freed buffers on purpose, to report late uses) */
  if (!sl_rt_debug())
    CHECK_MSG(sl_malloc_live_bytes() <= live0, "live %zu > %zu",
              sl_malloc_live_bytes(), live0);
}

/* I5 on the calling thread, where no thread exit follows to hide a clear
 * that did nothing (the pthread key's destructor drains what a thread
 * leaves behind, so the count after a join matches either way): the clear
 * itself drains the stream's queued work, unregisters it, and the next
 * sl_thread_stream makes a fresh one. */
static void test_clear_thread_streams_on_caller(void) {
  sl_device_t *dev = sl_cpu_device();
  sl_clear_thread_streams(); /* start with no thread stream on this thread */
  int before = sl_device_stream_count(dev);
  sl_stream_t *mine = sl_thread_stream(dev);
  CHECK(mine != NULL);
  if (!mine)
    return;
  CHECK_EQ_INT(sl_device_stream_count(dev), before + 1);
  _Atomic int ran = 0;
  sleep_arg s = {100, &ran, 0, NULL};
  CHECK_OK(sl_stream_submit(mine, sleep_task, &s, sizeof s, NULL, 0, NULL));
  uint64_t t0 = sl_now_ns();
  sl_clear_thread_streams();
  double ms = sl_ns_to_ms(sl_now_ns() - t0);
  CHECK_MSG(atomic_load(&ran) == 1,
            "sl_clear_thread_streams returned with the task still queued");
  CHECK_MSG(ms >= 90, "returned after %.2f ms, before the work was drained",
            ms);
  CHECK_MSG(sl_device_stream_count(dev) == before,
            "%d streams registered after the clear, %d before the thread "
            "stream was made",
            sl_device_stream_count(dev), before);
  sl_stream_t *again = sl_thread_stream(dev);
  CHECK(again != NULL);
  if (!again)
    return;
  CHECK_EQ_INT(sl_stream_query(again).submitted, 0); /* a new stream */
  CHECK_EQ_INT(sl_device_stream_count(dev), before + 1);
  sl_clear_thread_streams();
  CHECK_EQ_INT(sl_device_stream_count(dev), before);
}

/* ---- the store-worker race ------------------------------------------------
 */

#define RACE_BUF_WORDS 4096
#define RACE_ROUNDS    300

typedef struct race_q {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  sl_buf_t *items[16];
  int head, n;
  bool done;
} race_q;

typedef struct race_ctx {
  sl_device_t *dev;
  race_q q;
  _Atomic int torn, reads, stop_clearer;
} race_ctx;

/* A block is N-1 words of data then their xor-rotate checksum. */
static uint32_t checksum(const uint32_t *w, size_t n) {
  uint32_t h = 0x811C9DC5u;
  for (size_t i = 0; i < n; i++)
    h = (h ^ w[i]) * 16777619u;
  return h;
}

static sl_status fill_block_task(const sl_task_ctx *ctx, void *p) {
  fill_arg *a = p;
  uint32_t *d = sl_buf_ptr(a->b);
  uint32_t x = a->value;
  for (size_t i = 0; i < RACE_BUF_WORDS - 1; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    d[i] = x;
  }
  d[RACE_BUF_WORDS - 1] = checksum(d, RACE_BUF_WORDS - 1);
  return SL_OK;
}

static void *race_producer(void *p) {
  race_ctx *rc = p;
  sl_stream_t *s = sl_thread_stream(rc->dev);
  for (int i = 0; i < RACE_ROUNDS; i++) {
    sl_buf_t *b;
    if (sl_buf_alloc(s, RACE_BUF_WORDS * 4, &b) != SL_OK)
      continue;
    fill_arg f = {b, (uint32_t)i * 2654435761u + 1};
    sl_stream_submit(s, fill_block_task, &f, sizeof f, &b, 1, NULL);
    sl_stream_sync(s); /* the block is finished before it is handed over */
    pthread_mutex_lock(&rc->q.mu);
    while (rc->q.n == 16)
      pthread_cond_wait(&rc->q.cv, &rc->q.mu);
    rc->q.items[(rc->q.head + rc->q.n) % 16] = b;
    rc->q.n++;
    pthread_cond_broadcast(&rc->q.cv);
    pthread_mutex_unlock(&rc->q.mu);
    if (i % 7 == 0)
      sl_sync_and_clear_cache(s);
  }
  pthread_mutex_lock(&rc->q.mu);
  rc->q.done = true;
  pthread_cond_broadcast(&rc->q.cv);
  pthread_mutex_unlock(&rc->q.mu);
  sl_clear_thread_streams();
  return NULL;
}

typedef struct copy_out_arg {
  sl_buf_t *b;
  uint32_t *dst;
} copy_out_arg;

static sl_status copy_out_task(const sl_task_ctx *ctx, void *p) {
  copy_out_arg *a = p;
  memcpy(a->dst, sl_buf_ptr(a->b), RACE_BUF_WORDS * 4);
  return SL_OK;
}

/* The store worker: takes over each block, reads it on its own stream while
 * holding the buffer-access lock, verifies the checksum, releases it. */
static void *race_store_worker(void *p) {
  race_ctx *rc = p;
  sl_stream_t *s = sl_thread_stream(rc->dev);
  uint32_t *copy = sl_malloc(RACE_BUF_WORDS * 4);
  for (;;) {
    pthread_mutex_lock(&rc->q.mu);
    while (rc->q.n == 0 && !rc->q.done)
      pthread_cond_wait(&rc->q.cv, &rc->q.mu);
    if (rc->q.n == 0) {
      pthread_mutex_unlock(&rc->q.mu);
      break;
    }
    sl_buf_t *b = rc->q.items[rc->q.head];
    rc->q.head = (rc->q.head + 1) % 16;
    rc->q.n--;
    pthread_cond_broadcast(&rc->q.cv);
    pthread_mutex_unlock(&rc->q.mu);

    sl_buffer_access_lock(rc->dev);
    copy_out_arg c = {b, copy};
    uint64_t seq;
    if (sl_stream_submit(s, copy_out_task, &c, sizeof c, &b, 1, &seq) == SL_OK)
      sl_stream_wait_seq(s, seq);
    sl_buffer_access_unlock(rc->dev);
    if (checksum(copy, RACE_BUF_WORDS - 1) != copy[RACE_BUF_WORDS - 1])
      atomic_fetch_add(&rc->torn, 1);
    atomic_fetch_add(&rc->reads, 1);
    sl_buf_release(b);
  }
  sl_free(copy);
  sl_clear_thread_streams();
  return NULL;
}

static void *race_clearer(void *p) {
  race_ctx *rc = p;
  sl_stream_t *s = sl_thread_stream(rc->dev);
  while (!atomic_load(&rc->stop_clearer)) {
    sl_sync_and_clear_cache(s);
    sl_drain_all_and_clear_cache(rc->dev);
  }
  sl_clear_thread_streams();
  return NULL;
}

static void test_store_worker_race(void) {
  race_ctx rc;
  memset(&rc, 0, sizeof rc);
  rc.dev = sl_cpu_device();
  pthread_mutex_init(&rc.q.mu, NULL);
  pthread_cond_init(&rc.q.cv, NULL);
  pthread_t prod, store, clr;
  pthread_create(&clr, NULL, race_clearer, &rc);
  pthread_create(&store, NULL, race_store_worker, &rc);
  pthread_create(&prod, NULL, race_producer, &rc);
  pthread_join(prod, NULL);
  pthread_join(store, NULL);
  atomic_store(&rc.stop_clearer, 1);
  pthread_join(clr, NULL);
  CHECK_EQ_INT(atomic_load(&rc.reads), RACE_ROUNDS);
  CHECK_EQ_INT(atomic_load(&rc.torn), 0);
  pthread_cond_destroy(&rc.q.cv);
  pthread_mutex_destroy(&rc.q.mu);
}

/* ---- randomized stress ----------------------------------------------------
 */

#define STRESS_THREADS 6
#define STRESS_OPS     400

typedef struct stress_ctx {
  sl_device_t *dev;
  sl_stream_t *shared[3];
  _Atomic int errors;
  _Atomic int ops;
} stress_ctx;

typedef struct stress_targ {
  stress_ctx *sc;
  uint32_t seed;
} stress_targ;

static void *stress_body(void *p) {
  stress_targ *ta = p;
  stress_ctx *sc = ta->sc;
  uint32_t x = ta->seed;
#define RND() (x ^= x << 13, x ^= x >> 17, x ^= x << 5, x)
  sl_stream_t *own = sl_thread_stream(sc->dev);
  sl_buf_t *live[8] = {0};
  uint32_t val[8] = {0};
  for (int op = 0; op < STRESS_OPS; op++) {
    int slot = (int)(RND() % 8);
    switch (RND() % 8) {
    case 0:
    case 1: /* allocate and fill on the own stream */
      if (!live[slot]) {
        size_t sz = 256 + (RND() % 64) * 1024;
        if (sl_buf_alloc(own, sz, &live[slot]) != SL_OK) {
          live[slot] = NULL;
          break;
        }
        val[slot] = RND();
        fill_arg f = {live[slot], val[slot]};
        sl_stream_submit(own, fill_task, &f, sizeof f, &live[slot], 1, NULL);
      }
      break;
    case 2:
    case 3: { /* use on a shared stream after an event on the own stream */
      if (!live[slot])
        break;
      sl_stream_t *sh = sc->shared[RND() % 3];
      sl_event ev;
      sl_event_record(own, &ev);
      sl_stream_wait_event(sh, ev);
      check_arg c = {live[slot], val[slot], (RND() % 4) * 0.2, &sc->errors};
      sl_stream_submit(sh, check_task, &c, sizeof c, &live[slot], 1, NULL);
      break;
    }
    case 4:
    case 5: /* release while uses may still be pending */
      if (live[slot]) {
        sl_buf_release(live[slot]);
        live[slot] = NULL;
      }
      break;
    case 6: /* the owning clear */
      sl_sync_and_clear_cache(own);
      break;
    case 7: /* queries and the occasional drain of a shared stream */
      sl_stream_query(sc->shared[RND() % 3]);
      if (RND() % 4 == 0)
        sl_stream_sync(sc->shared[RND() % 3]);
      break;
    }
    atomic_fetch_add(&sc->ops, 1);
  }
  for (int i = 0; i < 8; i++)
    sl_buf_release(live[i]);
  sl_clear_thread_streams();
  return NULL;
#undef RND
}

static void test_stress(void) {
  stress_ctx sc;
  memset(&sc, 0, sizeof sc);
  sc.dev = sl_cpu_device();
  for (int i = 0; i < 3; i++)
    CHECK_OK(sl_stream_create(sc.dev, "shared", &sc.shared[i]));
  pthread_t th[STRESS_THREADS];
  stress_targ ta[STRESS_THREADS];
  for (int i = 0; i < STRESS_THREADS; i++) {
    ta[i].sc = &sc;
    ta[i].seed = 0x1234567u * (uint32_t)(i + 1);
    pthread_create(&th[i], NULL, stress_body, &ta[i]);
  }
  for (int i = 0; i < STRESS_THREADS; i++)
    pthread_join(th[i], NULL);
  CHECK_OK(sl_drain_all_and_clear_cache(sc.dev));
  for (int i = 0; i < 3; i++)
    sl_stream_destroy(sc.shared[i]);
  CHECK_EQ_INT(atomic_load(&sc.ops), STRESS_THREADS * STRESS_OPS);
  /* no task saw released (poisoned in debug mode) or reused memory */
  CHECK_EQ_INT(atomic_load(&sc.errors), 0);
  sl_alloc_stats st = sl_alloc_get_stats(sc.dev);
  CHECK_EQ_INT(st.retiring, 0);
  CHECK_EQ_INT(st.cache, 0);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--debug") == 0)
    sl_rt_set_debug(true);
  fprintf(stderr, "runtime debug mode: %s\n", sl_rt_debug() ? "on" : "off");
  RUN(test_three_streams_distinct);
  RUN(test_in_order_and_timeline);
  RUN(test_task_error_reported_once);
  RUN(test_events);
  RUN(test_alloc_retiring_until_uses_complete);
  RUN(test_alloc_limits);
  RUN(test_peak_and_reserved);
  RUN(test_buf_read_write);
  RUN(test_owning_clear_drains_its_stream);
  RUN(test_clear_drains_default_stream);
  RUN(test_clear_keeps_stream_error);
  RUN(test_clear_leaves_foreign_streams_alone);
  RUN(test_access_lock_excludes_clears);
  RUN(test_drain_all);
  RUN(test_clear_thread_streams);
  RUN(test_clear_thread_streams_on_caller);
  RUN(test_store_worker_race);
  RUN(test_stress);
  sl_rt_shutdown();
  return sl_test_finish();
}
