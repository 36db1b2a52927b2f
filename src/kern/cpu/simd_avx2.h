/* sluice — kern/cpu private: AVX2 helpers. Include only inside a region
 * compiled with target("avx2,fma,f16c") (or wider), after <immintrin.h>. */
#ifndef SLUICE_KERN_CPU_SIMD_AVX2_H
#define SLUICE_KERN_CPU_SIMD_AVX2_H

static inline __attribute__((always_inline)) float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) float hmax_ps(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) int hsum_i32(__m256i v) {
  __m128i s =
      _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

/* 8 int32 sums of 4 products each: unsigned a[32] times signed b[32]. The
 * int16 pair sums must not saturate (|a| * |b| * 2 <= 32767). */
static inline __attribute__((always_inline)) __m256i dot_us8(__m256i a,
                                                             __m256i b) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}

/* The 32 4-bit quants of a Q4_0 / Q4_1 block as bytes 0..15: low nibbles
 * (elements 0..15) in the low half, high nibbles (16..31) in the high. */
static inline __attribute__((always_inline)) __m256i
unpack_q4(const uint8_t *qs) {
  __m128i raw = _mm_loadu_si128((const __m128i *)qs);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw),
                          _mm256_set1_epi8(0x0F));
}

/* The 32 5-bit quants of a Q5_0 / Q5_1 block as bytes 0..31, in
 * unpack_q4's order: bit j of the little-endian qh is element j's fifth
 * bit. */
static inline __attribute__((always_inline)) __m256i
unpack_q5(const uint8_t *qs, const uint8_t *qh) {
  uint32_t h;
  memcpy(&h, qh, 4);
  /* byte k of the result gets byte k / 8 of h, then its bit k % 8 */
  __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h),
                                  _mm256_setr_epi64x(0, 0x0101010101010101LL,
                                                     0x0202020202020202LL,
                                                     0x0303030303030303LL));
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
  __m256i hi = _mm256_and_si256(
      _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit), _mm256_set1_epi8(16));
  return _mm256_or_si256(unpack_q4(qs), hi);
}

/* The 32 quants of an IQ4_NL block as its int8 levels, in unpack_q4's
 * order. */
static inline __attribute__((always_inline)) __m256i
unpack_iq4nl(const uint8_t *qs) {
  const __m256i lut = _mm256_broadcastsi128_si256(
      _mm_loadu_si128((const __m128i *)sl__kvalues_iq4nl));
  return _mm256_shuffle_epi8(lut, unpack_q4(qs));
}

/* 8 bf16 to 8 f32. */
static inline __attribute__((always_inline)) __m256 widen_bf16(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* exp(x) in f32, relative error about 2 ulp; inputs are clamped to
 * [-87.3, 88.37], so results stay finite and normal. */
static inline __attribute__((always_inline)) __m256 exp256(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365447504019f));
  __m256 fx =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* A dot over 32-element blocks for 1..SL__NT_MAX tokens (name##_nt, and
 * name through SL__NT_DISPATCH): blk((const wtype *)w, x, xs, i, acc, sm, NT)
 * adds block i of every token into its 8-lane acc and its scalar sm. One
 * accumulator chain over the blocks, added up as ggml's AVX2
 * ggml_vec_dot_q4_1_q8_1 / q8_0_q8_0 do (the block sums' order matters to
 * the last bit, and that bit decides roundings in the next activation
 * quantization, so matching it keeps sluice close to llama.cpp). Needs INL
 * and UNROLL. */
#define SL__DOT_BLK32(name, blk, wtype)                                        \
  INL void name##_nt(int64_t n, const void *w, const void *x, size_t xs,       \
                     float *y, size_t ys, const int NT) {                      \
    const wtype *a = w;                                                        \
    const int64_t nb = n / SL__QK;                                             \
    __m256 acc[SL__NT_MAX];                                                    \
    float sm[SL__NT_MAX];                                                      \
    UNROLL for (int t = 0; t < NT; t++) {                                      \
      acc[t] = _mm256_setzero_ps();                                            \
      sm[t] = 0;                                                               \
    }                                                                          \
    for (int64_t i = 0; i < nb; i++)                                           \
      blk(a, x, xs, i, acc, sm, NT);                                           \
    UNROLL for (int t = 0; t < NT; t++) y[(size_t)t * ys] =                    \
        hsum_ps(acc[t]) + sm[t];                                               \
  }                                                                            \
  SL__NT_DISPATCH(name)

#endif
