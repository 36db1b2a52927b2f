/* sluice — kv: the hot RAM tier (kv_tier.h).
 *
 * Blocks in host memory under one mutex: a chained hash table keyed by
 * block hash, and a doubly linked recency list (head: most recently used)
 * from whose tail blocks leave when the byte budget is passed. An entry is
 * one allocation (the entry, the block's token ids, compared in full at
 * every lookup so that a hash collision can never serve another prefix's
 * K/V, and the payload, raw or lz4-compressed), or, with the config's
 * payload allocator (the engine's page-locked memory on CUDA), the entry
 * and token ids with the payload in a slot of that allocator.
 *
 * A get takes a reference on the entry under the mutex and copies (or
 * decompresses) outside it; get_ref hands the payload itself out under a
 * reference (a restore's DMA reads it). An entry removed while referenced
 * (evicted, replaced) leaves the index and the budget at once and is freed
 * by its last reference.
 */
#include <lz4.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sluice/util.h"
#include "tier_impl.h"

typedef struct ram_entry {
  uint64_t hash;
  struct ram_entry *chain;       /* next in the hash bucket */
  struct ram_entry *prev, *next; /* recency list */
  size_t stored;                 /* payload bytes as held */
  size_t alloc;                  /* bytes charged to the budget */
  uint8_t *pay;                  /* the payload (inline or a slot) */
  int refs;                      /* gets in progress, refs handed out */
  bool lz4;                      /* the payload is lz4-compressed */
  bool dead;                     /* out of the index; the last ref frees */
  /* then: int32_t tokens[block_tokens], uint8_t payload[stored] (inline) */
} ram_entry;

typedef struct ram_tier {
  sl_kv_tier_t base; /* first: the ops */
  sl_kv_ram_config cfg;
  size_t payload_bytes;
  pthread_mutex_t mu;
  ram_entry **buckets;
  size_t cap, n; /* cap: a power of two */
  ram_entry *head, *tail;
  sl_kv_tier_stats st;
} ram_tier;

static int32_t *entry_tokens(ram_entry *x) {
  return (int32_t *)(x + 1);
}
static uint8_t *entry_inline(ram_tier *t, ram_entry *x) {
  return (uint8_t *)(entry_tokens(x) + t->cfg.block_tokens);
}

static void entry_free(ram_tier *t, ram_entry *x) {
  if (t->cfg.pay_alloc && x->pay)
    t->cfg.pay_free(t->cfg.pay_ctx, x->pay);
  free(x);
}

static ram_entry **bucket_of(ram_tier *t, uint64_t h) {
  return &t->buckets[(size_t)(h * 0x9E3779B97F4A7C15ull) >> 7 & (t->cap - 1)];
}

static ram_entry *find(ram_tier *t, uint64_t h) {
  for (ram_entry *x = *bucket_of(t, h); x; x = x->chain)
    if (x->hash == h)
      return x;
  return NULL;
}

static void list_unlink(ram_tier *t, ram_entry *x) {
  if (x->prev)
    x->prev->next = x->next;
  else
    t->head = x->next;
  if (x->next)
    x->next->prev = x->prev;
  else
    t->tail = x->prev;
  x->prev = x->next = NULL;
}

static void list_push_head(ram_tier *t, ram_entry *x) {
  x->prev = NULL;
  x->next = t->head;
  if (t->head)
    t->head->prev = x;
  t->head = x;
  if (!t->tail)
    t->tail = x;
}

static void remove_entry(ram_tier *t, ram_entry *x) {
  ram_entry **p = bucket_of(t, x->hash);
  while (*p != x)
    p = &(*p)->chain;
  *p = x->chain;
  list_unlink(t, x);
  t->n--;
  t->st.bytes -= x->alloc;
  if (x->refs)
    x->dead = true; /* its last reference frees it */
  else
    entry_free(t, x);
}

/* Drops one reference (under the mutex). */
static void entry_unref(ram_tier *t, ram_entry *x) {
  if (--x->refs == 0 && x->dead)
    entry_free(t, x);
}

/* Doubles the bucket array once the table holds as many entries (a failed
 * allocation keeps the old one: longer chains, still correct). */
static void maybe_grow(ram_tier *t) {
  if (t->n < t->cap)
    return;
  size_t cap = t->cap * 2;
  ram_entry **b = calloc(cap, sizeof *b);
  if (!b)
    return;
  ram_entry **old = t->buckets;
  size_t old_cap = t->cap;
  t->buckets = b;
  t->cap = cap;
  for (size_t i = 0; i < old_cap; i++)
    for (ram_entry *x = old[i], *nx; x; x = nx) {
      nx = x->chain;
      ram_entry **p = bucket_of(t, x->hash);
      x->chain = *p;
      *p = x;
    }
  free(old);
}

static bool tokens_match(ram_tier *t, ram_entry *x, const int32_t *tokens) {
  return !memcmp(entry_tokens(x), tokens,
                 sizeof(int32_t) * (size_t)t->cfg.block_tokens);
}

static bool ram_contains(sl_kv_tier_t *bt, const sl_kv_block_key *key,
                         bool count) {
  ram_tier *t = (ram_tier *)bt;
  pthread_mutex_lock(&t->mu);
  ram_entry *x =
      key->fingerprint == t->cfg.fingerprint ? find(t, key->hash) : NULL;
  bool ok = x && tokens_match(t, x, key->tokens);
  if (!ok && count)
    t->st.misses++;
  pthread_mutex_unlock(&t->mu);
  return ok;
}

/* The block of `key` with a reference taken, made the most recently used;
 * NULL when not held. Under the mutex. */
static ram_entry *acquire_locked(ram_tier *t, const sl_kv_block_key *key) {
  ram_entry *x = find(t, key->hash);
  if (!x || !tokens_match(t, x, key->tokens))
    return NULL;
  x->refs++;
  list_unlink(t, x);
  list_push_head(t, x);
  return x;
}

static sl_status ram_get(sl_kv_tier_t *bt, const sl_kv_block_key *key,
                         void *dst, size_t n) {
  ram_tier *t = (ram_tier *)bt;
  double t0 = sl_ns_to_ms(sl_now_ns());
  if (n != t->payload_bytes || key->fingerprint != t->cfg.fingerprint)
    return SL_ERR_INVALID_ARG;
  pthread_mutex_lock(&t->mu);
  ram_entry *x = acquire_locked(t, key); /* the copy runs outside */
  pthread_mutex_unlock(&t->mu);
  if (!x)
    return SL_ERR_NOT_FOUND;
  bool ok = true;
  if (x->lz4)
    ok = LZ4_decompress_safe((const char *)x->pay, dst, (int)x->stored,
                             (int)n) == (int)n;
  else
    memcpy(dst, x->pay, n);
  pthread_mutex_lock(&t->mu);
  if (!ok) { /* cannot happen short of memory corruption: never served */
    t->st.corrupt++;
    if (!x->dead)
      remove_entry(t, x);
    t->st.entries = t->n;
  } else {
    t->st.hits++;
    t->st.get_bytes += n;
    t->st.get_ms_total += sl_ns_to_ms(sl_now_ns()) - t0;
  }
  entry_unref(t, x);
  pthread_mutex_unlock(&t->mu);
  return ok ? SL_OK : SL_ERR_FORMAT;
}

static sl_status ram_get_ref(sl_kv_tier_t *bt, const sl_kv_block_key *key,
                             const void **p, size_t n, void **hold) {
  ram_tier *t = (ram_tier *)bt;
  if (n != t->payload_bytes || key->fingerprint != t->cfg.fingerprint)
    return SL_ERR_INVALID_ARG;
  pthread_mutex_lock(&t->mu);
  ram_entry *x = find(t, key->hash);
  if (x && x->lz4 && tokens_match(t, x, key->tokens)) { /* a copy instead */
    pthread_mutex_unlock(&t->mu);
    return SL_ERR_UNSUPPORTED;
  }
  if (!(x = acquire_locked(t, key))) {
    pthread_mutex_unlock(&t->mu);
    return SL_ERR_NOT_FOUND;
  }
  t->st.hits++;
  t->st.get_bytes += n;
  pthread_mutex_unlock(&t->mu);
  *p = x->pay;
  *hold = x;
  return SL_OK;
}

static void ram_unref(sl_kv_tier_t *bt, void *hold) {
  ram_tier *t = (ram_tier *)bt;
  pthread_mutex_lock(&t->mu);
  entry_unref(t, hold);
  pthread_mutex_unlock(&t->mu);
}

static sl_status ram_put(sl_kv_tier_t *bt, const sl_kv_block_key *key,
                         const void *src, size_t n) {
  ram_tier *t = (ram_tier *)bt;
  double t0 = sl_ns_to_ms(sl_now_ns());
  if (n != t->payload_bytes || key->fingerprint != t->cfg.fingerprint ||
      !key->hash || n > (size_t)LZ4_MAX_INPUT_SIZE)
    return SL_ERR_INVALID_ARG;
  pthread_mutex_lock(&t->mu);
  ram_entry *held = find(t, key->hash);
  if (held && tokens_match(t, held, key->tokens)) {
    list_unlink(t, held); /* a put is a use */
    list_push_head(t, held);
    pthread_mutex_unlock(&t->mu);
    return SL_OK;
  }
  pthread_mutex_unlock(&t->mu);
  size_t head =
      sizeof(ram_entry) + sizeof(int32_t) * (size_t)t->cfg.block_tokens;
  bool slot = t->cfg.pay_alloc != NULL;
  size_t bound = t->cfg.lz4 ? (size_t)LZ4_compressBound((int)n) : n;
  if (slot ? head + n > t->cfg.budget : head > t->cfg.budget)
    return SL_OK; /* could never be held */
  ram_entry *x = malloc(head + (slot ? 0 : (bound > n ? bound : n)));
  if (!x)
    return SL_ERR_NOMEM;
  memset(x, 0, sizeof *x);
  x->hash = key->hash;
  memcpy(entry_tokens(x), key->tokens,
         sizeof(int32_t) * (size_t)t->cfg.block_tokens);
  /* a slot holds the raw size: a compressed block must fit it */
  x->pay = slot ? t->cfg.pay_alloc(t->cfg.pay_ctx, n) : entry_inline(t, x);
  if (!x->pay) {
    free(x);
    return SL_ERR_NOMEM;
  }
  int c = t->cfg.lz4 && !slot
              ? LZ4_compress_default(src, (char *)x->pay, (int)n, (int)bound)
              : 0;
  /* kept compressed only when that saves an eighth: below that, the
   * decompression at every restore costs more than the bytes are worth */
  if (c > 0 && (size_t)c <= n - n / 8) {
    x->lz4 = true;
    x->stored = (size_t)c;
  } else {
    memcpy(x->pay, src, n);
    x->stored = n;
  }
  x->alloc = head + (slot ? n : x->stored);
  if (!slot) {
    ram_entry *shrunk = realloc(x, x->alloc);
    if (shrunk)
      x = shrunk;
    x->pay = entry_inline(t, x);
  }
  if (x->alloc > t->cfg.budget) { /* could never be held */
    entry_free(t, x);
    return SL_OK;
  }
  pthread_mutex_lock(&t->mu);
  ram_entry *old = find(t, key->hash);
  if (old) /* a block of the same hash (a collision, or a racing put) */
    remove_entry(t, old);
  maybe_grow(t);
  ram_entry **p = bucket_of(t, x->hash);
  x->chain = *p;
  *p = x;
  list_push_head(t, x);
  t->n++;
  t->st.bytes += x->alloc;
  t->st.puts++;
  t->st.put_bytes += n;
  t->st.compressed += x->lz4;
  while (t->st.bytes > t->cfg.budget && t->tail != x) {
    remove_entry(t, t->tail);
    t->st.evictions++;
  }
  t->st.entries = t->n;
  t->st.put_ms_total += sl_ns_to_ms(sl_now_ns()) - t0;
  pthread_mutex_unlock(&t->mu);
  return SL_OK;
}

static sl_kv_tier_stats ram_stats(sl_kv_tier_t *bt) {
  ram_tier *t = (ram_tier *)bt;
  pthread_mutex_lock(&t->mu);
  sl_kv_tier_stats s = t->st;
  pthread_mutex_unlock(&t->mu);
  return s;
}

static void ram_close(sl_kv_tier_t *bt) {
  ram_tier *t = (ram_tier *)bt;
  for (ram_entry *x = t->head, *nx; x; x = nx) {
    nx = x->next;
    entry_free(t, x); /* no reference may be held at close */
  }
  pthread_mutex_destroy(&t->mu);
  free(t->buckets);
  free(t);
}

static const sl_kv_tier_ops ram_ops = {.contains = ram_contains,
                                       .get = ram_get,
                                       .put = ram_put,
                                       .stats = ram_stats,
                                       .close = ram_close,
                                       .get_ref = ram_get_ref,
                                       .unref = ram_unref};

sl_status sl_kv_ram_open(const sl_kv_ram_config *cfg, sl_kv_tier_t **out) {
  *out = NULL;
  if (cfg->block_tokens <= 0 || cfg->block_tokens > 4096 || cfg->n_layer <= 0 ||
      cfg->kv_dim <= 0 || !cfg->budget || !cfg->pay_alloc != !cfg->pay_free)
    return SL_ERR_INVALID_ARG;
  ram_tier *t = calloc(1, sizeof *t);
  if (!t)
    return SL_ERR_NOMEM;
  t->cap = 256;
  if (!(t->buckets = calloc(t->cap, sizeof *t->buckets))) {
    free(t);
    return SL_ERR_NOMEM;
  }
  t->base.ops = &ram_ops;
  t->cfg = *cfg;
  t->payload_bytes = (size_t)cfg->n_layer * 2 * (size_t)cfg->block_tokens *
                     (size_t)cfg->kv_dim * sizeof(uint16_t);
  t->st.name = "hot";
  t->st.enabled = true;
  t->st.budget = cfg->budget;
  pthread_mutex_init(&t->mu, NULL);
  *out = &t->base;
  return SL_OK;
}
