/* SentencePiece-style (BPE by score) tokenization of one fragment, with
 * <0xXX> byte fallback, as llama.cpp's SPM tokenizer: the shared merge loop
 * (tokenizer_merge.c) ranked by score, the adjacent pair whose concatenation
 * is the token of highest score joining first. */
#include <stdio.h>

#include "sluice/util.h"
#include "tokenizer_impl.h"

/* Joining p[0, na) and p[na, na + nb) ranks by its token's score, higher
 * first (the rank is its negation: exact, and ordered the same). */
static sl_status spm_rank(const sl_tokenizer_t *t, void *ctx, const char *p,
                          size_t na, size_t nb, bool *joins, double *rank) {
  int32_t id = sl__tok_lookup(t, p, na + nb);
  *joins = id != SL_TOKEN_NULL;
  if (*joins)
    *rank = -(double)t->score[id];
  return SL_OK;
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

/* Every joined piece is a token (a pair joins only then); what is left are
 * single characters, which are tokens or fall back to bytes. (llama.cpp's
 * re-segmentation through its merge log never fires for that reason.) */
sl_status sl__spm_fragment(const sl_tokenizer_t *t, const char *s, size_t len,
                           sl__ivec *out) {
  sl__merge_rule rule = {spm_rank, byte_token, NULL};
  return sl__merge_text(t, s, len, &rule, out);
}
