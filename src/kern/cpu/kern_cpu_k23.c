/* sluice — kern/cpu: scalar dequantization and dots of Q2_K, Q3_K and IQ4_XS
 * (layouts in kern_cpu_k23.h, after ggml's ggml-common.h). The reference the
 * AVX2 dots are tested against; reached through the scalar op table.
 *
 * Element e of a 256-element block, for Q2_K and Q3_K: e = 128 h + 32 j + l
 * (h < 2, j < 4, l < 32) takes bits 2j..2j+1 of qs[32 h + l]; its scale is
 * number e / 16. Q3_K's third bit is bit 4h + j of hmask[l]. IQ4_XS: the
 * 32-element sub-block ib holds qs[16 ib ..], low nibbles its first 16
 * elements, high nibbles the next 16. */
#include "kern_cpu_k23.h"

const int8_t sl__kvalues_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};

/* The 256 2-bit quants of a Q2_K / Q3_K block, in element order. */
static void unpack_2bit(const uint8_t *qs, uint8_t *q) {
  for (int h = 0; h < 2; h++)
    for (int j = 0; j < 4; j++)
      for (int l = 0; l < 32; l++)
        q[128 * h + 32 * j + l] = (qs[32 * h + l] >> (2 * j)) & 3;
}

/* Q3_K's signed quants (-4..3), in element order. */
static void unpack_q3_K(const sl__block_q3_K *b, int8_t *q) {
  uint8_t lo[SL__QK_K];
  unpack_2bit(b->qs, lo);
  for (int e = 0; e < SL__QK_K; e++) {
    int bit = (b->hmask[e % 32] >> (e / 32)) & 1;
    q[e] = (int8_t)(lo[e] - (bit ? 0 : 4));
  }
}

void sl__dq_q2_K(const void *src, float *dst, int64_t n) {
  const sl__block_q2_K *b = src;
  uint8_t q[SL__QK_K];
  for (int64_t i = 0; i < n / SL__QK_K; i++, dst += SL__QK_K) {
    float d = sl__f16_to_f32(b[i].d), dmin = sl__f16_to_f32(b[i].dmin);
    unpack_2bit(b[i].qs, q);
    for (int g = 0; g < 16; g++) {
      float dl = d * (float)(b[i].scales[g] & 0xF);
      float ml = dmin * (float)(b[i].scales[g] >> 4);
      for (int l = 0; l < 16; l++)
        dst[16 * g + l] = dl * (float)q[16 * g + l] - ml;
    }
  }
}

void sl__dq_q3_K(const void *src, float *dst, int64_t n) {
  const sl__block_q3_K *b = src;
  int8_t q[SL__QK_K], sc[16];
  for (int64_t i = 0; i < n / SL__QK_K; i++, dst += SL__QK_K) {
    float d = sl__f16_to_f32(b[i].d);
    unpack_q3_K(&b[i], q);
    sl__q3_K_scales(b[i].scales, sc);
    for (int g = 0; g < 16; g++) {
      float dl = d * (float)sc[g];
      for (int l = 0; l < 16; l++)
        dst[16 * g + l] = dl * (float)q[16 * g + l];
    }
  }
}

void sl__dq_iq4_xs(const void *src, float *dst, int64_t n) {
  const sl__block_iq4_xs *b = src;
  for (int64_t i = 0; i < n / SL__QK_K; i++) {
    float d = sl__f16_to_f32(b[i].d);
    for (int ib = 0; ib < 8; ib++, dst += 32) {
      float dl = d * (float)sl__iq4_xs_scale(&b[i], ib);
      const uint8_t *qs = b[i].qs + 16 * ib;
      for (int j = 0; j < 16; j++) {
        dst[j] = dl * (float)sl__kvalues_iq4[qs[j] & 0xF];
        dst[j + 16] = dl * (float)sl__kvalues_iq4[qs[j] >> 4];
      }
    }
  }
}

/* ---- dots: integer sums per block, then one float product per block (two
 * for Q2_K's mins), added in block order. */

static float dot1_q2_K(int64_t n, const void *w, const void *xv) {
  const sl__block_q2_K *a = w;
  const sl__block_q8_K *x = xv;
  uint8_t q[SL__QK_K];
  float s = 0;
  for (int64_t i = 0; i < n / SL__QK_K; i++) {
    unpack_2bit(a[i].qs, q);
    int sumi = 0, summ = 0;
    for (int g = 0; g < 16; g++) {
      int s16 = 0;
      for (int l = 0; l < 16; l++)
        s16 += q[16 * g + l] * x[i].qs[16 * g + l];
      sumi += (a[i].scales[g] & 0xF) * s16;
      summ += (a[i].scales[g] >> 4) * x[i].bsums[g];
    }
    s += x[i].d * (sl__f16_to_f32(a[i].d) * (float)sumi -
                   sl__f16_to_f32(a[i].dmin) * (float)summ);
  }
  return s;
}

static float dot1_q3_K(int64_t n, const void *w, const void *xv) {
  const sl__block_q3_K *a = w;
  const sl__block_q8_K *x = xv;
  int8_t q[SL__QK_K], sc[16];
  float s = 0;
  for (int64_t i = 0; i < n / SL__QK_K; i++) {
    unpack_q3_K(&a[i], q);
    sl__q3_K_scales(a[i].scales, sc);
    int sumi = 0;
    for (int g = 0; g < 16; g++) {
      int s16 = 0;
      for (int l = 0; l < 16; l++)
        s16 += q[16 * g + l] * x[i].qs[16 * g + l];
      sumi += sc[g] * s16;
    }
    s += sl__f16_to_f32(a[i].d) * x[i].d * (float)sumi;
  }
  return s;
}

static float dot1_iq4_xs(int64_t n, const void *w, const void *xv) {
  const sl__block_iq4_xs *a = w;
  const sl__block_q8_K *x = xv;
  float s = 0;
  for (int64_t i = 0; i < n / SL__QK_K; i++) {
    int sumi = 0;
    for (int ib = 0; ib < 8; ib++) {
      const uint8_t *qs = a[i].qs + 16 * ib;
      const int8_t *xq = x[i].qs + 32 * ib;
      int s32 = 0;
      for (int j = 0; j < 16; j++)
        s32 += sl__kvalues_iq4[qs[j] & 0xF] * xq[j] +
               sl__kvalues_iq4[qs[j] >> 4] * xq[j + 16];
      sumi += sl__iq4_xs_scale(&a[i], ib) * s32;
    }
    s += sl__f16_to_f32(a[i].d) * x[i].d * (float)sumi;
  }
  return s;
}

SL__DOT_ROWS(extern, sl__dot_q2_K, dot1_q2_K)
SL__DOT_ROWS(extern, sl__dot_q3_K, dot1_q3_K)
SL__DOT_ROWS(extern, sl__dot_iq4_xs, dot1_iq4_xs)
