/* sluice — kern/cpu private: block layouts, fp16 helpers, the per-ISA op
 * table. Only src/kern/cpu/ includes this. */
#ifndef SLUICE_KERN_CPU_IMPL_H
#define SLUICE_KERN_CPU_IMPL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "sluice/kern_cpu.h"

#define SL__QK   32  /* elements per Q4_0 / Q4_1 / Q8_0 / Q8_1 block */
#define SL__QK_K 256 /* elements per K-quant super-block */

/* ggml block layouts (must match ggml byte for byte). */
typedef struct {
  uint16_t d; /* f16 */
  uint8_t qs[SL__QK / 2];
} sl__block_q4_0; /* 18 B */
typedef struct {
  uint16_t d, m; /* f16 */
  uint8_t qs[SL__QK / 2];
} sl__block_q4_1; /* 20 B */
typedef struct {
  uint16_t d;
  int8_t qs[SL__QK];
} sl__block_q8_0; /* 34 B */
typedef struct {
  uint16_t d, s; /* s = d * sum(qs) */
  int8_t qs[SL__QK];
} sl__block_q8_1; /* 36 B */
typedef struct {
  uint16_t d, dmin;
  uint8_t scales[12]; /* 8 6-bit scales and 8 6-bit mins, packed */
  uint8_t qs[SL__QK_K / 2];
} sl__block_q4_K; /* 144 B */
typedef struct {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[SL__QK_K / 8];
  uint8_t qs[SL__QK_K / 2];
} sl__block_q5_K; /* 176 B */
typedef struct {
  uint8_t ql[SL__QK_K / 2];
  uint8_t qh[SL__QK_K / 4];
  int8_t scales[SL__QK_K / 16];
  uint16_t d;
} sl__block_q6_K; /* 210 B */
typedef struct {
  float d;
  int8_t qs[SL__QK_K];
  int16_t bsums[SL__QK_K / 16]; /* sums of qs in groups of 16 */
} sl__block_q8_K;               /* 292 B */
typedef struct {
  uint16_t d;
  uint8_t qh[4]; /* bit j: the fifth bit of element j (little-endian u32) */
  uint8_t qs[SL__QK / 2];
} sl__block_q5_0; /* 22 B */
typedef struct {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[SL__QK / 2];
} sl__block_q5_1; /* 24 B */
typedef struct {
  uint16_t d;
  uint8_t qs[SL__QK / 2]; /* indices into sl__kvalues_iq4nl */
} sl__block_iq4_nl;       /* 18 B */

_Static_assert(sizeof(sl__block_q4_0) == 18, "q4_0");
/* A dot-table entry over nt tokens from a one-token dot, dot1 (each token's
 * sum is dot1's, in its order); storage: static, or extern for an entry
 * another file's table names. */
#define SL__DOT_ROWS(storage, name, dot1)                                      \
  storage void name(int64_t n, const void *w, const void *x, size_t xs,        \
                    float *y, size_t ys, int nt) {                             \
    for (int t = 0; t < nt; t++)                                               \
      y[(size_t)t * ys] =                                                      \
          dot1(n, w, (const void *)((const char *)x + t * xs));                \
  }

_Static_assert(sizeof(sl__block_q4_1) == 20, "q4_1");
_Static_assert(sizeof(sl__block_q8_0) == 34, "q8_0");
_Static_assert(sizeof(sl__block_q8_1) == 36, "q8_1");
_Static_assert(sizeof(sl__block_q4_K) == 144, "q4_K");
_Static_assert(sizeof(sl__block_q5_K) == 176, "q5_K");
_Static_assert(sizeof(sl__block_q6_K) == 210, "q6_K");
_Static_assert(sizeof(sl__block_q8_K) == 292, "q8_K");
_Static_assert(sizeof(sl__block_q5_0) == 22, "q5_0");
_Static_assert(sizeof(sl__block_q5_1) == 24, "q5_1");
_Static_assert(sizeof(sl__block_iq4_nl) == 18, "iq4_nl");

/* IQ4_NL's 16 non-linear levels (ggml's kvalues_iq4nl). */
static const int8_t sl__kvalues_iq4nl[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* ---- scalar f16 / bf16 ----------------------------------------------------
 */

static inline float sl__bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t sl__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float sl__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    float v = ldexpf((float)mant, -24); /* zero or subnormal: exact */
    return sign ? -v : v;
  }
  if (exp == 31)
    return sl__bits_f32(sign | 0x7f800000u | (mant << 13));
  return sl__bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* Round to nearest even, like F16C's _mm_cvtps_ph(x, 0). */
static inline uint16_t sl__f32_to_f16(float f) {
  uint32_t x = sl__f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) /* inf / nan */
    return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
  if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow */
    return (uint16_t)(sign | 0x7c00u);
  if (ax < 0x38800000u) { /* below the smallest normal: subnormal or zero */
    float v = sl__bits_f32(ax) * 16777216.0f; /* in units of 2^-24 */
    return (uint16_t)(sign | (uint32_t)lrintf(v));
  }
  uint32_t mant_odd = (ax >> 13) & 1u;
  ax += 0x0fffu + mant_odd;
  return (uint16_t)(sign | ((ax - 0x38000000u) >> 13));
}

static inline float sl__bf16_to_f32(uint16_t h) {
  return sl__bits_f32((uint32_t)h << 16);
}

/* ggml's get_scale_min_k4: the j-th 6-bit scale and min of a Q4_K/Q5_K block.
 */
static inline void sl__scale_min_k4(int j, const uint8_t *q, uint8_t *sc,
                                    uint8_t *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/* ---- the op table ---------------------------------------------------------
 */

#define SL__NTYPES 31 /* indexable by sl_ggml_type up to BF16 = 30 */
#define SL__NT_MAX 4  /* tokens per dot tile */

/* In the ISA files: instantiates the sl__dot_fn name(..., nt) from an
 * always-inline name##_nt(..., NT), NT a constant 1..SL__NT_MAX. */
#define SL__NT_DISPATCH(name)                                                  \
  static void name(int64_t n, const void *w, const void *x, size_t xs,         \
                   float *y, size_t ys, int nt) {                              \
    switch (nt) {                                                              \
    case 1:                                                                    \
      name##_nt(n, w, x, xs, y, ys, 1);                                        \
      break;                                                                   \
    case 2:                                                                    \
      name##_nt(n, w, x, xs, y, ys, 2);                                        \
      break;                                                                   \
    case 3:                                                                    \
      name##_nt(n, w, x, xs, y, ys, 3);                                        \
      break;                                                                   \
    default:                                                                   \
      name##_nt(n, w, x, xs, y, ys, 4);                                        \
      break;                                                                   \
    }                                                                          \
  }

typedef void (*sl__dequant_fn)(const void *src, float *dst, int64_t n);
typedef void (*sl__quant_fn)(const float *x, void *dst, int64_t n);
/* y[t * y_stride] = dot(w, x + t * x_stride bytes) for t < nt (1..NT_MAX). */
typedef void (*sl__dot_fn)(int64_t n, const void *w, const void *x,
                           size_t x_stride, float *y, size_t y_stride, int nt);

/* The batched product of a chunk of rows with every token:
 * y[t * y_stride + r] = dot(row r of w, token t of x) for r < nr, t < n,
 * each entry bit-identical to the same table's dot for that row and token
 * (tiles of two rows by up to four tokens only share loads and scale
 * conversions; every sum keeps the one-row order). x holds the quantized
 * activations (x_stride bytes per token); xd (and, for Q8_1, xsum) their
 * block scales d (and s) as floats, block-major: xd[i * ld + t], with
 * ld >= n rounded up to 4 and zeros past n. nr * (cols / 32) * 2 must not
 * exceed SL__GEMM_WSC_MAX (the weight scales are converted once, on the
 * stack). */
#define SL__GEMM_WSC_MAX 8192
typedef void (*sl__gemm_fn)(int64_t cols, const void *w, size_t w_stride,
                            int64_t nr, const void *x, size_t x_stride,
                            const float *xd, const float *xsum, int64_t ld,
                            int64_t n, float *y, size_t y_stride);

/* ---- repacked weights (kern_cpu_repack.c writes them) -----------------------
 *
 * Groups of SL__PACK_ROWS rows; per 32-element block position i, one group
 * block holding the block i of each of the 8 rows (rows past the matrix's
 * end: zeros), the groups' blocks contiguous (group g's block i at
 * (g * nb + i) * group block bytes). Element e of step s means quant 4s + e
 * (s = 0..7) of a row; "4-byte runs" put row r's 4 bytes at bytes 4r..4r+3
 * of a 32-byte vector, so one load carries the same four elements of all 8
 * rows. */
#define SL__PACK_ROWS SL_KERN_PACK_ROWS
typedef struct {
  uint16_t d[8];       /* f16 scales of rows 0..7 */
  uint8_t qs[4][8][4]; /* qs[j][r][e] = row r's qs[4j + e]: low nibbles step
                        * j, high nibbles step j + 4 */
} sl__pack_q4_0;       /* 144 B = 8 Q4_0 blocks; IQ4_NL the same */
typedef struct {
  uint16_t d[8];
  int8_t qs[8][8][4]; /* qs[s][r][e] = row r's qs[4s + e] */
} sl__pack_q8_0;      /* 272 B */
typedef struct {
  uint16_t d[8];
  /* qh[r][e]: bit 2j = the fifth bit of row r's element 4j + e, bit 2j + 1
   * that of element 16 + 4j + e (j = 0..3): the byte lines up with
   * qs[j][r][e] */
  uint8_t qh[8][4];
  uint8_t qs[4][8][4]; /* as Q4_0 */
} sl__pack_q5_0;       /* 176 B */
/* Q4_1 and Q5_1: Q4_0's and Q5_0's layouts with the rows' f16 minimums m
 * after their scales d. */
typedef struct {
  uint16_t d[8], m[8];
  uint8_t qs[4][8][4]; /* as Q4_0 */
} sl__pack_q4_1;       /* 160 B = 8 Q4_1 blocks */
typedef struct {
  uint16_t d[8], m[8];
  uint8_t qh[8][4];    /* as Q5_0 */
  uint8_t qs[4][8][4]; /* as Q4_0 */
} sl__pack_q5_1;       /* 192 B = 8 Q5_1 blocks */
/* The K-quants: one group block per 256-element super-block position.
 * Sub-block j (32 elements) of a Q4_K row is its elements 32j..32j+31. */
typedef struct {
  uint16_t d[8], dmin[8]; /* f16, as in the rows' blocks */
  uint8_t sc[8][8];       /* sc[j][r]: row r's 6-bit scale of sub-block j */
  uint8_t m[4][8][2];     /* m[k][r][h]: row r's 6-bit min of sub-block
                           * 2k + h (pairs, for madd with the token's sums) */
  /* qs[c][s][r][e] = row r's qs[32c + 4s + e]: the low nibble is element
   * 64c + 4s + e (sub-block 2c), the high one element 64c + 32 + 4s + e
   * (sub-block 2c + 1) */
  uint8_t qs[4][8][8][4];
} sl__pack_q4_K; /* 1184 B = 8 x 148 (a Q4_K block: 144) */
typedef struct {
  uint16_t d[8];       /* f16 */
  int8_t sc[16][8];    /* sc[g][r]: row r's scale of elements 16g..16g+15 */
  int8_t qs[64][8][4]; /* qs[s][r][e] = row r's quant 4s + e, minus 32
                        * (ql and qh combined: -32..31) */
} sl__pack_q6_K;       /* 2192 B = 8 x 274 (a Q6_K block: 210) */

/* The product of one group of packed rows with a tile of tokens:
 * y[t * y_stride + r] = dot(row r, token t) for r < nr (1..8), t < nt
 * (1..SL__NT_MAX). wg: the group's first group block; nb: blocks per row
 * (32-element blocks, or 256-element super-blocks for the K-quants).
 * x: the activation rows of the tile's tokens (x_stride bytes apart), Q8_0
 * or, for the K-quants, Q8_K. For Q8_0, xd[i * ld + t] are their block
 * scales as floats, xsum[i * ld + t] the sums of their blocks' int8 quants;
 * for Q8_K both are NULL (the kernel reads d and bsums from the blocks).
 * Each entry sums its blocks in one order, the same for every nt and every
 * tile the token lands in. */
typedef void (*sl__packed_fn)(int64_t nb, const void *wg, const void *x,
                              size_t x_stride, const float *xd,
                              const int32_t *xsum, int64_t ld, float *y,
                              size_t y_stride, int nr, int nt);

/* Bytes of one group block of weight type t (0: t has no packed layout). */
size_t sl__pack_block_bytes(sl_ggml_type t);
/* Elements per block of weight type t's packed layout (32, or 256 for the
 * K-quants). */
int64_t sl__pack_block_elems(sl_ggml_type t);

typedef struct sl__kern_cpu_ops {
  sl__dequant_fn dequant[SL__NTYPES];
  sl__quant_fn quant[SL__NTYPES]; /* by activation type */
  sl__dot_fn dot[SL__NTYPES];     /* by weight type */
  sl__gemm_fn gemm[SL__NTYPES];   /* by weight type; NULL: dot row by row */
  /* by weight type: the gemm also takes one token (it beats the dot there),
   * and prefers chunks of a multiple of 8 rows */
  bool gemm_one[SL__NTYPES];
  /* by weight type: the kernel over sl_kern_repack's layout; NULL: none */
  sl__packed_fn packed[SL__NTYPES];
  void (*rmsnorm)(float *out, const float *x, const float *w, int64_t n,
                  float eps);
  /* cs/sn: n_rot/2 cos and sin values */
  void (*rope)(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot,
               const float *cs, const float *sn, int neox);
  void (*softmax)(float *x, int64_t n);
  void (*swiglu)(float *out, const float *g, const float *u, int64_t n);
  void (*add)(float *out, const float *a, const float *b, int64_t n);
  void (*f32_to_f16)(uint16_t *dst, const float *src, int64_t n);
  /* sl_kern_attn_f16_paged after its checks: row p of K is
   * kb[p >> bs] + (p & ((1 << bs) - 1)) * kv_stride, likewise V */
  void (*attn_f16)(float *out, const float *q, const uint16_t *const *kb,
                   const uint16_t *const *vb, int bs, int64_t head_dim,
                   int64_t len, int64_t kv_stride, float scale, bool single,
                   float *scratch);
} sl__kern_cpu_ops;

/* Per-ISA tables; a NULL entry falls back to the scalar one. */
extern const sl__kern_cpu_ops sl__kern_cpu_scalar_ops;
extern const sl__kern_cpu_ops sl__kern_cpu_avx2_ops;
extern const sl__kern_cpu_ops sl__kern_cpu_avx512_ops;
/* The VNNI overlays (vnni_body.h, compiled twice): merged into the AVX2
 * table for avxvnni, into the AVX-512 one for avx512vnni. */
extern const sl__kern_cpu_ops sl__kern_cpu_avxvnni_ops;
extern const sl__kern_cpu_ops sl__kern_cpu_avx512vnni_ops;
/* kern_cpu_avx512vnni4.c: the avxvnni tiling, EVEX-encoded; tests only */
extern const sl__kern_cpu_ops sl__kern_cpu_avx512vnni4_ops;
/* Overlays merged into the scalar / AVX2 tables (kern_cpu_q5.c,
 * kern_cpu_q5_avx2.c): Q5_0, Q5_1 and IQ4_NL. */
extern const sl__kern_cpu_ops sl__kern_cpu_q5_scalar_ops;
extern const sl__kern_cpu_ops sl__kern_cpu_q5_avx2_ops;
/* packed_body.h, compiled three times: the packed kernels of the AVX2 table
 * (kern_cpu_packed_avx2.c) and of the VNNI levels (kern_cpu_packed_avxvnni.c,
 * kern_cpu_packed_avx512vnni.c); the three give the same bits */
extern const sl__packed_fn sl__kern_cpu_avx2_packed[SL__NTYPES];
extern const sl__packed_fn sl__kern_cpu_avxvnni_packed[SL__NTYPES];
extern const sl__packed_fn sl__kern_cpu_avx512vnni_packed[SL__NTYPES];
/* kern_cpu_gemm_avx2.c: the AVX2 table's gemm entries */
extern const sl__gemm_fn sl__kern_cpu_avx2_gemm[SL__NTYPES];

/* The table in use (all entries filled). */
const sl__kern_cpu_ops *sl__kern_cpu_ops_get(void);

/* Scratch space owned by a pool (NULL pool: thread-local). Returns NULL when
 * it cannot grow to `bytes`. Valid until the next call on the same pool. */
void *sl__kern_pool_scratch(sl_kern_pool_t *pool, size_t bytes);

#endif
