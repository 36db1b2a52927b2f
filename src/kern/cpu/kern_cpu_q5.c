/* sluice — kern/cpu: the scalar reference for the 32-element types Q5_0,
 * Q5_1 and IQ4_NL (dequantization and dots; Q5_0 and IQ4_NL against Q8_0
 * activations, Q5_1 against Q8_1, as ggml pairs them). An overlay that
 * kern_cpu.c merges into the scalar table; the AVX2 versions are in
 * kern_cpu_q5_avx2.c. */
#include "kern_cpu_impl.h"

/* Element j (0..31) of a Q5 block, 0..31: the low nibbles hold elements
 * 0..15, the high ones 16..31, and bit j of qh is the fifth bit. */
static inline int q5_at(const uint8_t *qs, uint32_t qh, int j) {
  int lo = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
  return lo | (int)((qh >> j) & 1) << 4;
}

static inline uint32_t qh_of(const uint8_t *qh) {
  return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
         (uint32_t)qh[3] << 24;
}

static inline int iq4nl_at(const uint8_t *qs, int j) {
  return sl__kvalues_iq4nl[j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4];
}

/* ---- dequantization -------------------------------------------------------
 */

static void dq_q5_0(const void *src, float *dst, int64_t n) {
  const sl__block_q5_0 *b = src;
  for (int64_t i = 0; i < n / SL__QK; i++, dst += SL__QK) {
    float d = sl__f16_to_f32(b[i].d);
    uint32_t qh = qh_of(b[i].qh);
    for (int j = 0; j < SL__QK; j++)
      dst[j] = (float)(q5_at(b[i].qs, qh, j) - 16) * d;
  }
}

static void dq_q5_1(const void *src, float *dst, int64_t n) {
  const sl__block_q5_1 *b = src;
  for (int64_t i = 0; i < n / SL__QK; i++, dst += SL__QK) {
    float d = sl__f16_to_f32(b[i].d), m = sl__f16_to_f32(b[i].m);
    uint32_t qh = qh_of(b[i].qh);
    for (int j = 0; j < SL__QK; j++)
      dst[j] = (float)q5_at(b[i].qs, qh, j) * d + m;
  }
}

static void dq_iq4_nl(const void *src, float *dst, int64_t n) {
  const sl__block_iq4_nl *b = src;
  for (int64_t i = 0; i < n / SL__QK; i++, dst += SL__QK) {
    float d = sl__f16_to_f32(b[i].d);
    for (int j = 0; j < SL__QK; j++)
      dst[j] = (float)iq4nl_at(b[i].qs, j) * d;
  }
}

/* ---- dots -----------------------------------------------------------------
 * Per block an exact integer sum, then one float product and sum, as the
 * scalar Q4_0 / Q4_1 dots. */

static float dot1_q5_0(int64_t n, const void *w, const void *xv) {
  const sl__block_q5_0 *a = w;
  const sl__block_q8_0 *x = xv;
  float s = 0;
  for (int64_t i = 0; i < n / SL__QK; i++) {
    uint32_t qh = qh_of(a[i].qh);
    int sumi = 0;
    for (int j = 0; j < SL__QK; j++)
      sumi += (q5_at(a[i].qs, qh, j) - 16) * x[i].qs[j];
    s += (float)sumi * sl__f16_to_f32(a[i].d) * sl__f16_to_f32(x[i].d);
  }
  return s;
}

static float dot1_q5_1(int64_t n, const void *w, const void *xv) {
  const sl__block_q5_1 *a = w;
  const sl__block_q8_1 *x = xv;
  float s = 0;
  for (int64_t i = 0; i < n / SL__QK; i++) {
    uint32_t qh = qh_of(a[i].qh);
    int sumi = 0;
    for (int j = 0; j < SL__QK; j++)
      sumi += q5_at(a[i].qs, qh, j) * x[i].qs[j];
    s += sl__f16_to_f32(a[i].d) * sl__f16_to_f32(x[i].d) * (float)sumi +
         sl__f16_to_f32(a[i].m) * sl__f16_to_f32(x[i].s);
  }
  return s;
}

static float dot1_iq4_nl(int64_t n, const void *w, const void *xv) {
  const sl__block_iq4_nl *a = w;
  const sl__block_q8_0 *x = xv;
  float s = 0;
  for (int64_t i = 0; i < n / SL__QK; i++) {
    int sumi = 0;
    for (int j = 0; j < SL__QK; j++)
      sumi += iq4nl_at(a[i].qs, j) * x[i].qs[j];
    s += (float)sumi * sl__f16_to_f32(a[i].d) * sl__f16_to_f32(x[i].d);
  }
  return s;
}

SL__DOT_ROWS(static, dot_q5_0, dot1_q5_0)
SL__DOT_ROWS(static, dot_q5_1, dot1_q5_1)
SL__DOT_ROWS(static, dot_iq4_nl, dot1_iq4_nl)

const sl__kern_cpu_ops sl__kern_cpu_q5_scalar_ops = {
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
