/* rt internals shared by the generic runtime (stream.c, alloc.c, memsync.c)
 * and the backends (cpu/, cuda/). Nothing outside src/rt includes this. */
#ifndef SLUICE_RT_IMPL_H
#define SLUICE_RT_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "sluice/alloc.h"
#include "sluice/memsync.h"
#include "sluice/rt.h"
#include "sluice/util.h"

#define SL__MAX_CUDA    16
#define SL__MAX_DEVICES (1 + SL__MAX_CUDA) /* slot 0: cpu; 1..: cuda */

typedef enum sl__stream_kind {
  SL__STREAM_DEFAULT = 0,
  SL__STREAM_GENERATION = 1,
  SL__STREAM_THREAD = 2,
  SL__STREAM_USER = 3,
} sl__stream_kind;

/* One queued task. CPU: heap-allocated, owned by the queue, freed by the
 * worker. CUDA: lives on the submitter's stack during the submit call. */
typedef struct sl__task {
  sl_task_fn fn;
  sl_task_ctx ctx;
  sl_buf_t **bufs; /* the declared buffers (points into `storage`) */
  size_t nbufs;
  void *arg;
  size_t arg_size;
  struct sl__task *next;
  /* bufs then arg bytes follow, max-aligned */
  _Alignas(max_align_t) unsigned char storage[];
} sl__task;

struct sl_stream {
  sl_device_t *dev;
  uint32_t id;
  sl__stream_kind kind;
  char name[48];
  _Atomic uint64_t submitted;
  _Atomic uint64_t completed;
  _Atomic int error;          /* first sl_status a task returned, or 0 */
  pthread_mutex_t submit_mu;  /* orders seq assignment with the backend */
  void *backend;              /* backend-private state */
  struct sl_stream *reg_next; /* device registry (under dev->streams_mu) */
  pthread_t creator;          /* for thread-local streams */
  _Atomic int refs; /* 1 for the owner, +1 per queued cross-stream wait */
  /* Clear evidence (memsync.c), attributed to this stream: [0] from clears
   * made with this stream as the owner, [1] from everyone else's. */
  struct {
    _Atomic uint64_t clears, bytes_last, tasks_last, ns_last, ns_max;
  } ev[2];
  /* The completion watch (memsync.c): a clear that found this stream's work
   * pending sets watch_seq; whoever publishes completion of that seq stamps
   * the time. Nothing is submitted to the stream. */
  _Atomic uint64_t watch_seq; /* 0: none */
  _Atomic uint64_t watch_t0;
  _Atomic int watch_side; /* index into ev[] */
  /* What the worker is running (CPU), for the drain watchdog's report. */
  _Atomic uint64_t running_seq;
  _Atomic(sl_task_fn) running_fn;
};

/* Makes a stream of `kind` on dev and registers it (stream.c). */
sl_status sl__stream_new(sl_device_t *dev, sl__stream_kind kind,
                         const char *name, sl_stream_t **out);
/* Drains s, makes the allocator forget it, tears it down (stream.c). */
void sl__stream_free(sl_stream_t *s);

/* References keep a destroyed (drained) stream's struct readable by tasks on
 * other streams that still wait on its timeline. */
void sl__stream_ref(sl_stream_t *s);
void sl__stream_unref(sl_stream_t *s);

typedef struct sl__backend_ops {
  const char *name;
  /* Opens the device; stores private state in dev->backend. */
  sl_status (*device_open)(sl_device_t *dev);
  void (*device_close)(sl_device_t *dev);
  /* Makes the backend side of `s` (kind already set). */
  sl_status (*stream_init)(sl_stream_t *s);
  /* Tears down a drained stream (stops its worker, destroys its queue). */
  void (*stream_fini)(sl_stream_t *s);
  /* Optional: frees what other streams' waits may still read (mutexes,
   * condition variables), when the stream's last reference goes. */
  void (*stream_free_state)(sl_stream_t *s);
  /* Queues `t` (seq already in t->ctx.seq). CPU: takes ownership of the heap
   * task. CUDA: runs t->fn now on the calling thread (with the task set as
   * current, see sl__task_enter), then records completion of seq. On failure
   * the task has not run and nothing is queued; the caller still owns it. */
  sl_status (*submit)(sl_stream_t *s, sl__task *t);
  /* True when `submit` runs the task on the calling thread (CUDA). */
  bool runs_inline;
  /* Blocks until completed >= seq, or until `deadline_ns` (sl_now_ns clock)
   * has passed: then returns SL_ERR_TIMEOUT with nothing changed. */
  sl_status (*wait)(sl_stream_t *s, uint64_t seq, uint64_t deadline_ns);
  /* Updates s->completed from the device without blocking. */
  void (*poll)(sl_stream_t *s);
  /* Later work on `waiter` waits for (ev.stream, ev.seq). */
  sl_status (*wait_event)(sl_stream_t *waiter, sl_event ev);
  /* Host <-> device copies, performed inside a task on ctx->native. */
  sl_status (*copy)(const sl_task_ctx *ctx, void *dst, const void *src,
                    size_t n, bool to_device);
  void *(*mem_alloc)(sl_device_t *dev, size_t n);
  void (*mem_free)(sl_device_t *dev, void *p, size_t n);
  /* Optional: after a batch of mem_free calls, returns freed memory to the
   * system (CUDA: the stream-ordered pool is trimmed). */
  void (*mem_trim)(sl_device_t *dev);
  /* Debug mode: fill / check the poison pattern (synchronous). */
  void (*poison)(sl_device_t *dev, void *p, size_t n);
  bool (*poison_intact)(sl_device_t *dev, const void *p, size_t n);
  uint64_t (*footprint)(sl_device_t *dev);
  /* bytes that can still be allocated on the device (0 when unknown) */
  uint64_t (*mem_avail)(sl_device_t *dev, uint64_t *total);
} sl__backend_ops;

/* ---- allocator internals (alloc.c) ---- */

typedef enum sl__buf_state {
  SL__BUF_ACTIVE = 1,
  SL__BUF_RETIRING = 2,
  SL__BUF_CACHED = 3,
  SL__BUF_QUARANTINE = 4, /* debug mode: released memory kept poisoned */
  SL__BUF_FREED = 5,      /* debug mode: memory returned, struct kept */
} sl__buf_state;

typedef struct sl__buf_use {
  sl_stream_t *stream;
  uint64_t seq; /* the last use on that stream */
} sl__buf_use;

#define SL__BUF_INLINE_USES 4

typedef struct sl__link {
  struct sl__link *prev, *next;
} sl__link;

/* A circular list with a sentinel head. */
typedef struct sl__list {
  sl__link head;
  size_t n;
} sl__list;

struct sl_buf {
  void *ptr;
  size_t size;  /* requested */
  size_t bytes; /* bucket size actually held */
  int bucket;
  uint64_t id;
  sl_device_t *dev;
  sl_stream_t *owner;
  sl__buf_state state;
  uint64_t release_ns;
  uint32_t nuses, cap_uses;
  sl__buf_use *uses; /* inline_uses or a heap array */
  sl__buf_use inline_uses[SL__BUF_INLINE_USES];
  sl__link link; /* the list of its state (per bucket when CACHED) */
  sl__link lru;  /* the global CACHED list, oldest first */
};

#define SL__NBUCKETS 168

typedef struct sl__allocator {
  pthread_mutex_t mu;
  sl__list active;
  sl__list retiring;
  sl__list cached[SL__NBUCKETS]; /* per bucket, oldest first */
  sl__list lru;                  /* every CACHED buffer, oldest first */
  sl__list quarantine;           /* debug mode, oldest first */
  sl__list graveyard;            /* debug mode: freed structs */
  /* Memory released under `mu`, returned to the backend after `mu` is
   * dropped (sl__alloc_flush_frees), so that a driver free that waits for
   * the device never stalls another thread's allocator call. */
  struct {
    void *ptr;
    size_t bytes;
  } * to_free;
  size_t n_to_free, cap_to_free;
  int fail_allocs; /* test hook: the next N allocations fail as OOM */
  uint64_t quarantine_bytes;
  uint64_t next_id;
  bool limit_set_cache; /* cache limit chosen by the user */
  sl_alloc_stats st;
} sl__allocator;

struct sl_device {
  sl_device_kind kind;
  int index;
  char name[16];
  const sl__backend_ops *ops;
  void *backend;
  sl_stream_t *default_stream;
  sl_stream_t *gen_stream;
  pthread_mutex_t streams_mu;
  sl_stream_t *streams; /* registry of every live stream */
  int nstreams;
  pthread_mutex_t access_mu; /* recursive buffer-access lock */
  /* clears' waits for it and holds of it (written under it, read
   * lock-free: sl_buffer_access_stats) */
  _Atomic uint64_t lk_clears, lk_wait_total, lk_wait_max, lk_hold_total,
      lk_hold_max;
  _Atomic uint64_t lk_wait_hist[SL_LOCK_HIST_BUCKETS];
  sl__allocator alloc;
  /* in-flight time at clears of their own streams (lock-free: stamped by
   * completion watches) */
  _Atomic uint64_t inflight_ns_last, inflight_ns_max, inflight_ns_total;
};

/* ---- shared helpers ---- */

/* Backends. The CUDA one is NULL when sluice is built without CUDA. */
extern const sl__backend_ops sl__cpu_backend;
const sl__backend_ops *sl__cuda_backend(void);

/* The task the calling thread is running (CPU worker) or enqueueing (CUDA
 * submit), or NULL. Set by the backend around t->fn. */
void sl__task_enter(const sl__task *t);
void sl__task_leave(void);
const sl__task *sl__task_current(void);

/* Runs `t` as the current task and stores a non-OK result as the stream's
 * error. Used by backends. */
sl_status sl__task_run(sl__task *t);

/* Publishes completion of `seq` on `s` (CPU worker, CUDA poll) and stamps a
 * completion watch that `seq` satisfies. Lock-free. */
void sl__stream_set_completed(sl_stream_t *s, uint64_t seq);

/* Drains `s` (under the watchdog) and returns the error a task reported
 * since the last sync WITHOUT taking it: the stream's owner still gets it at
 * its next sync. A fatal error ends the process (I6). */
sl_status sl__stream_drain_keep_error(sl_stream_t *s);

/* Resolves `s`'s completion watch if its seq has completed. Lock-free. */
void sl__stream_watch_check(sl_stream_t *s);

/* The drain deadline in ns (SLUICE_DRAIN_DEADLINE_S, sl_rt_set_drain_deadline
 * _ms); past it a wait is a hung device or a lost wakeup (I6). */
uint64_t sl__drain_deadline_ns(void);

/* I6: logs `what` and `detail` and ends the process with
 * SL_EXIT_DEVICE_FATAL. */
_Noreturn void sl__device_fatal(sl_device_t *dev, const char *what,
                                const char *detail);

/* Allocator lifecycle (alloc.c). */
void sl__alloc_init(sl_device_t *dev);
void sl__alloc_fini(sl_device_t *dev);
/* Records the uses of a task's buffers (under the allocator lock). */
void sl__alloc_record_uses(sl_device_t *dev, sl_buf_t *const *bufs, size_t n,
                           sl_stream_t *s, uint64_t seq);
/* Drops every use record and ownership that names `s` (drained). */
void sl__alloc_forget_stream(sl_device_t *dev, sl_stream_t *s);
/* Calls fn on every registered stream of dev under the registry lock. */
void sl__device_each_stream(sl_device_t *dev,
                            void (*fn)(sl_stream_t *s, void *ud), void *ud);
/* Check at submit time: every buffer live (a released one aborts). */
void sl__alloc_check_live(sl_buf_t *const *bufs, size_t n, sl_stream_t *s);
/* Bytes of buffers with pending uses, per stream: the clear's evidence. */
typedef struct sl__inflight {
  sl_stream_t *stream;
  uint64_t bytes;
} sl__inflight;

/* Returns CACHED (and quarantined) buffers to the system and returns the
 * bytes freed. Fills inflight[i].bytes with the bytes of buffers that have a
 * use pending on inflight[i].stream (I2), and records in the stats the sum
 * over the first `n_own` entries (the streams the clear drained). */
uint64_t sl__alloc_clear(sl_device_t *dev, sl__inflight *inflight, size_t n,
                         size_t n_own, const char *site);
/* Returns memory released under the allocator lock to the backend. Call with
 * no allocator lock held. */
void sl__alloc_flush_frees(sl_device_t *dev);
/* Debug mode: checks a CPU task's declared buffers before it runs. */
void sl__alloc_check_task_bufs(const sl__task *t);

/* Test hook: marks `b` CACHED at once, skipping its pending uses (a planted
 * bookkeeping bug, so that debug mode can be shown to catch it). */
void sl__alloc_plant_early_retire(sl_buf_t *b);

#endif
