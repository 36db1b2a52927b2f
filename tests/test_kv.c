/* kv: the paged KV block pool — reference counts, the free list, the prefix
 * index and its collision guard, LRU eviction, the hash chain, the buffer
 * layout, a randomized check against a reference model, stats read from
 * another thread, fault injection at create, and the asserts that catch
 * misuse (death tests). */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>

#include "harness.h"
#include "kv/kv_impl.h"
#include "sluice/alloc.h"
#include "sluice/kv.h"
#include "sluice/rt.h"
#include "sluice/util.h"

static sl_stream_t *owner(void) {
  return sl_generation_stream(sl_cpu_device());
}

static sl_kv_pool_t *make_pool(int n_layer, int kv_dim, int T, int n_blocks,
                               uint64_t fp) {
  sl_kv_config c = {n_layer, kv_dim, T, n_blocks, fp};
  sl_kv_pool_t *p = NULL;
  sl_status st = sl_kv_pool_create(&c, owner(), &p);
  CHECK_MSG(st == SL_OK, "create: %s", sl_status_str(st));
  return p;
}

static void fill_tokens(int32_t *t, int n, int32_t base) {
  for (int i = 0; i < n; i++)
    t[i] = base + i;
}

/* ---- create -------------------------------------------------------------- */

static void test_create_bad_config(void) {
  sl_kv_pool_t *p = (sl_kv_pool_t *)(uintptr_t)1;
  sl_kv_config ok = {2, 8, 4, 4, 1};
  CHECK(sl_kv_pool_create(NULL, owner(), &p) == SL_ERR_INVALID_ARG);
  CHECK(p == NULL);
  CHECK(sl_kv_pool_create(&ok, NULL, &p) == SL_ERR_INVALID_ARG);
  CHECK(sl_kv_pool_create(&ok, owner(), NULL) == SL_ERR_INVALID_ARG);
  sl_kv_config bad[] = {
      {0, 8, 4, 4, 1},  {2, 0, 4, 4, 1},  {2, 8, 0, 4, 1},  {2, 8, 4, 0, 1},
      {-1, 8, 4, 4, 1}, {2, -8, 4, 4, 1}, {2, 8, -4, 4, 1}, {2, 8, 4, -4, 1},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    p = (sl_kv_pool_t *)(uintptr_t)1;
    CHECK_EQ_INT(sl_kv_pool_create(&bad[i], owner(), &p), SL_ERR_INVALID_ARG);
    CHECK(p == NULL);
  }
  /* the element count overflows size_t */
  sl_kv_config huge = {INT_MAX, INT_MAX, INT_MAX, INT_MAX, 1};
  CHECK_EQ_INT(sl_kv_pool_create(&huge, owner(), &p), SL_ERR_OVERFLOW);
  /* only the bytes (x2 for K and V, x2 for f16) overflow: 2^62 elements */
  sl_kv_config edge = {1 << 16, 1 << 15, 1 << 15, 1 << 16, 1};
  CHECK_EQ_INT(sl_kv_pool_create(&edge, owner(), &p), SL_ERR_OVERFLOW);
  CHECK(p == NULL);
}

static void test_create_memory_limit(void) {
  sl_device_t *dev = sl_cpu_device();
  size_t live0 = sl_malloc_live_bytes();
  sl_alloc_set_limit(dev, 1u << 20);
  /* 2 * 4 layers * 64 blocks * 16 tokens * 128 dim * 2 bytes = 2 MiB */
  sl_kv_config c = {4, 128, 16, 64, 7};
  sl_kv_pool_t *p = (sl_kv_pool_t *)(uintptr_t)1;
  CHECK_EQ_INT(sl_kv_pool_create(&c, owner(), &p), SL_ERR_MEMORY_LIMIT);
  CHECK(p == NULL);
  CHECK_EQ_INT(sl_malloc_live_bytes(), live0);
  sl_alloc_set_limit(dev, 0);
  CHECK_OK(sl_kv_pool_create(&c, owner(), &p));
  CHECK(p && sl_buf_size(sl_kv_buffer(p)) == 2u << 20);
  CHECK(sl_buf_owner(sl_kv_buffer(p)) == owner());
  CHECK(sl_kv_config_of(p)->fingerprint == 7);
  CHECK(sl_kv_config_of(p)->n_blocks == 64);
  sl_kv_pool_free(p);
  sl_kv_pool_free(NULL);
}

/* Fails each host allocation of create in turn: every failure returns
 * SL_ERR_NOMEM and leaks nothing, host or device. */
static void test_create_fault_injection(void) {
  sl_device_t *dev = sl_cpu_device();
  sl_kv_config c = {3, 16, 8, 37, 42};
  /* warm up: the runtime's own first-use allocations are not ours */
  sl_kv_pool_free(make_pool(3, 16, 8, 37, 42));
  int failures = 0;
  for (uint64_t n = 1; n < 100; n++) {
    size_t live0 = sl_malloc_live_bytes();
    uint64_t active0 = sl_alloc_get_stats(dev).active;
    sl_kv_pool_t *p = (sl_kv_pool_t *)(uintptr_t)1;
    sl_malloc_fail_after(n);
    sl_status st = sl_kv_pool_create(&c, owner(), &p);
    sl_malloc_fail_after(0);
    if (st == SL_OK) {
      CHECK(p != NULL);
      CHECK(sl__kv_pool_sanity(p));
      sl_kv_pool_free(p);
      CHECK_EQ_INT(sl_malloc_live_bytes(), live0);
      break;
    }
    failures++;
    CHECK_MSG(st == SL_ERR_NOMEM, "allocation %llu: %s", (unsigned long long)n,
              sl_status_str(st));
    CHECK(p == NULL);
    CHECK_MSG(sl_malloc_live_bytes() == live0, "allocation %llu leaked %zu",
              (unsigned long long)n, sl_malloc_live_bytes() - live0);
    CHECK_EQ_INT(sl_alloc_get_stats(dev).active, active0);
  }
  /* pool, blocks, tokens, free list, index */
  CHECK_MSG(failures >= 5, "only %d injection points", failures);
}

/* ---- blocks -------------------------------------------------------------- */

static void check_counts(sl_kv_pool_t *p, int used, int cached, int free_) {
  sl_kv_stats s = sl_kv_stats_of(p);
  CHECK_EQ_INT(s.used, used);
  CHECK_EQ_INT(s.cached, cached);
  CHECK_EQ_INT(s.free, free_);
  CHECK_EQ_INT(s.used + s.cached + s.free, s.n_blocks);
  CHECK_EQ_INT(sl_kv_available(p), cached + free_);
}

static void test_alloc_ref_unref_cycle(void) {
  enum { N = 8 };
  sl_kv_pool_t *p = make_pool(2, 4, 4, N, 1);
  if (!p)
    return;
  check_counts(p, 0, 0, N);
  for (int round = 0; round < 3; round++) {
    int ids[N];
    bool seen[N] = {false};
    for (int i = 0; i < N; i++) {
      ids[i] = sl_kv_block_alloc(p);
      CHECK(ids[i] >= 0 && ids[i] < N);
      if (ids[i] >= 0 && ids[i] < N) {
        CHECK(!seen[ids[i]]);
        seen[ids[i]] = true;
        CHECK_EQ_INT(sl_kv_block_refcount(p, ids[i]), 1);
      }
    }
    check_counts(p, N, 0, 0);
    CHECK_EQ_INT(sl_kv_block_alloc(p), -1);
    sl_kv_block_ref(p, ids[3]);
    sl_kv_block_ref(p, ids[3]);
    CHECK_EQ_INT(sl_kv_block_refcount(p, ids[3]), 3);
    sl_kv_block_unref(p, ids[3]);
    sl_kv_block_unref(p, ids[3]);
    CHECK_EQ_INT(sl_kv_block_refcount(p, ids[3]), 1);
    for (int i = 0; i < N; i++) {
      sl_kv_block_unref(p, ids[i]);
      CHECK_EQ_INT(sl_kv_block_refcount(p, ids[i]), 0);
      check_counts(p, N - 1 - i, 0, i + 1);
    }
    CHECK(sl__kv_pool_sanity(p));
  }
  sl_kv_stats s = sl_kv_stats_of(p);
  CHECK_EQ_INT(s.evictions, 0); /* nothing was published */
  sl_kv_pool_free(p);
}

/* ---- prefix cache -------------------------------------------------------- */

static void test_publish_lookup(void) {
  enum { T = 4 };
  sl_kv_pool_t *p = make_pool(1, 4, T, 4, 9);
  if (!p)
    return;
  int32_t tok[T], other[T];
  fill_tokens(tok, T, 100);
  fill_tokens(other, T, 200);
  uint64_t h = sl_kv_hash_block(p, 0, tok, T);
  int a = sl_kv_block_alloc(p);
  CHECK(sl_kv_publish(p, a, h, tok));
  /* the pool keeps its own copy of the tokens */
  int32_t copy[T];
  memcpy(copy, tok, sizeof tok);
  tok[0] = -1;

  CHECK_EQ_INT(sl_kv_lookup(p, h, copy), a);
  CHECK_EQ_INT(sl_kv_block_refcount(p, a), 2);
  CHECK_EQ_INT(sl_kv_lookup(p, h + 1, copy), -1);
  CHECK_EQ_INT(sl_kv_lookup(p, sl_kv_hash_block(p, 0, other, T), other), -1);
  sl_kv_stats s = sl_kv_stats_of(p);
  CHECK_EQ_INT(s.hits, 1);
  CHECK_EQ_INT(s.misses, 2);

  /* a second block under the same hash loses and stays unpublished */
  int b = sl_kv_block_alloc(p);
  CHECK(!sl_kv_publish(p, b, h, copy));
  CHECK(!sl_kv_publish(p, a, h, copy)); /* a itself: already there */
  sl_kv_block_unref(p, b);
  check_counts(p, 1, 0, 3); /* b went free, not cached */

  /* unreferenced, a stays cached and can be found again */
  sl_kv_block_unref(p, a);
  sl_kv_block_unref(p, a);
  check_counts(p, 0, 1, 3);
  CHECK_EQ_INT(sl_kv_lookup(p, h, copy), a);
  check_counts(p, 1, 0, 3);
  CHECK_EQ_INT(sl_kv_block_refcount(p, a), 1);
  /* a ref on a cached block revives it too */
  sl_kv_block_unref(p, a);
  check_counts(p, 0, 1, 3);
  sl_kv_block_ref(p, a);
  check_counts(p, 1, 0, 3);
  sl_kv_block_unref(p, a);
  s = sl_kv_stats_of(p);
  CHECK_EQ_INT(s.hits, 2);
  CHECK_EQ_INT(s.misses, 2);
  CHECK(sl__kv_pool_sanity(p));
  sl_kv_pool_free(p);
}

static void test_collision_guard(void) {
  enum { T = 8 };
  sl_kv_pool_t *p = make_pool(1, 2, T, 4, 3);
  if (!p)
    return;
  int32_t x[T], y[T];
  fill_tokens(x, T, 1);
  fill_tokens(y, T, 1);
  y[T - 1] = 999;      /* differs in the last token only */
  uint64_t h = 0x1234; /* a forced collision: same hash, other tokens */
  int a = sl_kv_block_alloc(p);
  CHECK(sl_kv_publish(p, a, h, x));
  CHECK_EQ_INT(sl_kv_lookup(p, h, y), -1);
  CHECK_EQ_INT(sl_kv_block_refcount(p, a), 1);
  int b = sl_kv_block_alloc(p);
  CHECK(!sl_kv_publish(p, b, h, y));
  CHECK_EQ_INT(sl_kv_lookup(p, h, x), a);
  sl_kv_stats s = sl_kv_stats_of(p);
  CHECK_EQ_INT(s.hits, 1);
  CHECK_EQ_INT(s.misses, 1);
  sl_kv_pool_free(p);
}

/* Publishes block `b` with tokens derived from `tag`; returns the hash. */
static uint64_t publish_tag(sl_kv_pool_t *p, int b, int tag, int T) {
  int32_t tok[64];
  fill_tokens(tok, T, tag * 1000);
  uint64_t h = sl_kv_hash_block(p, 0, tok, T);
  CHECK(sl_kv_publish(p, b, h, tok));
  return h;
}

static bool lookup_tag(sl_kv_pool_t *p, uint64_t h, int tag, int T, int *got) {
  int32_t tok[64];
  fill_tokens(tok, T, tag * 1000);
  *got = sl_kv_lookup(p, h, tok);
  return *got >= 0;
}

static void test_lru_eviction_order(void) {
  enum { N = 4, T = 2 };
  sl_kv_pool_t *p = make_pool(1, 2, T, N, 5);
  if (!p)
    return;
  int id[N];
  uint64_t h[N];
  for (int i = 0; i < N; i++) {
    id[i] = sl_kv_block_alloc(p);
    h[i] = publish_tag(p, id[i], i, T);
  }
  int order[N] = {2, 0, 3, 1};
  for (int i = 0; i < N; i++)
    sl_kv_block_unref(p, id[order[i]]);
  check_counts(p, 0, N, 0);
  /* touch 0: it moves to the most recently used end -> 2, 3, 1, 0 */
  int got;
  CHECK(lookup_tag(p, h[0], 0, T, &got) && got == id[0]);
  sl_kv_block_unref(p, id[0]);
  int expect[N] = {2, 3, 1, 0};
  for (int i = 0; i < N; i++) {
    int b = sl_kv_block_alloc(p);
    CHECK_MSG(b == id[expect[i]], "eviction %d: got %d, want %d", i, b,
              id[expect[i]]);
    /* evicted means unpublished: its prefix is gone */
    CHECK(!lookup_tag(p, h[expect[i]], expect[i], T, &got));
    CHECK_EQ_INT(sl_kv_stats_of(p).evictions, i + 1);
    /* and it can be published again under a new hash */
    if (i == 0)
      h[expect[i]] = publish_tag(p, b, 50, T);
  }
  check_counts(p, N, 0, 0);
  /* free blocks go before cached ones */
  sl_kv_block_unref(p, id[2]); /* republished: cached */
  sl_kv_block_unref(p, id[3]); /* free */
  check_counts(p, N - 2, 1, 1);
  CHECK_EQ_INT(sl_kv_block_alloc(p), id[3]);
  CHECK_EQ_INT(sl_kv_stats_of(p).evictions, N);
  CHECK_EQ_INT(sl_kv_block_alloc(p), id[2]);
  CHECK_EQ_INT(sl_kv_stats_of(p).evictions, N + 1);
  CHECK(sl__kv_pool_sanity(p));
  sl_kv_pool_free(p);
}

static void test_referenced_never_evicted(void) {
  enum { N = 6, T = 2 };
  sl_kv_pool_t *p = make_pool(1, 2, T, N, 5);
  if (!p)
    return;
  int id[N];
  uint64_t h[N];
  for (int i = 0; i < N; i++) {
    id[i] = sl_kv_block_alloc(p);
    h[i] = publish_tag(p, id[i], i, T);
  }
  /* a sequence keeps blocks 0..2; 3..5 are released (cached) */
  for (int i = 3; i < N; i++)
    sl_kv_block_unref(p, id[i]);
  /* a second sequence shares block 1 and revives block 4 */
  sl_kv_block_ref(p, id[1]);
  int got;
  CHECK(lookup_tag(p, h[4], 4, T, &got) && got == id[4]);
  /* only 3 and 5 can be evicted */
  int e1 = sl_kv_block_alloc(p), e2 = sl_kv_block_alloc(p);
  CHECK((e1 == id[3] && e2 == id[5]));
  CHECK_EQ_INT(sl_kv_block_alloc(p), -1);
  CHECK_EQ_INT(sl_kv_available(p), 0);
  for (int i = 0; i < 3; i++) {
    CHECK(lookup_tag(p, h[i], i, T, &got) && got == id[i]);
    sl_kv_block_unref(p, got);
  }
  CHECK(lookup_tag(p, h[4], 4, T, &got) && got == id[4]);
  sl_kv_block_unref(p, got);
  CHECK_EQ_INT(sl_kv_block_refcount(p, id[1]), 2);
  CHECK_EQ_INT(sl_kv_stats_of(p).evictions, 2);
  CHECK(sl__kv_pool_sanity(p));
  sl_kv_pool_free(p);
}

static void test_hash_chain(void) {
  enum { T = 16, NB = 6 };
  sl_kv_pool_t *p = make_pool(1, 2, T, 4, 0xabc);
  sl_kv_pool_t *q = make_pool(1, 2, T, 4, 0xabc);
  sl_kv_pool_t *r = make_pool(1, 2, T, 4, 0xabd);
  if (!p || !q || !r)
    goto done;
  int32_t tok[NB * T];
  for (int i = 0; i < NB * T; i++)
    tok[i] = (int32_t)(i * 7919 % 50000);
  uint64_t hp[NB], hq[NB], hr[NB], hc[NB];
  uint64_t a = 0, b = 0, c = 0, d = 0;
  int32_t changed[NB * T];
  memcpy(changed, tok, sizeof tok);
  changed[3] += 1; /* one token of block 0 */
  for (int i = 0; i < NB; i++) {
    hp[i] = a = sl_kv_hash_block(p, a, tok + i * T, T);
    hq[i] = b = sl_kv_hash_block(q, b, tok + i * T, T);
    hr[i] = c = sl_kv_hash_block(r, c, tok + i * T, T);
    hc[i] = d = sl_kv_hash_block(p, d, changed + i * T, T);
  }
  for (int i = 0; i < NB; i++) {
    CHECK(hp[i] == hq[i]); /* same prefix, same fingerprint: same hashes */
    CHECK(hp[i] != hr[i]); /* another fingerprint: other hashes */
    CHECK(hp[i] != hc[i]); /* block 0 changed: every later hash changes */
    for (int j = 0; j < i; j++)
      CHECK(hp[i] != hp[j]);
  }
  /* the same tokens after another parent hash differently */
  CHECK(sl_kv_hash_block(p, 0, tok + T, T) != hp[1]);
  /* a different order of the same tokens hashes differently */
  int32_t sw[T];
  memcpy(sw, tok, sizeof sw);
  int32_t t0 = sw[0];
  sw[0] = sw[1];
  sw[1] = t0;
  CHECK(sl_kv_hash_block(p, 0, sw, T) != hp[0]);
  /* deterministic */
  CHECK(sl_kv_hash_block(p, 0, tok, T) == hp[0]);
done:
  sl_kv_pool_free(p);
  sl_kv_pool_free(q);
  sl_kv_pool_free(r);
}

/* ---- layout -------------------------------------------------------------- */

static void test_offsets(void) {
  enum { L = 3, D = 8, T = 4, N = 5 };
  sl_kv_pool_t *p = make_pool(L, D, T, N, 1);
  if (!p)
    return;
  size_t span = (size_t)T * D;
  size_t total = 2 * (size_t)L * N * span; /* f16 elements */
  CHECK_EQ_INT(sl_buf_size(sl_kv_buffer(p)), total * 2);
  uint8_t *cover = calloc(total, 1);
  uint16_t *img = calloc(total, sizeof *img);
  uint16_t *back = calloc(total, sizeof *back);
  if (!cover || !img || !back)
    goto done;
  /* every (layer, block) range of K and of V lies inside the buffer, the
   * ranges do not overlap, and together they cover it; K comes first */
  for (int l = 0; l < L; l++)
    for (int b = 0; b < N; b++) {
      size_t ko = sl_kv_k_offset(p, l, b), vo = sl_kv_v_offset(p, l, b);
      CHECK(ko + span <= total / 2);
      CHECK(vo >= total / 2 && vo + span <= total);
      CHECK_EQ_INT(ko, ((size_t)l * N + b) * span);
      for (size_t i = 0; i < span; i++) {
        cover[ko + i]++;
        cover[vo + i]++;
        img[ko + i] = (uint16_t)(l * 100 + b * 10 + 1);
        img[vo + i] = (uint16_t)(l * 100 + b * 10 + 2);
      }
    }
  for (size_t i = 0; i < total; i++)
    if (cover[i] != 1) {
      CHECK_MSG(cover[i] == 1, "element %zu covered %d times", i, cover[i]);
      break;
    }
  /* the buffer really holds that many elements */
  CHECK_OK(sl_buf_write(sl_kv_buffer(p), 0, img, total * sizeof *img));
  CHECK_OK(sl_buf_read(sl_kv_buffer(p), 0, back, total * sizeof *back));
  CHECK(memcmp(img, back, total * sizeof *img) == 0);
  uint16_t probe[T * D];
  CHECK_OK(sl_buf_read(sl_kv_buffer(p), sl_kv_v_offset(p, 2, 3) * 2, probe,
                       sizeof probe));
  CHECK_EQ_INT(probe[0], 2 * 100 + 3 * 10 + 2);
  CHECK_EQ_INT(probe[T * D - 1], 2 * 100 + 3 * 10 + 2);
done:
  free(cover);
  free(img);
  free(back);
  sl_kv_pool_free(p);
}

/* ---- randomized check against a reference model -------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}
static int rnd(int n) {
  return (int)(rng() % (uint64_t)n);
}

enum { M_FREE, M_USED, M_CACHED };
enum { MT = 3, MAXN = 64 };

typedef struct model {
  int n;
  int state[MAXN];
  int ref[MAXN];
  bool pub[MAXN];
  uint64_t hash[MAXN];
  int32_t tok[MAXN][MT];
  uint64_t lru_time[MAXN];
  uint64_t clock;
  uint64_t hits, misses, evictions;
} model;

static int model_find(const model *m, uint64_t h) {
  for (int b = 0; b < m->n; b++)
    if (m->pub[b] && m->hash[b] == h)
      return b;
  return -1;
}

/* a random block in `state` (refcount kept below 1000), or -1 */
static int model_pick(const model *m, int state) {
  int c[MAXN], k = 0;
  for (int b = 0; b < m->n; b++)
    if (m->state[b] == state && m->ref[b] < 1000)
      c[k++] = b;
  return k ? c[rnd(k)] : -1;
}

static void random_tokens(int32_t *t) {
  for (int i = 0; i < MT; i++)
    t[i] = rnd(3);
}

static bool model_check_against(sl_kv_pool_t *p, const model *m, long op) {
  int cnt[3] = {0, 0, 0};
  bool ok = true;
  for (int b = 0; b < m->n; b++) {
    cnt[m->state[b]]++;
    /* model-internal invariants */
    if ((m->state[b] == M_USED) != (m->ref[b] > 0) ||
        (m->state[b] == M_FREE && m->pub[b]) ||
        (m->state[b] == M_CACHED && !m->pub[b])) {
      CHECK_MSG(0, "op %ld: model broken at block %d", op, b);
      ok = false;
    }
    if (sl_kv_block_refcount(p, b) != m->ref[b]) {
      CHECK_MSG(0, "op %ld: block %d refcount %d, model %d", op, b,
                sl_kv_block_refcount(p, b), m->ref[b]);
      ok = false;
    }
  }
  sl_kv_stats s = sl_kv_stats_of(p);
  if (s.used != cnt[M_USED] || s.cached != cnt[M_CACHED] ||
      s.free != cnt[M_FREE] || s.used + s.cached + s.free != m->n ||
      s.hits != m->hits || s.misses != m->misses ||
      s.evictions != m->evictions ||
      sl_kv_available(p) != cnt[M_FREE] + cnt[M_CACHED]) {
    CHECK_MSG(0,
              "op %ld: stats used %d/%d cached %d/%d free %d/%d hits %llu/%llu "
              "misses %llu/%llu evictions %llu/%llu",
              op, s.used, cnt[M_USED], s.cached, cnt[M_CACHED], s.free,
              cnt[M_FREE], (unsigned long long)s.hits,
              (unsigned long long)m->hits, (unsigned long long)s.misses,
              (unsigned long long)m->misses, (unsigned long long)s.evictions,
              (unsigned long long)m->evictions);
    ok = false;
  }
  return ok;
}

static bool model_run(int n, long ops) {
  sl_kv_pool_t *p = make_pool(1, 2, MT, n, 77);
  if (!p)
    return false;
  model m;
  memset(&m, 0, sizeof m);
  m.n = n;
  bool ok = true;
  for (long op = 0; op < ops && ok; op++) {
    int r = rnd(100);
    if (r < 20) { /* alloc */
      int b = sl_kv_block_alloc(p);
      int want_state = M_FREE;
      bool any_free = false, any_cached = false;
      int lru = -1;
      for (int i = 0; i < n; i++) {
        any_free |= m.state[i] == M_FREE;
        if (m.state[i] == M_CACHED) {
          any_cached = true;
          if (lru < 0 || m.lru_time[i] < m.lru_time[lru])
            lru = i;
        }
      }
      if (!any_free && !any_cached) {
        CHECK_MSG(b == -1, "op %ld: alloc gave %d with all referenced", op, b);
        ok = b == -1;
        continue;
      }
      if (!any_free) {
        want_state = M_CACHED;
        CHECK_MSG(b == lru, "op %ld: evicted %d, least recent is %d", op, b,
                  lru);
        ok = b == lru;
      }
      if (!ok || b < 0 || b >= n || m.state[b] != want_state) {
        CHECK_MSG(0, "op %ld: alloc gave %d", op, b);
        ok = false;
        continue;
      }
      if (want_state == M_CACHED) {
        m.evictions++;
        m.pub[b] = false;
      }
      m.state[b] = M_USED;
      m.ref[b] = 1;
    } else if (r < 30) { /* ref a used block */
      int b = model_pick(&m, M_USED);
      if (b < 0)
        continue;
      sl_kv_block_ref(p, b);
      m.ref[b]++;
    } else if (r < 33) { /* ref a cached block: revives it */
      int b = model_pick(&m, M_CACHED);
      if (b < 0)
        continue;
      sl_kv_block_ref(p, b);
      m.ref[b] = 1;
      m.state[b] = M_USED;
    } else if (r < 58) { /* unref */
      int b = model_pick(&m, M_USED);
      if (b < 0)
        continue;
      sl_kv_block_unref(p, b);
      if (--m.ref[b] == 0) {
        m.state[b] = m.pub[b] ? M_CACHED : M_FREE;
        m.lru_time[b] = ++m.clock;
      }
    } else if (r < 73) { /* publish */
      int b = model_pick(&m, M_USED);
      if (b < 0)
        continue;
      int32_t t[MT];
      random_tokens(t);
      uint64_t h = rnd(5) == 0 ? (uint64_t)(1 + rnd(4)) /* forced collision */
                               : sl_kv_hash_block(p, (uint64_t)rnd(2), t, MT);
      int owner_b = model_find(&m, h);
      if (m.pub[b] && owner_b < 0)
        continue; /* a published block under a second hash is a bug */
      bool want = owner_b < 0;
      bool got = sl_kv_publish(p, b, h, t);
      if (got != want) {
        CHECK_MSG(0, "op %ld: publish %d gave %d, want %d", op, b, got, want);
        ok = false;
      }
      if (want) {
        m.pub[b] = true;
        m.hash[b] = h;
        memcpy(m.tok[b], t, sizeof t);
      }
    } else { /* lookup */
      uint64_t h;
      int32_t t[MT];
      int src = rnd(3) ? model_pick(&m, rnd(2) ? M_USED : M_CACHED) : -1;
      if (src >= 0 && m.pub[src]) {
        h = m.hash[src];
        memcpy(t, m.tok[src], sizeof t);
        if (rnd(4) == 0)
          random_tokens(t); /* perhaps other tokens under the same hash */
      } else {
        random_tokens(t);
        h = rnd(3) == 0 ? (uint64_t)(1 + rnd(4))
                        : sl_kv_hash_block(p, (uint64_t)rnd(2), t, MT);
      }
      int want = model_find(&m, h);
      if (want >= 0 && memcmp(m.tok[want], t, sizeof t) != 0)
        want = -1;
      int got = sl_kv_lookup(p, h, t);
      if (got != want) {
        CHECK_MSG(0, "op %ld: lookup gave %d, want %d", op, got, want);
        ok = false;
        continue;
      }
      if (want < 0) {
        m.misses++;
      } else {
        m.hits++;
        m.ref[want]++;
        m.state[want] = M_USED;
      }
    }
    ok = ok && model_check_against(p, &m, op);
    if (ok && (n <= 8 || op % 16 == 0) && !sl__kv_pool_sanity(p)) {
      CHECK_MSG(0, "op %ld: pool sanity", op);
      ok = false;
    }
  }
  sl_kv_stats s = sl_kv_stats_of(p);
  fprintf(stderr, "   n=%d: %llu hits, %llu misses, %llu evictions\n", n,
          (unsigned long long)s.hits, (unsigned long long)s.misses,
          (unsigned long long)s.evictions);
  /* the run exercised every path */
  CHECK(s.hits > 0 && s.misses > 0 && s.evictions > 0);
  sl_kv_pool_free(p);
  return ok;
}

static void test_model_check(void) {
  const char *seed = getenv("SLUICE_KV_SEED");
  if (seed)
    rng_state = strtoull(seed, NULL, 0) | 1;
  fprintf(stderr, "   seed 0x%llx (SLUICE_KV_SEED)\n",
          (unsigned long long)rng_state);
  CHECK(model_run(16, 100000));
  CHECK(model_run(3, 20000));
  CHECK(model_run(MAXN, 30000));
}

/* ---- stats from another thread ------------------------------------------- */

typedef struct reader {
  sl_kv_pool_t *p;
  atomic_bool stop;
  atomic_long reads;
  long bad;
} reader;

static void *reader_main(void *arg) {
  reader *r = arg;
  uint64_t hits = 0, misses = 0, ev = 0;
  while (!atomic_load(&r->stop)) {
    sl_kv_stats s = sl_kv_stats_of(r->p);
    if (s.used + s.cached + s.free != s.n_blocks || s.used < 0 ||
        s.cached < 0 || s.free < 0 || s.hits < hits || s.misses < misses ||
        s.evictions < ev)
      r->bad++;
    hits = s.hits;
    misses = s.misses;
    ev = s.evictions;
    r->reads++;
  }
  return NULL;
}

static void test_stats_from_other_thread(void) {
  enum { N = 32, T = 4 };
  sl_kv_pool_t *p = make_pool(1, 2, T, N, 11);
  if (!p)
    return;
  reader r = {.p = p};
  atomic_init(&r.stop, false);
  pthread_t th;
  CHECK(pthread_create(&th, NULL, reader_main, &r) == 0);
  while (atomic_load(&r.reads) == 0) /* the reader is running */
    sched_yield();
  int held[N], nheld = 0;
  for (int i = 0; i < 50000; i++) {
    int32_t t[T] = {i % 40, 1, 2, 3};
    uint64_t h = sl_kv_hash_block(p, 0, t, T);
    int b = sl_kv_lookup(p, h, t);
    if (b < 0) {
      b = sl_kv_block_alloc(p);
      if (b >= 0)
        sl_kv_publish(p, b, h, t);
    }
    if (b >= 0)
      held[nheld++] = b;
    if (nheld == N || (nheld && (i % 3) == 0))
      sl_kv_block_unref(p, held[--nheld]);
  }
  atomic_store(&r.stop, true);
  pthread_join(th, NULL);
  while (nheld)
    sl_kv_block_unref(p, held[--nheld]);
  CHECK_EQ_INT(r.bad, 0);
  CHECK(atomic_load(&r.reads) > 0);
  sl_kv_stats s = sl_kv_stats_of(p);
  CHECK_EQ_INT(s.used, 0);
  CHECK(s.hits > 0 && s.misses > 0 && s.evictions > 0);
  CHECK(sl__kv_pool_sanity(p));
  sl_kv_pool_free(p);
}

/* ---- death tests: misuse is a bug and aborts ----------------------------- */

static void child_unref_free(void) {
  sl_kv_pool_t *p = make_pool(1, 2, 2, 2, 1);
  sl_kv_block_unref(p, 1);
}

static void child_ref_free(void) {
  sl_kv_pool_t *p = make_pool(1, 2, 2, 2, 1);
  int b = sl_kv_block_alloc(p);
  sl_kv_block_unref(p, b);
  sl_kv_block_ref(p, b);
}

static void child_unref_cached(void) {
  sl_kv_pool_t *p = make_pool(1, 2, 2, 2, 1);
  int b = sl_kv_block_alloc(p);
  int32_t t[2] = {1, 2};
  sl_kv_publish(p, b, 5, t);
  sl_kv_block_unref(p, b);
  sl_kv_block_unref(p, b);
}

static void child_out_of_range(void) {
  sl_kv_pool_t *p = make_pool(1, 2, 2, 2, 1);
  sl_kv_block_ref(p, 2);
}

static void child_publish_free(void) {
  sl_kv_pool_t *p = make_pool(1, 2, 2, 2, 1);
  int32_t t[2] = {1, 2};
  sl_kv_publish(p, 0, 5, t);
}

static void expect_abort(const char *child, const char *what) {
  int ws = 0;
  char err[8192];
  CHECK_OK(sl_test_spawn_child(child, &ws, err, sizeof err));
  CHECK_MSG(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGABRT, "%s: status 0x%x",
            child, ws);
  CHECK_MSG(strstr(err, what) != NULL, "%s: message lacks '%s':\n%s", child,
            what, err);
}

static void test_misuse_aborts(void) {
  expect_abort("unref-free", "unref of a block that holds no reference");
  expect_abort("ref-free", "reference to a free block");
  expect_abort("unref-cached", "unref of a block that holds no reference");
  expect_abort("out-of-range", "block id out of range");
  expect_abort("publish-free", "publish of an unreferenced block");
}

/* The layout helpers of kv.h (the one source of the arithmetic) agree with
 * the pool's own validated sizes and offsets, and the prefix fingerprint
 * changes with the model's fingerprint and with block_tokens. */
static void test_layout_helpers(void) {
  sl_kv_config c = {3, 40, 8, 11, 0};
  sl_kv_pool_t *p;
  CHECK_OK(sl_kv_pool_create(&c, owner(), &p));
  sl_kv_view v = sl_kv_view_of(p);
  CHECK_EQ_INT(sl_kv_view_bytes(&v), sl_buf_size(sl_kv_buffer(p)));
  CHECK_EQ_INT(sl_kv_block_bytes(c.n_layer, c.kv_dim, c.block_tokens) *
                   (uint64_t)c.n_blocks,
               sl_buf_size(sl_kv_buffer(p)));
  for (int l = 0; l < c.n_layer; l++)
    for (int b = 0; b < c.n_blocks; b++) {
      CHECK_EQ_INT(sl_kv_view_k_offset(&v, l, b), sl_kv_k_offset(p, l, b));
      CHECK_EQ_INT(sl_kv_view_k_offset(&v, l, b) + sl_kv_view_half_elems(&v),
                   sl_kv_v_offset(p, l, b));
    }
  sl_kv_pool_free(p);
  uint8_t fa[16] = {1, 2, 3}, fb[16] = {1, 2, 3};
  CHECK(sl_kv_fingerprint(fa, 16) == sl_kv_fingerprint(fb, 16));
  CHECK(sl_kv_fingerprint(fa, 16) != sl_kv_fingerprint(fa, 32));
  fb[15] ^= 1;
  CHECK(sl_kv_fingerprint(fa, 16) != sl_kv_fingerprint(fb, 16));
}

int main(int argc, char **argv) {
  SL_TEST_CHILDREN(argc, argv, {"unref-free", child_unref_free},
                   {"ref-free", child_ref_free},
                   {"unref-cached", child_unref_cached},
                   {"out-of-range", child_out_of_range},
                   {"publish-free", child_publish_free});
  RUN(test_create_bad_config);
  RUN(test_create_memory_limit);
  RUN(test_create_fault_injection);
  RUN(test_alloc_ref_unref_cycle);
  RUN(test_publish_lookup);
  RUN(test_collision_guard);
  RUN(test_lru_eviction_order);
  RUN(test_referenced_never_evicted);
  RUN(test_hash_chain);
  RUN(test_offsets);
  RUN(test_layout_helpers);
  RUN(test_model_check);
  RUN(test_stats_from_other_thread);
  RUN(test_misuse_aborts);
  sl_rt_shutdown();
  return sl_test_finish();
}
