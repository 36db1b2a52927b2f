/* sluice — kv: the paged KV cache.
 *
 * A pool of fixed-size blocks, each holding `block_tokens` positions of K and
 * V for every layer, in f16. Sequences own block tables (arrays of block ids);
 * blocks are reference counted. Full blocks can be published in the prefix
 * cache under a hash chain (DESIGN.md, "KV cache"):
 *   h_i = H(fingerprint ‖ h_{i-1} ‖ tokens of block i ‖ extra)
 * A published block whose reference count drops to 0 stays cached (and can
 * be found again) until the pool needs it: unreferenced cached blocks are
 * evicted least recently used first.
 *
 * Memory: one buffer from the runtime allocator, owned by the stream given at
 * creation. Layout: K then V, each (n_layer, n_blocks, block_tokens, kv_dim)
 * f16.
 *
 * Threading: a pool belongs to one engine thread; nothing here locks, except
 * sl_kv_stats(), which may be called from any thread.
 */
#ifndef SLUICE_KV_H
#define SLUICE_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/alloc.h"
#include "sluice/model.h"
#include "sluice/status.h"

typedef struct sl_kv_pool sl_kv_pool_t;

typedef struct sl_kv_config {
  int n_layer;
  int kv_dim;       /* n_head_kv * head_dim */
  int block_tokens; /* T */
  int n_blocks;
  uint64_t fingerprint; /* model identity, KV dtype/layout and T */
} sl_kv_config;

typedef struct sl_kv_stats {
  int n_blocks;
  int used;                         /* referenced by at least one sequence */
  int cached;                       /* published and unreferenced (evictable) */
  int free;                         /* never used or evicted */
  uint64_t hits, misses, evictions; /* prefix lookups and evictions */
} sl_kv_stats;

/* Allocates the pool's memory on `owner` (SL_ERR_MEMORY_LIMIT /
 * SL_ERR_DEVICE_OOM when it does not fit). Free with sl_kv_pool_free. */
sl_status sl_kv_pool_create(const sl_kv_config *cfg, sl_stream_t *owner,
                            sl_kv_pool_t **out);
void sl_kv_pool_free(sl_kv_pool_t *p);

const sl_kv_config *sl_kv_config_of(const sl_kv_pool_t *p);
/* The pool's buffer, for tasks that read or write it (declare it). */
sl_buf_t *sl_kv_buffer(sl_kv_pool_t *p);

/* The pool's memory as the forward pass sees it. */
sl_kv_view sl_kv_view_of(const sl_kv_pool_t *p);

/* Takes a free block, or evicts the least recently used cached one; returns
 * its id with reference count 1, or -1 when every block is referenced. */
int sl_kv_block_alloc(sl_kv_pool_t *p);
void sl_kv_block_ref(sl_kv_pool_t *p, int block);
/* Drops a reference; at 0 a published block becomes cached, another free. */
void sl_kv_block_unref(sl_kv_pool_t *p, int block);
int sl_kv_block_refcount(const sl_kv_pool_t *p, int block);

/* The chain hash of one full block after `parent` (0 for the first). */
uint64_t sl_kv_hash_block(const sl_kv_pool_t *p, uint64_t parent,
                          const int32_t *tokens, int n_tokens);

/* Publishes full block `block` under `hash` (and its token ids, to guard
 * against collisions). A block already published under that hash wins: the
 * call returns false and changes nothing. */
bool sl_kv_publish(sl_kv_pool_t *p, int block, uint64_t hash,
                   const int32_t *tokens);

/* Finds a published block for `hash` whose tokens equal `tokens`; takes a
 * reference and returns its id, or -1. */
int sl_kv_lookup(sl_kv_pool_t *p, uint64_t hash, const int32_t *tokens);

/* Number of blocks that can be had right now (free + cached). */
int sl_kv_available(const sl_kv_pool_t *p);

sl_kv_stats sl_kv_stats_of(sl_kv_pool_t *p);

/* Element offsets (in f16 units) of K and V for (layer, block) in the
 * pool's buffer; each spans block_tokens * kv_dim values. */
size_t sl_kv_k_offset(const sl_kv_pool_t *p, int layer, int block);
size_t sl_kv_v_offset(const sl_kv_pool_t *p, int layer, int block);

#endif
