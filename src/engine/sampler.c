#include <math.h>
#include <stdbool.h>
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
  int *counts; /* per token, over the ring */
  struct cand {
    int32_t id;
    float logit;
  } * cands;
  float *probs;        /* per candidate */
  sl_logit_bias *bias; /* added to the logits before anything else */
  int n_bias;
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
  s->probs = sl_calloc((size_t)n_vocab, sizeof *s->probs);
  if (!s->hist || !s->counts || !s->cands || !s->probs) {
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
  sl_free(s->probs);
  sl_free(s->bias);
  sl_free(s);
}

sl_status sl_sampler_set_bias(sl_sampler_t *s, const sl_logit_bias *b, int n) {
  if (n < 0 || (n && !b))
    return SL_ERR_INVALID_ARG;
  for (int i = 0; i < n; i++)
    if (b[i].id < 0 || b[i].id >= s->n_vocab || !isfinite(b[i].bias))
      return SL_ERR_INVALID_ARG;
  sl_logit_bias *c = NULL;
  if (n && !(c = sl_malloc(sizeof *c * (size_t)n)))
    return SL_ERR_NOMEM;
  if (n)
    memcpy(c, b, sizeof *c * (size_t)n);
  sl_free(s->bias);
  s->bias = c;
  s->n_bias = n;
  return SL_OK;
}

bool sl_sampler_has_bias(const sl_sampler_t *s) {
  return s->n_bias > 0;
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
  if (s->hist_n == 0 ||
      (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
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

/* The candidates' order: higher logit first, then lower id (a total order,
 * so every selection below is deterministic whatever its pivots). */
static bool better(const struct cand *a, const struct cand *b) {
  return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *a, const void *b) {
  return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

static void swap_cand(struct cand *a, struct cand *b) {
  struct cand t = *a;
  *a = *b;
  *b = t;
}

/* Moves the k best of c[0..n) to c[0..k) (in no order): quickselect,
 * median-of-three pivots, expected O(n). */
static void select_best(struct cand *c, int n, int k) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (better(&c[mid], &c[lo]))
      swap_cand(&c[mid], &c[lo]);
    if (better(&c[hi], &c[lo]))
      swap_cand(&c[hi], &c[lo]);
    if (better(&c[hi], &c[mid]))
      swap_cand(&c[hi], &c[mid]);
    struct cand pv = c[mid]; /* the median: c[lo] >= pv >= c[hi] */
    int i = lo, j = hi;
    while (i <= j) {
      while (better(&c[i], &pv))
        i++;
      while (better(&pv, &c[j]))
        j--;
      if (i <= j)
        swap_cand(&c[i++], &c[j--]);
    }
    /* now c[lo..j] >= pv >= c[i..hi], and c[j+1..i-1] == pv */
    if (k - 1 <= j)
      hi = j;
    else if (k - 1 >= i)
      lo = i;
    else
      return;
  }
}

/* Sorts the k best of c[0..n) into c[0..k), best first. */
static void sort_best(struct cand *c, int n, int k) {
  if (k < n)
    select_best(c, n, k);
  qsort(c, (size_t)k, sizeof *c, cmp_cand);
}

bool sl_sampler_is_argmax(const sl_sampler_t *s) {
  const sl_sampler_params *p = &s->p;
  return p->temperature <= 0.0f && p->repeat_penalty == 1.0f &&
         p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f &&
         !s->n_bias;
}

const sl_sampler_params *sl_sampler_params_of(const sl_sampler_t *s) {
  return &s->p;
}

double sl_sampler_draw(sl_sampler_t *s) {
  return s->p.temperature > 0.0f ? rng_next(s) : 0.0;
}

bool sl_sampler_penalties(const sl_sampler_t *s, int max_pen, int32_t *ids,
                          int32_t *counts, int *n_out) {
  const sl_sampler_params *p = &s->p;
  int cap = p->penalty_last_n, n = 0;
  *n_out = 0;
  if (s->hist_n == 0 ||
      (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
       p->frequency_penalty == 0.0f))
    return true;
  for (int i = 0; i < s->hist_n; i++) { /* newest first, each token once */
    int32_t t = s->hist[(s->hist_head - 1 - i + cap) % cap];
    bool first = s->counts[t] > 0;
    for (int j = 0; j < i && first; j++)
      if (s->hist[(s->hist_head - 1 - j + cap) % cap] == t)
        first = false;
    if (!first)
      continue;
    if (n == max_pen)
      return false;
    ids[n] = t;
    counts[n++] = s->counts[t];
  }
  *n_out = n;
  return true;
}

int32_t sl_sampler_sample(sl_sampler_t *s, float *logits) {
  return sl_sampler_sample_with(s, logits, sl_sampler_draw(s));
}

int32_t sl_sampler_sample_with(sl_sampler_t *s, float *logits, double u) {
  const sl_sampler_params *p = &s->p;
  int n = s->n_vocab;
  for (int i = 0; i < s->n_bias; i++) /* OpenAI's logit_bias: first */
    logits[s->bias[i].id] += s->bias[i].bias;
  apply_penalties(s, logits);
  if (p->temperature <= 0.0f) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
      if (logits[i] > logits[best])
        best = i;
    return best;
  }
  for (int i = 0; i < n; i++) {
    s->cands[i].id = i;
    s->cands[i].logit = logits[i];
  }
  /* top-k: the k best, sorted (O(n + k log k)); without it, all n stay in
   * id order until a cut needs them sorted */
  int m = p->top_k > 0 && p->top_k < n ? p->top_k : n;
  bool sorted = m < n;
  if (sorted)
    sort_best(s->cands, n, m);
  float mx = s->cands[0].logit;
  if (!sorted)
    for (int i = 1; i < m; i++)
      mx = fmaxf(mx, s->cands[i].logit);
  /* softmax with temperature over the m candidates */
  float *pr = s->probs;
  double sum = 0;
  for (int i = 0; i < m; i++) {
    pr[i] = expf((s->cands[i].logit - mx) / p->temperature);
    sum += pr[i];
  }
  float pmax = 0.0f;
  for (int i = 0; i < m; i++) {
    pr[i] = (float)(pr[i] / sum);
    pmax = fmaxf(pmax, pr[i]);
  }
  /* min-p: drop tokens under min_p * the top probability (order kept) */
  if (p->min_p > 0.0f) {
    float floor_p = p->min_p * pmax;
    int keep = 0;
    for (int i = 0; i < m; i++)
      if (pr[i] >= floor_p) {
        s->cands[keep] = s->cands[i];
        pr[keep++] = pr[i];
      }
    m = keep;
  }
  /* top-p: the smallest best-first prefix whose mass reaches top_p; the
   * order is needed now, for a growing number of the best at a time */
  if (p->top_p < 1.0f) {
    if (!sorted) {
      /* pair each candidate with its probability while sorting */
      for (int i = 0; i < m; i++)
        s->cands[i].logit = pr[i];
      int want = m < 64 ? m : 64;
      for (;;) {
        sort_best(s->cands, m, want);
        double cum = 0;
        int i = 0;
        while (i < want && cum < p->top_p)
          cum += s->cands[i++].logit;
        if (cum >= p->top_p || want == m)
          break;
        want = want > m / 8 ? m : want * 8;
      }
      for (int i = 0; i < m; i++)
        pr[i] = s->cands[i].logit;
    }
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
  double r = u * total, acc = 0;
  int32_t pick = s->cands[m - 1].id;
  for (int i = 0; i < m; i++) {
    acc += pr[i];
    if (r < acc) {
      pick = s->cands[i].id;
      break;
    }
  }
  return pick;
}
