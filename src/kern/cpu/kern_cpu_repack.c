/* sluice — kern/cpu: repacking weight matrices into groups of 8 interleaved
 * rows (the layouts are in kern_cpu_impl.h, the kernels over them in
 * packed_body.h). Plain C: the copy happens once, at load. */
#include <stdlib.h>

#include "kern_cpu_impl.h"
#include "sluice/util.h"

size_t sl__pack_block_bytes(sl_ggml_type t) {
  switch (t) {
  case SL_GGML_Q4_0:
  case SL_GGML_IQ4_NL:
    return sizeof(sl__pack_q4_0);
  case SL_GGML_Q8_0:
    return sizeof(sl__pack_q8_0);
  case SL_GGML_Q5_0:
    return sizeof(sl__pack_q5_0);
  case SL_GGML_Q4_1:
    return sizeof(sl__pack_q4_1);
  case SL_GGML_Q5_1:
    return sizeof(sl__pack_q5_1);
  case SL_GGML_Q4_K:
    return sizeof(sl__pack_q4_K);
  case SL_GGML_Q6_K:
    return sizeof(sl__pack_q6_K);
  default:
    return 0;
  }
}

int64_t sl__pack_block_elems(sl_ggml_type t) {
  return t == SL_GGML_Q4_K || t == SL_GGML_Q6_K ? SL__QK_K : SL__QK;
}

_Static_assert(sizeof(sl__pack_q4_0) == 8 * sizeof(sl__block_q4_0), "q4_0x8");
_Static_assert(sizeof(sl__pack_q8_0) == 8 * sizeof(sl__block_q8_0), "q8_0x8");
_Static_assert(sizeof(sl__pack_q5_0) == 8 * sizeof(sl__block_q5_0), "q5_0x8");
_Static_assert(sizeof(sl__pack_q4_1) == 8 * sizeof(sl__block_q4_1), "q4_1x8");
_Static_assert(sizeof(sl__pack_q5_1) == 8 * sizeof(sl__block_q5_1), "q5_1x8");
_Static_assert(sizeof(sl__pack_q4_K) == 1184, "q4_Kx8");
_Static_assert(sizeof(sl__pack_q6_K) == 2192, "q6_Kx8");

static bool repack_off(void) {
  const char *e = getenv("SLUICE_REPACK");
  return e && strcmp(e, "0") == 0;
}

size_t sl_kern_repack_bytes(const sl_kern_weight *W) {
  if (!W || !W->data || W->rows <= 0 || W->cols <= 0 || (int)W->type < 0 ||
      (int)W->type >= SL__NTYPES || W->cols % sl__pack_block_elems(W->type))
    return 0;
  const size_t gb = sl__pack_block_bytes(W->type);
  if (!gb || !sl__kern_cpu_ops_get()->packed[W->type] || repack_off())
    return 0;
  size_t groups = (size_t)((W->rows + SL__PACK_ROWS - 1) / SL__PACK_ROWS);
  size_t blocks, bytes;
  if (!sl_mul_ok(groups, (size_t)(W->cols / sl__pack_block_elems(W->type)),
                 &blocks) ||
      !sl_mul_ok(blocks, gb, &bytes))
    return 0;
  return bytes;
}

/* One group block from the 8 rows' block i (a row NULL: zeros). */
static void pack_q4_0(sl__pack_q4_0 *o, const void *const *rows, int64_t i) {
  for (int r = 0; r < 8; r++) {
    const sl__block_q4_0 *b =
        rows[r] ? (const sl__block_q4_0 *)rows[r] + i : NULL;
    o->d[r] = b ? b->d : 0;
    for (int j = 0; j < 4; j++)
      for (int e = 0; e < 4; e++)
        o->qs[j][r][e] = b ? b->qs[4 * j + e] : 0;
  }
}

static void pack_q8_0(sl__pack_q8_0 *o, const void *const *rows, int64_t i) {
  for (int r = 0; r < 8; r++) {
    const sl__block_q8_0 *b =
        rows[r] ? (const sl__block_q8_0 *)rows[r] + i : NULL;
    o->d[r] = b ? b->d : 0;
    for (int s = 0; s < 8; s++)
      for (int e = 0; e < 4; e++)
        o->qs[s][r][e] = b ? b->qs[4 * s + e] : 0;
  }
}

/* Row r's fifth bits h (Q5_0 / Q5_1, a little-endian u32) and nibbles qs
 * (NULL: zeros) into the group's qh and qs (the Q5_0 layout). */
static void pack_q5_bits(uint8_t qh[8][4], uint8_t qs[4][8][4], int r,
                         uint32_t h, const uint8_t *q) {
  for (int e = 0; e < 4; e++) {
    uint8_t v = 0;
    for (int j = 0; j < 4; j++) {
      v |= (uint8_t)(((h >> (4 * j + e)) & 1u) << (2 * j));
      v |= (uint8_t)(((h >> (16 + 4 * j + e)) & 1u) << (2 * j + 1));
    }
    qh[r][e] = v;
    for (int j = 0; j < 4; j++)
      qs[j][r][e] = q ? q[4 * j + e] : 0;
  }
}

static void pack_q5_0(sl__pack_q5_0 *o, const void *const *rows, int64_t i) {
  for (int r = 0; r < 8; r++) {
    const sl__block_q5_0 *b =
        rows[r] ? (const sl__block_q5_0 *)rows[r] + i : NULL;
    uint32_t h = 0;
    if (b)
      memcpy(&h, b->qh, 4);
    o->d[r] = b ? b->d : 0;
    pack_q5_bits(o->qh, o->qs, r, h, b ? b->qs : NULL);
  }
}

static void pack_q4_1(sl__pack_q4_1 *o, const void *const *rows, int64_t i) {
  for (int r = 0; r < 8; r++) {
    const sl__block_q4_1 *b =
        rows[r] ? (const sl__block_q4_1 *)rows[r] + i : NULL;
    o->d[r] = b ? b->d : 0;
    o->m[r] = b ? b->m : 0;
    for (int j = 0; j < 4; j++)
      for (int e = 0; e < 4; e++)
        o->qs[j][r][e] = b ? b->qs[4 * j + e] : 0;
  }
}

static void pack_q5_1(sl__pack_q5_1 *o, const void *const *rows, int64_t i) {
  for (int r = 0; r < 8; r++) {
    const sl__block_q5_1 *b =
        rows[r] ? (const sl__block_q5_1 *)rows[r] + i : NULL;
    uint32_t h = 0;
    if (b)
      memcpy(&h, b->qh, 4);
    o->d[r] = b ? b->d : 0;
    o->m[r] = b ? b->m : 0;
    pack_q5_bits(o->qh, o->qs, r, h, b ? b->qs : NULL);
  }
}

static void pack_q4_K(sl__pack_q4_K *o, const void *const *rows, int64_t i) {
  memset(o, 0, sizeof *o);
  for (int r = 0; r < 8; r++) {
    if (!rows[r])
      continue;
    const sl__block_q4_K *b = (const sl__block_q4_K *)rows[r] + i;
    o->d[r] = b->d;
    o->dmin[r] = b->dmin;
    for (int j = 0; j < 8; j++)
      sl__scale_min_k4(j, b->scales, &o->sc[j][r], &o->m[j / 2][r][j % 2]);
    for (int c = 0; c < 4; c++)
      for (int s = 0; s < 8; s++)
        memcpy(o->qs[c][s][r], b->qs + 32 * c + 4 * s, 4);
  }
}

static void pack_q6_K(sl__pack_q6_K *o, const void *const *rows, int64_t i) {
  memset(o, 0, sizeof *o);
  for (int r = 0; r < 8; r++) {
    if (!rows[r])
      continue;
    const sl__block_q6_K *b = (const sl__block_q6_K *)rows[r] + i;
    o->d[r] = b->d;
    for (int g = 0; g < 16; g++)
      o->sc[g][r] = b->scales[g];
    /* ggml's Q6_K order: per half h, element 128h + 32k + l has the nibble
     * of ql[64h + 32(k & 1) + l] (high for k >= 2) and bits 2k of
     * qh[32h + l] */
    for (int h = 0; h < 2; h++)
      for (int k = 0; k < 4; k++)
        for (int l = 0; l < 32; l++) {
          uint8_t ql = b->ql[64 * h + 32 * (k & 1) + l];
          uint8_t lo = k < 2 ? ql & 0xF : ql >> 4;
          uint8_t hi = (b->qh[32 * h + l] >> (2 * k)) & 3;
          int e = 128 * h + 32 * k + l;
          o->qs[e / 4][r][e % 4] = (int8_t)((lo | hi << 4) - 32);
        }
  }
}

sl_status sl_kern_repack(const sl_kern_weight *W, void *dst, size_t bytes) {
  size_t need = sl_kern_repack_bytes(W);
  if (need == 0)
    return SL_ERR_UNSUPPORTED;
  if (!dst || bytes < need)
    return SL_ERR_INVALID_ARG;
  size_t rb;
  sl_status st = sl_kern_row_bytes(W->type, W->cols, &rb);
  if (st != SL_OK)
    return st;
  const int64_t nb = W->cols / sl__pack_block_elems(W->type);
  const size_t gb = sl__pack_block_bytes(W->type);
  const int64_t ng = (W->rows + SL__PACK_ROWS - 1) / SL__PACK_ROWS;
  for (int64_t g = 0; g < ng; g++) {
    const void *rows[SL__PACK_ROWS];
    for (int r = 0; r < SL__PACK_ROWS; r++) {
      int64_t row = g * SL__PACK_ROWS + r;
      rows[r] = row < W->rows ? (const char *)W->data + (size_t)row * rb : NULL;
    }
    char *o = (char *)dst + (size_t)(g * nb) * gb;
    for (int64_t i = 0; i < nb; i++, o += gb) {
      switch (W->type) {
      case SL_GGML_Q4_0:
      case SL_GGML_IQ4_NL: /* the same bytes: d, then 16 nibble bytes */
        pack_q4_0((sl__pack_q4_0 *)o, rows, i);
        break;
      case SL_GGML_Q8_0:
        pack_q8_0((sl__pack_q8_0 *)o, rows, i);
        break;
      case SL_GGML_Q5_0:
        pack_q5_0((sl__pack_q5_0 *)o, rows, i);
        break;
      case SL_GGML_Q4_1:
        pack_q4_1((sl__pack_q4_1 *)o, rows, i);
        break;
      case SL_GGML_Q5_1:
        pack_q5_1((sl__pack_q5_1 *)o, rows, i);
        break;
      case SL_GGML_Q4_K:
        pack_q4_K((sl__pack_q4_K *)o, rows, i);
        break;
      case SL_GGML_Q6_K:
        pack_q6_K((sl__pack_q6_K *)o, rows, i);
        break;
      default:
        SL_ASSERT(0);
      }
    }
  }
  return SL_OK;
}
