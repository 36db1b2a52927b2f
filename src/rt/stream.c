/* Devices, streams, events and the task protocol; backend-independent.
 *
 * Process state: `g_rt` below is the runtime's one documented global. It holds
 * the device table (opened on first use, closed by sl_rt_shutdown) and the
 * debug-mode switch. Thread-local streams hang off a _Thread_local table.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt/rt_impl.h"

#define SL__MAX_CUDA    16
#define SL__MAX_DEVICES (1 + SL__MAX_CUDA) /* slot 0: cpu; 1..: cuda */

static struct {
  pthread_mutex_t mu;
  sl_device_t *devices[SL__MAX_DEVICES];
  _Atomic uint32_t next_stream_id;
  _Atomic int debug;                  /* -1: not yet decided */
  _Atomic uint64_t drain_deadline_ns; /* 0: not yet decided */
  pthread_key_t tls_key;
  pthread_once_t key_once;
} g_rt = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .debug = -1,
    .key_once = PTHREAD_ONCE_INIT,
};

/* The calling thread's thread-local streams, one slot per device. */
static _Thread_local sl_stream_t *t_streams[SL__MAX_DEVICES];
static _Thread_local const sl__task *t_current_task;

/* ---- debug mode ---------------------------------------------------------- */

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

/* ---- tasks -----------------------------------------------------------------
 */

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

/* ---- completion watches and clear evidence (see memsync.c) ----------------
 */

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

/* ---- the drain watchdog (I6) ------------------------------------------------
 */

#define DEFAULT_DRAIN_DEADLINE_S 600

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

static uint64_t deadline_from_now(void) {
  uint64_t d = sl__drain_deadline_ns(), now = sl_now_ns();
  return d == UINT64_MAX || d > UINT64_MAX - now ? UINT64_MAX : now + d;
}

/* A wait ran past the deadline: name the stream and the task, then I6. */
static _Noreturn void drain_hung(sl_stream_t *s, uint64_t seq) {
  uint64_t done = atomic_load(&s->completed);
  uint64_t running = atomic_load(&s->running_seq);
  sl_task_fn fn = atomic_load(&s->running_fn);
  char detail[256];
  snprintf(detail, sizeof detail,
           "stream %s did not reach seq %llu within %.1f s (drain watchdog): "
           "completed %llu, stuck on task seq %llu (fn %p)",
           s->name, (unsigned long long)seq,
           (double)sl__drain_deadline_ns() / 1e9, (unsigned long long)done,
           (unsigned long long)(running ? running : done + 1),
           running ? (void *)fn : NULL);
  sl__device_fatal(s->dev, "a drain", detail);
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

/* ---- streams ----------------------------------------------------------------
 */

static void registry_add(sl_device_t *dev, sl_stream_t *s) {
  pthread_mutex_lock(&dev->streams_mu);
  s->reg_next = dev->streams;
  dev->streams = s;
  dev->nstreams++;
  pthread_mutex_unlock(&dev->streams_mu);
}

static void registry_remove(sl_device_t *dev, sl_stream_t *s) {
  pthread_mutex_lock(&dev->streams_mu);
  for (sl_stream_t **pp = &dev->streams; *pp; pp = &(*pp)->reg_next)
    if (*pp == s) {
      *pp = s->reg_next;
      dev->nstreams--;
      break;
    }
  pthread_mutex_unlock(&dev->streams_mu);
}

static sl_status stream_new(sl_device_t *dev, sl__stream_kind kind,
                            const char *name, sl_stream_t **out) {
  sl_stream_t *s = sl_calloc(1, sizeof *s);
  if (!s)
    return SL_ERR_NOMEM;
  s->dev = dev;
  s->kind = kind;
  s->id = atomic_fetch_add(&g_rt.next_stream_id, 1) + 1;
  s->creator = pthread_self();
  atomic_store(&s->refs, 1);
  snprintf(s->name, sizeof s->name, "%s/%s:%u", dev->name, name, s->id);
  pthread_mutex_init(&s->submit_mu, NULL);
  sl_status st = dev->ops->stream_init(s);
  if (st != SL_OK)
    goto fail_init;
  registry_add(dev, s);
  *out = s;
  return SL_OK;
fail_init:
  pthread_mutex_destroy(&s->submit_mu);
  sl_free(s);
  return st;
}

void sl__stream_ref(sl_stream_t *s) {
  atomic_fetch_add(&s->refs, 1);
}

void sl__stream_unref(sl_stream_t *s) {
  if (atomic_fetch_sub(&s->refs, 1) == 1) {
    if (s->dev->ops->stream_free_state)
      s->dev->ops->stream_free_state(s);
    pthread_mutex_destroy(&s->submit_mu);
    sl_free(s);
  }
}

/* Drains `s`, makes the allocator forget it, tears down its backend, and
 * drops the owner's reference. */
static void stream_free(sl_stream_t *s) {
  sl_device_t *dev = s->dev;
  sl_status st = sl_stream_sync(s);
  if (st != SL_OK)
    SL_LOGW("stream %s: error at destroy: %s", s->name, sl_status_str(st));
  registry_remove(dev, s);
  sl__alloc_forget_stream(dev, s);
  dev->ops->stream_fini(s);
  sl__stream_unref(s);
}

sl_status sl_stream_create(sl_device_t *dev, const char *name,
                           sl_stream_t **out) {
  if (!dev || !out)
    return SL_ERR_INVALID_ARG;
  return stream_new(dev, SL__STREAM_USER, name ? name : "user", out);
}

void sl_stream_destroy(sl_stream_t *s) {
  if (!s)
    return;
  SL_ASSERT_MSG(s->kind == SL__STREAM_USER,
                "sl_stream_destroy is for streams made by sl_stream_create");
  stream_free(s);
}

sl_device_t *sl_stream_device(const sl_stream_t *s) {
  return s->dev;
}
const char *sl_stream_name(const sl_stream_t *s) {
  return s->name;
}
uint32_t sl_stream_id(const sl_stream_t *s) {
  return s->id;
}

void *sl_stream_native(const sl_stream_t *s) {
  /* CUDA: s->backend points at a struct whose first member is the
   * cudaStream_t (src/rt/cuda/backend_cuda.c) */
  return s->dev->kind == SL_DEVICE_CUDA ? *(void *const *)s->backend : NULL;
}

sl_stream_t *sl_device_default_stream(sl_device_t *dev) {
  return dev->default_stream;
}
sl_stream_t *sl_generation_stream(sl_device_t *dev) {
  return dev->gen_stream;
}

static int device_slot(const sl_device_t *dev) {
  return dev->kind == SL_DEVICE_CPU ? 0 : 1 + dev->index;
}

/* pthread key destructor: a thread that exits without sl_clear_thread_streams
 * still gets its streams drained and freed, with a warning (I5 is the rule). */
static void tls_destructor(void *unused) {
  int n = 0;
  for (int i = 0; i < SL__MAX_DEVICES; i++)
    if (t_streams[i]) {
      stream_free(t_streams[i]);
      t_streams[i] = NULL;
      n++;
    }
  if (n)
    SL_LOGW("a thread exited with %d live thread stream(s) without "
            "sl_clear_thread_streams (I5); drained them at exit",
            n);
}

static void make_key(void) {
  pthread_key_create(&g_rt.tls_key, tls_destructor);
}

sl_stream_t *sl_thread_stream(sl_device_t *dev) {
  int slot = device_slot(dev);
  if (t_streams[slot])
    return t_streams[slot];
  sl_stream_t *s;
  if (stream_new(dev, SL__STREAM_THREAD, "thread", &s) != SL_OK)
    return NULL;
  t_streams[slot] = s;
  pthread_once(&g_rt.key_once, make_key);
  pthread_setspecific(g_rt.tls_key, (void *)1);
  return s;
}

void sl_clear_thread_streams(void) {
  for (int i = 0; i < SL__MAX_DEVICES; i++)
    if (t_streams[i]) {
      stream_free(t_streams[i]);
      t_streams[i] = NULL;
    }
  pthread_once(&g_rt.key_once, make_key);
  pthread_setspecific(g_rt.tls_key, NULL);
}

/* ---- submission
 * -------------------------------------------------------------- */

sl_status sl_stream_submit(sl_stream_t *s, sl_task_fn fn, const void *arg,
                           size_t arg_size, sl_buf_t *const *bufs, size_t nbufs,
                           uint64_t *seq_out) {
  if (!s || !fn || (nbufs && !bufs) || (arg_size && !arg))
    return SL_ERR_INVALID_ARG;
  size_t bufs_bytes, total;
  if (!sl_mul_ok(nbufs, sizeof(sl_buf_t *), &bufs_bytes))
    return SL_ERR_OVERFLOW;
  /* keep the arg bytes max-aligned after the buffer list */
  size_t arg_off = (bufs_bytes + _Alignof(max_align_t) - 1) &
                   ~(size_t)(_Alignof(max_align_t) - 1);
  if (arg_off > SIZE_MAX - sizeof(sl__task) - arg_size)
    return SL_ERR_OVERFLOW;
  total = sizeof(sl__task) + arg_off + arg_size;
  sl__task *t = sl_malloc(total);
  if (!t)
    return SL_ERR_NOMEM;
  t->fn = fn;
  t->ctx.stream = s;
  t->ctx.native = sl_stream_native(s);
  t->bufs = (sl_buf_t **)t->storage;
  t->nbufs = nbufs;
  if (nbufs)
    memcpy(t->bufs, bufs, bufs_bytes);
  t->arg = t->storage + arg_off;
  t->arg_size = arg_size;
  if (arg_size)
    memcpy(t->arg, arg, arg_size);
  t->next = NULL;

  /* A released buffer in a submission is a bug: abort naming both sides. */
  sl__alloc_check_live(bufs, nbufs, s);
  pthread_mutex_lock(&s->submit_mu);
  uint64_t seq = atomic_load(&s->submitted) + 1;
  t->ctx.seq = seq;
  sl_status st;
  if (s->dev->ops->runs_inline) {
    st = s->dev->ops->submit(s, t); /* runs t->fn now; t stays ours */
    if (st == SL_OK)
      atomic_store(&s->submitted, seq);
    sl_free(t);
  } else {
    atomic_store(&s->submitted, seq); /* before the worker can complete it */
    st = s->dev->ops->submit(s, t);   /* takes t on success */
    if (st != SL_OK) {
      atomic_store(&s->submitted, seq - 1);
      sl_free(t);
    }
  }
  /* Record the uses before returning, so that a buffer the caller releases
   * next stays RETIRING until this task is done (I1). A task that already
   * finished just leaves a completed use. */
  if (st == SL_OK)
    sl__alloc_record_uses(s->dev, bufs, nbufs, s, seq);
  pthread_mutex_unlock(&s->submit_mu);
  if (st == SL_OK && seq_out)
    *seq_out = seq;
  return st;
}

static sl_status take_error(sl_stream_t *s, const char *what) {
  int e = atomic_exchange(&s->error, 0);
  if (e == SL_ERR_DEVICE_FATAL)
    sl__device_fatal(s->dev, what, s->name);
  return (sl_status)e;
}

/* Blocks until seq has completed on s, under the drain watchdog. Leaves the
 * stream's error in place. */
static sl_status wait_done(sl_stream_t *s, uint64_t seq) {
  if (atomic_load_explicit(&s->completed, memory_order_acquire) >= seq)
    return SL_OK;
  sl_status st = s->dev->ops->wait(s, seq, deadline_from_now());
  if (st == SL_ERR_TIMEOUT)
    drain_hung(s, seq);
  if (st == SL_ERR_DEVICE_FATAL)
    sl__device_fatal(s->dev, "stream wait", s->name);
  return st;
}

sl_status sl_stream_wait_seq(sl_stream_t *s, uint64_t seq) {
  if (seq > atomic_load(&s->submitted))
    return SL_ERR_INVALID_ARG;
  sl_status st = wait_done(s, seq);
  if (st != SL_OK)
    return st;
  return take_error(s, "stream wait");
}

sl_status sl__stream_drain_keep_error(sl_stream_t *s) {
  sl_status st = wait_done(s, atomic_load(&s->submitted));
  if (st != SL_OK)
    return st;
  int e = atomic_load(&s->error);
  if (e == SL_ERR_DEVICE_FATAL)
    sl__device_fatal(s->dev, "a drain", s->name);
  return (sl_status)e;
}

sl_status sl_stream_sync(sl_stream_t *s) {
  return sl_stream_wait_seq(s, atomic_load(&s->submitted));
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

/* ---- events -----------------------------------------------------------------
 */

sl_status sl_event_record(sl_stream_t *s, sl_event *out) {
  if (!s || !out)
    return SL_ERR_INVALID_ARG;
  out->stream = s;
  out->seq = atomic_load(&s->submitted);
  return SL_OK;
}

sl_status sl_stream_wait_event(sl_stream_t *waiter, sl_event ev) {
  if (!waiter || !ev.stream || waiter->dev != ev.stream->dev)
    return SL_ERR_INVALID_ARG;
  if (ev.stream == waiter || sl_stream_done(ev.stream, ev.seq))
    return SL_OK;
  return waiter->dev->ops->wait_event(waiter, ev);
}

bool sl_event_done(sl_event ev) {
  return ev.stream == NULL || sl_stream_done(ev.stream, ev.seq);
}

/* ---- devices
 * ------------------------------------------------------------------ */

static sl_status device_open(sl_device_kind kind, int index,
                             const sl__backend_ops *ops, sl_device_t **out) {
  sl_device_t *dev = sl_calloc(1, sizeof *dev);
  if (!dev)
    return SL_ERR_NOMEM;
  dev->kind = kind;
  dev->index = index;
  dev->ops = ops;
  if (kind == SL_DEVICE_CPU)
    snprintf(dev->name, sizeof dev->name, "cpu");
  else
    snprintf(dev->name, sizeof dev->name, "cuda:%d", index);
  pthread_mutex_init(&dev->streams_mu, NULL);
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&dev->access_mu, &ma);
  pthread_mutexattr_destroy(&ma);
  sl__alloc_init(dev);
  sl_status st = ops->device_open(dev);
  if (st != SL_OK)
    goto fail_open;
  st = stream_new(dev, SL__STREAM_DEFAULT, "default", &dev->default_stream);
  if (st != SL_OK)
    goto fail_default;
  st = stream_new(dev, SL__STREAM_GENERATION, "generation", &dev->gen_stream);
  if (st != SL_OK)
    goto fail_gen;
  *out = dev;
  return SL_OK;
fail_gen:
  stream_free(dev->default_stream);
fail_default:
  ops->device_close(dev);
fail_open:
  sl__alloc_fini(dev);
  pthread_mutex_destroy(&dev->access_mu);
  pthread_mutex_destroy(&dev->streams_mu);
  sl_free(dev);
  return st;
}

sl_status sl_device_get(sl_device_kind kind, int index, sl_device_t **out) {
  if (!out || index < 0)
    return SL_ERR_INVALID_ARG;
  const sl__backend_ops *ops;
  int slot;
  if (kind == SL_DEVICE_CPU) {
    if (index != 0)
      return SL_ERR_NO_DEVICE;
    ops = &sl__cpu_backend;
    slot = 0;
  } else if (kind == SL_DEVICE_CUDA) {
    ops = sl__cuda_backend();
    if (!ops)
      return SL_ERR_UNSUPPORTED;
    if (index >= SL__MAX_CUDA)
      return SL_ERR_NO_DEVICE;
    slot = 1 + index;
  } else {
    return SL_ERR_INVALID_ARG;
  }
  (void)sl_rt_debug(); /* fix the debug mode before any buffer exists */
  pthread_mutex_lock(&g_rt.mu);
  sl_status st = SL_OK;
  if (!g_rt.devices[slot])
    st = device_open(kind, index, ops, &g_rt.devices[slot]);
  if (st == SL_OK)
    *out = g_rt.devices[slot];
  pthread_mutex_unlock(&g_rt.mu);
  return st;
}

sl_device_t *sl_cpu_device(void) {
  sl_device_t *d = NULL;
  sl_status st = sl_device_get(SL_DEVICE_CPU, 0, &d);
  SL_ASSERT_MSG(st == SL_OK, "the CPU device cannot be opened");
  return d;
}

bool sl_cuda_available(void) {
  sl_device_t *d;
  return sl_device_get(SL_DEVICE_CUDA, 0, &d) == SL_OK;
}

sl_device_kind sl_device_kind_of(const sl_device_t *dev) {
  return dev->kind;
}
const char *sl_device_name(const sl_device_t *dev) {
  return dev->name;
}

int sl_device_stream_count(sl_device_t *dev) {
  pthread_mutex_lock(&dev->streams_mu);
  int n = dev->nstreams;
  pthread_mutex_unlock(&dev->streams_mu);
  return n;
}

/* Calls fn on every registered stream of dev, holding the registry lock (fn
 * must not create or destroy streams). */
void sl__device_each_stream(sl_device_t *dev,
                            void (*fn)(sl_stream_t *s, void *ud), void *ud) {
  pthread_mutex_lock(&dev->streams_mu);
  for (sl_stream_t *s = dev->streams; s; s = s->reg_next)
    fn(s, ud);
  pthread_mutex_unlock(&dev->streams_mu);
}

void sl_rt_shutdown(void) {
  sl_clear_thread_streams();
  pthread_mutex_lock(&g_rt.mu);
  for (int i = SL__MAX_DEVICES - 1; i >= 0; i--) {
    sl_device_t *dev = g_rt.devices[i];
    if (!dev)
      continue;
    g_rt.devices[i] = NULL;
    if (dev->nstreams > 2)
      SL_LOGW("%s: %d stream(s) still alive at shutdown", dev->name,
              dev->nstreams - 2);
    /* user streams left alive are the caller's leak; free them anyway */
    while (dev->streams) {
      sl_stream_t *s = dev->streams;
      stream_free(s);
    }
    sl__alloc_fini(dev);
    dev->ops->device_close(dev);
    pthread_mutex_destroy(&dev->access_mu);
    pthread_mutex_destroy(&dev->streams_mu);
    sl_free(dev);
  }
  pthread_mutex_unlock(&g_rt.mu);
}

#ifndef SLUICE_HAVE_CUDA
const sl__backend_ops *sl__cuda_backend(void) {
  return NULL;
}
#endif
