/* The seed's wrong clear, kept only to reproduce the bug it caused.
 *
 * sl__rt_experiment_bare_clear() drains the device default stream alone and
 * then releases the cache, as oMLX's bare `mx.synchronize(); mx.clear_cache()`
 * did. In sluice it is still memory-safe (I1: in-flight buffers are RETIRING,
 * never CACHED), but it leaves the engine's work in flight, which the
 * allocator's in-flight counters show. Only bench/seed.c calls it; engine code
 * must use sl_sync_and_clear_cache(stream) (I3). */
#ifndef SLUICE_RT_EXPERIMENT_H
#define SLUICE_RT_EXPERIMENT_H

#include "sluice/rt.h"

sl_status sl__rt_experiment_bare_clear(sl_device_t *dev);

#endif
