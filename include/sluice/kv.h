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
#include "sluice/status.h"

typedef struct sl_kv_pool sl_kv_pool_t;

/* ---- the layout: the one source of its arithmetic ---------------------------
 * K then V, each (n_layer, n_blocks, block_tokens, kv_dim) f16, kv_dim =
 * n_head_kv * head_dim. The pool, sl_ctx, the forward pass, the engine's
 * memory guard and the benchmarks all compute sizes and offsets here. */

/* Where a paged KV cache lives, as the forward pass sees it: one buffer in
 * the layout above, with block_tokens a power of two. The kv layer
 * (sl_kv_view_of) and sl_ctx make these; the model layer only reads and writes
 * the memory. */
typedef struct sl_kv_view {
  sl_buf_t *buf;
  int n_layer;
  int n_blocks;
  int block_tokens;
  int kv_dim;
} sl_kv_view;

/* Bytes of one block (K and V, every layer, f16): 2 * n_layer * block_tokens
 * * kv_dim * 2. Arguments must be >= 0. */
static inline uint64_t sl_kv_block_bytes(int n_layer, int kv_dim,
                                         int block_tokens) {
  return 2ull * (uint64_t)n_layer * (uint64_t)block_tokens * (uint64_t)kv_dim *
         sizeof(uint16_t);
}

/* f16 elements of one half (K or V) of a view's buffer: n_layer * n_blocks *
 * block_tokens * kv_dim. The buffer holds 2 halves. */
static inline size_t sl_kv_view_half_elems(const sl_kv_view *v) {
  return (size_t)v->n_layer * (size_t)v->n_blocks * (size_t)v->block_tokens *
         (size_t)v->kv_dim;
}

/* Bytes of a view's buffer (both halves). */
static inline size_t sl_kv_view_bytes(const sl_kv_view *v) {
  return 2 * sl_kv_view_half_elems(v) * sizeof(uint16_t);
}

/* Element offset (f16 units) of K for (layer, block) in a view's buffer:
 * (layer * n_blocks + block) * block_tokens * kv_dim; the block's values are
 * (block_tokens, kv_dim) row-major. V: add sl_kv_view_half_elems. */
static inline size_t sl_kv_view_k_offset(const sl_kv_view *v, int layer,
                                         int block) {
  return ((size_t)layer * (size_t)v->n_blocks + (size_t)block) *
         (size_t)v->block_tokens * (size_t)v->kv_dim;
}

/* The prefix cache's fingerprint (sl_kv_config.fingerprint): XXH3-64 over
 * the model's 16-byte weight fingerprint (sl_model_fingerprint), the KV
 * dtype and layout (f16, the layout above) and block_tokens. Two pools share
 * prefix hashes only when all of these match. Pure; any thread. */
uint64_t sl_kv_fingerprint(const uint8_t model_fp[16], int block_tokens);

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
