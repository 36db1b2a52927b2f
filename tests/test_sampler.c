/* The sampler: greedy, the seeded generator's determinism, the frequencies
 * of temperature sampling against the softmax, and the top-k / min-p / top-p
 * cuts checked against a reference that sorts the whole vocabulary. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "sluice/sampler.h"
#include "sluice/util.h"

static uint64_t g_rng = 0x1234567;
static uint32_t rnd(void) {
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(g_rng >> 33);
}

static sl_sampler_params plain(float temp) {
  sl_sampler_params p = sl_sampler_defaults();
  p.temperature = temp;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

/* logits with many exact ties (quantized to 1/4) */
static void fill_logits(float *l, int n, float spread) {
  for (int i = 0; i < n; i++)
    l[i] = (float)(int)(rnd() % (uint32_t)(spread * 4)) / 4.0f - spread / 2;
}

static void test_greedy(void) {
  float l[1000];
  fill_logits(l, 1000, 20);
  l[517] = 100;
  sl_sampler_params p = plain(0);
  sl_sampler_t *s = sl_sampler_create(&p, 1000);
  CHECK(s != NULL);
  CHECK_EQ_INT(sl_sampler_sample(s, l), 517);
  sl_sampler_free(s);
  CHECK(sl_sampler_create(&p, 0) == NULL);
}

static void test_same_seed_same_tokens(void) {
  enum { N = 3000, T = 200 };
  float *l = sl_malloc(N * sizeof *l), *w = sl_malloc(N * sizeof *w);
  fill_logits(l, N, 8);
  int32_t a[T], b[T];
  for (int run = 0; run < 2; run++) {
    sl_sampler_params p = sl_sampler_defaults();
    p.seed = 42;
    p.top_k = run ? 0 : 50; /* both cut paths */
    for (int pass = 0; pass < 2; pass++) {
      sl_sampler_t *s = sl_sampler_create(&p, N);
      for (int t = 0; t < T; t++) {
        memcpy(w, l, N * sizeof *w);
        (pass ? b : a)[t] = sl_sampler_sample(s, w);
      }
      sl_sampler_free(s);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    int distinct = 0;
    for (int t = 1; t < T; t++)
      distinct += a[t] != a[0];
    CHECK(distinct > 0); /* it does sample */
  }
  sl_free(l);
  sl_free(w);
}

/* Temperature 1, no cuts: frequencies match the softmax (every token, a
 * bound of 5 standard deviations plus a little). */
static void test_frequencies(void) {
  enum { N = 6, DRAWS = 60000 };
  const float l[N] = {1.0f, 2.0f, 0.5f, 2.0f, -1.0f, 0.0f};
  double pr[N], sum = 0;
  for (int i = 0; i < N; i++)
    sum += pr[i] = exp(l[i] - 2.0);
  sl_sampler_params p = plain(1.0f);
  p.seed = 7;
  sl_sampler_t *s = sl_sampler_create(&p, N);
  int cnt[N] = {0};
  float w[N];
  for (int d = 0; d < DRAWS; d++) {
    memcpy(w, l, sizeof w);
    int32_t t = sl_sampler_sample(s, w);
    CHECK(t >= 0 && t < N);
    cnt[t]++;
  }
  for (int i = 0; i < N; i++) {
    double want = pr[i] / sum * DRAWS, sd = sqrt(want);
    CHECK_MSG(fabs(cnt[i] - want) <= 5 * sd + 5, "token %d: %d vs %.0f", i,
              cnt[i], want);
  }
  sl_sampler_free(s);
}

/* The reference: every token by (logit desc, id asc), softmax over the top
 * k, min-p, then the top-p prefix. Returns the size of the allowed set, its
 * ids in allowed[]. */
static const float *g_sort_logits;
static int cmp_ref(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  float lx = g_sort_logits[x], ly = g_sort_logits[y];
  if (lx != ly)
    return lx > ly ? -1 : 1;
  return x - y;
}

static int reference_set(const float *l, int n, const sl_sampler_params *p,
                         int *allowed) {
  int *ord = sl_malloc((size_t)n * sizeof *ord);
  double *pr = sl_malloc((size_t)n * sizeof *pr);
  for (int i = 0; i < n; i++)
    ord[i] = i;
  g_sort_logits = l;
  qsort(ord, (size_t)n, sizeof *ord, cmp_ref);
  int m = p->top_k > 0 && p->top_k < n ? p->top_k : n;
  double sum = 0;
  for (int i = 0; i < m; i++)
    sum += pr[i] = exp((l[ord[i]] - l[ord[0]]) / p->temperature);
  for (int i = 0; i < m; i++)
    pr[i] /= sum;
  if (p->min_p > 0) {
    int keep = 1;
    while (keep < m && pr[keep] >= p->min_p * pr[0])
      keep++;
    m = keep;
  }
  if (p->top_p < 1) { /* the shortest prefix with mass >= top_p */
    int keep = 0;
    for (double cum = 0; keep < m && cum < p->top_p; keep++)
      cum += pr[keep];
    m = keep;
  }
  memcpy(allowed, ord, (size_t)m * sizeof *ord);
  sl_free(ord);
  sl_free(pr);
  return m;
}

/* Over many random vocabularies (with ties) and every combination of the
 * cuts: each pick is in the reference's allowed set, and over enough draws
 * a small allowed set is covered whole (nothing allowed is lost). */
static void test_cuts_match_reference(void) {
  enum { N = 4000 };
  float *l = sl_malloc(N * sizeof *l), *w = sl_malloc(N * sizeof *w);
  int *allowed = sl_malloc(N * sizeof *allowed);
  char *ok = sl_malloc(N), *seen = sl_malloc(N);
  static const int ks[] = {0, 1, 7, 40, 3999, 5000};
  static const float ps[] = {1.0f, 0.9f, 0.5f, 0.05f};
  static const float mps[] = {0.0f, 0.05f, 0.3f};
  int cases = 0; /* also varies the spread and temperature */
  for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
    for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++)
      for (size_t mi = 0; mi < sizeof mps / sizeof mps[0]; mi++) {
        fill_logits(l, N, (cases % 3) ? 6 : 30);
        sl_sampler_params p = plain(cases % 2 ? 0.7f : 1.5f);
        p.top_k = ks[ki];
        p.top_p = ps[pi];
        p.min_p = mps[mi];
        p.seed = (uint64_t)cases;
        int m = reference_set(l, N, &p, allowed);
        memset(ok, 0, N);
        memset(seen, 0, N);
        for (int i = 0; i < m; i++)
          ok[allowed[i]] = 1;
        sl_sampler_t *s = sl_sampler_create(&p, N);
        int bad = 0, draws = m <= 8 ? 400 : 60;
        for (int d = 0; d < draws; d++) {
          memcpy(w, l, N * sizeof *w);
          int32_t t = sl_sampler_sample(s, w);
          if (t < 0 || t >= N || !ok[t])
            bad++;
          else
            seen[t] = 1;
        }
        sl_sampler_free(s);
        CHECK_MSG(bad == 0, "k %d p %.2f min_p %.2f: %d picks outside %d",
                  p.top_k, p.top_p, p.min_p, bad, m);
        if (m == 1) /* the only allowed token is what comes out */
          CHECK(seen[allowed[0]] != 0);
        cases++;
      }
  sl_free(l);
  sl_free(w);
  sl_free(allowed);
  sl_free(ok);
  sl_free(seen);
}

/* Penalties: a repeated token's logit is lowered so that greedy moves off
 * it. */
/* logit_bias: added before anything else; -100 bans the best token, +100
 * all but forces a poor one; a bias makes the sampler no plain argmax (so
 * no device stands in for it); bad ids are refused. */
static void test_logit_bias(void) {
  float l[1000], c[1000];
  fill_logits(l, 1000, 20);
  l[517] = 100;
  sl_sampler_params p = plain(0);
  sl_sampler_t *s = sl_sampler_create(&p, 1000);
  CHECK(s != NULL && sl_sampler_is_argmax(s) && !sl_sampler_has_bias(s));
  sl_logit_bias ban[] = {{517, -100.0f}, {3, 0.0f}};
  CHECK_OK(sl_sampler_set_bias(s, ban, 2));
  CHECK(sl_sampler_has_bias(s) && !sl_sampler_is_argmax(s));
  memcpy(c, l, sizeof l);
  int32_t t = sl_sampler_sample(s, c);
  int32_t best = -1; /* the argmax without 517 */
  for (int i = 0; i < 1000; i++)
    if (i != 517 && (best < 0 || l[i] > l[best]))
      best = i;
  CHECK_EQ_INT(t, best);
  sl_logit_bias force[] = {{42, 100.0f}};
  CHECK_OK(sl_sampler_set_bias(s, force, 1));
  l[517] = 20;
  memcpy(c, l, sizeof l);
  CHECK_EQ_INT(sl_sampler_sample(s, c), 42);
  sl_logit_bias bad_id[] = {{1000, 1.0f}};
  CHECK(sl_sampler_set_bias(s, bad_id, 1) == SL_ERR_INVALID_ARG);
  sl_logit_bias bad_v[] = {{1, NAN}};
  CHECK(sl_sampler_set_bias(s, bad_v, 1) == SL_ERR_INVALID_ARG);
  CHECK_OK(sl_sampler_set_bias(s, NULL, 0));
  CHECK(sl_sampler_is_argmax(s));
  sl_sampler_free(s);
}

static void test_penalties(void) {
  float l[4] = {1.0f, 3.0f, 2.9f, 0.0f};
  sl_sampler_params p = plain(0);
  p.repeat_penalty = 1.5f;
  sl_sampler_t *s = sl_sampler_create(&p, 4);
  CHECK_EQ_INT(sl_sampler_sample(s, l), 1);
  sl_sampler_accept(s, 1);
  float l2[4] = {1.0f, 3.0f, 2.9f, 0.0f};
  CHECK_EQ_INT(sl_sampler_sample(s, l2), 2);
  CHECK(fabsf(l2[1] - 2.0f) < 1e-6f);
  sl_sampler_free(s);
}

int main(void) {
  RUN(test_greedy);
  RUN(test_same_seed_same_tokens);
  RUN(test_frequencies);
  RUN(test_cuts_match_reference);
  RUN(test_penalties);
  RUN(test_logit_bias);
  return sl_test_finish();
}
