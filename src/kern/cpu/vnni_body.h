/* sluice — kern/cpu private: the 256-bit vpdpbusd dots and gemm tiles of the
 * 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q8_0 weights), one
 * source for two encodings. kern_cpu_avxvnni.c (VEX, AVX-VNNI) and
 * kern_cpu_avx512vnni.c (EVEX, AVX512_VNNI + VL) include it once each, inside
 * their target region, after <immintrin.h> and simd_avx2.h, with
 *   INL, UNROLL           as in the other ISA files;
 *   SL__DPBUSD(acc, u, s) the encoding's 256-bit vpdpbusd: acc + the 8 sums
 *                         of 4 products u (unsigned bytes) * s (signed);
 *   SL__VNT               tokens per gemm tile (8 with EVEX's 32 registers,
 *                         4 with VEX's 16);
 *   SL__VNNI_OPS          the name of the overlay table to define.
 *
 * The order of the sums (which differs from the AVX2 kernels' in the float
 * rounding only; Q8_0 keeps the AVX2 order, see below): for each row and
 * token, a block's products are summed
 * exactly, as an int32, and the blocks chain through one float fma each,
 * acc = fma((float)isum, d_w * d_x, acc), from block 0 up, acc from +0; Q4_1
 * and Q5_1 chain their m * s terms the same way into a second sum, added
 * last. The dots and the gemm tiles both follow it, so batching changes no
 * bit of any result.
 *
 * Gemm tiles (all but Q8_0, below): eight rows by up to SL__VNT tokens, the
 * rows in the lanes. The eight rows' block is turned into columns, vector m
 * holding elements 4m..4m+3 of every row as unsigned bytes (the packed
 * nibbles are transposed, 4x4 dwords per half, before they are unpacked);
 * eight vpdpbusd against the token's dwords broadcast give the eight rows'
 * exact block sums, and one cvt, mul and fma scale them. Signed weights go
 * as unsigned codes u = q + off (off = 8 for Q4_0, 16 for Q5_0, 128 for
 * IQ4_NL): sum(q x) = sum(u x) - off * sum(x), the last term per token and
 * block, computed once per token tile for a segment of blocks (SL__VSEG) and
 * shared by the chunk's rows. The matmul sends one-token products here too
 * (gemm_one): with the rows in the lanes, one token costs less than the dot.
 *
 * Dots (one row, 1..4 tokens: sl_kern_vec_dot, and the matmul where no gemm
 * serves): the sign trick, one vpdpbusd and a horizontal sum per block. */

#define XB(type, t, i) (((const type *)((const char *)x + (size_t)(t)*xs))[i])

/* Loops over the eight rows or the up to SL__VNT tokens of a tile: unrolled
 * whole, so their arrays stay in registers. */
#define UNROLL8 _Pragma("GCC unroll 8")

/* acc + a * b, one rounding (the vector fma's lane arithmetic). */
INL float fma1(float a, float b, float acc) {
  return _mm_cvtss_f32(
      _mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(acc)));
}

/* ---- dots ------------------------------------------------------------------
 */

/* Signed weight quants q against Q8_0: the block's exact sum of q * x per
 * token, through |q| * sign(x, q). */
INL void vblk_signed(__m256i q, float dw, const void *x, size_t xs, int64_t i,
                     float *acc, const int NT) {
  __m256i aq = _mm256_sign_epi8(q, q);
  UNROLL for (int t = 0; t < NT; t++) {
    const sl__block_q8_0 *xb = &XB(sl__block_q8_0, t, i);
    __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
    int s = hsum_i32(
        SL__DPBUSD(_mm256_setzero_si256(), aq, _mm256_sign_epi8(xv, q)));
    acc[t] = fma1((float)s, dw * _cvtsh_ss(xb->d), acc[t]);
  }
}

/* Unsigned quants q (0..31) with a minimum against Q8_1. */
INL void vblk_min(__m256i q, float dw, float mw, const void *x, size_t xs,
                  int64_t i, float *acc, float *sm, const int NT) {
  UNROLL for (int t = 0; t < NT; t++) {
    const sl__block_q8_1 *xb = &XB(sl__block_q8_1, t, i);
    __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
    int s = hsum_i32(SL__DPBUSD(_mm256_setzero_si256(), q, xv));
    acc[t] = fma1((float)s, dw * _cvtsh_ss(xb->d), acc[t]);
    sm[t] = fma1(mw, _cvtsh_ss(xb->s), sm[t]);
  }
}

INL void vblk_q4_0(const sl__block_q4_0 *a, const void *x, size_t xs, int64_t i,
                   float *acc, float *sm, const int NT) {
  (void)sm;
  __m256i q = _mm256_sub_epi8(unpack_q4(a[i].qs), _mm256_set1_epi8(8));
  vblk_signed(q, _cvtsh_ss(a[i].d), x, xs, i, acc, NT);
}
INL void vblk_q5_0(const sl__block_q5_0 *a, const void *x, size_t xs, int64_t i,
                   float *acc, float *sm, const int NT) {
  (void)sm;
  __m256i q =
      _mm256_sub_epi8(unpack_q5(a[i].qs, a[i].qh), _mm256_set1_epi8(16));
  vblk_signed(q, _cvtsh_ss(a[i].d), x, xs, i, acc, NT);
}
INL void vblk_iq4_nl(const sl__block_iq4_nl *a, const void *x, size_t xs,
                     int64_t i, float *acc, float *sm, const int NT) {
  (void)sm;
  vblk_signed(unpack_iq4nl(a[i].qs), _cvtsh_ss(a[i].d), x, xs, i, acc, NT);
}
INL void vblk_q4_1(const sl__block_q4_1 *a, const void *x, size_t xs, int64_t i,
                   float *acc, float *sm, const int NT) {
  vblk_min(unpack_q4(a[i].qs), _cvtsh_ss(a[i].d), _cvtsh_ss(a[i].m), x, xs, i,
           acc, sm, NT);
}
INL void vblk_q5_1(const sl__block_q5_1 *a, const void *x, size_t xs, int64_t i,
                   float *acc, float *sm, const int NT) {
  vblk_min(unpack_q5(a[i].qs, a[i].qh), _cvtsh_ss(a[i].d), _cvtsh_ss(a[i].m), x,
           xs, i, acc, sm, NT);
}

/* A dot in the order above: blk(a, x, xs, i, acc, sm, NT) chains block i. */
#define SL__VDOT(name, blk, wtype, has_m)                                      \
  INL void name##_nt(int64_t n, const void *w, const void *x, size_t xs,       \
                     float *y, size_t ys, const int NT) {                      \
    const wtype *a = w;                                                        \
    const int64_t nb = n / SL__QK;                                             \
    float acc[SL__NT_MAX], sm[SL__NT_MAX];                                     \
    UNROLL for (int t = 0; t < NT; t++) acc[t] = sm[t] = 0.0f;                 \
    for (int64_t i = 0; i < nb; i++)                                           \
      blk(a, x, xs, i, acc, sm, NT);                                           \
    UNROLL for (int t = 0; t < NT; t++) y[(size_t)t * ys] =                    \
        has_m ? acc[t] + sm[t] : acc[t];                                       \
  }                                                                            \
  SL__NT_DISPATCH(name)

SL__VDOT(vdot_q4_0, vblk_q4_0, sl__block_q4_0, 0)
SL__VDOT(vdot_q5_0, vblk_q5_0, sl__block_q5_0, 0)
SL__VDOT(vdot_iq4_nl, vblk_iq4_nl, sl__block_iq4_nl, 0)
SL__VDOT(vdot_q4_1, vblk_q4_1, sl__block_q4_1, 1)
SL__VDOT(vdot_q5_1, vblk_q5_1, sl__block_q5_1, 1)

/* ---- gemm tiles
 * --------------------------------------------------------------
 */

/* The columns of eight rows' block i, as unsigned codes u = q + off (off 8
 * for Q4_0, 16 for Q5_0, 128 for IQ4_NL and Q8_0; Q4_1 and Q5_1: their
 * quants): v[m], lane r = elements 4m..4m+3 of row a[r]. */

/* The nibble types: the 16 packed bytes of the rows go through a 4x4 dword
 * transpose (rows 0..3 in the low half, 4..7 in the high) before they are
 * unpacked, so the transpose moves half the bytes: packed dword m holds
 * elements 4m..4m+3 (low nibbles) and 16+4m.. (high ones). */
INL void cols_nibbles(const uint8_t *const *qs, __m256i *v) {
#define SL__LD2(lo, hi)                                                        \
  _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(hi)),                     \
                   _mm_loadu_si128((const __m128i *)(lo)))
  __m256i p0 = SL__LD2(qs[0], qs[4]), p1 = SL__LD2(qs[1], qs[5]);
  __m256i p2 = SL__LD2(qs[2], qs[6]), p3 = SL__LD2(qs[3], qs[7]);
#undef SL__LD2
  __m256i a0 = _mm256_unpacklo_epi32(p0, p1),
          a1 = _mm256_unpackhi_epi32(p0, p1);
  __m256i a2 = _mm256_unpacklo_epi32(p2, p3),
          a3 = _mm256_unpackhi_epi32(p2, p3);
  __m256i c[4] = {_mm256_unpacklo_epi64(a0, a2), _mm256_unpackhi_epi64(a0, a2),
                  _mm256_unpacklo_epi64(a1, a3), _mm256_unpackhi_epi64(a1, a3)};
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  UNROLL for (int m = 0; m < 4; m++) {
    v[m] = _mm256_and_si256(c[m], m4);
    v[m + 4] = _mm256_and_si256(_mm256_srli_epi16(c[m], 4), m4);
  }
}

/* The fifth bits of Q5_0 / Q5_1: element j of row r gets 16 when bit j of
 * its qh is set. */
INL void cols_add_qh(const uint8_t *const *qh, __m256i *v) {
  int32_t h[8];
  for (int r = 0; r < 8; r++)
    memcpy(&h[r], qh[r], 4);
  __m256i hv =
      _mm256_setr_epi32(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
  /* bits 4m..4m+3 of a lane: its byte m / 2, from bit 4 * (m % 2) */
#define SL__REP(k)                                                             \
  _mm256_shuffle_epi8(hv, _mm256_setr_epi8(k, k, k, k, 4 + k, 4 + k, 4 + k,    \
                                           4 + k, 8 + k, 8 + k, 8 + k, 8 + k,  \
                                           12 + k, 12 + k, 12 + k, 12 + k, k,  \
                                           k, k, k, 4 + k, 4 + k, 4 + k,       \
                                           4 + k, 8 + k, 8 + k, 8 + k, 8 + k,  \
                                           12 + k, 12 + k, 12 + k, 12 + k))
  const __m256i by[4] = {SL__REP(0), SL__REP(1), SL__REP(2), SL__REP(3)};
#undef SL__REP
  const __m256i blo = _mm256_set1_epi32(0x08040201);
  const __m256i bhi = _mm256_set1_epi32((int)0x80402010u);
  const __m256i b16 = _mm256_set1_epi8(16);
#define SL__ADD(m, bits)                                                       \
  v[m] = _mm256_or_si256(                                                      \
      v[m],                                                                    \
      _mm256_and_si256(                                                        \
          _mm256_cmpeq_epi8(_mm256_and_si256(by[(m) / 2], bits), bits), b16))
  SL__ADD(0, blo);
  SL__ADD(1, bhi);
  SL__ADD(2, blo);
  SL__ADD(3, bhi);
  SL__ADD(4, blo);
  SL__ADD(5, bhi);
  SL__ADD(6, blo);
  SL__ADD(7, bhi);
#undef SL__ADD
}

#define SL__QS8(a, i)                                                          \
  const uint8_t *qs[8] = {a[0][i].qs, a[1][i].qs, a[2][i].qs, a[3][i].qs,      \
                          a[4][i].qs, a[5][i].qs, a[6][i].qs, a[7][i].qs}
#define SL__QH8(a, i)                                                          \
  const uint8_t *qh[8] = {a[0][i].qh, a[1][i].qh, a[2][i].qh, a[3][i].qh,      \
                          a[4][i].qh, a[5][i].qh, a[6][i].qh, a[7][i].qh}

INL void cols_q4_0(const sl__block_q4_0 *const *a, int64_t i, __m256i *v) {
  SL__QS8(a, i);
  cols_nibbles(qs, v);
}
INL void cols_q4_1(const sl__block_q4_1 *const *a, int64_t i, __m256i *v) {
  SL__QS8(a, i);
  cols_nibbles(qs, v);
}
INL void cols_q5_0(const sl__block_q5_0 *const *a, int64_t i, __m256i *v) {
  SL__QS8(a, i);
  SL__QH8(a, i);
  cols_nibbles(qs, v);
  cols_add_qh(qh, v);
}
INL void cols_q5_1(const sl__block_q5_1 *const *a, int64_t i, __m256i *v) {
  SL__QS8(a, i);
  SL__QH8(a, i);
  cols_nibbles(qs, v);
  cols_add_qh(qh, v);
}
INL void cols_iq4_nl(const sl__block_iq4_nl *const *a, int64_t i, __m256i *v) {
  SL__QS8(a, i);
  cols_nibbles(qs, v);
  const __m256i lut =
      _mm256_xor_si256(_mm256_broadcastsi128_si256(
                           _mm_loadu_si128((const __m128i *)sl__kvalues_iq4nl)),
                       _mm256_set1_epi8(-128));
  UNROLL8 for (int m = 0; m < 8; m++) v[m] = _mm256_shuffle_epi8(lut, v[m]);
}

INL __m256i bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

/* Blocks per bias segment: a token tile's biases for SL__VSEG blocks live on
 * the stack. Rows longer than that run in segments, the accumulators kept in
 * `spill` between segments; a chunk then has at most
 * SL__GEMM_WSC_MAX / (2 * SL__VSEG) rows (the matmul's chunk bound). */
#define SL__VSEG 256
/* Rows ahead that a tile prefetches (its rows' blocks, pfd bytes on): a tile
 * reads eight rows' blocks in turn, which the hardware prefetchers follow
 * badly once the weights stream from DRAM. */
#define SL__VPF     16
#define SL__VGROUPS ((SL__GEMM_WSC_MAX / (2 * SL__VSEG) + 7) / 8 + 1)

/* Blocks [i0, i1) of eight rows a[0..7] by NT tokens. bias: [i - i0][t],
 * -off * sum(x) (NULL for the unsigned types: no bias, an m * s chain);
 * spill[2][SL__VNT]: acc then sm, read unless `first`, written unless `last`
 * (then rows < nr of y get the sums); pfd: the prefetch distance in bytes. */
#define SL__VTILE(name, wtype, cols, has_m, xtype)                             \
  INL void name(int64_t i0, int64_t i1, const wtype *const *a, const void *x,  \
                size_t xs, const float *xd, const float *xsum, int64_t ld,     \
                const int32_t *bias, __m256 *spill, int first, int last,       \
                size_t pfd, float *y, size_t ys, int nr, const int NT) {       \
    __m256 acc[SL__VNT], sm[SL__VNT];                                          \
    UNROLL8 for (int t = 0; t < NT; t++) {                                     \
      acc[t] = first ? _mm256_setzero_ps() : spill[t];                         \
      sm[t] = first ? _mm256_setzero_ps() : spill[SL__VNT + t];                \
    }                                                                          \
    for (int64_t i = i0; i < i1; i++) {                                        \
      __m256i v[8];                                                            \
      UNROLL8 for (int r = 0; r < 8; r++)                                      \
          _mm_prefetch((const char *)&a[r][i] + pfd, _MM_HINT_T0);             \
      cols(a, i, v);                                                           \
      __m256 dw = _mm256_cvtph_ps(                                             \
          _mm_setr_epi16((short)a[0][i].d, (short)a[1][i].d, (short)a[2][i].d, \
                         (short)a[3][i].d, (short)a[4][i].d, (short)a[5][i].d, \
                         (short)a[6][i].d, (short)a[7][i].d));                 \
      __m256 mw = _mm256_setzero_ps();                                         \
      if (has_m)                                                               \
        mw = _mm256_cvtph_ps(                                                  \
            _mm_setr_epi16((short)SL__VM(a[0][i]), (short)SL__VM(a[1][i]),     \
                           (short)SL__VM(a[2][i]), (short)SL__VM(a[3][i]),     \
                           (short)SL__VM(a[4][i]), (short)SL__VM(a[5][i]),     \
                           (short)SL__VM(a[6][i]), (short)SL__VM(a[7][i])));   \
      UNROLL8 for (int t = 0; t < NT; t++) {                                   \
        const int8_t *q = XB(xtype, t, i).qs;                                  \
        __m256i c0 = has_m ? _mm256_setzero_si256()                            \
                           : _mm256_set1_epi32(bias[(i - i0) * SL__VNT + t]);  \
        __m256i c1 = _mm256_setzero_si256();                                   \
        c0 = SL__DPBUSD(c0, v[0], bcast4(q));                                  \
        c1 = SL__DPBUSD(c1, v[1], bcast4(q + 4));                              \
        c0 = SL__DPBUSD(c0, v[2], bcast4(q + 8));                              \
        c1 = SL__DPBUSD(c1, v[3], bcast4(q + 12));                             \
        c0 = SL__DPBUSD(c0, v[4], bcast4(q + 16));                             \
        c1 = SL__DPBUSD(c1, v[5], bcast4(q + 20));                             \
        c0 = SL__DPBUSD(c0, v[6], bcast4(q + 24));                             \
        c1 = SL__DPBUSD(c1, v[7], bcast4(q + 28));                             \
        __m256 dx = _mm256_broadcast_ss(xd + i * ld + t);                      \
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(c0, c1)), \
                                 _mm256_mul_ps(dw, dx), acc[t]);               \
        if (has_m)                                                             \
          sm[t] = _mm256_fmadd_ps(mw, _mm256_broadcast_ss(xsum + i * ld + t),  \
                                  sm[t]);                                      \
      }                                                                        \
    }                                                                          \
    if (!last) {                                                               \
      UNROLL8 for (int t = 0; t < NT; t++) {                                   \
        spill[t] = acc[t];                                                     \
        spill[SL__VNT + t] = sm[t];                                            \
      }                                                                        \
      return;                                                                  \
    }                                                                          \
    UNROLL8 for (int t = 0; t < NT; t++) {                                     \
      float o[8];                                                              \
      _mm256_storeu_ps(o, has_m ? _mm256_add_ps(acc[t], sm[t]) : acc[t]);      \
      for (int r = 0; r < nr; r++)                                             \
        y[(size_t)t * ys + r] = o[r];                                          \
    }                                                                          \
  }

/* Q4_1 / Q5_1: the m field; the signed types never read it. */
#define SL__VM(b) SL__VMF(b)

/* The chunk driver (sl__gemm_fn): per token tile and block segment, the
 * biases, then the groups of eight rows (the last group repeats its last
 * row to fill the lanes, and stores only its own rows). */
#define SL__VGEMM(name, wtype, tile, off, has_m, xtype)                        \
  static void name(int64_t cols, const void *w, size_t wst, int64_t nr,        \
                   const void *x, size_t xs, const float *xd,                  \
                   const float *xsum, int64_t ld, int64_t n, float *y,         \
                   size_t ys) {                                                \
    const int64_t nb = cols / SL__QK;                                          \
    int32_t bias[SL__VSEG * SL__VNT];                                          \
    __m256 spill[SL__VGROUPS][2 * SL__VNT];                                    \
    SL_ASSERT(nb <= SL__VSEG || (nr + 7) / 8 <= SL__VGROUPS);                  \
    const __m256i offv = _mm256_set1_epi8((char)(off));                        \
    for (int64_t t0 = 0; t0 < n; t0 += SL__VNT) {                              \
      int64_t nt = n - t0 < SL__VNT ? n - t0 : SL__VNT;                        \
      const void *xt = (const char *)x + (size_t)t0 * xs;                      \
      const float *xdt = xd + t0, *xst = has_m ? xsum + t0 : NULL;             \
      for (int64_t s0 = 0; s0 < nb; s0 += SL__VSEG) {                          \
        int64_t s1 = nb - s0 < SL__VSEG ? nb : s0 + SL__VSEG;                  \
        if (!has_m)                                                            \
          for (int64_t i = s0; i < s1; i++)                                    \
            for (int64_t t = 0; t < nt; t++) {                                 \
              const xtype *xb =                                                \
                  &((const xtype *)((const char *)xt + (size_t)t * xs))[i];    \
              __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);        \
              bias[(i - s0) * SL__VNT + t] =                                   \
                  -hsum_i32(SL__DPBUSD(_mm256_setzero_si256(), offv, xv));     \
            }                                                                  \
        for (int64_t r = 0; r < nr; r += 8) {                                  \
          int g = nr - r < 8 ? (int)(nr - r) : 8;                              \
          const wtype *a[8];                                                   \
          for (int k = 0; k < 8; k++)                                          \
            a[k] = (const wtype *)((const char *)w +                           \
                                   (size_t)(r + (k < g ? k : g - 1)) * wst);   \
          float *yt = y + (size_t)t0 * ys + (size_t)r;                         \
          __m256 *sp = spill[nb <= SL__VSEG ? 0 : r / 8];                      \
          int first = s0 == 0, last = s1 == nb;                                \
          SL__VCALL_NT(SL__VTILE_CALL, tile, nt)                               \
        }                                                                      \
      }                                                                        \
    }                                                                          \
  }
#define SL__VTILE_CALL(fn, NT)                                                 \
  fn(s0, s1, a, xt, xs, xdt, xst, ld, bias, sp, first, last, SL__VPF *wst, yt, \
     ys, g, NT)

/* A tile call with NT a constant, 1..SL__VNT. */
#if SL__VNT == 8
#define SL__VCALL_NT(call, fn, nt)                                             \
  switch (nt) {                                                                \
  case 1:                                                                      \
    call(fn, 1);                                                               \
    break;                                                                     \
  case 2:                                                                      \
    call(fn, 2);                                                               \
    break;                                                                     \
  case 3:                                                                      \
    call(fn, 3);                                                               \
    break;                                                                     \
  case 4:                                                                      \
    call(fn, 4);                                                               \
    break;                                                                     \
  case 5:                                                                      \
    call(fn, 5);                                                               \
    break;                                                                     \
  case 6:                                                                      \
    call(fn, 6);                                                               \
    break;                                                                     \
  case 7:                                                                      \
    call(fn, 7);                                                               \
    break;                                                                     \
  default:                                                                     \
    call(fn, 8);                                                               \
    break;                                                                     \
  }
#elif SL__VNT == 4
#define SL__VCALL_NT(call, fn, nt)                                             \
  switch (nt) {                                                                \
  case 1:                                                                      \
    call(fn, 1);                                                               \
    break;                                                                     \
  case 2:                                                                      \
    call(fn, 2);                                                               \
    break;                                                                     \
  case 3:                                                                      \
    call(fn, 3);                                                               \
    break;                                                                     \
  default:                                                                     \
    call(fn, 4);                                                               \
    break;                                                                     \
  }
#else
#error "SL__VNT must be 4 or 8"
#endif

#define SL__VMF(b) 0
SL__VTILE(vtile_q4_0, sl__block_q4_0, cols_q4_0, 0, sl__block_q8_0)
SL__VTILE(vtile_q5_0, sl__block_q5_0, cols_q5_0, 0, sl__block_q8_0)
SL__VTILE(vtile_iq4_nl, sl__block_iq4_nl, cols_iq4_nl, 0, sl__block_q8_0)
#undef SL__VMF
#define SL__VMF(b) (b).m
SL__VTILE(vtile_q4_1, sl__block_q4_1, cols_q4_1, 1, sl__block_q8_1)
SL__VTILE(vtile_q5_1, sl__block_q5_1, cols_q5_1, 1, sl__block_q8_1)
#undef SL__VMF

SL__VGEMM(vgemm_q4_0, sl__block_q4_0, vtile_q4_0, 8, 0, sl__block_q8_0)
SL__VGEMM(vgemm_q5_0, sl__block_q5_0, vtile_q5_0, 16, 0, sl__block_q8_0)
SL__VGEMM(vgemm_iq4_nl, sl__block_iq4_nl, vtile_iq4_nl, 128, 0, sl__block_q8_0)
SL__VGEMM(vgemm_q4_1, sl__block_q4_1, vtile_q4_1, 0, 1, sl__block_q8_1)
SL__VGEMM(vgemm_q5_1, sl__block_q5_1, vtile_q5_1, 0, 1, sl__block_q8_1)

/* ---- Q8_0: the AVX2 kernels' order ----------------------------------------
 * Q8_0 rows are twice as many bytes per element, and streaming eight of them
 * at once from DRAM ran at half the one-row dot's bandwidth (the 49152-row
 * output matrix, Q8_0 in llama.cpp's files of the default model, measured
 * on one Zen 4), so Q8_0 keeps the AVX2 kernels' order: eight lanes of sums
 * of four products, an fma per lane and block, one horizontal sum at the end
 * (its results equal the AVX2 table's bit for bit), and one token goes
 * through the dot. The gemm tiles (two rows by up to four tokens) take the
 * codes u = q + 128 and, per lane, the bias -128 * (the lane's four x
 * summed): one vpdpbusd per block, row and token. */

INL void lblk_q8_0(const sl__block_q8_0 *a, const void *x, size_t xs, int64_t i,
                   __m256 *acc, float *sm, const int NT) {
  (void)sm;
  __m256i q = _mm256_loadu_si256((const __m256i *)a[i].qs);
  __m256i aq = _mm256_sign_epi8(q, q);
  float dw = _cvtsh_ss(a[i].d);
  UNROLL for (int t = 0; t < NT; t++) {
    const sl__block_q8_0 *xb = &XB(sl__block_q8_0, t, i);
    __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
    __m256i p = SL__DPBUSD(_mm256_setzero_si256(), aq, _mm256_sign_epi8(xv, q));
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                             _mm256_set1_ps(dw * _cvtsh_ss(xb->d)), acc[t]);
  }
}
SL__DOT_BLK32(ldot_q8_0, lblk_q8_0, sl__block_q8_0)

/* Blocks per bias segment (SL__LSEG * SL__NT_MAX bias vectors, 16 KiB, on
 * the stack); longer rows keep their accumulators in `spill` between
 * segments, and a chunk then has at most SL__GEMM_WSC_MAX / (2 * SL__LSEG)
 * rows. */
#define SL__LSEG  128
#define SL__LPAIR (SL__GEMM_WSC_MAX / (4 * SL__LSEG) + 1)

/* Blocks [i0, i1) of rows a0 and a1 (a1 == a0 when !two) by NT tokens. nbv:
 * [i - i0][t] the bias vectors; spill[2][SL__NT_MAX]: the accumulators, read
 * unless `first`, written unless `last` (then the sums go to y, as the
 * one-row dot's `hsum + 0.0f`). */
INL void ltile_q8_0(int64_t i0, int64_t i1, const sl__block_q8_0 *a0,
                    const sl__block_q8_0 *a1, const void *x, size_t xs,
                    const float *xd, int64_t ld, const __m256i *nbv,
                    __m256 *spill, int first, int last, float *y, size_t ys,
                    int two, const int NT) {
  __m256 acc0[SL__NT_MAX], acc1[SL__NT_MAX];
  UNROLL for (int t = 0; t < NT; t++) {
    acc0[t] = first ? _mm256_setzero_ps() : spill[t];
    acc1[t] = first ? _mm256_setzero_ps() : spill[SL__NT_MAX + t];
  }
  const __m256i flip = _mm256_set1_epi8(-128);
  for (int64_t i = i0; i < i1; i++) {
    __m256i u0 =
        _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)a0[i].qs), flip);
    __m256i u1 =
        _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)a1[i].qs), flip);
    __m256 d0 = _mm256_set1_ps(_cvtsh_ss(a0[i].d));
    __m256 d1 = _mm256_set1_ps(_cvtsh_ss(a1[i].d));
    const __m256i *bi = nbv + (i - i0) * SL__NT_MAX;
    UNROLL for (int t = 0; t < NT; t++) {
      __m256i xv =
          _mm256_loadu_si256((const __m256i *)XB(sl__block_q8_0, t, i).qs);
      __m256 dx = _mm256_broadcast_ss(xd + i * ld + t);
      acc0[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SL__DPBUSD(bi[t], u0, xv)),
                                _mm256_mul_ps(d0, dx), acc0[t]);
      acc1[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SL__DPBUSD(bi[t], u1, xv)),
                                _mm256_mul_ps(d1, dx), acc1[t]);
    }
  }
  if (!last) {
    UNROLL for (int t = 0; t < NT; t++) {
      spill[t] = acc0[t];
      spill[SL__NT_MAX + t] = acc1[t];
    }
    return;
  }
  UNROLL for (int t = 0; t < NT; t++) {
    y[(size_t)t * ys] = hsum_ps(acc0[t]) + 0.0f;
    if (two)
      y[(size_t)t * ys + 1] = hsum_ps(acc1[t]) + 0.0f;
  }
}

/* The chunk driver (sl__gemm_fn): per token tile and block segment, the
 * bias vectors, then the row pairs. */
static void lgemm_q8_0(int64_t cols, const void *w, size_t wst, int64_t nr,
                       const void *x, size_t xs, const float *xd,
                       const float *xsum, int64_t ld, int64_t n, float *y,
                       size_t ys) {
  (void)xsum;
  const int64_t nb = cols / SL__QK;
  __m256i nbv[SL__LSEG * SL__NT_MAX];
  __m256 spill[SL__LPAIR][2 * SL__NT_MAX];
  SL_ASSERT(nb <= SL__LSEG || (nr + 1) / 2 <= SL__LPAIR);
  const __m256i off = _mm256_set1_epi8(-128); /* 128 as unsigned bytes */
  for (int64_t t0 = 0; t0 < n; t0 += SL__NT_MAX) {
    int64_t nt = n - t0 < SL__NT_MAX ? n - t0 : SL__NT_MAX;
    const void *xt = (const char *)x + (size_t)t0 * xs;
    for (int64_t s0 = 0; s0 < nb; s0 += SL__LSEG) {
      int64_t s1 = nb - s0 < SL__LSEG ? nb : s0 + SL__LSEG;
      for (int64_t i = s0; i < s1; i++)
        for (int64_t t = 0; t < nt; t++) {
          const sl__block_q8_0 *xb =
              &((const sl__block_q8_0 *)((const char *)xt + (size_t)t * xs))[i];
          __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
          nbv[(i - s0) * SL__NT_MAX + t] =
              _mm256_sub_epi32(_mm256_setzero_si256(),
                               SL__DPBUSD(_mm256_setzero_si256(), off, xv));
        }
      for (int64_t r = 0; r < nr; r += 2) {
        int two = r + 1 < nr;
        const sl__block_q8_0 *a0 =
            (const sl__block_q8_0 *)((const char *)w + (size_t)r * wst);
        const sl__block_q8_0 *a1 =
            two ? (const sl__block_q8_0 *)((const char *)a0 + wst) : a0;
        float *yt = y + (size_t)t0 * ys + (size_t)r;
        __m256 *sp = spill[nb <= SL__LSEG ? 0 : r / 2];
        int first = s0 == 0, last = s1 == nb;
        const float *xdt = xd + t0;
        switch (nt) {
        case 1:
          ltile_q8_0(s0, s1, a0, a1, xt, xs, xdt, ld, nbv, sp, first, last, yt,
                     ys, two, 1);
          break;
        case 2:
          ltile_q8_0(s0, s1, a0, a1, xt, xs, xdt, ld, nbv, sp, first, last, yt,
                     ys, two, 2);
          break;
        case 3:
          ltile_q8_0(s0, s1, a0, a1, xt, xs, xdt, ld, nbv, sp, first, last, yt,
                     ys, two, 3);
          break;
        default:
          ltile_q8_0(s0, s1, a0, a1, xt, xs, xdt, ld, nbv, sp, first, last, yt,
                     ys, two, 4);
          break;
        }
      }
    }
  }
}

const sl__kern_cpu_ops SL__VNNI_OPS = {
    .dot =
        {
            [SL_GGML_Q4_0] = vdot_q4_0,
            [SL_GGML_Q4_1] = vdot_q4_1,
            [SL_GGML_Q5_0] = vdot_q5_0,
            [SL_GGML_Q5_1] = vdot_q5_1,
            [SL_GGML_IQ4_NL] = vdot_iq4_nl,
            [SL_GGML_Q8_0] = ldot_q8_0,
        },
    .gemm =
        {
            [SL_GGML_Q4_0] = vgemm_q4_0,
            [SL_GGML_Q4_1] = vgemm_q4_1,
            [SL_GGML_Q5_0] = vgemm_q5_0,
            [SL_GGML_Q5_1] = vgemm_q5_1,
            [SL_GGML_IQ4_NL] = vgemm_iq4_nl,
            [SL_GGML_Q8_0] = lgemm_q8_0,
        },
    .gemm_one =
        {
            [SL_GGML_Q4_0] = true,
            [SL_GGML_Q4_1] = true,
            [SL_GGML_Q5_0] = true,
            [SL_GGML_Q5_1] = true,
            [SL_GGML_IQ4_NL] = true,
        },
};
