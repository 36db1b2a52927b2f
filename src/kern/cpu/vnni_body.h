/* sluice — kern/cpu private: the 256-bit vpdpbusd dots and gemm tiles of the
 * 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q8_0 weights), one
 * source for two encodings. kern_cpu_avxvnni.c (VEX, AVX-VNNI) and
 * kern_cpu_avx512vnni.c (EVEX, AVX512_VNNI + VL) include it once each, inside
 * their target region, after <immintrin.h> and simd_avx2.h, with
 *   INL, UNROLL           as in the other ISA files;
 *   SL__DPBUSD(acc, u, s) the encoding's 256-bit vpdpbusd: acc + the 8 sums
 *                         of 4 products u (unsigned bytes) * s (signed);
 *   SL__VNNI_OPS          the name of the overlay table to define.
 *
 * Every result equals the AVX2 table's bit for bit: the integer lanes are
 * the same sums of four products (vpdpbusd computes them exactly, as
 * vpmaddubsw + vpmaddwd do when nothing saturates, which the block ranges
 * guarantee) and the float part is the AVX2 code's, order included.
 *
 * Dots (one row, 1..4 tokens): the sign trick of the AVX2 dots with one
 * vpdpbusd in place of vpmaddubsw + vpmaddwd.
 *
 * Gemm tiles (two rows by up to four tokens): signed weights go as unsigned
 * codes u = q + off (off = 8 for Q4_0, 16 for Q5_0, 128 for IQ4_NL and Q8_0),
 * so a lane's sum of q * x is vpdpbusd(-off * (the lane's four x summed), u,
 * x). The bias vector depends on the token alone: it is computed once per
 * token tile for a segment of blocks (SL__VSEG) and shared by every row of
 * the chunk, which leaves one vpdpbusd per block, row and token. Unsigned
 * weights (Q4_1, Q5_1) against Q8_1 need no bias. */

#define XB(type, t, i) (((const type *)((const char *)x + (size_t)(t)*xs))[i])

/* ---- dots ------------------------------------------------------------------
 */

/* Signed weight quants q against Q8_0: |q| * sign(x, q) into vpdpbusd. */
INL void vblk_signed(__m256i q, float dw, const void *x, size_t xs, int64_t i,
                     __m256 *acc, const int NT) {
  __m256i aq = _mm256_sign_epi8(q, q);
  UNROLL for (int t = 0; t < NT; t++) {
    const sl__block_q8_0 *xb = &XB(sl__block_q8_0, t, i);
    __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
    __m256i p = SL__DPBUSD(_mm256_setzero_si256(), aq, _mm256_sign_epi8(xv, q));
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                             _mm256_set1_ps(dw * _cvtsh_ss(xb->d)), acc[t]);
  }
}

/* Unsigned quants q (0..31) with a minimum against Q8_1. */
INL void vblk_min(__m256i q, float dw, float mw, const void *x, size_t xs,
                  int64_t i, __m256 *acc, float *sm, const int NT) {
  UNROLL for (int t = 0; t < NT; t++) {
    const sl__block_q8_1 *xb = &XB(sl__block_q8_1, t, i);
    __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
    __m256i p = SL__DPBUSD(_mm256_setzero_si256(), q, xv);
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                             _mm256_set1_ps(dw * _cvtsh_ss(xb->d)), acc[t]);
    sm[t] += mw * _cvtsh_ss(xb->s);
  }
}

INL void vblk_q4_0(const sl__block_q4_0 *a, const void *x, size_t xs, int64_t i,
                   __m256 *acc, float *sm, const int NT) {
  (void)sm;
  __m256i q = _mm256_sub_epi8(unpack_q4(a[i].qs), _mm256_set1_epi8(8));
  vblk_signed(q, _cvtsh_ss(a[i].d), x, xs, i, acc, NT);
}
INL void vblk_q5_0(const sl__block_q5_0 *a, const void *x, size_t xs, int64_t i,
                   __m256 *acc, float *sm, const int NT) {
  (void)sm;
  __m256i q =
      _mm256_sub_epi8(unpack_q5(a[i].qs, a[i].qh), _mm256_set1_epi8(16));
  vblk_signed(q, _cvtsh_ss(a[i].d), x, xs, i, acc, NT);
}
INL void vblk_iq4_nl(const sl__block_iq4_nl *a, const void *x, size_t xs,
                     int64_t i, __m256 *acc, float *sm, const int NT) {
  (void)sm;
  vblk_signed(unpack_iq4nl(a[i].qs), _cvtsh_ss(a[i].d), x, xs, i, acc, NT);
}
INL void vblk_q8_0(const sl__block_q8_0 *a, const void *x, size_t xs, int64_t i,
                   __m256 *acc, float *sm, const int NT) {
  (void)sm;
  __m256i q = _mm256_loadu_si256((const __m256i *)a[i].qs);
  vblk_signed(q, _cvtsh_ss(a[i].d), x, xs, i, acc, NT);
}
INL void vblk_q4_1(const sl__block_q4_1 *a, const void *x, size_t xs, int64_t i,
                   __m256 *acc, float *sm, const int NT) {
  vblk_min(unpack_q4(a[i].qs), _cvtsh_ss(a[i].d), _cvtsh_ss(a[i].m), x, xs, i,
           acc, sm, NT);
}
INL void vblk_q5_1(const sl__block_q5_1 *a, const void *x, size_t xs, int64_t i,
                   __m256 *acc, float *sm, const int NT) {
  vblk_min(unpack_q5(a[i].qs, a[i].qh), _cvtsh_ss(a[i].d), _cvtsh_ss(a[i].m), x,
           xs, i, acc, sm, NT);
}

SL__DOT_BLK32(vdot_q4_0, vblk_q4_0, sl__block_q4_0)
SL__DOT_BLK32(vdot_q5_0, vblk_q5_0, sl__block_q5_0)
SL__DOT_BLK32(vdot_iq4_nl, vblk_iq4_nl, sl__block_iq4_nl)
SL__DOT_BLK32(vdot_q8_0, vblk_q8_0, sl__block_q8_0)
SL__DOT_BLK32(vdot_q4_1, vblk_q4_1, sl__block_q4_1)
SL__DOT_BLK32(vdot_q5_1, vblk_q5_1, sl__block_q5_1)

/* ---- gemm tiles
 * --------------------------------------------------------------
 */

/* The unsigned codes u = q + off of a signed block, in unpack_q4's order. */
INL __m256i ucode_q4_0(const sl__block_q4_0 *b) { /* off 8 */
  return unpack_q4(b->qs);
}
INL __m256i ucode_q5_0(const sl__block_q5_0 *b) { /* off 16 */
  return unpack_q5(b->qs, b->qh);
}
INL __m256i ucode_iq4_nl(const sl__block_iq4_nl *b) { /* off 128 */
  return _mm256_xor_si256(unpack_iq4nl(b->qs), _mm256_set1_epi8(-128));
}
INL __m256i ucode_q8_0(const sl__block_q8_0 *b) { /* off 128 */
  return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)b->qs),
                          _mm256_set1_epi8(-128));
}

/* Blocks per bias segment: the bias vectors of one token tile live on the
 * stack, SL__VSEG * SL__NT_MAX of them (16 KiB). Rows longer than that run
 * in segments, their accumulators kept in `spill` between segments; a chunk
 * then has at most SL__GEMM_WSC_MAX / (2 * SL__VSEG) rows. */
#define SL__VSEG  128
#define SL__VPAIR (SL__GEMM_WSC_MAX / (4 * SL__VSEG) + 1)

/* Blocks [i0, i1) of rows a0 and a1 (a1 == a0 when !two) by NT tokens,
 * signed weights. ws0 / ws1: the rows' d as floats, by block; nb_:
 * [i - i0][t] the tokens' bias vectors; spill[2][SL__NT_MAX]: the
 * accumulators, read unless `first`, written unless `last` (then the sums
 * go to y, as the one-row dot's `hsum + 0.0f`). */
#define SL__VTILE_SIGNED(name, wtype, ucode)                                   \
  INL void name(int64_t i0, int64_t i1, const wtype *a0, const wtype *a1,      \
                const float *ws0, const float *ws1, const void *x, size_t xs,  \
                const float *xd, int64_t ld, const __m256i *nb_,               \
                __m256 *spill, int first, int last, float *y, size_t ys,       \
                int two, const int NT) {                                       \
    __m256 acc0[SL__NT_MAX], acc1[SL__NT_MAX];                                 \
    UNROLL for (int t = 0; t < NT; t++) {                                      \
      acc0[t] = first ? _mm256_setzero_ps() : spill[t];                        \
      acc1[t] = first ? _mm256_setzero_ps() : spill[SL__NT_MAX + t];           \
    }                                                                          \
    for (int64_t i = i0; i < i1; i++) {                                        \
      __m256i u0 = ucode(&a0[i]), u1 = ucode(&a1[i]);                          \
      __m256 d0 = _mm256_broadcast_ss(ws0 + i);                                \
      __m256 d1 = _mm256_broadcast_ss(ws1 + i);                                \
      const __m256i *bi = nb_ + (i - i0) * SL__NT_MAX;                         \
      UNROLL for (int t = 0; t < NT; t++) {                                    \
        __m256i xv =                                                           \
            _mm256_loadu_si256((const __m256i *)XB(sl__block_q8_0, t, i).qs);  \
        __m256 dx = _mm256_broadcast_ss(xd + i * ld + t);                      \
        acc0[t] =                                                              \
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(SL__DPBUSD(bi[t], u0, xv)),     \
                            _mm256_mul_ps(d0, dx), acc0[t]);                   \
        acc1[t] =                                                              \
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(SL__DPBUSD(bi[t], u1, xv)),     \
                            _mm256_mul_ps(d1, dx), acc1[t]);                   \
      }                                                                        \
    }                                                                          \
    if (!last) {                                                               \
      UNROLL for (int t = 0; t < NT; t++) {                                    \
        spill[t] = acc0[t];                                                    \
        spill[SL__NT_MAX + t] = acc1[t];                                       \
      }                                                                        \
      return;                                                                  \
    }                                                                          \
    UNROLL for (int t = 0; t < NT; t++) {                                      \
      y[(size_t)t * ys] = hsum_ps(acc0[t]) + 0.0f;                             \
      if (two)                                                                 \
        y[(size_t)t * ys + 1] = hsum_ps(acc1[t]) + 0.0f;                       \
    }                                                                          \
  }

/* A tile call with NT a constant. */
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

/* The chunk driver for signed weights (sl__gemm_fn): weight scales to
 * floats once; per token tile and block segment, the bias vectors, then the
 * row pairs. */
#define SL__VGEMM_SIGNED(name, wtype, tile, off)                               \
  static void name(int64_t cols, const void *w, size_t wst, int64_t nr,        \
                   const void *x, size_t xs, const float *xd,                  \
                   const float *xsum, int64_t ld, int64_t n, float *y,         \
                   size_t ys) {                                                \
    (void)xsum;                                                                \
    const int64_t nb = cols / SL__QK;                                          \
    float ws[SL__GEMM_WSC_MAX];                                                \
    __m256i bias[SL__VSEG * SL__NT_MAX];                                       \
    __m256 spill[SL__VPAIR][2 * SL__NT_MAX];                                   \
    SL_ASSERT(nb <= SL__VSEG || (nr + 1) / 2 <= SL__VPAIR);                    \
    for (int64_t r = 0; r < nr; r++) {                                         \
      const wtype *a = (const wtype *)((const char *)w + (size_t)r * wst);     \
      for (int64_t i = 0; i < nb; i++)                                         \
        ws[r * nb + i] = _cvtsh_ss(a[i].d);                                    \
    }                                                                          \
    const __m256i offv = _mm256_set1_epi8((char)(off));                        \
    for (int64_t t0 = 0; t0 < n; t0 += SL__NT_MAX) {                           \
      int64_t nt = n - t0 < SL__NT_MAX ? n - t0 : SL__NT_MAX;                  \
      const void *xt = (const char *)x + (size_t)t0 * xs;                      \
      const float *xdt = xd + t0;                                              \
      for (int64_t s0 = 0; s0 < nb; s0 += SL__VSEG) {                          \
        int64_t s1 = nb - s0 < SL__VSEG ? nb : s0 + SL__VSEG;                  \
        for (int64_t i = s0; i < s1; i++)                                      \
          for (int64_t t = 0; t < nt; t++) {                                   \
            const sl__block_q8_0 *xb =                                         \
                &((const sl__block_q8_0 *)((const char *)xt +                  \
                                           (size_t)t * xs))[i];                \
            __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);          \
            bias[(i - s0) * SL__NT_MAX + t] = _mm256_sub_epi32(                \
                _mm256_setzero_si256(),                                        \
                SL__DPBUSD(_mm256_setzero_si256(), offv, xv));                 \
          }                                                                    \
        for (int64_t r = 0; r < nr; r += 2) {                                  \
          int two = r + 1 < nr;                                                \
          const wtype *a0 =                                                    \
              (const wtype *)((const char *)w + (size_t)r * wst);              \
          const wtype *a1 =                                                    \
              two ? (const wtype *)((const char *)a0 + wst) : a0;              \
          const float *w0 = ws + r * nb, *w1 = two ? w0 + nb : w0;             \
          float *yt = y + (size_t)t0 * ys + (size_t)r;                         \
          __m256 *sp = spill[nb <= SL__VSEG ? 0 : r / 2];                      \
          int first = s0 == 0, last = s1 == nb;                                \
          SL__VCALL_NT(SL__VTILE_CALL, tile, nt)                               \
        }                                                                      \
      }                                                                        \
    }                                                                          \
  }
#define SL__VTILE_CALL(fn, NT)                                                 \
  fn(s0, s1, a0, a1, w0, w1, xt, xs, xdt, ld, bias, sp, first, last, yt, ys,   \
     two, NT)

/* Q4_1 / Q5_1 rows against Q8_1: the AVX2 tile with vpdpbusd (ws0 / ws1:
 * [block][2], d then m). */
#define SL__VTILE_MIN(name, wtype, load_q)                                     \
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
      __m128 sx = _mm_loadu_ps(xsum + i * ld);                                 \
      sm0 = _mm_fmadd_ps(_mm_broadcast_ss(ws0 + 2 * i + 1), sx, sm0);          \
      sm1 = _mm_fmadd_ps(_mm_broadcast_ss(ws1 + 2 * i + 1), sx, sm1);          \
      UNROLL for (int t = 0; t < NT; t++) {                                    \
        __m256i xv =                                                           \
            _mm256_loadu_si256((const __m256i *)XB(sl__block_q8_1, t, i).qs);  \
        __m256 dx = _mm256_broadcast_ss(xd + i * ld + t);                      \
        acc0[t] = _mm256_fmadd_ps(                                             \
            _mm256_cvtepi32_ps(SL__DPBUSD(_mm256_setzero_si256(), q0, xv)),    \
            _mm256_mul_ps(d0, dx), acc0[t]);                                   \
        acc1[t] = _mm256_fmadd_ps(                                             \
            _mm256_cvtepi32_ps(SL__DPBUSD(_mm256_setzero_si256(), q1, xv)),    \
            _mm256_mul_ps(d1, dx), acc1[t]);                                   \
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

#define SL__VGEMM_MIN(name, wtype, tile)                                       \
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
        ws[(r * nb + i) * 2 + 1] = _cvtsh_ss(a[i].m);                          \
      }                                                                        \
    }                                                                          \
    for (int64_t t0 = 0; t0 < n; t0 += SL__NT_MAX) {                           \
      int64_t nt = n - t0 < SL__NT_MAX ? n - t0 : SL__NT_MAX;                  \
      const void *xt = (const char *)x + (size_t)t0 * xs;                      \
      const float *xdt = xd + t0, *xst = xsum + t0;                            \
      for (int64_t r = 0; r < nr; r += 2) {                                    \
        int two = r + 1 < nr;                                                  \
        const wtype *a0 = (const wtype *)((const char *)w + (size_t)r * wst);  \
        const wtype *a1 = two ? (const wtype *)((const char *)a0 + wst) : a0;  \
        const float *w0 = ws + r * nb * 2, *w1 = two ? w0 + nb * 2 : w0;       \
        float *yt = y + (size_t)t0 * ys + (size_t)r;                           \
        SL__VCALL_NT(SL__VTILE_MIN_CALL, tile, nt)                             \
      }                                                                        \
    }                                                                          \
  }
#define SL__VTILE_MIN_CALL(fn, NT)                                             \
  fn(nb, a0, a1, w0, w1, xt, xs, xdt, xst, ld, yt, ys, two, NT)

INL __m256i vload_q4_1(const sl__block_q4_1 *b) {
  return unpack_q4(b->qs);
}
INL __m256i vload_q5_1(const sl__block_q5_1 *b) {
  return unpack_q5(b->qs, b->qh);
}

SL__VTILE_SIGNED(vtile_q4_0, sl__block_q4_0, ucode_q4_0)
SL__VTILE_SIGNED(vtile_q5_0, sl__block_q5_0, ucode_q5_0)
SL__VTILE_SIGNED(vtile_iq4_nl, sl__block_iq4_nl, ucode_iq4_nl)
SL__VTILE_SIGNED(vtile_q8_0, sl__block_q8_0, ucode_q8_0)
SL__VTILE_MIN(vtile_q4_1, sl__block_q4_1, vload_q4_1)
SL__VTILE_MIN(vtile_q5_1, sl__block_q5_1, vload_q5_1)

SL__VGEMM_SIGNED(vgemm_q4_0, sl__block_q4_0, vtile_q4_0, 8)
SL__VGEMM_SIGNED(vgemm_q5_0, sl__block_q5_0, vtile_q5_0, 16)
SL__VGEMM_SIGNED(vgemm_iq4_nl, sl__block_iq4_nl, vtile_iq4_nl, 128)
SL__VGEMM_SIGNED(vgemm_q8_0, sl__block_q8_0, vtile_q8_0, 128)
SL__VGEMM_MIN(vgemm_q4_1, sl__block_q4_1, vtile_q4_1)
SL__VGEMM_MIN(vgemm_q5_1, sl__block_q5_1, vtile_q5_1)

const sl__kern_cpu_ops SL__VNNI_OPS = {
    .dot =
        {
            [SL_GGML_Q4_0] = vdot_q4_0,
            [SL_GGML_Q4_1] = vdot_q4_1,
            [SL_GGML_Q5_0] = vdot_q5_0,
            [SL_GGML_Q5_1] = vdot_q5_1,
            [SL_GGML_IQ4_NL] = vdot_iq4_nl,
            [SL_GGML_Q8_0] = vdot_q8_0,
        },
    .gemm =
        {
            [SL_GGML_Q4_0] = vgemm_q4_0,
            [SL_GGML_Q4_1] = vgemm_q4_1,
            [SL_GGML_Q5_0] = vgemm_q5_0,
            [SL_GGML_Q5_1] = vgemm_q5_1,
            [SL_GGML_IQ4_NL] = vgemm_iq4_nl,
            [SL_GGML_Q8_0] = vgemm_q8_0,
        },
};
