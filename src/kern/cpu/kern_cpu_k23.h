/* sluice — kern/cpu private: Q2_K, Q3_K and IQ4_XS, the low-bit 256-element
 * weight types (Q2_K / Q3_K_S/M/L / IQ4_XS files). Their activations are
 * Q8_K, as for Q4_K / Q5_K / Q6_K. The scalar kernels live in
 * kern_cpu_k23.c, the AVX2 dots in kern_cpu_k23_avx2.c; the op tables of
 * kern_cpu_scalar.c and kern_cpu_avx2.c point at them. Only src/kern/cpu/
 * (and its tests) include this. */
#ifndef SLUICE_KERN_CPU_K23_H
#define SLUICE_KERN_CPU_K23_H

#include "kern_cpu_impl.h"

/* ggml block layouts (must match ggml byte for byte). */
typedef struct {
  uint8_t scales[SL__QK_K / 16]; /* per 16: low nibble scale, high min */
  uint8_t qs[SL__QK_K / 4];      /* 2-bit quants */
  uint16_t d, dmin;              /* f16 */
} sl__block_q2_K;                /* 84 B */
typedef struct {
  uint8_t hmask[SL__QK_K / 8]; /* the third bit of each quant, set: +4 */
  uint8_t qs[SL__QK_K / 4];    /* low 2 bits */
  uint8_t scales[12];          /* 16 6-bit scales, biased by 32, packed */
  uint16_t d;                  /* f16 */
} sl__block_q3_K;              /* 110 B */
typedef struct {
  uint16_t d;                      /* f16 */
  uint16_t scales_h;               /* high 2 bits of 8 6-bit scales */
  uint8_t scales_l[SL__QK_K / 64]; /* low 4 bits, two per byte */
  uint8_t qs[SL__QK_K / 2];        /* 4-bit indices into sl__kvalues_iq4 */
} sl__block_iq4_xs;                /* 136 B */

_Static_assert(sizeof(sl__block_q2_K) == 84, "q2_K");
_Static_assert(sizeof(sl__block_q3_K) == 110, "q3_K");
_Static_assert(sizeof(sl__block_iq4_xs) == 136, "iq4_xs");

/* The 16 non-linear levels of IQ4_XS (and IQ4_NL), as ggml's kvalues_iq4nl. */
extern const int8_t sl__kvalues_iq4[16];

/* The 16 scales of a Q3_K block, unbiased (-32..31), into sc[16]. */
static inline void sl__q3_K_scales(const uint8_t *s, int8_t *sc) {
  for (int i = 0; i < 16; i++) {
    int lo = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
    int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    sc[i] = (int8_t)((lo | (hi << 4)) - 32);
  }
}

/* The ib-th (0..7) 32-element scale of an IQ4_XS block, unbiased. */
static inline int sl__iq4_xs_scale(const sl__block_iq4_xs *b, int ib) {
  int lo = (b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
  int hi = (b->scales_h >> (2 * ib)) & 3;
  return (lo | (hi << 4)) - 32;
}

/* kern_cpu_k23.c: the scalar dequantizations and dots. */
void sl__dq_q2_K(const void *src, float *dst, int64_t n);
void sl__dq_q3_K(const void *src, float *dst, int64_t n);
void sl__dq_iq4_xs(const void *src, float *dst, int64_t n);
void sl__dot_q2_K(int64_t n, const void *w, const void *x, size_t xs, float *y,
                  size_t ys, int nt);
void sl__dot_q3_K(int64_t n, const void *w, const void *x, size_t xs, float *y,
                  size_t ys, int nt);
void sl__dot_iq4_xs(int64_t n, const void *w, const void *x, size_t xs,
                    float *y, size_t ys, int nt);

/* kern_cpu_k23_avx2.c: the AVX2 dots (x86-64 only; call only where
 * sl_kern_cpu_isa_supported(SL_KERN_ISA_AVX2)). Same contract as the scalar
 * ones; within a float32 rounding bound of them, not bit-identical. */
void sl__dot_q2_K_avx2(int64_t n, const void *w, const void *x, size_t xs,
                       float *y, size_t ys, int nt);
void sl__dot_q3_K_avx2(int64_t n, const void *w, const void *x, size_t xs,
                       float *y, size_t ys, int nt);
void sl__dot_iq4_xs_avx2(int64_t n, const void *w, const void *x, size_t xs,
                         float *y, size_t ys, int nt);

#endif
