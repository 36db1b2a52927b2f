/* The CUDA matrix kernels (sl_kcu_matmul, sl_kcu_get_rows) against the CPU
 * kernels and a float64 reference, for every supported weight type, on the
 * matrix-vector path (n <= 8) and the dequantize + cuBLAS path (n > 8).
 *
 * Skips (exit 77) when sluice was built without CUDA or when no CUDA device
 * can be opened. `--bench` times n = 1, 2, 4, 8 (GB/s of weights read, and
 * the fraction of the device's pure read bandwidth, sl_kcu_read_bench) and
 * n = 512 (GFLOP/s) on the shapes of an 8B model (4096 x 4096, 14336 x 4096,
 * 4096 x 14336, 128256 x 4096) for Q4_0, Q4_1, Q8_0, F16, Q4_K, Q6_K, Q5_0,
 * Q5_1, IQ4_NL, Q2_K, Q3_K, IQ4_XS (and 1536 x 576, 49152 x 576 for the
 * 32-element types) instead of testing.
 *
 * Weights go to the device in their GGUF bytes and through sl_kcu_pack (the
 * packed layout for Q4_0, Q4_1, Q8_0; a copy for the others), as the engine
 * uploads them; the CPU reads the GGUF bytes. test_pack checks the packed
 * bytes against the layout of src/kern/cuda/packed.cuh computed here.
 *
 * Weights are random bytes with every block's scale fields overwritten by
 * sane f16 values (d in [0.001, 0.05]; IQ4_XS, whose levels reach 127 and
 * sub-block scales 32, [0.0001, 0.002]), so results are finite; every bit
 * pattern of the other fields is a valid block; x is uniform
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
 *    a margin, 0.6 amax / 127 sum_k |w_k|. For Q4_1 and Q5_1 the CPU's s =
 *    d * sum q (f16, from the f32 d) adds <= |m| amax 0.035 per block. Plus
 *    1e-5 L1.
 *  - GPU against CPU: the sum of the two bounds.
 *
 * A dropped or misplaced block scale, an off-by-one block or a wrong nibble
 * moves an output by a fraction of L2 (>= sqrt(32 / cols) L2 for one wrong
 * block of 32), far above these bounds. For quantized weights the GPU must
 * also be closer to float64 than the CPU (root mean square over the
 * outputs). sl_kcu_get_rows must equal sl_kern_dequant_row bit for bit (+0
 * and -0 count as equal); for Q4_1 and Q5_1 the GPU computes the fused q * d
 * + m of the AVX2/AVX-512 dequantizer, which the scalar one rounds twice, so
 * under SLUICE_ISA=scalar the fused value computed here is accepted too. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test.h"
#include "harness.h"
#include "rand_weights.h"
#include "sluice/kern_cpu.h"
#include "sluice/kern_cuda.h"
#include "sluice/rt.h"
#include "sluice/util.h"

#ifdef SLUICE_HAVE_CUDA
#include <cuda_runtime_api.h>

static cudaStream_t g_s;
/* cudaMemcpy from pageable memory returns once the bytes are staged, not
 * once they land, and the kernels run on a non-blocking stream that does not
 * wait for the legacy stream: a kernel could read the buffer before the copy
 * reached it (seen on the H200: a fixed set of rows came back NaN in one run
 * of three). Every host-to-device copy goes on the kernels' stream and is
 * waited for. */
static cudaError_t h2d(void *dst, const void *src, size_t n) {
  cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, g_s);
  return e == cudaSuccess ? cudaStreamSynchronize(g_s) : e;
}

static float h2f(uint16_t h) {
  uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
  float v =
      e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 0x400), (int)e - 25);
  return h & 0x8000 ? -v : v;
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

/* Uploads the GGUF bytes w of a rows x cols matrix of t and packs them into
 * a new device buffer of sl_kcu_packed_bytes (*out; its size in *bytes). */
static bool upload_packed(sl_ggml_type t, const uint8_t *w, size_t gguf_bytes,
                          int64_t rows, int64_t cols, void **out,
                          size_t *bytes) {
  void *tmp = NULL;
  *out = NULL;
  *bytes = sl_kcu_packed_bytes(t, rows, cols);
  if (*bytes == 0 || *bytes == SIZE_MAX)
    return false;
  if (cudaMalloc(&tmp, gguf_bytes) != cudaSuccess)
    return false;
  bool ok = cudaMalloc(out, *bytes) == cudaSuccess &&
            h2d(tmp, w, gguf_bytes) == cudaSuccess &&
            sl_kcu_pack(g_s, t, tmp, *out, rows, cols) == SL_OK &&
            cudaStreamSynchronize(g_s) == cudaSuccess;
  cudaFree(tmp);
  return ok;
}

/* dequant: fill wf (the bench does without). */
static bool case_init2(mm_case *c, sl_ggml_type t, int64_t rows, int64_t cols,
                       int nmax, bool dequant) {
  memset(c, 0, sizeof *c);
  c->t = t, c->rows = rows, c->cols = cols, c->nmax = nmax;
  size_t rb;
  if (sl_kern_row_bytes(t, cols, &rb) != SL_OK)
    return false;
  c->bytes = rb * (size_t)rows;
  c->w = sl_malloc(c->bytes);
  c->wf = dequant ? sl_malloc((size_t)(rows * cols) * sizeof(float)) : NULL;
  c->x = sl_malloc((size_t)(nmax * cols) * sizeof(float));
  if (!c->w || (dequant && !c->wf) || !c->x)
    return false;
  rw_fill_weight(t, c->w, c->bytes);
  for (int64_t r = 0; dequant && r < rows; r++)
    if (sl_kern_dequant_row(t, c->w + (size_t)r * rb, c->wf + r * cols, cols) !=
        SL_OK)
      return false;
  for (int64_t i = 0; i < nmax * cols; i++)
    c->x[i] = rw_unif(-1.0f, 1.0f);
  size_t pb;
  if (!upload_packed(t, c->w, c->bytes, rows, cols, &c->dw, &pb) ||
      cudaMalloc((void **)&c->dx, (size_t)(nmax * cols) * sizeof(float)) !=
          cudaSuccess ||
      cudaMalloc((void **)&c->dy, (size_t)(nmax * rows) * sizeof(float)) !=
          cudaSuccess)
    return false;
  h2d(c->dx, c->x, (size_t)(nmax * cols) * sizeof(float));
  return true;
}

static bool case_init(mm_case *c, sl_ggml_type t, int64_t rows, int64_t cols,
                      int nmax) {
  return case_init2(c, t, rows, cols, nmax, true);
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
  sl_kern_weight hw = {t, rows, cols, c.w, NULL};
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
      /* Q4_1, Q5_1: the f16 s term, |m| amax 0.035 a block */
      const size_t mbb = t == SL_GGML_Q4_1 ? 20 : t == SL_GGML_Q5_1 ? 24 : 0;
      for (int64_t b = 0; mbb && b < cols / 32; b++) {
        uint16_t mb;
        memcpy(&mb,
               c.w + ((size_t)r * (size_t)(cols / 32) + (size_t)b) * mbb + 2,
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

  sl_kern_weight dw = {t, rows, cols, c.dw, NULL};
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

    /* x rounded to f16: the batched path, and the tensor-core kernel of the
     * packed types (unless SLUICE_CUDA_MMT=0) */
    const char *mmt_env = getenv("SLUICE_CUDA_MMT");
    const bool mmt = sl_kcu_type_packed(t) && !(mmt_env && mmt_env[0] == '0');
    const bool f16path = (n > SL_KCU_MMV_MAX_TOKENS && t != SL_GGML_F32) || mmt;
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
    SL_GGML_F32,  SL_GGML_F16,  SL_GGML_BF16, SL_GGML_Q4_0,   SL_GGML_Q4_1,
    SL_GGML_Q8_0, SL_GGML_Q5_0, SL_GGML_Q5_1, SL_GGML_IQ4_NL, SL_GGML_Q2_K,
    SL_GGML_Q3_K, SL_GGML_Q4_K, SL_GGML_Q5_K, SL_GGML_Q6_K,   SL_GGML_IQ4_XS};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

/* The 256-element blocks (Q2_K..Q6_K, IQ4_XS); the others get rows of 576
 * (not a multiple of 256) and 32. */
static bool is_k(sl_ggml_type t) {
  return sl_ggml_type_traits_of(t)->blck_size == 256;
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
  /* bigger: several units per thread, 64-thread and 128-thread groups; for
   * the packed kernels 8 and 16 warps along a row */
  check_matmul(SL_GGML_Q4_0, 4096, 4096, 64);
  check_matmul(SL_GGML_Q8_0, 4096, 4096, 64);
  check_matmul(SL_GGML_Q4_1, 4096, 4096, 16);
  check_matmul(SL_GGML_Q4_1, 1000, 4096, 16);
  check_matmul(SL_GGML_Q8_0, 1000, 4096, 16);
  /* packed: an odd count of 16-byte chunks (the last pair half empty), a
   * row count not a multiple of the 16-row tile, a single row */
  check_matmul(SL_GGML_Q4_0, 100, 96, 16);
  check_matmul(SL_GGML_Q4_1, 100, 96, 16);
  check_matmul(SL_GGML_Q8_0, 37, 32, 16);
  check_matmul(SL_GGML_Q4_0, 1, 1024, 16);
  check_matmul(SL_GGML_Q4_K, 4096, 4096, 64);
  check_matmul(SL_GGML_Q6_K, 4096, 4096, 64);
  check_matmul(SL_GGML_Q3_K, 4096, 4096, 64);
  check_matmul(SL_GGML_IQ4_XS, 1000, 4096, 16);
  check_matmul(SL_GGML_Q2_K, 1000, 4096, 16);
  check_matmul(SL_GGML_Q5_0, 4096, 4096, 64);
  check_matmul(SL_GGML_Q5_1, 1000, 4096, 16);
  check_matmul(SL_GGML_IQ4_NL, 1000, 4096, 16);
  /* a single 32-element block a row, a single row */
  check_matmul(SL_GGML_Q5_1, 100, 32, 16);
  check_matmul(SL_GGML_IQ4_NL, 1, 1024, 16);
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

/* The fused q * d + m of element k of a Q4_1 or Q5_1 row. */
static float q41_fused(sl_ggml_type t, const uint8_t *row, int64_t k) {
  const bool q5 = t == SL_GGML_Q5_1;
  const uint8_t *b = row + (k / 32) * (q5 ? 24 : 20);
  const uint8_t *qs = b + (q5 ? 8 : 4);
  uint16_t d, m;
  memcpy(&d, b, 2);
  memcpy(&m, b + 2, 2);
  int j = (int)(k % 32);
  int q = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
  if (q5)
    q |= ((b[4 + j / 8] >> (j % 8)) & 1) << 4;
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
    ids[i] = (int32_t)(rw_rnd() % (uint64_t)rows);
  ids[0] = 0, ids[1] = (int32_t)rows - 1, ids[2] = ids[3];
  h2d(dids, ids, sizeof ids);
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
      if (!ok && (t == SL_GGML_Q4_1 || t == SL_GGML_Q5_1) &&
          sl_kern_cpu_isa() == SL_KERN_ISA_SCALAR)
        ok = same_float(g, q41_fused(t, c.w + (size_t)ids[i] * rb, k));
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

/* Every row of the packed types goes through sl_kcu_pack first (case_init),
 * so this also checks that packing keeps each quant, scale and min. */
static void test_get_rows(void) {
  for (size_t i = 0; i < N_TYPES; i++) {
    sl_ggml_type t = k_types[i];
    check_get_rows(t, 300, is_k(t) ? 1536 : 576);
    check_get_rows(t, 50, is_k(t) ? 256 : 32);
    if (sl_kcu_type_packed(t))
      check_get_rows(t, 16, 96); /* one full tile, an odd chunk count */
    if (!sl_ggml_type_traits_of(t)->is_quantized)
      check_get_rows(t, 50, 36); /* the scalar units */
  }
}

/* ---- the packed layout ----------------------------------------------------
 */

/* sl_kcu_pack against the layout of src/kern/cuda/packed.cuh built here:
 * tiles of 16 rows; in a tile, 16-byte quant chunk c of row-in-tile rr at
 * (c * 16 + rr) * 16, then the scale bytes of block b at 16 * nb * QB +
 * (b * 16 + rr) * SB; padding rows zero. Other types: a copy. */
static void check_pack(sl_ggml_type t, int64_t rows, int64_t cols) {
  const sl_ggml_type_traits *tr = sl_ggml_type_traits_of(t);
  size_t rb;
  if (sl_kern_row_bytes(t, cols, &rb) != SL_OK) {
    CHECK_MSG(0, "row bytes %s", tr->name);
    return;
  }
  const size_t gb = rb * (size_t)rows;
  uint8_t *w = sl_malloc(gb);
  size_t pb = 0;
  void *dp = NULL;
  uint8_t *got = NULL, *want = NULL;
  if (!w)
    goto out;
  rw_fill_weight(t, w, gb);
  if (!upload_packed(t, w, gb, rows, cols, &dp, &pb)) {
    CHECK_MSG(0, "pack %s %lld x %lld", tr->name, (long long)rows,
              (long long)cols);
    goto out;
  }
  got = sl_malloc(pb);
  want = sl_calloc(pb, 1);
  if (!got || !want)
    goto out;
  cudaMemcpy(got, dp, pb, cudaMemcpyDeviceToHost);
  if (!sl_kcu_type_packed(t)) {
    CHECK_EQ_INT(pb, gb);
    CHECK_MSG(pb == gb && memcmp(got, w, gb) == 0, "copy %s", tr->name);
    goto out;
  }
  const int qb = t == SL_GGML_Q8_0 ? 32 : 16, sb = t == SL_GGML_Q4_1 ? 4 : 2;
  const int64_t nb = cols / 32, tiles = (rows + 15) / 16;
  const size_t tb = (size_t)(16 * nb * (qb + sb));
  CHECK_EQ_INT(pb, (size_t)tiles * tb);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t b = 0; b < nb; b++) {
      const uint8_t *blk = w + (size_t)r * rb + (size_t)b * (size_t)(qb + sb);
      uint8_t *tile = want + (size_t)(r / 16) * tb;
      for (int c = 0; c < qb / 16; c++)
        memcpy(tile +
                   ((size_t)(b * (qb / 16) + c) * 16 + (size_t)(r % 16)) * 16,
               blk + sb + 16 * c, 16);
      memcpy(tile + (size_t)(16 * nb * qb) +
                 ((size_t)b * 16 + (size_t)(r % 16)) * (size_t)sb,
             blk, (size_t)sb);
    }
  size_t first = pb;
  for (size_t i = 0; i < pb && first == pb; i++)
    if (got[i] != want[i])
      first = i;
  CHECK_MSG(first == pb, "pack %s %lld x %lld: byte %zu of %zu differs",
            tr->name, (long long)rows, (long long)cols, first, pb);
out:
  cudaFree(dp);
  sl_free(w);
  sl_free(got);
  sl_free(want);
}

static void test_pack(void) {
  CHECK(sl_kcu_type_packed(SL_GGML_Q4_0));
  CHECK(sl_kcu_type_packed(SL_GGML_Q4_1));
  CHECK(sl_kcu_type_packed(SL_GGML_Q8_0));
  CHECK(!sl_kcu_type_packed(SL_GGML_Q4_K));
  CHECK(!sl_kcu_type_packed(SL_GGML_F16));
  /* 4096 x 4096: 256 tiles of 16 rows x 128 blocks x (quants + scales) */
  CHECK_EQ_INT(sl_kcu_packed_bytes(SL_GGML_Q4_0, 4096, 4096),
               256u * 16 * 128 * 18);
  CHECK_EQ_INT(sl_kcu_packed_bytes(SL_GGML_Q4_1, 17, 64), 2u * 16 * 2 * 20);
  CHECK_EQ_INT(sl_kcu_packed_bytes(SL_GGML_Q8_0, 1, 32), 16u * 34);
  CHECK_EQ_INT(sl_kcu_packed_bytes(SL_GGML_Q4_K, 3, 256), 3u * 144);
  CHECK_EQ_INT(sl_kcu_packed_bytes(SL_GGML_F32, 3, 5), 60);
  CHECK_EQ_INT(sl_kcu_packed_bytes(SL_GGML_Q4_0, 3, 48), 0);
  CHECK_EQ_INT(sl_kcu_packed_bytes(SL_GGML_Q5_0, 3, 64), 3u * 2 * 22);
  CHECK_EQ_INT(sl_kcu_packed_bytes(SL_GGML_Q3_K, 2, 512), 2u * 2 * 110);
  CHECK_EQ_INT(sl_kcu_packed_bytes(SL_GGML_Q2_K, 2, 288), 0);
  CHECK_EQ_INT(sl_kcu_packed_bytes(SL_GGML_Q8_K, 3, 256), 0);
  CHECK_EQ_INT(sl_kcu_packed_bytes(SL_GGML_Q4_0, 0, 64), 0);
  CHECK_EQ_INT(sl_kcu_packed_bytes(SL_GGML_Q4_0, INT64_MAX / 2, 1 << 20),
               SIZE_MAX);
  for (size_t i = 0; i < N_TYPES; i++) {
    sl_ggml_type t = k_types[i];
    check_pack(t, 37, is_k(t) ? 512 : 96);
    check_pack(t, 16, is_k(t) ? 256 : 64);
  }
  /* arguments */
  void *a = NULL, *b = NULL;
  if (cudaMalloc(&a, 4096) != cudaSuccess ||
      cudaMalloc(&b, 4096) != cudaSuccess) {
    CHECK_MSG(0, "cudaMalloc");
    goto out;
  }
  CHECK_EQ_INT(sl_kcu_pack(g_s, SL_GGML_Q8_K, a, b, 2, 256),
               SL_ERR_UNSUPPORTED);
  CHECK_EQ_INT(sl_kcu_pack(g_s, SL_GGML_IQ4_XS, a, b, 2, 288),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kcu_pack(g_s, SL_GGML_Q4_0, a, b, 2, 48), SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kcu_pack(g_s, SL_GGML_Q4_0, a, (char *)b + 8, 2, 64),
               SL_ERR_INVALID_ARG); /* dst not 16-byte aligned */
  CHECK_EQ_INT(sl_kcu_pack(g_s, SL_GGML_Q4_0, (char *)a + 1, b, 2, 64),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kcu_pack(g_s, SL_GGML_Q4_0, a, b, -1, 64),
               SL_ERR_INVALID_ARG);
  CHECK_OK(sl_kcu_pack(g_s, SL_GGML_Q4_0, a, b, 0, 64));
  CHECK_EQ_INT(cudaStreamSynchronize(g_s), cudaSuccess);
out:
  cudaFree(a);
  cudaFree(b);
}

/* ---- arguments ------------------------------------------------------------
 */

static void test_args(void) {
  for (size_t i = 0; i < N_TYPES; i++)
    CHECK(sl_kcu_type_supported(k_types[i]));
  CHECK(!sl_kcu_type_supported(SL_GGML_Q8_1));
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

  sl_kern_weight w = {SL_GGML_Q8_K, 64, 256, dw, NULL};
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 1, NULL, 0), SL_ERR_UNSUPPORTED);
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 16, scratch, 1 << 20),
               SL_ERR_UNSUPPORTED);
  CHECK_EQ_INT(sl_kcu_get_rows(g_s, SL_GGML_Q8_K, dw, 256, dids, 1, dy),
               SL_ERR_UNSUPPORTED);

  w = (sl_kern_weight){SL_GGML_Q4_0, 64, 48, dw,
                       NULL}; /* not a multiple of 32 */
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 1, NULL, 0), SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 16, scratch, 1 << 20),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kcu_get_rows(g_s, SL_GGML_Q4_0, dw, 48, dids, 1, dy),
               SL_ERR_INVALID_ARG);
  w = (sl_kern_weight){SL_GGML_Q6_K, 64, 288, dw,
                       NULL}; /* not a multiple of 256 */
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 2, NULL, 0), SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kcu_get_rows(g_s, SL_GGML_Q6_K, dw, 288, dids, 1, dy),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, -1, NULL, 0), SL_ERR_INVALID_ARG);
  w = (sl_kern_weight){SL_GGML_Q3_K, 64, 576, dw, NULL}; /* 2.25 blocks */
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 1, NULL, 0), SL_ERR_INVALID_ARG);
  w = (sl_kern_weight){SL_GGML_Q5_1, 64, 80, dw, NULL}; /* 2.5 blocks */
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 1, NULL, 0), SL_ERR_INVALID_ARG);
  /* the 4-byte loads of Q5_1, Q2_K, IQ4_XS; Q5_0, Q3_K take 2-byte data */
  w = (sl_kern_weight){SL_GGML_Q5_1, 64, 64, (char *)dw + 2, NULL};
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 1, NULL, 0), SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(
      sl_kcu_get_rows(g_s, SL_GGML_IQ4_XS, (char *)dw + 2, 256, dids, 1, dy),
      SL_ERR_INVALID_ARG);
  w = (sl_kern_weight){SL_GGML_Q3_K, 4, 256, (char *)dw + 2, NULL};
  CHECK_OK(sl_kcu_matmul(g_s, &w, dx, dy, 1, NULL, 0));
  /* packed data must be 16-byte aligned (its 16-byte loads) */
  w = (sl_kern_weight){SL_GGML_Q8_0, 64, 64, (char *)dw + 8, NULL};
  CHECK_EQ_INT(sl_kcu_matmul(g_s, &w, dx, dy, 1, NULL, 0), SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(
      sl_kcu_get_rows(g_s, SL_GGML_Q8_0, (char *)dw + 8, 64, dids, 1, dy),
      SL_ERR_INVALID_ARG);

  /* scratch: 0 on the matrix-vector path and for F32; W and X in f16, each
   * rounded up to 256 bytes, otherwise */
  w = (sl_kern_weight){SL_GGML_Q4_0, 100, 96, dw, NULL};
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
static void check_invariance2(sl_ggml_type t, sl_kcu_mm_path path, int n,
                              int64_t rows, int64_t cols) {
  mm_case c;
  if (!case_init2(&c, t, rows, cols, n, false)) {
    CHECK_MSG(0, "case_init %d", (int)t);
    case_fini(&c);
    return;
  }
  sl_kern_weight w = {t, c.rows, c.cols, c.dw, NULL};
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
  fprintf(stderr, "   %-5s %s %lldx%lld n=%d: %d token(s) differ alone\n",
          sl_ggml_type_traits_of(t)->name,
          path == SL_KCU_MM_VEC ? "vec " : "gemm", (long long)rows,
          (long long)cols, n, diff);
  CHECK_MSG(diff == 0, "%s path %d: a token alone differs from its batch",
            sl_ggml_type_traits_of(t)->name, (int)path);
  if (scratch)
    cudaFree(scratch);
  sl_free(all);
  sl_free(one);
  case_fini(&c);
}

static void check_invariance(sl_ggml_type t, sl_kcu_mm_path path, int n) {
  int64_t cols = sl_ggml_type_traits_of(t)->blck_size == 256 ? 768 : 576;
  check_invariance2(t, path, n, 1000, cols);
}

/* sl_kcu_matmul_vec_split: each part's outputs are, bit for bit, the rows
 * of the plain matrix-vector product of the stacked weight, in their own
 * arrays (q, k, v of different heights; a last part not a multiple of 16). */
static void check_split(sl_ggml_type t, int n) {
  if (!sl_kcu_split_ok(t)) {
    fprintf(stderr, "   split: %s not on the tensor-core kernel, skipped\n",
            sl_ggml_type_traits_of(t)->name);
    return;
  }
  const int64_t parts[3] = {576, 192, 200}, rows = 968, cols = 576;
  mm_case c;
  if (!case_init2(&c, t, rows, cols, n, false)) {
    CHECK_MSG(0, "case_init %d", (int)t);
    case_fini(&c);
    return;
  }
  sl_kern_weight w = {t, rows, cols, c.dw, NULL};
  float *dys = NULL;
  CHECK_EQ_INT(cudaMalloc((void **)&dys, sizeof(float) * (size_t)(n * rows)),
               cudaSuccess);
  float *all = sl_malloc(sizeof(float) * (size_t)(n * rows));
  float *sp = sl_malloc(sizeof(float) * (size_t)(n * rows));
  CHECK_OK(sl_kcu_matmul_path(g_s, &w, c.dx, c.dy, n, SL_KCU_MM_VEC, NULL, 0));
  sl_kcu_split split = {
      3,
      {parts[0], parts[1], parts[2]},
      {dys, dys + n * parts[0], dys + n * (parts[0] + parts[1])}};
  CHECK_OK(sl_kcu_matmul_vec_split(g_s, &w, c.dx, n, &split));
  CHECK_EQ_INT(cudaStreamSynchronize(g_s), cudaSuccess);
  cudaMemcpy(all, c.dy, sizeof(float) * (size_t)(n * rows),
             cudaMemcpyDeviceToHost);
  cudaMemcpy(sp, dys, sizeof(float) * (size_t)(n * rows),
             cudaMemcpyDeviceToHost);
  int bad = 0;
  int64_t r0 = 0, off = 0;
  for (int p = 0; p < 3; p++) {
    for (int tk = 0; tk < n; tk++)
      bad += memcmp(sp + off + tk * parts[p], all + tk * rows + r0,
                    sizeof(float) * (size_t)parts[p]) != 0;
    off += n * parts[p];
    r0 += parts[p];
  }
  fprintf(stderr, "   split %-5s n=%d: %d part rows differ\n",
          sl_ggml_type_traits_of(t)->name, n, bad);
  CHECK_MSG(bad == 0,
            "%s split n=%d: %d token rows differ from the plain product",
            sl_ggml_type_traits_of(t)->name, n, bad);
  /* a part other than the last must be a multiple of 16 rows */
  sl_kcu_split odd = {2, {200, 768}, {dys, dys + n * 200}};
  CHECK(sl_kcu_matmul_vec_split(g_s, &w, c.dx, n, &odd) == SL_ERR_INVALID_ARG);
  cudaFree(dys);
  sl_free(all);
  sl_free(sp);
  case_fini(&c);
}

static void test_split(void) {
  const sl_ggml_type ts[] = {SL_GGML_Q4_0, SL_GGML_Q4_1, SL_GGML_Q8_0};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
    check_split(ts[i], 1);
    check_split(ts[i], 13);
    check_split(ts[i], 67);
  }
}

/* The tensor-core product loads its first weights before its pdl_wait()
 * (src/kern/cuda/pdl.cuh) but reads x only after it: x holds zeros until a
 * slow kernel (which lets the product start at once) copies the real tokens
 * in 20 ms later, and the product must give the same bits as on the real x
 * (one token: two register stages; 13: one). Without the wait it reads the
 * zeros. */
static void test_pdl_order(void) {
  const sl_ggml_type ts[] = {SL_GGML_Q4_0, SL_GGML_Q4_1, SL_GGML_Q8_0};
  const int ns[] = {1, 13};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    for (size_t j = 0; j < 2; j++) {
      const int n = ns[j];
      const int64_t rows = 1000, cols = 576;
      mm_case c;
      if (!case_init2(&c, ts[i], rows, cols, n, false)) {
        CHECK_MSG(0, "case_init %d", (int)ts[i]);
        case_fini(&c);
        continue;
      }
      sl_kern_weight w = {ts[i], rows, cols, c.dw, NULL};
      const size_t xb = sizeof(float) * (size_t)(n * cols),
                   yb = sizeof(float) * (size_t)(n * rows);
      float *ref = sl_malloc(yb), *got = sl_malloc(yb),
            *zero = sl_calloc(1, xb);
      float *dsrc = NULL;
      CHECK_EQ_INT(cudaMalloc((void **)&dsrc, xb), cudaSuccess);
      CHECK_OK(
          sl_kcu_matmul_path(g_s, &w, c.dx, c.dy, n, SL_KCU_MM_VEC, NULL, 0));
      CHECK_EQ_INT(
          cudaMemcpyAsync(dsrc, c.dx, xb, cudaMemcpyDeviceToDevice, g_s),
          cudaSuccess);
      CHECK_EQ_INT(cudaStreamSynchronize(g_s), cudaSuccess);
      cudaMemcpy(ref, c.dy, yb, cudaMemcpyDeviceToHost);
      CHECK_EQ_INT(h2d(c.dx, zero, xb), cudaSuccess);
      CHECK_OK(sl__kcu_test_slow_copy(g_s, c.dx, dsrc, n * cols, 20.0));
      CHECK_OK(
          sl_kcu_matmul_path(g_s, &w, c.dx, c.dy, n, SL_KCU_MM_VEC, NULL, 0));
      CHECK_EQ_INT(cudaStreamSynchronize(g_s), cudaSuccess);
      cudaMemcpy(got, c.dy, yb, cudaMemcpyDeviceToHost);
      CHECK_MSG(memcmp(ref, got, yb) == 0,
                "%s n=%d: the product after a slow writer of x differs",
                sl_ggml_type_traits_of(ts[i])->name, n);
      cudaFree(dsrc);
      sl_free(ref);
      sl_free(got);
      sl_free(zero);
      case_fini(&c);
    }
}

static void test_batch_invariance(void) {
  /* packed, >= 2048 tiles: 2 tiles a thread block for <= 4 tokens, 1 for
   * more (n = 21 runs as 8 + 8 + 5, each token alone as 1); 16 warps along
   * the row */
  check_invariance2(SL_GGML_Q4_0, SL_KCU_MM_VEC, 21, 33000, 256);
  check_invariance2(SL_GGML_Q4_1, SL_KCU_MM_VEC, 21, 33000, 256);
  check_invariance2(SL_GGML_Q8_0, SL_KCU_MM_VEC, 21, 33000, 256);
  check_invariance2(SL_GGML_Q4_1, SL_KCU_MM_VEC, 21, 200, 4096);
  /* the tensor-core kernel: 8-token tiles up to 64 tokens a pass (n = 70 is
   * 64 + 6), 1, 2 or 4 row tiles a warp by the tile count and the tokens */
  check_invariance2(SL_GGML_Q4_0, SL_KCU_MM_VEC, 70, 33000, 256);
  check_invariance2(SL_GGML_Q4_1, SL_KCU_MM_VEC, 70, 9000, 512);
  check_invariance2(SL_GGML_Q8_0, SL_KCU_MM_VEC, 70, 1000, 4096);
  check_invariance2(SL_GGML_Q4_1, SL_KCU_MM_VEC, 40, 17000, 256);
  const sl_ggml_type ts[] = {SL_GGML_Q4_0, SL_GGML_Q4_1,   SL_GGML_Q8_0,
                             SL_GGML_F16,  SL_GGML_F32,    SL_GGML_Q6_K,
                             SL_GGML_Q5_0, SL_GGML_Q5_1,   SL_GGML_Q2_K,
                             SL_GGML_Q3_K, SL_GGML_IQ4_NL, SL_GGML_IQ4_XS};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
    check_invariance(ts[i], SL_KCU_MM_VEC, 21);
    check_invariance(ts[i], SL_KCU_MM_GEMM, 37);
  }
}

/* The device's pure read bandwidth (sl_kcu_read_bench over 2 GiB), GB/s. */
static double read_peak(void) {
  const size_t bytes = (size_t)2 << 30;
  void *buf = NULL;
  unsigned *sink = NULL;
  double best = 0;
  if (cudaMalloc(&buf, bytes) != cudaSuccess ||
      cudaMalloc((void **)&sink, 4) != cudaSuccess)
    goto out;
  cudaMemset(buf, 1, bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int r = 0; r < 6; r++) {
    cudaEventRecord(e0, g_s);
    sl_kcu_read_bench(g_s, buf, bytes, sink);
    cudaEventRecord(e1, g_s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (r > 0 && bytes / (ms * 1e6) > best)
      best = (double)bytes / (ms * 1e6);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
out:
  cudaFree(buf);
  cudaFree(sink);
  return best;
}

static void bench_one(sl_ggml_type t, int64_t rows, int64_t cols, double peak) {
  const sl_ggml_type_traits *tr = sl_ggml_type_traits_of(t);
  mm_case c;
  enum { NB = 512 };
  if (!case_init2(&c, t, rows, cols, NB, false)) {
    fprintf(stderr, "bench setup failed\n");
    case_fini(&c);
    return;
  }
  /* the bytes the kernels read: the packed matrix, else the GGUF bytes */
  const double wbytes = (double)sl_kcu_packed_bytes(t, rows, cols);
  sl_kern_weight w = {t, rows, cols, c.dw, NULL};
  size_t sb = sl_kcu_matmul_scratch_bytes(&w, NB);
  void *scratch = NULL;
  if (sb && cudaMalloc(&scratch, sb) != cudaSuccess) {
    fprintf(stderr, "bench scratch failed\n");
    case_fini(&c);
    return;
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  static const int ns[] = {1, 2, 4, 8, NB};
  for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
    const int n = ns[j], reps = n == NB ? 10 : 100;
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
    double sec = ms / 1e3 / reps, gbs = wbytes / sec / 1e9;
    printf("%-5s %6lld x %-6lld n=%-3d %9.1f us  %7.1f GB/s weights (%3.0f%% "
           "of read)  %8.1f GFLOP/s  (%s)\n",
           tr->name, (long long)rows, (long long)cols, n, sec * 1e6, gbs,
           peak > 0 ? 100.0 * gbs / peak : 0.0,
           2.0 * (double)rows * (double)cols * n / sec / 1e9,
           sl_status_str(st));
    fflush(stdout);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(scratch);
  case_fini(&c);
}

/* --bench [type name]: all types, or the one named (e.g. q4_0). */
static void bench(const char *only) {
  static const sl_ggml_type ts[] = {SL_GGML_Q4_0, SL_GGML_Q4_1, SL_GGML_Q8_0,
                                    SL_GGML_F16,  SL_GGML_Q4_K, SL_GGML_Q6_K,
                                    SL_GGML_Q5_0, SL_GGML_Q5_1, SL_GGML_IQ4_NL,
                                    SL_GGML_Q2_K, SL_GGML_Q3_K, SL_GGML_IQ4_XS};
  static const int64_t shapes[][2] = {
      {4096, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
  /* and for the 32-element types the rows of 576 (not a multiple of 256)
   * that Q4_K_M / Q5_K_M files of SmolLM2-class models hold as Q5_0, Q5_1
   * (ffn_gate / ffn_up, and a 49152-token output matrix) */
  static const int64_t narrow[][2] = {{1536, 576}, {49152, 576}};
  const double peak = read_peak();
  printf("pure read (sl_kcu_read_bench): %.1f GB/s\n", peak);
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
    if (only && strcmp(only, sl_ggml_type_traits_of(ts[i])->name) != 0)
      continue;
    for (size_t j = 0; j < sizeof shapes / sizeof shapes[0]; j++)
      bench_one(ts[i], shapes[j][0], shapes[j][1], peak);
    if (sl_ggml_type_traits_of(ts[i])->blck_size == 32)
      for (size_t j = 0; j < sizeof narrow / sizeof narrow[0]; j++)
        bench_one(ts[i], narrow[j][0], narrow[j][1], peak);
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
  int setup = cuda_test_stream(&g_s);
  if (setup)
    return setup;
  if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
    bench(argc > 2 ? argv[2] : NULL);
  } else {
    RUN(test_pack);
    RUN(test_args);
    RUN(test_get_rows);
    RUN(test_matmul);
    RUN(test_batch_invariance);
    RUN(test_split);
    RUN(test_pdl_order);
  }
  /* the stream's cuBLAS handle stays in kern's list (its stream-fini hook
   * runs only for the backend's own streams): harmless at exit */
  cudaStreamDestroy(g_s);
  sl_rt_shutdown();
  return argc > 1 && strcmp(argv[1], "--bench") == 0 ? 0 : sl_test_finish();
#endif
}
