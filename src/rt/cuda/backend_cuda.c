/* CUDA backend: a stream is a cudaStream_t; completion is tracked with events.
 *
 * Written in C11 against the CUDA runtime's C API (cuda_runtime_api.h), so
 * that it can include rt_impl.h (C11 atomics, which nvcc's C++ cannot parse).
 * Device code lives in .cu files with a C ABI.
 *
 * Streams. The device default stream is the legacy default stream
 * (cudaStreamLegacy). Every other stream is created cudaStreamNonBlocking, so
 * that draining the default stream does not drain it, nor it the default
 * stream (DESIGN.md, "Backends/cuda": this keeps the seed's bug faithful).
 *
 * Timeline. Tasks run on the submitting thread (runs_inline) and enqueue
 * their device work on the native stream; submit then records a pooled event
 * and pushes (seq, event) on the stream's pending FIFO. poll pops the events
 * that have completed and publishes their seq as `completed`.
 *
 * Locking. Each stream has one backend mutex (cuda_stream.mu) guarding its
 * FIFO and its event pool; it is the innermost lock of the runtime
 * (submit_mu -> allocator mutex -> cuda_stream.mu), and nothing that blocks
 * on the device is called under it.
 *
 * The evidence of work in flight at a clear submits nothing: poll publishes
 * completion through sl__stream_set_completed, which stamps the clear's
 * completion watch (memsync.c). cudaFree runs outside the allocator's mutex
 * (alloc.c returns memory after the lock is dropped), so one engine's clear
 * never stalls another engine's allocations behind the device.
 *
 * The drain watchdog (I6): wait() polls the event with a backoff up to the
 * caller's deadline instead of blocking in cudaEventSynchronize.
 *
 * Fatal errors (I6): a sticky CUDA error (the context is unusable) met in a
 * submit, a poll or a wait ends the process through sl__device_fatal.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rt/cuda/cuda_hooks.h"
#include "rt/rt_impl.h"

#define POISON_BYTE  0xA5
#define POISON_CHUNK (1u << 20)

/* One recorded event: the end of task `seq`. */
typedef struct ev_node {
  uint64_t seq;
  cudaEvent_t ev;
  int refs;    /* waiters blocked on `ev` outside the lock */
  bool popped; /* left the FIFO while refs > 0; the last waiter recycles it */
  struct ev_node *next;
} ev_node;

/* The backend side of a stream. `native` must stay the FIRST member:
 * sl_stream_native() reads it as *(void **)s->backend. */
typedef struct cuda_stream {
  cudaStream_t native;
  bool owned;           /* created here (not the legacy default stream) */
  pthread_mutex_t mu;   /* guards head/tail/pool and the nodes' refs */
  ev_node *head, *tail; /* pending events, oldest first */
  ev_node *pool;        /* free nodes, each with its event */
} cuda_stream;

typedef struct cuda_device {
  cudaStream_t util; /* private non-blocking stream for debug poisoning */
  cudaStream_t mem;  /* stream-ordered allocation and release */
  cudaMemPool_t pool;
} cuda_device;

static _Atomic(sl__cuda_stream_fini_fn) g_stream_fini_hook;

void sl__cuda_set_stream_fini_hook(sl__cuda_stream_fini_fn fn) {
  atomic_store(&g_stream_fini_hook, fn);
}

/* ---- errors
 * ------------------------------------------------------------------- */

/* True for errors after which the CUDA context cannot be used again. */
static bool is_sticky(cudaError_t e) {
  switch (e) {
  case cudaErrorIllegalAddress:
  case cudaErrorLaunchFailure:
  case cudaErrorIllegalInstruction:
  case cudaErrorMisalignedAddress:
  case cudaErrorInvalidAddressSpace:
  case cudaErrorInvalidPc:
  case cudaErrorHardwareStackError:
  case cudaErrorECCUncorrectable:
  case cudaErrorNvlinkUncorrectable:
  case cudaErrorAssert:
  case cudaErrorLaunchTimeout:
  case cudaErrorContextIsDestroyed:
  case cudaErrorExternalDevice:
  case cudaErrorTensorMemoryLeak:
  case cudaErrorUnknown:
    return true;
  default:
    return false;
  }
}

/* Classifies a failed CUDA call made during `what`: a sticky error ends the
 * process (I6); any other is cleared from the thread's last-error slot and
 * returns SL_ERR_DEVICE (SL_ERR_DEVICE_OOM for an allocation failure). */
static sl_status fail(sl_device_t *dev, cudaError_t e, const char *what) {
  if (is_sticky(e)) {
    char detail[256];
    snprintf(detail, sizeof detail, "%s (%s)", cudaGetErrorString(e),
             cudaGetErrorName(e));
    sl__device_fatal(dev, what, detail);
  }
  (void)cudaGetLastError();
  SL_LOGW("%s: %s failed: %s", dev->name, what, cudaGetErrorString(e));
  return e == cudaErrorMemoryAllocation ? SL_ERR_DEVICE_OOM : SL_ERR_DEVICE;
}

/* Makes dev current on the calling thread (cheap when it already is). */
static void use_device(const sl_device_t *dev) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != dev->index)
    (void)cudaSetDevice(dev->index);
}

/* ---- devices
 * ------------------------------------------------------------------- */

static sl_status cuda_device_open(sl_device_t *dev) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    /* no driver, an old driver, no device: not an error of ours */
    (void)cudaGetLastError();
    SL_LOGD("cuda: no device (%s)", cudaGetErrorString(e));
    return SL_ERR_NO_DEVICE;
  }
  if (dev->index >= count)
    return SL_ERR_NO_DEVICE;
  e = cudaSetDevice(dev->index);
  if (e == cudaSuccess)
    e = cudaFree(NULL); /* creates the primary context now, not mid-task */
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    SL_LOGW("cuda:%d cannot be opened: %s", dev->index, cudaGetErrorString(e));
    return SL_ERR_NO_DEVICE;
  }
  cuda_device *cd = sl_calloc(1, sizeof *cd);
  if (!cd)
    return SL_ERR_NOMEM;
  sl_status st;
  e = cudaStreamCreateWithFlags(&cd->util, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    st = fail(dev, e, "device open");
    goto fail_util;
  }
  e = cudaStreamCreateWithFlags(&cd->mem, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaDeviceGetDefaultMemPool(&cd->pool, dev->index);
  if (e != cudaSuccess) {
    st = fail(dev, e, "device open (memory pool)");
    cudaStreamDestroy(cd->util);
    goto fail_util;
  }
  dev->backend = cd;
  return SL_OK;
fail_util:
  sl_free(cd);
  return st;
}

static void cuda_device_close(sl_device_t *dev) {
  cuda_device *cd = dev->backend;
  if (!cd)
    return;
  use_device(dev);
  cudaStreamSynchronize(cd->mem);
  cudaStreamDestroy(cd->mem);
  cudaStreamDestroy(cd->util);
  sl_free(cd);
  dev->backend = NULL;
}

/* ---- streams
 * ------------------------------------------------------------------- */

static sl_status cuda_stream_init(sl_stream_t *s) {
  cuda_stream *cs = sl_calloc(1, sizeof *cs);
  if (!cs)
    return SL_ERR_NOMEM;
  if (s->kind == SL__STREAM_DEFAULT) {
    cs->native = cudaStreamLegacy;
  } else {
    use_device(s->dev);
    cudaError_t e =
        cudaStreamCreateWithFlags(&cs->native, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      sl_status st = fail(s->dev, e, "stream create");
      sl_free(cs);
      return st;
    }
    cs->owned = true;
  }
  pthread_mutex_init(&cs->mu, NULL);
  s->backend = cs;
  return SL_OK;
}

static void free_nodes(ev_node *n) {
  while (n) {
    ev_node *next = n->next;
    cudaEventDestroy(n->ev);
    sl_free(n);
    n = next;
  }
}

static void cuda_stream_fini(sl_stream_t *s) {
  cuda_stream *cs = s->backend;
  use_device(s->dev);
  /* drained already; be sure */
  (void)cudaStreamSynchronize(cs->native);
  sl__cuda_stream_fini_fn hook = atomic_load(&g_stream_fini_hook);
  if (hook)
    hook(s->dev->index, (void *)cs->native);
  free_nodes(cs->head);
  free_nodes(cs->pool);
  if (cs->owned)
    cudaStreamDestroy(cs->native);
  (void)cudaGetLastError();
  pthread_mutex_destroy(&cs->mu);
  sl_free(cs);
  s->backend = NULL;
}

/* Takes a node with a ready event from the pool, or makes one. Called under
 * the stream's submit_mu, not under cs->mu. */
static sl_status node_get(sl_stream_t *s, ev_node **out) {
  cuda_stream *cs = s->backend;
  pthread_mutex_lock(&cs->mu);
  ev_node *n = cs->pool;
  if (n)
    cs->pool = n->next;
  pthread_mutex_unlock(&cs->mu);
  if (!n) {
    n = sl_calloc(1, sizeof *n);
    if (!n)
      return SL_ERR_NOMEM;
    cudaError_t e = cudaEventCreateWithFlags(&n->ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      sl_free(n);
      return fail(s->dev, e, "event create");
    }
  }
  n->refs = 0;
  n->popped = false;
  n->next = NULL;
  *out = n;
  return SL_OK;
}

/* Under cs->mu. */
static void node_put_locked(cuda_stream *cs, ev_node *n) {
  n->next = cs->pool;
  cs->pool = n;
}

static sl_status cuda_submit(sl_stream_t *s, sl__task *t) {
  cuda_stream *cs = s->backend;
  sl_device_t *dev = s->dev;
  use_device(dev);
  /* a stale, non-sticky error of someone else's must not be blamed on t */
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess && is_sticky(e))
    fail(dev, e, "stream submit");
  /* I8: the task's declared buffers must be live as it enqueues */
  if (sl_rt_debug())
    sl__alloc_check_task_bufs(t);
  sl_status st = sl__task_run(t);
  if (st != SL_OK)
    return st;
  e = cudaGetLastError(); /* launch errors of the task's kernels */
  if (e != cudaSuccess)
    return fail(dev, e, "kernel launch");
  ev_node *n = NULL;
  if ((st = node_get(s, &n)) != SL_OK)
    return st;
  n->seq = t->ctx.seq;
  e = cudaEventRecord(n->ev, cs->native);
  if (e != cudaSuccess) {
    pthread_mutex_lock(&cs->mu);
    node_put_locked(cs, n);
    pthread_mutex_unlock(&cs->mu);
    return fail(dev, e, "event record");
  }
  pthread_mutex_lock(&cs->mu);
  if (cs->tail)
    cs->tail->next = n;
  else
    cs->head = n;
  cs->tail = n;
  pthread_mutex_unlock(&cs->mu);
  return SL_OK;
}

static void cuda_poll(sl_stream_t *s) {
  cuda_stream *cs = s->backend;
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&cs->mu);
  ev_node *n = NULL;
  while ((n = cs->head)) {
    e = cudaEventQuery(n->ev);
    if (e != cudaSuccess)
      break;
    cs->head = n->next;
    if (!cs->head)
      cs->tail = NULL;
    sl__stream_set_completed(s, n->seq);
    if (n->refs)
      n->popped = true;
    else
      node_put_locked(cs, n);
  }
  pthread_mutex_unlock(&cs->mu);
  if (e != cudaSuccess && e != cudaErrorNotReady) {
    /* non-sticky: keep it as the stream's error for the next sync */
    int zero = 0;
    sl_status st = fail(s->dev, e, "stream poll");
    atomic_compare_exchange_strong(&s->error, &zero, (int)st);
  }
}

/* Waits for `ev` until `deadline` (sl_now_ns clock; UINT64_MAX: forever):
 * spins briefly, then sleeps with a backoff up to 1 ms. */
static cudaError_t event_wait(cudaEvent_t ev, uint64_t deadline) {
  if (deadline == UINT64_MAX)
    return cudaEventSynchronize(ev);
  /* A step's results are waited for here: for the first 200 ms the sleep
   * stays under 20 us, so a wait ends at most ~tens of us late (the step
   * takes milliseconds); a long drain backs off to 1 ms polls. */
  unsigned sleep_us = 0;
  uint64_t t0 = sl_now_ns();
  for (;;) {
    cudaError_t e = cudaEventQuery(ev);
    if (e != cudaErrorNotReady)
      return e;
    uint64_t now = sl_now_ns();
    if (now >= deadline)
      return cudaErrorNotReady;
    if (sleep_us)
      usleep(sleep_us);
    unsigned cap = now - t0 < 200000000ull ? 16 : 1000;
    sleep_us = sleep_us ? (sleep_us * 2 < cap ? sleep_us * 2 : cap) : 1;
  }
}

static sl_status cuda_wait(sl_stream_t *s, uint64_t seq, uint64_t deadline) {
  cuda_stream *cs = s->backend;
  sl_device_t *dev = s->dev;
  pthread_mutex_lock(&cs->mu);
  ev_node *n = cs->head;
  while (n && n->seq < seq)
    n = n->next;
  if (n)
    n->refs++;
  pthread_mutex_unlock(&cs->mu);
  cudaError_t e;
  if (n) {
    /* the event of the first task at or after seq: completes no earlier */
    e = event_wait(n->ev, deadline);
    pthread_mutex_lock(&cs->mu);
    if (--n->refs == 0 && n->popped)
      node_put_locked(cs, n);
    pthread_mutex_unlock(&cs->mu);
  } else if (atomic_load_explicit(&s->completed, memory_order_acquire) >= seq) {
    e = cudaSuccess; /* a concurrent poll got there first */
  } else {
    /* every submitted task has an event; this is only a safety net */
    use_device(dev);
    e = cudaStreamSynchronize(cs->native);
    if (e == cudaSuccess)
      sl__stream_set_completed(s, seq);
  }
  if (e == cudaErrorNotReady)
    return SL_ERR_TIMEOUT; /* the drain watchdog (stream.c) reports it */
  if (e != cudaSuccess)
    return fail(dev, e, "stream wait");
  cuda_poll(s);
  return SL_OK;
}

static sl_status cuda_wait_event(sl_stream_t *waiter, sl_event ev) {
  cuda_stream *src = ev.stream->backend;
  cuda_stream *dst = waiter->backend;
  pthread_mutex_lock(&src->mu);
  ev_node *n = src->head;
  while (n && n->seq < ev.seq)
    n = n->next;
  if (n) {
    /* under src->mu, so that the event is not recycled meanwhile; the wait
     * binds to the event's current record, which is task n->seq's */
    use_device(waiter->dev);
    cudaError_t e = cudaStreamWaitEvent(dst->native, n->ev, 0);
    if (e != cudaSuccess) {
      pthread_mutex_unlock(&src->mu);
      return fail(waiter->dev, e, "stream wait event");
    }
  }
  /* no node: every task up to ev.seq has completed already */
  pthread_mutex_unlock(&src->mu);
  return SL_OK;
}

static sl_status cuda_copy(const sl_task_ctx *ctx, void *dst, const void *src,
                           size_t n, bool to_device) {
  cudaError_t e = cudaMemcpyAsync(
      dst, src, n, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
      (cudaStream_t)ctx->native);
  if (e != cudaSuccess)
    return fail(ctx->stream->dev, e, "copy");
  return SL_OK;
}

/* ---- memory
 * -------------------------------------------------------------------- */

/* Memory is stream-ordered (cudaMallocAsync / cudaFreeAsync on the device's
 * private `mem` stream): cudaFree waits for the whole device and holds the
 * driver while it does, so one engine's clear would stall every other
 * engine's allocations behind unrelated work. The allocator frees only
 * buffers whose every use has completed (I1, I2), so no cross-stream order
 * is needed for a free; an allocation is complete before it is returned. */
static void *cuda_mem_alloc(sl_device_t *dev, size_t n) {
  cuda_device *cd = dev->backend;
  use_device(dev);
  void *p = NULL;
  cudaError_t e = cudaMallocAsync(&p, n, cd->mem);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(cd->mem);
  if (e != cudaSuccess) {
    if (is_sticky(e))
      fail(dev, e, "cudaMallocAsync");
    (void)cudaGetLastError(); /* out of memory: the allocator reports it */
    return NULL;
  }
  return p;
}

static void cuda_mem_free(sl_device_t *dev, void *p, size_t n) {
  cuda_device *cd = dev->backend;
  use_device(dev);
  cudaError_t e = cudaFreeAsync(p, cd->mem);
  if (e != cudaSuccess)
    fail(dev, e, "cudaFreeAsync");
}

/* After a batch of frees: give the pool's unused memory back to the driver
 * (a clear returns memory, I2), waiting only for the `mem` stream. */
static void cuda_mem_trim(sl_device_t *dev) {
  cuda_device *cd = dev->backend;
  use_device(dev);
  cudaError_t e = cudaStreamSynchronize(cd->mem);
  if (e == cudaSuccess)
    e = cudaMemPoolTrimTo(cd->pool, 0);
  if (e != cudaSuccess)
    fail(dev, e, "memory pool trim");
}

static void cuda_poison(sl_device_t *dev, void *p, size_t n) {
  cuda_device *cd = dev->backend;
  use_device(dev);
  cudaError_t e = cudaMemsetAsync(p, POISON_BYTE, n, cd->util);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(cd->util);
  if (e != cudaSuccess)
    fail(dev, e, "poison");
}

static bool cuda_poison_intact(sl_device_t *dev, const void *p, size_t n) {
  cuda_device *cd = dev->backend;
  use_device(dev);
  size_t chunk = n < POISON_CHUNK ? n : POISON_CHUNK;
  unsigned char *h = sl_malloc(chunk ? chunk : 1);
  if (!h)
    return true; /* cannot check; do not report a false violation */
  bool ok = true;
  for (size_t off = 0; off < n && ok; off += chunk) {
    size_t len = n - off < chunk ? n - off : chunk;
    cudaError_t e = cudaMemcpyAsync(h, (const char *)p + off, len,
                                    cudaMemcpyDeviceToHost, cd->util);
    if (e == cudaSuccess)
      e = cudaStreamSynchronize(cd->util);
    if (e != cudaSuccess) {
      fail(dev, e, "poison check");
      break;
    }
    for (size_t i = 0; i < len; i++)
      if (h[i] != POISON_BYTE) {
        ok = false;
        break;
      }
  }
  sl_free(h);
  return ok;
}

/* Device memory in use, by every process: total - free. */
static uint64_t cuda_footprint(sl_device_t *dev) {
  use_device(dev);
  size_t free_b = 0, total_b = 0;
  cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  if (e != cudaSuccess) {
    fail(dev, e, "cudaMemGetInfo");
    return 0;
  }
  return (uint64_t)(total_b - free_b);
}

static uint64_t cuda_mem_avail(sl_device_t *dev, uint64_t *total) {
  use_device(dev);
  size_t free_b = 0, total_b = 0;
  cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  if (e != cudaSuccess) {
    fail(dev, e, "cudaMemGetInfo");
    return 0;
  }
  if (total)
    *total = total_b;
  return (uint64_t)free_b;
}

static const sl__backend_ops cuda_ops = {
    .name = "cuda",
    .device_open = cuda_device_open,
    .device_close = cuda_device_close,
    .stream_init = cuda_stream_init,
    .stream_fini = cuda_stream_fini,
    .submit = cuda_submit,
    .runs_inline = true,
    .wait = cuda_wait,
    .poll = cuda_poll,
    .wait_event = cuda_wait_event,
    .copy = cuda_copy,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .mem_trim = cuda_mem_trim,
    .poison = cuda_poison,
    .poison_intact = cuda_poison_intact,
    .footprint = cuda_footprint,
    .mem_avail = cuda_mem_avail,
};

const sl__backend_ops *sl__cuda_backend(void) {
  return &cuda_ops;
}
