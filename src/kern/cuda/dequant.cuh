/* sluice — kern/cuda: device-side dequantization of GGUF weight blocks,
 * shared by the matrix-vector kernels (mmv.cu), the dequantize-to-f16 pass of
 * the batched path and the row gather (gemm.cu).
 *
 * Each weight type is a traits struct that splits a row into *units*: the
 * piece one thread loads at once (a 32-element slice of a K-quant
 * super-block, 8 floats), read with the narrowest loads the block layout
 * allows (blocks of 210 bytes are only 2-byte aligned). Q4_0, Q4_1 and Q8_0
 * are not here: the kernels read them in the packed layout (packed.cuh);
 * Q5_0, Q5_1 and IQ4_NL, the other 32-element types, are, in their GGUF
 * bytes (units of 16 elements).
 * A unit is `GPU` groups of `GS` consecutive elements (GS = 4 except the
 * unaligned float fallback), group g of unit u starting at element
 * off(u, g) of its block. group() turns a group into
 *
 *   q[GS]  the quantized values as exact floats (small integers; for float
 *          types the weights themselves),
 *   s, m   so that weight = q * s + m
 *
 * and exact() combines them with the rounding of the CPU dequantizers
 * (src/kern/cpu: scalar for the K-quants, Q2_K, Q3_K and IQ4_XS; AVX2's fused
 * multiply-add for Q5_1), so
 * that sl_kcu_get_rows equals sl_kern_dequant_row bit for bit. The matvec
 * uses q, s and m directly (it factors s out of the group when m is 0).
 *
 * Integers become floats through the exponent trick: the bits 0x4B000000 | v
 * are the float 2^23 + v exactly, so one bitwise op and one FADD replace an
 * I2F (a quarter-rate instruction on sm_90).
 */
#ifndef SLUICE_KERN_CUDA_DEQUANT_CUH
#define SLUICE_KERN_CUDA_DEQUANT_CUH

/* tests/test_kern_cuda_dequant_host.cpp builds this header for the host,
 * with its own definitions of the CUDA built-ins used here */
#ifndef SL_KCU_DEQUANT_HOST
#include <cuda_fp16.h>
#endif
#include <stdint.h>

#include "sluice/ggml_type.h"

namespace sl_kcu {

/* How a unit's weights combine: q alone, q * s, or q * s + m. */
enum kind { K_PLAIN = 0, K_SCALED = 1, K_MIN = 2 };

__device__ __forceinline__ uint32_t ld16(const uint8_t *p) {
  return __ldg((const unsigned short *)p);
}
__device__ __forceinline__ uint32_t ld32(const uint8_t *p) {
  return __ldg((const unsigned int *)p);
}
/* A 32-bit word from a 2-byte aligned address. */
__device__ __forceinline__ uint32_t ld32_a2(const uint8_t *p) {
  return ld16(p) | (ld16(p + 2) << 16);
}
__device__ __forceinline__ float f16(uint32_t bits) {
  return __half2float(__ushort_as_half((unsigned short)bits));
}
__device__ __forceinline__ float bf16(uint32_t bits) {
  return __uint_as_float(bits << 16);
}
/* v (< 2^23) minus bias, exactly, as a float. */
__device__ __forceinline__ float ifl(uint32_t v, float bias) {
  return __uint_as_float(0x4B000000u | v) - (8388608.0f + bias);
}

/* ggml's get_scale_min_k4 over the 12 scale bytes held as 3 words. */
__device__ __forceinline__ void scale_min_k4(int j, const uint32_t *sw,
                                             uint32_t &sc, uint32_t &mn) {
  /* selects, not sw[i >> 2]: j is known only at run time and an indexed
   * register array would go to local memory */
  auto byte = [&](int i) {
    const uint32_t w = i < 4 ? sw[0] : i < 8 ? sw[1] : sw[2];
    return (w >> (8 * (i & 3))) & 0xFF;
  };
  if (j < 4) {
    sc = byte(j) & 63;
    mn = byte(j + 4) & 63;
  } else {
    sc = (byte(j + 4) & 0xF) | ((byte(j - 4) >> 6) << 4);
    mn = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
  }
}

/* Q4_K / Q5_K: unit u covers qs bytes [32c + 16h, +16) of chunk c = u / 2
 * (64 elements: low nibbles are sub-block 2c, high nibbles 2c + 1); group g
 * < 4 takes low nibbles. elem = (d * sc) * q - dmin * m, unfused as the
 * scalar reference. */
struct kq_scales {
  float s_lo, m_lo, s_hi, m_hi; /* m: minus dmin * min */
};
__device__ __forceinline__ void load_kq_scales(const uint8_t *b, int c,
                                               kq_scales &k) {
  const uint32_t dd = ld32(b);
  const float d = f16(dd & 0xFFFF), dmin = f16(dd >> 16);
  uint32_t sw[3] = {ld32(b + 4), ld32(b + 8), ld32(b + 12)};
  uint32_t sc, mn;
  scale_min_k4(2 * c, sw, sc, mn);
  k.s_lo = __fmul_rn(d, (float)sc);
  k.m_lo = -__fmul_rn(dmin, (float)mn);
  scale_min_k4(2 * c + 1, sw, sc, mn);
  k.s_hi = __fmul_rn(d, (float)sc);
  k.m_hi = -__fmul_rn(dmin, (float)mn);
}

struct q4_k {
  static constexpr int QK = 256, BYTES = 144, UPB = 8, GPU = 8, GS = 4,
                       ALIGN = 4, KIND = K_MIN;
  struct raw {
    uint32_t q[4];
    kq_scales k;
  };
  static __device__ __forceinline__ void load(const uint8_t *b, int u, raw &r) {
    const int c = u >> 1, h = u & 1;
    load_kq_scales(b, c, r.k);
#pragma unroll
    for (int w = 0; w < 4; w++)
      r.q[w] = ld32(b + 16 + 32 * c + 16 * h + 4 * w);
  }
  static __device__ __forceinline__ int off(int u, int g) {
    const int c = u >> 1, h = u & 1;
    return 64 * c + (g < 4 ? 0 : 32) + 16 * h + 4 * (g & 3);
  }
  static __device__ __forceinline__ void group(const raw &r, int, int g,
                                               float *q, float &s, float &m) {
    const uint32_t v = (r.q[g & 3] >> (g < 4 ? 0 : 4)) & 0x0F0F0F0Fu;
#pragma unroll
    for (int e = 0; e < 4; e++)
      q[e] = ifl((v >> (8 * e)) & 0xFF, 0.0f);
    s = g < 4 ? r.k.s_lo : r.k.s_hi;
    m = g < 4 ? r.k.m_lo : r.k.m_hi;
  }
  static __device__ __forceinline__ float exact(float q, float s, float m) {
    return __fadd_rn(__fmul_rn(s, q), m);
  }
};

/* Q5_K: as Q4_K plus bit 2c (low) / 2c + 1 (high) of qh[l] as bit 4. */
struct q5_k {
  static constexpr int QK = 256, BYTES = 176, UPB = 8, GPU = 8, GS = 4,
                       ALIGN = 4, KIND = K_MIN;
  struct raw {
    uint32_t q[4], h[4];
    kq_scales k;
  };
  static __device__ __forceinline__ void load(const uint8_t *b, int u, raw &r) {
    const int c = u >> 1, h = u & 1;
    load_kq_scales(b, c, r.k);
#pragma unroll
    for (int w = 0; w < 4; w++) {
      r.q[w] = ld32(b + 48 + 32 * c + 16 * h + 4 * w);
      r.h[w] = ld32(b + 16 + 16 * h + 4 * w);
    }
  }
  static __device__ __forceinline__ int off(int u, int g) {
    return q4_k::off(u, g);
  }
  static __device__ __forceinline__ void group(const raw &r, int u, int g,
                                               float *q, float &s, float &m) {
    const int c = u >> 1, hi = g < 4 ? 0 : 1;
    const uint32_t v = (r.q[g & 3] >> (4 * hi)) & 0x0F0F0F0Fu;
    const uint32_t hb = ((r.h[g & 3] >> (2 * c + hi)) & 0x01010101u) << 4;
    const uint32_t vv = v | hb;
#pragma unroll
    for (int e = 0; e < 4; e++)
      q[e] = ifl((vv >> (8 * e)) & 0xFF, 0.0f);
    s = hi ? r.k.s_hi : r.k.s_lo;
    m = hi ? r.k.m_hi : r.k.m_lo;
  }
  static __device__ __forceinline__ float exact(float q, float s, float m) {
    return __fadd_rn(__fmul_rn(s, q), m);
  }
};

/* Q6_K: u8 ql[128], u8 qh[64], i8 scales[16], f16 d. Unit u: half h = u / 4
 * (128 elements), l0 = 8 * (u % 4); group g = 2k + p covers elements
 * 128h + 32k + l0 + 4p + [0, 4) of quarter k, scale scales[8h + l0/16 +
 * 2k]. elem = (d * sc) * (q - 32). */
struct q6_k {
  static constexpr int QK = 256, BYTES = 210, UPB = 8, GPU = 8, GS = 4,
                       ALIGN = 2, KIND = K_SCALED;
  struct raw {
    uint32_t la[2], lb[2], h[2];
    float s[4];
  };
  static __device__ __forceinline__ void load(const uint8_t *b, int u, raw &r) {
    const int h = u >> 2, l0 = 8 * (u & 3);
#pragma unroll
    for (int p = 0; p < 2; p++) {
      r.la[p] = ld32_a2(b + 64 * h + l0 + 4 * p);
      r.lb[p] = ld32_a2(b + 64 * h + 32 + l0 + 4 * p);
      r.h[p] = ld32_a2(b + 128 + 32 * h + l0 + 4 * p);
    }
    const float d = f16(ld16(b + 208));
    /* the four scales lie 2 bytes apart, at odd addresses for l0 >= 16:
     * byte loads (L1 hits: the unit's neighbours read the same 16 bytes) */
    const uint8_t *sc = b + 192 + 8 * h + (l0 >> 4);
#pragma unroll
    for (int k = 0; k < 4; k++)
      r.s[k] = __fmul_rn(d, (float)(int8_t)__ldg(sc + 2 * k));
  }
  static __device__ __forceinline__ int off(int u, int g) {
    const int h = u >> 2, l0 = 8 * (u & 3);
    return 128 * h + 32 * (g >> 1) + l0 + 4 * (g & 1);
  }
  static __device__ __forceinline__ void group(const raw &r, int, int g,
                                               float *q, float &s, float &m) {
    const int k = g >> 1, p = g & 1;
    const uint32_t lw = (k & 1) ? r.lb[p] : r.la[p];
    const uint32_t lo = (lw >> (k >= 2 ? 4 : 0)) & 0x0F0F0F0Fu;
    const uint32_t hb = ((r.h[p] >> (2 * k)) & 0x03030303u) << 4;
    const uint32_t v = lo | hb;
#pragma unroll
    for (int e = 0; e < 4; e++)
      q[e] = ifl((v >> (8 * e)) & 0xFF, 32.0f);
    s = r.s[k];
    m = 0.0f;
  }
  static __device__ __forceinline__ float exact(float q, float s, float) {
    return __fmul_rn(s, q);
  }
};

/* ---- 32-element blocks (Q5_0, Q5_1, IQ4_NL): unit h (UPB = 2) holds qs
 * bytes [8h, 8h + 8), i.e. elements 8h + [0, 8) (low nibbles, groups 0, 1)
 * and 16 + 8h + [0, 8) (high nibbles, groups 2, 3). */
__device__ __forceinline__ int blk32_off(int u, int g) {
  return 16 * (g >> 1) + 8 * u + 4 * (g & 1);
}
/* The four nibbles of group g, one per byte. */
__device__ __forceinline__ uint32_t blk32_nib(const uint32_t *q, int g) {
  return (q[g & 1] >> (4 * (g >> 1))) & 0x0F0F0F0Fu;
}
/* Bits 0..3 of b to bit 0 of bytes 0..3 (the products land on distinct
 * bits: no carries). */
__device__ __forceinline__ uint32_t spread4(uint32_t b) {
  return (b * 0x00204081u) & 0x01010101u;
}

/* Q5_0: f16 d, u8 qh[4], u8 qs[16]; elem = (q - 16) * d, q = nibble | bit j
 * of qh << 4. */
struct q5_0 {
  static constexpr int QK = 32, BYTES = 22, UPB = 2, GPU = 4, GS = 4, ALIGN = 2,
                       KIND = K_SCALED;
  struct raw {
    uint32_t q[2], h;
    float d;
  };
  static __device__ __forceinline__ void load(const uint8_t *b, int u, raw &r) {
    r.d = f16(ld16(b));
    r.h = ld32_a2(b + 2);
    r.q[0] = ld32_a2(b + 6 + 8 * u);
    r.q[1] = ld32_a2(b + 10 + 8 * u);
  }
  static __device__ __forceinline__ int off(int u, int g) {
    return blk32_off(u, g);
  }
  static __device__ __forceinline__ void group(const raw &r, int u, int g,
                                               float *q, float &s, float &m) {
    const uint32_t v =
        blk32_nib(r.q, g) | spread4((r.h >> blk32_off(u, g)) & 0xF) << 4;
#pragma unroll
    for (int e = 0; e < 4; e++)
      q[e] = ifl((v >> (8 * e)) & 0xFF, 16.0f);
    s = r.d;
    m = 0.0f;
  }
  static __device__ __forceinline__ float exact(float q, float s, float) {
    return __fmul_rn(s, q);
  }
};

/* Q5_1: f16 d, f16 m, u8 qh[4], u8 qs[16]; elem = q * d + m, fused as the
 * AVX2 / AVX-512 dequantizer computes it (the scalar one rounds twice; the
 * test accepts both under SLUICE_ISA=scalar, as for Q4_1). */
struct q5_1 {
  static constexpr int QK = 32, BYTES = 24, UPB = 2, GPU = 4, GS = 4, ALIGN = 4,
                       KIND = K_MIN;
  struct raw {
    uint32_t q[2], h;
    float d, m;
  };
  static __device__ __forceinline__ void load(const uint8_t *b, int u, raw &r) {
    const uint32_t dm = ld32(b);
    r.d = f16(dm & 0xFFFF);
    r.m = f16(dm >> 16);
    r.h = ld32(b + 4);
    r.q[0] = ld32(b + 8 + 8 * u);
    r.q[1] = ld32(b + 12 + 8 * u);
  }
  static __device__ __forceinline__ int off(int u, int g) {
    return blk32_off(u, g);
  }
  static __device__ __forceinline__ void group(const raw &r, int u, int g,
                                               float *q, float &s, float &m) {
    const uint32_t v =
        blk32_nib(r.q, g) | spread4((r.h >> blk32_off(u, g)) & 0xF) << 4;
#pragma unroll
    for (int e = 0; e < 4; e++)
      q[e] = ifl((v >> (8 * e)) & 0xFF, 0.0f);
    s = r.d;
    m = r.m;
  }
  static __device__ __forceinline__ float exact(float q, float s, float m) {
    return __fmaf_rn(q, s, m);
  }
};

/* The IQ4 levels (ggml's kvalues_iq4nl: -127, -104, ..., 113) of four 4-bit
 * indices, one per byte of v, as four int8 bytes: byte_perm picks from the
 * low and the high eight levels by bits 0..2, bit 3 chooses. */
__device__ __forceinline__ uint32_t iq4_levels(uint32_t v) {
  const uint32_t t = v & 0x07070707u, n = t | (t >> 4);
  const uint32_t sel = (n & 0xFFu) | ((n >> 8) & 0xFF00u);
  const uint32_t lo = __byte_perm(0xBFAD9881u, 0xF6EADDCFu, sel);
  const uint32_t hi = __byte_perm(0x26190D01u, 0x71594535u, sel);
  const uint32_t m = ((v >> 3) & 0x01010101u) * 0xFFu;
  return (lo & ~m) | (hi & m);
}
/* The four int8 levels of iq4_levels as exact floats. */
__device__ __forceinline__ void iq4_floats(uint32_t lv, float *q) {
#pragma unroll
  for (int e = 0; e < 4; e++)
    q[e] = ifl(((lv >> (8 * e)) & 0xFF) ^ 0x80, 128.0f);
}

/* IQ4_NL: f16 d, u8 qs[16] (indices into the levels); elem = level * d. */
struct iq4_nl {
  static constexpr int QK = 32, BYTES = 18, UPB = 2, GPU = 4, GS = 4, ALIGN = 2,
                       KIND = K_SCALED;
  struct raw {
    uint32_t q[2];
    float d;
  };
  static __device__ __forceinline__ void load(const uint8_t *b, int u, raw &r) {
    r.d = f16(ld16(b));
    r.q[0] = ld32_a2(b + 2 + 8 * u);
    r.q[1] = ld32_a2(b + 6 + 8 * u);
  }
  static __device__ __forceinline__ int off(int u, int g) {
    return blk32_off(u, g);
  }
  static __device__ __forceinline__ void group(const raw &r, int, int g,
                                               float *q, float &s, float &m) {
    iq4_floats(iq4_levels(blk32_nib(r.q, g)), q);
    s = r.d;
    m = 0.0f;
  }
  static __device__ __forceinline__ float exact(float q, float s, float) {
    return __fmul_rn(s, q);
  }
};

/* Q2_K and Q3_K: element 128h + 32j + l takes bits 2j..2j+1 of qs[32h + l]
 * and scale number 8h + 2j + l / 16. Unit u: h = u / 4, l0 = 8 (u % 4); it
 * loads qs[32h + l0 .. + 8), and group g = 2j + p covers elements 128h + 32j
 * + l0 + 4p + [0, 4), as Q6_K's units. */
__device__ __forceinline__ int k23_off(int u, int g) {
  return 128 * (u >> 2) + 32 * (g >> 1) + 8 * (u & 3) + 4 * (g & 1);
}

/* Q2_K: u8 scales[16] (low nibble scale, high min), u8 qs[64], f16 d, f16
 * dmin; elem = (d * sc) * q - dmin * mn, unfused as the scalar reference. */
struct q2_k {
  static constexpr int QK = 256, BYTES = 84, UPB = 8, GPU = 8, GS = 4,
                       ALIGN = 4, KIND = K_MIN;
  struct raw {
    uint32_t q[2];
    float s[4], m[4]; /* m: minus dmin * mn */
  };
  static __device__ __forceinline__ void load(const uint8_t *b, int u, raw &r) {
    const int h = u >> 2, l0 = 8 * (u & 3);
    r.q[0] = ld32(b + 16 + 32 * h + l0);
    r.q[1] = ld32(b + 20 + 32 * h + l0);
    const uint32_t dd = ld32(b + 80);
    const float d = f16(dd & 0xFFFF), dmin = f16(dd >> 16);
    /* scales 8h + (l0 / 16) + 2j, j < 4: bytes of the two words at 8h */
    const uint32_t sw0 = ld32(b + 8 * h), sw1 = ld32(b + 8 * h + 4);
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const uint32_t sc =
          ((j < 2 ? sw0 : sw1) >> (8 * ((l0 >> 4) + 2 * (j & 1)))) & 0xFF;
      r.s[j] = __fmul_rn(d, (float)(sc & 0xF));
      r.m[j] = -__fmul_rn(dmin, (float)(sc >> 4));
    }
  }
  static __device__ __forceinline__ int off(int u, int g) {
    return k23_off(u, g);
  }
  static __device__ __forceinline__ void group(const raw &r, int, int g,
                                               float *q, float &s, float &m) {
    const int j = g >> 1;
    const uint32_t v = (r.q[g & 1] >> (2 * j)) & 0x03030303u;
#pragma unroll
    for (int e = 0; e < 4; e++)
      q[e] = ifl((v >> (8 * e)) & 0xFF, 0.0f);
    s = r.s[j];
    m = r.m[j];
  }
  static __device__ __forceinline__ float exact(float q, float s, float m) {
    return __fadd_rn(__fmul_rn(s, q), m);
  }
};

/* Q3_K: u8 hmask[32], u8 qs[64], u8 scales[12] (16 6-bit scales biased by
 * 32), f16 d. q = low 2 bits - 4 + 4 * (bit 4h + j of hmask[l]); elem = (d *
 * sc) * q. */
struct q3_k {
  static constexpr int QK = 256, BYTES = 110, UPB = 8, GPU = 8, GS = 4,
                       ALIGN = 2, KIND = K_SCALED;
  struct raw {
    uint32_t q[2], hm[2];
    float s[4];
  };
  static __device__ __forceinline__ void load(const uint8_t *b, int u, raw &r) {
    const int h = u >> 2, l0 = 8 * (u & 3);
#pragma unroll
    for (int p = 0; p < 2; p++) {
      r.q[p] = ld32_a2(b + 32 + 32 * h + l0 + 4 * p);
      r.hm[p] = ld32_a2(b + l0 + 4 * p);
    }
    const float d = f16(ld16(b + 108));
    const uint32_t sw[3] = {ld32_a2(b + 96), ld32_a2(b + 100),
                            ld32_a2(b + 104)};
    /* scale i = 8h + k, k = l0 / 16 + 2j: low 4 bits in nibble h of byte k,
     * high 2 at bit 2 (i / 4) of byte 8 + i % 4 */
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int k = (l0 >> 4) + 2 * j;
      const uint32_t lo =
          ((k < 4 ? sw[0] : sw[1]) >> (8 * (k & 3) + 4 * h)) & 0xF;
      const uint32_t hi = (sw[2] >> (8 * (k & 3) + 2 * (2 * h + (k >> 2)))) & 3;
      r.s[j] = __fmul_rn(d, (float)((int)(lo | hi << 4) - 32));
    }
  }
  static __device__ __forceinline__ int off(int u, int g) {
    return k23_off(u, g);
  }
  static __device__ __forceinline__ void group(const raw &r, int u, int g,
                                               float *q, float &s, float &m) {
    const int j = g >> 1, p = g & 1;
    const uint32_t lo = (r.q[p] >> (2 * j)) & 0x03030303u;
    const uint32_t hb = (r.hm[p] >> (4 * (u >> 2) + j)) & 0x01010101u;
    const uint32_t v = lo | hb << 2;
#pragma unroll
    for (int e = 0; e < 4; e++)
      q[e] = ifl((v >> (8 * e)) & 0xFF, 4.0f);
    s = r.s[j];
    m = 0.0f;
  }
  static __device__ __forceinline__ float exact(float q, float s, float) {
    return __fmul_rn(s, q);
  }
};

/* IQ4_XS: f16 d, u16 scales_h, u8 scales_l[4], u8 qs[128]. Unit u is the
 * 32-element sub-block u: qs[16u .. + 16), low nibbles its first 16
 * elements (groups 0..3), high ones the next 16; its scale ls = (4 bits of
 * scales_l | 2 bits of scales_h << 4) - 32, elem = (d * ls) * level. */
struct iq4_xs {
  static constexpr int QK = 256, BYTES = 136, UPB = 8, GPU = 8, GS = 4,
                       ALIGN = 4, KIND = K_SCALED;
  struct raw {
    uint32_t q[4];
    float s;
  };
  static __device__ __forceinline__ void load(const uint8_t *b, int u, raw &r) {
    const uint32_t dw = ld32(b);
    const uint32_t lo = (__ldg(b + 4 + (u >> 1)) >> (4 * (u & 1))) & 0xF;
    const uint32_t hi = (dw >> (16 + 2 * u)) & 3;
    r.s = __fmul_rn(f16(dw & 0xFFFF), (float)((int)(lo | hi << 4) - 32));
#pragma unroll
    for (int w = 0; w < 4; w++)
      r.q[w] = ld32(b + 8 + 16 * u + 4 * w);
  }
  static __device__ __forceinline__ int off(int u, int g) {
    return 32 * u + (g < 4 ? 0 : 16) + 4 * (g & 3);
  }
  static __device__ __forceinline__ void group(const raw &r, int, int g,
                                               float *q, float &s, float &m) {
    iq4_floats(iq4_levels((r.q[g & 3] >> (g < 4 ? 0 : 4)) & 0x0F0F0F0Fu), q);
    s = r.s;
    m = 0.0f;
  }
  static __device__ __forceinline__ float exact(float q, float s, float) {
    return __fmul_rn(s, q);
  }
};

/* ---- float weights: units of 8 (16-byte loads; rows and data 16-byte
 * aligned) or of 1 (any cols). */
template <int V> struct f32w;
template <> struct f32w<8> {
  static constexpr int QK = 8, BYTES = 32, UPB = 1, GPU = 2, GS = 4, ALIGN = 16,
                       KIND = K_PLAIN;
  struct raw {
    float4 a[2];
  };
  static __device__ __forceinline__ void load(const uint8_t *b, int, raw &r) {
    r.a[0] = __ldg((const float4 *)b);
    r.a[1] = __ldg((const float4 *)b + 1);
  }
  static __device__ __forceinline__ int off(int, int g) { return 4 * g; }
  static __device__ __forceinline__ void group(const raw &r, int, int g,
                                               float *q, float &s, float &m) {
    q[0] = r.a[g].x;
    q[1] = r.a[g].y;
    q[2] = r.a[g].z;
    q[3] = r.a[g].w;
    s = 1.0f;
    m = 0.0f;
  }
  static __device__ __forceinline__ float exact(float q, float, float) {
    return q;
  }
};
template <> struct f32w<1> {
  static constexpr int QK = 1, BYTES = 4, UPB = 1, GPU = 1, GS = 1, ALIGN = 4,
                       KIND = K_PLAIN;
  struct raw {
    float a;
  };
  static __device__ __forceinline__ void load(const uint8_t *b, int, raw &r) {
    r.a = __ldg((const float *)b);
  }
  static __device__ __forceinline__ int off(int, int) { return 0; }
  static __device__ __forceinline__ void group(const raw &r, int, int, float *q,
                                               float &s, float &m) {
    q[0] = r.a;
    s = 1.0f;
    m = 0.0f;
  }
  static __device__ __forceinline__ float exact(float q, float, float) {
    return q;
  }
};

/* F16 (BF = false) and BF16 (BF = true) */
template <bool BF, int V> struct h16w;
template <bool BF> struct h16w<BF, 8> {
  static constexpr int QK = 8, BYTES = 16, UPB = 1, GPU = 2, GS = 4, ALIGN = 16,
                       KIND = K_PLAIN;
  struct raw {
    uint4 a;
  };
  static __device__ __forceinline__ void load(const uint8_t *b, int, raw &r) {
    r.a = __ldg((const uint4 *)b);
  }
  static __device__ __forceinline__ int off(int, int g) { return 4 * g; }
  static __device__ __forceinline__ float cvt(uint32_t bits) {
    return BF ? bf16(bits) : f16(bits);
  }
  static __device__ __forceinline__ void group(const raw &r, int, int g,
                                               float *q, float &s, float &m) {
    const uint32_t w0 = g ? r.a.z : r.a.x, w1 = g ? r.a.w : r.a.y;
    q[0] = cvt(w0 & 0xFFFF);
    q[1] = cvt(w0 >> 16);
    q[2] = cvt(w1 & 0xFFFF);
    q[3] = cvt(w1 >> 16);
    s = 1.0f;
    m = 0.0f;
  }
  static __device__ __forceinline__ float exact(float q, float, float) {
    return q;
  }
};
template <bool BF> struct h16w<BF, 1> {
  static constexpr int QK = 1, BYTES = 2, UPB = 1, GPU = 1, GS = 1, ALIGN = 2,
                       KIND = K_PLAIN;
  struct raw {
    uint32_t a;
  };
  static __device__ __forceinline__ void load(const uint8_t *b, int, raw &r) {
    r.a = ld16(b);
  }
  static __device__ __forceinline__ int off(int, int) { return 0; }
  static __device__ __forceinline__ void group(const raw &r, int, int, float *q,
                                               float &s, float &m) {
    q[0] = BF ? bf16(r.a) : f16(r.a);
    s = 1.0f;
    m = 0.0f;
  }
  static __device__ __forceinline__ float exact(float q, float, float) {
    return q;
  }
};

} // namespace sl_kcu

#endif
