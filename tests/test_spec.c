/* Speculative decoding (src/engine/spec.c, issue 47): prompt lookup's
 * drafts (the longest recurring suffix, its latest occurrence, n_min, the
 * caps); the drafter interface (a predicted output's drafts, its cursor,
 * the counts); the rejection rule's output distribution (a chi-square test
 * against the target's); and greedy generation over a single-sequence
 * context with drafts on the default model: the same tokens and the same
 * logits, bit for bit, as one token a pass (written here, independently),
 * with drafts both accepted and rejected on the way (DESIGN.md I9 is what
 * makes it so). */
#include <math.h>
#include <string.h>

#include "default_model.h"
#include "harness.h"
#include "sluice/memsync.h"
#include "sluice/rt.h"
#include "sluice/spec.h"
#include "sluice/util.h"

/* ---- prompt lookup ---- */

static sl_draft_params dparams(int n_max, int n_min, int gmax, int gmin) {
  return (sl_draft_params){n_max, n_min, gmax, gmin};
}

static void test_lookup(void) {
  int32_t out[16];
  /* the longest suffix that recurs: [1 2 3] (not [9 1 2 3]) */
  const int32_t a[] = {1, 2, 3, 4, 9, 9, 1, 2, 3};
  sl_draft_params p = dparams(3, 1, 4, 2);
  CHECK_EQ_INT(sl_draft_lookup(&p, a, 9, out), 3);
  CHECK(out[0] == 4 && out[1] == 9 && out[2] == 9);
  /* of two occurrences, the latest */
  const int32_t b[] = {5, 6, 7, 5, 6, 8, 5, 6};
  p = dparams(2, 1, 4, 2);
  CHECK_EQ_INT(sl_draft_lookup(&p, b, 8, out), 2);
  CHECK(out[0] == 8 && out[1] == 5);
  /* never past the end of what is known */
  p = dparams(8, 1, 4, 2);
  CHECK_EQ_INT(sl_draft_lookup(&p, b, 8, out), 3); /* 8 5 6, then the end */
  CHECK(out[0] == 8 && out[1] == 5 && out[2] == 6);
  /* n_min: the latest occurrence leaves too few, an earlier one serves */
  const int32_t c[] = {5, 6, 1, 2, 5, 6, 5, 6};
  p = dparams(4, 3, 2, 2);
  CHECK_EQ_INT(sl_draft_lookup(&p, c, 8, out), 4);
  CHECK(out[0] == 1 && out[1] == 2 && out[2] == 5 && out[3] == 6);
  p = dparams(4, 5, 2, 2); /* and none leaves 5 */
  CHECK_EQ_INT(sl_draft_lookup(&p, c, 8, out), 0);
  /* nothing recurs; a single token recurs only with ngram_min 1 */
  const int32_t d[] = {1, 2, 3, 4, 5, 3};
  p = dparams(4, 1, 3, 2);
  CHECK_EQ_INT(sl_draft_lookup(&p, d, 6, out), 0);
  p = dparams(4, 1, 3, 1);
  CHECK_EQ_INT(sl_draft_lookup(&p, d, 6, out), 3);
  CHECK(out[0] == 4 && out[1] == 5 && out[2] == 3);
  CHECK_EQ_INT(sl_draft_lookup(&p, d, 1, out), 0);
  /* the parameters' ranges */
  sl_draft_params def = sl_draft_defaults();
  char err[128];
  CHECK(sl_draft_params_ok(&def, err, sizeof err));
  sl_draft_params bad[] = {dparams(0, 1, 4, 2), dparams(65, 1, 4, 2),
                           dparams(4, 0, 4, 2), dparams(4, 5, 4, 2),
                           dparams(4, 1, 1, 2), dparams(4, 1, 4, 0),
                           dparams(4, 1, 65, 2)};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = 0;
    CHECK_MSG(!sl_draft_params_ok(&bad[i], err, sizeof err) && err[0],
              "case %zu accepted", i);
  }
}

/* ---- the drafter interface: prompt lookup with a predicted output ---- */

static void test_drafter_ngram(void) {
  sl_draft_params p = dparams(4, 1, 3, 2);
  sl_drafter *d = sl_drafter_ngram_create(&p);
  CHECK(d && d->stream == NULL && !strcmp(d->ops->name, "ngram"));
  sl_draft_params bad = dparams(0, 1, 3, 2);
  CHECK(sl_drafter_ngram_create(&bad) == NULL);
  if (!d)
    return;
  int32_t out[64];
  /* no reference: sl_draft_lookup's drafts */
  sl_draft_seq *s = sl_drafter_seq_begin(d, NULL, 0, 64);
  CHECK(s != NULL);
  int32_t h[] = {5, 6, 7, 8, 5, 6};
  CHECK_EQ_INT(sl_drafter_propose(s, h, 6, 4, out), 4);
  CHECK(out[0] == 7 && out[1] == 8 && out[2] == 5 && out[3] == 6);
  CHECK_EQ_INT(sl_drafter_propose(s, h, 6, 2, out), 2); /* k caps */
  sl_drafter_accepted(s, 2, 1);
  sl_drafter_accepted(s, 3, 7); /* kept is capped at drafted */
  CHECK(s->drafted == 5 && s->kept == 4);
  sl_drafter_seq_end(s);
  /* a reference: its first occurrence at or after the cursor, which moves
   * past what was kept */
  int32_t ref[] = {10, 11, 12, 13, 10, 11, 14, 15};
  s = sl_drafter_seq_begin(d, ref, 8, 64);
  CHECK(s != NULL);
  if (!s) {
    sl_drafter_free(d);
    return;
  }
  int32_t h2[] = {1, 2, 10, 11};
  CHECK_EQ_INT(sl_drafter_propose(s, h2, 4, 4, out), 4);
  CHECK(out[0] == 12 && out[1] == 13 && out[2] == 10 && out[3] == 11);
  sl_drafter_accepted(s, 4, 2);     /* 12 13 kept: the cursor at 4 */
  int32_t h3[] = {1, 2, 7, 10, 11}; /* [10 11] at 0 and 4: 4 is ahead */
  CHECK_EQ_INT(sl_drafter_propose(s, h3, 5, 4, out), 2);
  CHECK(out[0] == 14 && out[1] == 15);
  /* nothing in the reference follows: the sequence's own tokens */
  int32_t h4[] = {3, 4, 9, 3, 4};
  CHECK_EQ_INT(sl_drafter_propose(s, h4, 5, 4, out), 3);
  CHECK(out[0] == 9 && out[1] == 3 && out[2] == 4);
  sl_drafter_seq_end(s);
  sl_drafter_seq_end(NULL);
  CHECK(sl_drafter_seq_begin(d, NULL, 3, 64) == NULL); /* no tokens for 3 */
  CHECK(sl_drafter_seq_begin(d, NULL, 0, 0) == NULL);  /* no room */
  sl_drafter_free(d);
  sl_drafter_free(NULL);
}

/* ---- the rejection rule: the tokens follow the target's distribution ---- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double unif(void) { /* splitmix64, 53 bits */
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}

static void normalise(float *v, int n) {
  double t = 0;
  for (int i = 0; i < n; i++)
    t += v[i];
  for (int i = 0; i < n; i++)
    v[i] = (float)(v[i] / t);
}

/* Draws x from q and applies the rule N times: the tokens' counts against
 * N p by Pearson's chi-square (the tokens p gives 0 must never come), and
 * the share kept against sum_x min(p(x), q(x)). */
static void chi_square_case(const char *name, const float *p, const float *q,
                            int n) {
  enum { N = 200000 };
  long cnt[16] = {0}, kept = 0;
  for (int t = 0; t < N; t++) {
    double u0 = unif(), acc = 0;
    int x = n - 1;
    for (int i = 0; i < n; i++)
      if (u0 < (acc += q[i])) {
        x = i;
        break;
      }
    bool k = false;
    int32_t tok = sl_spec_accept(p, q, n, x, unif(), unif(), &k);
    CHECK(tok >= 0 && tok < n);
    if (tok < 0 || tok >= n)
      return;
    cnt[tok]++;
    kept += k;
    CHECK(!k || tok == x);
  }
  double chi = 0, keep = 0;
  int dof = -1;
  for (int i = 0; i < n; i++) {
    keep += p[i] < q[i] ? p[i] : q[i];
    if (p[i] <= 0) {
      CHECK_MSG(cnt[i] == 0, "%s: token %d (p 0) drawn %ld times", name, i,
                cnt[i]);
      continue;
    }
    double e = (double)N * p[i];
    chi += (cnt[i] - e) * (cnt[i] - e) / e;
    dof++;
  }
  /* 29.9: chi-square with 7 degrees of freedom at 1e-4 (fewer: lower) */
  double sd = sqrt(fmax(keep * (1 - keep), 0) / N) + 1e-5; /* + rounding */
  fprintf(stderr, "  %s: chi-square %.2f (%d dof), kept %.4f (theory %.4f)\n",
          name, chi, dof, (double)kept / N, keep);
  CHECK_MSG(chi < 29.9, "%s: chi-square %.1f: not the target's distribution",
            name, chi);
  CHECK_MSG(fabs((double)kept / N - keep) < 5 * sd, "%s: kept %.4f, not %.4f",
            name, (double)kept / N, keep);
}

static void test_rejection_rule(void) {
  enum { V = 8 };
  float p[V], q[V];
  for (int i = 0; i < V; i++) {
    p[i] = (float)(0.05 + unif());
    q[i] = (float)(0.05 + unif() * unif());
  }
  q[2] *= 6; /* a draft the target likes less than the drafter */
  normalise(p, V);
  normalise(q, V);
  chi_square_case("random p and q", p, q, V);
  float one[V] = {0};
  one[3] = 1; /* a drafter sure of its token (prompt lookup) */
  chi_square_case("q one token", p, one, V);
  chi_square_case("q = p", p, p, V);
  float sparse[V];
  memcpy(sparse, p, sizeof p);
  sparse[1] = sparse[5] = 0; /* tokens the target never takes */
  normalise(sparse, V);
  chi_square_case("p with zeros", sparse, q, V);
  bool k = true;
  CHECK(sl_spec_accept(p, q, V, V, 0.5, 0.5, &k) == -1 && !k);
  CHECK(sl_spec_accept(NULL, q, V, 0, 0.5, 0.5, NULL) == -1);
}

/* ---- when it pays: the adaptive rule's parts ---- */

static void test_allocate(void) {
  int prop[16], take[16];
  double alpha[16];
  for (int i = 0; i < 16; i++) {
    prop[i] = 8;
    alpha[i] = 0.8;
  }
  /* batch 1, drafts nearly free: most of a likely proposal */
  int one = sl_spec_allocate(prop, alpha, 1, 1, 0.1, take);
  CHECK(one == take[0] && one >= 5 && one <= 8);
  /* batch 16: each sequence gets fewer, the step no longer has room */
  int all = sl_spec_allocate(prop, alpha, 16, 16, 0.1, take);
  CHECK_MSG(all > 0 && all <= 3 * 16 && all < 16 * one, "%d of 16x8", all);
  for (int i = 0; i < 16; i++)
    CHECK(take[i] <= one);
  /* unlikely drafts: one at batch 1, none at batch 16 */
  for (int i = 0; i < 16; i++)
    alpha[i] = 0.05;
  CHECK(sl_spec_allocate(prop, alpha, 1, 1, 0.1, take) <= 1);
  CHECK_EQ_INT(sl_spec_allocate(prop, alpha, 16, 16, 0.1, take), 0);
  /* the likelier sequence first; the proposal caps; free drafts: all */
  alpha[0] = 0.9;
  alpha[1] = 0.3;
  prop[0] = 3;
  sl_spec_allocate(prop, alpha, 2, 2, 0.1, take);
  CHECK(take[0] == 3 && take[1] < 3);
  CHECK_EQ_INT(sl_spec_allocate(prop, alpha, 16, 16, 0.0, take), 3 + 15 * 8);
}

static void test_cost_model(void) {
  sl_spec_cost c = {0};
  CHECK(sl_spec_cost_ratio(&c, 0.25) == 0.25); /* nothing seen */
  for (int i = 0; i < 40; i++)                 /* one size only: no slope */
    sl_spec_cost_observe(&c, 1, 9e6);
  CHECK(sl_spec_cost_ratio(&c, 0.25) == 0.25);
  /* a + b n with a = 5 ms, b = 0.5 ms: b / (a + b) = 1/11 */
  for (int i = 0; i < 400; i++) {
    int n = 1 + i % 9;
    sl_spec_cost_observe(&c, n, 5e6 + 5e5 * n);
  }
  double r = sl_spec_cost_ratio(&c, 0.25);
  CHECK_MSG(fabs(r - 1.0 / 11) < 1e-3, "fitted %.5f, not %.5f", r, 1.0 / 11);
  /* a slope that is not positive: the default */
  for (int i = 0; i < 400; i++)
    sl_spec_cost_observe(&c, 1 + i % 9, 9e6 - 5e5 * (1 + i % 9));
  CHECK(sl_spec_cost_ratio(&c, 0.25) == 0.25);
}

static void test_acceptance_estimate(void) {
  sl_spec_accept_est a = {0};
  CHECK(sl_spec_alpha(&a) == 0.5); /* the prior */
  for (int i = 0; i < 5; i++)
    sl_spec_accept_observe(&a, 8, 8);
  double hi = sl_spec_alpha(&a);
  CHECK(hi > 0.9);
  for (int i = 0; i < 5; i++)
    sl_spec_accept_observe(&a, 8, 0);
  double lo = sl_spec_alpha(&a);
  CHECK_MSG(lo < 0.5, "after five rejected proposals: %.3f", lo);
  sl_spec_accept_observe(&a, 0, 0); /* nothing drafted: nothing learnt */
  CHECK(sl_spec_alpha(&a) == lo);
  for (int i = 0; i < 60; i++) /* held back: back up toward the prior */
    sl_spec_accept_age(&a);
  CHECK(sl_spec_alpha(&a) > lo && fabs(sl_spec_alpha(&a) - 0.5) < 0.1);
  sl_spec_accept_est b = {0};
  for (int i = 0; i < 5; i++)
    sl_spec_accept_observe(&b, 4, 4);
  double before = sl_spec_alpha(&b);
  sl_spec_accept_age(&b); /* a high one is not pulled down */
  CHECK(sl_spec_alpha(&b) == before);
}

/* ---- greedy generation with drafts, against one token a pass ---- */

enum { N_NEW = 48, N_CTX = 1024 };

static sl_model_t *g_model;
static sl_tokenizer_t *g_tok;

typedef struct record {
  int n;
  int32_t toks[N_NEW];
  float *rows; /* (N_NEW, n_vocab) */
  int64_t nv;
} record;

static bool on_token(void *ud, int32_t tok, const float *logits) {
  record *r = ud;
  CHECK(r->n < N_NEW);
  if (r->n >= N_NEW)
    return false;
  r->toks[r->n] = tok;
  memcpy(r->rows + (size_t)r->n * (size_t)r->nv, logits,
         sizeof(float) * (size_t)r->nv);
  r->n++;
  return true;
}

/* A fresh context with the prompt evaluated; its last logits in last. */
static sl_ctx_t *prefilled(sl_stream_t *s, const int32_t *ids, int n,
                           float *last) {
  sl_ctx_t *c = NULL;
  CHECK_OK(sl_ctx_create(g_model, s, N_CTX, 2, &c));
  if (c)
    CHECK_OK(sl_ctx_eval(c, ids, n, last, false));
  return c;
}

static int32_t first_max(const float *lg, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; i++)
    if (lg[i] > lg[b])
      b = i;
  return (int32_t)b;
}

static const char *PROMPTS[] = {
    /* an edit: the answer repeats most of the prompt */
    "Rename the variable total to sum in this code and print the code:\n"
    "def mean(values):\n    total = 0\n    for v in values:\n"
    "        total += v\n    return total / len(values)\n\n"
    "def mean(values):\n    sum = 0\n",
    "Copy the list exactly: apple, banana, cherry, date, elderberry, fig, "
    "grape. The list: apple, banana,",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps "
    "over the lazy dog. The quick brown",
};

static void test_greedy_with_drafts_is_greedy(void) {
  sl_stream_t *s = sl_thread_stream(sl_cpu_device());
  const int64_t nv = sl_model_hparams_of(g_model)->n_vocab;
  float *last = sl_malloc(sizeof(float) * (size_t)nv);
  record ref = {0}, spec = {0}, plain = {0};
  ref.rows = sl_malloc(sizeof(float) * (size_t)nv * N_NEW);
  spec.rows = sl_malloc(sizeof(float) * (size_t)nv * N_NEW);
  plain.rows = sl_malloc(sizeof(float) * (size_t)nv * N_NEW);
  ref.nv = spec.nv = plain.nv = nv;
  int64_t drafted = 0, accepted = 0, passes = 0;
  for (size_t pi = 0; pi < sizeof PROMPTS / sizeof PROMPTS[0]; pi++) {
    int32_t *ids;
    size_t n = 0;
    CHECK_OK(sl_tokenizer_encode(g_tok, PROMPTS[pi], strlen(PROMPTS[pi]), false,
                                 true, &ids, &n));
    int32_t *hist = sl_malloc(sizeof(int32_t) * (n + N_NEW));
    /* the reference: one token a pass */
    ref.n = 0;
    sl_ctx_t *c = prefilled(s, ids, (int)n, last);
    for (int k = 0; c && k < N_NEW; k++) {
      int32_t t = first_max(last, nv);
      on_token(&ref, t, last); /* a copy: the next pass overwrites last */
      CHECK_OK(sl_ctx_eval(c, &t, 1, last, false));
    }
    sl_ctx_free(c);
    /* with the default drafts, with short eager ones (most passes end on
     * a rejected last draft), and without (dp NULL) */
    for (int mode = 0; mode < 3; mode++) {
      record *r = mode == 2 ? &plain : &spec;
      r->n = 0;
      memcpy(hist, ids, sizeof(int32_t) * n);
      c = prefilled(s, ids, (int)n, last);
      sl_draft_params dp =
          mode == 0 ? sl_draft_defaults() : dparams(2, 1, 3, 1);
      sl_spec_stats st;
      sl_drafter *d = mode == 2 ? NULL : sl_drafter_ngram_create(&dp);
      CHECK(mode == 2 || d);
      if (c)
        CHECK_OK(sl_spec_generate_greedy(c, N_CTX, hist, (int)n, last, nv,
                                         N_NEW, d, dp.n_max, on_token, r, &st));
      sl_drafter_free(d);
      sl_ctx_free(c);
      CHECK_EQ_INT(r->n, N_NEW);
      CHECK(memcmp(hist + n, r->toks, sizeof(int32_t) * N_NEW) == 0);
      if (mode < 2) {
        drafted += st.drafted;
        accepted += st.accepted;
        passes += st.passes;
      } else {
        CHECK_EQ_INT(st.drafted, 0);
        CHECK_EQ_INT(st.passes, N_NEW - 1);
      }
      int bad = -1;
      for (int k = 0; k < N_NEW && bad < 0; k++)
        if (r->toks[k] != ref.toks[k] ||
            memcmp(r->rows + (size_t)k * (size_t)nv,
                   ref.rows + (size_t)k * (size_t)nv,
                   sizeof(float) * (size_t)nv) != 0)
          bad = k;
      CHECK_MSG(bad < 0,
                "prompt %zu, %s: token %d (id %d, reference %d) "
                "or its logits differ",
                pi, mode == 2 ? "no drafts" : "drafts", bad,
                bad >= 0 ? r->toks[bad] : -1, bad >= 0 ? ref.toks[bad] : -1);
    }
    sl_free(hist);
    sl_free(ids);
  }
  fprintf(stderr,
          "  %lld passes for %d tokens (%zu prompts, two draft settings); %lld "
          "drafted, %lld accepted\n",
          (long long)passes,
          2 * N_NEW * (int)(sizeof PROMPTS / sizeof PROMPTS[0]),
          sizeof PROMPTS / sizeof PROMPTS[0], (long long)drafted,
          (long long)accepted);
  /* both ways through the verification: drafts kept and drafts cut */
  CHECK(accepted > 0);
  CHECK(drafted > accepted);
  sl_free(ref.rows);
  sl_free(spec.rows);
  sl_free(plain.rows);
  sl_free(last);
  sl_sync_and_clear_cache(s);
}

int main(void) {
  RUN(test_lookup);
  RUN(test_drafter_ngram);
  RUN(test_rejection_rule);
  RUN(test_allocate);
  RUN(test_cost_model);
  RUN(test_acceptance_estimate);
  int rc = load_default_model(&g_model, &g_tok);
  if (rc == 0) {
    RUN(test_greedy_with_drafts_is_greedy);
    sl_tokenizer_free(g_tok);
    sl_model_free(g_model);
  } else if (rc != 77) {
    return rc;
  }
  sl_clear_thread_streams();
  sl_rt_shutdown();
  return sl_test_finish();
}
