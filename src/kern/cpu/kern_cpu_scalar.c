/* sluice — kern/cpu: the scalar reference for every op. Other ISAs are tested
 * against these. Compiled for generic x86-64 (and any other target). */
#include "kern_cpu_k23.h"

/* ---- dequantization -------------------------------------------------------
 */

static void dq_f32(const void *src, float *dst, int64_t n) {
  memcpy(dst, src, (size_t)n * sizeof(float));
}

static void dq_f16(const void *src, float *dst, int64_t n) {
  const uint16_t *s = src;
  for (int64_t i = 0; i < n; i++)
    dst[i] = sl__f16_to_f32(s[i]);
}

static void dq_bf16(const void *src, float *dst, int64_t n) {
  const uint16_t *s = src;
  for (int64_t i = 0; i < n; i++)
    dst[i] = sl__bf16_to_f32(s[i]);
}

static void dq_q4_0(const void *src, float *dst, int64_t n) {
  const sl__block_q4_0 *b = src;
  for (int64_t i = 0; i < n / SL__QK; i++, dst += SL__QK) {
    float d = sl__f16_to_f32(b[i].d);
    for (int j = 0; j < SL__QK / 2; j++) {
      dst[j] = (float)((b[i].qs[j] & 0xF) - 8) * d;
      dst[j + 16] = (float)((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

static void dq_q4_1(const void *src, float *dst, int64_t n) {
  const sl__block_q4_1 *b = src;
  for (int64_t i = 0; i < n / SL__QK; i++, dst += SL__QK) {
    float d = sl__f16_to_f32(b[i].d), m = sl__f16_to_f32(b[i].m);
    for (int j = 0; j < SL__QK / 2; j++) {
      dst[j] = (float)(b[i].qs[j] & 0xF) * d + m;
      dst[j + 16] = (float)(b[i].qs[j] >> 4) * d + m;
    }
  }
}

static void dq_q8_0(const void *src, float *dst, int64_t n) {
  const sl__block_q8_0 *b = src;
  for (int64_t i = 0; i < n / SL__QK; i++, dst += SL__QK) {
    float d = sl__f16_to_f32(b[i].d);
    for (int j = 0; j < SL__QK; j++)
      dst[j] = (float)b[i].qs[j] * d;
  }
}

static void dq_q8_1(const void *src, float *dst, int64_t n) {
  const sl__block_q8_1 *b = src;
  for (int64_t i = 0; i < n / SL__QK; i++, dst += SL__QK) {
    float d = sl__f16_to_f32(b[i].d);
    for (int j = 0; j < SL__QK; j++)
      dst[j] = (float)b[i].qs[j] * d;
  }
}

static void dq_q8_K(const void *src, float *dst, int64_t n) {
  const sl__block_q8_K *b = src;
  for (int64_t i = 0; i < n / SL__QK_K; i++, dst += SL__QK_K)
    for (int j = 0; j < SL__QK_K; j++)
      dst[j] = (float)b[i].qs[j] * b[i].d;
}

static void dq_q4_K(const void *src, float *dst, int64_t n) {
  const sl__block_q4_K *b = src;
  for (int64_t i = 0; i < n / SL__QK_K; i++) {
    float d = sl__f16_to_f32(b[i].d), dmin = sl__f16_to_f32(b[i].dmin);
    const uint8_t *q = b[i].qs;
    for (int j = 0; j < SL__QK_K; j += 64, q += 32) {
      uint8_t sc, m;
      sl__scale_min_k4(j / 32, b[i].scales, &sc, &m);
      float d1 = d * sc, m1 = dmin * m;
      sl__scale_min_k4(j / 32 + 1, b[i].scales, &sc, &m);
      float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; l++)
        *dst++ = d1 * (float)(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; l++)
        *dst++ = d2 * (float)(q[l] >> 4) - m2;
    }
  }
}

static void dq_q5_K(const void *src, float *dst, int64_t n) {
  const sl__block_q5_K *b = src;
  for (int64_t i = 0; i < n / SL__QK_K; i++) {
    float d = sl__f16_to_f32(b[i].d), dmin = sl__f16_to_f32(b[i].dmin);
    const uint8_t *ql = b[i].qs, *qh = b[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < SL__QK_K; j += 64, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      sl__scale_min_k4(j / 32, b[i].scales, &sc, &m);
      float d1 = d * sc, m1 = dmin * m;
      sl__scale_min_k4(j / 32 + 1, b[i].scales, &sc, &m);
      float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; l++)
        *dst++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; l++)
        *dst++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

static void dq_q6_K(const void *src, float *dst, int64_t n) {
  const sl__block_q6_K *b = src;
  for (int64_t i = 0; i < n / SL__QK_K; i++) {
    float d = sl__f16_to_f32(b[i].d);
    const uint8_t *ql = b[i].ql, *qh = b[i].qh;
    const int8_t *sc = b[i].scales;
    for (int h = 0; h < 2; h++, dst += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; l++) {
        int is = l / 16;
        int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        dst[l] = d * (float)sc[is] * (float)q1;
        dst[l + 32] = d * (float)sc[is + 2] * (float)q2;
        dst[l + 64] = d * (float)sc[is + 4] * (float)q3;
        dst[l + 96] = d * (float)sc[is + 6] * (float)q4;
      }
    }
  }
}

/* ---- activation quantization ----------------------------------------------
 * Q8_0 / Q8_1 as ggml's x86 quantize_row_q8_0 / q8_1 (the ones llama.cpp runs
 * on these CPUs; its *_ref versions differ in the last bit now and then):
 * d = amax / 127, q = round-half-even(x * (127 / amax)), s = d * sum(q) with
 * the float d. Q8_K as quantize_row_q8_K_ref. */

static void qa_f32(const float *x, void *dst, int64_t n) {
  memcpy(dst, x, (size_t)n * sizeof(float));
}

static void qa_q8_0(const float *x, void *dst, int64_t n) {
  sl__block_q8_0 *b = dst;
  for (int64_t i = 0; i < n / SL__QK; i++, x += SL__QK) {
    float amax = 0;
    for (int j = 0; j < SL__QK; j++)
      amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    b[i].d = sl__f32_to_f16(d);
    for (int j = 0; j < SL__QK; j++)
      b[i].qs[j] = (int8_t)nearbyintf(x[j] * id);
  }
}

static void qa_q8_1(const float *x, void *dst, int64_t n) {
  sl__block_q8_1 *b = dst;
  for (int64_t i = 0; i < n / SL__QK; i++, x += SL__QK) {
    float amax = 0;
    for (int j = 0; j < SL__QK; j++)
      amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < SL__QK; j++) {
      b[i].qs[j] = (int8_t)nearbyintf(x[j] * id);
      sum += b[i].qs[j];
    }
    b[i].d = sl__f32_to_f16(d);
    b[i].s = sl__f32_to_f16((float)sum * d);
  }
}

static void qa_q8_K(const float *x, void *dst, int64_t n) {
  sl__block_q8_K *b = dst;
  for (int64_t i = 0; i < n / SL__QK_K; i++, x += SL__QK_K) {
    float max = 0, amax = 0;
    for (int j = 0; j < SL__QK_K; j++)
      if (fabsf(x[j]) > amax) {
        amax = fabsf(x[j]);
        max = x[j];
      }
    if (amax == 0.0f) {
      memset(&b[i], 0, sizeof b[i]);
      continue;
    }
    float iscale = -127.0f / max;
    for (int j = 0; j < SL__QK_K; j++) {
      long v = lrintf(iscale * x[j]); /* nearest, ties to even */
      b[i].qs[j] = (int8_t)(v > 127 ? 127 : v);
    }
    for (int g = 0; g < SL__QK_K / 16; g++) {
      int s = 0;
      for (int j = 0; j < 16; j++)
        s += b[i].qs[g * 16 + j];
      b[i].bsums[g] = (int16_t)s;
    }
    b[i].d = 1.0f / iscale;
  }
}

/* ---- dots -----------------------------------------------------------------
 */

static float dot1_f32(int64_t n, const void *w, const float *x) {
  const float *a = w;
  float s = 0;
  for (int64_t i = 0; i < n; i++)
    s += a[i] * x[i];
  return s;
}

static float dot1_f16(int64_t n, const void *w, const float *x) {
  const uint16_t *a = w;
  float s = 0;
  for (int64_t i = 0; i < n; i++)
    s += sl__f16_to_f32(a[i]) * x[i];
  return s;
}

static float dot1_bf16(int64_t n, const void *w, const float *x) {
  const uint16_t *a = w;
  float s = 0;
  for (int64_t i = 0; i < n; i++)
    s += sl__bf16_to_f32(a[i]) * x[i];
  return s;
}

static float dot1_q4_0(int64_t n, const void *w, const void *xv) {
  const sl__block_q4_0 *a = w;
  const sl__block_q8_0 *x = xv;
  float s = 0;
  for (int64_t i = 0; i < n / SL__QK; i++) {
    int sumi = 0;
    for (int j = 0; j < 16; j++)
      sumi += ((a[i].qs[j] & 0xF) - 8) * x[i].qs[j] +
              ((a[i].qs[j] >> 4) - 8) * x[i].qs[j + 16];
    s += (float)sumi * sl__f16_to_f32(a[i].d) * sl__f16_to_f32(x[i].d);
  }
  return s;
}

static float dot1_q4_1(int64_t n, const void *w, const void *xv) {
  const sl__block_q4_1 *a = w;
  const sl__block_q8_1 *x = xv;
  float s = 0;
  for (int64_t i = 0; i < n / SL__QK; i++) {
    int sumi = 0;
    for (int j = 0; j < 16; j++)
      sumi +=
          (a[i].qs[j] & 0xF) * x[i].qs[j] + (a[i].qs[j] >> 4) * x[i].qs[j + 16];
    s += sl__f16_to_f32(a[i].d) * sl__f16_to_f32(x[i].d) * (float)sumi +
         sl__f16_to_f32(a[i].m) * sl__f16_to_f32(x[i].s);
  }
  return s;
}

static float dot1_q8_0(int64_t n, const void *w, const void *xv) {
  const sl__block_q8_0 *a = w;
  const sl__block_q8_0 *x = xv;
  float s = 0;
  for (int64_t i = 0; i < n / SL__QK; i++) {
    int sumi = 0;
    for (int j = 0; j < SL__QK; j++)
      sumi += a[i].qs[j] * x[i].qs[j];
    s += (float)sumi * sl__f16_to_f32(a[i].d) * sl__f16_to_f32(x[i].d);
  }
  return s;
}

/* Shared by Q4_K and Q5_K: q[256] unsigned quants, 8 scales and mins. */
static float dot_kmin_block(const uint8_t *q, const uint8_t *scales, float d,
                            float dmin, const sl__block_q8_K *x) {
  int sumi = 0, summ = 0;
  for (int j = 0; j < 8; j++) {
    uint8_t sc, m;
    sl__scale_min_k4(j, scales, &sc, &m);
    int s = 0;
    for (int l = 0; l < 32; l++)
      s += q[j * 32 + l] * x->qs[j * 32 + l];
    sumi += sc * s;
    summ += m * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
  }
  return x->d * (d * (float)sumi - dmin * (float)summ);
}

static float dot1_q4_K(int64_t n, const void *w, const void *xv) {
  const sl__block_q4_K *a = w;
  const sl__block_q8_K *x = xv;
  float s = 0;
  uint8_t q[SL__QK_K];
  for (int64_t i = 0; i < n / SL__QK_K; i++) {
    for (int j = 0; j < 4; j++)
      for (int l = 0; l < 32; l++) {
        q[j * 64 + l] = a[i].qs[j * 32 + l] & 0xF;
        q[j * 64 + 32 + l] = a[i].qs[j * 32 + l] >> 4;
      }
    s += dot_kmin_block(q, a[i].scales, sl__f16_to_f32(a[i].d),
                        sl__f16_to_f32(a[i].dmin), &x[i]);
  }
  return s;
}

static float dot1_q5_K(int64_t n, const void *w, const void *xv) {
  const sl__block_q5_K *a = w;
  const sl__block_q8_K *x = xv;
  float s = 0;
  uint8_t q[SL__QK_K];
  for (int64_t i = 0; i < n / SL__QK_K; i++) {
    for (int j = 0; j < 4; j++)
      for (int l = 0; l < 32; l++) {
        uint8_t h = a[i].qh[l];
        q[j * 64 + l] = (uint8_t)((a[i].qs[j * 32 + l] & 0xF) |
                                  (((h >> (2 * j)) & 1) << 4));
        q[j * 64 + 32 + l] = (uint8_t)((a[i].qs[j * 32 + l] >> 4) |
                                       (((h >> (2 * j + 1)) & 1) << 4));
      }
    s += dot_kmin_block(q, a[i].scales, sl__f16_to_f32(a[i].d),
                        sl__f16_to_f32(a[i].dmin), &x[i]);
  }
  return s;
}

static float dot1_q6_K(int64_t n, const void *w, const void *xv) {
  const sl__block_q6_K *a = w;
  const sl__block_q8_K *x = xv;
  float s = 0;
  int8_t q[SL__QK_K];
  for (int64_t i = 0; i < n / SL__QK_K; i++) {
    const uint8_t *ql = a[i].ql, *qh = a[i].qh;
    for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
      int8_t *o = q + h * 128;
      for (int l = 0; l < 32; l++) {
        o[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        o[l + 32] =
            (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        o[l + 96] =
            (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
    int sumi = 0;
    for (int g = 0; g < 16; g++) {
      int s16 = 0;
      for (int l = 0; l < 16; l++)
        s16 += q[g * 16 + l] * x[i].qs[g * 16 + l];
      sumi += a[i].scales[g] * s16;
    }
    s += sl__f16_to_f32(a[i].d) * x[i].d * (float)sumi;
  }
  return s;
}

SL__DOT_ROWS(static, dot_f32, dot1_f32)
SL__DOT_ROWS(static, dot_f16, dot1_f16)
SL__DOT_ROWS(static, dot_bf16, dot1_bf16)
SL__DOT_ROWS(static, dot_q4_0, dot1_q4_0)
SL__DOT_ROWS(static, dot_q4_1, dot1_q4_1)
SL__DOT_ROWS(static, dot_q8_0, dot1_q8_0)
SL__DOT_ROWS(static, dot_q4_K, dot1_q4_K)
SL__DOT_ROWS(static, dot_q5_K, dot1_q5_K)
SL__DOT_ROWS(static, dot_q6_K, dot1_q6_K)

/* ---- small ops ------------------------------------------------------------
 */

/* As ggml: squares in float summed in double, the mean and the scale in
 * float. */
static void rmsnorm(float *out, const float *x, const float *w, int64_t n,
                    float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; i++)
    ss += (double)(x[i] * x[i]);
  float mean = (float)(ss / (double)n);
  float scale = 1.0f / sqrtf(mean + eps);
  for (int64_t i = 0; i < n; i++)
    out[i] = x[i] * scale * (w ? w[i] : 1.0f);
}

static void rope(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot,
                 const float *cs, const float *sn, int neox) {
  int64_t half = n_rot / 2;
  for (int64_t h = 0; h < n_heads; h++) {
    float *v = x + h * head_dim;
    for (int64_t i = 0; i < half; i++) {
      int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
      float x0 = v[a], x1 = v[b];
      /* as ggml compiles it (contracted to fma) */
      v[a] = fmaf(x0, cs[i], -(x1 * sn[i]));
      v[b] = fmaf(x0, sn[i], x1 * cs[i]);
    }
  }
}

static void softmax(float *x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; i++)
    max = fmaxf(max, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; i++) {
    x[i] = expf(x[i] - max);
    sum += x[i];
  }
  float inv = (float)(1.0 / sum);
  for (int64_t i = 0; i < n; i++)
    x[i] *= inv;
}

static void swiglu(float *out, const float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void add(float *out, const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    out[i] = a[i] + b[i];
}

static void f32_to_f16(uint16_t *dst, const float *src, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    dst[i] = sl__f32_to_f16(src[i]);
}

/* Partial sums added up in the order of ggml's AVX2 reductions. reduce8: the
 * 8 lanes of one register (tinyBLAS's hsum): ((l0 + l4) + (l2 + l6)) +
 * ((l1 + l5) + (l3 + l7)). reduce32: the 4 registers of ggml_vec_dot_f16
 * (element i in register (i % 32) / 8, lane i % 8), then two hadds. */
static float reduce8(const float *l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}
static float reduce32(const float *l) {
  float a[8];
  for (int j = 0; j < 8; j++)
    a[j] = (l[j] + l[16 + j]) + (l[8 + j] + l[24 + j]);
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* sum of prod[0..n) as ggml sums a dot product: gemm (tinyBLAS, n % 8 == 0)
 * or ggml_vec_dot_f16 (the tail past a multiple of 32 in double). Products
 * of two halves are exact in float, so this equals the fma chains. */
static float osum(const float *prod, int64_t n, bool gemm) {
  if (gemm && n % 8 == 0) {
    float l[8] = {0};
    for (int64_t i = 0; i < n; i++)
      l[i % 8] += prod[i];
    return reduce8(l);
  }
  int64_t n32 = n - n % 32;
  float l[32] = {0};
  for (int64_t i = 0; i < n32; i++)
    l[i % 32] += prod[i];
  double s = reduce32(l);
  for (int64_t i = n32; i < n; i++)
    s += prod[i];
  return (float)s;
}

static void attn_f16(float *out, const float *q, const uint16_t *const *kb,
                     const uint16_t *const *vb, int bs, int64_t hd, int64_t len,
                     int64_t stride, float scale, bool single, float *sc) {
  const int64_t bm = ((int64_t)1 << bs) - 1;
#define KROW(p) (kb[(p) >> bs] + ((p)&bm) * stride)
#define VROW(p) (vb[(p) >> bs] + ((p)&bm) * stride)
  const bool gemm = !single;
  float q16[SL_KERN_ATTN_MAX_HEAD_DIM], prod[SL_KERN_ATTN_MAX_HEAD_DIM];
  for (int64_t i = 0; i < hd; i++)
    q16[i] = sl__f16_to_f32(sl__f32_to_f16(q[i]));
  float mx = -INFINITY;
  for (int64_t p = 0; p < len; p++) {
    const uint16_t *kp = KROW(p);
    for (int64_t i = 0; i < hd; i++)
      prod[i] = q16[i] * sl__f16_to_f32(kp[i]);
    sc[p] = osum(prod, hd, gemm) * scale;
    mx = fmaxf(mx, sc[p]);
  }
  /* exp, summed 8 at a time in float, those sums in double (as ggml's AVX2
   * softmax over its padded row: zeros past len) */
  const int64_t lpad = (len + 31) & ~(int64_t)31;
  double sum = 0;
  for (int64_t p = 0; p < lpad; p += 8) {
    for (int64_t j = p; j < p + 8; j++)
      sc[j] = j < len ? expf(sc[j] - mx) : 0.0f;
    sum += reduce8(sc + p);
  }
  float inv = (float)(1.0 / sum);
  for (int64_t p = 0; p < len; p++)
    sc[p] = sl__f16_to_f32(sl__f32_to_f16(sc[p] * inv));
  /* out[i] = dot(a, v[.][i]) over the padded row, in the same order */
  const int nl = gemm ? 8 : 32;
  for (int64_t i = 0; i < hd; i++) {
    float l[32] = {0};
    for (int64_t p = 0; p < len; p++)
      l[p % nl] += sc[p] * sl__f16_to_f32(VROW(p)[i]);
    out[i] = gemm ? reduce8(l) : reduce32(l);
  }
#undef KROW
#undef VROW
}

const sl__kern_cpu_ops sl__kern_cpu_scalar_ops = {
    .dequant =
        {
            [SL_GGML_F32] = dq_f32,
            [SL_GGML_F16] = dq_f16,
            [SL_GGML_BF16] = dq_bf16,
            [SL_GGML_Q4_0] = dq_q4_0,
            [SL_GGML_Q4_1] = dq_q4_1,
            [SL_GGML_Q8_0] = dq_q8_0,
            [SL_GGML_Q8_1] = dq_q8_1,
            [SL_GGML_Q4_K] = dq_q4_K,
            [SL_GGML_Q5_K] = dq_q5_K,
            [SL_GGML_Q6_K] = dq_q6_K,
            [SL_GGML_Q8_K] = dq_q8_K,
            [SL_GGML_Q2_K] = sl__dq_q2_K,
            [SL_GGML_Q3_K] = sl__dq_q3_K,
            [SL_GGML_IQ4_XS] = sl__dq_iq4_xs,
        },
    .quant =
        {
            [SL_GGML_F32] = qa_f32,
            [SL_GGML_Q8_0] = qa_q8_0,
            [SL_GGML_Q8_1] = qa_q8_1,
            [SL_GGML_Q8_K] = qa_q8_K,
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
            [SL_GGML_Q2_K] = sl__dot_q2_K,
            [SL_GGML_Q3_K] = sl__dot_q3_K,
            [SL_GGML_IQ4_XS] = sl__dot_iq4_xs,
        },
    .rmsnorm = rmsnorm,
    .rope = rope,
    .softmax = softmax,
    .swiglu = swiglu,
    .add = add,
    .f32_to_f16 = f32_to_f16,
    .attn_f16 = attn_f16,
};
