/* The merge loop that byte-level BPE (tokenizer_bpe.c) and SentencePiece
 * (tokenizer_spm.c) share: a text split into characters, the adjacent pair
 * of best rank joined until no pair joins (ties: leftmost first), each piece
 * then mapped to its id or, where it is no token, to its bytes' ids. The two
 * differ only in how a pair ranks and in what a lone byte becomes (the
 * sl__merge_rule they pass). A binary heap with lazy invalidation keeps long
 * texts O(n log n). */
#include "sluice/heap.h"
#include "sluice/util.h"
#include "tokenizer_impl.h"

typedef struct sym {
  int32_t prev, next;
  uint32_t off, n; /* bytes of the text; n = 0 once joined to its left */
} sym;

typedef struct bigram {
  double rank;
  int32_t left, right;
  uint32_t size; /* bytes of the pair when ranked: stale once it differs */
} bigram;

typedef struct work {
  const sl_tokenizer_t *t;
  const char *s;
  sym *syms;
  sl_heap heap; /* of bigram */
  const sl__merge_rule *rule;
} work;

/* a before b in the queue: the lower rank, then the smaller left */
static bool bg_first(const void *pa, const void *pb) {
  const bigram *a = pa, *b = pb;
  return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

/* Queues the pair (left, right) if both exist and it joins. */
static sl_status try_bigram(work *w, int32_t left, int32_t right) {
  if (left < 0 || right < 0)
    return SL_OK;
  const sym *a = &w->syms[left], *b = &w->syms[right];
  bool joins = false;
  double rank = 0;
  sl_status st = w->rule->rank(w->t, w->rule->ctx, w->s + a->off, a->n, b->n,
                               &joins, &rank);
  if (st != SL_OK || !joins)
    return st;
  bigram g = {rank, left, right, a->n + b->n};
  return sl_heap_push(&w->heap, &g);
}

sl_status sl__merge_text(const sl_tokenizer_t *t, const char *s, size_t len,
                         const sl__merge_rule *rule, sl__ivec *out) {
  if (len == 0)
    return SL_OK;
  if (len > UINT32_MAX / 2)
    return SL_ERR_INVALID_ARG;
  work w = {t, s, NULL, {0}, rule};
  sl_heap_init(&w.heap, sizeof(bigram), bg_first);
  sl_status st = SL_OK;
  w.syms = sl_calloc(len, sizeof *w.syms);
  if (!w.syms)
    return SL_ERR_NOMEM;
  int32_t nsym = 0;
  for (size_t off = 0; off < len;) {
    size_t cl = sl_utf8_seq_len((unsigned char)s[off]);
    if (cl > len - off)
      cl = len - off;
    w.syms[nsym] = (sym){nsym - 1, off + cl == len ? -1 : nsym + 1,
                         (uint32_t)off, (uint32_t)cl};
    nsym++;
    off += cl;
  }
  for (int32_t i = 1; i < nsym && st == SL_OK; i++)
    st = try_bigram(&w, i - 1, i);
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
    st = try_bigram(&w, l->prev, b.left);
    if (st == SL_OK)
      st = try_bigram(&w, b.left, l->next);
  }
  /* the pieces left, in order: joined ones are unlinked */
  for (int32_t i = 0; st == SL_OK && i != -1; i = w.syms[i].next) {
    const sym *y = &w.syms[i];
    int32_t id = sl__tok_lookup(t, s + y->off, y->n);
    if (id != SL_TOKEN_NULL) {
      st = sl__ivec_push(out, id);
      continue;
    }
    /* no token for the piece: each of its bytes on its own, if any */
    for (uint32_t j = 0; j < y->n && st == SL_OK; j++) {
      int32_t bid = rule->byte_id(t, (unsigned char)s[y->off + j]);
      if (bid != SL_TOKEN_NULL)
        st = sl__ivec_push(out, bid);
    }
  }
  sl_free(w.syms);
  sl_heap_free(&w.heap);
  return st;
}
