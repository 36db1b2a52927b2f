/* sluice — kern/cpu: AVX2 batched products for the 32-element block types
 * (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q8_0 weights), the prefill and
 * batched-decode path.
 *
 * A call covers a chunk of rows and every token. It converts the chunk's f16
 * weight scales to floats once, takes the activations' scales already
 * converted (block-major, so four tokens' scales are one load), and walks
 * tiles of two rows by up to four tokens: each weight block is unpacked once
 * per tile, each activation block loaded once for both rows. Every output is
 * still the one-row dot's sum in the one-row dot's order (which is ggml's),
 * so batching changes no bit of any result; test_kern_cpu checks that. */
#include "kern_cpu_impl.h"

#if defined(__x86_64__)

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#define INL    static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")

#include "simd_avx2.h"

#define XQ(type, t, i) (((const type *)((const char *)x + (size_t)(t)*xs))[i])

/* One tile: rows a0 and a1 (a1 == a0 when !two) by NT tokens. ws0/ws1: the
 * rows' scales as floats, [block][2] (d, then m for Q4_1 / Q5_1). Unsigned
 * quants with a minimum against Q8_1; load_q(block) unpacks them. */
#define SL__TILE_MIN(name, wtype, load_q)                                      \
  INL void name(int64_t nb, const wtype *a0, const wtype *a1,                  \
                const float *ws0, const float *ws1, const void *x, size_t xs,  \
                const float *xd, const float *xsum, int64_t ld, float *y,      \
                size_t ys, int two, const int NT) {                            \
    __m256 acc0[SL__NT_MAX], acc1[SL__NT_MAX];                                 \
    __m128 sm0 = _mm_setzero_ps(), sm1 = _mm_setzero_ps();                     \
    UNROLL for (int t = 0; t < NT; t++) acc0[t] = acc1[t] =                    \
        _mm256_setzero_ps();                                                   \
    for (int64_t i = 0; i < nb; i++) {                                         \
      __m256i q0 = load_q(&a0[i]), q1 = load_q(&a1[i]);                        \
      __m256 d0 = _mm256_broadcast_ss(ws0 + 2 * i);                            \
      __m256 d1 = _mm256_broadcast_ss(ws1 + 2 * i);                            \
      /* the one-row dot's `sm += m * s`, four tokens per lane set */          \
      __m128 sx = _mm_loadu_ps(xsum + i * ld);                                 \
      sm0 = _mm_fmadd_ps(_mm_broadcast_ss(ws0 + 2 * i + 1), sx, sm0);          \
      sm1 = _mm_fmadd_ps(_mm_broadcast_ss(ws1 + 2 * i + 1), sx, sm1);          \
      UNROLL for (int t = 0; t < NT; t++) {                                    \
        __m256i xv =                                                           \
            _mm256_loadu_si256((const __m256i *)XQ(sl__block_q8_1, t, i).qs);  \
        __m256 dx = _mm256_broadcast_ss(xd + i * ld + t);                      \
        acc0[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_us8(q0, xv)),         \
                                  _mm256_mul_ps(d0, dx), acc0[t]);             \
        acc1[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_us8(q1, xv)),         \
                                  _mm256_mul_ps(d1, dx), acc1[t]);             \
      }                                                                        \
    }                                                                          \
    float s0[4], s1[4];                                                        \
    _mm_storeu_ps(s0, sm0);                                                    \
    _mm_storeu_ps(s1, sm1);                                                    \
    UNROLL for (int t = 0; t < NT; t++) {                                      \
      y[(size_t)t * ys] = hsum_ps(acc0[t]) + s0[t];                            \
      if (two)                                                                 \
        y[(size_t)t * ys + 1] = hsum_ps(acc1[t]) + s1[t];                      \
    }                                                                          \
  }

/* Q4_0, Q5_0, IQ4_NL and Q8_0 rows against Q8_0 activations: signed
 * quants, the sign
 * trick of the one-row dot; `+ 0.0f` as the one-row dot's empty min sum. */
#define SL__TILE_SIGNED(name, wtype, load_q)                                   \
  INL void name(int64_t nb, const wtype *a0, const wtype *a1,                  \
                const float *ws0, const float *ws1, const void *x, size_t xs,  \
                const float *xd, const float *xsum, int64_t ld, float *y,      \
                size_t ys, int two, const int NT) {                            \
    (void)xsum;                                                                \
    __m256 acc0[SL__NT_MAX], acc1[SL__NT_MAX];                                 \
    UNROLL for (int t = 0; t < NT; t++) acc0[t] = acc1[t] =                    \
        _mm256_setzero_ps();                                                   \
    for (int64_t i = 0; i < nb; i++) {                                         \
      __m256i q0 = load_q(&a0[i]), q1 = load_q(&a1[i]);                        \
      __m256i aq0 = _mm256_sign_epi8(q0, q0), aq1 = _mm256_sign_epi8(q1, q1);  \
      __m256 d0 = _mm256_broadcast_ss(ws0 + 2 * i);                            \
      __m256 d1 = _mm256_broadcast_ss(ws1 + 2 * i);                            \
      UNROLL for (int t = 0; t < NT; t++) {                                    \
        __m256i xv =                                                           \
            _mm256_loadu_si256((const __m256i *)XQ(sl__block_q8_0, t, i).qs);  \
        __m256 dx = _mm256_broadcast_ss(xd + i * ld + t);                      \
        acc0[t] = _mm256_fmadd_ps(                                             \
            _mm256_cvtepi32_ps(dot_us8(aq0, _mm256_sign_epi8(xv, q0))),        \
            _mm256_mul_ps(d0, dx), acc0[t]);                                   \
        acc1[t] = _mm256_fmadd_ps(                                             \
            _mm256_cvtepi32_ps(dot_us8(aq1, _mm256_sign_epi8(xv, q1))),        \
            _mm256_mul_ps(d1, dx), acc1[t]);                                   \
      }                                                                        \
    }                                                                          \
    UNROLL for (int t = 0; t < NT; t++) {                                      \
      y[(size_t)t * ys] = hsum_ps(acc0[t]) + 0.0f;                             \
      if (two)                                                                 \
        y[(size_t)t * ys + 1] = hsum_ps(acc1[t]) + 0.0f;                       \
    }                                                                          \
  }

INL __m256i load_q4_0(const sl__block_q4_0 *b) {
  return _mm256_sub_epi8(unpack_q4(b->qs), _mm256_set1_epi8(8));
}
INL __m256i load_q5_0(const sl__block_q5_0 *b) {
  return _mm256_sub_epi8(unpack_q5(b->qs, b->qh), _mm256_set1_epi8(16));
}
INL __m256i load_iq4_nl(const sl__block_iq4_nl *b) {
  return unpack_iq4nl(b->qs);
}
INL __m256i load_q8_0(const sl__block_q8_0 *b) {
  return _mm256_loadu_si256((const __m256i *)b->qs);
}
INL __m256i load_q4_1(const sl__block_q4_1 *b) {
  return unpack_q4(b->qs);
}
INL __m256i load_q5_1(const sl__block_q5_1 *b) {
  return unpack_q5(b->qs, b->qh);
}
SL__TILE_SIGNED(tile_q4_0, sl__block_q4_0, load_q4_0)
SL__TILE_SIGNED(tile_q5_0, sl__block_q5_0, load_q5_0)
SL__TILE_SIGNED(tile_iq4_nl, sl__block_iq4_nl, load_iq4_nl)
SL__TILE_SIGNED(tile_q8_0, sl__block_q8_0, load_q8_0)
SL__TILE_MIN(tile_q4_1, sl__block_q4_1, load_q4_1)
SL__TILE_MIN(tile_q5_1, sl__block_q5_1, load_q5_1)

/* The chunk driver: weight scales to floats once, then token tiles outside
 * (the chunk's rows stay in L1 while the tiles pass) and row pairs inside. */
#define SL__GEMM(name, wtype, tile, has_m)                                     \
  static void name(int64_t cols, const void *w, size_t wst, int64_t nr,        \
                   const void *x, size_t xs, const float *xd,                  \
                   const float *xsum, int64_t ld, int64_t n, float *y,         \
                   size_t ys) {                                                \
    const int64_t nb = cols / SL__QK;                                          \
    float ws[SL__GEMM_WSC_MAX];                                                \
    for (int64_t r = 0; r < nr; r++) {                                         \
      const wtype *a = (const wtype *)((const char *)w + (size_t)r * wst);     \
      for (int64_t i = 0; i < nb; i++) {                                       \
        ws[(r * nb + i) * 2] = _cvtsh_ss(a[i].d);                              \
        ws[(r * nb + i) * 2 + 1] = has_m(a[i]);                                \
      }                                                                        \
    }                                                                          \
    for (int64_t t0 = 0; t0 < n; t0 += SL__NT_MAX) {                           \
      int64_t nt = n - t0 < SL__NT_MAX ? n - t0 : SL__NT_MAX;                  \
      const void *xt = (const char *)x + (size_t)t0 * xs;                      \
      const float *xdt = xd + t0, *xst = xsum ? xsum + t0 : NULL;              \
      for (int64_t r = 0; r < nr; r += 2) {                                    \
        int two = r + 1 < nr;                                                  \
        const wtype *a0 = (const wtype *)((const char *)w + (size_t)r * wst);  \
        const wtype *a1 = two ? (const wtype *)((const char *)a0 + wst) : a0;  \
        const float *w0 = ws + r * nb * 2, *w1 = two ? w0 + nb * 2 : w0;       \
        float *yt = y + (size_t)t0 * ys + (size_t)r;                           \
        switch (nt) {                                                          \
        case 1:                                                                \
          tile(nb, a0, a1, w0, w1, xt, xs, xdt, xst, ld, yt, ys, two, 1);      \
          break;                                                               \
        case 2:                                                                \
          tile(nb, a0, a1, w0, w1, xt, xs, xdt, xst, ld, yt, ys, two, 2);      \
          break;                                                               \
        case 3:                                                                \
          tile(nb, a0, a1, w0, w1, xt, xs, xdt, xst, ld, yt, ys, two, 3);      \
          break;                                                               \
        default:                                                               \
          tile(nb, a0, a1, w0, w1, xt, xs, xdt, xst, ld, yt, ys, two, 4);      \
          break;                                                               \
        }                                                                      \
      }                                                                        \
    }                                                                          \
  }

#define M_D_M(b)  _cvtsh_ss((b).m)
#define M_NONE(b) 0.0f
SL__GEMM(gemm_q4_0, sl__block_q4_0, tile_q4_0, M_NONE)
SL__GEMM(gemm_q4_1, sl__block_q4_1, tile_q4_1, M_D_M)
SL__GEMM(gemm_q5_0, sl__block_q5_0, tile_q5_0, M_NONE)
SL__GEMM(gemm_q5_1, sl__block_q5_1, tile_q5_1, M_D_M)
SL__GEMM(gemm_iq4_nl, sl__block_iq4_nl, tile_iq4_nl, M_NONE)
SL__GEMM(gemm_q8_0, sl__block_q8_0, tile_q8_0, M_NONE)

#pragma GCC pop_options

const sl__gemm_fn sl__kern_cpu_avx2_gemm[SL__NTYPES] = {
    [SL_GGML_Q4_0] = gemm_q4_0, [SL_GGML_Q4_1] = gemm_q4_1,
    [SL_GGML_Q8_0] = gemm_q8_0, [SL_GGML_Q5_0] = gemm_q5_0,
    [SL_GGML_Q5_1] = gemm_q5_1, [SL_GGML_IQ4_NL] = gemm_iq4_nl,
};

#else

const sl__gemm_fn sl__kern_cpu_avx2_gemm[SL__NTYPES] = {0};

#endif
