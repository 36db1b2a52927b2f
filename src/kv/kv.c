/* sluice — kv: the paged KV block pool and its prefix index.
 *
 * Block states (exactly one at a time):
 *   FREE    ref == 0, not published; on the free stack.
 *   USED    ref >= 1; published or not; on no list.
 *   CACHED  ref == 0, published; on the LRU list (head = least recently used).
 * Transitions:
 *   FREE   --alloc-->                 USED
 *   CACHED --alloc (evict, unpublish)--> USED
 *   CACHED --lookup hit / ref-->       USED
 *   USED   --unref to 0, published-->  CACHED (most recently used end)
 *   USED   --unref to 0, unpublished--> FREE
 *
 * The prefix index maps a chain hash to the one block published under it:
 * open addressing with linear probing and backward-shift deletion, at most
 * half full (capacity: the power of two >= 2 * n_blocks).
 *
 * Threading: everything runs on the engine thread, except sl_kv_stats_of().
 * The counters that it reads are written only under `stats_mu`; the engine
 * thread, their only writer, may read them without the lock.
 */
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "kv_impl.h"
#include "sluice/util.h"

enum { BLK_FREE = 0, BLK_USED = 1, BLK_CACHED = 2 };

typedef struct kv_block {
  uint64_t hash;      /* chain hash, valid while published */
  int32_t ref;        /* reference count */
  int32_t prev, next; /* LRU links while CACHED; -1 ends the list */
  uint8_t state;      /* BLK_* */
  bool published;     /* in the prefix index under `hash` */
} kv_block;

typedef struct kv_slot {
  uint64_t hash;
  int32_t block; /* -1: empty */
} kv_slot;

struct sl_kv_pool {
  sl_kv_config cfg;
  sl_buf_t *buf; /* K then V, each (n_layer, n_blocks, block_tokens, kv_dim)
                    f16; owned */

  /* element offsets (f16 units) */
  size_t block_elems; /* block_tokens * kv_dim */
  size_t layer_elems; /* n_blocks * block_elems */
  size_t v_base;      /* n_layer * layer_elems: where V starts */

  kv_block *blocks;  /* (n_blocks) */
  int32_t *tokens;   /* (n_blocks, block_tokens): token ids of published
                        blocks, for collision checks */
  int32_t *free_ids; /* (n_blocks) stack of FREE blocks; top at n_free-1 */
  int n_free_stack;
  int32_t lru_head, lru_tail; /* CACHED blocks; head is evicted first */

  kv_slot *slots; /* (slot_mask + 1) the prefix index */
  size_t slot_mask;
  size_t n_published;

  /* read by other threads (sl_kv_stats_of): written under stats_mu */
  pthread_mutex_t stats_mu;
  sl_kv_stats st;
};

/* ---- counters ------------------------------------------------------------ */

/* The counter of blocks in `state` (BLK_*). */
static int *state_counter(sl_kv_stats *st, int state) {
  switch (state) {
  case BLK_FREE:
    return &st->free;
  case BLK_USED:
    return &st->used;
  case BLK_CACHED:
    return &st->cached;
  }
  SL_ASSERT_MSG(0, "kv: bad block state");
  return NULL;
}

/* Moves one block between state counters (from/to: BLK_*; -1 for none) and
 * adds to the lookup/eviction counters, in one locked step so that readers
 * see used + cached + free == n_blocks. */
static void stats_update(sl_kv_pool_t *p, int from, int to, uint64_t hits,
                         uint64_t misses, uint64_t evictions) {
  pthread_mutex_lock(&p->stats_mu);
  if (from != to) {
    if (from >= 0)
      (*state_counter(&p->st, from))--;
    if (to >= 0)
      (*state_counter(&p->st, to))++;
  }
  p->st.hits += hits;
  p->st.misses += misses;
  p->st.evictions += evictions;
  pthread_mutex_unlock(&p->stats_mu);
}

/* ---- the prefix index ---------------------------------------------------- */

/* Returns the slot holding `hash`, or -1. */
static long index_find(const sl_kv_pool_t *p, uint64_t hash) {
  size_t i = (size_t)hash & p->slot_mask;
  for (;;) {
    const kv_slot *s = &p->slots[i];
    if (s->block < 0)
      return -1;
    if (s->hash == hash)
      return (long)i;
    i = (i + 1) & p->slot_mask;
  }
}

/* Inserts `hash` -> `block`; the hash must not be present. */
static void index_insert(sl_kv_pool_t *p, uint64_t hash, int32_t block) {
  SL_ASSERT(p->n_published < (size_t)p->cfg.n_blocks);
  size_t i = (size_t)hash & p->slot_mask;
  while (p->slots[i].block >= 0)
    i = (i + 1) & p->slot_mask;
  p->slots[i].hash = hash;
  p->slots[i].block = block;
  p->n_published++;
}

/* Removes the entry in slot `at`, shifting later entries of its probe run
 * back so that no tombstone is needed. */
static void index_remove(sl_kv_pool_t *p, size_t at) {
  size_t mask = p->slot_mask;
  size_t hole = at, j = at;
  for (;;) {
    j = (j + 1) & mask;
    if (p->slots[j].block < 0)
      break;
    size_t home = (size_t)p->slots[j].hash & mask;
    /* the entry at j may fill the hole when the hole lies on its probe path
     * (between its home and j, cyclically) */
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      p->slots[hole] = p->slots[j];
      hole = j;
    }
  }
  p->slots[hole].block = -1;
  p->slots[hole].hash = 0;
  p->n_published--;
}

/* The (block_tokens) token copy of `block`. */
static int32_t *block_tokens_of(const sl_kv_pool_t *p, int block) {
  return p->tokens + (size_t)block * (size_t)p->cfg.block_tokens;
}

/* ---- the LRU list of cached blocks --------------------------------------- */

/* Appends `b` at the most recently used end. */
static void lru_push_tail(sl_kv_pool_t *p, int32_t b) {
  kv_block *k = &p->blocks[b];
  k->prev = p->lru_tail;
  k->next = -1;
  if (p->lru_tail >= 0)
    p->blocks[p->lru_tail].next = b;
  else
    p->lru_head = b;
  p->lru_tail = b;
}

/* Unlinks `b`, which must be on the list. */
static void lru_remove(sl_kv_pool_t *p, int32_t b) {
  kv_block *k = &p->blocks[b];
  if (k->prev >= 0)
    p->blocks[k->prev].next = k->next;
  else
    p->lru_head = k->next;
  if (k->next >= 0)
    p->blocks[k->next].prev = k->prev;
  else
    p->lru_tail = k->prev;
  k->prev = k->next = -1;
}

/* ---- create / free ------------------------------------------------------- */

/* Validates `c` and computes the layout: element counts per block, per layer
 * and per half (K or V), the buffer's bytes and the token-copy count. Returns
 * SL_ERR_INVALID_ARG for a non-positive field, SL_ERR_OVERFLOW when a size
 * does not fit in size_t. */
static sl_status config_sizes(const sl_kv_config *c, size_t *buf_bytes,
                              size_t *block_elems, size_t *layer_elems,
                              size_t *half_elems, size_t *token_count) {
  if (c->n_layer <= 0 || c->kv_dim <= 0 || c->block_tokens <= 0 ||
      c->n_blocks <= 0)
    return SL_ERR_INVALID_ARG;
  size_t all, bytes;
  if (!sl_mul_ok((size_t)c->block_tokens, (size_t)c->kv_dim, block_elems) ||
      !sl_mul_ok(*block_elems, (size_t)c->n_blocks, layer_elems) ||
      !sl_mul_ok(*layer_elems, (size_t)c->n_layer, half_elems) ||
      !sl_mul_ok(*half_elems, 2, &all) ||
      !sl_mul_ok(all, sizeof(uint16_t), &bytes) ||
      !sl_mul_ok((size_t)c->n_blocks, (size_t)c->block_tokens, token_count) ||
      !sl_mul_ok(*token_count, sizeof(int32_t), &(size_t){0}))
    return SL_ERR_OVERFLOW;
  *buf_bytes = bytes;
  return SL_OK;
}

/* Contract (kv.h): validates `cfg` (SL_ERR_INVALID_ARG: NULL argument or a
 * field <= 0; SL_ERR_OVERFLOW: sizes past size_t), makes the host-side tables
 * (SL_ERR_NOMEM) and takes one buffer of 2 * n_layer * n_blocks *
 * block_tokens * kv_dim f16 values from `owner`'s allocator (its status is
 * passed on: SL_ERR_MEMORY_LIMIT, SL_ERR_DEVICE_OOM, SL_ERR_RANGE). Borrows
 * `cfg` (copied) and `owner` (must outlive the pool). On success *out owns
 * the pool, every block FREE; on failure *out is NULL and nothing is held.
 * The buffer's contents are left undefined. */
sl_status sl_kv_pool_create(const sl_kv_config *cfg, sl_stream_t *owner,
                            sl_kv_pool_t **out) {
  if (out)
    *out = NULL;
  if (!cfg || !owner || !out)
    return SL_ERR_INVALID_ARG;
  size_t bytes, block_elems, layer_elems, half_elems, token_count;
  sl_status st = config_sizes(cfg, &bytes, &block_elems, &layer_elems,
                              &half_elems, &token_count);
  if (st != SL_OK)
    return st;
  size_t n = (size_t)cfg->n_blocks;
  size_t cap = 8;
  while (cap < 2 * n)
    cap *= 2; /* n < 2^31: no overflow */

  sl_kv_pool_t *p = sl_calloc(1, sizeof *p);
  if (!p)
    return SL_ERR_NOMEM;
  p->cfg = *cfg;
  p->block_elems = block_elems;
  p->layer_elems = layer_elems;
  p->v_base = half_elems;
  p->lru_head = p->lru_tail = -1;
  p->slot_mask = cap - 1;
  p->st.n_blocks = cfg->n_blocks;
  p->st.free = cfg->n_blocks;

  st = SL_ERR_NOMEM;
  p->blocks = sl_calloc(n, sizeof *p->blocks);
  if (!p->blocks)
    goto fail_pool;
  p->tokens = sl_calloc(token_count, sizeof *p->tokens);
  if (!p->tokens)
    goto fail_blocks;
  p->free_ids = sl_calloc(n, sizeof *p->free_ids);
  if (!p->free_ids)
    goto fail_tokens;
  p->slots = sl_calloc(cap, sizeof *p->slots);
  if (!p->slots)
    goto fail_free_ids;
  if (pthread_mutex_init(&p->stats_mu, NULL) != 0) {
    st = SL_ERR_THREAD;
    goto fail_slots;
  }
  st = sl_buf_alloc(owner, bytes, &p->buf);
  if (st != SL_OK)
    goto fail_mutex;

  for (size_t i = 0; i < cap; i++)
    p->slots[i].block = -1;
  for (size_t i = 0; i < n; i++) {
    p->blocks[i].prev = p->blocks[i].next = -1;
    p->blocks[i].state = BLK_FREE;
    p->free_ids[i] = (int32_t)(n - 1 - i); /* pops 0, 1, 2, ... */
  }
  p->n_free_stack = (int)n;
  *out = p;
  return SL_OK;

fail_mutex:
  pthread_mutex_destroy(&p->stats_mu);
fail_slots:
  sl_free(p->slots);
fail_free_ids:
  sl_free(p->free_ids);
fail_tokens:
  sl_free(p->tokens);
fail_blocks:
  sl_free(p->blocks);
fail_pool:
  sl_free(p);
  return st;
}

/* Releases the buffer (sl_buf_release: it retires once the tasks that used
 * it have completed) and the host tables. Blocks may still be referenced: the
 * caller's block tables just become meaningless. NULL is a no-op. Engine
 * thread, with no sl_kv_stats_of() call in flight on another thread. */
void sl_kv_pool_free(sl_kv_pool_t *p) {
  if (!p)
    return;
  sl_buf_release(p->buf);
  pthread_mutex_destroy(&p->stats_mu);
  sl_free(p->slots);
  sl_free(p->free_ids);
  sl_free(p->tokens);
  sl_free(p->blocks);
  sl_free(p);
}

/* The pool's configuration (a copy made at create); valid while the pool
 * lives. */
const sl_kv_config *sl_kv_config_of(const sl_kv_pool_t *p) {
  return &p->cfg;
}

/* The pool's buffer, borrowed: tasks that touch the KV name it at
 * submission. Valid while the pool lives. */
sl_buf_t *sl_kv_buffer(sl_kv_pool_t *p) {
  return p->buf;
}

/* ---- blocks -------------------------------------------------------------- */

/* Aborts (a bug) unless `block` is a block id of `p`. */
static void check_block(const sl_kv_pool_t *p, int block) {
  SL_ASSERT_MSG(block >= 0 && block < p->cfg.n_blocks,
                "kv: block id out of range");
}

/* Pops a FREE block (most recently freed first); else evicts the least
 * recently used CACHED block, removing it from the prefix index (counted in
 * `evictions`). Returns the id, now USED with refcount 1, or -1 when every
 * block is referenced (a normal outcome, the caller waits or preempts). O(1).
 * Engine thread. */
int sl_kv_block_alloc(sl_kv_pool_t *p) {
  int32_t b;
  if (p->n_free_stack > 0) {
    b = p->free_ids[--p->n_free_stack];
    SL_ASSERT(p->blocks[b].state == BLK_FREE && p->blocks[b].ref == 0);
    p->blocks[b].state = BLK_USED;
    p->blocks[b].ref = 1;
    stats_update(p, BLK_FREE, BLK_USED, 0, 0, 0);
    return b;
  }
  b = p->lru_head;
  if (b < 0)
    return -1;
  kv_block *k = &p->blocks[b];
  SL_ASSERT(k->state == BLK_CACHED && k->ref == 0 && k->published);
  lru_remove(p, b);
  long slot = index_find(p, k->hash);
  SL_ASSERT_MSG(slot >= 0 && p->slots[slot].block == b,
                "kv: cached block missing from the prefix index");
  index_remove(p, (size_t)slot);
  k->published = false;
  k->hash = 0;
  k->state = BLK_USED;
  k->ref = 1;
  stats_update(p, BLK_CACHED, BLK_USED, 0, 0, 1);
  return b;
}

/* Adds a reference (a sequence sharing the block). The block must be USED,
 * or CACHED: a CACHED block leaves the LRU list and becomes USED (counted
 * neither as hit nor miss). Aborts on a FREE block, a bad id or refcount
 * overflow (bugs). Engine thread. */
void sl_kv_block_ref(sl_kv_pool_t *p, int block) {
  check_block(p, block);
  kv_block *k = &p->blocks[block];
  SL_ASSERT_MSG(k->state != BLK_FREE, "kv: reference to a free block");
  SL_ASSERT_MSG(k->ref < INT32_MAX, "kv: reference count overflow");
  if (k->state == BLK_CACHED) {
    lru_remove(p, block);
    k->state = BLK_USED;
    stats_update(p, BLK_CACHED, BLK_USED, 0, 0, 0);
  }
  k->ref++;
}

/* Drops one reference. At 0 a published block becomes CACHED at the most
 * recently used end of the LRU list; an unpublished one becomes FREE. Aborts
 * when the block holds no reference (FREE or CACHED) or the id is bad (bugs).
 * Engine thread. */
void sl_kv_block_unref(sl_kv_pool_t *p, int block) {
  check_block(p, block);
  kv_block *k = &p->blocks[block];
  SL_ASSERT_MSG(k->state == BLK_USED && k->ref > 0,
                "kv: unref of a block that holds no reference");
  if (--k->ref > 0)
    return;
  if (k->published) {
    k->state = BLK_CACHED;
    lru_push_tail(p, block);
    stats_update(p, BLK_USED, BLK_CACHED, 0, 0, 0);
  } else {
    k->state = BLK_FREE;
    p->free_ids[p->n_free_stack++] = block;
    stats_update(p, BLK_USED, BLK_FREE, 0, 0, 0);
  }
}

/* The block's reference count (0 for FREE and CACHED). Aborts on a bad id.
 * Engine thread. */
int sl_kv_block_refcount(const sl_kv_pool_t *p, int block) {
  check_block(p, block);
  return p->blocks[block].ref;
}

/* FREE + CACHED blocks: how many sl_kv_block_alloc() calls would succeed
 * now. Engine thread. */
int sl_kv_available(const sl_kv_pool_t *p) {
  return p->st.free + p->st.cached; /* the engine thread writes these */
}

/* ---- prefix cache -------------------------------------------------------- */

/* XXH3-64 over fingerprint (8 bytes) ‖ parent (8 bytes) ‖ the n_tokens ids
 * (4 bytes each), all in host byte order (little-endian on every supported
 * target). Publish and lookup compare block_tokens ids, so only hashes of
 * full blocks (n_tokens == block_tokens) can be found. Borrows `tokens`. Pure:
 * any thread. */
uint64_t sl_kv_hash_block(const sl_kv_pool_t *p, uint64_t parent,
                          const int32_t *tokens, int n_tokens) {
  SL_ASSERT(n_tokens >= 0 && (tokens || n_tokens == 0));
  XXH3_state_t s;
  XXH3_64bits_reset(&s);
  XXH3_64bits_update(&s, &p->cfg.fingerprint, sizeof p->cfg.fingerprint);
  XXH3_64bits_update(&s, &parent, sizeof parent);
  if (n_tokens)
    XXH3_64bits_update(&s, tokens, (size_t)n_tokens * sizeof *tokens);
  return XXH3_64bits_digest(&s);
}

/* Enters USED block `block` in the prefix index under `hash`, copying its
 * block_tokens ids from `tokens` (borrowed). Returns false and changes nothing
 * when a block (this one included) is already published under `hash`; true
 * otherwise. Aborts when the block is not USED, or is already published under
 * another hash (bugs). O(1) expected. Engine thread. */
bool sl_kv_publish(sl_kv_pool_t *p, int block, uint64_t hash,
                   const int32_t *tokens) {
  check_block(p, block);
  SL_ASSERT(tokens);
  kv_block *k = &p->blocks[block];
  SL_ASSERT_MSG(k->state == BLK_USED, "kv: publish of an unreferenced block");
  if (index_find(p, hash) >= 0)
    return false;
  SL_ASSERT_MSG(!k->published, "kv: block already published under another "
                               "hash");
  memcpy(block_tokens_of(p, block), tokens,
         (size_t)p->cfg.block_tokens * sizeof *tokens);
  k->hash = hash;
  k->published = true;
  index_insert(p, hash, block);
  return true;
}

/* Finds the block published under `hash` whose block_tokens ids equal
 * `tokens` (borrowed): on a hit takes a reference (a CACHED block leaves the
 * LRU list and becomes USED), counts a hit and returns the id. Otherwise
 * (absent, or the same hash over other tokens) counts a miss and returns -1.
 * Engine thread. */
int sl_kv_lookup(sl_kv_pool_t *p, uint64_t hash, const int32_t *tokens) {
  SL_ASSERT(tokens);
  long slot = index_find(p, hash);
  int32_t b = slot >= 0 ? p->slots[slot].block : -1;
  if (b < 0 || memcmp(block_tokens_of(p, b), tokens,
                      (size_t)p->cfg.block_tokens * sizeof *tokens) != 0) {
    stats_update(p, -1, -1, 0, 1, 0);
    return -1;
  }
  kv_block *k = &p->blocks[b];
  SL_ASSERT(k->published && k->hash == hash && k->state != BLK_FREE);
  SL_ASSERT_MSG(k->ref < INT32_MAX, "kv: reference count overflow");
  int from = k->state;
  if (from == BLK_CACHED) {
    lru_remove(p, b);
    k->state = BLK_USED;
  }
  k->ref++;
  stats_update(p, from, BLK_USED, 1, 0, 0);
  return b;
}

/* A consistent snapshot (used + cached + free == n_blocks). Any thread,
 * while the pool lives; takes a short mutex that the engine thread holds only
 * to update counters. */
sl_kv_stats sl_kv_stats_of(sl_kv_pool_t *p) {
  pthread_mutex_lock(&p->stats_mu);
  sl_kv_stats s = p->st;
  pthread_mutex_unlock(&p->stats_mu);
  return s;
}

/* ---- layout -------------------------------------------------------------- */

/* Element offset (f16 units) of K for (layer, block):
 * (layer * n_blocks + block) * block_tokens * kv_dim; the block's values are
 * (block_tokens, kv_dim) row-major. Aborts on a bad layer or block. Any
 * thread. */
size_t sl_kv_k_offset(const sl_kv_pool_t *p, int layer, int block) {
  SL_ASSERT_MSG(layer >= 0 && layer < p->cfg.n_layer, "kv: layer out of range");
  check_block(p, block);
  return (size_t)layer * p->layer_elems + (size_t)block * p->block_elems;
}

/* Element offset of V: the K offset plus n_layer * n_blocks * block_tokens *
 * kv_dim, where V starts. Aborts on a bad layer or block. Any thread. */
size_t sl_kv_v_offset(const sl_kv_pool_t *p, int layer, int block) {
  return p->v_base + sl_kv_k_offset(p, layer, block);
}

/* ---- sanity (tests, asserts) --------------------------------------------- */

#define SANITY(cond, ...)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      SL_LOGE("kv sanity: " __VA_ARGS__);                                      \
      ok = false;                                                              \
      goto done;                                                               \
    }                                                                          \
  } while (0)

bool sl__kv_pool_sanity(const sl_kv_pool_t *p) {
  bool ok = true;
  int n = p->cfg.n_blocks;
  int n_state[3] = {0, 0, 0};
  size_t n_pub = 0;
  /* 0: on no list; 1: on the free stack; 2: on the LRU list */
  uint8_t *seen = sl_calloc((size_t)n, 1);
  if (!seen) {
    SL_LOGE("kv sanity: out of memory");
    return false;
  }
  for (int b = 0; b < n; b++) {
    const kv_block *k = &p->blocks[b];
    SANITY(k->state <= BLK_CACHED, "block %d: bad state %d", b, k->state);
    n_state[k->state]++;
    SANITY(k->ref >= 0, "block %d: negative refcount", b);
    SANITY((k->state == BLK_USED) == (k->ref > 0),
           "block %d: state %d with refcount %d", b, k->state, k->ref);
    SANITY(k->state != BLK_FREE || !k->published, "block %d: free, published",
           b);
    SANITY(k->state != BLK_CACHED || k->published,
           "block %d: cached, unpublished", b);
    if (k->published) {
      n_pub++;
      long slot = index_find(p, k->hash);
      SANITY(slot >= 0 && p->slots[slot].block == b,
             "block %d: published but not in the index", b);
    }
  }
  for (int i = 0; i < p->n_free_stack; i++) {
    int32_t b = p->free_ids[i];
    SANITY(b >= 0 && b < n, "free stack: id %d out of range", b);
    SANITY(!seen[b], "free stack: block %d twice", b);
    SANITY(p->blocks[b].state == BLK_FREE, "free stack: block %d not free", b);
    seen[b] = 1;
  }
  SANITY(p->n_free_stack == n_state[BLK_FREE],
         "free stack: %d entries, %d free", p->n_free_stack, n_state[BLK_FREE]);
  int n_lru = 0;
  int32_t prev = -1;
  for (int32_t b = p->lru_head; b >= 0; b = p->blocks[b].next) {
    SANITY(b < n, "lru: id %d out of range", b);
    SANITY(!seen[b], "lru: block %d seen twice", b);
    SANITY(p->blocks[b].state == BLK_CACHED, "lru: block %d not cached", b);
    SANITY(p->blocks[b].prev == prev, "lru: bad prev link at %d", b);
    seen[b] = 2;
    prev = b;
    n_lru++;
  }
  SANITY(p->lru_tail == prev, "lru: tail %d, last %d", p->lru_tail, prev);
  SANITY(n_lru == n_state[BLK_CACHED], "lru: %d entries, %d cached", n_lru,
         n_state[BLK_CACHED]);
  size_t n_slots = 0;
  for (size_t i = 0; i <= p->slot_mask; i++) {
    const kv_slot *s = &p->slots[i];
    if (s->block < 0)
      continue;
    n_slots++;
    SANITY(s->block < n, "index: slot %zu holds id %d", i, s->block);
    const kv_block *k = &p->blocks[s->block];
    SANITY(k->published && k->hash == s->hash,
           "index: slot %zu names block %d, not published there", i, s->block);
    SANITY(index_find(p, s->hash) == (long)i,
           "index: slot %zu unreachable from its home", i);
  }
  SANITY(n_slots == n_pub && n_pub == p->n_published,
         "index: %zu slots, %zu published, count %zu", n_slots, n_pub,
         p->n_published);
  SANITY(p->st.used == n_state[BLK_USED] &&
             p->st.cached == n_state[BLK_CACHED] &&
             p->st.free == n_state[BLK_FREE] && p->st.n_blocks == n,
         "counters: used %d/%d cached %d/%d free %d/%d", p->st.used,
         n_state[BLK_USED], p->st.cached, n_state[BLK_CACHED], p->st.free,
         n_state[BLK_FREE]);
done:
  sl_free(seen);
  return ok;
}

uint64_t sl_kv_fingerprint(const uint8_t model_fp[16], int block_tokens) {
  static const char layout[] = "sluice kv: f16, K then V, (layer, block, "
                               "block_tokens, kv_dim)";
  int32_t t = block_tokens;
  XXH3_state_t s;
  XXH3_64bits_reset(&s);
  XXH3_64bits_update(&s, model_fp, 16);
  XXH3_64bits_update(&s, layout, sizeof layout);
  XXH3_64bits_update(&s, &t, sizeof t);
  return XXH3_64bits_digest(&s);
}

sl_kv_view sl_kv_view_of(const sl_kv_pool_t *p) {
  sl_kv_view v = {p->buf, p->cfg.n_layer, p->cfg.n_blocks, p->cfg.block_tokens,
                  p->cfg.kv_dim};
  return v;
}
