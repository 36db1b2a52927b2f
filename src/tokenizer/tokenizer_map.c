/* Tokenizer containers: a growable int32 vector and a string -> int64 hash
 * map with open addressing (linear probing) and an arena for the keys. */
#include <string.h>

#include "sluice/util.h"
#include "tokenizer_impl.h"

sl_status sl__ivec_push(sl__ivec *a, int32_t x) {
  if (a->n == a->cap) {
    size_t nc = a->cap ? a->cap * 2 : 16, bytes;
    if (!sl_mul_ok(nc, sizeof *a->v, &bytes))
      return SL_ERR_NOMEM;
    int32_t *nv = sl_realloc(a->v, bytes);
    if (!nv)
      return SL_ERR_NOMEM;
    a->v = nv;
    a->cap = nc;
  }
  a->v[a->n++] = x;
  return SL_OK;
}

static uint64_t hash_bytes(const char *k, size_t n) {
  /* FNV-1a, 64-bit, then a final mix so low bits are usable. */
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)k[i];
    h *= 1099511628211ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

void sl__strmap_init(sl__strmap *m) {
  memset(m, 0, sizeof *m);
}

void sl__strmap_free(sl__strmap *m) {
  sl_free(m->slots);
  sl_free(m->koff);
  sl_free(m->klen);
  sl_free(m->val);
  sl_free(m->arena);
  memset(m, 0, sizeof *m);
}

static bool key_eq(const sl__strmap *m, uint32_t e, const char *k, size_t n) {
  return m->klen[e] == n && memcmp(m->arena + m->koff[e], k, n) == 0;
}

/* Index of the slot holding `k`, or of the empty slot where it would go. */
static size_t find_slot(const sl__strmap *m, const char *k, size_t n,
                        uint64_t h) {
  size_t mask = m->cap - 1, i = (size_t)h & mask;
  for (;;) {
    uint32_t s = m->slots[i];
    if (s == 0 || key_eq(m, s - 1, k, n))
      return i;
    i = (i + 1) & mask;
  }
}

static sl_status grow_slots(sl__strmap *m) {
  size_t nc = m->cap ? m->cap * 2 : 64;
  uint32_t *ns = sl_calloc(nc, sizeof *ns);
  if (!ns)
    return SL_ERR_NOMEM;
  uint32_t *old = m->slots;
  size_t oc = m->cap;
  m->slots = ns;
  m->cap = nc;
  for (size_t i = 0; i < oc; i++) {
    uint32_t s = old[i];
    if (!s)
      continue;
    uint32_t e = s - 1;
    const char *k = m->arena + m->koff[e];
    size_t j = (size_t)hash_bytes(k, m->klen[e]) & (nc - 1);
    while (ns[j])
      j = (j + 1) & (nc - 1);
    ns[j] = s;
  }
  sl_free(old);
  return SL_OK;
}

static sl_status grow_entries(sl__strmap *m) {
  size_t nc = m->ecap ? m->ecap * 2 : 64, b1, b2, b3;
  if (nc > UINT32_MAX - 1 || !sl_mul_ok(nc, sizeof(uint64_t), &b1) ||
      !sl_mul_ok(nc, sizeof(uint32_t), &b2) ||
      !sl_mul_ok(nc, sizeof(int64_t), &b3))
    return SL_ERR_NOMEM;
  uint64_t *ko = sl_realloc(m->koff, b1);
  if (!ko)
    return SL_ERR_NOMEM;
  m->koff = ko;
  uint32_t *kl = sl_realloc(m->klen, b2);
  if (!kl)
    return SL_ERR_NOMEM;
  m->klen = kl;
  int64_t *v = sl_realloc(m->val, b3);
  if (!v)
    return SL_ERR_NOMEM;
  m->val = v;
  m->ecap = nc;
  return SL_OK;
}

sl_status sl__strmap_put(sl__strmap *m, const char *k, size_t klen, int64_t v,
                         bool overwrite) {
  if (klen > UINT32_MAX)
    return SL_ERR_INVALID_ARG;
  if ((m->count + 1) * 2 > m->cap) {
    sl_status st = grow_slots(m);
    if (st != SL_OK)
      return st;
  }
  uint64_t h = hash_bytes(k, klen);
  size_t i = find_slot(m, k, klen, h);
  if (m->slots[i]) {
    if (overwrite)
      m->val[m->slots[i] - 1] = v;
    return SL_OK;
  }
  if (m->count == m->ecap) {
    sl_status st = grow_entries(m);
    if (st != SL_OK)
      return st;
  }
  if (m->alen + klen + 1 > m->acap) {
    size_t nc = m->acap ? m->acap : 4096;
    while (nc < m->alen + klen + 1)
      nc *= 2;
    char *na = sl_realloc(m->arena, nc);
    if (!na)
      return SL_ERR_NOMEM;
    m->arena = na;
    m->acap = nc;
  }
  if (klen)
    memcpy(m->arena + m->alen, k, klen);
  m->arena[m->alen + klen] = 0;
  size_t e = m->count++;
  m->koff[e] = m->alen;
  m->klen[e] = (uint32_t)klen;
  m->val[e] = v;
  m->alen += klen + 1;
  m->slots[i] = (uint32_t)(e + 1);
  return SL_OK;
}

bool sl__strmap_get(const sl__strmap *m, const char *k, size_t klen,
                    int64_t *v) {
  if (!m->cap)
    return false;
  size_t i = find_slot(m, k, klen, hash_bytes(k, klen));
  if (!m->slots[i])
    return false;
  *v = m->val[m->slots[i] - 1];
  return true;
}

/* The vocabulary lookup that the encoders (tokenizer_bpe.c, tokenizer_spm.c)
 * and the driver (tokenizer.c) share; here, below all three, so that they do
 * not call each other in a loop. */
int32_t sl__tok_lookup(const sl_tokenizer_t *t, const char *s, size_t len) {
  int64_t v;
  if (sl__strmap_get(&t->tok_map, s, len, &v))
    return (int32_t)v;
  return SL_TOKEN_NULL;
}
