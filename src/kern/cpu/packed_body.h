/* sluice — kern/cpu private: products over repacked weights (groups of 8
 * interleaved rows, kern_cpu_impl.h) for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
 * IQ4_NL against Q8_0 activations, and Q4_K and Q6_K against Q8_K (below,
 * "K-quants"): decode (one token) and prefill (tiles of up to four tokens) are
 * the same code. One source for three encodings: kern_cpu_packed_avx2.c
 * (vpmaddubsw pairs), kern_cpu_packed_avxvnni.c (VEX vpdpbusd) and
 * kern_cpu_packed_avx512vnni.c (EVEX vpdpbusd on 256 bits) include it once
 * each, inside their target region, after <immintrin.h>, with
 *   SL__PK_VNNI           1 where SL__DPBUSD(acc, u, s) is the encoding's
 *                         256-bit vpdpbusd, 0 for AVX2;
 *   SL__PK_TABLE          the name of the table of entries to define.
 *
 * Per block position, each step s loads the elements 4s..4s+3 of all 8 rows
 * as one 256-bit vector and multiplies it with the token's four quants at
 * 4s broadcast to every row's lane: lane r collects row r's products. A
 * block's products are summed as integers (exact, so their order, and
 * whether vpmaddubsw pairs or vpdpbusd add them, cannot matter; the
 * unsigned Q4_0 / Q5_0 quants take the offset as -8 or -16 times the token
 * block's quant sum), then each row's block sum goes, in lane r, into one
 * float chain:
 *   acc = fma(float(isum), d_w * d_x, acc)   for blocks i = 0, 1, ...
 * So the result of (row, token) is that chain whatever the number of tokens
 * in the call, the tile the token lands in, the chunk of rows its thread
 * took, or the encoding: the three give the same bits. No horizontal sum is
 * needed: the 8 lanes are the 8 rows' outputs.
 */

#define INL    static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")

/* The integer accumulators. AVX2: int16 lanes (each caller bounds its
 * sums below 2^15) that PK_I32 widens; VNNI: int32 lanes from the start.
 *   PK_ADD(a, u, s)   a + the products of u (unsigned bytes) and s (signed)
 *   PK_ADD32(a, u, s) the same into int32 lanes a, widened at once
 *   PK_I32(a)         a as int32 lanes (pairs summed for AVX2)
 *   PK_SCALE(a, sc)   a times the int32 scales sc (|sc| < 2^8), as int32 */
#if SL__PK_VNNI
#define PK_ADD(a, u, s)   SL__DPBUSD(a, u, s)
#define PK_ADD32(a, u, s) SL__DPBUSD(a, u, s)
#define PK_I32(a)         (a)
#define PK_SCALE(a, sc)   _mm256_mullo_epi32(a, sc)
#else
#define PK_ADD(a, u, s) _mm256_add_epi16(a, _mm256_maddubs_epi16(u, s))
#define PK_ADD32(a, u, s)                                                      \
  _mm256_add_epi32(                                                            \
      a, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
#define PK_I32(a)       _mm256_madd_epi16(a, _mm256_set1_epi16(1))
#define PK_SCALE(a, sc) _mm256_madd_epi16(a, scale_pairs(sc))
#endif

/* The token's 4 quants at q broadcast to the 8 lanes. */
INL __m256i bc4(const int8_t *q) {
  int32_t v;
  memcpy(&v, q, 4);
  return _mm256_set1_epi32(v);
}

/* a + step j of a 32-element block whose unsigned quants sit as low nibbles
 * (elements 4j..4j+3, in lo) and high nibbles (16 + 4j.., in hi): their
 * products with the token's quants q. */
INL __m256i nib_step(__m256i a, __m256i lo, __m256i hi, const int8_t *q,
                     int j) {
  return PK_ADD(PK_ADD(a, lo, bc4(q + 4 * j)), hi, bc4(q + 16 + 4 * j));
}

/* The quants of token t's block i (x: the tile's first token). */
#define XQS(t, i)                                                              \
  (((const sl__block_q8_0 *)((const char *)x + (size_t)(t)*xs))[i].qs)

/* Q4_0 (off 8) and Q4_1 (off 0): nibbles 0..15 (the group's qs) against
 * the token, then - off * sum(x) per block; the eight int16 products of a
 * lane stay below 8 * 2 * 15 * 127 < 2^15. */
INL void isum_nib(const uint8_t (*qs)[8][4], const void *x, size_t xs,
                  int64_t i, const int32_t *xsum, int64_t ld, __m256i *is,
                  const int NT, const int off) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256i a16[SL__NT_MAX];
  UNROLL for (int t = 0; t < NT; t++) a16[t] = _mm256_setzero_si256();
  for (int j = 0; j < 4; j++) {
    __m256i raw = _mm256_loadu_si256((const __m256i *)qs[j]);
    __m256i lo = _mm256_and_si256(raw, m4);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    UNROLL for (int t = 0; t < NT; t++) {
      const int8_t *q = XQS(t, i);
      a16[t] = nib_step(a16[t], lo, hi, q, j);
    }
  }
  UNROLL for (int t = 0; t < NT; t++) is[t] = _mm256_sub_epi32(
      PK_I32(a16[t]), _mm256_set1_epi32(off ? off * xsum[i * ld + t] : 0));
}

INL void isum_q4_0(const sl__pack_q4_0 *b, const void *x, size_t xs, int64_t i,
                   const int32_t *xsum, int64_t ld, __m256i *is, const int NT) {
  isum_nib(b->qs, x, xs, i, xsum, ld, is, NT, 8);
}

INL void isum_q4_1(const sl__pack_q4_1 *b, const void *x, size_t xs, int64_t i,
                   const int32_t *xsum, int64_t ld, __m256i *is, const int NT) {
  isum_nib(b->qs, x, xs, i, xsum, ld, is, NT, 0);
}

/* Q5_0 (off 16) and Q5_1 (off 0): 5-bit quants 0..31 (the group's qh and
 * qs), offset -off; int16 sums over two steps pairs (4 products of <= 2 *
 * 31 * 127 each) before widening. */
INL void isum_q5(const uint8_t (*qhp)[4], const uint8_t (*qs)[8][4],
                 const void *x, size_t xs, int64_t i, const int32_t *xsum,
                 int64_t ld, __m256i *is, const int NT, const int off) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
  const __m256i qh = _mm256_loadu_si256((const __m256i *)qhp);
  /* bit 2j of a qh byte to bit 4 (lo), bit 2j + 1 to bit 4 (hi): per-byte
   * shifts of at most 4 through 16-bit lanes, masked to bit 4 */
  const __m256i hb[8] = {
      _mm256_and_si256(_mm256_slli_epi16(qh, 4), b4),
      _mm256_and_si256(_mm256_slli_epi16(qh, 3), b4),
      _mm256_and_si256(_mm256_slli_epi16(qh, 2), b4),
      _mm256_and_si256(_mm256_slli_epi16(qh, 1), b4),
      _mm256_and_si256(qh, b4),
      _mm256_and_si256(_mm256_srli_epi16(qh, 1), b4),
      _mm256_and_si256(_mm256_srli_epi16(qh, 2), b4),
      _mm256_and_si256(_mm256_srli_epi16(qh, 3), b4),
  };
  __m256i a32[SL__NT_MAX];
  UNROLL for (int t = 0; t < NT; t++) a32[t] =
      _mm256_set1_epi32(off ? -off * xsum[i * ld + t] : 0);
  for (int h = 0; h < 2; h++) {
    __m256i a16[SL__NT_MAX];
    UNROLL for (int t = 0; t < NT; t++) a16[t] = _mm256_setzero_si256();
    for (int j = 2 * h; j < 2 * h + 2; j++) {
      __m256i raw = _mm256_loadu_si256((const __m256i *)qs[j]);
      __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, m4), hb[2 * j]);
      __m256i hi = _mm256_or_si256(
          _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), hb[2 * j + 1]);
      UNROLL for (int t = 0; t < NT; t++) {
        const int8_t *q = XQS(t, i);
        a16[t] = nib_step(a16[t], lo, hi, q, j);
      }
    }
    UNROLL for (int t = 0; t < NT; t++) a32[t] =
        _mm256_add_epi32(a32[t], PK_I32(a16[t]));
  }
  UNROLL for (int t = 0; t < NT; t++) is[t] = a32[t];
}

INL void isum_q5_0(const sl__pack_q5_0 *b, const void *x, size_t xs, int64_t i,
                   const int32_t *xsum, int64_t ld, __m256i *is, const int NT) {
  isum_q5(b->qh, b->qs, x, xs, i, xsum, ld, is, NT, 16);
}

INL void isum_q5_1(const sl__pack_q5_1 *b, const void *x, size_t xs, int64_t i,
                   const int32_t *xsum, int64_t ld, __m256i *is, const int NT) {
  isum_q5(b->qh, b->qs, x, xs, i, xsum, ld, is, NT, 0);
}

/* is + signed quants w (|w| <= 128 as int8, aw = |w|) of one step against
 * the token's four quants at q: the sign trick of the one-row dots, widened
 * at once (one maddubs pair can reach 2 * 128 * 127). */
INL __m256i step_signed(__m256i is, __m256i w, __m256i aw, const int8_t *q) {
  return PK_ADD32(is, aw, _mm256_sign_epi8(bc4(q), w));
}

#if SL__PK_VNNI
/* VNNI: the signed weights as unsigned codes u = w + 128 (w ^ 0x80), whose
 * products vpdpbusd sums whole into int32, then - 128 * sum(x) per block:
 * the same integers as the sign trick, with no sign per token. */
INL void isum_q8_0(const sl__pack_q8_0 *b, const void *x, size_t xs, int64_t i,
                   const int32_t *xsum, int64_t ld, __m256i *is, const int NT) {
  const __m256i sb = _mm256_set1_epi8((char)0x80);
  UNROLL for (int t = 0; t < NT; t++) is[t] =
      _mm256_set1_epi32(-128 * xsum[i * ld + t]);
  for (int s = 0; s < 8; s++) {
    __m256i u =
        _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)b->qs[s]), sb);
    UNROLL for (int t = 0; t < NT; t++) is[t] =
        SL__DPBUSD(is[t], u, bc4(XQS(t, i) + 4 * s));
  }
}

INL void isum_iq4_nl(const sl__pack_q4_0 *b, const void *x, size_t xs,
                     int64_t i, const int32_t *xsum, int64_t ld, __m256i *is,
                     const int NT) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  /* the table's values + 128 as unsigned bytes */
  const __m256i lut =
      _mm256_xor_si256(_mm256_broadcastsi128_si256(
                           _mm_loadu_si128((const __m128i *)sl__kvalues_iq4nl)),
                       _mm256_set1_epi8((char)0x80));
  UNROLL for (int t = 0; t < NT; t++) is[t] =
      _mm256_set1_epi32(-128 * xsum[i * ld + t]);
  for (int j = 0; j < 4; j++) {
    __m256i raw = _mm256_loadu_si256((const __m256i *)b->qs[j]);
    __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(raw, m4));
    __m256i hi = _mm256_shuffle_epi8(
        lut, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
    UNROLL for (int t = 0; t < NT; t++) {
      const int8_t *q = XQS(t, i);
      is[t] = SL__DPBUSD(SL__DPBUSD(is[t], lo, bc4(q + 4 * j)), hi,
                         bc4(q + 16 + 4 * j));
    }
  }
}
#else
INL void isum_q8_0(const sl__pack_q8_0 *b, const void *x, size_t xs, int64_t i,
                   const int32_t *xsum, int64_t ld, __m256i *is, const int NT) {
  (void)xsum;
  (void)ld;
  UNROLL for (int t = 0; t < NT; t++) is[t] = _mm256_setzero_si256();
  for (int s = 0; s < 8; s++) {
    __m256i w = _mm256_loadu_si256((const __m256i *)b->qs[s]);
    __m256i aw = _mm256_sign_epi8(w, w);
    UNROLL for (int t = 0; t < NT; t++) is[t] =
        step_signed(is[t], w, aw, XQS(t, i) + 4 * s);
  }
}

INL void isum_iq4_nl(const sl__pack_q4_0 *b, const void *x, size_t xs,
                     int64_t i, const int32_t *xsum, int64_t ld, __m256i *is,
                     const int NT) {
  (void)xsum;
  (void)ld;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i lut = _mm256_broadcastsi128_si256(
      _mm_loadu_si128((const __m128i *)sl__kvalues_iq4nl));
  UNROLL for (int t = 0; t < NT; t++) is[t] = _mm256_setzero_si256();
  for (int j = 0; j < 4; j++) {
    __m256i raw = _mm256_loadu_si256((const __m256i *)b->qs[j]);
    __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(raw, m4));
    __m256i hi = _mm256_shuffle_epi8(
        lut, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
    __m256i alo = _mm256_sign_epi8(lo, lo), ahi = _mm256_sign_epi8(hi, hi);
    UNROLL for (int t = 0; t < NT; t++) {
      const int8_t *q = XQS(t, i);
      is[t] = step_signed(step_signed(is[t], lo, alo, q + 4 * j), hi, ahi,
                          q + 16 + 4 * j);
    }
  }
}

#endif

/* One block position of the 32-element types: the integer sums, then each
 * lane's fma with d_w * d_x (see the file comment). */
#define SL__STEP32(name, ptype, isum)                                          \
  INL void name(const ptype *b, const void *x, size_t xs, int64_t i,           \
                const float *xd, const int32_t *xsum, int64_t ld, __m256 *acc, \
                __m256 *accm, const int NT) {                                  \
    (void)accm;                                                                \
    __m256i is[SL__NT_MAX];                                                    \
    isum(b, x, xs, i, xsum, ld, is, NT);                                       \
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b->d));       \
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_fmadd_ps(              \
        _mm256_cvtepi32_ps(is[t]),                                             \
        _mm256_mul_ps(dw, _mm256_broadcast_ss(xd + i * ld + t)), acc[t]);      \
  }

/* Q4_1 and Q5_1 (w = d q + m): as above, and the minimums' term m_w * (d_x
 * sum(x)) chains, block after block, into a second sum accm that the group
 * driver adds last. */
#define SL__STEP32M(name, ptype, isum)                                         \
  INL void name(const ptype *b, const void *x, size_t xs, int64_t i,           \
                const float *xd, const int32_t *xsum, int64_t ld, __m256 *acc, \
                __m256 *accm, const int NT) {                                  \
    __m256i is[SL__NT_MAX];                                                    \
    isum(b, x, xs, i, xsum, ld, is, NT);                                       \
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b->d));       \
    __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b->m));       \
    UNROLL for (int t = 0; t < NT; t++) {                                      \
      __m256 dx = _mm256_broadcast_ss(xd + i * ld + t);                        \
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]),                      \
                               _mm256_mul_ps(dw, dx), acc[t]);                 \
      accm[t] = _mm256_fmadd_ps(                                               \
          mw, _mm256_mul_ps(dx, _mm256_set1_ps((float)xsum[i * ld + t])),      \
          accm[t]);                                                            \
    }                                                                          \
  }

SL__STEP32(step_q4_0, sl__pack_q4_0, isum_q4_0)
SL__STEP32(step_q5_0, sl__pack_q5_0, isum_q5_0)
SL__STEP32(step_q8_0, sl__pack_q8_0, isum_q8_0)
SL__STEP32(step_iq4_nl, sl__pack_q4_0, isum_iq4_nl)
SL__STEP32M(step_q4_1, sl__pack_q4_1, isum_q4_1)
SL__STEP32M(step_q5_1, sl__pack_q5_1, isum_q5_1)

/* ---- K-quants against Q8_K ----------------------------------------------
 * Per super-block, each 32-element (Q4_K) or 16-element (Q6_K) sub-block's
 * products are summed as int16 (exact: at most 8 * 2 * 15 * 127 and
 * 4 * 2 * 32 * 127), then times the rows' sub-block scales (madd with the
 * scale twice per lane) into one int32 per row and token (exact). The
 * lane's float chain then takes, per super-block, one fma (Q6_K) or two
 * (Q4_K: + sum_j sc_j * dot_j times d_w * d_x, then - sum_j m_j * bsum_j
 * times dmin_w * d_x). */

/* Token t's Q8_K block i. */
#define XK(t, i)                                                               \
  (((const sl__block_q8_K *)((const char *)x + (size_t)(t)*xs))[i])

/* The 8 rows' scales (int32 lanes, signed or not, |s| < 2^8) as int16
 * pairs (s, s) per lane, for PK_SCALE's madd. */
INL __m256i scale_pairs(__m256i s32) {
  return _mm256_or_si256(_mm256_and_si256(s32, _mm256_set1_epi32(0xFFFF)),
                         _mm256_slli_epi32(s32, 16));
}

INL void step_q4_K(const sl__pack_q4_K *b, const void *x, size_t xs, int64_t i,
                   const float *xd, const int32_t *xsum, int64_t ld,
                   __m256 *acc, __m256 *accm, const int NT) {
  (void)xd;
  (void)xsum;
  (void)ld;
  (void)accm;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256i is[SL__NT_MAX];
  UNROLL for (int t = 0; t < NT; t++) is[t] = _mm256_setzero_si256();
  /* sub-blocks 2c (low nibbles) and 2c + 1 (high) from one load of each
   * 32-byte run (the sums are exact integers: their order cannot matter) */
  for (int c = 0; c < 4; c++) {
    __m256i a16[SL__NT_MAX], b16[SL__NT_MAX];
    UNROLL for (int t = 0; t < NT; t++) a16[t] = b16[t] =
        _mm256_setzero_si256();
    for (int s = 0; s < 8; s++) {
      __m256i raw = _mm256_loadu_si256((const __m256i *)b->qs[c][s]);
      __m256i lo = _mm256_and_si256(raw, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      UNROLL for (int t = 0; t < NT; t++) {
        a16[t] = PK_ADD(a16[t], lo, bc4(XK(t, i).qs + 64 * c + 4 * s));
        b16[t] = PK_ADD(b16[t], hi, bc4(XK(t, i).qs + 64 * c + 32 + 4 * s));
      }
    }
    __m256i sl = _mm256_cvtepu8_epi32(
                _mm_loadl_epi64((const __m128i *)b->sc[2 * c])),
            sh = _mm256_cvtepu8_epi32(
                _mm_loadl_epi64((const __m128i *)b->sc[2 * c + 1]));
    UNROLL for (int t = 0; t < NT; t++) is[t] = _mm256_add_epi32(
        is[t], _mm256_add_epi32(PK_SCALE(a16[t], sl), PK_SCALE(b16[t], sh)));
  }
  __m256i mv[4];
  for (int k = 0; k < 4; k++)
    mv[k] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b->m[k]));
  const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b->d));
  const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b->dmin));
  UNROLL for (int t = 0; t < NT; t++) {
    /* the token's sub-block sums s_j as int16 pairs (s_2k, s_2k+1): int32
     * elements 0, 1, 4, 5 of pk */
    __m256i s32 =
        _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)XK(t, i).bsums),
                          _mm256_set1_epi16(1));
    __m256i pk = _mm256_packs_epi32(s32, s32);
    __m256i ms = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++)
      ms = _mm256_add_epi32(
          ms, _mm256_madd_epi16(mv[k],
                                _mm256_permutevar8x32_epi32(
                                    pk, _mm256_set1_epi32(k < 2 ? k : k + 2))));
    __m256 dx = _mm256_broadcast_ss(&XK(t, i).d);
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_mul_ps(dw, dx),
                             acc[t]);
    acc[t] =
        _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(dm, dx), acc[t]);
  }
}

INL void step_q6_K(const sl__pack_q6_K *b, const void *x, size_t xs, int64_t i,
                   const float *xd, const int32_t *xsum, int64_t ld,
                   __m256 *acc, __m256 *accm, const int NT) {
  (void)xd;
  (void)xsum;
  (void)ld;
  (void)accm;
  __m256i is[SL__NT_MAX];
  UNROLL for (int t = 0; t < NT; t++) is[t] = _mm256_setzero_si256();
  for (int g = 0; g < 16; g++) {
    __m256i sc =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)b->sc[g]));
    __m256i a16[SL__NT_MAX];
    UNROLL for (int t = 0; t < NT; t++) a16[t] = _mm256_setzero_si256();
    for (int s = 4 * g; s < 4 * g + 4; s++) {
      __m256i w = _mm256_loadu_si256((const __m256i *)b->qs[s]);
      __m256i aw = _mm256_abs_epi8(w);
      UNROLL for (int t = 0; t < NT; t++) a16[t] =
          PK_ADD(a16[t], aw, _mm256_sign_epi8(bc4(XK(t, i).qs + 4 * s), w));
    }
    UNROLL for (int t = 0; t < NT; t++) is[t] =
        _mm256_add_epi32(is[t], PK_SCALE(a16[t], sc));
  }
  const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b->d));
  UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_fmadd_ps(
      _mm256_cvtepi32_ps(is[t]),
      _mm256_mul_ps(dw, _mm256_broadcast_ss(&XK(t, i).d)), acc[t]);
}

/* The group driver: per block, step updates each lane's float chain (see
 * the file comment). */
#define SL__PACKED(name, ptype, step, has_m)                                   \
  INL void name##_nt(int64_t nb, const void *wg, const void *x, size_t xs,     \
                     const float *xd, const int32_t *xsum, int64_t ld,         \
                     float *y, size_t ys, int nr, const int NT) {              \
    const ptype *b = wg;                                                       \
    __m256 acc[SL__NT_MAX], accm[SL__NT_MAX];                                  \
    UNROLL for (int t = 0; t < NT; t++) acc[t] = accm[t] =                     \
        _mm256_setzero_ps();                                                   \
    for (int64_t i = 0; i < nb; i++)                                           \
      step(&b[i], x, xs, i, xd, xsum, ld, acc, accm, NT);                      \
    UNROLL for (int t = 0; t < NT; t++) {                                      \
      if (has_m)                                                               \
        acc[t] = _mm256_add_ps(acc[t], accm[t]);                               \
      if (nr == SL__PACK_ROWS) {                                               \
        _mm256_storeu_ps(y + (size_t)t * ys, acc[t]);                          \
      } else {                                                                 \
        float tmp[SL__PACK_ROWS];                                              \
        _mm256_storeu_ps(tmp, acc[t]);                                         \
        memcpy(y + (size_t)t * ys, tmp, (size_t)nr * sizeof(float));           \
      }                                                                        \
    }                                                                          \
  }                                                                            \
  static void name(int64_t nb, const void *wg, const void *x, size_t xs,       \
                   const float *xd, const int32_t *xsum, int64_t ld, float *y, \
                   size_t ys, int nr, int nt) {                                \
    switch (nt) {                                                              \
    case 1:                                                                    \
      name##_nt(nb, wg, x, xs, xd, xsum, ld, y, ys, nr, 1);                    \
      break;                                                                   \
    case 2:                                                                    \
      name##_nt(nb, wg, x, xs, xd, xsum, ld, y, ys, nr, 2);                    \
      break;                                                                   \
    case 3:                                                                    \
      name##_nt(nb, wg, x, xs, xd, xsum, ld, y, ys, nr, 3);                    \
      break;                                                                   \
    default:                                                                   \
      name##_nt(nb, wg, x, xs, xd, xsum, ld, y, ys, nr, 4);                    \
      break;                                                                   \
    }                                                                          \
  }

SL__PACKED(packed_q4_0, sl__pack_q4_0, step_q4_0, 0)
SL__PACKED(packed_q5_0, sl__pack_q5_0, step_q5_0, 0)
SL__PACKED(packed_q8_0, sl__pack_q8_0, step_q8_0, 0)
SL__PACKED(packed_iq4_nl, sl__pack_q4_0, step_iq4_nl, 0)
SL__PACKED(packed_q4_1, sl__pack_q4_1, step_q4_1, 1)
SL__PACKED(packed_q5_1, sl__pack_q5_1, step_q5_1, 1)
SL__PACKED(packed_q4_K, sl__pack_q4_K, step_q4_K, 0)
SL__PACKED(packed_q6_K, sl__pack_q6_K, step_q6_K, 0)

const sl__packed_fn SL__PK_TABLE[SL__NTYPES] = {
    [SL_GGML_Q4_0] = packed_q4_0, [SL_GGML_Q5_0] = packed_q5_0,
    [SL_GGML_Q8_0] = packed_q8_0, [SL_GGML_IQ4_NL] = packed_iq4_nl,
    [SL_GGML_Q4_1] = packed_q4_1, [SL_GGML_Q5_1] = packed_q5_1,
    [SL_GGML_Q4_K] = packed_q4_K, [SL_GGML_Q6_K] = packed_q6_K,
};
