/* The hot RAM tier (src/kv/tier_ram.c):
 *   - put then get gives the same bytes, raw and lz4-compressed;
 *   - a block whose token ids differ from the key's (a hash collision) or
 *     of another model (fingerprint) is never served;
 *   - the byte budget evicts the least recently used block (a get is a
 *     use), and bytes held never pass it;
 *   - lz4 keeps a block compressed only when that saves an eighth: a
 *     compressible block is held in fewer bytes, noise is held raw;
 *   - many blocks (the table grows) stay findable;
 *   - get_ref lends the block in place: it keeps its bytes while lent, even
 *     after the budget evicted it, and is freed by the last unref (ASan);
 *   - with a payload allocator (the engine's page-locked slots on CUDA),
 *     every payload lives in a slot, and every slot comes back;
 *   - gets and puts from several threads, with evictions (TSan). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "sluice/kv_tier.h"

enum { T = 16, LAYERS = 3, KVD = 8 };

static sl_kv_ram_config cfg_for(uint64_t budget, bool lz4) {
  return (sl_kv_ram_config){.budget = budget,
                            .fingerprint = 77,
                            .n_layer = LAYERS,
                            .kv_dim = KVD,
                            .block_tokens = T,
                            .lz4 = lz4};
}

static void noise(uint8_t *p, size_t n, unsigned seed) {
  uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (uint8_t)x;
  }
}

static void tokens_for(int32_t *t, unsigned seed) {
  for (int i = 0; i < T; i++)
    t[i] = (int32_t)(seed * 1000u + (unsigned)i);
}

/* A payload allocator that counts its slots (malloc behind it). */
typedef struct slots {
  _Atomic int out, allocs;
  size_t size;
} slots;

static void *slot_alloc(void *ctx, size_t n) {
  slots *sl = ctx;
  if (n > sl->size)
    return NULL;
  atomic_fetch_add(&sl->out, 1);
  atomic_fetch_add(&sl->allocs, 1);
  return malloc(sl->size);
}

static void slot_free(void *ctx, void *p) {
  slots *sl = ctx;
  atomic_fetch_sub(&sl->out, 1);
  memset(p, 0xDD, sl->size); /* a read after the free shows */
  free(p);
}

/* Readers get or lend blocks while a writer's puts evict them; each block
 * carries its own seed in every byte, so a torn or reused payload shows. */
enum { RACE_KEYS = 24, RACE_ROUNDS = 3000 };

typedef struct race {
  sl_kv_tier_t *t;
  size_t n;
  int32_t toks[RACE_KEYS][T];
  _Atomic int bad, served, stop;
} race;

static void *race_reader(void *p) {
  race *r = p;
  uint8_t *dst = malloc(r->n);
  for (unsigned i = 0; !atomic_load(&r->stop); i++) {
    unsigned k = (i * 7u) % RACE_KEYS;
    sl_kv_block_key key = {77, 500 + k, r->toks[k]};
    const void *at = NULL;
    void *hold = NULL;
    const uint8_t *b = NULL;
    if (i % 2 && sl_kv_tier_get_ref(r->t, &key, &at, r->n, &hold) == SL_OK)
      b = at;
    else if (!(i % 2) && sl_kv_tier_get(r->t, &key, dst, r->n) == SL_OK)
      b = dst;
    if (!b)
      continue;
    atomic_fetch_add(&r->served, 1);
    for (size_t j = 0; j < r->n; j += 97)
      if (b[j] != (uint8_t)(k + 1))
        atomic_fetch_add(&r->bad, 1);
    sl_kv_tier_unref(r->t, hold);
  }
  free(dst);
  return NULL;
}

static void race_run(sl_kv_tier_t *t, size_t n) {
  race *r = calloc(1, sizeof *r);
  r->t = t;
  r->n = n;
  for (unsigned k = 0; k < RACE_KEYS; k++)
    tokens_for(r->toks[k], 50 + k);
  pthread_t th[3];
  for (int i = 0; i < 3; i++)
    pthread_create(&th[i], NULL, race_reader, r);
  uint8_t *src = malloc(n);
  /* at least RACE_ROUNDS puts, and on until the readers were served a
   * few hundred blocks (on a busy machine they may start late) */
  for (unsigned i = 0; i < RACE_ROUNDS || (atomic_load(&r->served) < 300 &&
                                           i < 200u * RACE_ROUNDS);
       i++) {
    unsigned k = (i * 5u) % RACE_KEYS;
    memset(src, (int)(k + 1), n);
    sl_kv_block_key key = {77, 500 + k, r->toks[k]};
    CHECK(sl_kv_tier_put(t, &key, src, n) == SL_OK);
  }
  atomic_store(&r->stop, 1);
  for (int i = 0; i < 3; i++)
    pthread_join(th[i], NULL);
  sl_kv_tier_stats st = sl_kv_tier_stats_of(t);
  printf("race: %d blocks served under %llu evictions\n",
         atomic_load(&r->served), (unsigned long long)st.evictions);
  CHECK(atomic_load(&r->bad) == 0);
  CHECK(st.evictions > 0 && atomic_load(&r->served) > 0);
  free(src);
  free(r);
}

int main(void) {
  const size_t n = 2u * LAYERS * T * KVD * 2;
  uint8_t *src = malloc(n), *dst = malloc(n), *zero = calloc(1, n);
  int32_t toks[8][T];
  for (unsigned i = 0; i < 8; i++)
    tokens_for(toks[i], i);
  sl_kv_tier_t *t;
  sl_kv_ram_config bad = cfg_for(0, false);
  CHECK(sl_kv_ram_open(&bad, &t) == SL_ERR_INVALID_ARG);

  /* round trips, raw and compressed; what must never be served */
  for (int lz = 0; lz < 2; lz++) {
    sl_kv_ram_config c = cfg_for(1u << 20, lz);
    CHECK(sl_kv_ram_open(&c, &t) == SL_OK);
    noise(src, n, 1);
    sl_kv_block_key k1 = {77, 101, toks[1]}, k2 = {77, 102, toks[2]};
    CHECK(sl_kv_tier_put(t, &k1, src, n) == SL_OK);
    CHECK(sl_kv_tier_put(t, &k2, zero, n) == SL_OK);
    CHECK(sl_kv_tier_contains(t, &k1) && sl_kv_tier_contains(t, &k2));
    memset(dst, 0xAA, n);
    CHECK(sl_kv_tier_get(t, &k1, dst, n) == SL_OK && !memcmp(dst, src, n));
    memset(dst, 0xAA, n);
    CHECK(sl_kv_tier_get(t, &k2, dst, n) == SL_OK && !memcmp(dst, zero, n));
    sl_kv_tier_stats st = sl_kv_tier_stats_of(t);
    /* the zero block compresses far below 7/8; noise never does */
    CHECK(st.compressed == (lz ? 1u : 0u));
    if (lz)
      CHECK(st.bytes < n + n / 8 + 1024);
    else
      CHECK(st.bytes >= 2 * n);
    /* the same hash with other token ids (a collision): never served */
    sl_kv_block_key kc = {77, 101, toks[3]};
    uint64_t misses = sl_kv_tier_stats_of(t).misses;
    CHECK(!sl_kv_tier_peek(t, &kc) && sl_kv_tier_peek(t, &k1));
    CHECK(sl_kv_tier_stats_of(t).misses == misses); /* a peek is no lookup */
    CHECK(!sl_kv_tier_contains(t, &kc));
    CHECK(sl_kv_tier_stats_of(t).misses == misses + 1);
    CHECK(sl_kv_tier_get(t, &kc, dst, n) == SL_ERR_NOT_FOUND);
    /* another model's fingerprint, a wrong size */
    sl_kv_block_key kf = {78, 101, toks[1]};
    CHECK(!sl_kv_tier_contains(t, &kf));
    CHECK(sl_kv_tier_get(t, &kf, dst, n) == SL_ERR_INVALID_ARG);
    CHECK(sl_kv_tier_get(t, &k1, dst, n - 2) == SL_ERR_INVALID_ARG);
    CHECK(sl_kv_tier_put(t, &kf, src, n) == SL_ERR_INVALID_ARG);
    st = sl_kv_tier_stats_of(t);
    CHECK(st.hits == 2 && st.puts == 2 && st.get_bytes == 2 * n);
    CHECK(st.entries == 2 && !strcmp(st.name, "hot") && st.enabled);
    sl_kv_tier_close(t);
  }

  /* the budget: room for three raw blocks; the least recently used goes */
  {
    sl_kv_ram_config c = cfg_for(3 * (n + 256), false);
    CHECK(sl_kv_ram_open(&c, &t) == SL_OK);
    sl_kv_block_key k[5];
    for (unsigned i = 0; i < 5; i++)
      k[i] = (sl_kv_block_key){77, 200 + i, toks[i]};
    for (unsigned i = 0; i < 3; i++) {
      noise(src, n, 10 + i);
      CHECK(sl_kv_tier_put(t, &k[i], src, n) == SL_OK);
    }
    CHECK(sl_kv_tier_stats_of(t).entries == 3);
    CHECK(sl_kv_tier_get(t, &k[0], dst, n) == SL_OK); /* 0 used: 1 is LRU */
    noise(src, n, 13);
    CHECK(sl_kv_tier_put(t, &k[3], src, n) == SL_OK);
    sl_kv_tier_stats st = sl_kv_tier_stats_of(t);
    CHECK(st.entries == 3 && st.evictions == 1 && st.bytes <= c.budget);
    CHECK(!sl_kv_tier_contains(t, &k[1]));
    CHECK(sl_kv_tier_contains(t, &k[0]) && sl_kv_tier_contains(t, &k[2]) &&
          sl_kv_tier_contains(t, &k[3]));
    noise(src, n, 10);
    CHECK(sl_kv_tier_get(t, &k[0], dst, n) == SL_OK && !memcmp(dst, src, n));
    sl_kv_tier_close(t);
  }

  /* a block larger than the whole budget is not held */
  {
    sl_kv_ram_config c = cfg_for(n / 2, false);
    CHECK(sl_kv_ram_open(&c, &t) == SL_OK);
    sl_kv_block_key k = {77, 300, toks[0]};
    CHECK(sl_kv_tier_put(t, &k, src, n) == SL_OK);
    CHECK(!sl_kv_tier_contains(t, &k) && sl_kv_tier_stats_of(t).bytes == 0);
    sl_kv_tier_close(t);
  }

  /* many blocks: the table grows, every block stays findable, and each
   * comes back with its own bytes */
  {
    enum { MANY = 3000 };
    sl_kv_ram_config c = cfg_for((uint64_t)MANY * (n + 256), true);
    CHECK(sl_kv_ram_open(&c, &t) == SL_OK);
    int32_t mt[T];
    for (unsigned i = 0; i < MANY; i++) {
      tokens_for(mt, 1000 + i);
      memset(src, (int)(i & 0xff), n); /* compressible */
      sl_kv_block_key k = {77, 0x1000000ull * (i + 1) + i, mt};
      CHECK(sl_kv_tier_put(t, &k, src, n) == SL_OK);
    }
    int found = 0;
    for (unsigned i = 0; i < MANY; i++) {
      tokens_for(mt, 1000 + i);
      sl_kv_block_key k = {77, 0x1000000ull * (i + 1) + i, mt};
      memset(src, (int)(i & 0xff), n);
      found += sl_kv_tier_get(t, &k, dst, n) == SL_OK && !memcmp(dst, src, n);
    }
    sl_kv_tier_stats st = sl_kv_tier_stats_of(t);
    printf("%d of %d blocks found; %llu bytes held for %llu payload bytes\n",
           found, MANY, (unsigned long long)st.bytes,
           (unsigned long long)st.put_bytes);
    CHECK(found == MANY && st.evictions == 0 && st.compressed == MANY);
    sl_kv_tier_close(t);
  }
  /* lent in place: the bytes stay while lent, through an eviction */
  {
    sl_kv_ram_config c = cfg_for(2 * (n + 256), true);
    CHECK(sl_kv_ram_open(&c, &t) == SL_OK);
    sl_kv_block_key k[4];
    for (unsigned i = 0; i < 4; i++)
      k[i] = (sl_kv_block_key){77, 400 + i, toks[i]};
    noise(src, n, 40);
    CHECK(sl_kv_tier_put(t, &k[0], src, n) == SL_OK);
    const void *at = NULL;
    void *hold = NULL;
    CHECK(sl_kv_tier_get_ref(t, &k[0], &at, n, &hold) == SL_OK && at && hold);
    CHECK(at && !memcmp(at, src, n));
    CHECK(sl_kv_tier_stats_of(t).hits == 1);
    sl_kv_block_key kc = {77, 400, toks[3]}; /* a collision: not lent */
    const void *at2 = NULL;
    void *hold2 = NULL;
    CHECK(sl_kv_tier_get_ref(t, &kc, &at2, n, &hold2) == SL_ERR_NOT_FOUND);
    CHECK(!at2 && !hold2);
    /* two more blocks: the budget evicts the lent one from the index */
    for (unsigned i = 1; i < 3; i++) {
      noise(dst, n, 41 + i);
      CHECK(sl_kv_tier_put(t, &k[i], dst, n) == SL_OK);
    }
    CHECK(!sl_kv_tier_contains(t, &k[0]));
    CHECK(sl_kv_tier_stats_of(t).bytes <= c.budget);
    CHECK(at && !memcmp(at, src, n)); /* still whole while lent */
    sl_kv_tier_unref(t, hold);        /* frees it (ASan: no leak) */
    /* a block held compressed is not lent: the caller copies */
    memset(src, 3, n);
    CHECK(sl_kv_tier_put(t, &k[3], src, n) == SL_OK);
    CHECK(sl_kv_tier_get_ref(t, &k[3], &at2, n, &hold2) == SL_ERR_UNSUPPORTED);
    CHECK(sl_kv_tier_get(t, &k[3], dst, n) == SL_OK && !memcmp(dst, src, n));
    sl_kv_tier_close(t);
  }

  /* payloads in an allocator's slots (lz4 is not used there) */
  {
    slots sl = {.size = n};
    sl_kv_ram_config c = cfg_for(3 * (n + 256), true);
    c.pay_alloc = slot_alloc;
    sl_kv_ram_config half = c;
    half.pay_free = NULL;
    CHECK(sl_kv_ram_open(&half, &t) == SL_ERR_INVALID_ARG);
    c.pay_free = slot_free;
    c.pay_ctx = &sl;
    CHECK(sl_kv_ram_open(&c, &t) == SL_OK);
    for (unsigned i = 0; i < 5; i++) {
      memset(src, (int)i, n); /* compressible, yet held raw */
      sl_kv_block_key k = {77, 600 + i, toks[i]};
      CHECK(sl_kv_tier_put(t, &k, src, n) == SL_OK);
    }
    sl_kv_tier_stats st = sl_kv_tier_stats_of(t);
    CHECK(st.entries == 3 && st.evictions == 2 && st.compressed == 0);
    CHECK(atomic_load(&sl.out) == 3 && atomic_load(&sl.allocs) == 5);
    sl_kv_block_key k4 = {77, 604, toks[4]};
    const void *at = NULL;
    void *hold = NULL;
    CHECK(sl_kv_tier_get_ref(t, &k4, &at, n, &hold) == SL_OK);
    memset(src, 4, n);
    CHECK(at && !memcmp(at, src, n));
    /* evicted while lent: its slot stays until the unref */
    for (unsigned i = 5; i < 8; i++) {
      sl_kv_block_key k = {77, 600 + i, toks[i]};
      CHECK(sl_kv_tier_put(t, &k, zero, n) == SL_OK);
    }
    CHECK(!sl_kv_tier_contains(t, &k4) && atomic_load(&sl.out) == 4);
    CHECK(at && !memcmp(at, src, n));
    sl_kv_tier_unref(t, hold);
    CHECK(atomic_load(&sl.out) == 3);
    race_run(t, n); /* slots freed and reused while lent and read */
    sl_kv_tier_close(t);
    CHECK(atomic_load(&sl.out) == 0);
  }

  /* the same race with the tier's own allocations, lz4 on (each block
   * compresses to ~100 bytes with its entry: room for about 8 of 24) */
  {
    sl_kv_ram_config c = cfg_for(1024, true);
    CHECK(sl_kv_ram_open(&c, &t) == SL_OK);
    race_run(t, n);
    sl_kv_tier_close(t);
  }
  free(src);
  free(dst);
  free(zero);
  return sl_test_finish();
}
