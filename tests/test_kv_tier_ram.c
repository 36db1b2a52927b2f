/* The hot RAM tier (src/kv/tier_ram.c):
 *   - put then get gives the same bytes, raw and lz4-compressed;
 *   - a block whose token ids differ from the key's (a hash collision) or
 *     of another model (fingerprint) is never served;
 *   - the byte budget evicts the least recently used block (a get is a
 *     use), and bytes held never pass it;
 *   - lz4 keeps a block compressed only when that saves an eighth: a
 *     compressible block is held in fewer bytes, noise is held raw;
 *   - many blocks (the table grows) stay findable. */
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
  free(src);
  free(dst);
  free(zero);
  return sl_test_finish();
}
