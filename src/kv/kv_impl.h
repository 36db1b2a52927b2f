/* sluice — kv: private declarations of the block pool (src/kv/ and tests).
 */
#ifndef SLUICE_KV_IMPL_H
#define SLUICE_KV_IMPL_H

#include <stdbool.h>

#include "sluice/kv.h"

/* Walks the whole pool and checks its internal invariants: every block is in
 * exactly one state (free, used, cached) matching its reference count; the
 * free list holds exactly the free blocks; the LRU list holds exactly the
 * cached blocks, with consistent links; the prefix index holds exactly the
 * published blocks, each findable under its hash; the counters match. Logs the
 * first violation it finds (SL_LOGE) and returns false; true when all hold.
 * O(n_blocks + index size). Engine thread only (like every call but stats). */
bool sl__kv_pool_sanity(const sl_kv_pool_t *p);

#endif
