/* CPU backend: a stream is a worker thread that runs its tasks in order.
 * Device memory is 64-byte-aligned host memory. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rt/rt_impl.h"

typedef struct cpu_stream {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv_work; /* worker waits for tasks */
  pthread_cond_t cv_done; /* waiters wait for completion */
  sl__task *head, *tail;
  int waiters;
  bool stop;
} cpu_stream;

#define POISON_BYTE 0xA5

static void *worker_main(void *arg) {
  sl_stream_t *s = arg;
  cpu_stream *cs = s->backend;
  char tname[16];
  snprintf(tname, sizeof tname, "sl-stream-%u", s->id);
  pthread_setname_np(pthread_self(), tname);
  bool debug = sl_rt_debug();
  pthread_mutex_lock(&cs->mu);
  for (;;) {
    while (!cs->head && !cs->stop)
      pthread_cond_wait(&cs->cv_work, &cs->mu);
    if (!cs->head)
      break; /* stop, and the queue is drained */
    sl__task *t = cs->head;
    cs->head = t->next;
    if (!cs->head)
      cs->tail = NULL;
    pthread_mutex_unlock(&cs->mu);

    /* I8: each task checks, before it runs, that every buffer it declared
     * is still live (ACTIVE, or RETIRING because of this very use). */
    if (debug)
      sl__alloc_check_task_bufs(t);
    uint64_t seq = t->ctx.seq;
    atomic_store(&s->running_fn, t->fn); /* for the drain watchdog */
    atomic_store(&s->running_seq, seq);
    sl__task_run(t);
    atomic_store(&s->running_seq, 0);
    sl_free(t);

    pthread_mutex_lock(&cs->mu);
    sl__stream_set_completed(s, seq);
    if (cs->waiters)
      pthread_cond_broadcast(&cs->cv_done);
  }
  pthread_mutex_unlock(&cs->mu);
  return NULL;
}

static sl_status cpu_device_open(sl_device_t *dev) {
  return SL_OK;
}
static void cpu_device_close(sl_device_t *dev) {}

static sl_status cpu_stream_init(sl_stream_t *s) {
  cpu_stream *cs = sl_calloc(1, sizeof *cs);
  if (!cs)
    return SL_ERR_NOMEM;
  pthread_mutex_init(&cs->mu, NULL);
  pthread_cond_init(&cs->cv_work, NULL);
  pthread_condattr_t ca; /* timed waits on the sl_now_ns clock */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&cs->cv_done, &ca);
  pthread_condattr_destroy(&ca);
  s->backend = cs;
  if (pthread_create(&cs->thread, NULL, worker_main, s) != 0) {
    pthread_cond_destroy(&cs->cv_done);
    pthread_cond_destroy(&cs->cv_work);
    pthread_mutex_destroy(&cs->mu);
    sl_free(cs);
    s->backend = NULL;
    return SL_ERR_THREAD;
  }
  return SL_OK;
}

static void cpu_stream_fini(sl_stream_t *s) {
  cpu_stream *cs = s->backend;
  pthread_mutex_lock(&cs->mu);
  cs->stop = true;
  pthread_cond_signal(&cs->cv_work);
  pthread_mutex_unlock(&cs->mu);
  pthread_join(cs->thread, NULL);
}

static void cpu_stream_free_state(sl_stream_t *s) {
  cpu_stream *cs = s->backend;
  pthread_cond_destroy(&cs->cv_done);
  pthread_cond_destroy(&cs->cv_work);
  pthread_mutex_destroy(&cs->mu);
  sl_free(cs);
  s->backend = NULL;
}

static sl_status cpu_submit(sl_stream_t *s, sl__task *t) {
  cpu_stream *cs = s->backend;
  pthread_mutex_lock(&cs->mu);
  if (cs->tail)
    cs->tail->next = t;
  else
    cs->head = t;
  cs->tail = t;
  pthread_cond_signal(&cs->cv_work);
  pthread_mutex_unlock(&cs->mu);
  return SL_OK;
}

static sl_status cpu_wait(sl_stream_t *s, uint64_t seq, uint64_t deadline) {
  cpu_stream *cs = s->backend;
  const sl__task *cur = sl__task_current();
  SL_ASSERT_MSG(!cur || cur->ctx.stream != s,
                "a task waited on its own stream (deadlock)");
  struct timespec ts = {(time_t)(deadline / 1000000000ull),
                        (long)(deadline % 1000000000ull)};
  sl_status st = SL_OK;
  pthread_mutex_lock(&cs->mu);
  cs->waiters++;
  while (atomic_load_explicit(&s->completed, memory_order_acquire) < seq) {
    if (deadline == UINT64_MAX) {
      pthread_cond_wait(&cs->cv_done, &cs->mu);
    } else if (pthread_cond_timedwait(&cs->cv_done, &cs->mu, &ts) ==
                   ETIMEDOUT &&
               atomic_load_explicit(&s->completed, memory_order_acquire) <
                   seq) {
      st = SL_ERR_TIMEOUT;
      break;
    }
  }
  cs->waiters--;
  pthread_mutex_unlock(&cs->mu);
  return st;
}

static void cpu_poll(sl_stream_t *s) {} /* `completed` is always current */

typedef struct wait_arg {
  sl_event ev;
} wait_arg;

static sl_status wait_task(const sl_task_ctx *ctx, void *arg) {
  wait_arg *w = arg;
  /* wait on the other stream's timeline without taking its error; a stream
   * destroyed meanwhile was drained first, so it reads as done */
  sl_status st = SL_OK;
  if (!sl_stream_done(w->ev.stream, w->ev.seq))
    st = w->ev.stream->dev->ops->wait(w->ev.stream, w->ev.seq, UINT64_MAX);
  sl__stream_unref(w->ev.stream); /* taken in cpu_wait_event */
  return st;
}

static sl_status cpu_wait_event(sl_stream_t *waiter, sl_event ev) {
  wait_arg w = {ev};
  sl__stream_ref(ev.stream);
  sl_status st =
      sl_stream_submit(waiter, wait_task, &w, sizeof w, NULL, 0, NULL);
  if (st != SL_OK)
    sl__stream_unref(ev.stream);
  return st;
}

static sl_status cpu_copy(const sl_task_ctx *ctx, void *dst, const void *src,
                          size_t n, bool to_device) {
  memcpy(dst, src, n);
  return SL_OK;
}

static void *cpu_mem_alloc(sl_device_t *dev, size_t n) {
  void *p = NULL;
  if (posix_memalign(&p, 64, n) != 0)
    return NULL;
  return p;
}

static void cpu_mem_free(sl_device_t *dev, void *p, size_t n) {
  free(p);
}

static void cpu_poison(sl_device_t *dev, void *p, size_t n) {
  memset(p, POISON_BYTE, n);
}

static bool cpu_poison_intact(sl_device_t *dev, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != POISON_BYTE)
      return false;
  return true;
}

/* Resident set size from /proc/self/statm (pages * page size). */
/* MemAvailable and MemTotal from /proc/meminfo. */
static uint64_t cpu_mem_avail(sl_device_t *dev, uint64_t *total) {
  (void)dev;
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f)
    return 0;
  char line[256];
  unsigned long long kb, avail = 0, tot = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
      avail = kb * 1024ull;
    else if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
      tot = kb * 1024ull;
  }
  fclose(f);
  if (total)
    *total = tot;
  return avail;
}

static uint64_t cpu_footprint(sl_device_t *dev) {
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f)
    return 0;
  unsigned long size = 0, resident = 0;
  int n = fscanf(f, "%lu %lu", &size, &resident);
  fclose(f);
  if (n != 2)
    return 0;
  return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

const sl__backend_ops sl__cpu_backend = {
    .name = "cpu",
    .device_open = cpu_device_open,
    .device_close = cpu_device_close,
    .stream_init = cpu_stream_init,
    .stream_fini = cpu_stream_fini,
    .stream_free_state = cpu_stream_free_state,
    .submit = cpu_submit,
    .runs_inline = false,
    .wait = cpu_wait,
    .poll = cpu_poll,
    .wait_event = cpu_wait_event,
    .copy = cpu_copy,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .poison = cpu_poison,
    .poison_intact = cpu_poison_intact,
    .footprint = cpu_footprint,
    .mem_avail = cpu_mem_avail,
};
