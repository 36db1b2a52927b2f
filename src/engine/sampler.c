#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sluice/sampler.h"
#include "sluice/util.h"

struct sl_sampler {
  sl_sampler_params p;
  int n_vocab;
  uint64_t rng[2];
  int32_t *hist; /* ring of the last penalty_last_n tokens */
  int hist_n, hist_head;
  int *counts;   /* per token, over the ring */
  struct cand {
    int32_t id;
    float logit;
  } * cands;
};

sl_sampler_params sl_sampler_defaults(void) {
  sl_sampler_params p = {0.8f, 40, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f, 64, 0};
  return p;
}

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* xoroshiro128+ ; returns a double in [0, 1) */
static double rng_next(sl_sampler_t *s) {
  uint64_t s0 = s->rng[0], s1 = s->rng[1], r = s0 + s1;
  s1 ^= s0;
  s->rng[0] = ((s0 << 24) | (s0 >> 40)) ^ s1 ^ (s1 << 16);
  s->rng[1] = (s1 << 37) | (s1 >> 27);
  return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

sl_sampler_t *sl_sampler_create(const sl_sampler_params *p, int n_vocab) {
  if (!p || n_vocab <= 0)
    return NULL;
  sl_sampler_t *s = sl_calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->p = *p;
  if (s->p.penalty_last_n < 0)
    s->p.penalty_last_n = 0;
  s->n_vocab = n_vocab;
  uint64_t x = p->seed;
  s->rng[0] = splitmix(&x);
  s->rng[1] = splitmix(&x);
  s->hist = sl_calloc((size_t)s->p.penalty_last_n + 1, sizeof *s->hist);
  s->counts = sl_calloc((size_t)n_vocab, sizeof *s->counts);
  s->cands = sl_calloc((size_t)n_vocab, sizeof *s->cands);
  if (!s->hist || !s->counts || !s->cands) {
    sl_sampler_free(s);
    return NULL;
  }
  return s;
}

void sl_sampler_free(sl_sampler_t *s) {
  if (!s)
    return;
  sl_free(s->hist);
  sl_free(s->counts);
  sl_free(s->cands);
  sl_free(s);
}

void sl_sampler_accept(sl_sampler_t *s, int32_t tok) {
  int cap = s->p.penalty_last_n;
  if (cap == 0 || tok < 0 || tok >= s->n_vocab)
    return;
  if (s->hist_n == cap) {
    s->counts[s->hist[s->hist_head]]--;
    s->hist_n--;
  }
  s->hist[s->hist_head] = tok;
  s->hist_head = (s->hist_head + 1) % cap;
  s->hist_n++;
  s->counts[tok]++;
}

static void apply_penalties(sl_sampler_t *s, float *logits) {
  const sl_sampler_params *p = &s->p;
  if (s->hist_n == 0 || (p->repeat_penalty == 1.0f &&
                         p->presence_penalty == 0.0f &&
                         p->frequency_penalty == 0.0f))
    return;
  int cap = p->penalty_last_n;
  /* each distinct token in the window once */
  for (int i = 0; i < s->hist_n; i++) {
    int32_t t = s->hist[(s->hist_head - 1 - i + cap) % cap];
    int c = s->counts[t];
    if (c <= 0)
      continue;
    bool first = true;
    for (int j = 0; j < i; j++)
      if (s->hist[(s->hist_head - 1 - j + cap) % cap] == t)
        first = false;
    if (!first)
      continue;
    float l = logits[t];
    if (p->repeat_penalty != 1.0f)
      l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
    l -= (float)c * p->frequency_penalty + p->presence_penalty;
    logits[t] = l;
  }
}

static int cmp_cand(const void *a, const void *b) {
  float x = ((const struct cand *)a)->logit, y = ((const struct cand *)b)->logit;
  if (x != y)
    return x < y ? 1 : -1;
  return ((const struct cand *)a)->id - ((const struct cand *)b)->id;
}

int32_t sl_sampler_sample(sl_sampler_t *s, float *logits) {
  const sl_sampler_params *p = &s->p;
  int n = s->n_vocab;
  apply_penalties(s, logits);
  if (p->temperature <= 0.0f) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
      if (logits[i] > logits[best])
        best = i;
    return best;
  }
  /* candidates: top-k by partial selection (full sort when k is off) */
  int k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
  for (int i = 0; i < n; i++) {
    s->cands[i].id = i;
    s->cands[i].logit = logits[i];
  }
  if (k < n) {
    /* keep the k largest: simple heap-free select via partial qsort */
    qsort(s->cands, (size_t)n, sizeof *s->cands, cmp_cand);
  } else {
    qsort(s->cands, (size_t)n, sizeof *s->cands, cmp_cand);
  }
  int m = k;
  /* softmax with temperature over the m candidates */
  float mx = s->cands[0].logit;
  double sum = 0;
  float *pr = sl_malloc((size_t)m * sizeof *pr);
  if (!pr)
    return s->cands[0].id;
  for (int i = 0; i < m; i++) {
    pr[i] = expf((s->cands[i].logit - mx) / p->temperature);
    sum += pr[i];
  }
  for (int i = 0; i < m; i++)
    pr[i] = (float)(pr[i] / sum);
  /* min-p: drop tokens under min_p * the top probability */
  if (p->min_p > 0.0f) {
    float floor_p = p->min_p * pr[0];
    int keep = 1;
    while (keep < m && pr[keep] >= floor_p)
      keep++;
    m = keep;
  }
  /* top-p: the smallest prefix whose mass reaches top_p */
  if (p->top_p < 1.0f) {
    double cum = 0;
    int keep = 0;
    while (keep < m) {
      cum += pr[keep++];
      if (cum >= p->top_p)
        break;
    }
    m = keep;
  }
  double total = 0;
  for (int i = 0; i < m; i++)
    total += pr[i];
  double r = rng_next(s) * total, acc = 0;
  int32_t pick = s->cands[m - 1].id;
  for (int i = 0; i < m; i++) {
    acc += pr[i];
    if (r < acc) {
      pick = s->cands[i].id;
      break;
    }
  }
  sl_free(pr);
  return pick;
}
