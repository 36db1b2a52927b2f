/* sluice — kern/cpu: AVX2 + FMA + F16C kernels. Every function here is
 * compiled for that target only and reached only through the op table when
 * sl_kern_cpu_isa_supported(SL_KERN_ISA_AVX2). Entries left NULL use the
 * scalar ones. */
#include "kern_cpu_k23.h"

#if defined(__x86_64__)

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#define INL    static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")

#include "simd_avx2.h"

/* ---- dots ------------------------------------------------------------------
 */

#define XB(type, t, i) (((const type *)((const char *)x + (size_t)(t)*xs))[i])

INL void dot_f32_nt(int64_t n, const void *w, const void *x, size_t xs,
                    float *y, size_t ys, const int NT) {
  const float *a = w;
  __m256 acc[SL__NT_MAX], acc2[SL__NT_MAX];
  UNROLL for (int t = 0; t < NT; t++) acc[t] = acc2[t] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 w0 = _mm256_loadu_ps(a + i), w1 = _mm256_loadu_ps(a + i + 8);
    UNROLL for (int t = 0; t < NT; t++) {
      const float *xt = (const float *)((const char *)x + (size_t)t * xs);
      acc[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt + i), acc[t]);
      acc2[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + i + 8), acc2[t]);
    }
  }
  UNROLL for (int t = 0; t < NT; t++) {
    const float *xt = (const float *)((const char *)x + (size_t)t * xs);
    float s = hsum_ps(_mm256_add_ps(acc[t], acc2[t]));
    for (int64_t k = i; k < n; k++)
      s += a[k] * xt[k];
    y[(size_t)t * ys] = s;
  }
}
SL__NT_DISPATCH(dot_f32)

/* F16 / BF16 rows: load 8 halves and widen. */
#define SL__DOT_HALF(name, widen, scalar_cvt)                                  \
  INL void name##_nt(int64_t n, const void *w, const void *x, size_t xs,       \
                     float *y, size_t ys, const int NT) {                      \
    const uint16_t *a = w;                                                     \
    __m256 acc[SL__NT_MAX], acc2[SL__NT_MAX];                                  \
    UNROLL for (int t = 0; t < NT; t++) acc[t] = acc2[t] =                     \
        _mm256_setzero_ps();                                                   \
    int64_t i = 0;                                                             \
    for (; i + 16 <= n; i += 16) {                                             \
      __m256 w0 = widen(_mm_loadu_si128((const __m128i *)(a + i)));            \
      __m256 w1 = widen(_mm_loadu_si128((const __m128i *)(a + i + 8)));        \
      UNROLL for (int t = 0; t < NT; t++) {                                    \
        const float *xt = (const float *)((const char *)x + (size_t)t * xs);   \
        acc[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt + i), acc[t]);         \
        acc2[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + i + 8), acc2[t]);   \
      }                                                                        \
    }                                                                          \
    UNROLL for (int t = 0; t < NT; t++) {                                      \
      const float *xt = (const float *)((const char *)x + (size_t)t * xs);     \
      float s = hsum_ps(_mm256_add_ps(acc[t], acc2[t]));                       \
      for (int64_t k = i; k < n; k++)                                          \
        s += scalar_cvt(a[k]) * xt[k];                                         \
      y[(size_t)t * ys] = s;                                                   \
    }                                                                          \
  }                                                                            \
  SL__NT_DISPATCH(name)

SL__DOT_HALF(dot_f16, _mm256_cvtph_ps, _cvtsh_ss)
SL__DOT_HALF(dot_bf16, widen_bf16, sl__bf16_to_f32)

/* The 32-element block types: one block's products for NT tokens, added to
 * acc[] (and sm[] for Q4_1). */
INL void blk_q4_0(const sl__block_q4_0 *a, const void *x, size_t xs, int64_t i,
                  __m256 *acc, float *sm, const int NT) {
  (void)sm;
  __m256i q = _mm256_sub_epi8(unpack_q4(a[i].qs), _mm256_set1_epi8(8));
  __m256i aq = _mm256_sign_epi8(q, q);
  float dw = _cvtsh_ss(a[i].d);
  UNROLL for (int t = 0; t < NT; t++) {
    const sl__block_q8_0 *xb = &XB(sl__block_q8_0, t, i);
    __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
    __m256i p = dot_us8(aq, _mm256_sign_epi8(xv, q));
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                             _mm256_set1_ps(dw * _cvtsh_ss(xb->d)), acc[t]);
  }
}

INL void blk_q4_1(const sl__block_q4_1 *a, const void *x, size_t xs, int64_t i,
                  __m256 *acc, float *sm, const int NT) {
  __m256i q = unpack_q4(a[i].qs);
  float dw = _cvtsh_ss(a[i].d), mw = _cvtsh_ss(a[i].m);
  UNROLL for (int t = 0; t < NT; t++) {
    const sl__block_q8_1 *xb = &XB(sl__block_q8_1, t, i);
    __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
    __m256i p = dot_us8(q, xv);
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                             _mm256_set1_ps(dw * _cvtsh_ss(xb->d)), acc[t]);
    sm[t] += mw * _cvtsh_ss(xb->s);
  }
}

INL void blk_q8_0(const sl__block_q8_0 *a, const void *x, size_t xs, int64_t i,
                  __m256 *acc, float *sm, const int NT) {
  (void)sm;
  __m256i q = _mm256_loadu_si256((const __m256i *)a[i].qs);
  __m256i aq = _mm256_sign_epi8(q, q);
  float dw = _cvtsh_ss(a[i].d);
  UNROLL for (int t = 0; t < NT; t++) {
    const sl__block_q8_0 *xb = &XB(sl__block_q8_0, t, i);
    __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
    __m256i p = dot_us8(aq, _mm256_sign_epi8(xv, q));
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                             _mm256_set1_ps(dw * _cvtsh_ss(xb->d)), acc[t]);
  }
}

SL__DOT_BLK32(dot_q4_0, blk_q4_0, sl__block_q4_0)
SL__DOT_BLK32(dot_q4_1, blk_q4_1, sl__block_q4_1)
SL__DOT_BLK32(dot_q8_0, blk_q8_0, sl__block_q8_0)

/* Q4_K and Q5_K share everything but the unpacking of the 4+1 bit quants. */
INL void dot_kmin_nt(int64_t n, const void *w, const void *x, size_t xs,
                     float *y, size_t ys, const int NT, const int five) {
  const int64_t nb = n / SL__QK_K;
  const size_t bsz = five ? sizeof(sl__block_q5_K) : sizeof(sl__block_q4_K);
  const __m256i m4 = _mm256_set1_epi8(0x0F), b16 = _mm256_set1_epi8(16);
  __m256 acc[SL__NT_MAX];
  UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; i++) {
    const uint8_t *blk = (const uint8_t *)w + (size_t)i * bsz;
    /* Both layouts start: f16 d, f16 dmin, scales[12]. */
    const sl__block_q4_K *hdr = (const sl__block_q4_K *)blk;
    const uint8_t *qs = five ? ((const sl__block_q5_K *)blk)->qs : hdr->qs;
    __m256i hv = _mm256_setzero_si256();
    if (five)
      hv = _mm256_loadu_si256(
          (const __m256i *)((const sl__block_q5_K *)blk)->qh);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++)
      sl__scale_min_k4(j, hdr->scales, &sc[j], &mn[j]);
    /* mins, each twice: pairs with bsums[2j], bsums[2j+1] */
    __m256i mins16 = _mm256_cvtepu8_epi16(
        _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)mn),
                          _mm_loadl_epi64((const __m128i *)mn)));
    float d = _cvtsh_ss(hdr->d), dmin = _cvtsh_ss(hdr->dmin);
    __m256i sumi[SL__NT_MAX];
    UNROLL for (int t = 0; t < NT; t++) sumi[t] = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
      __m256i qv = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
      __m256i lo = _mm256_and_si256(qv, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
      if (five) {
        __m256i bl = _mm256_set1_epi8((char)(1 << (2 * j)));
        __m256i bh = _mm256_set1_epi8((char)(2 << (2 * j)));
        lo = _mm256_or_si256(
            lo, _mm256_and_si256(
                    _mm256_cmpeq_epi8(_mm256_and_si256(hv, bl), bl), b16));
        hi = _mm256_or_si256(
            hi, _mm256_and_si256(
                    _mm256_cmpeq_epi8(_mm256_and_si256(hv, bh), bh), b16));
      }
      __m256i sl = _mm256_set1_epi16(sc[2 * j]);
      __m256i sh = _mm256_set1_epi16(sc[2 * j + 1]);
      UNROLL for (int t = 0; t < NT; t++) {
        const sl__block_q8_K *xb = &XB(sl__block_q8_K, t, i);
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(xb->qs + 64 * j));
        __m256i x1 =
            _mm256_loadu_si256((const __m256i *)(xb->qs + 64 * j + 32));
        __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), sl);
        __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), sh);
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
      }
    }
    UNROLL for (int t = 0; t < NT; t++) {
      const sl__block_q8_K *xb = &XB(sl__block_q8_K, t, i);
      __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
      __m256i pm = _mm256_madd_epi16(bs, mins16);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]),
                               _mm256_set1_ps(d * xb->d), acc[t]);
      acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(pm),
                                _mm256_set1_ps(dmin * xb->d), acc[t]);
    }
  }
  UNROLL for (int t = 0; t < NT; t++) y[(size_t)t * ys] = hsum_ps(acc[t]);
}

INL void dot_q4_K_nt(int64_t n, const void *w, const void *x, size_t xs,
                     float *y, size_t ys, const int NT) {
  dot_kmin_nt(n, w, x, xs, y, ys, NT, 0);
}
SL__NT_DISPATCH(dot_q4_K)

INL void dot_q5_K_nt(int64_t n, const void *w, const void *x, size_t xs,
                     float *y, size_t ys, const int NT) {
  dot_kmin_nt(n, w, x, xs, y, ys, NT, 1);
}
SL__NT_DISPATCH(dot_q5_K)

INL void dot_q6_K_nt(int64_t n, const void *w, const void *x, size_t xs,
                     float *y, size_t ys, const int NT) {
  const sl__block_q6_K *a = w;
  const int64_t nb = n / SL__QK_K;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  __m256 acc[SL__NT_MAX];
  UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; i++) {
    __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)a[i].scales));
    __m256i sumi[SL__NT_MAX];
    UNROLL for (int t = 0; t < NT; t++) sumi[t] = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
      const uint8_t *ql = a[i].ql + 64 * h, *qh = a[i].qh + 32 * h;
      const int8_t *sc = a[i].scales + 8 * h;
      __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
      __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
      __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                             _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
      q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                             _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                             _mm256_and_si256(hb, m30));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
      for (int k = 0; k < 4; k++) {
        __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]),
                                     _mm_set1_epi16(sc[2 * k]));
        UNROLL for (int t = 0; t < NT; t++) {
          const sl__block_q8_K *xb = &XB(sl__block_q8_K, t, i);
          __m256i xv =
              _mm256_loadu_si256((const __m256i *)(xb->qs + 128 * h + 32 * k));
          sumi[t] = _mm256_add_epi32(
              sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], xv), s));
        }
      }
    }
    float d = _cvtsh_ss(a[i].d);
    UNROLL for (int t = 0; t < NT; t++) {
      const sl__block_q8_K *xb = &XB(sl__block_q8_K, t, i);
      __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
      __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
      acc[t] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[t], off)),
                          _mm256_set1_ps(d * xb->d), acc[t]);
    }
  }
  UNROLL for (int t = 0; t < NT; t++) y[(size_t)t * ys] = hsum_ps(acc[t]);
}
SL__NT_DISPATCH(dot_q6_K)

/* ---- dequantization ------------------------------------------------------ */

static void dq_f16(const void *src, float *dst, int64_t n) {
  const uint16_t *s = src;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(
        dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
  for (; i < n; i++)
    dst[i] = _cvtsh_ss(s[i]);
}

static void dq_bf16(const void *src, float *dst, int64_t n) {
  const uint16_t *s = src;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     widen_bf16(_mm_loadu_si128((const __m128i *)(s + i))));
  for (; i < n; i++)
    dst[i] = sl__bf16_to_f32(s[i]);
}

/* Stores 32 int8 (as one __m256i) times d plus m into dst[32]. */
INL void store_i8x32(float *dst, __m256i q, __m256 d, __m256 m) {
  __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  __m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  __m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
  _mm256_storeu_ps(dst, _mm256_fmadd_ps(f0, d, m));
  _mm256_storeu_ps(dst + 8, _mm256_fmadd_ps(f1, d, m));
  _mm256_storeu_ps(dst + 16, _mm256_fmadd_ps(f2, d, m));
  _mm256_storeu_ps(dst + 24, _mm256_fmadd_ps(f3, d, m));
}

static void dq_q4_0(const void *src, float *dst, int64_t n) {
  const sl__block_q4_0 *b = src;
  for (int64_t i = 0; i < n / SL__QK; i++, dst += SL__QK) {
    __m256i q = _mm256_sub_epi8(unpack_q4(b[i].qs), _mm256_set1_epi8(8));
    store_i8x32(dst, q, _mm256_set1_ps(_cvtsh_ss(b[i].d)), _mm256_setzero_ps());
  }
}

static void dq_q4_1(const void *src, float *dst, int64_t n) {
  const sl__block_q4_1 *b = src;
  for (int64_t i = 0; i < n / SL__QK; i++, dst += SL__QK) {
    __m256i q = unpack_q4(b[i].qs);
    store_i8x32(dst, q, _mm256_set1_ps(_cvtsh_ss(b[i].d)),
                _mm256_set1_ps(_cvtsh_ss(b[i].m)));
  }
}

static void dq_q8_0(const void *src, float *dst, int64_t n) {
  const sl__block_q8_0 *b = src;
  for (int64_t i = 0; i < n / SL__QK; i++, dst += SL__QK)
    store_i8x32(dst, _mm256_loadu_si256((const __m256i *)b[i].qs),
                _mm256_set1_ps(_cvtsh_ss(b[i].d)), _mm256_setzero_ps());
}

/* ---- activation quantization ----------------------------------------------
 */

/* Quantizes 32 floats times id into 32 int8 (round half to even, as ggml's
 * x86 quantizers); returns them and stores their sum in *sum. */
INL __m256i quant32(const float *x, __m256 id, int *sum) {
  __m256i v[4];
  for (int k = 0; k < 4; k++) {
    __m256 f = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), id);
    v[k] = _mm256_cvtps_epi32(
        _mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  __m256i s01 = _mm256_packs_epi32(v[0], v[1]);
  __m256i s23 = _mm256_packs_epi32(v[2], v[3]);
  __m256i p = _mm256_packs_epi16(s01, s23);
  /* undo the in-lane interleave of the packs */
  p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]),
                                 _mm256_add_epi32(v[2], v[3]));
  *sum = hsum_i32(s32);
  return p;
}

INL float amax32(const float *x) {
  const __m256 sgn = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_andnot_ps(sgn, _mm256_loadu_ps(x));
  for (int k = 1; k < 4; k++)
    m = _mm256_max_ps(m, _mm256_andnot_ps(sgn, _mm256_loadu_ps(x + 8 * k)));
  return hmax_ps(m);
}

static void qa_q8_0(const float *x, void *dst, int64_t n) {
  sl__block_q8_0 *b = dst;
  for (int64_t i = 0; i < n / SL__QK; i++, x += SL__QK) {
    float amax = amax32(x);
    float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum;
    b[i].d = sl__f32_to_f16(d);
    _mm256_storeu_si256((__m256i *)b[i].qs,
                        quant32(x, _mm256_set1_ps(id), &sum));
  }
}

static void qa_q8_1(const float *x, void *dst, int64_t n) {
  sl__block_q8_1 *b = dst;
  for (int64_t i = 0; i < n / SL__QK; i++, x += SL__QK) {
    float amax = amax32(x);
    float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum;
    _mm256_storeu_si256((__m256i *)b[i].qs,
                        quant32(x, _mm256_set1_ps(id), &sum));
    b[i].d = sl__f32_to_f16(d);
    b[i].s = sl__f32_to_f16((float)sum * d);
  }
}

/* ---- small ops ------------------------------------------------------------
 */

/* As the scalar one (and ggml): squares in float, summed in double. */
static void rmsnorm(float *out, const float *x, const float *w, int64_t n,
                    float eps) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    v = _mm256_mul_ps(v, v);
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  }
  double l[4];
  _mm256_storeu_pd(l, _mm256_add_pd(a0, a1));
  double ss = (l[0] + l[1]) + (l[2] + l[3]);
  for (; i < n; i++)
    ss += (double)(x[i] * x[i]);
  float mean = (float)(ss / (double)n);
  float scale = 1.0f / sqrtf(mean + eps);
  __m256 s = _mm256_set1_ps(scale);
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), s);
    if (w)
      v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
    _mm256_storeu_ps(out + i, v);
  }
  for (; i < n; i++)
    out[i] = x[i] * scale * (w ? w[i] : 1.0f);
}

static void rope(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot,
                 const float *cs, const float *sn, int neox) {
  const int64_t half = n_rot / 2;
  for (int64_t h = 0; h < n_heads; h++) {
    float *v = x + h * head_dim;
    int64_t i = 0;
    if (neox) {
      for (; i + 8 <= half; i += 8) {
        __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + i + half);
        __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
        _mm256_storeu_ps(v + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
        _mm256_storeu_ps(v + i + half,
                         _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
      }
      for (; i < half; i++) {
        float x0 = v[i], x1 = v[i + half];
        v[i] = fmaf(x0, cs[i], -(x1 * sn[i]));
        v[i + half] = fmaf(x0, sn[i], x1 * cs[i]);
      }
    } else {
      for (; i + 4 <= half; i += 4) {
        __m128 c4 = _mm_loadu_ps(cs + i), s4 = _mm_loadu_ps(sn + i);
        __m256 c =
            _mm256_set_m128(_mm_unpackhi_ps(c4, c4), _mm_unpacklo_ps(c4, c4));
        __m256 s =
            _mm256_set_m128(_mm_unpackhi_ps(s4, s4), _mm_unpacklo_ps(s4, s4));
        __m256 xv = _mm256_loadu_ps(v + 2 * i);
        __m256 sw = _mm256_permute_ps(xv, 0xB1); /* swap pairs */
        /* even: fma(x0, c, -(x1 s)); odd: fma(x0, s, x1 c), as ggml */
        __m256 ev = _mm256_fmsub_ps(xv, c, _mm256_mul_ps(sw, s));
        __m256 od = _mm256_fmadd_ps(sw, s, _mm256_mul_ps(xv, c));
        _mm256_storeu_ps(v + 2 * i, _mm256_blend_ps(ev, od, 0xAA));
      }
      for (; i < half; i++) {
        float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = fmaf(x0, cs[i], -(x1 * sn[i]));
        v[2 * i + 1] = fmaf(x0, sn[i], x1 * cs[i]);
      }
    }
  }
}

static void softmax(float *x, int64_t n) {
  int64_t i = 0;
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (; i + 8 <= n; i += 8)
    mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  float max = hmax_ps(mv);
  for (; i < n; i++)
    max = fmaxf(max, x[i]);
  __m256 m = _mm256_set1_ps(max), acc = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  double sum = hsum_ps(acc);
  for (; i < n; i++) {
    x[i] = expf(x[i] - max);
    sum += x[i];
  }
  float inv = (float)(1.0 / sum);
  __m256 iv = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), iv));
  for (; i < n; i++)
    x[i] *= inv;
}

static void swiglu(float *out, const float *g, const float *u, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), sgn = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 gv = _mm256_loadu_ps(g + i);
    __m256 e = exp256(_mm256_xor_ps(gv, sgn));
    __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; i++)
    out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void add(float *out, const float *a, const float *b, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(
        out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  for (; i < n; i++)
    out[i] = a[i] + b[i];
}

static void f32_to_f16(uint16_t *dst, const float *src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(
        (__m128i *)(dst + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++)
    dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

/* 8 halves at p (fewer at a tail: the rest read as 0) as floats. */
INL __m256 load_h8(const uint16_t *p, int64_t m) {
  if (m >= 8)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
  uint16_t t[8] = {0};
  memcpy(t, p, (size_t)m * 2);
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t));
}

/* ggml_vec_dot_f16 over n32 (a multiple of 32) elements of q16 and an f16
 * row: four chains over 32-element steps, added up as ggml does (see
 * reduce32 in the scalar file) down to four lanes; (l0 + l1) + (l2 + l3) of
 * the result, as two hadds, is the dot. */
INL __m128 dot_f16_4x8(const __m256 *q16, const uint16_t *kp, int64_t n32) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (int64_t i = 0; i < n32; i += 32) {
    s0 = _mm256_fmadd_ps(q16[i / 8], load_h8(kp + i, 8), s0);
    s1 = _mm256_fmadd_ps(q16[i / 8 + 1], load_h8(kp + i + 8, 8), s1);
    s2 = _mm256_fmadd_ps(q16[i / 8 + 2], load_h8(kp + i + 16, 8), s2);
    s3 = _mm256_fmadd_ps(q16[i / 8 + 3], load_h8(kp + i + 24, 8), s3);
  }
  __m256 a = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
  return _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
}

/* See the scalar attn_f16: the same arithmetic and summation orders. */
static void attn_f16(float *out, const float *q, const uint16_t *const *kb,
                     const uint16_t *const *vb, int bs, int64_t hd, int64_t len,
                     int64_t stride, float scale, bool single, float *sc) {
  const int64_t bm = ((int64_t)1 << bs) - 1;
#define KROW(p) (kb[(p) >> bs] + ((p)&bm) * stride)
#define VROW(p) (vb[(p) >> bs] + ((p)&bm) * stride)
  __m256 q16[SL_KERN_ATTN_MAX_HEAD_DIM / 8];
  float qf[SL_KERN_ATTN_MAX_HEAD_DIM];
  const int64_t nq = (hd + 7) / 8;
  for (int64_t c = 0; c < nq; c++) {
    float t[8] = {0};
    memcpy(t, q + 8 * c, (size_t)(hd - 8 * c < 8 ? hd - 8 * c : 8) * 4);
    q16[c] = _mm256_cvtph_ps(
        _mm256_cvtps_ph(_mm256_loadu_ps(t), _MM_FROUND_TO_NEAREST_INT));
    _mm256_storeu_ps(t, q16[c]);
    memcpy(qf + 8 * c, t, (size_t)(hd - 8 * c < 8 ? hd - 8 * c : 8) * 4);
  }
  const bool gemm = !single;
  int64_t p = 0;
  if (gemm && hd % 8 == 0) {
    /* tinyBLAS: one 8-lane chain, four positions at a time */
    for (; p + 4 <= len; p += 4) {
      const uint16_t *k0 = KROW(p), *k1 = KROW(p + 1), *k2 = KROW(p + 2),
                     *k3 = KROW(p + 3);
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t c = 0; c < nq; c++) {
        a0 = _mm256_fmadd_ps(q16[c], load_h8(k0 + 8 * c, 8), a0);
        a1 = _mm256_fmadd_ps(q16[c], load_h8(k1 + 8 * c, 8), a1);
        a2 = _mm256_fmadd_ps(q16[c], load_h8(k2 + 8 * c, 8), a2);
        a3 = _mm256_fmadd_ps(q16[c], load_h8(k3 + 8 * c, 8), a3);
      }
      sc[p] = hsum_ps(a0) * scale;
      sc[p + 1] = hsum_ps(a1) * scale;
      sc[p + 2] = hsum_ps(a2) * scale;
      sc[p + 3] = hsum_ps(a3) * scale;
    }
    for (; p < len; p++) {
      const uint16_t *kp = KROW(p);
      __m256 a = _mm256_setzero_ps();
      for (int64_t c = 0; c < nq; c++)
        a = _mm256_fmadd_ps(q16[c], load_h8(kp + 8 * c, 8), a);
      sc[p] = hsum_ps(a) * scale;
    }
  } else {
    /* ggml_vec_dot_f16: four chains over 32-element steps, tail in double */
    const int64_t n32 = hd - hd % 32;
    if (n32 == hd) {
      /* no tail: four positions' last two pairings in three hadds */
      const __m128 sv = _mm_set1_ps(scale);
      for (; p + 4 <= len; p += 4) {
        __m128 t[4];
        UNROLL for (int j = 0; j < 4; j++) t[j] =
            dot_f16_4x8(q16, KROW(p + j), n32);
        __m128 h =
            _mm_hadd_ps(_mm_hadd_ps(t[0], t[1]), _mm_hadd_ps(t[2], t[3]));
        _mm_storeu_ps(sc + p, _mm_mul_ps(h, sv));
      }
    }
    for (; p < len; p++) {
      const uint16_t *kp = KROW(p);
      __m128 t = dot_f16_4x8(q16, kp, n32);
      t = _mm_hadd_ps(t, t);
      double d = _mm_cvtss_f32(_mm_hadd_ps(t, t));
      for (int64_t i = n32; i < hd; i++)
        d += qf[i] * _cvtsh_ss(kp[i]);
      sc[p] = (float)d * scale;
    }
  }
  /* the maximum is exact in any order */
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (p = 0; p + 8 <= len; p += 8)
    mv = _mm256_max_ps(mv, _mm256_loadu_ps(sc + p));
  float mx = hmax_ps(mv);
  for (; p < len; p++)
    mx = fmaxf(mx, sc[p]);
  /* exp and the sum in double, 8 at a time; zeros past len up to a multiple
   * of 32 (as ggml's masked, padded rows) */
  const int64_t lpad = (len + 31) & ~(int64_t)31;
  const __m256 m = _mm256_set1_ps(mx);
  double sum = 0;
  for (p = 0; p < lpad; p += 8) {
    __m256 e = _mm256_setzero_ps();
    if (p < len) {
      e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + p), m));
      if (p + 8 > len) {
        /* lane j keeps its value when j < len - p */
        __m256i idx =
            _mm256_sub_epi32(_mm256_set1_epi32((int)(len - p)),
                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                                 idx, _mm256_setzero_si256())));
      }
    }
    _mm256_storeu_ps(sc + p, e);
    sum += hsum_ps(e);
  }
  const __m256 inv = _mm256_set1_ps((float)(1.0 / sum));
  for (p = 0; p < lpad; p += 8)
    _mm256_storeu_ps(sc + p, _mm256_cvtph_ps(_mm256_cvtps_ph(
                                 _mm256_mul_ps(_mm256_loadu_ps(sc + p), inv),
                                 _MM_FROUND_TO_NEAREST_INT)));
  /* out[i] = sum_p a_p v_p[i], 8 outputs at a time, each summed as ggml sums
   * a row of its transposed V: position p in lane p % 8 (gemm) or register
   * (p % 32) / 8, lane p % 8 (gemv), then its reduction. */
  for (int64_t i = 0; i < hd; i += 8) {
    const int64_t w = hd - i < 8 ? hd - i : 8;
    __m256 r;
    if (gemm) {
      __m256 l[8];
      for (int j = 0; j < 8; j++)
        l[j] = _mm256_setzero_ps();
      p = 0;
      if (bs >= 3) /* eight aligned positions share a block: one row base */
        for (; p + 8 <= len; p += 8) {
          const uint16_t *v0 = VROW(p) + i;
          _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) l[j] =
              _mm256_fmadd_ps(_mm256_broadcast_ss(sc + p + j),
                              load_h8(v0 + j * stride, w), l[j]);
        }
      for (; p < len; p++)
        l[p & 7] = _mm256_fmadd_ps(_mm256_broadcast_ss(sc + p),
                                   load_h8(VROW(p) + i, w), l[p & 7]);
      r = _mm256_add_ps(
          _mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])),
          _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])));
    } else {
      /* accumulator j gets positions p = j (mod 32); a group of eight of
       * them at a time stays in registers over the whole row */
      __m256 l[32];
      for (int g = 0; g < 32; g += 8) {
        __m256 a8[8];
        for (int j = 0; j < 8; j++)
          a8[j] = _mm256_setzero_ps();
        for (int64_t p0 = g; p0 < len; p0 += 32) {
          if (bs >= 3 && p0 + 8 <= len) {
            const uint16_t *v0 = VROW(p0) + i;
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) a8[j] =
                _mm256_fmadd_ps(_mm256_broadcast_ss(sc + p0 + j),
                                load_h8(v0 + j * stride, w), a8[j]);
          } else {
            for (int j = 0; j < 8 && p0 + j < len; j++)
              a8[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(sc + p0 + j),
                                      load_h8(VROW(p0 + j) + i, w), a8[j]);
          }
        }
        for (int j = 0; j < 8; j++)
          l[g + j] = a8[j];
      }
      __m256 a[8];
      for (int j = 0; j < 8; j++)
        a[j] = _mm256_add_ps(_mm256_add_ps(l[j], l[16 + j]),
                             _mm256_add_ps(l[8 + j], l[24 + j]));
      r = _mm256_add_ps(
          _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[1], a[5])),
          _mm256_add_ps(_mm256_add_ps(a[2], a[6]), _mm256_add_ps(a[3], a[7])));
    }
    float t[8];
    _mm256_storeu_ps(t, r);
    memcpy(out + i, t, (size_t)w * 4);
  }
#undef KROW
#undef VROW
}

#pragma GCC pop_options

const sl__kern_cpu_ops sl__kern_cpu_avx2_ops = {
    .dequant =
        {
            [SL_GGML_F16] = dq_f16,
            [SL_GGML_BF16] = dq_bf16,
            [SL_GGML_Q4_0] = dq_q4_0,
            [SL_GGML_Q4_1] = dq_q4_1,
            [SL_GGML_Q8_0] = dq_q8_0,
        },
    .quant =
        {
            [SL_GGML_Q8_0] = qa_q8_0,
            [SL_GGML_Q8_1] = qa_q8_1,
        },
    .dot =
        {
            [SL_GGML_F32] = dot_f32,
            [SL_GGML_F16] = dot_f16,
            [SL_GGML_BF16] = dot_bf16,
            [SL_GGML_Q4_0] = dot_q4_0,
            [SL_GGML_Q4_1] = dot_q4_1,
            [SL_GGML_Q8_0] = dot_q8_0,
            [SL_GGML_Q4_K] = dot_q4_K,
            [SL_GGML_Q5_K] = dot_q5_K,
            [SL_GGML_Q6_K] = dot_q6_K,
            [SL_GGML_Q2_K] = sl__dot_q2_K_avx2,
            [SL_GGML_Q3_K] = sl__dot_q3_K_avx2,
            [SL_GGML_IQ4_XS] = sl__dot_iq4_xs_avx2,
        },
    .rmsnorm = rmsnorm,
    .rope = rope,
    .softmax = softmax,
    .swiglu = swiglu,
    .add = add,
    .f32_to_f16 = f32_to_f16,
    .attn_f16 = attn_f16,
};

#else /* not x86-64: nothing here; the scalar table serves */

const sl__kern_cpu_ops sl__kern_cpu_avx2_ops = {0};

#endif
