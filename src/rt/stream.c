/* Streams, submission, waits and events; backend-independent. Devices live
 * in device.c; the timeline (completion, watches, the task protocol, debug
 * mode, I6's exits) in timeline.c, below both.
 *
 * Process state: `g_streams` below (stream ids, the thread-stream key).
 * Thread-local streams hang off a _Thread_local table.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt/rt_impl.h"

static struct {
  _Atomic uint32_t next_stream_id;
  pthread_key_t tls_key;
  pthread_once_t key_once;
} g_rt = {
    .key_once = PTHREAD_ONCE_INIT,
};

/* The calling thread's thread-local streams, one slot per device. */
static _Thread_local sl_stream_t *t_streams[SL__MAX_DEVICES];

/* ---- the drain watchdog (I6) ---- */

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

/* ---- streams ---- */

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

sl_status sl__stream_new(sl_device_t *dev, sl__stream_kind kind,
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
void sl__stream_free(sl_stream_t *s) {
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
  return sl__stream_new(dev, SL__STREAM_USER, name ? name : "user", out);
}

void sl_stream_destroy(sl_stream_t *s) {
  if (!s)
    return;
  SL_ASSERT_MSG(s->kind == SL__STREAM_USER,
                "sl_stream_destroy is for streams made by sl_stream_create");
  sl__stream_free(s);
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
      sl__stream_free(t_streams[i]);
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
  if (sl__stream_new(dev, SL__STREAM_THREAD, "thread", &s) != SL_OK)
    return NULL;
  t_streams[slot] = s;
  pthread_once(&g_rt.key_once, make_key);
  pthread_setspecific(g_rt.tls_key, (void *)1);
  return s;
}

void sl_clear_thread_streams(void) {
  for (int i = 0; i < SL__MAX_DEVICES; i++)
    if (t_streams[i]) {
      sl__stream_free(t_streams[i]);
      t_streams[i] = NULL;
    }
  pthread_once(&g_rt.key_once, make_key);
  pthread_setspecific(g_rt.tls_key, NULL);
}

/* ---- submission ---- */

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

/* ---- events ---- */

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
