/* Embeddings in the engine (sl_gen_params.pooling), under the sanitizers
 * (labels c;threaded): llama.cpp's vectors are the Python test's reference
 * (tests/py/test_api_embed.py); here the engine's own properties:
 * - a DONE event with n_embd floats of norm 1, nothing generated;
 * - the same prompt again (its blocks now in the prefix cache) gives the
 *   same vector, and a prompt split into prefill chunks the vector of one
 *   chunk;
 * - mean and last pooling differ;
 * - an embedding beside a generation leaves the generation's greedy tokens
 *   as they are alone;
 * - bad pooling values are refused at submit. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine_util.h"
#include "harness.h"
#include "sluice/engine.h"
#include "sluice/model.h"
#include "sluice/rt.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

static sl_model_t *g_model;
static sl_tokenizer_t *g_tok;
static int g_d;

typedef struct emb {
  result r;
  float v[4096];
  int n;
  int completion;
} emb;

static void on_emb(void *ud, const sl_engine_event *ev) {
  emb *x = ud;
  if (ev->kind == SL_EV_DONE && ev->embedding && ev->n_embd <= 4096) {
    memcpy(x->v, ev->embedding, sizeof(float) * (size_t)ev->n_embd);
    x->n = ev->n_embd;
    x->completion = ev->completion_tokens;
  }
  on_event(&x->r, ev);
}

static sl_engine_t *engine(int chunk) {
  sl_engine_config cfg = sl_engine_config_defaults();
  cfg.device = SL_ENGINE_DEVICE_CPU;
  cfg.n_ctx = 512;
  cfg.kv_block_tokens = 16;
  cfg.kv_blocks = 128;
  cfg.n_threads = 2;
  cfg.prefill_chunk = chunk;
  cfg.max_batched_tokens = chunk;
  sl_engine_t *e = NULL;
  CHECK_OK(sl_engine_create(g_model, g_tok, &cfg, &e));
  return e;
}

static void embed(sl_engine_t *e, const int32_t *ids, int n, sl_pooling pool,
                  emb *x) {
  memset(x, 0, sizeof *x);
  result_init(&x->r);
  sl_gen_params p = greedy(8);
  p.pooling = pool;
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_emb, x, NULL));
}

static double cosine(const float *a, const float *b, int n) {
  double s = 0;
  for (int i = 0; i < n; i++)
    s += (double)a[i] * b[i];
  return s;
}

static int tokenize(const char *text, int32_t **ids) {
  size_t n = 0;
  CHECK_OK(
      sl_tokenizer_encode(g_tok, text, strlen(text), true, false, ids, &n));
  return (int)n;
}

static void test_embed(void) {
  int32_t *ids = NULL;
  int n = tokenize("Embeddings turn text into vectors, and vectors into "
                   "neighbours: a sentence long enough to fill a few blocks "
                   "of sixteen tokens each, so that the prefix cache has "
                   "something to offer the second time. It goes on, past "
                   "the third block and into the fourth, with plain words "
                   "that a small tokenizer splits one by one.",
                   &ids);
  CHECK(n > 40);
  sl_engine_t *e = engine(512), *small = engine(16);
  emb a, b, c, l;
  embed(e, ids, n, SL_POOL_MEAN, &a);
  result_wait(&a.r);
  CHECK(a.r.finish == SL_FINISH_STOP && a.n == g_d && a.completion == 0);
  CHECK(a.r.n == 0); /* no token was generated */
  CHECK(fabs(cosine(a.v, a.v, g_d) - 1.0) < 1e-4);
  /* again: its blocks are cached now, and must not be reused */
  embed(e, ids, n, SL_POOL_MEAN, &b);
  result_wait(&b.r);
  CHECK(b.n == g_d && b.r.cached == 0);
  CHECK(cosine(a.v, b.v, g_d) > 1 - 1e-6);
  /* prefill in chunks of 16: the same vector */
  embed(small, ids, n, SL_POOL_MEAN, &c);
  result_wait(&c.r);
  CHECK(c.n == g_d && cosine(a.v, c.v, g_d) > 1 - 1e-5);
  /* the last token's: another vector */
  embed(small, ids, n, SL_POOL_LAST, &l);
  result_wait(&l.r);
  CHECK(l.n == g_d && fabs(cosine(l.v, l.v, g_d) - 1.0) < 1e-4);
  CHECK(cosine(a.v, l.v, g_d) < 0.999);

  /* beside a generation: its greedy tokens as alone */
  result alone, beside;
  result_init(&alone);
  result_init(&beside);
  sl_gen_params g = greedy(24);
  CHECK_OK(sl_engine_submit(e, ids, 12, &g, on_event, &alone, NULL));
  result_wait(&alone);
  emb many[6];
  CHECK_OK(sl_engine_submit(small, ids, 12, &g, on_event, &beside, NULL));
  for (int k = 0; k < 6; k++)
    embed(small, ids + k, n - k, k % 2 ? SL_POOL_LAST : SL_POOL_MEAN, &many[k]);
  result_wait(&beside);
  for (int k = 0; k < 6; k++) {
    result_wait(&many[k].r);
    CHECK(many[k].n == g_d && many[k].r.finish == SL_FINISH_STOP);
  }
  CHECK(beside.n == alone.n && beside.finish == alone.finish);
  CHECK(!memcmp(beside.toks, alone.toks, sizeof(int32_t) * (size_t)alone.n));

  /* refused: a pooling that is none of the kinds */
  sl_gen_params bad = greedy(8);
  bad.pooling = (sl_pooling)7;
  CHECK(sl_engine_submit(e, ids, n, &bad, on_event, &alone, NULL) ==
        SL_ERR_INVALID_ARG);
  sl_engine_free(small);
  sl_engine_free(e);
  sl_free(ids);
}

int main(void) {
  int rc = load_default_model(&g_model, &g_tok);
  if (rc)
    return rc;
  g_d = (int)sl_model_hparams_of(g_model)->n_embd;
  RUN(test_embed);
  sl_tokenizer_free(g_tok);
  sl_model_free(g_model);
  sl_rt_shutdown();
  return sl_test_finish();
}
