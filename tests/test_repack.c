/* Tests for repacked weights (sl_kern_repack_bytes, sl_kern_repack and the
 * packed kernels matmul takes for them): on each ISA level under test, for
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL (32 to 4096 columns, against Q8_0
 * activations) and Q4_K and Q6_K against Q8_K activations (256 to 4096
 * columns), rows not multiples of 8 among them,
 *   - the product within the f64 rounding bound of a chain of nb fmas, and
 *     within that bound of the scalar level's (unpacked) product;
 *   - the same bits as the AVX2 level's packed product (the VNNI levels'
 *     vpdpbusd kernels sum the same integers);
 *   - every entry (row, token) bit for bit the same whatever the number of
 *     tokens in the call (1, 2, 3, 5, 13, 64), the chunk of the prompt it
 *     lands in, the thread count and sl_kern_matmul_parts;
 *   - a packed copy of zeros gives zeros where a packed kernel runs (the
 *     packed path is taken) and the unpacked product where none does;
 *   - sizes: 0 on the scalar level, with SLUICE_REPACK=0, for other
 *     types.
 * SLUICE_ISA=scalar|avx2|... puts one level under test (ctest: test_repack_
 * <level>; 77 where this CPU lacks it), else every level the CPU has. */
#include <math.h>

#include "harness.h"
#include "isa_levels.h"
#include "kern/cpu/kern_cpu_impl.h"
#include "sluice/kern_cpu.h"
#include "sluice/util.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd_u64(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}
static float rnd_f(float lo, float hi) {
  return lo + (hi - lo) * (float)(rnd_u64() >> 40) / (float)(1 << 24);
}

static const sl_ggml_type k_types[] = {
    SL_GGML_Q4_0, SL_GGML_Q8_0,   SL_GGML_Q5_0, SL_GGML_Q4_1,
    SL_GGML_Q5_1, SL_GGML_IQ4_NL, SL_GGML_Q4_K, SL_GGML_Q6_K};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

static sl_kern_isa g_isas[SL_KERN_ISA_COUNT];
static int g_nisa;

static size_t row_bytes(sl_ggml_type t, int64_t n) {
  size_t b = 0;
  SL_ASSERT(sl_kern_row_bytes(t, n, &b) == SL_OK);
  return b;
}

static bool is_k(sl_ggml_type t) {
  return t == SL_GGML_Q4_K || t == SL_GGML_Q6_K;
}

static sl_ggml_type act_of(sl_ggml_type t) {
  return is_k(t) ? SL_GGML_Q8_K : SL_GGML_Q8_0;
}

/* The packed copy's bytes per row (the last group's padding rows aside). */
static size_t packed_row_bytes(sl_ggml_type t, int64_t cols) {
  if (t == SL_GGML_Q4_K)
    return (size_t)(cols / 256) * 148;
  if (t == SL_GGML_Q6_K)
    return (size_t)(cols / 256) * 274;
  return row_bytes(t, cols);
}

/* Random blocks: every quant bit pattern, scales d (and Q4_K's dmin)
 * 0.001..0.02. */
static void fill_random(sl_ggml_type t, uint8_t *p, int64_t n) {
  size_t bb;
  int64_t be;
  SL_ASSERT(sl_kern_type_block(t, &be, &bb));
  for (int64_t b = 0; b < n / be; b++, p += bb) {
    for (size_t k = 0; k < bb; k++)
      p[k] = (uint8_t)rnd_u64();
    uint16_t h = sl__f32_to_f16(rnd_f(0.001f, 0.02f));
    uint16_t m = sl__f32_to_f16(rnd_f(0.001f, 0.02f));
    if (t == SL_GGML_Q6_K) {
      memcpy(p + offsetof(sl__block_q6_K, d), &h, 2);
    } else {
      memcpy(p, &h, 2); /* d first in the others */
      if (t == SL_GGML_Q4_K || t == SL_GGML_Q4_1 || t == SL_GGML_Q5_1)
        memcpy(p + 2, &m, 2); /* dmin or m */
    }
  }
}

/* f64 dot of the dequantized row and activations, and sum |w x|. */
static double ref_dot(sl_ggml_type t, int64_t n, const void *w, const void *xq,
                      double *absum) {
  float *wf = sl_malloc(n * sizeof(float)), *xf = sl_malloc(n * sizeof(float));
  SL_ASSERT(sl_kern_dequant_row(t, w, wf, n) == SL_OK);
  SL_ASSERT(sl_kern_dequant_row(act_of(t), xq, xf, n) == SL_OK);
  double s = 0, a = 0;
  for (int64_t i = 0; i < n; i++) {
    s += (double)wf[i] * xf[i];
    a += fabs((double)wf[i] * xf[i]);
  }
  sl_free(wf);
  sl_free(xf);
  *absum = a;
  return s;
}

/* Q4_1 and Q5_1: the scalar level's dot takes Q8_1 activations, whose sum
 * term s = d * sum(q) is rounded to f16 from the unrounded d (as ggml's):
 * its product is off f64 by up to 2^-10 sum |m_w s| more than the packed
 * one, which uses the exact sum. That sum for one row and token (0 for the
 * other types). */
static double m_term_abs(sl_ggml_type t, int64_t cols, const uint8_t *w,
                         const uint8_t *xq) {
  if (t != SL_GGML_Q4_1 && t != SL_GGML_Q5_1)
    return 0;
  const size_t wb =
      t == SL_GGML_Q4_1 ? sizeof(sl__block_q4_1) : sizeof(sl__block_q5_1);
  double a = 0;
  for (int64_t i = 0; i < cols / 32; i++) {
    uint16_t m;
    memcpy(&m, w + i * wb + 2, 2);
    const sl__block_q8_0 *x = (const sl__block_q8_0 *)xq + i;
    int32_t q = 0;
    for (int k = 0; k < 32; k++)
      q += x->qs[k];
    a += fabs((double)sl__f16_to_f32(m) * sl__f16_to_f32(x->d) * q);
  }
  return a;
}

/* The levels with packed kernels: all but scalar. */
static bool has_packed(sl_kern_isa isa) {
  return isa != SL_KERN_ISA_SCALAR;
}

static void test_bytes(void) {
  uint8_t wb[210 * 4] = {0};
  uint8_t dst[2192 * 2];
  for (int k = 0; k < g_nisa; k++) {
    CHECK_OK(sl_kern_cpu_set_isa(g_isas[k]));
    bool scalar = !has_packed(g_isas[k]);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
      const int64_t cols = is_k(k_types[ti]) ? 256 : 32;
      sl_kern_weight W = {k_types[ti], 3, cols, wb, NULL};
      size_t want = scalar ? 0 : 8 * packed_row_bytes(k_types[ti], cols);
      CHECK_MSG(sl_kern_repack_bytes(&W) == want, "type %d isa %s: %zu",
                k_types[ti], sl_kern_isa_name(g_isas[k]),
                sl_kern_repack_bytes(&W));
      if (scalar) {
        CHECK_EQ_INT(sl_kern_repack(&W, dst, sizeof dst), SL_ERR_UNSUPPORTED);
        continue;
      }
      CHECK_EQ_INT(sl_kern_repack(&W, dst, want - 1), SL_ERR_INVALID_ARG);
      CHECK_OK(sl_kern_repack(&W, dst, want));
      setenv("SLUICE_REPACK", "0", 1);
      CHECK_EQ_INT((int)sl_kern_repack_bytes(&W), 0);
      CHECK_EQ_INT(sl_kern_repack(&W, dst, want), SL_ERR_UNSUPPORTED);
      unsetenv("SLUICE_REPACK");
      CHECK(sl_kern_repack_bytes(&W) == want);
      sl_kern_weight odd = {k_types[ti], 3, cols + 16, wb, NULL};
      CHECK_EQ_INT((int)sl_kern_repack_bytes(&odd), 0);
    }
    /* types without a packed kernel (yet) */
    sl_kern_weight q2k = {SL_GGML_Q2_K, 3, 256, wb, NULL};
    sl_kern_weight f32 = {SL_GGML_F32, 8, 32, wb, NULL};
    CHECK_EQ_INT((int)sl_kern_repack_bytes(&q2k), 0);
    CHECK_EQ_INT((int)sl_kern_repack_bytes(&f32), 0);
  }
}

/* The product and its invariances for one type, shape and ISA. */
static void check_shape(sl_kern_isa isa, sl_ggml_type t, int64_t rows,
                        int64_t cols, sl_kern_pool_t *const *pools) {
  enum { MAXT = 64 };
  const char *in = sl_kern_isa_name(isa);
  const int64_t nb = cols / 32;
  const size_t wrb = row_bytes(t, cols), xrb = row_bytes(act_of(t), cols);
  uint8_t *w = sl_malloc(wrb * rows);
  float *X = sl_malloc(MAXT * cols * sizeof(float));
  uint8_t *xq = sl_malloc(xrb * MAXT);
  float *full = sl_malloc(MAXT * rows * sizeof(float));
  float *scal = sl_malloc(MAXT * rows * sizeof(float));
  float *got = sl_malloc(MAXT * rows * sizeof(float));
  SL_ASSERT(w && X && xq && full && scal && got);
  fill_random(t, w, cols * rows);
  for (int64_t i = 0; i < MAXT * cols; i++)
    X[i] = rnd_f(-1, 1);
  CHECK_OK(sl_kern_cpu_set_isa(SL_KERN_ISA_SCALAR));
  sl_kern_weight W = {t, rows, cols, w, NULL};
  CHECK_OK(sl_kern_matmul(pools[1], &W, X, scal, MAXT));
  for (int64_t tt = 0; tt < MAXT; tt++)
    CHECK_OK(
        sl_kern_quantize_act(act_of(t), X + tt * cols, xq + tt * xrb, cols));

  CHECK_OK(sl_kern_cpu_set_isa(isa));
  size_t pb = sl_kern_repack_bytes(&W);
  CHECK(pb == (size_t)((rows + 7) / 8) * 8 * packed_row_bytes(t, cols));
  void *packed = sl_malloc(pb);
  SL_ASSERT(packed);
  CHECK_OK(sl_kern_repack(&W, packed, pb));
  W.packed = packed;
  CHECK_OK(sl_kern_matmul(pools[1], &W, X, full, MAXT));

  /* within the bound of f64, and of the scalar level's product */
  int off = 0, soff = 0;
  double worst = 0;
  for (int64_t tt = 0; tt < MAXT; tt++)
    for (int64_t r = 0; r < rows; r++) {
      double absum;
      double want = ref_dot(t, cols, w + r * wrb, xq + tt * xrb, &absum);
      double tol = (double)(nb + 8) * 6e-8 * absum + 1e-9;
      double e = fabs(full[tt * rows + r] - want);
      double stol = 2 * tol + 0x1.02p-10 * m_term_abs(t, cols, w + r * wrb,
                                                      xq + tt * xrb);
      off += !(e <= tol);
      soff += !(fabs(full[tt * rows + r] - scal[tt * rows + r]) <= stol);
      if (e / tol > worst)
        worst = e / tol;
    }
  CHECK_MSG(off == 0 && soff == 0,
            "type %d %lldx%lld %s: %d off f64 (worst %.2f of the bound), %d "
            "off the scalar level",
            t, (long long)rows, (long long)cols, in, off, worst, soff);
  /* the same bits as the AVX2 level's kernels on the same packed copy */
  if (isa != SL_KERN_ISA_AVX2 && sl_kern_cpu_isa_supported(SL_KERN_ISA_AVX2)) {
    CHECK_OK(sl_kern_cpu_set_isa(SL_KERN_ISA_AVX2));
    CHECK_OK(sl_kern_matmul(pools[1], &W, X, got, MAXT));
    CHECK_MSG(memcmp(got, full, (size_t)(MAXT * rows) * sizeof(float)) == 0,
              "type %d %lldx%lld: %s and avx2 differ bitwise", t,
              (long long)rows, (long long)cols, in);
    CHECK_OK(sl_kern_cpu_set_isa(isa));
  }

  /* the same bits whatever the call's token count, threads and chunking */
  static const int64_t ns[] = {1, 2, 3, 5, 13, 64};
  int diff = 0;
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
    for (int p = 0; p < 2; p++) {
      memset(got, 0xff, MAXT * rows * sizeof(float));
      CHECK_OK(sl_kern_matmul(pools[p], &W, X, got, ns[k]));
      diff += memcmp(got, full, (size_t)(ns[k] * rows) * sizeof(float)) != 0;
    }
  /* chunkings of the 64 tokens: each chunk starts the tiles afresh */
  static const int64_t chunks[][8] = {
      {1, 63}, {3, 5, 7, 49}, {13, 13, 13, 13, 12}, {2, 2, 2, 58}, {64}};
  for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
    int64_t t0 = 0;
    for (int k = 0; k < 8 && chunks[c][k] > 0; k++) {
      int64_t n = chunks[c][k];
      CHECK_OK(sl_kern_matmul(pools[c & 1], &W, X + t0 * cols, got, n));
      diff += memcmp(got, full + t0 * rows,
                     (size_t)(n * rows) * sizeof(float)) != 0;
      t0 += n;
    }
    CHECK(t0 == MAXT);
  }
  /* as one part of several, next to an unpacked part of another type */
  {
    int64_t n = 5;
    uint8_t *w2 = sl_malloc(row_bytes(SL_GGML_F16, cols) * 3);
    fill_random(SL_GGML_F16, w2, cols * 3);
    sl_kern_weight W2 = {SL_GGML_F16, 3, cols, w2, NULL};
    float *y2 = sl_malloc(n * 3 * sizeof(float));
    const sl_kern_weight *ws[] = {&W2, &W};
    float *ys[] = {y2, got};
    CHECK_OK(sl_kern_matmul_parts(pools[1], ws, 2, X + 7 * cols, ys, n));
    diff +=
        memcmp(got, full + 7 * rows, (size_t)(n * rows) * sizeof(float)) != 0;
    sl_free(w2);
    sl_free(y2);
  }
  CHECK_MSG(diff == 0,
            "type %d %lldx%lld %s: %d calls differ bitwise from the 64-token "
            "call",
            t, (long long)rows, (long long)cols, in, diff);

  /* the packed copy is what the kernel reads: zeros give zeros */
  memset(packed, 0, pb);
  CHECK_OK(sl_kern_matmul(pools[0], &W, X, got, 3));
  int nz = 0;
  for (int64_t e = 0; e < 3 * rows; e++)
    nz += got[e] != 0.0f;
  CHECK_MSG(nz == 0, "type %d %s: %d nonzero from a zero packed copy", t, in,
            nz);
  /* a level without packed kernels reads `data` */
  CHECK_OK(sl_kern_cpu_set_isa(SL_KERN_ISA_SCALAR));
  CHECK_OK(sl_kern_matmul(pools[1], &W, X, got, 3));
  CHECK(memcmp(got, scal, (size_t)(3 * rows) * sizeof(float)) == 0);

  sl_free(packed);
  sl_free(w);
  sl_free(X);
  sl_free(xq);
  sl_free(full);
  sl_free(scal);
  sl_free(got);
}

static void test_packed_products(void) {
  static const int64_t shapes[][2] = {{37, 32},   {8, 64},    {13, 576},
                                      {40, 1536}, {19, 4096}, {5, 224},
                                      {64, 2048}};
  /* the K-quants' rows are multiples of 256 */
  static const int64_t shapes_k[][2] = {{37, 256},  {8, 512},   {13, 1536},
                                        {40, 2048}, {19, 4096}, {5, 256},
                                        {64, 1536}};
  sl_kern_pool_t *pools[2] = {sl_kern_pool_create(1), sl_kern_pool_create(2)};
  CHECK(pools[0] && pools[1]);
  int tested = 0;
  for (int k = 0; k < g_nisa; k++) {
    if (!has_packed(g_isas[k]))
      continue;
    tested++;
    for (size_t ti = 0; ti < N_TYPES; ti++)
      for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        check_shape(g_isas[k], k_types[ti],
                    is_k(k_types[ti]) ? shapes_k[s][0] : shapes[s][0],
                    is_k(k_types[ti]) ? shapes_k[s][1] : shapes[s][1], pools);
  }
  if (!tested)
    fprintf(stderr, "  (no level with packed kernels under test)\n");
  sl_kern_pool_destroy(pools[0]);
  sl_kern_pool_destroy(pools[1]);
}

int main(void) {
  int rc = sl_test_isa_levels(g_isas, &g_nisa);
  if (rc >= 0)
    return rc;
  unsetenv("SLUICE_REPACK");
  RUN(test_bytes);
  RUN(test_packed_products);
  return sl_test_finish();
}
