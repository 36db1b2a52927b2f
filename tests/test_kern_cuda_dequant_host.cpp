/* The CUDA dequantization units (src/kern/cuda/dequant.cuh) compiled for the
 * host, against the CPU dequantizers (sl_kern_dequant_row): runs without a
 * GPU and without nvcc, so that CI checks the device-side bit arithmetic of
 * every weight type the CUDA matrix kernels read in GGUF bytes.
 *
 * The CUDA intrinsics that dequant.cuh uses get exact host equivalents here
 * (__fmul_rn and __fadd_rn are one IEEE rounding each: this file is built
 * with -ffp-contract=off; __fmaf_rn is fmaf). For each type, on random
 * blocks (random bytes, sane f16 scales, as tests/test_kern_cuda_mm.c):
 *
 *  - every element of a row is written by exactly one (unit, group, lane),
 *    and the units' exact() values equal sl_kern_dequant_row bit for bit
 *    (+0 and -0 alike), as sl_kcu_get_rows and the f16 pass of the batched
 *    path must; for Q5_1 under SLUICE_ISA=scalar, whose CPU dequantizer
 *    rounds q * d + m twice, the fused value computed here from the bytes
 *    is accepted too (the CUDA test's rule for Q4_1 and Q5_1);
 *  - the matrix-vector kernel's combination of q, s and m by the type's KIND
 *    (mmv.cu: fmaf(q, s, m) for K_MIN, s * sum q x for K_SCALED, sum q x for
 *    K_PLAIN) gives a dot within 1e-5 L1 of the float64 dot of the CPU's
 *    rows, L1 = sum |w_k x_k|: a KIND that drops a scale or a min, which
 *    the exact() check cannot see, moves it by a large part of L1.
 *
 * What it cannot check: loads' alignment and coalescing, launch shapes, the
 * kernels' reductions; tests/test_kern_cuda_mm.c does, on a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#define _Noreturn [[noreturn]] /* C11's spelling in sluice/util.h */
extern "C" {
#include "rand_weights.h"
#include "sluice/kern_cpu.h"
#include "sluice/util.h"
}

/* ---- host equivalents of the CUDA built-ins dequant.cuh uses ------------ */
#define SL_KCU_DEQUANT_HOST 1
#define __device__
#define __forceinline__ inline

struct float4 {
  float x, y, z, w;
};
struct uint4 {
  unsigned x, y, z, w;
};
template <class T> static inline T __ldg(const T *p) {
  T v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline float __uint_as_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline float __fmul_rn(float a, float b) {
  return a * b;
}
static inline float __fadd_rn(float a, float b) {
  return a + b;
}
static inline float __fmaf_rn(float a, float b, float c) {
  return fmaf(a, b, c);
}
/* default mode: selector nibble n (bit 3 replicates the sign) picks result
 * byte n from the 8 bytes of (x, y) */
static inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t v = (uint64_t)y << 32 | x;
  uint32_t r = 0;
  for (int n = 0; n < 4; n++) {
    const uint32_t sel = (s >> (4 * n)) & 0xF;
    uint32_t b = (uint32_t)(v >> (8 * (sel & 7))) & 0xFF;
    if (sel & 8)
      b = b & 0x80 ? 0xFF : 0;
    r |= b << (8 * n);
  }
  return r;
}
static inline uint16_t __ushort_as_half(unsigned short v) {
  return v;
}
static inline float __half2float(uint16_t h) {
  const uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
  float v = e == 0    ? ldexpf((float)m, -24)
            : e == 31 ? (m ? NAN : INFINITY)
                      : ldexpf((float)(m | 0x400), (int)e - 25);
  return h & 0x8000 ? -v : v;
}

#include "kern/cuda/dequant.cuh"

/* ---- harness ---------------------------------------------------------- */
static int g_fail, g_checks;
#define CHECK_MSG(cond, ...)                                                   \
  do {                                                                         \
    g_checks++;                                                                \
    if (!(cond)) {                                                             \
      g_fail++;                                                                \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);          \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
    }                                                                          \
  } while (0)

static bool same_float(float a, float b) {
  uint32_t ua, ub;
  memcpy(&ua, &a, 4);
  memcpy(&ub, &b, 4);
  return a == b || ua == ub;
}

/* The fused q * d + m of element k of a Q5_1 row. */
static float q5_1_fused(const uint8_t *row, int64_t k) {
  const uint8_t *b = row + (k / 32) * 24;
  const int j = (int)(k % 32);
  int q = j < 16 ? b[8 + j] & 0xF : b[8 + j - 16] >> 4;
  q |= ((b[4 + j / 8] >> (j % 8)) & 1) << 4;
  uint16_t d, m;
  memcpy(&d, b, 2);
  memcpy(&m, b + 2, 2);
  return fmaf((float)q, __half2float(d), __half2float(m));
}

/* `rows` rows of `cols` elements of type t through the units of T. */
template <class T>
static void check_type(sl_ggml_type t, int64_t rows, int64_t cols) {
  const sl_ggml_type_traits *tr = sl_ggml_type_traits_of(t);
  const char *name = tr->name;
  /* a unit's block is the type's (float types: QK elements of type_size) */
  CHECK_MSG(tr->is_quantized
                ? T::QK == (int)tr->blck_size && T::BYTES == (int)tr->type_size
                : T::BYTES == T::QK * (int)tr->type_size,
            "%s: QK %d, BYTES %d against the type table", name, T::QK,
            T::BYTES);
  size_t rb;
  if (sl_kern_row_bytes(t, cols, &rb) != SL_OK) {
    CHECK_MSG(0, "%s: row bytes", name);
    return;
  }
  uint8_t *w = (uint8_t *)sl_malloc(rb * (size_t)rows);
  float *ref = (float *)sl_malloc(sizeof(float) * (size_t)cols);
  float *got = (float *)sl_malloc(sizeof(float) * (size_t)cols);
  float *x = (float *)sl_malloc(sizeof(float) * (size_t)cols);
  int *hits = (int *)sl_malloc(sizeof(int) * (size_t)cols);
  if (!w || !ref || !got || !x || !hits) {
    CHECK_MSG(0, "%s: out of memory", name);
    goto out;
  }
  {
    rw_fill_weight(t, w, rb * (size_t)rows);
    for (int64_t k = 0; k < cols; k++)
      x[k] = rw_unif(-1.0f, 1.0f);
    const bool scalar = sl_kern_cpu_isa() == SL_KERN_ISA_SCALAR;
    const int64_t nb = cols / T::QK;
    int bad = 0, badhit = 0, baddot = 0;
    for (int64_t r = 0; r < rows; r++) {
      const uint8_t *row = w + (size_t)r * rb;
      if (sl_kern_dequant_row(t, row, ref, cols) != SL_OK) {
        CHECK_MSG(0, "%s: cpu dequant", name);
        goto out;
      }
      memset(hits, 0, sizeof(int) * (size_t)cols);
      float acc = 0.0f; /* the matvec's per-thread sum, one thread */
      for (int64_t b = 0; b < nb; b++)
        for (int u = 0; u < T::UPB; u++) {
          typename T::raw raw;
          T::load(row + (size_t)b * T::BYTES, u, raw);
          for (int g = 0; g < T::GPU; g++) {
            float q[T::GS], s, m;
            T::group(raw, u, g, q, s, m);
            const int64_t o = b * T::QK + T::off(u, g);
            float p = 0.0f;
            for (int e = 0; e < T::GS; e++) {
              if (o + e < 0 || o + e >= cols) {
                badhit++;
                continue;
              }
              hits[o + e]++;
              got[o + e] = T::exact(q[e], s, m);
              const float qe =
                  T::KIND == sl_kcu::K_MIN ? fmaf(q[e], s, m) : q[e];
              if (T::KIND == sl_kcu::K_SCALED)
                p = fmaf(qe, x[o + e], p);
              else
                acc = fmaf(qe, x[o + e], acc);
            }
            if (T::KIND == sl_kcu::K_SCALED)
              acc = fmaf(s, p, acc);
          }
        }
      double dot = 0.0, l1 = 0.0;
      for (int64_t k = 0; k < cols; k++) {
        if (hits[k] != 1) {
          badhit++;
          continue;
        }
        bool ok = same_float(got[k], ref[k]);
        if (!ok && t == SL_GGML_Q5_1 && scalar)
          ok = same_float(got[k], q5_1_fused(row, k));
        if (!ok && bad++ < 3)
          fprintf(stderr, "  %s row %lld elem %lld: unit %.9g cpu %.9g\n", name,
                  (long long)r, (long long)k, got[k], ref[k]);
        dot += (double)ref[k] * x[k];
        l1 += fabs((double)ref[k] * x[k]);
      }
      if (!(fabs(acc - dot) <= 1e-5 * l1) && baddot++ < 3)
        fprintf(stderr, "  %s row %lld: matvec sum %.9g, float64 %.9g\n", name,
                (long long)r, acc, dot);
    }
    CHECK_MSG(badhit == 0, "%s %lld cols: %d elements not written once", name,
              (long long)cols, badhit);
    CHECK_MSG(bad == 0, "%s %lld cols: %d elements differ from the cpu", name,
              (long long)cols, bad);
    CHECK_MSG(baddot == 0, "%s %lld cols: %d rows' matvec sums off", name,
              (long long)cols, baddot);
    fprintf(stderr, "  %-6s %3lld x %-4lld units of %d elements: %s\n", name,
            (long long)rows, (long long)cols, T::QK / T::UPB,
            bad || badhit || baddot ? "FAIL" : "ok");
  }
out:
  sl_free(w);
  sl_free(ref);
  sl_free(got);
  sl_free(x);
  sl_free(hits);
}

template <class T> static void check_both(sl_ggml_type t, int64_t short_cols) {
  check_type<T>(t, 64, short_cols);
  check_type<T>(t, 16, 4096);
}

int main(void) {
  using namespace sl_kcu;
  /* the 32-element types: rows of 576 (18 blocks, not a multiple of 256) */
  check_both<q5_0>(SL_GGML_Q5_0, 576);
  check_both<q5_1>(SL_GGML_Q5_1, 576);
  check_both<iq4_nl>(SL_GGML_IQ4_NL, 576);
  check_type<iq4_nl>(SL_GGML_IQ4_NL, 8, 32);
  check_both<q2_k>(SL_GGML_Q2_K, 1536);
  check_both<q3_k>(SL_GGML_Q3_K, 1536);
  check_both<iq4_xs>(SL_GGML_IQ4_XS, 1536);
  check_both<q4_k>(SL_GGML_Q4_K, 1536);
  check_both<q5_k>(SL_GGML_Q5_K, 1536);
  check_both<q6_k>(SL_GGML_Q6_K, 1536);
  check_both<f32w<8>>(SL_GGML_F32, 576);
  check_type<f32w<1>>(SL_GGML_F32, 8, 36);
  check_both<h16w<false, 8>>(SL_GGML_F16, 576);
  check_type<h16w<false, 1>>(SL_GGML_F16, 8, 36);
  check_both<h16w<true, 8>>(SL_GGML_BF16, 576);
  check_type<h16w<true, 1>>(SL_GGML_BF16, 8, 36);
  fprintf(stderr, "%d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
