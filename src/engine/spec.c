/* sluice — engine: speculative decoding (include/sluice/spec.h): prompt
 * lookup, and greedy generation over a single-sequence context that
 * verifies the drafts in one pass and truncates what it rejects. */
#include <stdio.h>
#include <string.h>

#include "sluice/spec.h"
#include "sluice/util.h"

sl_draft_params sl_draft_defaults(void) {
  return (sl_draft_params){
      .n_max = 8, .n_min = 1, .ngram_max = 4, .ngram_min = 2};
}

bool sl_draft_params_ok(const sl_draft_params *p, char *err, size_t errcap) {
  const char *why = NULL;
  if (!p)
    why = "no parameters";
  else if (p->n_max < 1 || p->n_max > 64)
    why = "draft-max must be 1..64";
  else if (p->n_min < 1 || p->n_min > p->n_max)
    why = "draft-min must be 1..draft-max";
  else if (p->ngram_min < 1 || p->ngram_max < p->ngram_min || p->ngram_max > 64)
    why = "the n-gram lengths must be 1 <= min <= max <= 64";
  if (why && err && errcap)
    snprintf(err, errcap, "%s", why);
  return why == NULL;
}

int sl_draft_lookup(const sl_draft_params *p, const int32_t *hist, int n,
                    int32_t *out) {
  if (!p || !hist || !out || n < 2)
    return 0;
  int top = p->ngram_max < n - 1 ? p->ngram_max : n - 1;
  for (int g = top; g >= p->ngram_min; g--) {
    const int32_t *suf = hist + n - g;
    /* the latest earlier occurrence that leaves n_min tokens after it */
    for (int i = n - g - 1; i >= 0; i--) {
      if (memcmp(hist + i, suf, sizeof(int32_t) * (size_t)g) != 0)
        continue;
      int from = i + g, cnt = n - from < p->n_max ? n - from : p->n_max;
      if (cnt < p->n_min)
        continue;
      memcpy(out, hist + from, sizeof(int32_t) * (size_t)cnt);
      return cnt;
    }
  }
  return 0;
}

/* The lowest index of the largest logit (the engine's greedy rule). */
static int32_t argmax(const float *lg, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (lg[i] > lg[best])
      best = i;
  return (int32_t)best;
}

sl_status sl_spec_generate_greedy(sl_ctx_t *c, int n_ctx, int32_t *hist,
                                  int n_hist, const float *last,
                                  int64_t n_vocab, int max_new,
                                  const sl_draft_params *dp,
                                  sl_spec_emit_fn emit, void *ud,
                                  sl_spec_stats *stats) {
  sl_spec_stats dummy;
  if (!stats)
    stats = &dummy;
  memset(stats, 0, sizeof *stats);
  if (!c || !hist || n_hist < 0 || !last || n_vocab <= 0 || max_new < 0 ||
      !emit || (dp && !sl_draft_params_ok(dp, NULL, 0)))
    return SL_ERR_INVALID_ARG;
  const int K = dp ? dp->n_max : 0;
  float *rows = sl_malloc(sizeof(float) * (size_t)n_vocab * (size_t)(K + 1));
  int32_t *batch = sl_malloc(sizeof(int32_t) * (size_t)(K + 1));
  if (!rows || !batch) {
    sl_free(rows);
    sl_free(batch);
    return SL_ERR_NOMEM;
  }
  sl_status st = SL_OK;
  int n = n_hist, made = 0;
  const float *row = last; /* the logits that chose cur */
  int32_t cur = argmax(row, n_vocab);
  while (made < max_new) {
    hist[n++] = cur;
    made++;
    if (!emit(ud, cur, row) || made == max_new)
      break;
    /* cur goes in first; after it the drafts, as many as the budget, the
     * context and the lookup allow */
    int past = sl_ctx_n_past(c), d = 0;
    if (dp) {
      d = sl_draft_lookup(dp, hist, n, batch + 1);
      int room = n_ctx - past - 1;
      d = d < room ? d : room > 0 ? room : 0;
      d = d < max_new - made ? d : max_new - made;
    }
    batch[0] = cur;
    if ((st = sl_ctx_eval(c, batch, 1 + d, rows, d > 0)) != SL_OK)
      break;
    stats->passes++;
    stats->drafted += d;
    /* row i follows cur and drafts 0..i-1: keep draft i while the target
     * would have chosen it */
    int i = 0;
    bool stop = false;
    while (i < d) {
      const float *r = rows + (size_t)i * (size_t)n_vocab;
      int32_t t = argmax(r, n_vocab);
      if (t != batch[1 + i])
        break;
      i++;
      stats->accepted++;
      hist[n++] = t;
      made++;
      if (!emit(ud, t, r) || made == max_new) {
        stop = true;
        break;
      }
    }
    if (d > 0)
      sl_ctx_truncate(c, past + 1 + i); /* cur and the drafts kept */
    if (stop)
      break;
    row = rows + (size_t)i * (size_t)n_vocab;
    cur = argmax(row, n_vocab);
  }
  sl_free(rows);
  sl_free(batch);
  return st;
}
