/* sluice — engine: a draft model behind the drafter interface
 * (include/sluice/spec.h). Each sequence has a context over the draft
 * model on the drafter's stream; a proposal catches that context up to
 * the sequence's tokens (the common prefix kept, the rest evaluated, so a
 * rejection is rolled back by the next proposal) and drafts greedily, one
 * pass of the draft model per token. The drafts are the draft model's
 * argmax (q puts all its mass on them), so the engine verifies them as it
 * verifies prompt lookup's: exactly, greedy or sampled. */
#include <stdio.h>
#include <string.h>

#include "sluice/spec.h"
#include "sluice/util.h"

enum { CATCH_UP_CHUNK = 256 }; /* tokens a catch-up pass evaluates at most */

typedef struct model_drafter {
  sl_drafter base; /* base.stream: borrowed, outlives the drafter */
  sl_model_t *model;
  int n_threads;
  int64_t n_vocab;
  float *logits; /* one row: the drafter serves one thread at a time */
} model_drafter;

typedef struct model_seq {
  sl_draft_seq head;
  sl_ctx_t *ctx; /* NULL: it could not be made (no drafts) */
  int32_t *toks; /* what ctx holds: toks[0 .. n_past) */
  int cap;       /* its context: the sequence's tokens at most */
} model_seq;

static sl_draft_seq *model_seq_begin(sl_drafter *d, const int32_t *ref,
                                     int n_ref, int max_len) {
  (void)ref; /* a draft model drafts from the sequence alone */
  (void)n_ref;
  model_drafter *md = (model_drafter *)d;
  model_seq *s = sl_calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->cap = max_len;
  s->toks = sl_malloc(sizeof(int32_t) * (size_t)max_len);
  if (!s->toks || sl_ctx_create(md->model, d->stream, max_len, md->n_threads,
                                &s->ctx) != SL_OK) {
    s->ctx = NULL; /* the sequence goes without drafts */
    SL_LOGW("draft model: no context of %d tokens for a sequence", max_len);
  }
  return &s->head;
}

static int model_propose(sl_drafter *d, sl_draft_seq *hs, const int32_t *hist,
                         int n, int k, int32_t *out) {
  model_drafter *md = (model_drafter *)d;
  model_seq *s = (model_seq *)hs;
  /* the drafts' passes need positions n .. n + k - 2 */
  if (!s->ctx || n < 1 || n + 1 > s->cap)
    return 0;
  k = k < s->cap - n + 1 ? k : s->cap - n + 1;
  int past = sl_ctx_n_past(s->ctx), c = 0;
  while (c < past && c < n && s->toks[c] == hist[c])
    c++;
  if (c == n) /* the last token again, for its logits */
    c = n - 1;
  sl_ctx_truncate(s->ctx, c);
  while (c < n) {
    int m = n - c < CATCH_UP_CHUNK ? n - c : CATCH_UP_CHUNK;
    if (sl_ctx_eval(s->ctx, hist + c, m, c + m == n ? md->logits : NULL,
                    false) != SL_OK) {
      sl_ctx_truncate(s->ctx, 0);
      return 0;
    }
    memcpy(s->toks + c, hist + c, sizeof(int32_t) * (size_t)m);
    c += m;
  }
  int i = 0;
  while (i < k) {
    int32_t t = sl_spec_argmax(md->logits, md->n_vocab);
    out[i++] = t;
    if (i == k)
      break;
    if (sl_ctx_eval(s->ctx, &t, 1, md->logits, false) != SL_OK)
      break;
    s->toks[n + i - 1] = t;
  }
  return i;
}

static void model_seq_end(sl_drafter *d, sl_draft_seq *hs) {
  (void)d;
  model_seq *s = (model_seq *)hs;
  sl_ctx_free(s->ctx); /* its buffers RETIRING until the stream is done */
  sl_free(s->toks);
  sl_free(s);
}

static void model_destroy(sl_drafter *d) {
  model_drafter *md = (model_drafter *)d;
  sl_free(md->logits);
  sl_free(md);
}

static const sl_drafter_ops model_ops = {
    .name = "draft-model",
    .seq_begin = model_seq_begin,
    .propose = model_propose,
    .accepted = NULL, /* a rejection is rolled back by the next proposal */
    .seq_end = model_seq_end,
    .destroy = model_destroy,
};

sl_drafter *sl_drafter_model_create(sl_model_t *m, sl_stream_t *stream,
                                    int n_threads) {
  if (!m || !stream)
    return NULL;
  model_drafter *md = sl_calloc(1, sizeof *md);
  if (!md)
    return NULL;
  md->n_vocab = sl_model_hparams_of(m)->n_vocab;
  md->logits = sl_malloc(sizeof(float) * (size_t)md->n_vocab);
  if (!md->logits) {
    sl_free(md);
    return NULL;
  }
  md->base.ops = &model_ops;
  md->base.stream = stream;
  md->model = m;
  md->n_threads = n_threads;
  return &md->base;
}

sl_status sl_draft_side_open(const char *path, const sl_tokenizer_t *target,
                             int n_threads, sl_draft_side *out, char *err,
                             size_t errcap) {
  char why[256] = "";
  sl_status st = SL_OK;
  sl_tokenizer_t *dt = NULL;
  memset(out, 0, sizeof *out);
  if (!(out->model = sl_model_load(path, &st, why, sizeof why)) ||
      (st = sl_tokenizer_load(sl_model_gguf(out->model), &dt, why,
                              sizeof why)) != SL_OK ||
      !sl_tokenizer_same_vocab(target, dt, why, sizeof why)) {
    st = st != SL_OK ? st : SL_ERR_INVALID_ARG;
  } else if ((st = sl_stream_create(sl_cpu_device(), "draft", &out->stream)) !=
                 SL_OK ||
             !(out->drafter = sl_drafter_model_create(out->model, out->stream,
                                                      n_threads))) {
    st = st != SL_OK ? st : SL_ERR_NOMEM;
    snprintf(why, sizeof why, "%s", sl_status_str(st));
  }
  sl_tokenizer_free(dt);
  if (st != SL_OK) {
    if (err && errcap)
      snprintf(err, errcap, "%s", why[0] ? why : sl_status_str(st));
    sl_stream_destroy(out->stream);
    sl_model_free(out->model);
    memset(out, 0, sizeof *out);
  }
  return st;
}
