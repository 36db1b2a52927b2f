/* The CUDA small ops, attention and argmax (sluice/kern_cuda.h) against the
 * CPU kernels (sluice/kern_cpu.h) on random inputs.
 *
 * Skips (exit 77) when sluice was built without CUDA or when no CUDA device
 * can be opened. `--bench` times decode attention (32 sequences of 4096
 * positions, 32 heads, 8 KV heads, head_dim 128) and prints the KV read
 * bandwidth. `--host-check` runs no GPU code: it measures how far the CPU
 * attention reference (f16-rounded q and probabilities, as ggml) lies from
 * a float64 attention on the test's inputs, the margin behind the tolerance
 * of the GPU-vs-CPU comparison below. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_test.h"
#include "harness.h"
#include "sluice/kern_cpu.h"
#include "sluice/kern_cuda.h"
#include "sluice/rt.h"

#ifdef SLUICE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- host helpers ---------------------------------------------------------
 */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd_u64(void) { /* splitmix64 */
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static float rnd_uni(void) {
  return (float)(rnd_u64() >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

static float rnd_normal(void) {
  double u1 = ((double)(rnd_u64() >> 11) + 1.0) / 9007199254740993.0;
  double u2 = (double)(rnd_u64() >> 11) / 9007199254740992.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static uint16_t f2h(float x) {
  uint16_t h;
  sl_kern_f32_to_f16(&h, &x, 1);
  return h;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  return p;
}

/* max over rows of max_i |a - ref| / max_i |ref| (plus `floor` in the
 * denominator); NaN anywhere gives +inf, so that it fails any bound */
static double row_rel_err(const float *a, const float *ref, int64_t rows,
                          int64_t width, double floor) {
  double worst = 0;
  for (int64_t r = 0; r < rows; r++) {
    double mx = 0, err = 0;
    for (int64_t i = 0; i < width; i++) {
      double x = a[r * width + i], y = ref[r * width + i];
      if (isnan(x) || isnan(y))
        return INFINITY;
      mx = fmax(mx, fabs(y));
      err = fmax(err, fabs(x - y));
    }
    worst = fmax(worst, err / (mx + floor));
  }
  return worst;
}

/* ---- attention inputs (host) ------------------------------------------------
 */

enum { BT = 16, BT_SHIFT = 4, MAX_SEQ = 8 };

/* A paged cache and a batch of query tokens. */
typedef struct attn_case {
  int hd, n_head, n_head_kv, kv_dim;
  int n_seq, lens[MAX_SEQ];
  int n_blocks;
  int32_t *block_table;     /* every sequence's blocks, back to back */
  int32_t seq_off[MAX_SEQ]; /* its first entry in block_table */
  uint16_t *k, *v;          /* (n_blocks, BT, kv_dim) f16 */
  int n_tok, max_len;
  int32_t *tok_seq, *tok_pos; /* (n_tok) */
  float *q;                   /* (n_tok, n_head * hd) */
  float scale;
} attn_case;

/* Sequences of lens[] positions in blocks of BT, the blocks shuffled over
 * the pool (with spare blocks no sequence owns). Positions no sequence holds
 * are f16 NaN, so that reading one poisons the result. K ~ N(0, 1), V ~
 * U(-1, 1). */
static void attn_case_init(attn_case *c, int hd, int n_head, int n_head_kv,
                           const int *lens, int n_seq) {
  memset(c, 0, sizeof *c);
  c->hd = hd;
  c->n_head = n_head;
  c->n_head_kv = n_head_kv;
  c->kv_dim = n_head_kv * hd;
  c->n_seq = n_seq;
  int used = 0;
  for (int s = 0; s < n_seq; s++) {
    c->lens[s] = lens[s];
    c->seq_off[s] = used;
    used += (lens[s] + BT - 1) / BT;
  }
  c->n_blocks = used + 7;
  int32_t *perm = xmalloc(sizeof(int32_t) * c->n_blocks);
  for (int i = 0; i < c->n_blocks; i++)
    perm[i] = i;
  for (int i = c->n_blocks - 1; i > 0; i--) {
    int j = (int)(rnd_u64() % (uint64_t)(i + 1));
    int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  c->block_table = perm; /* the first `used` entries are owned */
  size_t n = (size_t)c->n_blocks * BT * c->kv_dim;
  c->k = xmalloc(n * sizeof(uint16_t));
  c->v = xmalloc(n * sizeof(uint16_t));
  for (size_t i = 0; i < n; i++)
    c->k[i] = c->v[i] = 0x7E00; /* NaN */
  for (int s = 0; s < n_seq; s++)
    for (int p = 0; p < lens[s]; p++) {
      size_t row = ((size_t)c->block_table[c->seq_off[s] + p / BT] * BT +
                    (size_t)(p % BT)) *
                   c->kv_dim;
      for (int i = 0; i < c->kv_dim; i++) {
        c->k[row + i] = f2h(rnd_normal());
        c->v[row + i] = f2h(rnd_uni());
      }
    }
  c->scale = 1.0f / sqrtf((float)hd);
}

typedef struct tok_run {
  int seq, pos0, count;
} tok_run;

/* The batch: runs of consecutive positions; q ~ N(0, 4), so that scores
 * have a standard deviation of about 2 (a peaked softmax, as trained models
 * have). */
static void attn_case_tokens(attn_case *c, const tok_run *runs, int n_runs) {
  free(c->tok_seq);
  free(c->tok_pos);
  free(c->q);
  c->n_tok = 0;
  for (int r = 0; r < n_runs; r++)
    c->n_tok += runs[r].count;
  c->tok_seq = xmalloc(sizeof(int32_t) * c->n_tok);
  c->tok_pos = xmalloc(sizeof(int32_t) * c->n_tok);
  c->max_len = 0;
  int t = 0;
  for (int r = 0; r < n_runs; r++)
    for (int i = 0; i < runs[r].count; i++, t++) {
      c->tok_seq[t] = runs[r].seq;
      c->tok_pos[t] = runs[r].pos0 + i;
      if (c->tok_pos[t] + 1 > c->max_len)
        c->max_len = c->tok_pos[t] + 1;
    }
  size_t nq = (size_t)c->n_tok * c->n_head * c->hd;
  c->q = xmalloc(nq * sizeof(float));
  for (size_t i = 0; i < nq; i++)
    c->q[i] = 2.0f * rnd_normal();
}

static void attn_case_free(attn_case *c) {
  free(c->block_table);
  free(c->k);
  free(c->v);
  free(c->tok_seq);
  free(c->tok_pos);
  free(c->q);
}

/* out (n_tok, n_head * hd) by sl_kern_attn_f16_paged per (token, head). */
static void attn_ref_cpu(const attn_case *c, float *out) {
  const int g = c->n_head / c->n_head_kv;
  int max_blk = (c->max_len + BT - 1) / BT;
  const uint16_t **kb = xmalloc(sizeof(*kb) * max_blk);
  const uint16_t **vb = xmalloc(sizeof(*vb) * max_blk);
  float *scratch = xmalloc(sizeof(float) * (size_t)(c->max_len + 32));
  for (int t = 0; t < c->n_tok; t++) {
    int s = c->tok_seq[t], len = c->tok_pos[t] + 1;
    for (int h = 0; h < c->n_head; h++) {
      int kvh = h / g;
      for (int b = 0; b < (len + BT - 1) / BT; b++) {
        size_t off =
            (size_t)c->block_table[c->seq_off[s] + b] * BT * c->kv_dim +
            (size_t)kvh * c->hd;
        kb[b] = c->k + off;
        vb[b] = c->v + off;
      }
      size_t qo = ((size_t)t * c->n_head + h) * c->hd;
      sl_status st = sl_kern_attn_f16_paged(out + qo, c->q + qo, kb, vb,
                                            BT_SHIFT, c->hd, len, c->kv_dim,
                                            c->scale, c->n_tok == 1, scratch);
      if (st != SL_OK) {
        fprintf(stderr, "sl_kern_attn_f16_paged: %s\n", sl_status_str(st));
        exit(1);
      }
    }
  }
  free(kb);
  free(vb);
  free(scratch);
}

/* The same in float64, q and probabilities unrounded: what the GPU computes
 * up to float rounding. */
static void attn_ref_f64(const attn_case *c, float *out) {
  const int g = c->n_head / c->n_head_kv;
  double *sc = xmalloc(sizeof(double) * (size_t)c->max_len);
  double *acc = xmalloc(sizeof(double) * (size_t)c->hd);
  for (int t = 0; t < c->n_tok; t++) {
    int s = c->tok_seq[t], len = c->tok_pos[t] + 1;
    for (int h = 0; h < c->n_head; h++) {
      int kvh = h / g;
      const float *q = c->q + ((size_t)t * c->n_head + h) * c->hd;
      double mx = -INFINITY;
      for (int p = 0; p < len; p++) {
        const uint16_t *kr =
            c->k +
            ((size_t)c->block_table[c->seq_off[s] + p / BT] * BT + p % BT) *
                c->kv_dim +
            (size_t)kvh * c->hd;
        float kf[256];
        sl_kern_dequant_row(SL_GGML_F16, kr, kf, c->hd);
        double d = 0;
        for (int i = 0; i < c->hd; i++)
          d += (double)q[i] * kf[i];
        sc[p] = d * c->scale;
        mx = fmax(mx, sc[p]);
      }
      double sum = 0;
      for (int i = 0; i < c->hd; i++)
        acc[i] = 0;
      for (int p = 0; p < len; p++) {
        double e = exp(sc[p] - mx);
        sum += e;
        const uint16_t *vr =
            c->v +
            ((size_t)c->block_table[c->seq_off[s] + p / BT] * BT + p % BT) *
                c->kv_dim +
            (size_t)kvh * c->hd;
        float vf[256];
        sl_kern_dequant_row(SL_GGML_F16, vr, vf, c->hd);
        for (int i = 0; i < c->hd; i++)
          acc[i] += e * vf[i];
      }
      float *o = out + ((size_t)t * c->n_head + h) * c->hd;
      for (int i = 0; i < c->hd; i++)
        o[i] = (float)(acc[i] / sum);
    }
  }
  free(sc);
  free(acc);
}

/* The configurations the attention test covers: head_dim 64, 96 (lanes of
 * 3 elements: the unvectorized loads), 128 and 256; GQA groups 1, 3, 4 and 8
 * (8 with head_dim 256 takes two head chunks per KV head). */
typedef struct attn_cfg {
  int hd, n_head, n_head_kv;
} attn_cfg;

static const attn_cfg k_cfgs[] = {
    {64, 4, 4},  {64, 6, 2},  {64, 8, 2}, {128, 4, 4},
    {128, 6, 2}, {128, 8, 2}, {96, 6, 2}, {256, 16, 2},
};
static const int k_lens[] = {1, 17, 300, 5000};

/* The batches: decode (one token per sequence, its last position); prefill
 * chunks at pos0 > 0 from two sequences plus a whole short prompt; a short
 * batch (max_len 17: one split). */
static const tok_run k_decode[] = {
    {0, 0, 1}, {1, 16, 1}, {2, 299, 1}, {3, 4999, 1}};
static const tok_run k_prefill[] = {{3, 4900, 100}, {2, 250, 50}, {1, 0, 17}};
static const tok_run k_short[] = {{0, 0, 1}, {1, 0, 17}};

/* Tolerances. GPU vs float64: the GPU differs only by float rounding (dot
 * products of <= 256 terms, exp2f within 2 ulp, sums of <= 5000 terms split
 * over warps and splits): a few 1e-6 of the row's largest value; 1e-4
 * leaves margin and still fails a dropped or an extra position (one of 5000
 * positions moves the output by ~1/5000 of its spread, > 1e-2 of its
 * maximum). GPU vs the CPU kernel: the CPU rounds q and the probabilities to
 * f16 (relative 2^-11 each), which moves scores of magnitude ~2-6 by up to
 * ~1e-3 and the output by as much relative to its largest value; 4e-3
 * (`--host-check` measures the CPU's own distance to float64: < 1.5e-3 on
 * these inputs, 1.3e-3 when written). */
#define ATTN_TOL_F64 1e-4
#define ATTN_TOL_CPU 4e-3

static int host_check(void) {
  double worst = 0;
  for (size_t ci = 0; ci < sizeof k_cfgs / sizeof k_cfgs[0]; ci++) {
    attn_case c;
    attn_case_init(&c, k_cfgs[ci].hd, k_cfgs[ci].n_head, k_cfgs[ci].n_head_kv,
                   k_lens, 4);
    const tok_run *batches[] = {k_decode, k_prefill, k_short};
    const int nb[] = {4, 3, 2};
    for (int b = 0; b < 3; b++) {
      attn_case_tokens(&c, batches[b], nb[b]);
      size_t n = (size_t)c.n_tok * c.n_head * c.hd;
      float *r1 = xmalloc(n * sizeof(float)), *r2 = xmalloc(n * sizeof(float));
      attn_ref_cpu(&c, r1);
      attn_ref_f64(&c, r2);
      double e = row_rel_err(r1, r2, (int64_t)c.n_tok * c.n_head, c.hd, 1e-6);
      printf("hd %d heads %d/%d batch %d: cpu vs f64 %.3g\n", c.hd, c.n_head,
             c.n_head_kv, b, e);
      worst = fmax(worst, e);
      free(r1);
      free(r2);
    }
    attn_case_free(&c);
  }
  printf("worst %.3g (tolerance GPU vs CPU %.3g)\n", worst, ATTN_TOL_CPU);
  return worst < ATTN_TOL_CPU / 2 ? 0 : 1;
}

#ifdef SLUICE_HAVE_CUDA

static cudaStream_t g_stream;

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) {
    fprintf(stderr, "cudaMalloc(%zu) failed\n", bytes);
    exit(1);
  }
  return p;
}

/* cudaMemcpy from pageable memory returns once the bytes are staged, not
 * once they land, and the kernels run on a non-blocking stream that does not
 * wait for the legacy stream: a kernel could read the buffer before the copy
 * reached it (seen on the H200: a fixed set of rows came back NaN in one run
 * of three). Every host-to-device copy goes on the kernels' stream and is
 * waited for. */
static cudaError_t h2d(void *dst, const void *src, size_t n) {
  cudaError_t e =
      cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, g_stream);
  return e == cudaSuccess ? cudaStreamSynchronize(g_stream) : e;
}

static void *dev_upload(const void *src, size_t bytes) {
  void *p = dev_alloc(bytes);
  if (bytes && h2d(p, src, bytes) != cudaSuccess) {
    fprintf(stderr, "cudaMemcpy failed\n");
    exit(1);
  }
  return p;
}

static void download(void *dst, const void *src, size_t bytes) {
  CHECK(cudaStreamSynchronize(g_stream) == cudaSuccess);
  CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
}

static void dev_free(void *p) {
  cudaFree(p);
}

static float *rnd_vec(int64_t n, float amp) {
  float *x = xmalloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    x[i] = amp * rnd_uni();
  return x;
}

/* ---- rmsnorm ----------------------------------------------------------------
 */

/* Per element: the GPU's only difference is the float sum of squares (the
 * CPU sums in double), whose relative error over <= 5000 terms, summed by
 * 256 threads then a tree, stays below ~1e-6; the 1/sqrt halves it. A mean
 * over width - 1, or a dropped eps (1e-5 against a mean of ~1/3), errs by
 * > 1.5e-5. */
static void test_rmsnorm(void) {
  const int64_t widths[] = {64, 128, 576, 1024, 1025, 4096, 4099, 8192};
  const int64_t rows_of[] = {1, 7, 64};
  for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
    for (size_t ri = 0; ri < 3; ri++)
      for (int use_w = 0; use_w < 2; use_w++) {
        int64_t W = widths[wi], R = rows_of[ri], n = W * R;
        float *x = rnd_vec(n, 1.0f), *w = rnd_vec(W, 2.0f);
        float *ref = xmalloc(sizeof(float) * n),
              *got = xmalloc(sizeof(float) * n);
        for (int64_t r = 0; r < R; r++)
          sl_kern_rmsnorm(ref + r * W, x + r * W, use_w ? w : NULL, W, 1e-5f);
        float *dx = dev_upload(x, sizeof(float) * n);
        float *dw = dev_upload(w, sizeof(float) * W);
        float *dy = dev_alloc(sizeof(float) * n);
        /* in place on odd configurations (y may equal x) */
        bool inplace = (wi + ri) % 2 == 1;
        CHECK_OK(sl_kcu_rmsnorm(g_stream, inplace ? dx : dy, dx,
                                use_w ? dw : NULL, R, W, 1e-5f));
        download(got, inplace ? dx : dy, sizeof(float) * n);
        double worst = 0;
        for (int64_t i = 0; i < n; i++) {
          double e = fabs(got[i] - ref[i]) / (fabs(ref[i]) + 1e-30);
          worst = isnan(got[i]) ? INFINITY : fmax(worst, e);
        }
        CHECK_MSG(worst <= 2e-6, "width %lld rows %lld w %d: rel err %.3g",
                  (long long)W, (long long)R, use_w, worst);
        dev_free(dx);
        dev_free(dw);
        dev_free(dy);
        free(x);
        free(w);
        free(ref);
        free(got);
      }
  CHECK(sl_kcu_rmsnorm(g_stream, NULL, NULL, NULL, 1, 0, 1e-5f) ==
        SL_ERR_INVALID_ARG);
}

/* ---- add, add_bias, swiglu ------------------------------------------------
 */

/* add and add_bias are single IEEE additions: equal bit for bit. swiglu:
 * exp within 2 ulp on either side (CUDA expf; the CPU's AVX2 exp256), then
 * an add, a division and a product, rounded on both: under ~9e-7 relative
 * in the worst case; 2e-6 (plus 1e-30 for zeros). Another formula (silu
 * of u, a sign off, y = g * u) fails it by O(1). Sizes include
 * odd lengths and pointers 4 bytes off 16-byte alignment (the scalar
 * paths). */
static void test_elementwise(void) {
  const int64_t sizes[] = {1, 3, 1000, 4096, 100003};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
    for (int off = 0; off < 2; off++) {
      int64_t n = sizes[si];
      float *a = rnd_vec(n, 8.0f), *b = rnd_vec(n, 8.0f);
      float *ref = xmalloc(sizeof(float) * n),
            *got = xmalloc(sizeof(float) * n);
      float *da = dev_alloc(sizeof(float) * (n + 1)),
            *db = dev_alloc(sizeof(float) * (n + 1)),
            *dy = dev_alloc(sizeof(float) * (n + 1));
      CHECK(h2d(da + off, a, sizeof(float) * n) == cudaSuccess);
      CHECK(h2d(db + off, b, sizeof(float) * n) == cudaSuccess);

      sl_kern_add(ref, a, b, n);
      CHECK_OK(sl_kcu_add(g_stream, dy + off, da + off, db + off, n));
      download(got, dy + off, sizeof(float) * n);
      CHECK_MSG(memcmp(got, ref, sizeof(float) * n) == 0, "add n %lld",
                (long long)n);

      sl_kern_swiglu(ref, a, b, n);
      /* y aliases g */
      CHECK_OK(sl_kcu_swiglu(g_stream, da + off, da + off, db + off, n));
      download(got, da + off, sizeof(float) * n);
      double worst = 0;
      for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]) / (fabs(ref[i]) + 1e-30);
        worst = isnan(got[i]) ? INFINITY : fmax(worst, e);
      }
      CHECK_MSG(worst <= 2e-6, "swiglu n %lld: rel err %.3g", (long long)n,
                worst);
      dev_free(da);
      dev_free(db);
      dev_free(dy);
      free(a);
      free(b);
      free(ref);
      free(got);
    }

  const int64_t shapes[][2] = {{1, 1}, {5, 96}, {64, 896}, {3, 4099}};
  for (size_t si = 0; si < 4; si++) {
    int64_t R = shapes[si][0], W = shapes[si][1], n = R * W;
    float *y = rnd_vec(n, 4.0f), *bias = rnd_vec(W, 4.0f);
    float *ref = xmalloc(sizeof(float) * n), *got = xmalloc(sizeof(float) * n);
    for (int64_t r = 0; r < R; r++)
      sl_kern_add(ref + r * W, y + r * W, bias, W);
    float *dy = dev_upload(y, sizeof(float) * n),
          *db = dev_upload(bias, sizeof(float) * W);
    CHECK_OK(sl_kcu_add_bias(g_stream, dy, db, R, W));
    download(got, dy, sizeof(float) * n);
    CHECK_MSG(memcmp(got, ref, sizeof(float) * n) == 0, "add_bias %lld x %lld",
              (long long)R, (long long)W);
    dev_free(dy);
    dev_free(db);
    free(y);
    free(bias);
    free(ref);
    free(got);
  }
}

/* ---- rope -------------------------------------------------------------------
 */

/* The angle is the CPU's float for float (same theta_scale from the host's
 * powf, the same chain of products); sinf/cosf may differ by ~3 ulp
 * together (CUDA 2, glibc 1), so each output moves by at most ~4e-7 of
 * |x0| + |x1|, plus the fma rounding: 2e-6 of the head's largest input.
 * Using the wrong pairs, mode, base or an angle one step off the chain errs
 * by O(1). Dims past n_rot must come back unchanged. */
static void test_rope(void) {
  const int32_t pos[] = {0, 1, 17, 4097, 65535, 100000};
  const int n_tok = 6, n_head = 3;
  const int shapes[][2] = {{128, 128}, {128, 64}, {64, 64}, {64, 32}, {96, 40}};
  const float bases[] = {10000.0f, 500000.0f};
  const float scales[] = {1.0f, 0.25f};
  for (int si = 0; si < 5; si++)
    for (int mode = 0; mode <= 2; mode += 2)
      for (int bi = 0; bi < 2; bi++) {
        int hd = shapes[si][0], n_rot = shapes[si][1];
        float base = bases[bi], scale = scales[bi];
        int64_t n = (int64_t)n_tok * n_head * hd;
        float *x = rnd_vec(n, 3.0f);
        float *ref = xmalloc(sizeof(float) * n),
              *got = xmalloc(sizeof(float) * n);
        memcpy(ref, x, sizeof(float) * n);
        for (int t = 0; t < n_tok; t++)
          CHECK_OK(sl_kern_rope(ref + (int64_t)t * n_head * hd, n_head, hd,
                                n_rot, pos[t], base, scale,
                                (sl_kern_rope_mode)mode));
        float *dx = dev_upload(x, sizeof(float) * n);
        int32_t *dpos = dev_upload(pos, sizeof pos);
        CHECK_OK(sl_kcu_rope(g_stream, dx, dpos, n_tok, n_head, hd, n_rot, base,
                             scale, mode));
        download(got, dx, sizeof(float) * n);
        double worst = 0;
        bool tail_same = true;
        for (int64_t r = 0; r < (int64_t)n_tok * n_head; r++) {
          double mx = 0, err = 0;
          for (int i = 0; i < hd; i++) {
            mx = fmax(mx, fabs(x[r * hd + i]));
            double e = fabs(got[r * hd + i] - ref[r * hd + i]);
            err = isnan(got[r * hd + i]) ? INFINITY : fmax(err, e);
            if (i >= n_rot && got[r * hd + i] != x[r * hd + i])
              tail_same = false;
          }
          worst = fmax(worst, err / mx);
        }
        CHECK_MSG(worst <= 2e-6, "hd %d n_rot %d mode %d base %g: %.3g", hd,
                  n_rot, mode, base, worst);
        CHECK(tail_same);
        dev_free(dx);
        dev_free(dpos);
        free(x);
        free(ref);
        free(got);
      }
  CHECK(sl_kcu_rope(g_stream, NULL, NULL, 1, 1, 64, 33, 1e4f, 1.0f, 0) ==
        SL_ERR_INVALID_ARG);
}

/* ---- kv_store ---------------------------------------------------------------
 */

/* f16 round to nearest even on both sides: equal bit for bit, values past
 * the f16 range included (inf). Rows of slots not written stay as they
 * were. kv_dim 6 takes the unvectorized path. */
static void test_kv_store(void) {
  const int dims[] = {6, 256, 1024};
  for (int di = 0; di < 3; di++) {
    const int kv_dim = dims[di], n_slots = 64, n_tok = 20;
    size_t n_cache = (size_t)n_slots * kv_dim;
    float *k = rnd_vec((int64_t)n_tok * kv_dim, 4.0f),
          *v = rnd_vec((int64_t)n_tok * kv_dim, 4.0f);
    k[3] = 70000.0f;           /* past the f16 range: inf */
    v[1] = 1.0f + 1.0f / 2048; /* a tie: rounds to even (1.0) */
    int32_t slot[20];
    for (int t = 0; t < n_tok; t++)
      slot[t] = (t * 37 + 5) % n_slots; /* distinct, scattered */
    uint16_t *kc = xmalloc(n_cache * 2), *vc = xmalloc(n_cache * 2);
    for (size_t i = 0; i < n_cache; i++)
      kc[i] = vc[i] = 0x1234;
    uint16_t *dk = dev_upload(kc, n_cache * 2),
             *dv = dev_upload(vc, n_cache * 2);
    for (int t = 0; t < n_tok; t++) {
      sl_kern_f32_to_f16(kc + (size_t)slot[t] * kv_dim, k + t * kv_dim, kv_dim);
      sl_kern_f32_to_f16(vc + (size_t)slot[t] * kv_dim, v + t * kv_dim, kv_dim);
    }
    float *dkf = dev_upload(k, sizeof(float) * n_tok * kv_dim),
          *dvf = dev_upload(v, sizeof(float) * n_tok * kv_dim);
    int32_t *dslot = dev_upload(slot, sizeof slot);
    CHECK_OK(sl_kcu_kv_store(g_stream, dk, dv, dkf, dvf, dslot, n_tok, kv_dim));
    uint16_t *gk = xmalloc(n_cache * 2), *gv = xmalloc(n_cache * 2);
    download(gk, dk, n_cache * 2);
    download(gv, dv, n_cache * 2);
    CHECK_MSG(memcmp(gk, kc, n_cache * 2) == 0, "K kv_dim %d", kv_dim);
    CHECK_MSG(memcmp(gv, vc, n_cache * 2) == 0, "V kv_dim %d", kv_dim);
    dev_free(dk);
    dev_free(dv);
    dev_free(dkf);
    dev_free(dvf);
    dev_free(dslot);
    free(k);
    free(v);
    free(kc);
    free(vc);
    free(gk);
    free(gv);
  }
}

/* ---- fused: add_rmsnorm, rope_kv_store -------------------------------------
 */

/* add_rmsnorm against the CPU's add then rmsnorm: x bit for bit (one IEEE
 * addition), y within rmsnorm's 2e-6 (only the order of the sum of squares
 * differs), with y aliasing d (as the forward pass calls it) and not; widths
 * on the one-float4-a-thread path (576, 4096), the four-a-thread one
 * (8192, 16384) and the two-launch fallback (4099). A dropped add, a norm
 * of the old x, or a missing weight fails it by O(1). */
/* sl_kcu_kv_blocks: a gather of n pool blocks into the staging layout (for
 * each block, for each layer, K span then V span) equals the CPU's index
 * arithmetic (sl_kv_view_k_offset) bit for bit; the scatter of another
 * staging buffer writes exactly those spans and nothing else. Aligned
 * (uint4) and unaligned (u16) span widths; bad block ids refused. */
static void test_kv_blocks(void) {
  const int n_layer = 3, n_blocks = 10;
  const size_t spans[] = {16 * 64, 3 * 5}; /* 2 KiB; 30 bytes */
  for (size_t si = 0; si < 2; si++) {
    size_t span = spans[si];
    size_t half = (size_t)n_layer * n_blocks * span, total = 2 * half;
    uint16_t *pool = xmalloc(total * 2);
    for (size_t i = 0; i < total; i++)
      pool[i] = (uint16_t)rnd_u64();
    const int blocks[] = {7, 0, 9, 3};
    const int n = 4;
    size_t st_elems = (size_t)n * n_layer * 2 * span;
    uint16_t *ref = xmalloc(st_elems * 2), *got = xmalloc(st_elems * 2);
    for (int i = 0; i < n; i++)
      for (int l = 0; l < n_layer; l++)
        for (int h = 0; h < 2; h++) {
          size_t off = (size_t)h * half +
                       ((size_t)l * n_blocks + (size_t)blocks[i]) * span;
          memcpy(ref + (((size_t)i * n_layer + l) * 2 + h) * span, pool + off,
                 span * 2);
        }
    uint16_t *dpool = dev_upload(pool, total * 2);
    uint16_t *dst = dev_alloc(st_elems * 2);
    CHECK_OK(sl_kcu_kv_blocks(g_stream, dpool, n_layer, n_blocks, span, blocks,
                              n, dst, true));
    download(got, dst, st_elems * 2);
    CHECK_MSG(!memcmp(got, ref, st_elems * 2), "gather differs (span %zu)",
              span);
    /* scatter new values into the same blocks */
    for (size_t i = 0; i < st_elems; i++)
      ref[i] = (uint16_t)rnd_u64();
    CHECK(h2d(dst, ref, st_elems * 2) == cudaSuccess);
    CHECK_OK(sl_kcu_kv_blocks(g_stream, dpool, n_layer, n_blocks, span, blocks,
                              n, dst, false));
    uint16_t *after = xmalloc(total * 2);
    download(after, dpool, total * 2);
    for (int i = 0; i < n; i++)
      for (int l = 0; l < n_layer; l++)
        for (int h = 0; h < 2; h++) {
          size_t off = (size_t)h * half +
                       ((size_t)l * n_blocks + (size_t)blocks[i]) * span;
          memcpy(pool + off, ref + (((size_t)i * n_layer + l) * 2 + h) * span,
                 span * 2);
        }
    CHECK_MSG(!memcmp(after, pool, total * 2),
              "scatter differs or wrote elsewhere (span %zu)", span);
    const int bad[] = {10};
    CHECK(sl_kcu_kv_blocks(g_stream, dpool, n_layer, n_blocks, span, bad, 1,
                           dst, true) == SL_ERR_INVALID_ARG);
    dev_free(dpool);
    dev_free(dst);
    free(pool);
    free(ref);
    free(got);
    free(after);
  }
}

static void test_add_rmsnorm(void) {
  const int64_t widths[] = {576, 4096, 4099, 8192, 16384};
  const int64_t rows_of[] = {1, 5};
  for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
    for (size_t ri = 0; ri < 2; ri++)
      for (int alias = 0; alias < 2; alias++) {
        int64_t W = widths[wi], R = rows_of[ri], n = W * R;
        float *x = rnd_vec(n, 1.0f), *d = rnd_vec(n, 1.0f),
              *w = rnd_vec(W, 2.0f);
        float *xs = xmalloc(sizeof(float) * n),
              *ref = xmalloc(sizeof(float) * n),
              *got = xmalloc(sizeof(float) * n),
              *gotx = xmalloc(sizeof(float) * n);
        sl_kern_add(xs, x, d, n);
        for (int64_t r = 0; r < R; r++)
          sl_kern_rmsnorm(ref + r * W, xs + r * W, w, W, 1e-5f);
        float *dx = dev_upload(x, sizeof(float) * n),
              *dd = dev_upload(d, sizeof(float) * n),
              *dw = dev_upload(w, sizeof(float) * W);
        float *dy = alias ? dd : dev_alloc(sizeof(float) * n);
        CHECK_OK(sl_kcu_add_rmsnorm(g_stream, dx, dy, dd, dw, R, W, 1e-5f));
        download(got, dy, sizeof(float) * n);
        download(gotx, dx, sizeof(float) * n);
        CHECK_MSG(memcmp(gotx, xs, sizeof(float) * n) == 0,
                  "width %lld: x += d not exact", (long long)W);
        double worst = 0;
        for (int64_t i = 0; i < n; i++) {
          double e = fabs(got[i] - ref[i]) / (fabs(ref[i]) + 1e-30);
          worst = isnan(got[i]) ? INFINITY : fmax(worst, e);
        }
        CHECK_MSG(worst <= 2e-6, "width %lld rows %lld alias %d: rel err %.3g",
                  (long long)W, (long long)R, alias, worst);
        dev_free(dx);
        dev_free(dd);
        dev_free(dw);
        if (!alias)
          dev_free(dy);
        free(x);
        free(d);
        free(w);
        free(xs);
        free(ref);
        free(got);
        free(gotx);
      }
  CHECK(sl_kcu_add_rmsnorm(g_stream, NULL, NULL, NULL, NULL, 1, 8, 1e-5f) ==
        SL_ERR_INVALID_ARG);
}

/* rope_kv_store against the three launches it replaces, on the GPU: q, k
 * and both cache halves bit for bit (the same arithmetic), both layouts, a
 * partial rotation, GQA (2 KV heads for 6) and a padding token (slot -1,
 * nothing stored). A rotation of k after the store, or of q with k's head
 * count, fails it. */
static void test_rope_kv_store(void) {
  const int32_t pos[] = {0, 3, 17, 4097, 900};
  const int32_t slot[] = {9, 2, -1, 30, 17};
  const int n_tok = 5, n_head = 6, n_kv = 2, n_slots = 32;
  const int shapes[][2] = {{128, 128}, {64, 32}};
  for (int si = 0; si < 2; si++)
    for (int mode = 0; mode <= 2; mode += 2) {
      const int hd = shapes[si][0], n_rot = shapes[si][1], kvd = n_kv * hd;
      const int64_t nq = (int64_t)n_tok * n_head * hd,
                    nk = (int64_t)n_tok * kvd;
      const size_t nc = (size_t)n_slots * kvd;
      float *q = rnd_vec(nq, 3.0f), *k = rnd_vec(nk, 3.0f),
            *v = rnd_vec(nk, 3.0f);
      uint16_t *c0 = xmalloc(nc * 2);
      for (size_t i = 0; i < nc; i++)
        c0[i] = 0x1234;
      float *dq[2], *dk[2], *dv = dev_upload(v, sizeof(float) * nk);
      uint16_t *kc[2], *vc[2];
      for (int r = 0; r < 2; r++) {
        dq[r] = dev_upload(q, sizeof(float) * nq);
        dk[r] = dev_upload(k, sizeof(float) * nk);
        kc[r] = dev_upload(c0, nc * 2);
        vc[r] = dev_upload(c0, nc * 2);
      }
      int32_t *dpos = dev_upload(pos, sizeof pos),
              *dslot = dev_upload(slot, sizeof slot);
      CHECK_OK(sl_kcu_rope(g_stream, dq[0], dpos, n_tok, n_head, hd, n_rot,
                           1e4f, 1.0f, mode));
      CHECK_OK(sl_kcu_rope(g_stream, dk[0], dpos, n_tok, n_kv, hd, n_rot, 1e4f,
                           1.0f, mode));
      CHECK_OK(sl_kcu_kv_store(g_stream, kc[0], vc[0], dk[0], dv, dslot, n_tok,
                               kvd));
      CHECK_OK(sl_kcu_rope_kv_store(g_stream, dq[1], dk[1], dv, dpos, dslot,
                                    n_tok, n_head, n_kv, hd, n_rot, 1e4f, 1.0f,
                                    mode, kc[1], vc[1]));
      float *hq[2], *hk[2];
      uint16_t *hkc[2], *hvc[2];
      for (int r = 0; r < 2; r++) {
        hq[r] = xmalloc(sizeof(float) * nq);
        hk[r] = xmalloc(sizeof(float) * nk);
        hkc[r] = xmalloc(nc * 2);
        hvc[r] = xmalloc(nc * 2);
        download(hq[r], dq[r], sizeof(float) * nq);
        download(hk[r], dk[r], sizeof(float) * nk);
        download(hkc[r], kc[r], nc * 2);
        download(hvc[r], vc[r], nc * 2);
      }
      CHECK_MSG(memcmp(hq[0], hq[1], sizeof(float) * nq) == 0,
                "q hd %d mode %d", hd, mode);
      CHECK_MSG(memcmp(hk[0], hk[1], sizeof(float) * nk) == 0,
                "k hd %d mode %d", hd, mode);
      CHECK_MSG(memcmp(hkc[0], hkc[1], nc * 2) == 0, "K cache hd %d mode %d",
                hd, mode);
      CHECK_MSG(memcmp(hvc[0], hvc[1], nc * 2) == 0, "V cache hd %d mode %d",
                hd, mode);
      CHECK(memcmp(hq[0], q, sizeof(float) * nq) != 0); /* it did rotate */
      for (int r = 0; r < 2; r++) {
        dev_free(dq[r]);
        dev_free(dk[r]);
        dev_free(kc[r]);
        dev_free(vc[r]);
        free(hq[r]);
        free(hk[r]);
        free(hkc[r]);
        free(hvc[r]);
      }
      dev_free(dv);
      dev_free(dpos);
      dev_free(dslot);
      free(q);
      free(k);
      free(v);
      free(c0);
    }
}

/* ---- attention -------------------------------------------------------------
 */

typedef struct attn_dev {
  uint16_t *k, *v;
  int32_t *block_table, *seq_off;
} attn_dev;

/* Runs c's batch on the GPU into out (host); returns the status and the
 * work bytes it was given. */
static sl_status attn_gpu(const attn_case *c, const attn_dev *d, float *out,
                          int n_split_tok, size_t *work_bytes) {
  size_t nq = (size_t)c->n_tok * c->n_head * c->hd;
  float *dq = dev_upload(c->q, nq * sizeof(float));
  float *dout = dev_alloc(nq * sizeof(float));
  int32_t *dseq = dev_upload(c->tok_seq, sizeof(int32_t) * c->n_tok);
  int32_t *dpos = dev_upload(c->tok_pos, sizeof(int32_t) * c->n_tok);
  size_t wb = n_split_tok ? sl_kcu_attn_work_bytes(n_split_tok, c->n_head,
                                                   c->hd, c->max_len)
                          : 0;
  void *work = wb ? dev_alloc(wb) : NULL;
  /* NaN in out: a row the kernel never writes fails the comparison */
  CHECK(cudaMemset(dout, 0xff, nq * sizeof(float)) == cudaSuccess);
  sl_kcu_attn a = {
      .q = dq,
      .out = dout,
      .k_layer = d->k,
      .v_layer = d->v,
      .block_table = d->block_table,
      .seq_blk_off = d->seq_off,
      .tok_seq = dseq,
      .tok_pos = dpos,
      .n_tok = c->n_tok,
      .n_head = c->n_head,
      .n_head_kv = c->n_head_kv,
      .head_dim = c->hd,
      .kv_dim = c->kv_dim,
      .block_tokens = BT,
      .max_len = c->max_len,
      .n_split_tok = n_split_tok,
      .scale = c->scale,
      .work = work,
      .work_bytes = wb,
  };
  sl_status st = sl_kcu_attention(g_stream, &a);
  download(out, dout, nq * sizeof(float));
  if (wb) {
    /* too little work space is refused, not overrun */
    a.work_bytes = wb - 1;
    CHECK(sl_kcu_attention(g_stream, &a) == SL_ERR_INVALID_ARG);
  }
  dev_free(dq);
  dev_free(dout);
  dev_free(dseq);
  dev_free(dpos);
  if (work)
    dev_free(work);
  *work_bytes = wb;
  return st;
}

static void test_attention(void) {
  for (size_t ci = 0; ci < sizeof k_cfgs / sizeof k_cfgs[0]; ci++) {
    attn_case c;
    attn_case_init(&c, k_cfgs[ci].hd, k_cfgs[ci].n_head, k_cfgs[ci].n_head_kv,
                   k_lens, 4);
    size_t nc = (size_t)c.n_blocks * BT * c.kv_dim * sizeof(uint16_t);
    int32_t used = c.seq_off[3] + (c.lens[3] + BT - 1) / BT;
    attn_dev d = {
        .k = dev_upload(c.k, nc),
        .v = dev_upload(c.v, nc),
        .block_table = dev_upload(c.block_table, sizeof(int32_t) * used),
        .seq_off = dev_upload(c.seq_off, sizeof(int32_t) * 4),
    };
    const tok_run *batches[] = {k_decode, k_prefill, k_short};
    const char *names[] = {"decode", "prefill", "short"};
    const int nb[] = {4, 3, 2};
    for (int b = 0; b < 3; b++) {
      attn_case_tokens(&c, batches[b], nb[b]);
      size_t n = (size_t)c.n_tok * c.n_head * c.hd;
      float *got = xmalloc(n * sizeof(float)), *rc = xmalloc(n * sizeof(float)),
            *rd = xmalloc(n * sizeof(float));
      attn_ref_cpu(&c, rc);
      attn_ref_f64(&c, rd);
      int64_t rows = (int64_t)c.n_tok * c.n_head;
      /* every batch both unsplit (prompt tokens) and split (decode) */
      for (int sp = 0; sp < 2; sp++) {
        size_t wb = 0;
        CHECK_OK(attn_gpu(&c, &d, got, sp ? c.n_tok : 0, &wb));
        double e_cpu = row_rel_err(got, rc, rows, c.hd, 1e-6);
        double e_f64 = row_rel_err(got, rd, rows, c.hd, 1e-6);
        fprintf(stderr,
                "   hd %3d heads %2d/%d %-7s %s n_tok %3d work %8zu B: vs cpu "
                "%.2e, vs f64 %.2e\n",
                c.hd, c.n_head, c.n_head_kv, names[b],
                sp ? "split  " : "unsplit", c.n_tok, wb, e_cpu, e_f64);
        CHECK_MSG(e_cpu <= ATTN_TOL_CPU, "%s hd %d: vs cpu %.3g", names[b],
                  c.hd, e_cpu);
        CHECK_MSG(e_f64 <= ATTN_TOL_F64, "%s hd %d: vs f64 %.3g", names[b],
                  c.hd, e_f64);
        /* split tokens longer than one chunk take the split path */
        CHECK(sp && c.max_len > SL_KCU_ATTN_CHUNK ? wb > 0 : wb == 0);
      }
      /* batch invariance: a token that is not the batch's longest (seq 2,
       * 300 positions, next to one of 5000), alone and split, gives its
       * row of the batch bit for bit */
      if (b == 0) {
        size_t wb = 0;
        CHECK_OK(attn_gpu(&c, &d, got, c.n_tok, &wb));
        const int ti = c.n_tok - 2;
        attn_case one = c;
        one.n_tok = 1;
        one.tok_seq += ti;
        one.tok_pos += ti;
        one.q += (size_t)ti * c.n_head * c.hd;
        one.max_len = one.tok_pos[0] + 1;
        CHECK(one.max_len < c.max_len);
        float *alone = xmalloc(sizeof(float) * c.n_head * c.hd);
        CHECK_OK(attn_gpu(&one, &d, alone, 1, &wb));
        CHECK_MSG(!memcmp(alone, got + (size_t)ti * c.n_head * c.hd,
                          sizeof(float) * c.n_head * c.hd),
                  "hd %d: a token alone differs from its row in the batch",
                  c.hd);
        free(alone);
      }
      free(got);
      free(rc);
      free(rd);
    }
    dev_free(d.k);
    dev_free(d.v);
    dev_free(d.block_table);
    dev_free(d.seq_off);
    attn_case_free(&c);
  }

  /* head_dim not a multiple of 32, or past 256: refused */
  sl_kcu_attn bad = {.n_tok = 1, .n_head = 1, .n_head_kv = 1, .head_dim = 48};
  CHECK(sl_kcu_attention(g_stream, &bad) == SL_ERR_INVALID_ARG);
}

/* ---- argmax -----------------------------------------------------------------
 */

/* ids: exactly the CPU sampler's scan (the first maximum). logprob against
 * float64 log-softmax: the GPU sums exp(x - max) in float over up to 128k
 * terms (~125 per thread, then a tree): relative error < 1e-5, so logprob
 * within 5e-5 absolute. */
static void test_argmax(void) {
  const int64_t vocabs[] = {49152, 128256, 32001};
  for (int vi = 0; vi < 3; vi++) {
    const int64_t V = vocabs[vi];
    const int R = 6;
    const int off = vi == 2; /* unaligned rows: the scalar path */
    float *x = rnd_vec(R * V, 6.0f);
    /* row 1: a tie of the maximum at 777 and 40000; row 2: -inf entries and
     * the maximum last; row 3: all equal; row 4: -inf first, maximum at 1;
     * row 5: a sharp maximum (logprob near 0) */
    x[1 * V + 777] = x[1 * V + 40000 % V] = 50.0f;
    x[2 * V + 5] = x[2 * V + 6] = -INFINITY;
    x[2 * V + V - 1] = 9.0f;
    for (int64_t i = 0; i < V; i++)
      x[3 * V + i] = 0.5f;
    x[4 * V] = -INFINITY;
    x[4 * V + 1] = 7.0f;
    x[5 * V + 12345] = 100.0f;
    float *dx = dev_alloc(sizeof(float) * (R * V + 1));
    CHECK(h2d(dx + off, x, sizeof(float) * R * V) == cudaSuccess);
    int32_t *dids = dev_alloc(sizeof(int32_t) * R);
    float *dlp = dev_alloc(sizeof(float) * R);
    CHECK_OK(sl_kcu_argmax(g_stream, dx + off, R, V, dids, dlp));
    int32_t ids[6];
    float lp[6];
    download(ids, dids, sizeof ids);
    download(lp, dlp, sizeof lp);
    for (int r = 0; r < R; r++) {
      const float *xr = x + r * V;
      int64_t best = 0;
      for (int64_t i = 1; i < V; i++)
        if (xr[i] > xr[best])
          best = i;
      double sum = 0;
      for (int64_t i = 0; i < V; i++)
        sum += exp((double)xr[i] - xr[best]);
      double want = -log(sum);
      CHECK_MSG(ids[r] == best, "V %lld row %d: %d != %lld", (long long)V, r,
                ids[r], (long long)best);
      CHECK_MSG(fabs(lp[r] - want) <= 5e-5, "V %lld row %d: logprob %g vs %g",
                (long long)V, r, lp[r], want);
    }
    CHECK(ids[1] == 777);
    /* ids without logprob */
    CHECK(cudaMemset(dids, 0xff, sizeof ids) == cudaSuccess);
    CHECK_OK(sl_kcu_argmax(g_stream, dx + off, R, V, dids, NULL));
    int32_t ids2[6];
    download(ids2, dids, sizeof ids2);
    CHECK(memcmp(ids, ids2, sizeof ids) == 0);
    dev_free(dx);
    dev_free(dids);
    dev_free(dlp);
    free(x);
  }
}

/* ---- benchmark --------------------------------------------------------------
 */

/* Decode attention, 32 sequences x 4096 positions, 32 heads, 8 KV heads,
 * head_dim 128: KV bytes read per call over the time per call. Also a
 * prefill chunk of 512 tokens at positions 3584..4095 of one sequence. */
/* ---- PDL (src/kern/cuda/pdl.cuh) -------------------------------------------
 */

/* A kernel reads what the kernel before it wrote only after its pdl_wait():
 * x is zeros until a slow kernel (which lets the next one start at once)
 * copies the real input in 20 ms later; rmsnorm and add_rmsnorm must still
 * see the real input. Without the wait they read the zeros. */
static void test_pdl_order(void) {
  const int64_t W = 576, R = 3, n = W * R;
  float *x = rnd_vec(n, 1.0f), *d = rnd_vec(n, 1.0f), *w = rnd_vec(W, 2.0f);
  float *ref = xmalloc(sizeof(float) * n), *got = xmalloc(sizeof(float) * n);
  float *dsrc = dev_upload(x, sizeof(float) * n);
  float *dd = dev_upload(d, sizeof(float) * n);
  float *dw = dev_upload(w, sizeof(float) * W);
  float *dx = dev_alloc(sizeof(float) * n), *dy = dev_alloc(sizeof(float) * n);
  float *zero = calloc((size_t)n, sizeof(float));
  /* rmsnorm */
  for (int64_t r = 0; r < R; r++)
    sl_kern_rmsnorm(ref + r * W, x + r * W, w, W, 1e-5f);
  CHECK(h2d(dx, zero, sizeof(float) * n) == cudaSuccess);
  CHECK_OK(sl__kcu_test_slow_copy(g_stream, dx, dsrc, n, 20.0));
  CHECK_OK(sl_kcu_rmsnorm(g_stream, dy, dx, dw, R, W, 1e-5f));
  download(got, dy, sizeof(float) * n);
  double worst = 0;
  for (int64_t i = 0; i < n; i++)
    worst = fmax(worst, fabs(got[i] - ref[i]) / (fabs(ref[i]) + 1e-30));
  CHECK_MSG(worst <= 2e-6, "rmsnorm after a slow writer: rel err %.3g", worst);
  /* add_rmsnorm: x += d, y = rmsnorm(x) */
  float *xs = xmalloc(sizeof(float) * n);
  for (int64_t i = 0; i < n; i++)
    xs[i] = x[i] + d[i];
  for (int64_t r = 0; r < R; r++)
    sl_kern_rmsnorm(ref + r * W, xs + r * W, w, W, 1e-5f);
  CHECK(h2d(dx, zero, sizeof(float) * n) == cudaSuccess);
  CHECK_OK(sl__kcu_test_slow_copy(g_stream, dx, dsrc, n, 20.0));
  CHECK_OK(sl_kcu_add_rmsnorm(g_stream, dx, dy, dd, dw, R, W, 1e-5f));
  download(got, dy, sizeof(float) * n);
  worst = 0;
  for (int64_t i = 0; i < n; i++)
    worst = fmax(worst, fabs(got[i] - ref[i]) / (fabs(ref[i]) + 1e-30));
  CHECK_MSG(worst <= 2e-6, "add_rmsnorm after a slow writer: rel err %.3g",
            worst);
  dev_free(dsrc);
  dev_free(dd);
  dev_free(dw);
  dev_free(dx);
  dev_free(dy);
  free(x);
  free(d);
  free(w);
  free(xs);
  free(zero);
  free(ref);
  free(got);
}

static int bench(void) {
  const int n_seq = 32, ctx = 4096, nh = 32, nkv = 8, hd = 128;
  const int kv_dim = nkv * hd, blk_per_seq = ctx / BT;
  const int n_blocks = n_seq * blk_per_seq;
  size_t nc = (size_t)n_blocks * BT * kv_dim * sizeof(uint16_t);
  uint16_t *dk = dev_alloc(nc), *dv = dev_alloc(nc);
  CHECK(cudaMemset(dk, 0x11, nc) == cudaSuccess);
  CHECK(cudaMemset(dv, 0x11, nc) == cudaSuccess);
  int32_t *bt = xmalloc(sizeof(int32_t) * n_blocks);
  for (int i = 0; i < n_blocks; i++)
    bt[i] = i;
  for (int i = n_blocks - 1; i > 0; i--) {
    int j = (int)(rnd_u64() % (uint64_t)(i + 1));
    int32_t t = bt[i];
    bt[i] = bt[j];
    bt[j] = t;
  }
  int32_t off[32], seq[512], pos[512];
  for (int s = 0; s < n_seq; s++) {
    off[s] = s * blk_per_seq;
    seq[s] = s;
    pos[s] = ctx - 1;
  }
  int32_t *dbt = dev_upload(bt, sizeof(int32_t) * n_blocks);
  int32_t *doff = dev_upload(off, sizeof off);
  int32_t *dseq = dev_upload(seq, sizeof(int32_t) * n_seq);
  int32_t *dpos = dev_upload(pos, sizeof(int32_t) * n_seq);
  float *dq = dev_alloc(sizeof(float) * 512 * nh * hd);
  float *dout = dev_alloc(sizeof(float) * 512 * nh * hd);
  CHECK(cudaMemset(dq, 0, sizeof(float) * 512 * nh * hd) == cudaSuccess);
  size_t wb = sl_kcu_attn_work_bytes(n_seq, nh, hd, ctx);
  size_t wb_pf = 0; /* prompt tokens are not split */
  void *work = dev_alloc(wb > wb_pf ? wb : wb_pf);
  sl_kcu_attn a = {
      .q = dq,
      .out = dout,
      .k_layer = dk,
      .v_layer = dv,
      .block_table = dbt,
      .seq_blk_off = doff,
      .tok_seq = dseq,
      .tok_pos = dpos,
      .n_tok = n_seq,
      .n_head = nh,
      .n_head_kv = nkv,
      .head_dim = hd,
      .kv_dim = kv_dim,
      .block_tokens = BT,
      .max_len = ctx,
      .n_split_tok = n_seq,
      .scale = 1.0f / sqrtf((float)hd),
      .work = work,
      .work_bytes = wb,
  };
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  const int iters = 50;
  for (int i = 0; i < 5; i++)
    CHECK_OK(sl_kcu_attention(g_stream, &a));
  cudaEventRecord(e0, g_stream);
  for (int i = 0; i < iters; i++)
    sl_kcu_attention(g_stream, &a);
  cudaEventRecord(e1, g_stream);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  double us = 1e3 * ms / iters;
  double bytes = 2.0 * n_seq * ctx * kv_dim * sizeof(uint16_t);
  printf("{\"bench\": \"attn_decode\", \"n_seq\": %d, \"ctx\": %d, "
         "\"n_head\": %d, \"n_head_kv\": %d, \"head_dim\": %d, "
         "\"us\": %.1f, \"kv_GBps\": %.0f, \"work_bytes\": %zu}\n",
         n_seq, ctx, nh, nkv, hd, us, bytes / (us * 1e-6) / 1e9, wb);

  /* prefill: 512 tokens of sequence 0 at positions 3584..4095 */
  for (int t = 0; t < 512; t++) {
    seq[t] = 0;
    pos[t] = ctx - 512 + t;
  }
  int32_t *dseq2 = dev_upload(seq, sizeof seq),
          *dpos2 = dev_upload(pos, sizeof pos);
  a.tok_seq = dseq2;
  a.tok_pos = dpos2;
  a.n_tok = 512;
  a.n_split_tok = 0;
  a.work_bytes = wb_pf;
  for (int i = 0; i < 2; i++)
    CHECK_OK(sl_kcu_attention(g_stream, &a));
  cudaEventRecord(e0, g_stream);
  for (int i = 0; i < 10; i++)
    sl_kcu_attention(g_stream, &a);
  cudaEventRecord(e1, g_stream);
  cudaEventSynchronize(e1);
  cudaEventElapsedTime(&ms, e0, e1);
  us = 1e3 * ms / 10;
  /* causal flops: 4 * hd per (token, head, position) */
  double flops = 0;
  for (int t = 0; t < 512; t++)
    flops += 4.0 * hd * nh * (pos[t] + 1);
  printf("{\"bench\": \"attn_prefill\", \"n_tok\": 512, \"pos0\": %d, "
         "\"us\": %.1f, \"TFLOPs\": %.2f}\n",
         ctx - 512, us, flops / (us * 1e-6) / 1e12);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  dev_free(dk);
  dev_free(dv);
  dev_free(dbt);
  dev_free(doff);
  dev_free(dseq);
  dev_free(dpos);
  dev_free(dseq2);
  dev_free(dpos2);
  dev_free(dq);
  dev_free(dout);
  dev_free(work);
  free(bt);
  return sl_test_finish();
}

#endif /* SLUICE_HAVE_CUDA */

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--host-check") == 0)
    return host_check();
#ifndef SLUICE_HAVE_CUDA
  (void)sl_test_current;
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
    RUN(test_rmsnorm);
    RUN(test_elementwise);
    RUN(test_rope);
    RUN(test_kv_store);
    RUN(test_kv_blocks);
    RUN(test_add_rmsnorm);
    RUN(test_rope_kv_store);
    RUN(test_attention);
    RUN(test_argmax);
    RUN(test_pdl_order);
    rc = sl_test_finish();
  }
  cudaStreamDestroy(g_stream);
  sl_rt_shutdown();
  return rc;
#endif
}
