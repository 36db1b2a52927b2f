/* Planted violations: debug mode (I8) must catch each one and name both
 * sides; a fatal device error must end the process with its own code (I6).
 * Each violation runs in a child process (re-exec of this binary). */
#include <stdatomic.h>
#include <string.h>

#include "harness.h"
#include "rt/rt_impl.h"
#include "sluice/alloc.h"
#include "sluice/memsync.h"
#include "sluice/rt.h"
#include "sluice/util.h"

typedef struct touch_arg {
  sl_buf_t *b;
} touch_arg;

static sl_status touch_task(const sl_task_ctx *ctx, void *p) {
  touch_arg *a = p;
  volatile unsigned char *d = sl_buf_ptr(a->b);
  d[0] = 1;
  return SL_OK;
}

/* A buffer used on a stream the allocator was not told about: the task on
 * `other` touches `b` without declaring it. */
static void child_undeclared_use(void) {
  sl_rt_set_debug(true);
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *own = sl_thread_stream(dev), *other;
  sl_stream_create(dev, "undeclared", &other);
  sl_buf_t *b;
  sl_buf_alloc(own, 4096, &b);
  touch_arg a = {b};
  sl_stream_submit(other, touch_task, &a, sizeof a, NULL, 0, NULL);
  sl_stream_sync(other);
}

/* A task that names a buffer already released. */
static void child_use_after_release(void) {
  sl_rt_set_debug(true);
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *s = sl_thread_stream(dev);
  sl_buf_t *b;
  sl_buf_alloc(s, 4096, &b);
  sl_buf_release(b);
  touch_arg a = {b};
  sl_stream_submit(s, touch_task, &a, sizeof a, &b, 1, NULL);
  sl_stream_sync(s);
}

typedef struct slow_arg {
  sl_buf_t *b;
  int ms;
  _Atomic int *started;
} slow_arg;

static sl_status slow_touch_task(const sl_task_ctx *ctx, void *p) {
  slow_arg *a = p;
  atomic_store(a->started, 1);
  usleep((useconds_t)a->ms * 1000);
  ((volatile unsigned char *)sl_buf_ptr(a->b))[0] = 2;
  return SL_OK;
}

/* A bookkeeping bug planted in the allocator: the buffer goes to the cache
 * while a use on another stream is pending; the clear must refuse. */
static void child_clear_with_pending_use(void) {
  sl_rt_set_debug(true);
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *eng = sl_thread_stream(dev), *other;
  sl_stream_create(dev, "pending-user", &other);
  sl_buf_t *b;
  sl_buf_alloc(eng, 4096, &b);
  static _Atomic int started;
  slow_arg a = {b, 300, &started};
  sl_stream_submit(other, slow_touch_task, &a, sizeof a, &b, 1, NULL);
  while (!atomic_load(&started)) /* the use is under way */
    usleep(100);
  sl__alloc_plant_early_retire(b);
  sl_sync_and_clear_cache(eng); /* drains eng and default, not `other` */
}

/* Memory written after its release: the poison check at the clear. */
static void child_write_after_release(void) {
  sl_rt_set_debug(true);
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *s = sl_thread_stream(dev);
  sl_buf_t *b;
  sl_buf_alloc(s, 4096, &b);
  unsigned char *raw = sl_buf_ptr(b); /* a stale raw pointer kept around */
  sl_buf_release(b);
  raw[100] = 0; /* the bug */
  sl_sync_and_clear_cache(s);
}

static sl_status fatal_task(const sl_task_ctx *ctx, void *p) {
  return SL_ERR_DEVICE_FATAL;
}

static void child_fatal_device_error(void) {
  sl_stream_t *s = sl_thread_stream(sl_cpu_device());
  sl_stream_submit(s, fatal_task, NULL, 0, NULL, 0, NULL);
  sl_sync_and_clear_cache(s);
}

/* The same error met by the owner's own sync, not by a clear: the sync
 * ends the process too (I6: a sync or a clear), and never returns the
 * fatal code to a caller that could go on using the device. */
static void child_fatal_device_error_sync(void) {
  sl_stream_t *s = sl_thread_stream(sl_cpu_device());
  sl_stream_submit(s, fatal_task, NULL, 0, NULL, 0, NULL);
  sl_status st = sl_stream_sync(s);
  fprintf(stderr, "child: the sync returned %s\n", sl_status_str(st));
}

/* Debug mode poisons released memory: a stale pointer reads the poison,
 * not the old contents, and a release nobody wrote after is not reported
 * at the clear. Exits 0, or 3 when the memory was not poisoned. */
static void child_poison_released(void) {
  sl_rt_set_debug(true);
  sl_device_t *dev = sl_cpu_device();
  sl_stream_t *s = sl_thread_stream(dev);
  sl_buf_t *b;
  if (sl_buf_alloc(s, 4096, &b) != SL_OK)
    exit(2);
  unsigned char *raw = sl_buf_ptr(b);
  memset(raw, 0x11, 4096);
  sl_buf_release(b); /* no uses: quarantined at once, the struct kept */
  bool poisoned = dev->ops->poison_intact(dev, raw, 4096);
  fprintf(stderr, "child: released memory %s\n",
          poisoned ? "poisoned" : "NOT poisoned");
  sl_sync_and_clear_cache(s); /* checks the poison, then frees */
  exit(poisoned ? 0 : 3);
}

static sl_status hang_task(const sl_task_ctx *ctx, void *p) {
  for (;;) /* a hung device: the work never completes */
    pause();
  return SL_OK;
}

/* A drain that never completes: the watchdog names the stream and the task
 * and ends the process with the fatal-device code (I6). */
static void child_hung_drain(void) {
  sl_rt_set_drain_deadline_ms(300);
  sl_stream_t *s;
  sl_stream_create(sl_cpu_device(), "hung", &s);
  sl_stream_submit(s, hang_task, NULL, 0, NULL, 0, NULL);
  sl_sync_and_clear_cache(s);
}

static void expect_abort(const char *child, const char *what,
                         const char *side) {
  int ws = 0;
  char err[8192];
  CHECK_OK(sl_test_spawn_child(child, &ws, err, sizeof err));
  CHECK_MSG(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGABRT,
            "%s: child did not abort (status 0x%x)\n%s", child, ws, err);
  CHECK_MSG(strstr(err, what) != NULL, "%s: message lacks '%s':\n%s", child,
            what, err);
  CHECK_MSG(strstr(err, side) != NULL, "%s: message lacks '%s':\n%s", child,
            side, err);
  CHECK_MSG(strstr(err, "buffer #") != NULL, "%s: no buffer named", child);
}

static void test_undeclared_use(void) {
  expect_abort("undeclared", "did not declare", "stream cpu/undeclared");
}
static void test_use_after_release(void) {
  expect_abort("use-after-release", "already released", "stream cpu/thread");
}
static void test_clear_with_pending_use(void) {
  expect_abort("pending", "clear would release a buffer with pending uses",
               "stream cpu/pending-user");
  expect_abort("pending", "pending uses",
               "the clearing side: sl_sync_and_clear_cache(cpu/thread");
}
static void test_write_after_release(void) {
  expect_abort("write-after-release", "written after its release",
               "owner stream cpu/thread");
}

static void test_fatal_device_error_exit_code(void) {
  int ws = 0;
  char err[4096];
  CHECK_OK(sl_test_spawn_child("fatal", &ws, err, sizeof err));
  CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == SL_EXIT_DEVICE_FATAL,
            "status 0x%x\n%s", ws, err);
  CHECK(strstr(err, "FATAL device error") != NULL);
}

static void test_fatal_device_error_in_sync(void) {
  int ws = 0;
  char err[4096];
  CHECK_OK(sl_test_spawn_child("fatal-sync", &ws, err, sizeof err));
  CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == SL_EXIT_DEVICE_FATAL,
            "status 0x%x\n%s", ws, err);
  CHECK_MSG(strstr(err, "FATAL device error") != NULL, "%s", err);
  CHECK_MSG(strstr(err, "during stream wait") != NULL, "%s", err);
  CHECK_MSG(strstr(err, "cpu/thread") != NULL, "stream not named: %s", err);
  CHECK_MSG(strstr(err, "the sync returned") == NULL, "%s", err);
}

static void test_debug_poisons_released(void) {
  int ws = 0;
  char err[4096];
  CHECK_OK(sl_test_spawn_child("poison", &ws, err, sizeof err));
  CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "status 0x%x\n%s", ws, err);
  CHECK_MSG(strstr(err, "child: released memory poisoned") != NULL, "%s", err);
  CHECK_MSG(strstr(err, "VIOLATION") == NULL, "%s", err);
}

static void test_drain_watchdog(void) {
  int ws = 0;
  char err[4096];
  uint64_t t0 = sl_now_ns();
  CHECK_OK(sl_test_spawn_child("hung", &ws, err, sizeof err));
  double s = sl_ns_to_ms(sl_now_ns() - t0) / 1e3;
  CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == SL_EXIT_DEVICE_FATAL,
            "status 0x%x\n%s", ws, err);
  CHECK_MSG(strstr(err, "drain watchdog") != NULL, "%s", err);
  CHECK_MSG(strstr(err, "cpu/hung") != NULL, "stream not named: %s", err);
  CHECK_MSG(strstr(err, "task seq 1") != NULL, "task not named: %s", err);
  CHECK_MSG(s < 30, "took %.1f s", s);
}

/* Without debug mode the same planted bug is not checked at the clear, but a
 * released buffer in a submission is always refused. */
static void test_children_dispatch_unknown(void) {
  int ws = 0;
  char err[256];
  CHECK_OK(sl_test_spawn_child("no-such-child", &ws, err, sizeof err));
  CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 99);
}

int main(int argc, char **argv) {
  SL_TEST_CHILDREN(argc, argv, {"undeclared", child_undeclared_use},
                   {"use-after-release", child_use_after_release},
                   {"pending", child_clear_with_pending_use},
                   {"write-after-release", child_write_after_release},
                   {"fatal", child_fatal_device_error},
                   {"fatal-sync", child_fatal_device_error_sync},
                   {"poison", child_poison_released},
                   {"hung", child_hung_drain});
  RUN(test_undeclared_use);
  RUN(test_use_after_release);
  RUN(test_clear_with_pending_use);
  RUN(test_write_after_release);
  RUN(test_fatal_device_error_exit_code);
  RUN(test_fatal_device_error_in_sync);
  RUN(test_debug_poisons_released);
  RUN(test_drain_watchdog);
  RUN(test_children_dispatch_unknown);
  return sl_test_finish();
}
