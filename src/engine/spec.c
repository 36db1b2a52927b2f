/* sluice — engine: speculative decoding (include/sluice/spec.h): the
 * drafter interface, prompt lookup behind it, and greedy generation over
 * a single-sequence context that verifies the drafts in one pass and
 * truncates what it rejects. */
#include <math.h>
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

/* ---- the drafter interface ---- */

sl_draft_seq *sl_drafter_seq_begin(sl_drafter *d, const int32_t *ref, int n_ref,
                                   int max_len) {
  if (!d || n_ref < 0 || (n_ref > 0 && !ref) || max_len < 1)
    return NULL;
  sl_draft_seq *s = d->ops->seq_begin(d, ref, n_ref, max_len);
  if (s) {
    s->drafter = d;
    s->drafted = s->kept = 0;
  }
  return s;
}

int sl_drafter_propose(sl_draft_seq *s, const int32_t *hist, int n, int k,
                       int32_t *out) {
  if (!s || !hist || n < 0 || !out || k < 1)
    return 0;
  k = k < 64 ? k : 64;
  int c = s->drafter->ops->propose(s->drafter, s, hist, n, k, out);
  return c < 0 ? 0 : c < k ? c : k;
}

void sl_drafter_accepted(sl_draft_seq *s, int drafted, int kept) {
  if (!s || drafted <= 0)
    return;
  kept = kept < 0 ? 0 : kept < drafted ? kept : drafted;
  s->drafted += drafted;
  s->kept += kept;
  if (s->drafter->ops->accepted)
    s->drafter->ops->accepted(s->drafter, s, drafted, kept);
}

void sl_drafter_seq_end(sl_draft_seq *s) {
  if (s)
    s->drafter->ops->seq_end(s->drafter, s);
}

void sl_drafter_free(sl_drafter *d) {
  if (d)
    d->ops->destroy(d);
}

/* ---- prompt lookup behind it ---- */

typedef struct ngram_drafter {
  sl_drafter base;
  sl_draft_params p;
} ngram_drafter;

typedef struct ngram_seq {
  sl_draft_seq head;
  int32_t *ref; /* the reference text's tokens, or NULL */
  int n_ref;
  int cursor;    /* where in ref the output has got to: after the last kept */
  int last_from; /* where in ref the last proposal came from, or -1 */
} ngram_seq;

static sl_draft_seq *ngram_seq_begin(sl_drafter *d, const int32_t *ref,
                                     int n_ref, int max_len) {
  (void)d;
  (void)max_len; /* its lookups hold nothing per token */
  ngram_seq *s = sl_calloc(1, sizeof *s);
  if (!s)
    return NULL;
  if (n_ref > 0) {
    s->ref = sl_malloc(sizeof(int32_t) * (size_t)n_ref);
    if (!s->ref) {
      sl_free(s);
      return NULL;
    }
    memcpy(s->ref, ref, sizeof(int32_t) * (size_t)n_ref);
    s->n_ref = n_ref;
  }
  s->last_from = -1;
  return &s->head;
}

/* The longest suffix of hist[0..n) (p's n-gram lengths) found in the
 * reference: of its occurrences the first at or after the cursor (the
 * output goes through the reference in order), else the last before it;
 * what follows it, up to k tokens, into out. */
static int ngram_ref_lookup(const sl_draft_params *p, ngram_seq *s,
                            const int32_t *hist, int n, int k, int32_t *out) {
  s->last_from = -1;
  int top = p->ngram_max < n ? p->ngram_max : n;
  for (int g = top; g >= p->ngram_min; g--) {
    const int32_t *suf = hist + n - g;
    int best = -1;
    for (int i = 0; i + g < s->n_ref; i++) {
      if (memcmp(s->ref + i, suf, sizeof(int32_t) * (size_t)g) != 0)
        continue;
      best = i;
      if (i + g >= s->cursor)
        break;
    }
    if (best < 0)
      continue;
    int from = best + g, cnt = s->n_ref - from < k ? s->n_ref - from : k;
    memcpy(out, s->ref + from, sizeof(int32_t) * (size_t)cnt);
    s->last_from = from;
    return cnt;
  }
  return 0;
}

static int ngram_propose(sl_drafter *d, sl_draft_seq *hs, const int32_t *hist,
                         int n, int k, int32_t *out) {
  ngram_drafter *nd = (ngram_drafter *)d;
  ngram_seq *s = (ngram_seq *)hs;
  sl_draft_params p = nd->p;
  p.n_max = k < p.n_max ? k : p.n_max;
  p.n_min = p.n_min < p.n_max ? p.n_min : p.n_max;
  int c = s->n_ref ? ngram_ref_lookup(&p, s, hist, n, p.n_max, out) : 0;
  if (c >= p.n_min)
    return c;
  s->last_from = -1;
  return sl_draft_lookup(&p, hist, n, out);
}

static void ngram_accepted(sl_drafter *d, sl_draft_seq *hs, int drafted,
                           int kept) {
  (void)d;
  (void)drafted;
  ngram_seq *s = (ngram_seq *)hs;
  if (s->last_from >= 0)
    s->cursor = s->last_from + kept;
}

static void ngram_seq_end(sl_drafter *d, sl_draft_seq *hs) {
  (void)d;
  ngram_seq *s = (ngram_seq *)hs;
  sl_free(s->ref);
  sl_free(s);
}

static void ngram_destroy(sl_drafter *d) {
  sl_free(d);
}

static const sl_drafter_ops ngram_ops = {
    .name = "ngram",
    .seq_begin = ngram_seq_begin,
    .propose = ngram_propose,
    .accepted = ngram_accepted,
    .seq_end = ngram_seq_end,
    .destroy = ngram_destroy,
};

sl_drafter *sl_drafter_ngram_create(const sl_draft_params *p) {
  if (!sl_draft_params_ok(p, NULL, 0))
    return NULL;
  ngram_drafter *d = sl_calloc(1, sizeof *d);
  if (!d)
    return NULL;
  d->base.ops = &ngram_ops;
  d->base.stream = NULL;
  d->p = *p;
  return &d->base;
}

/* ---- sampled requests: the rejection rule ---- */

/* The residual's (unnormalised) mass at token i: max(0, p - q). */
static double residual(const float *p, const float *q, int64_t i) {
  return p[i] > q[i] ? (double)p[i] - (double)q[i] : 0.0;
}

int32_t sl_spec_accept(const float *p, const float *q, int64_t n, int32_t x,
                       double u1, double u2, bool *kept) {
  if (kept)
    *kept = false;
  if (!p || !q || n <= 0 || x < 0 || x >= n)
    return -1;
  /* keep x with probability min(1, p(x) / q(x)): u1 q(x) < p(x) */
  if (u1 * (double)q[x] < (double)p[x]) {
    if (kept)
      *kept = true;
    return x;
  }
  double mass = 0;
  for (int64_t i = 0; i < n; i++)
    mass += residual(p, q, i);
  if (!(mass > 0)) /* p == q (up to rounding): x could not be rejected */
    return x;
  double t = u2 * mass, acc = 0;
  int64_t last = x;
  for (int64_t i = 0; i < n; i++) {
    double r = residual(p, q, i);
    if (r <= 0)
      continue;
    last = i;
    acc += r;
    if (t < acc)
      return (int32_t)i;
  }
  return (int32_t)last; /* t at the very top: rounding */
}

/* ---- when it pays ---- */

int sl_spec_allocate(const int *prop, const double *alpha, int n, int n_base,
                     double cost, int *take) {
  int total = 0;
  for (int s = 0; s < n; s++)
    take[s] = 0;
  double E = n_base, C = 1.0 + (cost > 0 ? cost : 0) * n_base;
  for (;;) {
    int best = -1;
    double bg = -1;
    for (int s = 0; s < n; s++) {
      if (take[s] >= prop[s])
        continue;
      double g = pow(alpha[s], take[s] + 1);
      if (g > bg) {
        bg = g;
        best = s;
      }
    }
    /* the draft pays when bg / cost > E / C */
    if (best < 0 || (cost > 0 && bg * C <= cost * E))
      break;
    take[best]++;
    total++;
    E += bg;
    C += cost > 0 ? cost : 0;
  }
  return total;
}

enum { COST_MIN_OBS = 16 };
#define COST_DECAY 0.98

void sl_spec_cost_observe(sl_spec_cost *c, int n_tokens, double ns) {
  double x = n_tokens;
  c->s0 = c->s0 * COST_DECAY + 1;
  c->s1 = c->s1 * COST_DECAY + x;
  c->s2 = c->s2 * COST_DECAY + x * x;
  c->sy = c->sy * COST_DECAY + ns;
  c->sny = c->sny * COST_DECAY + x * ns;
  c->n_obs++;
}

double sl_spec_cost_ratio(const sl_spec_cost *c, double dflt) {
  if (c->n_obs < COST_MIN_OBS)
    return dflt;
  double det = c->s0 * c->s2 - c->s1 * c->s1;
  /* the sizes' variance (det / s0^2) under one token: no slope to read */
  if (!(det > c->s0 * c->s0))
    return dflt;
  double b = (c->s0 * c->sny - c->s1 * c->sy) / det;
  double a = (c->sy - b * c->s1) / c->s0;
  if (!(a > 0 && b > 0))
    return dflt;
  return b / (a + b);
}

#define ACCEPT_WEIGHT 0.3 /* a verification's weight in alpha */
#define ACCEPT_PRIOR  0.5

void sl_spec_accept_observe(sl_spec_accept_est *a, int drafted, int kept) {
  if (drafted <= 0)
    return;
  double x = kept < drafted ? (double)kept / (kept + 1) : 1.0;
  a->a = (1 - ACCEPT_WEIGHT) * sl_spec_alpha(a) + ACCEPT_WEIGHT * x;
  a->n++;
}

void sl_spec_accept_age(sl_spec_accept_est *a) {
  if (a->n && a->a < ACCEPT_PRIOR) /* up toward the prior, never down */
    a->a += 0.05 * (ACCEPT_PRIOR - a->a);
}

double sl_spec_alpha(const sl_spec_accept_est *a) {
  return a->n ? a->a : ACCEPT_PRIOR;
}

int32_t sl_spec_argmax(const float *lg, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (lg[i] > lg[best])
      best = i;
  return (int32_t)best;
}

sl_status sl_spec_generate_greedy(sl_ctx_t *c, int n_ctx, int32_t *hist,
                                  int n_hist, const float *last,
                                  int64_t n_vocab, int max_new, sl_drafter *d,
                                  int k, sl_spec_emit_fn emit, void *ud,
                                  sl_spec_stats *stats) {
  sl_spec_stats dummy;
  if (!stats)
    stats = &dummy;
  memset(stats, 0, sizeof *stats);
  if (!c || !hist || n_hist < 0 || !last || n_vocab <= 0 || max_new < 0 ||
      !emit || (d && (k < 1 || k > 64)))
    return SL_ERR_INVALID_ARG;
  const int K = d ? k : 0;
  sl_draft_seq *ds = d ? sl_drafter_seq_begin(d, NULL, 0, n_ctx) : NULL;
  if (d && !ds)
    return SL_ERR_NOMEM;
  float *rows = sl_malloc(sizeof(float) * (size_t)n_vocab * (size_t)(K + 1));
  int32_t *batch = sl_malloc(sizeof(int32_t) * (size_t)(K + 1));
  if (!rows || !batch) {
    sl_free(rows);
    sl_free(batch);
    sl_drafter_seq_end(ds);
    return SL_ERR_NOMEM;
  }
  sl_status st = SL_OK;
  int n = n_hist, made = 0;
  const float *row = last; /* the logits that chose cur */
  int32_t cur = sl_spec_argmax(row, n_vocab);
  while (made < max_new) {
    hist[n++] = cur;
    made++;
    if (!emit(ud, cur, row) || made == max_new)
      break;
    /* cur goes in first; after it the drafts, as many as the budget, the
     * context and the lookup allow */
    int past = sl_ctx_n_past(c), nd = 0;
    if (ds) {
      int room = n_ctx - past - 1;
      room = room < max_new - made ? room : max_new - made;
      room = room < K ? room : K;
      nd = room > 0 ? sl_drafter_propose(ds, hist, n, room, batch + 1) : 0;
    }
    batch[0] = cur;
    if ((st = sl_ctx_eval(c, batch, 1 + nd, rows, nd > 0)) != SL_OK)
      break;
    stats->passes++;
    stats->drafted += nd;
    /* row i follows cur and drafts 0..i-1: keep draft i while the target
     * would have chosen it */
    int i = 0;
    bool stop = false;
    while (i < nd) {
      const float *r = rows + (size_t)i * (size_t)n_vocab;
      int32_t t = sl_spec_argmax(r, n_vocab);
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
    if (nd > 0) {
      sl_drafter_accepted(ds, nd, i);
      sl_ctx_truncate(c, past + 1 + i); /* cur and the drafts kept */
    }
    if (stop)
      break;
    row = rows + (size_t)i * (size_t)n_vocab;
    cur = sl_spec_argmax(row, n_vocab);
  }
  sl_free(rows);
  sl_free(batch);
  sl_drafter_seq_end(ds);
  return st;
}
