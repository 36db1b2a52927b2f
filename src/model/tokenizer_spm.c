/* SentencePiece-style (BPE by score) tokenization of one fragment, with
 * <0xXX> byte fallback, as llama.cpp's SPM tokenizer: repeatedly merge the
 * adjacent pair whose concatenation is a token with the highest score (ties:
 * leftmost first). */
#include <stdio.h>
#include <string.h>

#include "model/tokenizer_impl.h"
#include "sluice/util.h"

typedef struct sym {
  int32_t prev, next;
  uint32_t off, n;
} sym;

typedef struct bigram {
  float score;
  int32_t left, right;
  uint32_t size;
} bigram;

/* a before b in the queue: higher score, then smaller left */
static bool bg_first(const bigram *a, const bigram *b) {
  return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct work {
  sym *syms;
  bigram *heap;
  size_t nheap, cap;
} work;

static sl_status push(work *w, bigram b) {
  if (w->nheap == w->cap) {
    size_t nc = w->cap ? w->cap * 2 : 64, bytes;
    if (!sl_mul_ok(nc, sizeof *w->heap, &bytes))
      return SL_ERR_NOMEM;
    bigram *nh = sl_realloc(w->heap, bytes);
    if (!nh)
      return SL_ERR_NOMEM;
    w->heap = nh;
    w->cap = nc;
  }
  size_t i = w->nheap++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!bg_first(&b, &w->heap[p]))
      break;
    w->heap[i] = w->heap[p];
    i = p;
  }
  w->heap[i] = b;
  return SL_OK;
}

static bigram pop(work *w) {
  bigram top = w->heap[0], last = w->heap[--w->nheap];
  size_t i = 0, n = w->nheap;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const bigram *mb = &last;
    if (l < n && bg_first(&w->heap[l], mb)) {
      m = l;
      mb = &w->heap[l];
    }
    if (r < n && bg_first(&w->heap[r], mb))
      m = r;
    if (m == i)
      break;
    w->heap[i] = w->heap[m];
    i = m;
  }
  if (n)
    w->heap[i] = last;
  return top;
}

static sl_status try_bigram(const sl_tokenizer_t *t, work *w, const char *s,
                            int32_t left, int32_t right) {
  if (left < 0 || right < 0)
    return SL_OK;
  uint32_t size = w->syms[left].n + w->syms[right].n;
  int32_t id = sl__tok_lookup(t, s + w->syms[left].off, size);
  if (id == SL_TOKEN_NULL)
    return SL_OK;
  bigram b = {t->score[id], left, right, size};
  return push(w, b);
}

/* The id for raw byte c: "<0xXX>", else the one-byte token, else unk. */
static int32_t byte_token(const sl_tokenizer_t *t, unsigned char c) {
  char buf[8];
  snprintf(buf, sizeof buf, "<0x%02X>", c);
  int32_t id = sl__tok_lookup(t, buf, 6);
  if (id == SL_TOKEN_NULL)
    id = sl__tok_lookup(t, (const char *)&c, 1);
  if (id == SL_TOKEN_NULL)
    id = t->unk;
  return id;
}

sl_status sl__spm_fragment(const sl_tokenizer_t *t, const char *s, size_t len,
                           sl__ivec *out) {
  if (len == 0)
    return SL_OK;
  if (len > UINT32_MAX / 2)
    return SL_ERR_INVALID_ARG;
  work w = {0};
  sl_status st = SL_OK;
  w.syms = sl_calloc(len, sizeof *w.syms);
  if (!w.syms)
    return SL_ERR_NOMEM;
  int32_t nsym = 0;
  for (size_t off = 0; off < len;) {
    size_t cl = sl__utf8_len((unsigned char)s[off]);
    if (cl > len - off)
      cl = len - off;
    w.syms[nsym] = (sym){nsym - 1, off + cl == len ? -1 : nsym + 1,
                         (uint32_t)off, (uint32_t)cl};
    nsym++;
    off += cl;
  }
  for (int32_t i = 1; i < nsym && st == SL_OK; i++)
    st = try_bigram(t, &w, s, i - 1, i);
  while (st == SL_OK && w.nheap) {
    bigram b = pop(&w);
    sym *l = &w.syms[b.left], *r = &w.syms[b.right];
    if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
      continue;
    l->n += r->n;
    r->n = 0;
    l->next = r->next;
    if (r->next >= 0)
      w.syms[r->next].prev = b.left;
    st = try_bigram(t, &w, s, l->prev, b.left);
    if (st == SL_OK)
      st = try_bigram(t, &w, s, b.left, l->next);
  }
  /* Every merged symbol is a token (merges need one); what is left are
   * single characters, which are tokens or fall back to bytes. (llama.cpp's
   * re-segmentation through its merge log never fires for that reason.) */
  for (int32_t i = 0; st == SL_OK && i != -1; i = w.syms[i].next) {
    const sym *y = &w.syms[i];
    int32_t id = sl__tok_lookup(t, s + y->off, y->n);
    if (id != SL_TOKEN_NULL) {
      st = sl__ivec_push(out, id);
      continue;
    }
    for (uint32_t j = 0; j < y->n && st == SL_OK; j++) {
      int32_t bid = byte_token(t, (unsigned char)s[y->off + j]);
      if (bid != SL_TOKEN_NULL)
        st = sl__ivec_push(out, bid);
    }
  }
  sl_free(w.syms);
  sl_free(w.heap);
  return st;
}
