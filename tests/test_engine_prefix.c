/* A prefix-cache hit must not change the answer (issue 10, item 8): a prompt
 * served cold and the same prompt served with its first blocks from the
 * prefix cache give the same greedy tokens, logprobs and top-20 logprobs,
 * bit for bit, for every remainder the cache leaves to compute: 1 to 20
 * tokens (a prompt of 2 blocks + r tokens after a primer that shares its
 * first 2 blocks; 0 cannot happen, the last prompt token is always computed
 * for its logits), then 40 more prompts that leave 1 (the remainder that
 * runs alone: about one in four of them differed when its attention took
 * the one-token order and the cold run the chunk's, mutants 20 and 25).
 * The cold runs go to a second engine, and each prompt starts with its own
 * words, so nothing there is cached. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "engine_util.h"
#include "harness.h"
#include "sluice/engine.h"
#include "sluice/model.h"
#include "sluice/rt.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

enum { BLOCK = 16, NGEN = 8, NTOP = 20 };

static sl_model_t *g_model;
static sl_tokenizer_t *g_tok;

/* One request's tokens, their logprobs and the top NTOP alternatives'. */
typedef struct run {
  result r;
  float lp[NGEN];
  sl_token_logprob top[NGEN][NTOP];
  int nlp;
} run;

static void on_event_lp(void *ud, const sl_engine_event *ev) {
  run *x = ud;
  if (ev->kind == SL_EV_TOKEN && ev->token >= 0 && x->nlp < NGEN) {
    x->lp[x->nlp] = ev->logprob;
    for (int k = 0; k < ev->n_top && k < NTOP; k++)
      x->top[x->nlp][k] = ev->top[k];
    x->nlp++;
  }
  on_event(&x->r, ev);
}

static void serve(sl_engine_t *e, const int32_t *ids, int n, run *x) {
  memset(x, 0, sizeof *x);
  result_init(&x->r);
  sl_gen_params p = greedy(NGEN);
  p.top_logprobs = NTOP;
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event_lp, x, NULL));
  result_wait(&x->r);
}

static sl_engine_t *engine(void) {
  sl_engine_config cfg = sl_engine_config_defaults();
  cfg.n_ctx = 512;
  cfg.kv_block_tokens = BLOCK;
  cfg.kv_blocks = 96;
  cfg.n_threads = 2;
  sl_engine_t *e = NULL;
  CHECK_OK(sl_engine_create(g_model, g_tok, &cfg, &e));
  return e;
}

static void test_hit_remainders(void) {
  /* cold: every prompt is new there; hit: a primer puts the prompt's first
   * two blocks into the cache first */
  sl_engine_t *cold_e = engine(), *hit_e = engine();
  if (!cold_e || !hit_e) {
    sl_engine_free(cold_e);
    sl_engine_free(hit_e);
    return;
  }
  const char *tail = " the lighthouse keeper counted ships in the fog, one by "
                     "one, and wrote each name into a green ledger that his "
                     "grandmother had kept before him, page after page of "
                     "harbours, storms, cargo and weather for forty years";
  /* remainders 1..20, then 40 more prompts that leave one token (the case
   * where the remainder runs alone, and the attention order could follow);
   * under a sanitizer 5 more (the paths are the same; the count is the
   * normal build's evidence) */
  const int prompts = SL_TEST_SANITIZED ? 25 : 60;
  for (int k = 1; k <= prompts; k++) {
    const int rem = k <= 20 ? k : 1;
    char text[1024];
    snprintf(text, sizeof text, "Entry %d of the log, by keeper %c%c:%s", k,
             'A' + k % 26, 'a' + k / 26, tail);
    int32_t *all = NULL;
    size_t na = 0;
    CHECK_OK(sl_tokenizer_encode(g_tok, text, strlen(text), false, false, &all,
                                 &na));
    const int n = 2 * BLOCK + rem;
    CHECK_MSG((int)na > n, "text %d: %zu tokens", k, na);
    if ((int)na <= n) {
      sl_free(all);
      continue;
    }
    /* the primer: the first two blocks, then a token the prompt does not
     * have there, so only those two blocks match */
    int32_t primer[2 * BLOCK + 1];
    memcpy(primer, all, sizeof(int32_t) * 2 * BLOCK);
    primer[2 * BLOCK] = all[n]; /* past the prompt's end: not its token */
    if (primer[2 * BLOCK] == all[2 * BLOCK])
      primer[2 * BLOCK] = all[0];
    run cold, prime, hit;
    serve(cold_e, all, n, &cold);
    serve(hit_e, primer, 2 * BLOCK + 1, &prime);
    serve(hit_e, all, n, &hit);
    CHECK_EQ_INT(cold.r.cached, 0);
    CHECK_MSG(hit.r.cached == 2 * BLOCK,
              "remainder %d: %d of %d tokens cached, want %d", rem,
              hit.r.cached, n, 2 * BLOCK);
    bool same = cold.r.n == NGEN && hit.r.n == NGEN && cold.nlp == NGEN &&
                hit.nlp == NGEN &&
                memcmp(cold.r.toks, hit.r.toks, sizeof(int32_t) * NGEN) == 0 &&
                memcmp(cold.lp, hit.lp, sizeof(float) * NGEN) == 0 &&
                memcmp(cold.top, hit.top, sizeof cold.top) == 0;
    CHECK_MSG(same,
              "prompt of %d tokens, %d from the cache (remainder %d): first "
              "logprob %.9g cold, %.9g from the hit",
              n, hit.r.cached, n - hit.r.cached, cold.nlp ? cold.lp[0] : NAN,
              hit.nlp ? hit.lp[0] : NAN);
    sl_free(all);
  }
  sl_engine_free(cold_e);
  sl_engine_free(hit_e);
}

int main(void) {
  int rc = load_default_model(&g_model, &g_tok);
  if (rc)
    return rc;
  RUN(test_hit_remainders);
  sl_tokenizer_free(g_tok);
  sl_model_free(g_model);
  sl_rt_shutdown();
  return sl_test_finish();
}
