/* sluice — kern/cpu: AVX2 + FMA + F16C dequantization and dots for Q5_0,
 * Q5_1 and IQ4_NL; an overlay that kern_cpu.c merges into the AVX2 table
 * (the AVX-512 table inherits them). Reached only when
 * sl_kern_cpu_isa_supported(SL_KERN_ISA_AVX2). Their batched products are in
 * kern_cpu_gemm_avx2.c, bit-identical with these dots.
 *
 * The dots keep the shape of the Q4_0 / Q4_1 ones (kern_cpu_avx2.c): one
 * 8-lane accumulator chain over the blocks, fma of the block's int32 lane
 * sums by d_w * d_x, then one horizontal sum (plus the m * s sum for Q5_1).
 * For Q5_0 and Q5_1 that is the order of ggml's AVX2 dots; its IQ4_NL dot
 * (as far as we read it) takes two blocks per step into two chains, so there
 * the last bits may differ from llama.cpp's (the model test measures both
 * against float64, not against each other). */
#include "kern_cpu_impl.h"

#if defined(__x86_64__)

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#define INL    static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")

#include "simd_avx2.h"

#define XB(type, t, i) (((const type *)((const char *)x + (size_t)(t)*xs))[i])

/* ---- dots ------------------------------------------------------------------
 */

/* Signed weight quants q (|q| <= 127) against Q8_0: the sign trick puts
 * |q| in the unsigned operand of maddubs. */
INL void blk_signed(__m256i q, float dw, const void *x, size_t xs, int64_t i,
                    __m256 *acc, const int NT) {
  __m256i aq = _mm256_sign_epi8(q, q);
  UNROLL for (int t = 0; t < NT; t++) {
    const sl__block_q8_0 *xb = &XB(sl__block_q8_0, t, i);
    __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
    __m256i p = dot_us8(aq, _mm256_sign_epi8(xv, q));
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                             _mm256_set1_ps(dw * _cvtsh_ss(xb->d)), acc[t]);
  }
}

INL void blk_q5_0(const void *w, const void *x, size_t xs, int64_t i,
                  __m256 *acc, float *sm, const int NT) {
  (void)sm;
  const sl__block_q5_0 *a = (const sl__block_q5_0 *)w + i;
  __m256i q = _mm256_sub_epi8(unpack_q5(a->qs, a->qh), _mm256_set1_epi8(16));
  blk_signed(q, _cvtsh_ss(a->d), x, xs, i, acc, NT);
}

INL void blk_iq4_nl(const void *w, const void *x, size_t xs, int64_t i,
                    __m256 *acc, float *sm, const int NT) {
  (void)sm;
  const sl__block_iq4_nl *a = (const sl__block_iq4_nl *)w + i;
  blk_signed(unpack_iq4nl(a->qs), _cvtsh_ss(a->d), x, xs, i, acc, NT);
}

INL void blk_q5_1(const void *w, const void *x, size_t xs, int64_t i,
                  __m256 *acc, float *sm, const int NT) {
  const sl__block_q5_1 *a = (const sl__block_q5_1 *)w + i;
  __m256i q = unpack_q5(a->qs, a->qh); /* 0..31: unsigned as it is */
  float dw = _cvtsh_ss(a->d), mw = _cvtsh_ss(a->m);
  UNROLL for (int t = 0; t < NT; t++) {
    const sl__block_q8_1 *xb = &XB(sl__block_q8_1, t, i);
    __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
    __m256i p = dot_us8(q, xv);
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                             _mm256_set1_ps(dw * _cvtsh_ss(xb->d)), acc[t]);
    sm[t] += mw * _cvtsh_ss(xb->s);
  }
}

SL__DOT_BLK32(dot_q5_0, blk_q5_0, void)
SL__DOT_BLK32(dot_q5_1, blk_q5_1, void)
SL__DOT_BLK32(dot_iq4_nl, blk_iq4_nl, void)

/* ---- dequantization ------------------------------------------------------ */

/* dst[0..32) = q (32 int8) * d + m. */
INL void store32(float *dst, __m256i q, __m256 d, __m256 m) {
  __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int k = 0; k < 4; k++)
    _mm256_storeu_ps(
        dst + 8 * k,
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[k])), d,
                        m));
}

static void dq_q5_0(const void *src, float *dst, int64_t n) {
  const sl__block_q5_0 *b = src;
  for (int64_t i = 0; i < n / SL__QK; i++, dst += SL__QK) {
    __m256i q =
        _mm256_sub_epi8(unpack_q5(b[i].qs, b[i].qh), _mm256_set1_epi8(16));
    store32(dst, q, _mm256_set1_ps(_cvtsh_ss(b[i].d)), _mm256_setzero_ps());
  }
}

static void dq_q5_1(const void *src, float *dst, int64_t n) {
  const sl__block_q5_1 *b = src;
  for (int64_t i = 0; i < n / SL__QK; i++, dst += SL__QK)
    store32(dst, unpack_q5(b[i].qs, b[i].qh), _mm256_set1_ps(_cvtsh_ss(b[i].d)),
            _mm256_set1_ps(_cvtsh_ss(b[i].m)));
}

static void dq_iq4_nl(const void *src, float *dst, int64_t n) {
  const sl__block_iq4_nl *b = src;
  for (int64_t i = 0; i < n / SL__QK; i++, dst += SL__QK)
    store32(dst, unpack_iq4nl(b[i].qs), _mm256_set1_ps(_cvtsh_ss(b[i].d)),
            _mm256_setzero_ps());
}

#pragma GCC pop_options

const sl__kern_cpu_ops sl__kern_cpu_q5_avx2_ops = {
    .dequant =
        {
            [SL_GGML_Q5_0] = dq_q5_0,
            [SL_GGML_Q5_1] = dq_q5_1,
            [SL_GGML_IQ4_NL] = dq_iq4_nl,
        },
    .dot =
        {
            [SL_GGML_Q5_0] = dot_q5_0,
            [SL_GGML_Q5_1] = dot_q5_1,
            [SL_GGML_IQ4_NL] = dot_iq4_nl,
        },
};

#else /* not x86-64: the scalar overlay serves */

const sl__kern_cpu_ops sl__kern_cpu_q5_avx2_ops = {0};

#endif
