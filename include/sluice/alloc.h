/* sluice — the stream-ordered caching allocator.
 *
 * Tensor memory comes only from here. Each device has one allocator with a
 * cache in size buckets. A buffer records its owning stream (the stream it
 * was allocated for) and its last use on each stream that touched it.
 *
 * Lifecycle (I1, I2):
 *   ACTIVE   --sl_buf_release-->  RETIRING  --all uses completed-->  CACHED
 *   CACHED   --reused by sl_buf_alloc--> ACTIVE
 *   CACHED   --clear / trim-->            returned to the system
 * A RETIRING buffer is never reused and never freed.
 *
 * Threading: every function is thread-safe.
 */
#ifndef SLUICE_ALLOC_H
#define SLUICE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "sluice/rt.h"

/* Allocates `size` bytes of device memory owned by stream `owner`, reusing a
 * CACHED buffer of the same bucket when there is one. Fails with
 * SL_ERR_MEMORY_LIMIT when the allocation would pass the memory limit even
 * after trimming the cache, SL_ERR_DEVICE_OOM when the backend has no memory;
 * it never aborts. The caller owns *out and gives it back with
 * sl_buf_release(). */
sl_status sl_buf_alloc(sl_stream_t *owner, size_t size, sl_buf_t **out);

/* Gives `b` back. It becomes RETIRING until every recorded use has completed,
 * then CACHED. Takes ownership; `b` must not be used afterwards. NULL is a
 * no-op. */
void sl_buf_release(sl_buf_t *b);

/* The buffer's memory. Inside a task (CPU) or while enqueueing one (CUDA), in
 * debug mode, checks that the buffer is live and that the running task's
 * stream has a recorded use of it; a violation aborts naming both sides. */
void *sl_buf_ptr(sl_buf_t *b);

size_t sl_buf_size(const sl_buf_t *b); /* the size asked for */
sl_stream_t *sl_buf_owner(const sl_buf_t *b);
uint64_t sl_buf_id(const sl_buf_t *b); /* unique, for messages */

/* Records a use of `b` at task `seq` of stream `s`, for work that was queued
 * on `s` outside sl_stream_submit (a library that enqueues on our stream).
 * sl_stream_submit does this itself for the buffers it is given. */
sl_status sl_buf_record_use(sl_buf_t *b, sl_stream_t *s, uint64_t seq);

/* The latest use of b recorded on stream s (the task sequence number), 0
 * when none is: a reader's check that its work counts as a use (I1). */
uint64_t sl_buf_use_seq(sl_buf_t *b, const sl_stream_t *s);

/* Host <-> buffer copies, in stream order on the buffer's owner; they block
 * until done. */
sl_status sl_buf_write(sl_buf_t *b, size_t off, const void *src, size_t n);
sl_status sl_buf_read(sl_buf_t *b, size_t off, void *dst, size_t n);

typedef struct sl_alloc_stats {
  /* bytes */
  uint64_t active;   /* held by callers */
  uint64_t retiring; /* released, with uses still pending */
  uint64_t cache;    /* CACHED, reusable */
  uint64_t peak;     /* highest active + retiring seen */
  uint64_t reserved; /* obtained from the system: active+retiring+cache */
  uint64_t limit;    /* memory limit (0: none) */
  uint64_t cache_limit;
  /* counters */
  uint64_t allocs;
  uint64_t cache_hits;
  uint64_t clears;
  uint64_t trims;          /* cache releases forced by a limit */
  uint64_t bytes_released; /* returned to the system, all causes */
  uint64_t limit_failures; /* allocations refused by the memory limit */
  /* work in flight at clears (I2), on the streams each clear drained (its
   * own stream and the default stream; every stream for drain_all): after a
   * correct drain these stay 0. Work of other streams is attributed to them
   * (sl_stream_clear_evidence). */
  uint64_t clears_with_inflight;
  uint64_t inflight_bytes_last; /* bytes with pending uses at the last clear */
  uint64_t inflight_bytes_max;
  double inflight_ms_last; /* time until that work ended */
  double inflight_ms_max;
  double inflight_ms_total;
} sl_alloc_stats;

/* Snapshot of `dev`'s allocator. In-flight milliseconds of a clear are known
 * only once that work has finished; until then they read as 0. */
sl_alloc_stats sl_alloc_get_stats(sl_device_t *dev);

/* Fault injection (tests): the next `n` allocations on `dev` that would
 * obtain memory fail exactly as an exhausted device does: the cache is given
 * back, then SL_ERR_DEVICE_OOM. 0 turns it off. */
void sl_alloc_inject_oom(sl_device_t *dev, int n);

/* Sets the memory limit in bytes (0: none). Allocations that would take
 * active + retiring + new past it fail with SL_ERR_MEMORY_LIMIT. */
void sl_alloc_set_limit(sl_device_t *dev, uint64_t bytes);

/* Sets the cache limit. Past it, the oldest CACHED buffers are returned to
 * the system. The default is 1/4 of the memory limit, or 1 GiB without one. */
void sl_alloc_set_cache_limit(sl_device_t *dev, uint64_t bytes);

/* Moves every RETIRING buffer whose uses have completed to CACHED. Never
 * blocks on streams. */
void sl_alloc_collect(sl_device_t *dev);

#endif
