/* sluice — kern/cpu: AVX-512 (F, BW, VL, DQ) kernels: float-weight dots, add
 * and rmsnorm. Everything else uses the AVX2 table: a two-blocks-per-register
 * version of the Q4_0/Q4_1/Q8_0 dots measured slower than AVX2 on the one
 * AVX-512 host tried (a Xeon VM), so it was left out. Reached only when
 * sl_kern_cpu_isa_supported(SL_KERN_ISA_AVX512). */
#include "kern_cpu_impl.h"

#if defined(__x86_64__)

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>

#define INL    static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")

#define XT(t) ((const char *)x + (size_t)(t)*xs)

/* Float weights, 16 per step; widen() turns 16 weights at w + i into f32. */
#define SL__DOT_FLOAT(name, elem, load16, scalar_cvt)                          \
  INL void name##_nt(int64_t n, const void *w, const void *x, size_t xs,       \
                     float *y, size_t ys, const int NT) {                      \
    const elem *a = w;                                                         \
    __m512 acc[SL__NT_MAX];                                                    \
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();          \
    int64_t i = 0;                                                             \
    for (; i + 16 <= n; i += 16) {                                             \
      __m512 wv = load16(a + i);                                               \
      UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_fmadd_ps(            \
          wv, _mm512_loadu_ps((const float *)XT(t) + i), acc[t]);              \
    }                                                                          \
    UNROLL for (int t = 0; t < NT; t++) {                                      \
      const float *xt = (const float *)XT(t);                                  \
      float s = _mm512_reduce_add_ps(acc[t]);                                  \
      for (int64_t k = i; k < n; k++)                                          \
        s += scalar_cvt(a[k]) * xt[k];                                         \
      y[(size_t)t * ys] = s;                                                   \
    }                                                                          \
  }                                                                            \
  SL__NT_DISPATCH(name)

INL __m512 load_f32(const float *p) {
  return _mm512_loadu_ps(p);
}
INL __m512 load_f16(const uint16_t *p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
INL __m512 load_bf16(const uint16_t *p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
INL float id_f32(float f) {
  return f;
}

SL__DOT_FLOAT(dot_f32, float, load_f32, id_f32)
SL__DOT_FLOAT(dot_f16, uint16_t, load_f16, _cvtsh_ss)
SL__DOT_FLOAT(dot_bf16, uint16_t, load_bf16, sl__bf16_to_f32)

static void add(float *out, const float *a, const float *b, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(
        out + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  if (i < n) {
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i),
                                        _mm512_maskz_loadu_ps(m, b + i)));
  }
}

static void rmsnorm(float *out, const float *x, const float *w, int64_t n,
                    float eps) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  double ss = _mm512_reduce_add_ps(acc);
  for (; i < n; i++)
    ss += (double)x[i] * x[i];
  float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
  __m512 s = _mm512_set1_ps(scale);
  for (i = 0; i + 16 <= n; i += 16) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), s);
    if (w)
      v = _mm512_mul_ps(v, _mm512_loadu_ps(w + i));
    _mm512_storeu_ps(out + i, v);
  }
  for (; i < n; i++)
    out[i] = x[i] * scale * (w ? w[i] : 1.0f);
}

#pragma GCC pop_options

const sl__kern_cpu_ops sl__kern_cpu_avx512_ops = {
    .dot =
        {
            [SL_GGML_F32] = dot_f32,
            [SL_GGML_F16] = dot_f16,
            [SL_GGML_BF16] = dot_bf16,
        },
    .rmsnorm = rmsnorm,
    .add = add,
};

#else

const sl__kern_cpu_ops sl__kern_cpu_avx512_ops = {0};

#endif
