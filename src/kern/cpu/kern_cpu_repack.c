/* sluice — kern/cpu: repacking weight matrices into groups of 8 interleaved
 * rows (the layouts are in kern_cpu_impl.h, the kernels over them in
 * kern_cpu_packed_avx2.c). Plain C: the copy happens once, at load. */
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
  default:
    return 0;
  }
}

_Static_assert(sizeof(sl__pack_q4_0) == 8 * sizeof(sl__block_q4_0), "q4_0x8");
_Static_assert(sizeof(sl__pack_q8_0) == 8 * sizeof(sl__block_q8_0), "q8_0x8");
_Static_assert(sizeof(sl__pack_q5_0) == 8 * sizeof(sl__block_q5_0), "q5_0x8");

static bool repack_off(void) {
  const char *e = getenv("SLUICE_REPACK");
  return e && strcmp(e, "0") == 0;
}

size_t sl_kern_repack_bytes(const sl_kern_weight *W) {
  if (!W || !W->data || W->rows <= 0 || W->cols <= 0 || W->cols % SL__QK != 0 ||
      (int)W->type < 0 || (int)W->type >= SL__NTYPES)
    return 0;
  const size_t gb = sl__pack_block_bytes(W->type);
  if (!gb || !sl__kern_cpu_ops_get()->packed[W->type] || repack_off())
    return 0;
  size_t groups = (size_t)((W->rows + SL__PACK_ROWS - 1) / SL__PACK_ROWS);
  size_t blocks, bytes;
  if (!sl_mul_ok(groups, (size_t)(W->cols / SL__QK), &blocks) ||
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

static void pack_q5_0(sl__pack_q5_0 *o, const void *const *rows, int64_t i) {
  for (int r = 0; r < 8; r++) {
    const sl__block_q5_0 *b =
        rows[r] ? (const sl__block_q5_0 *)rows[r] + i : NULL;
    uint32_t h = 0;
    if (b)
      memcpy(&h, b->qh, 4);
    o->d[r] = b ? b->d : 0;
    for (int e = 0; e < 4; e++) {
      uint8_t v = 0;
      for (int j = 0; j < 4; j++) {
        v |= (uint8_t)(((h >> (4 * j + e)) & 1u) << (2 * j));
        v |= (uint8_t)(((h >> (16 + 4 * j + e)) & 1u) << (2 * j + 1));
      }
      o->qh[r][e] = v;
      for (int j = 0; j < 4; j++)
        o->qs[j][r][e] = b ? b->qs[4 * j + e] : 0;
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
  const int64_t nb = W->cols / SL__QK;
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
      default:
        SL_ASSERT(0);
      }
    }
  }
  return SL_OK;
}
