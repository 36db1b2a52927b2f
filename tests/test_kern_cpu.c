/* Tests for kern/cpu: every op on the ISA levels under test against float64
 * math on the dequantized operands (and against the scalar level where the
 * result must match it). Random data from fixed seeds.
 *
 * SLUICE_ISA=scalar|avx2|avx512 puts one level under test: ctest runs this
 * binary once per level (test_kern_cpu_scalar, _avx2, _avx512, registered in
 * cmake/kern_cpu.cmake). A level this CPU cannot run exits 77 (skipped); an
 * unknown name fails, and so does a run where the kernels did not pick the
 * level asked for. Without SLUICE_ISA every level the CPU has is tested. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "harness.h"
#include "isa_levels.h"
#include "kern/cpu/kern_cpu_k23.h"
#include "sluice/kern_cpu.h"
#include "sluice/util.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd_u64(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}
static float rnd_f(float lo, float hi) { /* uniform in [lo, hi) */
  return lo + (hi - lo) * (float)(rnd_u64() >> 40) / (float)(1 << 24);
}

static const sl_ggml_type k_wtypes[] = {
    SL_GGML_F32,  SL_GGML_F16,    SL_GGML_BF16, SL_GGML_Q4_0, SL_GGML_Q4_1,
    SL_GGML_Q8_0, SL_GGML_Q4_K,   SL_GGML_Q5_K, SL_GGML_Q6_K, SL_GGML_Q5_0,
    SL_GGML_Q5_1, SL_GGML_IQ4_NL, SL_GGML_Q2_K, SL_GGML_Q3_K, SL_GGML_IQ4_XS};
#define N_WTYPES (sizeof k_wtypes / sizeof k_wtypes[0])

/* The levels under test, set by main. */
static sl_kern_isa g_isas[SL_KERN_ISA_COUNT];
static int g_nisa;

static int isa_list(sl_kern_isa *out) {
  memcpy(out, g_isas, sizeof g_isas);
  return g_nisa;
}

static uint16_t f16_of(float f) {
  return sl__f32_to_f16(f);
}

/* Fills `n` elements of type t with random but well-formed blocks (every bit
 * pattern of the quants, scales of a realistic size). */
static void fill_random(sl_ggml_type t, void *dst, int64_t n) {
  int64_t be;
  size_t bb;
  SL_ASSERT(sl_kern_type_block(t, &be, &bb));
  uint8_t *p = dst;
  for (int64_t b = 0; b < n / be; b++, p += bb) {
    for (size_t k = 0; k < bb; k++)
      p[k] = (uint8_t)rnd_u64();
    uint16_t h;
    switch (t) {
    case SL_GGML_F32:
      *(float *)p = rnd_f(-1, 1);
      break;
    case SL_GGML_F16:
      h = f16_of(rnd_f(-1, 1));
      memcpy(p, &h, 2);
      break;
    case SL_GGML_BF16:
      h = (uint16_t)(sl__f32_bits(rnd_f(-1, 1)) >> 16);
      memcpy(p, &h, 2);
      break;
    case SL_GGML_Q4_0:
    case SL_GGML_Q5_0:
    case SL_GGML_IQ4_NL:
    case SL_GGML_Q8_0:
      ((sl__block_q4_0 *)p)->d = f16_of(rnd_f(0.001f, 0.02f));
      break;
    case SL_GGML_Q4_1:
    case SL_GGML_Q5_1:
      ((sl__block_q4_1 *)p)->d = f16_of(rnd_f(0.001f, 0.02f));
      ((sl__block_q4_1 *)p)->m = f16_of(rnd_f(-0.1f, 0.1f));
      break;
    case SL_GGML_Q4_K:
    case SL_GGML_Q5_K:
      ((sl__block_q4_K *)p)->d = f16_of(rnd_f(0.0001f, 0.002f));
      ((sl__block_q4_K *)p)->dmin = f16_of(rnd_f(0.0001f, 0.002f));
      break;
    case SL_GGML_Q6_K:
      ((sl__block_q6_K *)p)->d = f16_of(rnd_f(0.0001f, 0.001f));
      break;
    case SL_GGML_Q2_K:
      ((sl__block_q2_K *)p)->d = f16_of(rnd_f(0.0001f, 0.002f));
      ((sl__block_q2_K *)p)->dmin = f16_of(rnd_f(0.0001f, 0.002f));
      break;
    case SL_GGML_Q3_K:
      ((sl__block_q3_K *)p)->d = f16_of(rnd_f(0.0001f, 0.001f));
      break;
    case SL_GGML_IQ4_XS:
      ((sl__block_iq4_xs *)p)->d = f16_of(rnd_f(0.0001f, 0.001f));
      break;
    default:
      SL_ASSERT(0);
    }
  }
}

static size_t row_bytes(sl_ggml_type t, int64_t n) {
  size_t b = 0;
  SL_ASSERT(sl_kern_row_bytes(t, n, &b) == SL_OK);
  return b;
}

static int64_t block_of(sl_ggml_type t) {
  int64_t be;
  SL_ASSERT(sl_kern_type_block(t, &be, NULL));
  return be;
}

/* ----------------------------------------------------------------------------
 */

static void test_f16_roundtrip(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
      continue; /* NaN */
    if (sl__f32_to_f16(sl__f16_to_f32((uint16_t)h)) != h)
      bad++;
  }
  CHECK_EQ_INT(bad, 0);
  CHECK(sl__f32_to_f16(1.0f) == 0x3c00);
  CHECK(sl__f32_to_f16(65504.0f) == 0x7bff);
  CHECK(sl__f32_to_f16(1e6f) == 0x7c00);
  CHECK(sl__f32_to_f16(1.0f + 1.0f / 4096) == 0x3c00); /* tie to even */
  CHECK(sl__f32_to_f16(5.96046448e-8f) == 0x0001);     /* smallest subnormal */
}

static void test_type_info(void) {
  size_t b;
  CHECK_OK(sl_kern_row_bytes(SL_GGML_Q4_1, 576, &b));
  CHECK_EQ_INT(b, 18 * 20);
  CHECK_OK(sl_kern_row_bytes(SL_GGML_Q6_K, 512, &b));
  CHECK_EQ_INT(b, 420);
  CHECK_EQ_INT(sl_kern_row_bytes(SL_GGML_Q4_0, 33, &b), SL_ERR_INVALID_ARG);
  CHECK_OK(sl_kern_row_bytes(SL_GGML_Q5_0, 64, &b));
  CHECK_EQ_INT(b, 2 * 22);
  CHECK_OK(sl_kern_row_bytes(SL_GGML_Q5_1, 64, &b));
  CHECK_EQ_INT(b, 2 * 24);
  CHECK_OK(sl_kern_row_bytes(SL_GGML_IQ4_NL, 64, &b));
  CHECK_EQ_INT(b, 2 * 18);
  /* 16: a ggml type (IQ2_XXS) sluice does not know */
  CHECK_EQ_INT(sl_kern_row_bytes((sl_ggml_type)16, 256, &b),
               SL_ERR_UNSUPPORTED);
  float f[32];
  uint8_t raw[64] = {0};
  CHECK_EQ_INT(sl_kern_dequant_row((sl_ggml_type)16, raw, f, 256),
               SL_ERR_UNSUPPORTED); /* IQ2_XXS: no kernel */
  CHECK_EQ_INT(sl_kern_dequant_row(SL_GGML_Q8_0, raw, f, 31),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kern_cpu_set_isa((sl_kern_isa)7), SL_ERR_INVALID_ARG);
  sl_ggml_type a;
  CHECK_OK(sl_kern_act_type(SL_GGML_Q4_1, &a));
  CHECK_EQ_INT(a, SL_GGML_Q8_1);
  CHECK_OK(sl_kern_act_type(SL_GGML_Q5_K, &a));
  CHECK_EQ_INT(a, SL_GGML_Q8_K);
  CHECK_OK(sl_kern_act_type(SL_GGML_Q5_0, &a));
  CHECK_EQ_INT(a, SL_GGML_Q8_0);
  CHECK_OK(sl_kern_act_type(SL_GGML_IQ4_NL, &a));
  CHECK_EQ_INT(a, SL_GGML_Q8_0);
  CHECK_OK(sl_kern_act_type(SL_GGML_Q5_1, &a));
  CHECK_EQ_INT(a, SL_GGML_Q8_1);
  /* an activation type is no weight type */
  CHECK_EQ_INT(sl_kern_act_type(SL_GGML_Q8_1, &a), SL_ERR_UNSUPPORTED);
}

/* Dequantization on every ISA equals the scalar one (up to one rounding of
 * an fma). Known values pin the layouts. */
static void test_dequant(void) {
  sl_kern_isa isas[SL_KERN_ISA_COUNT];
  int ni = isa_list(isas);
  const int64_t n = 256 * 3;
  for (size_t ti = 0; ti < N_WTYPES; ti++) {
    sl_ggml_type t = k_wtypes[ti];
    void *w = sl_malloc(row_bytes(t, n));
    float *ref = sl_malloc(n * sizeof(float)),
          *got = sl_malloc(n * sizeof(float));
    fill_random(t, w, n);
    CHECK_OK(sl_kern_cpu_set_isa(SL_KERN_ISA_SCALAR));
    CHECK_OK(sl_kern_dequant_row(t, w, ref, n));
    for (int k = 0; k < ni; k++) {
      if (isas[k] == SL_KERN_ISA_SCALAR)
        continue; /* the reference itself: pinned by the known values below */
      CHECK_OK(sl_kern_cpu_set_isa(isas[k]));
      CHECK_OK(sl_kern_dequant_row(t, w, got, n));
      int bad = 0;
      for (int64_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - ref[i]) <= 1e-6f * fabsf(ref[i]) + 1e-9f))
          bad++;
      CHECK_MSG(bad == 0, "type %d isa %s: %d mismatches", t,
                sl_kern_isa_name(isas[k]), bad);
    }
    sl_free(w);
    sl_free(ref);
    sl_free(got);
  }
  /* hand-made blocks */
  CHECK_OK(sl_kern_cpu_set_isa(SL_KERN_ISA_SCALAR));
  sl__block_q4_0 b0 = {.d = f16_of(0.5f)};
  b0.qs[0] = 0x3A; /* x[0] = (10-8)*0.5 = 1, x[16] = (3-8)*0.5 = -2.5 */
  float f[32];
  CHECK_OK(sl_kern_dequant_row(SL_GGML_Q4_0, &b0, f, 32));
  CHECK(f[0] == 1.0f && f[16] == -2.5f && f[1] == -4.0f);
  sl__block_q4_1 b1 = {.d = f16_of(0.25f), .m = f16_of(-1.0f)};
  b1.qs[15] = 0xF1; /* x[15] = 1*0.25-1, x[31] = 15*0.25-1 */
  CHECK_OK(sl_kern_dequant_row(SL_GGML_Q4_1, &b1, f, 32));
  CHECK(f[15] == -0.75f && f[31] == 2.75f && f[0] == -1.0f);
  /* Q5: bit j of the little-endian qh is element j's fifth bit */
  sl__block_q5_0 b5 = {.d = f16_of(0.5f), .qh = {0x01, 0, 0, 0x80}};
  b5.qs[0] = 0x3A;  /* x[0] = (16+10-16)*0.5, x[16] = (3-16)*0.5 */
  b5.qs[15] = 0xF0; /* x[15] = -8, x[31] = (16+15-16)*0.5 = 7.5 */
  CHECK_OK(sl_kern_dequant_row(SL_GGML_Q5_0, &b5, f, 32));
  CHECK(f[0] == 5.0f && f[16] == -6.5f && f[15] == -8.0f && f[31] == 7.5f &&
        f[1] == -8.0f);
  sl__block_q5_1 b51 = {.d = f16_of(0.25f), .m = f16_of(-1.0f)};
  b51.qh[2] = 0x02; /* element 17 */
  b51.qs[1] = 0x21; /* x[1] = 1*0.25-1, x[17] = (16+2)*0.25-1 */
  CHECK_OK(sl_kern_dequant_row(SL_GGML_Q5_1, &b51, f, 32));
  CHECK(f[1] == -0.75f && f[17] == 3.5f && f[0] == -1.0f && f[16] == -1.0f);
  sl__block_iq4_nl bn = {.d = f16_of(0.5f)};
  bn.qs[3] = 0xF0; /* x[3] = -127*0.5, x[19] = 113*0.5 */
  CHECK_OK(sl_kern_dequant_row(SL_GGML_IQ4_NL, &bn, f, 32));
  CHECK(f[3] == -63.5f && f[19] == 56.5f && f[0] == -63.5f);
  float g[256];
  /* Q2_K: group 1 (elements 16..31) scale 2, min 3; x[16] = 0.5*2*3 - 0.25*3
   * (bits 0..1 of qs[16]), x[48] from bits 2..3 of qs[16], group 3 */
  sl__block_q2_K b2 = {.d = f16_of(0.5f), .dmin = f16_of(0.25f)};
  b2.scales[1] = 0x32;
  b2.scales[3] = 0x01;
  b2.qs[16] = 0x0B;
  CHECK_OK(sl_kern_dequant_row(SL_GGML_Q2_K, &b2, g, 256));
  CHECK(g[16] == 2.25f && g[17] == -0.75f && g[0] == 0.0f && g[48] == 1.0f);
  /* Q3_K: scale 0 = (5 | 1 << 4) - 32 = -11, scale 1 = -32; x[1] = -11 *
   * (2 - 4), x[0] = -11 * (0 - 4 + 4) (its hmask bit set), x[16] = -32 * -4,
   * x[32] takes bit 1 of hmask[0], x[33] (group 2, scale -32) not */
  sl__block_q3_K b3 = {.d = f16_of(1.0f)};
  b3.scales[0] = 5;
  b3.scales[8] = 1;
  b3.hmask[0] = 0x03;
  b3.qs[1] = 0x02;
  CHECK_OK(sl_kern_dequant_row(SL_GGML_Q3_K, &b3, g, 256));
  CHECK(g[1] == 22.0f && g[0] == 0.0f && g[16] == 128.0f && g[32] == 0.0f &&
        g[33] == 128.0f);
  /* IQ4_XS: sub-block 0 scale (1 | 2 << 4) - 32 = 1, sub-block 1 2 - 32 */
  sl__block_iq4_xs b4 = {.d = f16_of(0.5f), .scales_h = 0x0002};
  b4.scales_l[0] = 0x21;
  b4.qs[0] = 0xF0;
  CHECK_OK(sl_kern_dequant_row(SL_GGML_IQ4_XS, &b4, g, 256));
  CHECK(g[0] == -63.5f && g[16] == 56.5f && g[32] == 1905.0f);
}

/* Activation quantization: round trip within ~half a step on every ISA, and
 * the ISAs agree. */
static void test_quantize_act(void) {
  static const sl_ggml_type acts[] = {SL_GGML_Q8_0, SL_GGML_Q8_1, SL_GGML_Q8_K};
  sl_kern_isa isas[SL_KERN_ISA_COUNT];
  int ni = isa_list(isas);
  const int64_t n = 512;
  float x[512], back[512], ref[512];
  for (int i = 0; i < n; i++)
    x[i] = rnd_f(-3, 3) * (i % 37 == 0 ? 10.0f : 1.0f);
  for (int i = 64; i < 96; i++)
    x[i] = 0; /* an all-zero block */
  for (size_t a = 0; a < 3; a++) {
    int64_t be = block_of(acts[a]);
    uint8_t *q = sl_malloc(row_bytes(acts[a], n));
    CHECK_OK(sl_kern_cpu_set_isa(SL_KERN_ISA_SCALAR));
    CHECK_OK(sl_kern_quantize_act(acts[a], x, q, n));
    CHECK_OK(sl_kern_dequant_row(acts[a], q, ref, n));
    for (int k = 0; k < ni; k++) {
      CHECK_OK(sl_kern_cpu_set_isa(isas[k]));
      CHECK_OK(sl_kern_quantize_act(acts[a], x, q, n));
      CHECK_OK(sl_kern_dequant_row(acts[a], q, back, n));
      int bad = 0, differ = 0;
      for (int64_t b = 0; b < n / be; b++) {
        float amax = 0;
        for (int64_t i = b * be; i < (b + 1) * be; i++)
          amax = fmaxf(amax, fabsf(x[i]));
        float step = amax / 127;
        for (int64_t i = b * be; i < (b + 1) * be; i++) {
          if (!(fabsf(back[i] - x[i]) <= 0.57f * step + 1e-12f))
            bad++;
          if (!(fabsf(back[i] - ref[i]) <= 1.01f * step))
            differ++;
        }
      }
      CHECK_MSG(bad == 0 && differ == 0, "act %d isa %s: %d bad, %d differ",
                acts[a], sl_kern_isa_name(isas[k]), bad, differ);
      if (acts[a] == SL_GGML_Q8_1) { /* s = d * sum(q) */
        const sl__block_q8_1 *b = (const sl__block_q8_1 *)q;
        int sum = 0;
        for (int i = 0; i < 32; i++)
          sum += b[1].qs[i];
        CHECK(fabsf(sl__f16_to_f32(b[1].s) -
                    (float)sum * sl__f16_to_f32(b[1].d)) <=
              1e-3f * fabsf((float)sum * sl__f16_to_f32(b[1].d)) + 1e-6f);
      }
      if (acts[a] == SL_GGML_Q8_K) {
        const sl__block_q8_K *b = (const sl__block_q8_K *)q;
        int sum = 0;
        for (int i = 16; i < 32; i++)
          sum += b[1].qs[i];
        CHECK_EQ_INT(sum, b[1].bsums[1]);
      }
    }
    sl_free(q);
  }
}

/* f64 dot of dequantized w and dequantized activations, plus the sum of
 * |w x| for a rounding bound and the fp16-s slack of Q8_1. */
static double ref_dot(sl_ggml_type t, int64_t n, const void *w, const void *xq,
                      double *absum, double *slack) {
  sl_ggml_type act;
  SL_ASSERT(sl_kern_act_type(t, &act) == SL_OK);
  float *wf = sl_malloc(n * sizeof(float)), *xf = sl_malloc(n * sizeof(float));
  SL_ASSERT(sl_kern_dequant_row(t, w, wf, n) == SL_OK);
  SL_ASSERT(sl_kern_dequant_row(act, xq, xf, n) == SL_OK);
  double s = 0, a = 0, sl = 0;
  for (int64_t i = 0; i < n; i++) {
    s += (double)wf[i] * xf[i];
    a += fabs((double)wf[i] * xf[i]);
  }
  if (t == SL_GGML_Q4_1 || t == SL_GGML_Q5_1) {
    /* m * s with s rounded to f16, as ggml; both blocks start d, m */
    size_t bb;
    SL_ASSERT(sl_kern_type_block(t, NULL, &bb));
    const sl__block_q8_1 *xb = xq;
    for (int64_t b = 0; b < n / 32; b++) {
      const sl__block_q4_1 *wb =
          (const sl__block_q4_1 *)((const char *)w + (size_t)b * bb);
      sl += fabs(sl__f16_to_f32(wb->m) * sl__f16_to_f32(xb[b].s)) / 1024;
    }
  }
  sl_free(wf);
  sl_free(xf);
  *absum = a;
  *slack = sl;
  return s;
}

static void test_vec_dot_scalar_vs_f64(void) {
  CHECK_OK(sl_kern_cpu_set_isa(SL_KERN_ISA_SCALAR));
  for (size_t ti = 0; ti < N_WTYPES; ti++) {
    sl_ggml_type t = k_wtypes[ti], act;
    CHECK_OK(sl_kern_act_type(t, &act));
    int64_t be = block_of(t) > block_of(act) ? block_of(t) : block_of(act);
    for (int64_t nb = 1; nb <= 5; nb += 2) {
      int64_t n = be * nb + (be == 1 ? 13 : 0);
      void *w = sl_malloc(row_bytes(t, n));
      float *x = sl_malloc(n * sizeof(float));
      void *xq = sl_malloc(row_bytes(act, n));
      fill_random(t, w, n);
      for (int64_t i = 0; i < n; i++)
        x[i] = rnd_f(-2, 2);
      CHECK_OK(sl_kern_quantize_act(act, x, xq, n));
      float got;
      CHECK_OK(sl_kern_vec_dot(t, n, w, xq, &got));
      double absum, slack;
      double want = ref_dot(t, n, w, xq, &absum, &slack);
      CHECK_MSG(fabs(got - want) <= 2e-6 * absum + slack + 1e-9,
                "type %d n %lld: %.9g vs %.9g (|wx| %.3g)", t, (long long)n,
                got, want, absum);
      sl_free(w);
      sl_free(x);
      sl_free(xq);
    }
  }
}

/* Matmul: the scalar single-thread result and each ISA, n_tokens, thread
 * count against f64 per entry, within the float32 rounding bound of a dot
 * whose partial sums chain at most ~30 roundings: 2e-6 (~33 ulp of 1) times
 * sum |w x|, plus Q4_1's f16 rounding of s (see ref_dot). The bound comes
 * from the arithmetic, not from a measurement: every ISA must meet it. */
static void test_matmul(void) {
  static const int64_t toks[] = {1, 3, 17, 64};
  sl_kern_isa isas[SL_KERN_ISA_COUNT];
  int ni = isa_list(isas);
  sl_kern_pool_t *pools[2] = {sl_kern_pool_create(1), sl_kern_pool_create(2)};
  CHECK(pools[0] && pools[1]);
  const int64_t rows = 37;
  for (size_t ti = 0; ti < N_WTYPES; ti++) {
    sl_ggml_type t = k_wtypes[ti], act;
    CHECK_OK(sl_kern_act_type(t, &act));
    int64_t be = block_of(t) > block_of(act) ? block_of(t) : block_of(act);
    int64_t cols = be == 1 ? 203 : (be == 32 ? 32 * 7 : 256 * 3);
    size_t wrb = row_bytes(t, cols);
    uint8_t *w = sl_malloc(wrb * rows);
    fill_random(t, w, cols * rows);
    sl_kern_weight W = {t, rows, cols, w, NULL};
    int64_t maxt = 64;
    float *X = sl_malloc(maxt * cols * sizeof(float));
    float *ref = sl_malloc(maxt * rows * sizeof(float));
    float *got = sl_malloc(maxt * rows * sizeof(float));
    double *want = sl_malloc(maxt * rows * sizeof(double));
    double *tol = sl_malloc(maxt * rows * sizeof(double));
    uint8_t *xq = sl_malloc(row_bytes(act, cols));
    for (int64_t i = 0; i < maxt * cols; i++)
      X[i] = rnd_f(-1, 1);
    for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
      int64_t nt = toks[k];
      CHECK_OK(sl_kern_cpu_set_isa(SL_KERN_ISA_SCALAR));
      CHECK_OK(sl_kern_matmul(NULL, &W, X, ref, nt));
      /* scalar vs f64 */
      int bad = 0;
      double worst = 0;
      for (int64_t tt = 0; tt < nt; tt++) {
        CHECK_OK(sl_kern_quantize_act(act, X + tt * cols, xq, cols));
        for (int64_t r = 0; r < rows; r++) {
          double absum, slack;
          int64_t e = tt * rows + r;
          want[e] = ref_dot(t, cols, w + r * wrb, xq, &absum, &slack);
          tol[e] = 2e-6 * absum + slack + 1e-9;
          double err = fabs(ref[e] - want[e]);
          if (err > tol[e])
            bad++;
          if (err / tol[e] > worst)
            worst = err / tol[e];
        }
      }
      CHECK_MSG(bad == 0, "type %d nt %lld: %d entries off f64 (worst %.2f)", t,
                (long long)nt, bad, worst);
      for (int ki = 0; ki < ni; ki++)
        for (int p = 0; p < 2; p++) {
          CHECK_OK(sl_kern_cpu_set_isa(isas[ki]));
          memset(got, 0xff, nt * rows * sizeof(float));
          CHECK_OK(sl_kern_matmul(pools[p], &W, X, got, nt));
          int off = 0;
          for (int64_t i = 0; i < nt * rows; i++)
            if (!(fabs(got[i] - want[i]) <= tol[i]))
              off++;
          CHECK_MSG(off == 0, "type %d isa %s nt %lld threads %d: %d off", t,
                    sl_kern_isa_name(isas[ki]), (long long)nt, p + 1, off);
          /* every entry is bit for bit the same ISA's one-row dot: token
           * tiles and two-row tiles only share loads, never reorder sums */
          int diff = 0;
          for (int64_t tt = 0; tt < nt; tt++) {
            const void *xa = X + tt * cols;
            if (act != SL_GGML_F32) {
              CHECK_OK(sl_kern_quantize_act(act, X + tt * cols, xq, cols));
              xa = xq;
            }
            for (int64_t r = 0; r < rows; r++) {
              float one;
              CHECK_OK(sl_kern_vec_dot(t, cols, w + r * wrb, xa, &one));
              if (memcmp(&one, &got[tt * rows + r], sizeof one) != 0)
                diff++;
            }
          }
          CHECK_MSG(diff == 0,
                    "type %d isa %s nt %lld threads %d: %d entries differ "
                    "from the one-row dot",
                    t, sl_kern_isa_name(isas[ki]), (long long)nt, p + 1, diff);
        }
    }
    sl_free(w);
    sl_free(X);
    sl_free(ref);
    sl_free(got);
    sl_free(want);
    sl_free(tol);
    sl_free(xq);
  }
  /* argument errors */
  float y[4], xx[64] = {0};
  uint8_t wb[64] = {0};
  sl_kern_weight bad = {(sl_ggml_type)16, 1, 32, wb, NULL};
  CHECK_EQ_INT(sl_kern_matmul(pools[1], &bad, xx, y, 1), SL_ERR_UNSUPPORTED);
  sl_kern_weight odd = {SL_GGML_Q8_0, 1, 48, wb, NULL};
  CHECK_EQ_INT(sl_kern_matmul(pools[1], &odd, xx, y, 1), SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kern_matmul(pools[1], &odd, xx, y, -1), SL_ERR_INVALID_ARG);
  sl_kern_pool_destroy(pools[0]);
  sl_kern_pool_destroy(pools[1]);
}

/* sl_kern_matmul_parts against one sl_kern_matmul per part: bit for bit,
 * for parts of mixed weight and activation types (Q8_K, Q8_0, Q8_1 and F16
 * activations in one call; gemm and dot paths side by side), any token
 * count, one or two threads, every ISA. A part computed with another
 * part's activations, or a part whose rows no thread took, fails it. */
static void test_matmul_parts(void) {
  static const sl_ggml_type sets[][3] = {
      {SL_GGML_Q4_K, SL_GGML_Q8_0, SL_GGML_Q5_0},
      {SL_GGML_Q4_1, SL_GGML_Q4_0, SL_GGML_Q6_K},
      {SL_GGML_F16, SL_GGML_IQ4_XS, SL_GGML_Q4_1}};
  static const int64_t prow[3] = {37, 16, 5}, toks[] = {1, 5, 64};
  const int64_t cols = 256 * 3;
  sl_kern_isa isas[SL_KERN_ISA_COUNT];
  int ni = isa_list(isas);
  sl_kern_pool_t *pools[2] = {sl_kern_pool_create(1), sl_kern_pool_create(2)};
  CHECK(pools[0] && pools[1]);
  float *X = sl_malloc(64 * cols * sizeof(float));
  for (int64_t i = 0; i < 64 * cols; i++)
    X[i] = rnd_f(-1, 1);
  for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
    sl_kern_weight W[3];
    const sl_kern_weight *pw[3];
    uint8_t *wd[3];
    float *ref[3], *got[3];
    for (int i = 0; i < 3; i++) {
      size_t wrb = row_bytes(sets[si][i], cols);
      wd[i] = sl_malloc(wrb * prow[i]);
      fill_random(sets[si][i], wd[i], cols * prow[i]);
      W[i] = (sl_kern_weight){sets[si][i], prow[i], cols, wd[i], NULL};
      pw[i] = &W[i];
      ref[i] = sl_malloc(64 * prow[i] * sizeof(float));
      got[i] = sl_malloc(64 * prow[i] * sizeof(float));
    }
    for (int ki = 0; ki < ni; ki++)
      for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++)
        for (int p = 0; p < 2; p++) {
          int64_t nt = toks[k];
          CHECK_OK(sl_kern_cpu_set_isa(isas[ki]));
          for (int i = 0; i < 3; i++) {
            CHECK_OK(sl_kern_matmul(pools[p], &W[i], X, ref[i], nt));
            memset(got[i], 0xff, nt * prow[i] * sizeof(float));
          }
          CHECK_OK(sl_kern_matmul_parts(pools[p], pw, 3, X, got, nt));
          for (int i = 0; i < 3; i++)
            CHECK_MSG(memcmp(got[i], ref[i], nt * prow[i] * sizeof(float)) == 0,
                      "set %zu part %d isa %s nt %lld threads %d", si, i,
                      sl_kern_isa_name(isas[ki]), (long long)nt, p + 1);
        }
    for (int i = 0; i < 3; i++) {
      sl_free(wd[i]);
      sl_free(ref[i]);
      sl_free(got[i]);
    }
  }
  /* argument errors: no parts, too many, parts of different widths */
  uint8_t wb[1024] = {0};
  float y0[64], y1[64];
  float *ys[5] = {y0, y1, y0, y1, y0};
  sl_kern_weight a = {SL_GGML_Q8_0, 1, 64, wb, NULL},
                 b = {SL_GGML_Q8_0, 1, 32, wb, NULL};
  const sl_kern_weight *ab[5] = {&a, &b, &a, &a, &a};
  CHECK_EQ_INT(sl_kern_matmul_parts(pools[1], ab, 0, X, ys, 1),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kern_matmul_parts(pools[1], ab, 5, X, ys, 1),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kern_matmul_parts(pools[1], ab, 2, X, ys, 1),
               SL_ERR_INVALID_ARG);
  sl_free(X);
  sl_kern_pool_destroy(pools[0]);
  sl_kern_pool_destroy(pools[1]);
}

/* sl_kern_matmul_grouped against one sl_kern_matmul per op: bit for bit,
 * for ops of mixed types (a packed copy among them where the ISA has one),
 * each over its own slice of X or sharing one (gate and up of an expert),
 * token counts 0 to 17, one or two threads, every ISA. An op computed from
 * another's activations (a wrong share of the quantization), or rows no
 * thread took, fail it. */
static void test_matmul_grouped(void) {
  enum { NOPS = 7 };
  static const sl_ggml_type types[NOPS] = {
      SL_GGML_Q8_0, SL_GGML_Q8_0, SL_GGML_Q4_K, SL_GGML_F32,
      SL_GGML_Q4_1, SL_GGML_Q6_K, SL_GGML_Q8_0};
  static const int64_t rows[NOPS] = {24, 24, 9, 5, 16, 40, 8},
                       ntok[NOPS] = {3, 3, 17, 1, 0, 2, 3};
  /* X slice of each op: ops 0 and 6 share one (quantized once); op 1 has
   * their type and size but rows of its own */
  static const int64_t xoff[NOPS] = {0, 5, 3, 20, 21, 21, 0};
  const int64_t cols = 256;
  sl_kern_isa isas[SL_KERN_ISA_COUNT];
  int ni = isa_list(isas);
  sl_kern_pool_t *pools[2] = {sl_kern_pool_create(1), sl_kern_pool_create(2)};
  CHECK(pools[0] && pools[1]);
  float *X = sl_malloc(24 * cols * sizeof(float));
  for (int64_t i = 0; i < 24 * cols; i++)
    X[i] = rnd_f(-1, 1);
  sl_kern_weight W[NOPS];
  uint8_t *wd[NOPS];
  void *pk[NOPS] = {0};
  float *ref[NOPS], *got[NOPS];
  for (int i = 0; i < NOPS; i++) {
    wd[i] = sl_malloc(row_bytes(types[i], cols) * rows[i]);
    fill_random(types[i], wd[i], cols * rows[i]);
    W[i] = (sl_kern_weight){types[i], rows[i], cols, wd[i], NULL};
    ref[i] = sl_malloc(17 * rows[i] * sizeof(float) + 4);
    got[i] = sl_malloc(17 * rows[i] * sizeof(float) + 4);
  }
  for (int ki = 0; ki < ni; ki++) {
    CHECK_OK(sl_kern_cpu_set_isa(isas[ki]));
    /* op 0's weight packed where this level packs Q8_0 */
    sl_free(pk[0]);
    pk[0] = NULL;
    W[0].packed = NULL;
    size_t pb = sl_kern_repack_bytes(&W[0]);
    if (pb) {
      pk[0] = sl_malloc(pb);
      CHECK_OK(sl_kern_repack(&W[0], pk[0], pb));
      W[0].packed = pk[0];
    }
    for (int p = 0; p < 2; p++) {
      sl_kern_matmul_op op[NOPS];
      for (int i = 0; i < NOPS; i++) {
        op[i] = (sl_kern_matmul_op){&W[i], X + xoff[i] * cols, got[i], ntok[i]};
        if (ntok[i])
          CHECK_OK(sl_kern_matmul(pools[p], &W[i], op[i].X, ref[i], ntok[i]));
        memset(got[i], 0xff, 17 * rows[i] * sizeof(float));
      }
      CHECK_OK(sl_kern_matmul_grouped(pools[p], op, NOPS));
      for (int i = 0; i < NOPS; i++)
        CHECK_MSG(
            memcmp(got[i], ref[i], ntok[i] * rows[i] * sizeof(float)) == 0,
            "op %d isa %s threads %d", i, sl_kern_isa_name(isas[ki]), p + 1);
    }
  }
  CHECK_OK(sl_kern_matmul_grouped(pools[1], NULL, 0));
  CHECK_EQ_INT(sl_kern_matmul_grouped(pools[1], NULL, 1), SL_ERR_INVALID_ARG);
  for (int i = 0; i < NOPS; i++) {
    sl_free(wd[i]);
    sl_free(pk[i]);
    sl_free(ref[i]);
    sl_free(got[i]);
  }
  sl_free(X);
  sl_kern_pool_destroy(pools[0]);
  sl_kern_pool_destroy(pools[1]);
}

/* The VNNI levels under test, for the types they bring kernels for (their
 * own summation order: vnni_body.h): the dot for 1..4 tokens at once equals
 * the dot token by token, and matmul for 1..9 tokens (tiles of eight rows by
 * up to eight tokens, nine rows: one full group and a group of one) equals
 * the one-row dot bit for bit and stays within the f64 rounding bound of a
 * chain of `nb` fmas, on short rows and on rows long enough for two bias
 * segments of the gemm tiles (300 blocks). The base level (avx2 / avx512)
 * runs the same matmuls as a witness: it must meet the same bound. Under
 * avx512vnni, the avxvnni level's tiling (four tokens a tile, compiled
 * EVEX-encoded: kern_cpu_avx512vnni4.c) must give the same bits. */
static void test_vnni(void) {
  static const sl_ggml_type types[] = {SL_GGML_Q4_0,   SL_GGML_Q4_1,
                                       SL_GGML_Q5_0,   SL_GGML_Q5_1,
                                       SL_GGML_IQ4_NL, SL_GGML_Q8_0};
  static const int64_t ncols[] = {32 * 7, 32 * 300};
  static const int64_t toks[] = {1, 2, 3, 4, 7, 9};
  enum { ROWS = 9, MAXT = 9 };
  sl_kern_isa isas[SL_KERN_ISA_COUNT];
  int ni = isa_list(isas), tested = 0;
  sl_kern_pool_t *pool = sl_kern_pool_create(2);
  CHECK(pool);
  for (int k = 0; k < ni; k++) {
    if (isas[k] != SL_KERN_ISA_AVXVNNI && isas[k] != SL_KERN_ISA_AVX512VNNI)
      continue;
    sl_kern_isa isa = isas[k];
    sl_kern_isa base =
        isa == SL_KERN_ISA_AVXVNNI ? SL_KERN_ISA_AVX2 : SL_KERN_ISA_AVX512;
    const char *in = sl_kern_isa_name(isa);
    tested++;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
      for (size_t ci = 0; ci < sizeof ncols / sizeof ncols[0]; ci++) {
        sl_ggml_type t = types[ti], act;
        CHECK_OK(sl_kern_act_type(t, &act));
        int64_t cols = ncols[ci], nb = cols / 32;
        size_t wrb = row_bytes(t, cols), xrb = row_bytes(act, cols);
        uint8_t *w = sl_malloc(wrb * ROWS), *xq = sl_malloc(xrb * MAXT);
        float *X = sl_malloc(MAXT * cols * sizeof(float));
        float *yb = sl_malloc(MAXT * ROWS * sizeof(float));
        float *yv = sl_malloc(MAXT * ROWS * sizeof(float));
        fill_random(t, w, cols * ROWS);
        for (int64_t i = 0; i < MAXT * cols; i++)
          X[i] = rnd_f(-1, 1);
        for (int64_t tt = 0; tt < MAXT; tt++)
          CHECK_OK(
              sl_kern_quantize_act(act, X + tt * cols, xq + tt * xrb, cols));
        sl_kern_weight W = {t, ROWS, cols, w, NULL};
        int diff = 0, off = 0, notdot = 0, boff = 0;
        /* the dot table for 1..4 tokens at once, against token by token */
        CHECK_OK(sl_kern_cpu_set_isa(isa));
        for (int nt = 1; nt <= 4; nt++)
          for (int64_t r = 0; r < ROWS; r++) {
            float d1[4], dn[4];
            for (int tt = 0; tt < nt; tt++)
              sl__kern_cpu_ops_get()->dot[t](cols, w + r * wrb, xq + tt * xrb,
                                             0, d1 + tt, 0, 1);
            sl__kern_cpu_ops_get()->dot[t](cols, w + r * wrb, xq, xrb, dn, 1,
                                           nt);
            diff += memcmp(d1, dn, nt * sizeof(float)) != 0;
          }
        CHECK_MSG(diff == 0, "type %d cols %lld %s: %d multi-token dots differ",
                  t, (long long)cols, in, diff);
        for (size_t k2 = 0; k2 < sizeof toks / sizeof toks[0]; k2++) {
          int64_t nt = toks[k2];
          CHECK_OK(sl_kern_cpu_set_isa(base));
          CHECK_OK(sl_kern_matmul(pool, &W, X, yb, nt));
          CHECK_OK(sl_kern_cpu_set_isa(isa));
          memset(yv, 0xff, MAXT * ROWS * sizeof(float));
          CHECK_OK(sl_kern_matmul(pool, &W, X, yv, nt));
          off = notdot = boff = 0;
          for (int64_t tt = 0; tt < nt; tt++)
            for (int64_t r = 0; r < ROWS; r++) {
              float got = yv[tt * ROWS + r], one;
              CHECK_OK(
                  sl_kern_vec_dot(t, cols, w + r * wrb, xq + tt * xrb, &one));
              notdot += memcmp(&got, &one, sizeof got) != 0;
              double absum, slack;
              double want =
                  ref_dot(t, cols, w + r * wrb, xq + tt * xrb, &absum, &slack);
              /* one rounding per fma of a lane's chain, the scale product,
               * the horizontal sum */
              double tol = (double)(nb + 8) * 6e-8 * absum + slack + 1e-9;
              off += !(fabs(got - want) <= tol);
              boff += !(fabs(yb[tt * ROWS + r] - want) <= tol);
            }
          if (isa == SL_KERN_ISA_AVX512VNNI) {
            /* the avxvnni tiling (four tokens), EVEX-encoded: same bits */
            int64_t ld = (nt + 3) & ~(int64_t)3;
            float *xd = sl_malloc(2 * nb * ld * sizeof(float));
            float *xs = xd + nb * ld;
            for (int64_t i = 0; i < nb * ld * 2; i++)
              xd[i] = 0.0f;
            for (int64_t tt = 0; tt < nt; tt++)
              for (int64_t i = 0; i < nb; i++) {
                const uint8_t *b =
                    xq + tt * xrb + i * (act == SL_GGML_Q8_1 ? 36 : 34);
                uint16_t h[2];
                memcpy(h, b, 4);
                xd[i * ld + tt] = sl__f16_to_f32(h[0]);
                xs[i * ld + tt] = sl__f16_to_f32(h[1]);
              }
            sl__kern_cpu_avx512vnni4_ops.gemm[t](
                cols, w, wrb, ROWS, xq, xrb, xd,
                act == SL_GGML_Q8_1 ? xs : NULL, ld, nt, yb, ROWS);
            int d4 = 0;
            for (int64_t e = 0; e < nt * ROWS; e++)
              d4 += memcmp(&yb[e], &yv[e], sizeof(float)) != 0;
            CHECK_MSG(d4 == 0,
                      "type %d cols %lld nt %lld: %d entries of the 4-token "
                      "tiling differ",
                      t, (long long)cols, (long long)nt, d4);
            sl_free(xd);
          }
          CHECK_MSG(off == 0 && notdot == 0 && boff == 0,
                    "type %d cols %lld %s nt %lld: %d off f64, %d differ from "
                    "the one-row dot; %s: %d off f64",
                    t, (long long)cols, in, (long long)nt, off, notdot,
                    sl_kern_isa_name(base), boff);
        }
        sl_free(w);
        sl_free(xq);
        sl_free(X);
        sl_free(yb);
        sl_free(yv);
      }
  }
  if (!tested)
    fprintf(stderr, "  (no VNNI level under test)\n");
  sl_kern_cpu_set_isa(isas[ni - 1]);
  sl_kern_pool_destroy(pool);
}

static void count_task(void *ctx, int ith, int nth) {
  _Atomic long *c = ctx;
  atomic_fetch_add(&c[ith], 1);
  atomic_fetch_add(&c[8], nth);
}

static void test_pool(void) {
  for (int nth = 1; nth <= 4; nth++) {
    sl_kern_pool_t *p = sl_kern_pool_create(nth);
    CHECK(p != NULL);
    CHECK_EQ_INT(sl_kern_pool_n_threads(p), nth);
    _Atomic long c[9] = {0};
    const int runs = nth <= 2 ? 20000 : 500;
    for (int r = 0; r < runs; r++) {
      sl_kern_pool_run(p, count_task, (void *)c);
      if (r == runs / 2)
        usleep(100000); /* let the workers fall asleep, then wake them */
    }
    for (int i = 0; i < nth; i++)
      CHECK_EQ_INT(c[i], runs);
    CHECK_EQ_INT(c[8], (long)runs * nth * nth);
    sl_kern_pool_destroy(p);
  }
  sl_kern_pool_destroy(NULL);
}

/* A worker the OS does not run holds no share of a job: here every worker
 * is held in a signal handler (as a descheduled thread would be, by other
 * processes on the cores or by another engine's pool), and the caller runs
 * every share of the next job itself and returns. With a share fixed to
 * each thread the caller waited for the held worker (beside another
 * process: every job waited for a time slice, 5-12 times slower). */
static int g_hold[2] = {-1, -1}; /* a held worker reads from it */
static int g_held[2] = {-1, -1}; /* and says it is held here */

static void hold_handler(int sig) {
  (void)sig;
  char c = 1;
  if (write(g_held[1], &c, 1) != 1)
    return;
  while (read(g_hold[0], &c, 1) < 0 && errno == EINTR)
    ;
}

typedef struct share_log {
  sl_kern_pool_t *pool;
  pid_t ran_on[4];
  _Atomic bool returned;
} share_log;

static void log_task(void *ctx, int ith, int nth) {
  (void)nth;
  ((share_log *)ctx)->ran_on[ith] = (pid_t)syscall(SYS_gettid);
}

static void *run_job(void *p) {
  share_log *l = p;
  sl_kern_pool_run(l->pool, log_task, l);
  atomic_store(&l->returned, true);
  return NULL;
}

static void test_pool_descheduled_worker(void) {
  if (SL_TEST_TSAN) { /* TSan holds a signal until its next intercepted
                         call: a spinning worker may never take it */
    fprintf(stderr, "  (skipped under TSan)\n");
    return;
  }
  enum { NTH = 3 };
  sl_kern_pool_t *pool = sl_kern_pool_create(NTH);
  CHECK(pool != NULL);
  share_log l = {.pool = pool};
  sl_kern_pool_run(pool, log_task, &l); /* the workers are up */
  CHECK(pipe(g_hold) == 0 && pipe(g_held) == 0);
  struct sigaction sa = {.sa_handler = hold_handler}, old;
  sigemptyset(&sa.sa_mask);
  CHECK(sigaction(SIGUSR1, &sa, &old) == 0);
  /* hold every other thread of this process: the pool's workers */
  int held = 0;
  pid_t self = (pid_t)syscall(SYS_gettid);
  DIR *d = opendir("/proc/self/task");
  CHECK(d != NULL);
  for (struct dirent *de; d && (de = readdir(d));) {
    pid_t tid = (pid_t)atoi(de->d_name);
    if (tid > 0 && tid != self &&
        syscall(SYS_tgkill, getpid(), tid, SIGUSR1) == 0)
      held++;
  }
  if (d)
    closedir(d);
  CHECK(held >= NTH - 1);
  for (int i = 0; i < held; i++) {
    char c;
    CHECK(read(g_held[0], &c, 1) == 1);
  }
  pthread_t caller;
  CHECK(pthread_create(&caller, NULL, run_job, &l) == 0);
  for (int ms = 0; ms < 5000 && !atomic_load(&l.returned); ms++)
    usleep(1000);
  CHECK_MSG(atomic_load(&l.returned),
            "the job waited 5 s for workers that were not running");
  char go[8] = {0};
  CHECK(write(g_hold[1], go, (size_t)held) == held); /* let them go */
  pthread_join(caller, NULL);
  for (int i = 0; i < NTH; i++) /* every share ran on the caller */
    CHECK(l.ran_on[i] == l.ran_on[0]);
  CHECK(sigaction(SIGUSR1, &old, NULL) == 0);
  for (int i = 0; i < 2; i++) {
    close(g_hold[i]);
    close(g_held[i]);
  }
  /* the pool goes on serving jobs with its workers back */
  _Atomic long c[9] = {0};
  for (int r = 0; r < 1000; r++)
    sl_kern_pool_run(pool, count_task, (void *)c);
  for (int i = 0; i < NTH; i++)
    CHECK_EQ_INT(c[i], 1000);
  sl_kern_pool_destroy(pool);
}

/* ---- small ops vs f64
 * --------------------------------------------------------- */

static void test_small_ops(void) {
  sl_kern_isa isas[SL_KERN_ISA_COUNT];
  int ni = isa_list(isas);
  static const int64_t sizes[] = {1, 7, 64, 333};
  for (int k = 0; k < ni; k++) {
    CHECK_OK(sl_kern_cpu_set_isa(isas[k]));
    const char *in = sl_kern_isa_name(isas[k]);
    for (size_t si = 0; si < 4; si++) {
      int64_t n = sizes[si];
      float a[333], b[333], w[333], out[333];
      for (int64_t i = 0; i < n; i++) {
        a[i] = rnd_f(-4, 4);
        b[i] = rnd_f(-4, 4);
        w[i] = rnd_f(0.5f, 1.5f);
      }
      /* rmsnorm */
      double ss = 0;
      for (int64_t i = 0; i < n; i++)
        ss += (double)a[i] * a[i];
      double sc = 1.0 / sqrt(ss / n + 1e-5);
      sl_kern_rmsnorm(out, a, w, n, 1e-5f);
      int bad = 0;
      for (int64_t i = 0; i < n; i++)
        bad += !(fabs(out[i] - a[i] * sc * w[i]) <=
                 2e-6 * fabs(a[i] * sc * w[i]) + 1e-7);
      sl_kern_rmsnorm(out, a, NULL, n, 1e-5f);
      for (int64_t i = 0; i < n; i++)
        bad += !(fabs(out[i] - a[i] * sc) <= 2e-6 * fabs(a[i] * sc) + 1e-7);
      CHECK_MSG(bad == 0, "rmsnorm %s n %lld", in, (long long)n);
      /* add */
      sl_kern_add(out, a, b, n);
      bad = 0;
      for (int64_t i = 0; i < n; i++)
        bad += out[i] != a[i] + b[i];
      CHECK_MSG(bad == 0, "add %s", in);
      /* swiglu, over a wide range of gate values */
      for (int64_t i = 0; i < n; i++)
        w[i] = rnd_f(-30, 30);
      sl_kern_swiglu(out, w, b, n);
      bad = 0;
      for (int64_t i = 0; i < n; i++) {
        double want = w[i] / (1.0 + exp(-(double)w[i])) * b[i];
        bad += !(fabs(out[i] - want) <= 4e-7 * fabs(w[i] * b[i]) + 1e-30);
      }
      CHECK_MSG(bad == 0, "swiglu %s n %lld", in, (long long)n);
      /* softmax */
      double mx = -1e30, sum = 0;
      for (int64_t i = 0; i < n; i++)
        mx = fmax(mx, a[i] * 5);
      for (int64_t i = 0; i < n; i++)
        sum += exp(a[i] * 5 - mx);
      for (int64_t i = 0; i < n; i++)
        out[i] = a[i] * 5;
      sl_kern_softmax(out, n);
      bad = 0;
      for (int64_t i = 0; i < n; i++) {
        double want = exp(a[i] * 5 - mx) / sum;
        bad += !(fabs(out[i] - want) <= 2e-6 * want + 1e-12);
      }
      CHECK_MSG(bad == 0, "softmax %s n %lld", in, (long long)n);
    }
    /* rope: both layouts, partial rotation, odd head count */
    for (int mode = 0; mode <= 2; mode += 2) {
      const int64_t nh = 3, hd = 64;
      for (int64_t nrot = 64; nrot >= 32; nrot -= 32) {
        float x[3 * 64], orig[3 * 64];
        for (int i = 0; i < nh * hd; i++)
          orig[i] = x[i] = rnd_f(-2, 2);
        int64_t pos = 1234;
        CHECK_OK(sl_kern_rope(x, nh, hd, nrot, pos, 10000.0f, 1.0f,
                              (sl_kern_rope_mode)mode));
        int bad = 0;
        for (int64_t h = 0; h < nh; h++)
          for (int64_t i = 0; i < hd; i++) {
            double want = orig[h * hd + i];
            if (i < nrot) {
              int64_t p = mode ? (i % (nrot / 2)) : i / 2; /* pair index */
              double th = pos * pow(10000.0, -2.0 * p / nrot);
              int64_t ia, ib;
              if (mode) {
                ia = p;
                ib = p + nrot / 2;
              } else {
                ia = 2 * p;
                ib = 2 * p + 1;
              }
              double x0 = orig[h * hd + ia], x1 = orig[h * hd + ib];
              want = i == ia ? x0 * cos(th) - x1 * sin(th)
                             : x0 * sin(th) + x1 * cos(th);
            }
            /* the angle is computed in float as ggml does: theta_p carries
             * about (p + 1) roundings of relative size 2^-24 */
            double th_err =
                pos *
                pow(10000.0,
                    -2.0 * (double)(mode ? (i % (nrot / 2)) : i / 2) / nrot) *
                (double)((mode ? (i % (nrot / 2)) : i / 2) + 2) * 6e-8;
            bad += !(fabs(x[h * hd + i] - want) <= 1e-5 + 4.0 * th_err);
          }
        CHECK_MSG(bad == 0, "rope %s mode %d nrot %lld: %d bad", in, mode,
                  (long long)nrot, bad);
      }
    }
  }
  float x[8];
  CHECK_EQ_INT(sl_kern_rope(x, 1, 8, 7, 0, 1e4f, 1, SL_KERN_ROPE_NORM),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kern_rope(x, 1, 8, 10, 0, 1e4f, 1, SL_KERN_ROPE_NORM),
               SL_ERR_INVALID_ARG);
}

/* ---- f16 conversion and attention
 * ------------------------------------------
 */

static void test_f32_to_f16(void) {
  sl_kern_isa isas[SL_KERN_ISA_COUNT];
  int ni = isa_list(isas);
  float x[67];
  uint16_t h[67];
  for (int i = 0; i < 67; i++)
    x[i] = rnd_f(-2, 2) * (i % 5 == 0 ? 3e4f : 1.0f);
  x[3] = 1.0f + 1.0f / 4096; /* a tie */
  x[4] = 1e6f;               /* overflow */
  x[5] = 1e-7f;              /* subnormal */
  for (int k = 0; k < ni; k++) {
    CHECK_OK(sl_kern_cpu_set_isa(isas[k]));
    sl_kern_f32_to_f16(h, x, 67);
    int bad = 0;
    for (int i = 0; i < 67; i++)
      bad += h[i] != sl__f32_to_f16(x[i]);
    CHECK_MSG(bad == 0, "f32_to_f16 %s: %d bad", sl_kern_isa_name(isas[k]),
              bad);
  }
}

/* float64 attention on the f16 cache with q and the probabilities rounded to
 * f16 as the kernel's contract says; *mag = sum_p a_p |v_p[i]| max over i. */
static void attn_ref(double *out, const float *q, const uint16_t *k,
                     const uint16_t *v, int64_t hd, int64_t len, int64_t st,
                     float scale, double *mag) {
  double *s = sl_malloc((size_t)len * sizeof(double));
  double mx = -1e300, sum = 0;
  for (int64_t p = 0; p < len; p++) {
    double d = 0;
    for (int64_t i = 0; i < hd; i++)
      d += (double)sl__f16_to_f32(sl__f32_to_f16(q[i])) *
           sl__f16_to_f32(k[p * st + i]);
    s[p] = d * scale;
    mx = fmax(mx, s[p]);
  }
  for (int64_t p = 0; p < len; p++)
    sum += s[p] = exp(s[p] - mx);
  *mag = 0;
  for (int64_t i = 0; i < hd; i++) {
    double o = 0, m = 0;
    for (int64_t p = 0; p < len; p++) {
      double a = sl__f16_to_f32(sl__f32_to_f16((float)(s[p] / sum)));
      o += a * sl__f16_to_f32(v[p * st + i]);
      m += a * fabs(sl__f16_to_f32(v[p * st + i]));
    }
    out[i] = o;
    *mag = fmax(*mag, m);
  }
  sl_free(s);
}

/* The paged form gives bit-identical results to the contiguous one on the
 * same rows, with blocks scattered in memory in a shuffled order. */
static void test_attn_f16_paged(void) {
  sl_kern_isa isas[SL_KERN_ISA_COUNT];
  int ni = isa_list(isas);
  const int64_t hd = 64, st = 2 * 64, T = 16, maxlen = 200;
  const int64_t nblk = (maxlen + T - 1) / T;
  uint16_t *k = sl_malloc((size_t)(maxlen * st) * 2);
  uint16_t *v = sl_malloc((size_t)(maxlen * st) * 2);
  uint16_t *pool_k = sl_malloc((size_t)(nblk * T * st) * 2);
  uint16_t *pool_v = sl_malloc((size_t)(nblk * T * st) * 2);
  float *sc = sl_malloc((size_t)(maxlen + 32) * sizeof(float));
  const uint16_t *kb[16], *vb[16];
  int perm[16];
  for (int i = 0; i < nblk; i++)
    perm[i] = i;
  for (int i = (int)nblk - 1; i > 0; i--) { /* shuffle the block order */
    int j = (int)(rnd_u64() % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (int64_t i = 0; i < maxlen * st; i++) {
    k[i] = sl__f32_to_f16(rnd_f(-2, 2));
    v[i] = sl__f32_to_f16(rnd_f(-1, 1));
  }
  for (int64_t b = 0; b < nblk; b++) {
    int64_t rows = maxlen - b * T < T ? maxlen - b * T : T;
    memcpy(pool_k + perm[b] * T * st, k + b * T * st, (size_t)(rows * st) * 2);
    memcpy(pool_v + perm[b] * T * st, v + b * T * st, (size_t)(rows * st) * 2);
    kb[b] = pool_k + perm[b] * T * st + hd; /* the second kv head */
    vb[b] = pool_v + perm[b] * T * st + hd;
  }
  static const int64_t lens[] = {1, 15, 16, 17, 33, 100, 200};
  float q[64], a[64], b2[64];
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
    for (int single = 0; single <= 1; single++)
      for (int ki = 0; ki < ni; ki++) {
        CHECK_OK(sl_kern_cpu_set_isa(isas[ki]));
        for (int64_t i = 0; i < hd; i++)
          q[i] = rnd_f(-2, 2);
        CHECK_OK(sl_kern_attn_f16(a, q, k + hd, v + hd, hd, lens[li], st,
                                  0.125f, single, sc));
        CHECK_OK(sl_kern_attn_f16_paged(b2, q, kb, vb, 4, hd, lens[li], st,
                                        0.125f, single, sc));
        CHECK_MSG(memcmp(a, b2, sizeof a) == 0, "len %lld single %d isa %d",
                  (long long)lens[li], single, (int)isas[ki]);
      }
  const uint16_t *nullb[1] = {NULL};
  CHECK(sl_kern_attn_f16_paged(a, q, nullb, vb, 4, hd, 3, st, 1, false, sc) ==
        SL_ERR_INVALID_ARG);
  CHECK(sl_kern_attn_f16_paged(a, q, kb, vb, 63, hd, 3, st, 1, false, sc) ==
        SL_ERR_INVALID_ARG);
  sl_kern_cpu_set_isa(isas[ni - 1]);
  sl_free(k);
  sl_free(v);
  sl_free(pool_k);
  sl_free(pool_v);
  sl_free(sc);
}

static void test_attn_f16(void) {
  sl_kern_isa isas[SL_KERN_ISA_COUNT];
  int ni = isa_list(isas);
  static const int64_t hds[] = {64, 128, 40, 7};
  static const int64_t lens[] = {1, 3, 8, 33, 100, 257};
  const int64_t st = 3 * 128; /* three kv heads of up to 128 */
  const int64_t maxlen = 257;
  uint16_t *k = sl_malloc((size_t)(maxlen * st) * 2);
  uint16_t *v = sl_malloc((size_t)(maxlen * st) * 2);
  float *sc = sl_malloc((size_t)(maxlen + 32) * sizeof(float));
  float q[128], out[128], first[2][128];
  double ref[128];
  for (int64_t i = 0; i < maxlen * st; i++) {
    k[i] = sl__f32_to_f16(rnd_f(-2, 2));
    v[i] = sl__f32_to_f16(rnd_f(-1, 1));
  }
  for (size_t hi = 0; hi < 4; hi++)
    for (size_t li = 0; li < 6; li++) {
      int64_t hd = hds[hi], len = lens[li];
      float qs = li % 2 ? 4.0f : 0.5f; /* peaked and flat distributions */
      for (int64_t i = 0; i < hd; i++)
        q[i] = rnd_f(-qs, qs);
      const uint16_t *kh = k + 128, *vh = v + 128; /* the second kv head */
      float scale = 1.0f / sqrtf((float)hd);
      double mag;
      attn_ref(ref, q, kh, vh, hd, len, st, scale, &mag);
      CHECK_OK(sl_kern_cpu_set_isa(SL_KERN_ISA_SCALAR));
      for (int single = 0; single <= 1; single++)
        CHECK_OK(sl_kern_attn_f16(first[single], q, kh, vh, hd, len, st, scale,
                                  single, sc));
      for (int single = 0; single <= 1; single++)
        for (int ki = 0; ki < ni; ki++) {
          CHECK_OK(sl_kern_cpu_set_isa(isas[ki]));
          for (int64_t i = 0; i < hd; i++)
            out[i] = NAN;
          CHECK_OK(
              sl_kern_attn_f16(out, q, kh, vh, hd, len, st, scale, single, sc));
          int bad = 0, differ = 0;
          for (int64_t i = 0; i < hd; i++) {
            /* a probability may round the other way in f16 (2^-11) */
            if (!(fabs(out[i] - ref[i]) <= 1e-3 * mag + 1e-6))
              bad++;
            if (!(fabsf(out[i] - first[single][i]) <=
                  1e-3f * (float)mag + 1e-6f))
              differ++;
          }
          CHECK_MSG(bad == 0 && differ == 0,
                    "attn %s hd %lld len %lld single %d: %d bad, %d differ",
                    sl_kern_isa_name(isas[ki]), (long long)hd, (long long)len,
                    single, bad, differ);
        }
    }
  /* one position: the output is v_0 exactly */
  for (int ki = 0; ki < ni; ki++) {
    CHECK_OK(sl_kern_cpu_set_isa(isas[ki]));
    CHECK_OK(sl_kern_attn_f16(out, q, k, v, 64, 1, st, 0.125f, false, sc));
    int bad = 0;
    for (int i = 0; i < 64; i++)
      bad += out[i] != sl__f16_to_f32(v[i]);
    CHECK_EQ_INT(bad, 0);
  }
  CHECK_EQ_INT(sl_kern_attn_f16(out, q, k, v, 64, 0, st, 1, false, sc),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kern_attn_f16(out, q, k, v, 0, 1, st, 1, false, sc),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kern_attn_f16(out, q, k, v, 64, 4, 32, 1, false, sc),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kern_attn_f16(out, q, k, v, SL_KERN_ATTN_MAX_HEAD_DIM + 1, 1,
                                4096, 1, false, sc),
               SL_ERR_INVALID_ARG);
  CHECK_EQ_INT(sl_kern_attn_f16(out, q, NULL, v, 64, 1, st, 1, false, sc),
               SL_ERR_INVALID_ARG);
  sl_free(sc);
  sl_free(v);
  sl_free(k);
}

/* SLUICE_ISA / SLUICE_CPU_ISA as the kernels read them. */
static void test_isa_env(void) {
  char *keep[2] = {NULL, NULL};
  static const char *names[2] = {"SLUICE_ISA", "SLUICE_CPU_ISA"};
  for (int i = 0; i < 2; i++) {
    const char *v = getenv(names[i]);
    keep[i] = v ? sl_strdup(v) : NULL;
  }
  sl_kern_isa isa = (sl_kern_isa)-1;
  unsetenv("SLUICE_ISA");
  unsetenv("SLUICE_CPU_ISA");
  CHECK_EQ_INT(sl_kern_cpu_isa_requested(&isa), SL_ERR_NOT_FOUND);
  setenv("SLUICE_ISA", "avx2", 1);
  CHECK_OK(sl_kern_cpu_isa_requested(&isa));
  CHECK_EQ_INT(isa, SL_KERN_ISA_AVX2);
  setenv("SLUICE_CPU_ISA", "scalar", 1); /* the new name wins */
  CHECK_OK(sl_kern_cpu_isa_requested(&isa));
  CHECK_EQ_INT(isa, SL_KERN_ISA_AVX2);
  setenv("SLUICE_ISA", "", 1); /* empty: the old name */
  CHECK_OK(sl_kern_cpu_isa_requested(&isa));
  CHECK_EQ_INT(isa, SL_KERN_ISA_SCALAR);
  setenv("SLUICE_ISA", "avx512", 1);
  CHECK_OK(sl_kern_cpu_isa_requested(&isa));
  CHECK_EQ_INT(isa, SL_KERN_ISA_AVX512);
  setenv("SLUICE_ISA", "avxvnni", 1);
  CHECK_OK(sl_kern_cpu_isa_requested(&isa));
  CHECK_EQ_INT(isa, SL_KERN_ISA_AVXVNNI);
  setenv("SLUICE_ISA", "avx512vnni", 1);
  CHECK_OK(sl_kern_cpu_isa_requested(&isa));
  CHECK_EQ_INT(isa, SL_KERN_ISA_AVX512VNNI);
  setenv("SLUICE_ISA", "AVX2", 1);
  CHECK_EQ_INT(sl_kern_cpu_isa_requested(&isa), SL_ERR_INVALID_ARG);
  setenv("SLUICE_ISA", "avx", 1);
  CHECK_EQ_INT(sl_kern_cpu_isa_requested(&isa), SL_ERR_INVALID_ARG);
  for (int i = 0; i < 2; i++) {
    if (keep[i])
      setenv(names[i], keep[i], 1);
    else
      unsetenv(names[i]);
    sl_free(keep[i]);
  }
}

int main(void) {
  /* the levels under test: the one SLUICE_ISA names, else all this CPU has */
  int rc = sl_test_isa_levels(g_isas, &g_nisa);
  if (rc >= 0)
    return rc;
  fprintf(stderr, "ISA levels under test:");
  for (int i = 0; i < g_nisa; i++)
    fprintf(stderr, " %s", sl_kern_isa_name(g_isas[i]));
  fprintf(stderr, " (chosen at start: %s)\n",
          sl_kern_isa_name(sl_kern_cpu_isa()));
  RUN(test_isa_env);
  RUN(test_f16_roundtrip);
  RUN(test_type_info);
  RUN(test_dequant);
  RUN(test_quantize_act);
  RUN(test_vec_dot_scalar_vs_f64);
  RUN(test_matmul);
  RUN(test_matmul_parts);
  RUN(test_matmul_grouped);
  RUN(test_vnni);
  RUN(test_pool);
  RUN(test_pool_descheduled_worker);
  RUN(test_small_ops);
  RUN(test_f32_to_f16);
  RUN(test_attn_f16);
  RUN(test_attn_f16_paged);
  return sl_test_finish();
}
