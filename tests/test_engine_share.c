/* In-flight prefix sharing (issue 11 item 5): eight requests that start
 * at once with the same ~300-token prefix must not prefill it eight
 * times. The first admitted computes it; the others wait for its blocks
 * (published as each prefill chunk ends) and take them from the pool.
 * Counted in prefill tokens: each of the seven others has every full block
 * of the shared prefix as cached tokens, so the prefix is computed once.
 * Each request's greedy tokens equal the same request's on a cold engine
 * (results do not depend on how a prompt splits between cache and
 * compute). Threaded: the TSan configuration runs it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_util.h"
#include "harness.h"
#include "sluice/util.h"

enum { N = 8, GEN = 8 };
/* the shared prefix's words: ~290 tokens, or ~115 under TSan (still three
 * prefill chunks, so the others wait on published blocks) */
enum { PREFIX_WORDS = SL_TEST_SANITIZED ? 40 : 100 };

static sl_engine_t *make(sl_model_t *m, sl_tokenizer_t *tok) {
  sl_engine_config c = sl_engine_config_defaults();
  c.n_ctx = 1024;
  c.max_seqs = N;
  c.n_threads = 2;
  c.prefill_chunk = 48;
  /* no queue timeout: a waiting request stops waiting after half of it,
   * and a TSan build prefills slowly enough to reach that */
  c.queue_timeout_ms = 0;
  sl_engine_t *e;
  CHECK(sl_engine_create(m, tok, &c, &e) == SL_OK);
  return e;
}

int main(void) {
  sl_model_t *m;
  sl_tokenizer_t *tok;
  if (load_default_model(&m, &tok) != 0)
    return 77;
  char text[8192];
  size_t o = 0;
  for (int w = 0; w < PREFIX_WORDS; w++)
    o += (size_t)snprintf(text + o, sizeof text - o, "shared%d ", w * 13 % 89);
  int32_t *pre;
  int np = engine_tokenize(tok, text, &pre);
  CHECK(np > (SL_TEST_SANITIZED ? 100 : 160));
  int32_t *prompts[N];
  int n[N];
  for (int i = 0; i < N; i++) {
    char suf[64];
    snprintf(suf, sizeof suf, " question %d about item %d", i, i * 7);
    int32_t *s;
    int ns = engine_tokenize(tok, suf, &s);
    CHECK(ns > 0);
    n[i] = np + ns;
    prompts[i] = malloc(sizeof(int32_t) * (size_t)n[i]);
    memcpy(prompts[i], pre, sizeof(int32_t) * (size_t)np);
    memcpy(prompts[i] + np, s, sizeof(int32_t) * (size_t)ns);
    sl_free(s);
  }
  /* all at once */
  sl_engine_t *e = make(m, tok);
  result res[N];
  sl_gen_params g = greedy(GEN);
  for (int i = 0; i < N; i++) {
    result_init(&res[i]);
    CHECK(sl_engine_submit(e, prompts[i], n[i], &g, on_event, &res[i], NULL) ==
          SL_OK);
  }
  for (int i = 0; i < N; i++)
    result_wait(&res[i]);
  sl_engine_stats st = sl_engine_get_stats(e);
  sl_engine_free(e);
  int shared = np / 16 * 16, with_prefix = 0;
  uint64_t computed = 0;
  for (int i = 0; i < N; i++) {
    computed += (uint64_t)(n[i] - res[i].cached);
    with_prefix += res[i].cached >= shared;
  }
  printf("prefix %d tokens (%d in full blocks); prompt tokens computed: "
         "%llu of %llu; %d of %d requests took the whole prefix from the "
         "pool; %llu admissions put off\n",
         np, shared, (unsigned long long)computed,
         (unsigned long long)st.prompt_tokens_total, with_prefix, N,
         (unsigned long long)st.prefix_waits);
  CHECK(with_prefix == N - 1);
  CHECK(st.prefix_waits > 0);
  /* the prefix once, plus each request's own tail */
  CHECK(computed <= (uint64_t)np + (uint64_t)N * (uint64_t)(n[0] - np + 32));
  /* the same tokens as a request alone on a cold engine: the first, the
   * second and the last (each cold run prefills the whole prompt, slow
   * under TSan) */
  for (int i = 0; i < N; i++) {
    if (i > 1 && i < N - 1) {
      free(prompts[i]);
      continue;
    }
    sl_engine_t *c = make(m, tok);
    result r;
    result_init(&r);
    CHECK(sl_engine_submit(c, prompts[i], n[i], &g, on_event, &r, NULL) ==
          SL_OK);
    result_wait(&r);
    sl_engine_free(c);
    CHECK(r.n == GEN && res[i].n == GEN);
    CHECK(!memcmp(r.toks, res[i].toks, sizeof(int32_t) * GEN));
    free(prompts[i]);
  }
  sl_free(pre);
  sl_tokenizer_free(tok);
  sl_model_free(m);
  return sl_test_finish();
}
