/* sluice — rt: devices, streams, events and timelines.
 *
 * A stream is an in-order queue of work on one device. CPU: a worker thread
 * runs the stream's tasks in order. CUDA: a cudaStream_t; a task's function
 * runs on the submitting thread and enqueues device work on the native stream.
 *
 * Each stream keeps a timeline: `submitted` is the sequence number of the last
 * task submitted, `completed` that of the last task finished. A task's
 * sequence number is its position on that stream (1, 2, ...).
 *
 * Every device has three kinds of stream, and they are distinct objects:
 *   - the device default stream      sl_device_default_stream()
 *   - the default generation stream  sl_generation_stream()
 *   - thread-local streams           sl_thread_stream(), one per thread
 * Draining one drains no other (DESIGN.md, "Threads and streams").
 *
 * Buffers (sluice/alloc.h) used by a task are named at submission; the
 * allocator then knows each buffer's uses per stream (I1).
 */
#ifndef SLUICE_RT_H
#define SLUICE_RT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/status.h"

typedef enum sl_device_kind {
  SL_DEVICE_CPU = 0,
  SL_DEVICE_CUDA = 1,
} sl_device_kind;

typedef struct sl_device sl_device_t;
typedef struct sl_stream sl_stream_t;
typedef struct sl_buf sl_buf_t;

/* Process exit code used when a fatal device error ends the process (I6). */
#define SL_EXIT_DEVICE_FATAL 86

/* ---- devices --------------------------------------------------------------
 */

/* Looks up (and on first use opens) device `index` of `kind`. Devices live
 * until sl_rt_shutdown(). Returns SL_ERR_NO_DEVICE when the backend or the
 * device is missing (CUDA without a GPU), SL_ERR_UNSUPPORTED when sluice was
 * built without that backend. Thread-safe. */
sl_status sl_device_get(sl_device_kind kind, int index, sl_device_t **out);

/* Convenience: the CPU device (never fails). */
sl_device_t *sl_cpu_device(void);

/* True when a CUDA device can be opened (false without a GPU or driver). */
bool sl_cuda_available(void);

sl_device_kind sl_device_kind_of(const sl_device_t *dev);
const char *sl_device_name(const sl_device_t *dev); /* "cpu", "cuda:0" */

/* Bytes that can still be allocated on `dev` (CUDA: free device memory;
 * CPU: MemAvailable), and in *total (may be NULL) the device's size. 0 when
 * unknown. */
uint64_t sl_device_mem_available(sl_device_t *dev, uint64_t *total);

/* Number of live streams of `dev`, the two built-in ones included. */
int sl_device_stream_count(sl_device_t *dev);

/* Destroys every device and stream. Only at process end, with no other thread
 * using the runtime. Idempotent. */
void sl_rt_shutdown(void);

/* ---- streams ----------------------------------------------------------------
 */

/* The device default stream. Borrowed; lives as long as the device. On CUDA
 * it is the legacy default stream; engine streams do not synchronize with it.
 */
sl_stream_t *sl_device_default_stream(sl_device_t *dev);

/* The process default generation stream, for library code with no engine in
 * scope. Borrowed; lives as long as the device. */
sl_stream_t *sl_generation_stream(sl_device_t *dev);

/* The calling thread's own stream on `dev`, made on first use (the analogue of
 * MLX's new_thread_local_stream). Borrowed; lives until the thread calls
 * sl_clear_thread_streams() (I5). Returns NULL if it cannot be made. */
sl_stream_t *sl_thread_stream(sl_device_t *dev);

/* Makes a new stream on `dev`; the caller destroys it with
 * sl_stream_destroy(). */
sl_status sl_stream_create(sl_device_t *dev, const char *name,
                           sl_stream_t **out);

/* Drains `s` and destroys it. Not for the built-in or thread-local streams. */
void sl_stream_destroy(sl_stream_t *s);

sl_device_t *sl_stream_device(const sl_stream_t *s);
const char *sl_stream_name(const sl_stream_t *s); /* "cpu/thread:3", ... */
uint32_t sl_stream_id(const sl_stream_t *s);      /* unique in the process */

/* The native handle: a cudaStream_t on CUDA, NULL on the CPU. */
void *sl_stream_native(const sl_stream_t *s);

/* ---- tasks ------------------------------------------------------------------
 */

typedef struct sl_task_ctx {
  sl_stream_t *stream;
  uint64_t seq; /* this task's sequence number on `stream` */
  void *native; /* cudaStream_t on CUDA, NULL on the CPU */
} sl_task_ctx;

/* A task. CPU: runs on the stream's worker thread. CUDA: runs on the
 * submitting thread during sl_stream_submit and enqueues its device work on
 * ctx->native. `arg` points at the task's own copy of the submitted bytes.
 * A non-OK return is kept as the stream's error; SL_ERR_DEVICE_FATAL ends the
 * process at the next sync (I6). */
typedef sl_status (*sl_task_fn)(const sl_task_ctx *ctx, void *arg);

/* Submits a task on `s` without waiting (the async_eval analogue).
 * `arg`/`arg_size` are copied into the task. `bufs` names every buffer the task
 * touches; each gets a use recorded at the task's sequence number. The
 * buffers must be live (not released); in debug mode a released one aborts.
 * On success stores the task's sequence number in *seq_out (may be NULL).
 * On failure the task is not queued and no use is recorded.
 * Thread-safe; tasks from one thread run in submission order. */
sl_status sl_stream_submit(sl_stream_t *s, sl_task_fn fn, const void *arg,
                           size_t arg_size, sl_buf_t *const *bufs, size_t nbufs,
                           uint64_t *seq_out);

/* Blocks until every task submitted on `s` before the call has completed.
 * Returns the first error a task reported since the last sync (then clears
 * it). A fatal device error ends the process (I6). */
sl_status sl_stream_sync(sl_stream_t *s);

/* Blocks until task `seq` of `s` has completed. */
sl_status sl_stream_wait_seq(sl_stream_t *s, uint64_t seq);

typedef struct sl_stream_pending {
  uint64_t submitted; /* seq of the last submitted task */
  uint64_t completed; /* seq of the last completed task */
  uint64_t tasks;     /* submitted - completed */
} sl_stream_pending;

/* Reads the stream's timeline without blocking. */
sl_stream_pending sl_stream_query(sl_stream_t *s);

/* True when `seq` has completed on `s` (never blocks). */
bool sl_stream_done(sl_stream_t *s, uint64_t seq);

/* Evidence of work in flight at clears (I2), attributed to the stream whose
 * work it was. `own`: clears that drained this stream first (its owner's
 * sl_sync_and_clear_cache(s); anyone's clear for the default stream; every
 * drain_all), so any count here is a broken drain. `others`: clears that did
 * not drain it and found its work pending (the seed's bare clear, another
 * engine's clear). Nothing is
 * ever submitted to a stream to measure it: the time is stamped when the
 * stream publishes completion of the work that was pending. */
typedef struct sl_clear_evidence {
  uint64_t clears;     /* clears that found this stream's work pending */
  uint64_t bytes_last; /* bytes with a use pending on it, at the last one */
  uint64_t tasks_last; /* its tasks pending then */
  double ms_last;      /* how long after that clear the work ended; 0 until
                          it has */
  double ms_max;
} sl_clear_evidence;

typedef struct sl_stream_evidence {
  sl_clear_evidence own, others;
} sl_stream_evidence;

sl_stream_evidence sl_stream_clear_evidence(sl_stream_t *s);

/* The drain watchdog (I6): a wait on a stream that has not completed after
 * `ms` milliseconds is a hung device or a lost wakeup. It logs the stream and
 * the task it is stuck on and ends the process with SL_EXIT_DEVICE_FATAL.
 * Default: SLUICE_DRAIN_DEADLINE_S from the environment, else 600 s. */
void sl_rt_set_drain_deadline_ms(uint64_t ms);

/* ---- events -----------------------------------------------------------------
 */

/* A point on one stream's timeline: (stream, seq). Plain value, no cleanup. */
typedef struct sl_event {
  sl_stream_t *stream;
  uint64_t seq;
} sl_event;

/* Marks the current end of `s` (all work submitted so far). */
sl_status sl_event_record(sl_stream_t *s, sl_event *out);

/* Makes later work on `waiter` wait until `ev` has completed, without blocking
 * the caller. Both streams must be on the same device. */
sl_status sl_stream_wait_event(sl_stream_t *waiter, sl_event ev);

/* True when the event's work has completed. */
bool sl_event_done(sl_event ev);

/* ---- debug mode (I8)
 * ------------------------------------------------------------ */

/* True when debug mode is on: built with SLUICE_DEBUG_RT, or the environment
 * variable SLUICE_DEBUG_RT=1 at first runtime use. */
bool sl_rt_debug(void);

/* Overrides debug mode (tests). Call before the first device is opened. */
void sl_rt_set_debug(bool on);

#endif
