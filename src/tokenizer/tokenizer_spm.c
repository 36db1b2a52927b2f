/* SentencePiece-style (BPE by score) tokenization of one fragment, with
 * <0xXX> byte fallback, as llama.cpp's SPM tokenizer: repeatedly merge the
 * adjacent pair whose concatenation is a token with the highest score (ties:
 * leftmost first). */
#include <stdio.h>
#include <string.h>

#include "sluice/heap.h"
#include "sluice/util.h"
#include "tokenizer_impl.h"

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
  sl_heap heap; /* of bigram */
} work;

static bool bg_first_v(const void *a, const void *b) {
  return bg_first(a, b);
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
  return sl_heap_push(&w->heap, &b);
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
  sl_heap_init(&w.heap, sizeof(bigram), bg_first_v);
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
    st = try_bigram(t, &w, s, i - 1, i);
  bigram b;
  while (st == SL_OK && sl_heap_pop(&w.heap, &b)) {
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
  sl_heap_free(&w.heap);
  return st;
}
