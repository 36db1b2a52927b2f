/* The timeline: what every other rt file builds on, calling nothing above
 * it. Completion (sl__stream_set_completed, queries), the completion watches
 * and clear evidence (memsync.c sets them), the task protocol, debug mode
 * (I8), the drain deadline and the fatal exit (I6).
 *
 * Process state: `g_tl` (the debug switch and the drain deadline). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt/rt_impl.h"

static struct {
  _Atomic int debug;                  /* -1: not yet decided */
  _Atomic uint64_t drain_deadline_ns; /* 0: not yet decided */
} g_rt = {
    .debug = -1,
};

static _Thread_local const sl__task *t_current_task;

#define DEFAULT_DRAIN_DEADLINE_S 600

bool sl_rt_debug(void) {
  int d = atomic_load(&g_rt.debug);
  if (d < 0) {
#ifdef SLUICE_DEBUG_RT
    d = 1;
#else
    const char *e = getenv("SLUICE_DEBUG_RT");
    d = e && e[0] && strcmp(e, "0") != 0;
#endif
    atomic_store(&g_rt.debug, d);
  }
  return d != 0;
}

void sl_rt_set_debug(bool on) {
  atomic_store(&g_rt.debug, on ? 1 : 0);
}

void sl__task_enter(const sl__task *t) {
  t_current_task = t;
}
void sl__task_leave(void) {
  t_current_task = NULL;
}
const sl__task *sl__task_current(void) {
  return t_current_task;
}

sl_status sl__task_run(sl__task *t) {
  sl__task_enter(t);
  sl_status st = t->fn(&t->ctx, t->arg);
  sl__task_leave();
  if (st != SL_OK) {
    int zero = 0;
    atomic_compare_exchange_strong(&t->ctx.stream->error, &zero, (int)st);
  }
  return st;
}

static void atomic_max_u64(_Atomic uint64_t *p, uint64_t v) {
  uint64_t cur = atomic_load(p);
  while (cur < v && !atomic_compare_exchange_weak(p, &cur, v))
    ;
}

/* Claims the watch set at seq w (now completed) and stamps the time. */
static void watch_resolve(sl_stream_t *s, uint64_t w) {
  if (!atomic_compare_exchange_strong(&s->watch_seq, &w, 0))
    return; /* someone else stamped it */
  uint64_t t0 = atomic_load(&s->watch_t0), now = sl_now_ns();
  uint64_t ns = now > t0 ? now - t0 : 1;
  int side = atomic_load(&s->watch_side);
  atomic_store(&s->ev[side].ns_last, ns);
  atomic_max_u64(&s->ev[side].ns_max, ns);
  if (side == 0) { /* a clear that drained s found its work: device-wide */
    sl_device_t *dev = s->dev;
    atomic_store(&dev->inflight_ns_last, ns);
    atomic_max_u64(&dev->inflight_ns_max, ns);
    atomic_fetch_add(&dev->inflight_ns_total, ns);
  }
}

void sl__stream_watch_check(sl_stream_t *s) {
  uint64_t w = atomic_load(&s->watch_seq);
  if (w && w != UINT64_MAX &&
      atomic_load_explicit(&s->completed, memory_order_acquire) >= w)
    watch_resolve(s, w);
}

void sl__stream_set_completed(sl_stream_t *s, uint64_t seq) {
  atomic_store_explicit(&s->completed, seq, memory_order_release);
  uint64_t w = atomic_load(&s->watch_seq);
  if (w && w != UINT64_MAX && seq >= w)
    watch_resolve(s, w);
}

sl_stream_evidence sl_stream_clear_evidence(sl_stream_t *s) {
  sl_stream_evidence out;
  sl__stream_watch_check(s);
  sl_clear_evidence *e[2] = {&out.own, &out.others};
  for (int i = 0; i < 2; i++) {
    e[i]->clears = atomic_load(&s->ev[i].clears);
    e[i]->bytes_last = atomic_load(&s->ev[i].bytes_last);
    e[i]->tasks_last = atomic_load(&s->ev[i].tasks_last);
    e[i]->ms_last = sl_ns_to_ms(atomic_load(&s->ev[i].ns_last));
    e[i]->ms_max = sl_ns_to_ms(atomic_load(&s->ev[i].ns_max));
  }
  return out;
}

void sl_rt_set_drain_deadline_ms(uint64_t ms) {
  atomic_store(&g_rt.drain_deadline_ns, ms ? ms * 1000000ull : UINT64_MAX);
}

uint64_t sl__drain_deadline_ns(void) {
  uint64_t d = atomic_load(&g_rt.drain_deadline_ns);
  if (d == 0) {
    const char *e = getenv("SLUICE_DRAIN_DEADLINE_S");
    double sec = e && *e ? strtod(e, NULL) : DEFAULT_DRAIN_DEADLINE_S;
    d = sec > 0 ? (uint64_t)(sec * 1e9) : UINT64_MAX; /* <= 0: no deadline */
    uint64_t zero = 0;
    atomic_compare_exchange_strong(&g_rt.drain_deadline_ns, &zero, d);
    d = atomic_load(&g_rt.drain_deadline_ns);
  }
  return d;
}

_Noreturn void sl__device_fatal(sl_device_t *dev, const char *what,
                                const char *detail) {
  fprintf(stderr,
          "sluice: FATAL device error on %s during %s: %s; exiting with code "
          "%d so that a supervisor can restart the process (I6)\n",
          dev ? dev->name : "?", what, detail ? detail : "",
          SL_EXIT_DEVICE_FATAL);
  fflush(stderr);
  _exit(SL_EXIT_DEVICE_FATAL);
}

sl_stream_pending sl_stream_query(sl_stream_t *s) {
  sl_stream_pending p;
  p.submitted = atomic_load(&s->submitted);
  if (atomic_load_explicit(&s->completed, memory_order_acquire) < p.submitted)
    s->dev->ops->poll(s);
  p.completed = atomic_load_explicit(&s->completed, memory_order_acquire);
  p.tasks = p.submitted - p.completed;
  return p;
}

bool sl_stream_done(sl_stream_t *s, uint64_t seq) {
  if (atomic_load_explicit(&s->completed, memory_order_acquire) >= seq)
    return true;
  s->dev->ops->poll(s);
  return atomic_load_explicit(&s->completed, memory_order_acquire) >= seq;
}
