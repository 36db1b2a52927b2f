/* sluice — engine: speculative decoding (issue 47).
 *
 * A drafter proposes the next few tokens of a sequence from what it has
 * seen; the target model scores them all in one pass (the drafted tokens
 * are a short prompt extension) and greedy decoding keeps the longest
 * prefix it agrees with plus its own next token. Because a token's logits
 * do not depend on how its sequence was cut into passes (DESIGN.md I9),
 * speculative greedy output equals plain greedy output bit for bit, logits
 * included. This round: prompt lookup as the drafter, and the greedy loop
 * over a single-sequence context (`sluice run --speculative ngram`).
 */
#ifndef SLUICE_SPEC_H
#define SLUICE_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "sluice/model.h"
#include "sluice/status.h"

/* Prompt lookup (model-free n-gram drafts). */
typedef struct sl_draft_params {
  int n_max;     /* tokens drafted at most (k), >= 1 */
  int n_min;     /* fewer would be drafted: draft none, >= 1 */
  int ngram_max; /* the longest suffix looked up, >= ngram_min */
  int ngram_min; /* the shortest, >= 1 */
} sl_draft_params;

/* n_max 8, n_min 1, ngram_max 4, ngram_min 2. */
sl_draft_params sl_draft_defaults(void);

/* False (and a message in err) unless every field is in range. */
bool sl_draft_params_ok(const sl_draft_params *p, char *err, size_t errcap);

/* The drafts for a sequence whose tokens so far are hist[0..n): the longest
 * suffix of hist, ngram_max tokens down to ngram_min, that also occurs
 * earlier in hist; of its occurrences the latest; what followed it there,
 * up to n_max tokens (and never past the end of hist), into out. Returns
 * that count, or 0 when no suffix recurs or fewer than n_min tokens would
 * be proposed. O(n * ngram_max) per call. */
int sl_draft_lookup(const sl_draft_params *p, const int32_t *hist, int n,
                    int32_t *out);

typedef struct sl_spec_stats {
  int64_t passes;   /* forward passes over the sequence */
  int64_t drafted;  /* tokens proposed */
  int64_t accepted; /* of them, kept */
} sl_spec_stats;

/* Called for each generated token, in order, with its logits (n_vocab
 * floats: the target's row that chose it; argmax of it is tok). Returns
 * false to stop (an end-of-generation token, a stop condition). */
typedef bool (*sl_spec_emit_fn)(void *ud, int32_t tok, const float *logits);

/* Greedy generation of up to max_new tokens over c, which has evaluated
 * hist[0..n_hist) (the prompt) and whose last logits row is `last`. hist
 * has room for n_hist + max_new tokens and gains each generated token.
 * dp NULL: one token a pass; else each pass feeds the last token and up to
 * dp->n_max drafts (sl_draft_lookup over hist), keeps the drafts while the
 * target's argmax (the lowest index on a tie) agrees, and truncates c past
 * the tokens kept. The same tokens and logits either way. Needs room in c
 * for the drafts: n_past + 1 + n_max <= n_ctx, or drafts are cut. */
sl_status sl_spec_generate_greedy(sl_ctx_t *c, int n_ctx, int32_t *hist,
                                  int n_hist, const float *last,
                                  int64_t n_vocab, int max_new,
                                  const sl_draft_params *dp,
                                  sl_spec_emit_fn emit, void *ud,
                                  sl_spec_stats *stats);

#endif
