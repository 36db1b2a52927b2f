/* Byte-level BPE: merges the characters of one pre-tokenized word, lowest
 * merge rank first (ties: leftmost first), then maps the pieces to ids.
 * A binary heap with lazy invalidation keeps long words O(n log n). */
#include <string.h>

#include "sluice/heap.h"
#include "sluice/util.h"
#include "tokenizer_impl.h"

typedef struct sym {
  int32_t prev, next;
  uint32_t off, n; /* bytes of the word */
} sym;

typedef struct bigram {
  int64_t rank;
  int32_t left, right;
  uint32_t size;
} bigram;

typedef struct work {
  sym *syms;
  sl_heap heap; /* of bigram */
  char *key;
  size_t capkey;
} work;

static bool bg_less(const bigram *a, const bigram *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static bool bg_less_v(const void *a, const void *b) {
  return bg_less(a, b);
}

/* Rank of merging syms[left] and syms[right], or -1. */
static sl_status rank_of(const sl_tokenizer_t *t, work *w, const char *word,
                         int32_t left, int32_t right, int64_t *rank) {
  const sym *a = &w->syms[left], *b = &w->syms[right];
  size_t need = 4 + (size_t)a->n + b->n;
  if (need > w->capkey) {
    char *nk = sl_realloc(w->key, need);
    if (!nk)
      return SL_ERR_NOMEM;
    w->key = nk;
    w->capkey = need;
  }
  uint32_t la = a->n;
  memcpy(w->key, &la, 4);
  memcpy(w->key + 4, word + a->off, a->n);
  memcpy(w->key + 4 + a->n, word + b->off, b->n);
  if (!sl__strmap_get(&t->merge_map, w->key, need, rank))
    *rank = -1;
  return SL_OK;
}

static sl_status add_bigram(const sl_tokenizer_t *t, work *w, const char *word,
                            int32_t left, int32_t right) {
  if (left < 0 || right < 0)
    return SL_OK;
  int64_t rank;
  sl_status st = rank_of(t, w, word, left, right, &rank);
  if (st != SL_OK || rank < 0)
    return st;
  bigram b = {rank, left, right, w->syms[left].n + w->syms[right].n};
  return sl_heap_push(&w->heap, &b);
}

sl_status sl__bpe_word(const sl_tokenizer_t *t, const char *word, size_t wlen,
                       sl__ivec *out) {
  if (wlen == 0)
    return SL_OK;
  if (wlen > UINT32_MAX / 2)
    return SL_ERR_INVALID_ARG;
  if (t->ignore_merges) {
    int32_t id = sl__tok_lookup(t, word, wlen);
    if (id != SL_TOKEN_NULL)
      return sl__ivec_push(out, id);
  }
  work w = {0};
  sl_heap_init(&w.heap, sizeof(bigram), bg_less_v);
  sl_status st = SL_OK;
  w.syms = sl_calloc(wlen, sizeof *w.syms);
  if (!w.syms)
    return SL_ERR_NOMEM;
  int32_t nsym = 0;
  for (size_t off = 0; off < wlen;) {
    size_t cl = sl_utf8_seq_len((unsigned char)word[off]);
    if (cl > wlen - off)
      cl = wlen - off;
    w.syms[nsym] = (sym){nsym - 1, off + cl == wlen ? -1 : nsym + 1,
                         (uint32_t)off, (uint32_t)cl};
    nsym++;
    off += cl;
  }
  for (int32_t i = 1; i < nsym && st == SL_OK; i++)
    st = add_bigram(t, &w, word, i - 1, i);
  bigram b;
  while (st == SL_OK && sl_heap_pop(&w.heap, &b)) {
    sym *l = &w.syms[b.left], *r = &w.syms[b.right];
    if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
      continue; /* stale */
    l->n += r->n;
    r->n = 0;
    l->next = r->next;
    if (r->next >= 0)
      w.syms[r->next].prev = b.left;
    st = add_bigram(t, &w, word, l->prev, b.left);
    if (st == SL_OK)
      st = add_bigram(t, &w, word, b.left, l->next);
  }
  for (int32_t i = 0; st == SL_OK && i != -1 && nsym > 0; i = w.syms[i].next) {
    const sym *s = &w.syms[i];
    if (s->n == 0)
      continue;
    int32_t id = sl__tok_lookup(t, word + s->off, s->n);
    if (id != SL_TOKEN_NULL) {
      st = sl__ivec_push(out, id);
      continue;
    }
    /* No token for the piece: each of its bytes on its own, if any. */
    for (uint32_t j = 0; j < s->n && st == SL_OK; j++) {
      int32_t bid = sl__tok_lookup(t, word + s->off + j, 1);
      if (bid != SL_TOKEN_NULL)
        st = sl__ivec_push(out, bid);
    }
  }
  sl_free(w.syms);
  sl_heap_free(&w.heap);
  sl_free(w.key);
  return st;
}
