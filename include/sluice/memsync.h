/* sluice — memsync: the one correct way to clear the cache.
 *
 * I3: engine code clears with sl_sync_and_clear_cache(stream), naming the
 * stream that carried its work (I4). Code with no engine in scope uses
 * sl_drain_all_and_clear_cache(dev). There is no stream-less clear.
 */
#ifndef SLUICE_MEMSYNC_H
#define SLUICE_MEMSYNC_H

#include <stddef.h>
#include <stdint.h>

#include "sluice/alloc.h"
#include "sluice/rt.h"

/* Under the device's recursive buffer-access lock: drains `stream`, then the
 * device default stream, then returns every CACHED buffer to the system.
 * RETIRING buffers are never freed (I2); the work still in flight on any
 * stream is measured into the allocator's in-flight counters. A fatal device
 * error ends the process (I6). Thread-safe. */
sl_status sl_sync_and_clear_cache(sl_stream_t *stream);

/* For code with no engine in scope (load-time transforms, admin actions with
 * no engine running): drains every registered stream of `dev`, then clears as
 * above. */
sl_status sl_drain_all_and_clear_cache(sl_device_t *dev);

/* Drains and destroys every thread-local stream the calling thread made (I5).
 * Call before a thread that used sl_thread_stream() exits. */
void sl_clear_thread_streams(void);

/* The device's recursive buffer-access lock. The store worker holds it while
 * it reads buffers; clears take it, so they never run during such a read. */
void sl_buffer_access_lock(sl_device_t *dev);
void sl_buffer_access_unlock(sl_device_t *dev);

/* How long clears wait for the buffer-access lock (a store batch holding
 * it) and hold it (their drain and clear), since the device opened. The
 * histogram counts waits per bucket, with upper bounds
 * sl_lock_hist_bound_ns(0..SL_LOCK_HIST_BUCKETS-1) (the last is +Inf). */
#define SL_LOCK_HIST_BUCKETS 11
uint64_t sl_lock_hist_bound_ns(int bucket); /* 0.1 ms .. 100 ms, +Inf */
typedef struct sl_access_lock_stats {
  uint64_t clears;
  uint64_t wait_ns_total, wait_ns_max;
  uint64_t hold_ns_total, hold_ns_max;
  uint64_t wait_hist[SL_LOCK_HIST_BUCKETS];
} sl_access_lock_stats;
sl_access_lock_stats sl_buffer_access_stats(sl_device_t *dev);

/* ---- accounting (I7)
 * ---------------------------------------------------------- */

/* The process's footprint on `dev`: RSS from /proc on the CPU, device memory
 * in use on CUDA. 0 if it cannot be read. */
uint64_t sl_footprint_bytes(sl_device_t *dev);

/* Unreleased-bytes estimator: freed bytes the OS or driver still charges.
 * residual = footprint - allocator bytes; unreleased = residual minus the
 * smallest residual seen over the last `window_ns` (10 s by default), never
 * below 0. Exact: the samples that can still become the window's minimum
 * are kept in a growable monotonic deque (O(1) amortized per sample, memory
 * bounded by the samples in one window). Samples must come in time order.
 * Not thread-safe: one owner. */
typedef struct sl_unreleased_sample {
  uint64_t t_ns;
  int64_t residual;
} sl_unreleased_sample;

typedef struct sl_unreleased_est {
  uint64_t window_ns;
  sl_unreleased_sample *s; /* ring of `cap` entries */
  size_t head, count, cap;
} sl_unreleased_est;

void sl_unreleased_init(sl_unreleased_est *e, uint64_t window_ns);
void sl_unreleased_fini(sl_unreleased_est *e);

/* Adds a sample and returns the unreleased-bytes estimate at `t_ns`. If the
 * deque cannot grow (out of host memory) the oldest sample beyond the
 * minimum is dropped, which can only make the estimate smaller. */
uint64_t sl_unreleased_update(sl_unreleased_est *e, uint64_t t_ns,
                              uint64_t footprint, uint64_t allocator_bytes);

/* The memory a guard should count: max(active, footprint - hot_tier). */
uint64_t sl_mem_guard_bytes(uint64_t active, uint64_t footprint,
                            uint64_t hot_tier_bytes);

#endif
