/* sluice tests: random weight matrices of every GGUF type the kernels take,
 * shared by the CUDA tests (test_kern_cuda_mm.c, and the host build of the
 * CUDA units, test_kern_cuda_dequant_host.cpp): random bytes, with each
 * block's f16 scale fields set to sane values (every other bit pattern is a
 * valid block). Its own random stream, so the including test's own draws
 * do not move. Header-only, C and C++. */
#ifndef SLUICE_TESTS_RAND_WEIGHTS_H
#define SLUICE_TESTS_RAND_WEIGHTS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sluice/ggml_type.h"

static uint64_t rw_state = 0x243F6A8885A308D3ull;

static inline uint64_t rw_rnd(void) { /* splitmix64 */
  uint64_t z = (rw_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static inline float rw_unif(float a, float b) {
  return a + (b - a) * (float)((double)(rw_rnd() >> 11) * 0x1.0p-53);
}

/* f32 -> f16 bits, round to nearest even (finite input). */
static inline uint16_t rw_f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  float a = fabsf(f);
  if (a >= 65520.0f)
    return (uint16_t)(sign | 0x7C00u);
  if (a < 0x1.0p-14f) /* subnormal: multiples of 2^-24 */
    return (uint16_t)(sign | (uint32_t)lrintf(a * 0x1.0p24f));
  uint32_t e = ((x >> 23) & 0xFF) - 127 + 15, mant = x & 0x7FFFFF;
  uint32_t h = (e << 10) | (mant >> 13), rem = mant & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
    h++;
  return (uint16_t)(sign | h);
}
static inline void rw_put16(uint8_t *p, uint16_t v) {
  memcpy(p, &v, 2);
}

/* Random weights of type t, rows x cols, in w (row-major GGUF bytes). */
static inline void rw_fill_weight(sl_ggml_type t, uint8_t *w, size_t bytes) {
  for (size_t i = 0; i < bytes; i++)
    w[i] = (uint8_t)rw_rnd();
  switch (t) {
  case SL_GGML_F32:
    for (size_t i = 0; i < bytes; i += 4) {
      float v = rw_unif(-1.0f, 1.0f);
      memcpy(w + i, &v, 4);
    }
    break;
  case SL_GGML_F16:
    for (size_t i = 0; i < bytes; i += 2)
      rw_put16(w + i, rw_f2h(rw_unif(-1.0f, 1.0f)));
    break;
  case SL_GGML_BF16:
    for (size_t i = 0; i < bytes; i += 2) {
      float v = rw_unif(-1.0f, 1.0f);
      uint32_t u;
      memcpy(&u, &v, 4);
      rw_put16(w + i, (uint16_t)(u >> 16));
    }
    break;
  case SL_GGML_Q4_0:
  case SL_GGML_Q8_0:
    for (size_t i = 0; i < bytes; i += t == SL_GGML_Q4_0 ? 18 : 34)
      rw_put16(w + i, rw_f2h(rw_unif(0.001f, 0.05f)));
    break;
  case SL_GGML_Q4_1:
    for (size_t i = 0; i < bytes; i += 20) {
      rw_put16(w + i, rw_f2h(rw_unif(0.001f, 0.05f)));
      rw_put16(w + i + 2, rw_f2h(rw_unif(-0.4f, 0.4f)));
    }
    break;
  case SL_GGML_Q4_K:
  case SL_GGML_Q5_K:
    for (size_t i = 0; i < bytes; i += t == SL_GGML_Q4_K ? 144 : 176) {
      rw_put16(w + i, rw_f2h(rw_unif(0.001f, 0.05f)));
      rw_put16(w + i + 2, rw_f2h(rw_unif(0.001f, 0.05f)));
    }
    break;
  case SL_GGML_Q6_K:
    for (size_t i = 0; i < bytes; i += 210)
      rw_put16(w + i + 208, rw_f2h(rw_unif(0.001f, 0.05f)));
    break;
  case SL_GGML_Q5_0:
  case SL_GGML_IQ4_NL:
    for (size_t i = 0; i < bytes; i += t == SL_GGML_Q5_0 ? 22 : 18)
      rw_put16(w + i, rw_f2h(rw_unif(0.001f, 0.05f)));
    break;
  case SL_GGML_Q5_1:
    for (size_t i = 0; i < bytes; i += 24) {
      rw_put16(w + i, rw_f2h(rw_unif(0.001f, 0.05f)));
      rw_put16(w + i + 2, rw_f2h(rw_unif(-0.4f, 0.4f)));
    }
    break;
  case SL_GGML_Q2_K: /* d, dmin at the end */
    for (size_t i = 0; i < bytes; i += 84) {
      rw_put16(w + i + 80, rw_f2h(rw_unif(0.001f, 0.05f)));
      rw_put16(w + i + 82, rw_f2h(rw_unif(0.001f, 0.05f)));
    }
    break;
  case SL_GGML_Q3_K:
    for (size_t i = 0; i < bytes; i += 110)
      rw_put16(w + i + 108, rw_f2h(rw_unif(0.001f, 0.05f)));
    break;
  case SL_GGML_IQ4_XS: /* d first; levels up to 127 and scales to 32 */
    for (size_t i = 0; i < bytes; i += 136)
      rw_put16(w + i, rw_f2h(rw_unif(0.0001f, 0.002f)));
    break;
  default:
    break;
  }
}

#endif
