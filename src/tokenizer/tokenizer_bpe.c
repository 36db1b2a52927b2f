/* Byte-level BPE: one pre-tokenized word through the shared merge loop
 * (tokenizer_merge.c), ranked by the merges list: the pair of lowest merge
 * rank joins first. A piece that is no token falls back to its one-byte
 * tokens, where the vocabulary has them. */
#include <string.h>

#include "sluice/util.h"
#include "tokenizer_impl.h"

typedef struct bpe_ctx {
  char *key; /* merge_map's key: (u32 length of the left, left, right) */
  size_t capkey;
} bpe_ctx;

/* The merge rank of joining p[0, na) and p[na, na + nb), if listed. */
static sl_status bpe_rank(const sl_tokenizer_t *t, void *ctx, const char *p,
                          size_t na, size_t nb, bool *joins, double *rank) {
  bpe_ctx *c = ctx;
  size_t need = 4 + na + nb;
  if (need > c->capkey) {
    char *nk = sl_realloc(c->key, need);
    if (!nk)
      return SL_ERR_NOMEM;
    c->key = nk;
    c->capkey = need;
  }
  uint32_t la = (uint32_t)na;
  memcpy(c->key, &la, 4);
  memcpy(c->key + 4, p, na + nb);
  int64_t r;
  *joins = sl__strmap_get(&t->merge_map, c->key, need, &r) && r >= 0;
  if (*joins)
    *rank = (double)r; /* exact: ranks are indices into the merges list */
  return SL_OK;
}

/* The id for raw byte c: its one-byte token, or SL_TOKEN_NULL (dropped). */
static int32_t bpe_byte(const sl_tokenizer_t *t, unsigned char c) {
  return sl__tok_lookup(t, (const char *)&c, 1);
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
  bpe_ctx c = {NULL, 0};
  sl__merge_rule rule = {bpe_rank, bpe_byte, &c};
  sl_status st = sl__merge_text(t, word, wlen, &rule, out);
  sl_free(c.key);
  return st;
}
