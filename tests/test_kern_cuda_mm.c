/* The CUDA matrix kernels (sl_kcu_matmul, sl_kcu_get_rows) against the CPU
 * kernels and a float64 reference, for every supported weight type, on the
 * matrix-vector path (n <= 8) and the dequantize + cuBLAS path (n > 8).
 *
 * Skips (exit 77) when sluice was built without CUDA or when no CUDA device
 * can be opened. `--bench` times n = 1 (GB/s of weights) and n = 512
 * (GFLOP/s) on 4096 x 14336 and 14336 x 4096 Q4_0, Q8_0 and F16 matrices
 * instead of testing.
 *
 * Weights are random bytes with every block's scale fields overwritten by
 * sane f16 values (d in [0.001, 0.05]), so results are finite; x is uniform
 * in [-1, 1]. The float64 reference is the exact dot of the rows that
 * sl_kern_dequant_row gives with x. Per output, with L1 = sum_k |w_k x_k|
 * and L2 = sqrt(sum_k (w_k x_k)^2), the bounds are:
 *
 *  - matrix-vector path: |gpu - ref| <= 1e-5 L1. The GPU uses the dequantized
 *    weights and x in f32 and sums in f32: each partial sum runs through a
 *    few dozen additions at most (sequential per thread, then a tree), i.e.
 *    ~50 u = 3e-6 of L1 in the worst case.
 *  - cuBLAS path, f16 inputs: W and x are rounded to f16 (relative error
 *    <= u16 = 2^-11 each, independent, near uniform), so err = sum_k w_k x_k
 *    (dw_k + dx_k) has a standard deviation <= u16 sqrt(2/3) L2; allowed: 8
 *    of those (3.2e-3 L2), plus 2e-6 L1 for the f32 accumulation and 3e-8
 *    sum |w_k| for x values in f16's subnormal range. F32 weights
 *    (cublasSgemm, f32 throughout): 1e-5 L1 as above.
 *  - CPU: quantizing x to 8 bits (Q8_0 / Q8_1 blocks of 32, Q8_K of 256)
 *    moves each x_k by at most 0.5 step plus the f16 rounding of the block
 *    scale: <= 0.5625 amax / 127 (amax: the largest |x| of k's block); with
 *    a margin, 0.6 amax / 127 sum_k |w_k|. For Q4_1 the CPU's s = d * sum q
 *    (f16, from the f32 d) adds <= |m| amax 0.035 per block. Plus 1e-5 L1.
 *  - GPU against CPU: the sum of the two bounds.
 *
 * A dropped or misplaced block scale, an off-by-one block or a wrong nibble
 * moves an output by a fraction of L2 (>= sqrt(32 / cols) L2 for one wrong
 * block of 32), far above these bounds. For quantized weights the GPU must
 * also be closer to float64 than the CPU (root mean square over the
 * outputs). sl_kcu_get_rows must equal sl_kern_dequant_row bit for bit (+0
 * and -0 count as equal); for Q4_1 the GPU computes the fused q * d + m of
 * the AVX2/AVX-512 dequantizer, which the scalar one rounds twice, so under
 * SLUICE_ISA=scalar the fused value computed here is accepted too. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "sluice/kern_cpu.h"
#include "sluice/kern_cuda.h"
#include "sluice/rt.h"
#include "sluice/util.h"

#ifdef SLUICE_HAVE_CUDA
#include <cuda_runtime_api.h>

static cudaStream_t g_s;
static uint64_t g_rng = 0x243F6A8885A308D3ull;

static uint64_t rnd(void) {
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static float unif(float a, float b) {
  return a + (b - a) * (float)((double)(rnd() >> 11) * 0x1.0p-53);
}

/* f32 -> f16 bits, round to nearest even (finite input). */
static uint16_t f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  float a = fabsf(f);
  if (a >= 65520.0f)
    return (uint16_t)(sign | 0x7C00u);
  if (a < 0x1.0p-14f) /* subnormal: multiples of 2^-24 */
    return (uint16_t)(sign | (uint32_t)lrintf(a * 0x1.0p24f));
  uint32_t e = ((x >> 23) & 0xFF) - 127 + 15, mant = x & 0x7FFFFF;
  uint32_t h = (e << 10) | (mant >> 13), rem = mant & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
    h++;
  return (uint16_t)(sign | h);
}
static float h2f(uint16_t h) {
  uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
  float v =
      e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 0x400), (int)e - 25);
  return h & 0x8000 ? -v : v;
}
static void put16(uint8_t *p, uint16_t v) {
  memcpy(p, &v, 2);
}

/* Random weights of type t, rows x cols, in w (row-major GGUF bytes). */
static void fill_weight(sl_ggml_type t, uint8_t *w, size_t bytes) {
  for (size_t i = 0; i < bytes; i++)
    w[i] = (uint8_t)rnd();
  switch (t) {
  case SL_GGML_F32:
    for (size_t i = 0; i < bytes; i += 4) {
      float v = unif(-1.0f, 1.0f);
      memcpy(w + i, &v, 4);
    }
    break;
  case SL_GGML_F16:
    for (size_t i = 0; i < bytes; i += 2)
      put16(w + i, f2h(unif(-1.0f, 1.0f)));
    break;
  case SL_GGML_BF16:
    for (size_t i = 0; i < bytes; i += 2) {
      float v = unif(-1.0f, 1.0f);
      uint32_t u;
      memcpy(&u, &v, 4);
      put16(w + i, (uint16_t)(u >> 16));
    }
    break;
  case SL_GGML_Q4_0:
  case SL_GGML_Q8_0:
    for (size_t i = 0; i < bytes; i += t == SL_GGML_Q4_0 ? 18 : 34)
      put16(w + i, f2h(unif(0.001f, 0.05f)));
    break;
  case SL_GGML_Q4_1:
    for (size_t i = 0; i < bytes; i += 20) {
      put16(w + i, f2h(unif(0.001f, 0.05f)));
      put16(w + i + 2, f2h(unif(-0.4f, 0.4f)));
    }
    break;
  case SL_GGML_Q4_K:
  case SL_GGML_Q5_K:
    for (size_t i = 0; i < bytes; i += t == SL_GGML_Q4_K ? 144 : 176) {
      put16(w + i, f2h(unif(0.001f, 0.05f)));
      put16(w + i + 2, f2h(unif(0.001f, 0.05f)));
    }
    break;
  case SL_GGML_Q6_K:
    for (size_t i = 0; i < bytes; i += 210)
      put16(w + i + 208, f2h(unif(0.001f, 0.05f)));
    break;
  default:
    break;
  }
}

/* One weight matrix on host and device, its dequantized rows and random x
 * for nmax tokens on both. */
typedef struct mm_case {
  sl_ggml_type t;
  int64_t rows, cols;
  int nmax;
  size_t bytes;
  uint8_t *w;
  float *wf; /* (rows, cols) sl_kern_dequant_row */
  float *x;  /* (nmax, cols) */
  void *dw;
  float *dx, *dy;
} mm_case;

static bool case_init(mm_case *c, sl_ggml_type t, int64_t rows, int64_t cols,
                      int nmax) {
  memset(c, 0, sizeof *c);
  c->t = t, c->rows = rows, c->cols = cols, c->nmax = nmax;
  size_t rb;
  if (sl_kern_row_bytes(t, cols, &rb) != SL_OK)
    return false;
  c->bytes = rb * (size_t)rows;
  c->w = sl_malloc(c->bytes);
  c->wf = sl_malloc((size_t)(rows * cols) * sizeof(float));
  c->x = sl_malloc((size_t)(nmax * cols) * sizeof(float));
  if (!c->w || !c->wf || !c->x)
    return false;
  fill_weight(t, c->w, c->bytes);
  for (int64_t r = 0; r < rows; r++)
    if (sl_kern_dequant_row(t, c->w + (size_t)r * rb, c->wf + r * cols, cols) !=
        SL_OK)
      return false;
  for (int64_t i = 0; i < nmax * cols; i++)
    c->x[i] = unif(-1.0f, 1.0f);
  if (cudaMalloc(&c->dw, c->bytes) != cudaSuccess ||
      cudaMalloc((void **)&c->dx, (size_t)(nmax * cols) * sizeof(float)) !=
          cudaSuccess ||
      cudaMalloc((void **)&c->dy, (size_t)(nmax * rows) * sizeof(float)) !=
          cudaSuccess)
    return false;
  cudaMemcpy(c->dw, c->w, c->bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(c->dx, c->x, (size_t)(nmax * cols) * sizeof(float),
             cudaMemcpyHostToDevice);
  return true;
}

static void case_fini(mm_case *c) {
  sl_free(c->w);
  sl_free(c->wf);
  sl_free(c->x);
  cudaFree(c->dw);
  cudaFree(c->dx);
  cudaFree(c->dy);
}

static int64_t act_block(sl_ggml_type t) {
  sl_ggml_type act;
  if (sl_kern_act_type(t, &act) != SL_OK || act == SL_GGML_F32)
    return 0;
  return act == SL_GGML_Q8_K ? 256 : 32;
}

/* ---- matmul ----------------------------------------------------------- */

static void check_matmul(sl_ggml_type t, int64_t rows, int64_t cols, int nmax) {
  static const int ns[] = {1, 2, 3, 5, 8, 9, 64, 512};
  const sl_ggml_type_traits *tr = sl_ggml_type_traits_of(t);
  mm_case c;
  if (!case_init(&c, t, rows, cols, nmax)) {
    CHECK_MSG(0, "setup %s %lld x %lld", tr->name, (long long)rows,
              (long long)cols);
    case_fini(&c);
    return;
  }
  const size_t ny = (size_t)(nmax * rows);
  double *ref = sl_malloc(ny * sizeof(double));
  double *l1 = sl_malloc(ny * sizeof(double)),
         *l2 = sl_malloc(ny * sizeof(double));
  double *tcpu = sl_malloc(ny * sizeof(double)),
         *w1 = sl_malloc(ny * sizeof(double));
  float *ycpu = sl_malloc(ny * sizeof(float)),
        *ygpu = sl_malloc(ny * sizeof(float));
  double *amax = sl_malloc((size_t)cols * sizeof(double));
  CHECK(ref && l1 && l2 && tcpu && w1 && ycpu && ygpu && amax);
  if (!(ref && l1 && l2 && tcpu && w1 && ycpu && ygpu && amax))
    goto out;

  /* the references, over all nmax tokens; smaller n take a prefix */
  sl_kern_weight hw = {t, rows, cols, c.w};
  CHECK_OK(sl_kern_matmul(NULL, &hw, c.x, ycpu, nmax));
  const int64_t ab = act_block(t);
  for (int tk = 0; tk < nmax; tk++) {
    const float *x = c.x + tk * cols;
    for (int64_t k = 0; k < cols; k++)
      amax[k] = 0.0;
    if (ab)
      for (int64_t k0 = 0; k0 < cols; k0 += ab) {
        double m = 0.0;
        for (int64_t k = k0; k < k0 + ab; k++)
          m = fmax(m, fabs((double)x[k]));
        for (int64_t k = k0; k < k0 + ab; k++)
          amax[k] = m;
      }
    for (int64_t r = 0; r < rows; r++) {
      const float *w = c.wf + r * cols;
      double s = 0, a1 = 0, a2 = 0, eq = 0, wa = 0;
      for (int64_t k = 0; k < cols; k++) {
        double p = (double)w[k] * (double)x[k];
        s += p;
        a1 += fabs(p);
        a2 += p * p;
        eq += fabs((double)w[k]) * amax[k];
        wa += fabs((double)w[k]);
      }
      double tc = 0.6 / 127.0 * eq + 1e-5 * a1;
      if (t == SL_GGML_Q4_1) /* the f16 s term: |m| amax 0.035 a block */
        for (int64_t b = 0; b < cols / 32; b++) {
          uint16_t mb;
          memcpy(&mb,
                 c.w + ((size_t)r * (size_t)(cols / 32) + (size_t)b) * 20 + 2,
                 2);
          tc += fabs((double)h2f(mb)) * amax[b * 32] * 0.035;
        }
      const size_t i = (size_t)tk * (size_t)rows + (size_t)r;
      ref[i] = s, l1[i] = a1, l2[i] = sqrt(a2), tcpu[i] = tc, w1[i] = wa;
    }
  }
  /* the CPU reference must hold its own bound */
  for (size_t i = 0; i < ny; i++)
    if (!(fabs((double)ycpu[i] - ref[i]) <= tcpu[i])) {
      CHECK_MSG(0, "cpu %s [%zu]: %g vs %g (tol %g)", tr->name, i, ycpu[i],
                ref[i], tcpu[i]);
      break;
    }

  sl_kern_weight dw = {t, rows, cols, c.dw};
  size_t sb = 0;
  for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
    if (ns[j] <= nmax && sl_kcu_matmul_scratch_bytes(&dw, ns[j]) > sb)
      sb = sl_kcu_matmul_scratch_bytes(&dw, ns[j]);
  void *scratch = NULL;
  if (sb && cudaMalloc(&scratch, sb) != cudaSuccess) {
    CHECK_MSG(0, "cudaMalloc scratch %zu", sb);
    goto out;
  }
  for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
    const int n = ns[j];
    if (n > nmax)
      continue;
    const size_t cnt = (size_t)n * (size_t)rows;
    cudaMemsetAsync(c.dy, 0xFF, cnt * sizeof(float), g_s); /* NaNs */
    sl_status st = sl_kcu_matmul(g_s, &dw, c.dx, c.dy, n, scratch,
                                 sl_kcu_matmul_scratch_bytes(&dw, n));
    CHECK_MSG(st == SL_OK, "%s n=%d: %s", tr->name, n, sl_status_str(st));
    CHECK_EQ_INT(cudaStreamSynchronize(g_s), cudaSuccess);
    cudaMemcpy(ygpu, c.dy, cnt * sizeof(float), cudaMemcpyDeviceToHost);

    const bool f16path = n > SL_KCU_MMV_MAX_TOKENS && t != SL_GGML_F32;
    double se_gpu = 0, se_cpu = 0, worst = 0;
    int bad = 0;
    for (size_t i = 0; i < cnt; i++) {
      double tg = f16path ? 8.0 * 0x1.0p-11 * sqrt(2.0 / 3.0) * l2[i] +
                                2e-6 * l1[i] + 3e-8 * w1[i]
                          : 1e-5 * l1[i];
      double eg = fabs((double)ygpu[i] - ref[i]);
      double ec = fabs((double)ycpu[i] - ref[i]);
      double egc = fabs((double)ygpu[i] - (double)ycpu[i]);
      se_gpu += eg * eg;
      se_cpu += ec * ec;
      if (eg / (tg + 1e-300) > worst)
        worst = eg / (tg + 1e-300);
      if (!(eg <= tg) || !(egc <= tg + tcpu[i])) {
        if (bad++ < 3)
          fprintf(stderr,
                  "  %s %lldx%lld n=%d tok %zu row %zu: gpu %.9g cpu %.9g "
                  "ref %.9g tol %.3g\n",
                  tr->name, (long long)rows, (long long)cols, n, i / rows,
                  i % rows, ygpu[i], ycpu[i], ref[i], tg);
      }
    }
    CHECK_MSG(bad == 0, "%s %lldx%lld n=%d: %d of %zu outputs off", tr->name,
              (long long)rows, (long long)cols, n, bad, cnt);
    if (tr->is_quantized)
      CHECK_MSG(se_gpu <= se_cpu,
                "%s n=%d: gpu rms err %.3g above the cpu's %.3g", tr->name, n,
                sqrt(se_gpu / cnt), sqrt(se_cpu / cnt));
    fprintf(stderr,
            "  %-5s %5lldx%-5lld n=%-3d rms err gpu %.2e cpu %.2e, "
            "worst %.2f of tol\n",
            tr->name, (long long)rows, (long long)cols, n, sqrt(se_gpu / cnt),
            sqrt(se_cpu / cnt), worst);
  }
  cudaFree(scratch);
out:
  sl_free(ref);
  sl_free(l1);
  sl_free(l2);
  sl_free(tcpu);
  sl_free(w1);
  sl_free(ycpu);
  sl_free(ygpu);
  sl_free(amax);
  case_fini(&c);
}

static const sl_ggml_type k_types[] = {
    SL_GGML_F32,  SL_GGML_F16,  SL_GGML_BF16, SL_GGML_Q4_0, SL_GGML_Q4_1,
    SL_GGML_Q8_0, SL_GGML_Q4_K, SL_GGML_Q5_K, SL_GGML_Q6_K};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

static bool is_k(sl_ggml_type t) {
  return t == SL_GGML_Q4_K || t == SL_GGML_Q5_K || t == SL_GGML_Q6_K;
}

static void test_matmul(void) {
  for (size_t i = 0; i < N_TYPES; i++) {
    sl_ggml_type t = k_types[i];
    if (is_k(t)) {
      check_matmul(t, 576, 512, 512);
      check_matmul(t, 1536, 768, 512);
      check_matmul(t, 576, 1536, 512);
      check_matmul(t, 1000, 512, 512);
    } else {
      check_matmul(t, 576, 576, 512);
      check_matmul(t, 1536, 576, 512);
      check_matmul(t, 576, 1536, 512);
      check_matmul(t, 1000, 576, 512);
    }
    if (t == SL_GGML_F32 || t == SL_GGML_F16 || t == SL_GGML_BF16)
      check_matmul(t, 100, 36, 64); /* cols % 8 != 0: the scalar units */
  }
  /* bigger: several units per thread, 64-thread and 128-thread groups */
  check_matmul(SL_GGML_Q4_0, 4096, 4096, 64);
  check_matmul(SL_GGML_Q8_0, 4096, 4096, 64);
  check_matmul(SL_GGML_Q4_K, 4096, 4096, 64);
  check_matmul(SL_GGML_Q6_K, 4096, 4096, 64);
  check_matmul(SL_GGML_F16, 1024, 14336, 16);
}

/* ---- get_rows ----------------------------------------------------------- */

static bool same_float(float a, float b) {
  if (a == b) /* +0 == -0 */
    return true;
  uint32_t ua, ub;
  memcpy(&ua, &a, 4);
  memcpy(&ub, &b, 4);
  return ua == ub; /* the same NaN */
}

/* The fused q * d + m of element k of a Q4_1 row. */
static float q4_1_fused(const uint8_t *row, int64_t k) {
  const uint8_t *b = row + (k / 32) * 20;
  uint16_t d, m;
  memcpy(&d, b, 2);
  memcpy(&m, b + 2, 2);
  int j = (int)(k % 32);
  int q = j < 16 ? b[4 + j] & 0xF : b[4 + j - 16] >> 4;
  return fmaf((float)q, h2f(d), h2f(m));
}

static void check_get_rows(sl_ggml_type t, int64_t rows, int64_t cols) {
  const sl_ggml_type_traits *tr = sl_ggml_type_traits_of(t);
  mm_case c;
  enum { N = 37 };
  int32_t ids[N];
  float *out = sl_malloc((size_t)N * (size_t)cols * sizeof(float));
  int32_t *dids = NULL;
  float *dout = NULL;
  if (!case_init(&c, t, rows, cols, 1) || !out ||
      cudaMalloc((void **)&dids, sizeof ids) != cudaSuccess ||
      cudaMalloc((void **)&dout, (size_t)N * (size_t)cols * sizeof(float)) !=
          cudaSuccess) {
    CHECK_MSG(0, "setup get_rows %s", tr->name);
    goto out;
  }
  for (int i = 0; i < N; i++)
    ids[i] = (int32_t)(rnd() % (uint64_t)rows);
  ids[0] = 0, ids[1] = (int32_t)rows - 1, ids[2] = ids[3];
  cudaMemcpy(dids, ids, sizeof ids, cudaMemcpyHostToDevice);
  CHECK_OK(sl_kcu_get_rows(g_s, t, c.dw, cols, dids, N, dout));
  CHECK_EQ_INT(cudaStreamSynchronize(g_s), cudaSuccess);
  cudaMemcpy(out, dout, (size_t)N * (size_t)cols * sizeof(float),
             cudaMemcpyDeviceToHost);
  size_t rb = c.bytes / (size_t)rows;
  int bad = 0;
  for (int i = 0; i < N; i++)
    for (int64_t k = 0; k < cols; k++) {
      float g = out[(size_t)i * (size_t)cols + (size_t)k];
      float e = c.wf[(int64_t)ids[i] * cols + k];
      bool ok = same_float(g, e);
      if (!ok && t == SL_GGML_Q4_1 && sl_kern_cpu_isa() == SL_KERN_ISA_SCALAR)
        ok = same_float(g, q4_1_fused(c.w + (size_t)ids[i] * rb, k));
      if (!ok && bad++ < 3)
        fprintf(stderr, "  get_rows %s row %d col %lld: %.9g vs %.9g\n",
                tr->name, ids[i], (long long)k, g, e);
    }
  CHECK_MSG(bad == 0, "get_rows %s %lld cols: %d elements differ", tr->name,
            (long long)cols, bad);
out:
  cudaFree(dids);
  cudaFree(dout);
  sl_free(out);
  case_fini(&c);
}

static void test_get_rows(void) {
  for (size_t i = 0; i < N_TYPES; i++) {
    sl_ggml_type t = k_types[i];
    check_get_rows(t, 300, is_k(t) ? 1536 : 576);
    check_get_rows(t, 50, is_k(t) ? 256 : 32);
    if (!sl_ggml_type_traits_of(t)->is_quantized)
      check_get_rows(t, 50, 36); /* the scalar units */
  }
}

/* ---- arguments ------------------------------------------------------------
 */

static void test_args(void) {
  for (size_t i = 0; i < N_TYPES; i++)
    CHECK(sl_kcu_type_supported(k_types[i]));
  CHECK(!sl_kcu_type_supported(SL_GGML_Q5_0));
  CHECK(!sl_kcu_type_supported(SL_GGML_Q8_K));

  void *dw = NULL, *scratch = NULL;
  float *dx = NULL, *dy = NULL;
  int32_t *dids = NULL;
  if (cudaMalloc(&dw, 1 << 20) != cudaSuccess ||
      cudaMalloc((void **)&dx, 1 << 20) != cudaSuccess ||
      cudaMalloc((void **)&dy, 1 << 20) != cudaSuccess ||
      cudaMalloc(&scratch, 1 << 20) != cudaSuccess ||
      cudaMalloc((void **)&dids, 64) != cudaSuccess) {
    CHECK_MSG(0, "cudaMalloc");
    goto out;
  }
  cudaMemset(dw, 0, 1 << 20);
  cudaMemset(dids, 0, 64);

  sl_kern_weight w = {SL_GGML_Q5_0, 64, 64, dw};
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 1, NULL, 0), SL_ERR_UNSUPPORTED);
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 16, scratch, 1 << 20),
               SL_ERR_UNSUPPORTED);
  CHECK_EQ_INT(sl_kcu_get_rows(g_s, SL_GGML_Q5_0, dw, 64, dids, 1, dy),
               SL_ERR_UNSUPPORTED);

  w = (sl_kern_weight){SL_GGML_Q4_0, 64, 48, dw}; /* not a multiple of 32 */
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 1, NULL, 0), SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 16, scratch, 1 << 20),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kcu_get_rows(g_s, SL_GGML_Q4_0, dw, 48, dids, 1, dy),
               SL_ERR_INVALID_ARG);
  w = (sl_kern_weight){SL_GGML_Q6_K, 64, 288, dw}; /* not a multiple of 256 */
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 2, NULL, 0), SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kcu_get_rows(g_s, SL_GGML_Q6_K, dw, 288, dids, 1, dy),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, -1, NULL, 0), SL_ERR_INVALID_ARG);

  /* scratch: 0 on the matrix-vector path and for F32; W and X in f16, each
   * rounded up to 256 bytes, otherwise */
  w = (sl_kern_weight){SL_GGML_Q4_0, 100, 96, dw};
  CHECK_EQ_INT(sl_kcu_matmul_scratch_bytes(&w, 8), 0);
  CHECK_EQ_INT(sl_kcu_matmul_scratch_bytes(&w, 9), 19200 + 1792);
  w.type = SL_GGML_F16;
  CHECK_EQ_INT(sl_kcu_matmul_scratch_bytes(&w, 9), 1792);
  w.type = SL_GGML_F32;
  CHECK_EQ_INT(sl_kcu_matmul_scratch_bytes(&w, 512), 0);
  /* too little scratch */
  w.type = SL_GGML_Q4_0;
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 9, scratch, 19200),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 9, NULL, 0), SL_ERR_INVALID_ARG);
  /* nothing to do */
  CHECK_OK(sl_kcu_matmul(g_s, &w, dx, dy, 0, NULL, 0));
  CHECK_OK(sl_kcu_get_rows(g_s, SL_GGML_Q4_0, dw, 96, dids, 0, dy));
  CHECK_EQ_INT(cudaStreamSynchronize(g_s), cudaSuccess);
out:
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(scratch);
  cudaFree(dids);
}

/* ---- --bench ---------------------------------------------------------------
 */

/* Batch invariance (the engine's need): on one path, a token's row of y is
 * the same bit for bit whether it is computed alone or among others. VEC
 * must hold it by construction; GEMM relies on cuBLAS computing an output
 * element the same way for any n, which is checked here. */
static void check_invariance(sl_ggml_type t, sl_kcu_mm_path path, int n) {
  mm_case c;
  int64_t cols = sl_ggml_type_traits_of(t)->blck_size == 256 ? 768 : 576;
  if (!case_init(&c, t, 1000, cols, n)) {
    CHECK_MSG(0, "case_init %d", (int)t);
    case_fini(&c);
    return;
  }
  sl_kern_weight w = {t, c.rows, c.cols, c.dw};
  size_t sb = sl_kcu_matmul_path_scratch_bytes(&w, n, path);
  void *scratch = NULL;
  if (sb)
    cudaMalloc(&scratch, sb);
  float *all = sl_malloc(sizeof(float) * (size_t)(n * c.rows));
  float *one = sl_malloc(sizeof(float) * (size_t)c.rows);
  CHECK_OK(sl_kcu_matmul_path(g_s, &w, c.dx, c.dy, n, path, scratch, sb));
  cudaStreamSynchronize(g_s);
  cudaMemcpy(all, c.dy, sizeof(float) * (size_t)(n * c.rows),
             cudaMemcpyDeviceToHost);
  int diff = 0;
  for (int i = 0; i < n; i += 5) { /* every fifth token, alone */
    CHECK_OK(sl_kcu_matmul_path(g_s, &w, c.dx + (size_t)i * (size_t)c.cols,
                                c.dy, 1, path, scratch, sb));
    cudaStreamSynchronize(g_s);
    cudaMemcpy(one, c.dy, sizeof(float) * (size_t)c.rows,
               cudaMemcpyDeviceToHost);
    diff += memcmp(one, all + (size_t)i * (size_t)c.rows,
                   sizeof(float) * (size_t)c.rows) != 0;
  }
  fprintf(stderr, "   %-5s %s n=%d: %d token(s) differ alone\n",
          sl_ggml_type_traits_of(t)->name,
          path == SL_KCU_MM_VEC ? "vec " : "gemm", n, diff);
  CHECK_MSG(diff == 0, "%s path %d: a token alone differs from its batch",
            sl_ggml_type_traits_of(t)->name, (int)path);
  if (scratch)
    cudaFree(scratch);
  sl_free(all);
  sl_free(one);
  case_fini(&c);
}

static void test_batch_invariance(void) {
  const sl_ggml_type ts[] = {SL_GGML_Q4_0, SL_GGML_Q4_1, SL_GGML_Q8_0,
                             SL_GGML_F16,  SL_GGML_F32,  SL_GGML_Q6_K};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
    check_invariance(ts[i], SL_KCU_MM_VEC, 21);
    check_invariance(ts[i], SL_KCU_MM_GEMM, 37);
  }
}

static void bench_one(sl_ggml_type t, int64_t rows, int64_t cols) {
  const sl_ggml_type_traits *tr = sl_ggml_type_traits_of(t);
  mm_case c;
  enum { NB = 512 };
  if (!case_init(&c, t, rows, cols, NB)) {
    fprintf(stderr, "bench setup failed\n");
    case_fini(&c);
    return;
  }
  sl_kern_weight w = {t, rows, cols, c.dw};
  size_t sb = sl_kcu_matmul_scratch_bytes(&w, NB);
  void *scratch = NULL;
  if (sb)
    cudaMalloc(&scratch, sb);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  static const int ns[] = {1, 2, 8, NB};
  for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
    const int n = ns[j], reps = n == NB ? 20 : 100;
    size_t s = sl_kcu_matmul_scratch_bytes(&w, n);
    sl_kcu_matmul(g_s, &w, c.dx, c.dy, n, scratch, s); /* warm-up */
    cudaEventRecord(e0, g_s);
    sl_status st = SL_OK;
    for (int r = 0; r < reps && st == SL_OK; r++)
      st = sl_kcu_matmul(g_s, &w, c.dx, c.dy, n, scratch, s);
    cudaEventRecord(e1, g_s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    double sec = ms / 1e3 / reps;
    printf("%-5s %6lld x %-6lld n=%-3d %9.1f us  %7.1f GB/s weights  "
           "%8.1f GFLOP/s  (%s)\n",
           tr->name, (long long)rows, (long long)cols, n, sec * 1e6,
           (double)c.bytes / sec / 1e9,
           2.0 * (double)rows * (double)cols * n / sec / 1e9,
           sl_status_str(st));
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(scratch);
  case_fini(&c);
}

static void bench(void) {
  static const sl_ggml_type ts[] = {SL_GGML_Q4_0, SL_GGML_Q8_0, SL_GGML_F16,
                                    SL_GGML_Q4_K, SL_GGML_Q6_K};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
    bench_one(ts[i], 4096, 14336);
    bench_one(ts[i], 14336, 4096);
  }
}
#endif /* SLUICE_HAVE_CUDA */

int main(int argc, char **argv) {
#ifndef SLUICE_HAVE_CUDA
  (void)argc;
  (void)argv;
  (void)sl_test_current;
  fprintf(stderr, "skip: sluice was built without the CUDA backend\n");
  return 77;
#else
  sl_device_t *dev;
  sl_status st = sl_device_get(SL_DEVICE_CUDA, 0, &dev);
  if (st != SL_OK) {
    fprintf(stderr, "skip: no CUDA device (%s)\n", sl_status_str(st));
    return 77;
  }
  if (cudaSetDevice(0) != cudaSuccess ||
      cudaStreamCreateWithFlags(&g_s, cudaStreamNonBlocking) != cudaSuccess) {
    fprintf(stderr, "cannot make a CUDA stream\n");
    return 1;
  }
  if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
    bench();
  } else {
    RUN(test_args);
    RUN(test_get_rows);
    RUN(test_matmul);
    RUN(test_batch_invariance);
  }
  /* the stream's cuBLAS handle stays in kern's list (its stream-fini hook
   * runs only for the backend's own streams): harmless at exit */
  cudaStreamDestroy(g_s);
  sl_rt_shutdown();
  return argc > 1 && strcmp(argv[1], "--bench") == 0 ? 0 : sl_test_finish();
#endif
}
