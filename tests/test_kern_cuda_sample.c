/* The device sampler (sl_kcu_sample, src/kern/cuda/sample.cu) against the
 * CPU sampler (sl_sampler_sample_with, src/engine/sampler.c) and the CPU
 * logprobs (sl__logprobs, src/engine/detok.c, re-stated below) on random
 * rows: vocabularies of 1000, 49152 and 128256; rows normal with sigma 1, 3
 * and 10, one with many exact ties, one very peaked, one flat; parameter
 * sets from greedy to every cut at once, with and without penalties. Each
 * (row, parameters) pair is drawn 64 times (64 sequences of one call, on the
 * same row), every row of a vocabulary in the same call.
 *
 * Pass criteria:
 * - greedy: the id equals the CPU's, always;
 * - sampled: the id equals the CPU's, except where r * total lies within
 *   1e-5 * total of a boundary of the CPU's cumulative walk, and then the
 *   device's id must be one whose interval touches that window (counted and
 *   printed as boundary cases); any other difference fails;
 * - id -1 only where the CPU's kept set reaches past the SL_KCU_SAMPLE_
 *   MAX_SORT best candidates (logit desc, id asc), or, top-k off and top-p
 *   on, where the last kept probability is not above that of the best
 *   candidate past them (a tie across the boundary the device cannot order),
 *   or where min_p > 1; then logprob is NaN;
 * - logprob (n_top >= 0) within 1e-4 of the CPU's (of the device's id);
 * - the top ids equal the CPU's except between entries whose raw logits
 *   differ by less than 1e-6, their logprobs within 1e-4; unused slots are
 *   id -1, logprob -inf;
 * - a second call gives bitwise the same outputs, and a sequence alone in a
 *   call gives bitwise what it gave among the others.
 *
 * Skips (exit 77) without CUDA or without a device. `--bench` times 64
 * sequences x 128256 for the server's default parameters and the CPU
 * defaults. `--host-check` runs no GPU code: it checks the test's own
 * reference (the kept set, its order and cumulative mass, restated from
 * sampler.c) against sl_sampler_sample_with on every case and draw. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test.h"
#include "engine/engine_impl.h"
#include "harness.h"
#include "sluice/kern_cuda.h"
#include "sluice/rt.h"
#include "sluice/sampler.h"

#ifdef SLUICE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

enum { DRAWS = 64, N_ROWS = 6, MAX_SORT = SL_KCU_SAMPLE_MAX_SORT };

static uint64_t g_rng = 0x5A17C0FFEEull;

static uint64_t rnd_u64(void) { /* splitmix64 */
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double rnd_unit(void) { /* [0, 1) */
  return (double)(rnd_u64() >> 11) * (1.0 / 9007199254740992.0);
}

static float rnd_normal(void) {
  double u1 = ((double)(rnd_u64() >> 11) + 1.0) / 9007199254740993.0;
  double u2 = rnd_unit();
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  return p;
}

/* Row r of a vocabulary: 0..2 normal sigma 1, 3, 10; 3 exact ties (halves
 * in [-4, 4]); 4 peaked (one entry 30 above a sigma-1 row); 5 flat. */
static void fill_row(float *x, int n, int r) {
  for (int i = 0; i < n; i++) {
    switch (r) {
    case 0:
      x[i] = rnd_normal();
      break;
    case 1:
      x[i] = 3.0f * rnd_normal();
      break;
    case 2:
      x[i] = 10.0f * rnd_normal();
      break;
    case 3:
      x[i] = (float)((int)(rnd_u64() % 17) - 8) * 0.5f;
      break;
    case 4:
      x[i] = rnd_normal();
      break;
    default:
      x[i] = 0.25f;
    }
  }
  if (r == 4)
    x[(int)(rnd_u64() % (uint64_t)n)] = 30.0f;
  if (r == 0 && n > 100) { /* some masked entries */
    for (int k = 0; k < 20; k++)
      x[(int)(rnd_u64() % (uint64_t)n)] = -INFINITY;
  }
}

/* ---- the reference -------------------------------------------------------
 */

typedef struct cand {
  int32_t id;
  float v;
} cand;

static int cmp_better(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->v > y->v || (x->v == y->v && x->id < y->id))
    return -1;
  if (y->v > x->v || (x->v == y->v && y->id < x->id))
    return 1;
  return 0;
}

/* sampler.c's walk for one (penalized row, parameters), T > 0: the kept
 * candidates in the order of the walk, their probabilities and cumulative
 * mass; and whether a -1 from the device is allowed. */
typedef struct ref_walk {
  int m;         /* kept */
  int32_t *id;   /* (m) in walk order */
  float *pr;     /* (m) */
  double *acc;   /* (m) cumulative */
  double total;  /* acc[m - 1] */
  bool may_fail; /* the device may answer -1 */
} ref_walk;

static void ref_walk_free(ref_walk *w) {
  free(w->id);
  free(w->pr);
  free(w->acc);
}

static void ref_walk_make(ref_walk *w, const sl_sampler_params *p,
                          const float *l, int n) {
  cand *c = xmalloc(sizeof(cand) * (size_t)n);
  cand *byl = xmalloc(sizeof(cand) * (size_t)n); /* all, by (logit, id) */
  float *pr = xmalloc(sizeof(float) * (size_t)n);
  for (int i = 0; i < n; i++) {
    c[i].id = i;
    c[i].v = l[i];
  }
  memcpy(byl, c, sizeof(cand) * (size_t)n);
  qsort(byl, (size_t)n, sizeof(cand), cmp_better);
  int *rank = xmalloc(sizeof(int) * (size_t)n);
  for (int i = 0; i < n; i++)
    rank[byl[i].id] = i;
  int m = p->top_k > 0 && p->top_k < n ? p->top_k : n;
  bool sorted = m < n;
  if (sorted)
    memcpy(c, byl, sizeof(cand) * (size_t)m);
  float mx = c[0].v;
  if (!sorted)
    for (int i = 1; i < m; i++)
      mx = fmaxf(mx, c[i].v);
  double sum = 0;
  for (int i = 0; i < m; i++) {
    pr[i] = expf((c[i].v - mx) / p->temperature);
    sum += pr[i];
  }
  float pmax = 0.0f;
  for (int i = 0; i < m; i++) {
    pr[i] = (float)(pr[i] / sum);
    pmax = fmaxf(pmax, pr[i]);
  }
  if (p->min_p > 0.0f) {
    float floor_p = p->min_p * pmax;
    int keep = 0;
    for (int i = 0; i < m; i++)
      if (pr[i] >= floor_p) {
        c[keep] = c[i];
        pr[keep++] = pr[i];
      }
    m = keep;
  }
  if (p->top_p < 1.0f) {
    if (!sorted) {
      for (int i = 0; i < m; i++)
        c[i].v = pr[i];
      qsort(c, (size_t)m, sizeof(cand), cmp_better);
      for (int i = 0; i < m; i++)
        pr[i] = c[i].v;
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
  w->m = m;
  w->id = xmalloc(sizeof(int32_t) * (size_t)(m ? m : 1));
  w->pr = xmalloc(sizeof(float) * (size_t)(m ? m : 1));
  w->acc = xmalloc(sizeof(double) * (size_t)(m ? m : 1));
  double acc = 0;
  bool past = false;
  for (int i = 0; i < m; i++) {
    w->id[i] = c[i].id;
    w->pr[i] = pr[i];
    acc += pr[i];
    w->acc[i] = acc;
    past |= rank[c[i].id] >= MAX_SORT;
  }
  w->total = acc;
  /* a tie of probability across the boundary (top-k off, top-p on) */
  bool tie = false;
  if (!sorted && p->top_p < 1.0f && n > MAX_SORT && m > 0) {
    float pn = (float)(expf((byl[MAX_SORT].v - mx) / p->temperature) / sum);
    tie = !(pr[m - 1] > pn);
  }
  w->may_fail = past || tie || p->min_p > 1.0f || m == 0;
  free(rank);
  free(pr);
  free(byl);
  free(c);
}

/* the walk's pick at draw u */
static int32_t ref_pick(const ref_walk *w, double u) {
  double r = u * w->total;
  for (int i = 0; i < w->m; i++)
    if (r < w->acc[i])
      return w->id[i];
  return w->id[w->m - 1];
}

/* ---- cases ----------------------------------------------------------------
 */

typedef struct pset {
  const char *name;
  sl_sampler_params sp;
  int n_top;
  bool pen; /* feed a penalty history */
} pset;

static pset pset_make(const char *name, float T, int k, float tp, float mp,
                      float rp, float pres, float freq, int n_top) {
  pset s;
  s.name = name;
  s.sp = sl_sampler_defaults();
  s.sp.temperature = T;
  s.sp.top_k = k;
  s.sp.top_p = tp;
  s.sp.min_p = mp;
  s.sp.repeat_penalty = rp;
  s.sp.presence_penalty = pres;
  s.sp.frequency_penalty = freq;
  s.sp.penalty_last_n = 64;
  s.n_top = n_top;
  s.pen = rp != 1.0f || pres != 0.0f || freq != 0.0f;
  return s;
}

static int make_psets(pset *ps) {
  int n = 0;
  ps[n++] = pset_make("greedy", 0, 0, 1, 0, 1, 0, 0, 5);
  ps[n++] = pset_make("greedy+pen", 0, 0, 1, 0, 1.3f, 0.5f, 0.2f, 20);
  ps[n++] = pset_make("server-default", 1, 0, 1, 0, 1, 0, 0, -1);
  ps[n++] = pset_make("cpu-default", 0.8f, 40, 0.95f, 0.05f, 1, 0, 0, 0);
  ps[n++] = pset_make("top_k-1", 1, 1, 1, 0, 1, 0, 0, 5);
  ps[n++] = pset_make("top_k-max_sort", 1, MAX_SORT, 1, 0, 1, 0, 0, 20);
  ps[n++] = pset_make("top_k-5000+min_p", 1, 5000, 1, 0.1f, 1, 0, 0, -1);
  ps[n++] = pset_make("top_p-0.9", 1, 0, 0.9f, 0, 1, 0, 0, -1);
  ps[n++] = pset_make("min_p-0.05", 0.7f, 0, 1, 0.05f, 1, 0, 0, 5);
  ps[n++] =
      pset_make("top_p+min_p+pen", 1.2f, 0, 0.5f, 0.02f, 1.2f, 0.3f, 0.1f, 20);
  ps[n++] = pset_make("top_k+top_p+pen", 0.9f, 50, 0.8f, 0, 1.1f, 0, 0.1f, 5);
  ps[n++] = pset_make("top_p-0.001", 1, 0, 0.001f, 0, 1, 0, 0, 0);
  return n;
}

/* One row under one parameter set: the CPU's picks for the draws, its walk
 * and the device's params. */
typedef struct rowcase {
  sl_sampler_t *s;
  float *pen_row; /* the penalized row (the CPU sampler's output) */
  ref_walk w;
  int32_t cpu_id[DRAWS];
  double u[DRAWS];
  float lp_lse;
  int32_t top_id[SL_KCU_SAMPLE_MAX_TOP];
  float top_lp[SL_KCU_SAMPLE_MAX_TOP];
  sl_kcu_sample_params kp;
} rowcase;

static void rowcase_make(rowcase *rc, const pset *ps, const float *row, int n,
                         int row_index) {
  memset(rc, 0, sizeof *rc);
  rc->s = sl_sampler_create(&ps->sp, n);
  if (ps->pen) { /* the row's best ids, some several times, and others */
    cand *c = xmalloc(sizeof(cand) * (size_t)n);
    for (int i = 0; i < n; i++) {
      c[i].id = i;
      c[i].v = row[i];
    }
    qsort(c, (size_t)n, sizeof(cand), cmp_better);
    int32_t best[8];
    for (int k = 0; k < 8; k++)
      best[k] = c[k % n].id;
    free(c);
    for (int t = 0; t < 80; t++) {
      int32_t tok = t % 3 ? best[(int)(rnd_u64() % 8)]
                          : (int32_t)(rnd_u64() % (uint64_t)n);
      sl_sampler_accept(rc->s, tok);
    }
  }
  sl_kcu_sample_params *kp = &rc->kp;
  memset(kp, 0, sizeof *kp);
  kp->temperature = ps->sp.temperature;
  kp->top_k = ps->sp.top_k;
  kp->top_p = ps->sp.top_p;
  kp->min_p = ps->sp.min_p;
  kp->repeat_penalty = ps->sp.repeat_penalty;
  kp->presence_penalty = ps->sp.presence_penalty;
  kp->frequency_penalty = ps->sp.frequency_penalty;
  int np = 0;
  bool fit = sl_sampler_penalties(rc->s, SL_KCU_SAMPLE_MAX_PEN, kp->pen_id,
                                  kp->pen_count, &np);
  CHECK(fit);
  kp->n_pen = np;
  kp->n_top = ps->n_top;
  kp->row = row_index;
  rc->pen_row = xmalloc(sizeof(float) * (size_t)n);
  float *tmp = xmalloc(sizeof(float) * (size_t)n);
  for (int d = 0; d < DRAWS; d++) {
    rc->u[d] = ps->sp.temperature > 0 ? rnd_unit() : 0.0;
    if (d == 1 && ps->sp.temperature > 0)
      rc->u[d] = 0.9999999999; /* the end of the walk */
    memcpy(tmp, row, sizeof(float) * (size_t)n);
    rc->cpu_id[d] = sl_sampler_sample_with(rc->s, tmp, rc->u[d]);
    if (d == 0)
      memcpy(rc->pen_row, tmp, sizeof(float) * (size_t)n);
  }
  free(tmp);
  if (ps->sp.temperature > 0)
    ref_walk_make(&rc->w, &ps->sp, rc->pen_row, n);
  if (ps->n_top >= 0) {
    int nt =
        ps->n_top < SL_KCU_SAMPLE_MAX_TOP ? ps->n_top : SL_KCU_SAMPLE_MAX_TOP;
    /* the engine's own logprobs (src/engine/detok.c) */
    sl_token_logprob top[SL_KCU_SAMPLE_MAX_TOP];
    rc->lp_lse = row[0] - sl__logprobs(row, n, 0, nt, top);
    for (int k = 0; k < nt; k++) {
      rc->top_id[k] = top[k].id;
      rc->top_lp[k] = top[k].logprob;
    }
  }
}

static void rowcase_free(rowcase *rc) {
  sl_sampler_free(rc->s);
  free(rc->pen_row);
  if (rc->w.id)
    ref_walk_free(&rc->w);
}

/* The reference's own walk agrees with the CPU sampler on every draw. */
static void check_reference(const rowcase *rc, const pset *ps, int n, int row) {
  if (ps->sp.temperature <= 0)
    return;
  for (int d = 0; d < DRAWS; d++) {
    int32_t want = rc->cpu_id[d];
    int32_t got = ref_pick(&rc->w, rc->u[d]);
    CHECK_MSG(got == want, "%s n %d row %d draw %d: ref %d cpu %d", ps->name, n,
              row, d, got, want);
  }
}

static int host_check(void) {
  const int vocabs[] = {1000, 49152, 128256};
  pset ps[16];
  int n_ps = make_psets(ps);
  for (int vi = 0; vi < 3; vi++) {
    int n = vocabs[vi];
    float *x = xmalloc(sizeof(float) * (size_t)n * N_ROWS);
    for (int r = 0; r < N_ROWS; r++)
      fill_row(x + (size_t)r * n, n, r);
    for (int pi = 0; pi < n_ps; pi++) {
      int fails = 0, kept_max = 0;
      for (int r = 0; r < N_ROWS; r++) {
        rowcase rc;
        rowcase_make(&rc, &ps[pi], x + (size_t)r * n, n, r);
        check_reference(&rc, &ps[pi], n, r);
        if (ps[pi].sp.temperature > 0) {
          fails += rc.w.may_fail;
          kept_max = rc.w.m > kept_max ? rc.w.m : kept_max;
        }
        rowcase_free(&rc);
      }
      printf("host-check n %6d %-18s rows the device may fail: %d, "
             "largest kept set %d\n",
             n, ps[pi].name, fails, kept_max);
    }
    free(x);
  }
  return sl_test_finish();
}

#ifdef SLUICE_HAVE_CUDA

/* true when `id` is a candidate whose interval of the walk comes within
 * 1e-5 * total of u * total (a boundary case) */
static bool ref_near(const ref_walk *w, double u, int32_t id) {
  double r = u * w->total, eps = 1e-5 * w->total;
  for (int i = 0; i < w->m; i++) {
    double lo = i ? w->acc[i - 1] : 0.0, hi = w->acc[i];
    if (w->id[i] == id && lo <= r + eps && r - eps <= hi &&
        (fabs(r - lo) <= eps || fabs(r - hi) <= eps))
      return true;
  }
  return false;
}

static cudaStream_t g_stream;

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) {
    fprintf(stderr, "cudaMalloc(%zu) failed\n", bytes);
    exit(1);
  }
  return p;
}

static void *dev_upload(const void *src, size_t bytes) {
  void *p = dev_alloc(bytes);
  if (cudaMemcpyAsync(p, src, bytes, cudaMemcpyHostToDevice, g_stream) !=
          cudaSuccess ||
      cudaStreamSynchronize(g_stream) != cudaSuccess) {
    fprintf(stderr, "upload failed\n");
    exit(1);
  }
  return p;
}

static void download(void *dst, const void *src, size_t bytes) {
  CHECK(cudaStreamSynchronize(g_stream) == cudaSuccess);
  CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
}

typedef struct tally {
  long exact, boundary, fallback, greedy;
} tally;

/* Checks sequence d of row case rc against the CPU. */
static void check_seq(const rowcase *rc, const pset *ps, const float *row,
                      int n, int r, int d, const sl_kcu_sample_out *o,
                      tally *t) {
  int32_t want = rc->cpu_id[d];
  const char *nm = ps->name;
  if (ps->sp.temperature <= 0) {
    CHECK_MSG(o->id == want, "%s n %d row %d: greedy %d cpu %d", nm, n, r,
              o->id, want);
    t->greedy++;
  } else if (o->id == want) {
    t->exact++;
  } else if (o->id == -1) {
    CHECK_MSG(rc->w.may_fail,
              "%s n %d row %d draw %d: -1 but the CPU kept %d within the "
              "best %d",
              nm, n, r, d, rc->w.m, MAX_SORT);
    t->fallback++;
  } else {
    bool near = ref_near(&rc->w, rc->u[d], o->id);
    CHECK_MSG(near, "%s n %d row %d draw %d (u %.17g): %d, cpu %d", nm, n, r, d,
              rc->u[d], o->id, want);
    t->boundary += near;
  }
  if (ps->n_top < 0)
    return;
  if (o->id >= 0) {
    float want_lp = row[o->id] - rc->lp_lse;
    CHECK_MSG(fabsf(o->logprob - want_lp) <= 1e-4f,
              "%s n %d row %d: logprob %.7g vs %.7g", nm, n, r, o->logprob,
              want_lp);
  } else {
    CHECK_MSG(isnan(o->logprob), "%s: logprob of -1 is %g", nm, o->logprob);
  }
  int nt =
      ps->n_top < SL_KCU_SAMPLE_MAX_TOP ? ps->n_top : SL_KCU_SAMPLE_MAX_TOP;
  for (int k = 0; k < nt; k++) {
    int32_t a = o->top_id[k], b = rc->top_id[k];
    if (b < 0) {
      CHECK_MSG(a == -1 && isinf(o->top_logprob[k]) && o->top_logprob[k] < 0,
                "%s n %d row %d: top %d is %d (%g), want none", nm, n, r, k, a,
                o->top_logprob[k]);
      continue;
    }
    bool same = a == b || (a >= 0 && a < n && fabsf(row[a] - row[b]) < 1e-6f);
    CHECK_MSG(same, "%s n %d row %d: top %d is %d (%.9g), cpu %d (%.9g)", nm, n,
              r, k, a, a >= 0 && a < n ? row[a] : NAN, b, row[b]);
    CHECK_MSG(fabsf(o->top_logprob[k] - rc->top_lp[k]) <= 1e-4f,
              "%s n %d row %d: top %d logprob %.7g vs %.7g", nm, n, r, k,
              o->top_logprob[k], rc->top_lp[k]);
  }
}

static void test_sample(void) {
  const int vocabs[] = {1000, 49152, 128256};
  pset ps[16];
  int n_ps = make_psets(ps);
  tally all = {0};
  for (int vi = 0; vi < 3; vi++) {
    int n = vocabs[vi];
    float *x = xmalloc(sizeof(float) * (size_t)n * N_ROWS);
    for (int r = 0; r < N_ROWS; r++)
      fill_row(x + (size_t)r * n, n, r);
    float *dx = dev_upload(x, sizeof(float) * (size_t)n * N_ROWS);
    const int n_seq = N_ROWS * DRAWS;
    sl_kcu_sample_params *kp = xmalloc(sizeof *kp * n_seq);
    sl_kcu_sample_out *o = xmalloc(sizeof *o * n_seq);
    sl_kcu_sample_out *o2 = xmalloc(sizeof *o2 * n_seq);
    sl_kcu_sample_params *dkp = dev_alloc(sizeof *kp * n_seq);
    sl_kcu_sample_out *dout = dev_alloc(sizeof *o * n_seq);
    size_t wb = sl_kcu_sample_work_bytes(n_seq, n);
    void *work = wb ? dev_alloc(wb) : NULL;
    for (int pi = 0; pi < n_ps; pi++) {
      rowcase *rc = xmalloc(sizeof *rc * N_ROWS);
      for (int r = 0; r < N_ROWS; r++) {
        rowcase_make(&rc[r], &ps[pi], x + (size_t)r * n, n, r);
        for (int d = 0; d < DRAWS; d++) {
          kp[r * DRAWS + d] = rc[r].kp;
          kp[r * DRAWS + d].r = rc[r].u[d];
        }
      }
      CHECK(cudaMemcpyAsync(dkp, kp, sizeof *kp * n_seq, cudaMemcpyHostToDevice,
                            g_stream) == cudaSuccess);
      CHECK(cudaMemsetAsync(dout, 0x5c, sizeof *o * n_seq, g_stream) ==
            cudaSuccess);
      CHECK_OK(sl_kcu_sample(g_stream, dx, n, n_seq, dkp, dout, work, wb));
      download(o, dout, sizeof *o * n_seq);
      tally t = {0};
      for (int r = 0; r < N_ROWS; r++)
        for (int d = 0; d < DRAWS; d++)
          check_seq(&rc[r], &ps[pi], x + (size_t)r * n, n, r, d,
                    &o[r * DRAWS + d], &t);
      /* determinism: again, bitwise */
      CHECK(cudaMemsetAsync(dout, 0xa3, sizeof *o * n_seq, g_stream) ==
            cudaSuccess);
      CHECK_OK(sl_kcu_sample(g_stream, dx, n, n_seq, dkp, dout, work, wb));
      download(o2, dout, sizeof *o * n_seq);
      CHECK_MSG(memcmp(o, o2, sizeof *o * n_seq) == 0, "%s n %d: not repeated",
                ps[pi].name, n);
      /* independence: one sequence alone (the last row's draw 5) */
      int one = (N_ROWS - 1) * DRAWS + 5;
      CHECK_OK(sl_kcu_sample(g_stream, dx, n, 1, dkp + one, dout, work, wb));
      download(o2, dout, sizeof *o);
      CHECK_MSG(memcmp(&o[one], o2, sizeof *o) == 0, "%s n %d: not alone",
                ps[pi].name, n);
      printf("n %6d %-18s exact %4ld boundary %ld fallback(-1) %ld "
             "greedy %ld\n",
             n, ps[pi].name, t.exact, t.boundary, t.fallback, t.greedy);
      all.exact += t.exact;
      all.boundary += t.boundary;
      all.fallback += t.fallback;
      all.greedy += t.greedy;
      for (int r = 0; r < N_ROWS; r++)
        rowcase_free(&rc[r]);
      free(rc);
    }
    /* logits untouched */
    float *back = xmalloc(sizeof(float) * (size_t)n * N_ROWS);
    download(back, dx, sizeof(float) * (size_t)n * N_ROWS);
    CHECK(memcmp(back, x, sizeof(float) * (size_t)n * N_ROWS) == 0);
    free(back);
    cudaFree(dx);
    cudaFree(dkp);
    cudaFree(dout);
    cudaFree(work);
    free(kp);
    free(o);
    free(o2);
    free(x);
  }
  printf("sampled: %ld exact, %ld boundary cases, %ld fallbacks (-1); "
         "greedy: %ld equal\n",
         all.exact, all.boundary, all.fallback, all.greedy);
  CHECK(sl_kcu_sample(g_stream, NULL, 0, 1, NULL, NULL, NULL, 0) ==
        SL_ERR_INVALID_ARG);
  CHECK(sl_kcu_sample(g_stream, NULL, 10, 0, NULL, NULL, NULL, 0) == SL_OK);
}

/* 64 sequences x 128256 (sigma 3 rows), server default and CPU defaults */
static int bench(void) {
  const int n = 128256, n_seq = 64;
  float *x = xmalloc(sizeof(float) * (size_t)n * n_seq);
  for (size_t i = 0; i < (size_t)n * n_seq; i++)
    x[i] = 3.0f * rnd_normal();
  float *dx = dev_upload(x, sizeof(float) * (size_t)n * n_seq);
  sl_kcu_sample_params *kp = xmalloc(sizeof *kp * n_seq);
  sl_kcu_sample_params *dkp = dev_alloc(sizeof *kp * n_seq);
  sl_kcu_sample_out *dout = dev_alloc(sizeof(sl_kcu_sample_out) * n_seq);
  pset ps[16];
  make_psets(ps);
  const int which[] = {2, 3, 0, 8};
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int wi = 0; wi < 4; wi++) {
    const pset *p = &ps[which[wi]];
    for (int s = 0; s < n_seq; s++) {
      memset(&kp[s], 0, sizeof kp[s]);
      kp[s].temperature = p->sp.temperature;
      kp[s].top_k = p->sp.top_k;
      kp[s].top_p = p->sp.top_p;
      kp[s].min_p = p->sp.min_p;
      kp[s].repeat_penalty = 1.0f;
      kp[s].r = rnd_unit();
      kp[s].n_top = -1;
      kp[s].row = s;
    }
    CHECK(cudaMemcpyAsync(dkp, kp, sizeof *kp * n_seq, cudaMemcpyHostToDevice,
                          g_stream) == cudaSuccess);
    for (int i = 0; i < 3; i++)
      CHECK_OK(sl_kcu_sample(g_stream, dx, n, n_seq, dkp, dout, NULL, 0));
    const int iters = 50;
    cudaEventRecord(e0, g_stream);
    for (int i = 0; i < iters; i++)
      sl_kcu_sample(g_stream, dx, n, n_seq, dkp, dout, NULL, 0);
    cudaEventRecord(e1, g_stream);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    printf("{\"bench\": \"sample\", \"params\": \"%s\", \"n_seq\": %d, "
           "\"n_vocab\": %d, \"us\": %.1f}\n",
           p->name, n_seq, n, 1e3 * ms / iters);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(dx);
  cudaFree(dkp);
  cudaFree(dout);
  free(kp);
  free(x);
  return sl_test_finish();
}

#endif /* SLUICE_HAVE_CUDA */

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--host-check") == 0)
    return host_check();
#ifndef SLUICE_HAVE_CUDA
  fprintf(stderr, "skip: sluice was built without the CUDA backend\n");
  return 77;
#else
  int setup = cuda_test_stream(&g_stream);
  if (setup)
    return setup;
  int rc;
  if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
    rc = bench();
  } else {
    RUN(test_sample);
    rc = sl_test_finish();
  }
  cudaStreamDestroy(g_stream);
  sl_rt_shutdown();
  return rc;
#endif
}
