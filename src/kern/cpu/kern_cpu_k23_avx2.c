/* sluice — kern/cpu: AVX2 dots of Q2_K, Q3_K and IQ4_XS weights with Q8_K
 * activations, for up to SL__NT_MAX tokens at once (the matmul's token
 * tiles: each weight block is unpacked once per tile). Compiled for
 * avx2,fma,f16c only and reached only through the AVX2 (and AVX-512) op
 * table. Each block's integer sum is exact, as in the scalar dots; only the
 * float accumulation differs (8 lanes, added up at the end). A token's result
 * does not depend on the tile it is in. */
#include "kern_cpu_k23.h"

#if defined(__x86_64__)

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#define INL    static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")

#include "simd_avx2.h"

#define XK(t, i)                                                               \
  (&((const sl__block_q8_K *)((const char *)x + (size_t)(t)*xs))[i])

/* int16 lanes: sc[k] in the low 128 bits, sc[k + 1] in the high: the scales
 * of the two 16-element groups a 32-byte step covers. */
INL __m256i pair_scale(const int16_t *sc, int k) {
  return _mm256_set_m128i(_mm_set1_epi16(sc[k + 1]), _mm_set1_epi16(sc[k]));
}

/* Q2_K and Q3_K share the 2-bit walk: per block, 8 steps of 32 quants
 * (h, j), each times its two scales. Q3_K adds the third bit and has no
 * mins; its quants are taken unsigned (0..7) and 4 * scale * bsum is taken
 * off after. */
INL void dot_k23_nt(int64_t n, const void *w, const void *x, size_t xs,
                    float *y, size_t ys, const int NT, const int three) {
  const int64_t nb = n / SL__QK_K;
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  __m256 acc[SL__NT_MAX];
  UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; i++) {
    /* sc: the 16 scales; sc16: Q3_K's scales, Q2_K's mins (x bsums) */
    const uint8_t *qs;
    int16_t sc[16];
    __m256i sc16, hv = _mm256_setzero_si256();
    float d, dmin = 0;
    if (three) {
      const sl__block_q3_K *b = (const sl__block_q3_K *)w + i;
      int8_t s8[16];
      sl__q3_K_scales(b->scales, s8);
      for (int g = 0; g < 16; g++)
        sc[g] = s8[g];
      sc16 = _mm256_loadu_si256((const __m256i *)sc);
      qs = b->qs;
      hv = _mm256_loadu_si256((const __m256i *)b->hmask);
      d = _cvtsh_ss(b->d);
    } else {
      const sl__block_q2_K *b = (const sl__block_q2_K *)w + i;
      __m128i raw = _mm_loadu_si128((const __m128i *)b->scales);
      _mm256_storeu_si256((__m256i *)sc, _mm256_cvtepu8_epi16(_mm_and_si128(
                                             raw, _mm_set1_epi8(0xF))));
      sc16 = _mm256_cvtepu8_epi16(
          _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0xF)));
      qs = b->qs;
      d = _cvtsh_ss(b->d);
      dmin = _cvtsh_ss(b->dmin);
    }
    __m256i sumi[SL__NT_MAX];
    UNROLL for (int t = 0; t < NT; t++) sumi[t] = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
      __m256i qv = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
      for (int j = 0; j < 4; j++) {
        __m256i q = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * j), m3);
        if (three)
          q = _mm256_or_si256(
              q,
              _mm256_slli_epi16(
                  _mm256_and_si256(_mm256_srli_epi16(hv, 4 * h + j), one), 2));
        __m256i s = pair_scale(sc, 8 * h + 2 * j);
        UNROLL for (int t = 0; t < NT; t++) {
          __m256i xv = _mm256_loadu_si256(
              (const __m256i *)(XK(t, i)->qs + 128 * h + 32 * j));
          sumi[t] = _mm256_add_epi32(
              sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), s));
        }
      }
    }
    UNROLL for (int t = 0; t < NT; t++) {
      const sl__block_q8_K *xb = XK(t, i);
      __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
      __m256i pm = _mm256_madd_epi16(bs, sc16);
      if (three) {
        __m256i v = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(pm, 2));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v),
                                 _mm256_set1_ps(d * xb->d), acc[t]);
      } else {
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]),
                                 _mm256_set1_ps(d * xb->d), acc[t]);
        acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(pm),
                                  _mm256_set1_ps(dmin * xb->d), acc[t]);
      }
    }
  }
  UNROLL for (int t = 0; t < NT; t++) y[(size_t)t * ys] = hsum_ps(acc[t]);
}

INL void q2_K_nt(int64_t n, const void *w, const void *x, size_t xs, float *y,
                 size_t ys, const int NT) {
  dot_k23_nt(n, w, x, xs, y, ys, NT, 0);
}
SL__NT_DISPATCH(q2_K)

INL void q3_K_nt(int64_t n, const void *w, const void *x, size_t xs, float *y,
                 size_t ys, const int NT) {
  dot_k23_nt(n, w, x, xs, y, ys, NT, 1);
}
SL__NT_DISPATCH(q3_K)

/* IQ4_XS: the levels by a byte shuffle, signed times signed through the
 * sign trick (|v| * sign(x, v); |v|, |x| <= 127, so the int16 pair sums
 * cannot saturate). */
INL void iq4_xs_nt(int64_t n, const void *w, const void *x, size_t xs, float *y,
                   size_t ys, const int NT) {
  const sl__block_iq4_xs *a = w;
  const int64_t nb = n / SL__QK_K;
  const __m256i lut = _mm256_broadcastsi128_si256(
      _mm_loadu_si128((const __m128i *)sl__kvalues_iq4));
  __m256 acc[SL__NT_MAX];
  UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; i++) {
    __m256i sumi[SL__NT_MAX];
    UNROLL for (int t = 0; t < NT; t++) sumi[t] = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ib++) {
      __m256i v = _mm256_shuffle_epi8(lut, unpack_q4(a[i].qs + 16 * ib));
      __m256i av = _mm256_sign_epi8(v, v);
      __m256i s = _mm256_set1_epi16((short)sl__iq4_xs_scale(&a[i], ib));
      UNROLL for (int t = 0; t < NT; t++) {
        __m256i xv =
            _mm256_loadu_si256((const __m256i *)(XK(t, i)->qs + 32 * ib));
        __m256i p = _mm256_maddubs_epi16(av, _mm256_sign_epi8(xv, v));
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, s));
      }
    }
    float d = _cvtsh_ss(a[i].d);
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_fmadd_ps(
        _mm256_cvtepi32_ps(sumi[t]), _mm256_set1_ps(d * XK(t, i)->d), acc[t]);
  }
  UNROLL for (int t = 0; t < NT; t++) y[(size_t)t * ys] = hsum_ps(acc[t]);
}
SL__NT_DISPATCH(iq4_xs)

void sl__dot_q2_K_avx2(int64_t n, const void *w, const void *x, size_t xs,
                       float *y, size_t ys, int nt) {
  q2_K(n, w, x, xs, y, ys, nt);
}
void sl__dot_q3_K_avx2(int64_t n, const void *w, const void *x, size_t xs,
                       float *y, size_t ys, int nt) {
  q3_K(n, w, x, xs, y, ys, nt);
}
void sl__dot_iq4_xs_avx2(int64_t n, const void *w, const void *x, size_t xs,
                         float *y, size_t ys, int nt) {
  iq4_xs(n, w, x, xs, y, ys, nt);
}

#pragma GCC pop_options

#endif
