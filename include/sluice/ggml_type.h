/* sluice — ggml_type: the ggml tensor types and their traits, in one table at
 * the bottom of the stack (util), as ggml's own `type_traits` table is. The
 * GGUF reader (gguf) and the kernels (kern) both read it.
 *
 * Values and sizes are ggml's (ggml.h `enum ggml_type`, ggml.c
 * `type_traits`): a row of n elements of type t takes
 * n / blck_size * type_size bytes, n a multiple of blck_size.
 *
 * Threading: the table is constant; any thread. */
#ifndef SLUICE_GGML_TYPE_H
#define SLUICE_GGML_TYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ggml tensor types (values as in ggml and the GGUF spec). */
typedef enum sl_ggml_type {
  SL_GGML_F32 = 0,
  SL_GGML_F16 = 1,
  SL_GGML_Q4_0 = 2,
  SL_GGML_Q4_1 = 3,
  SL_GGML_Q5_0 = 6,
  SL_GGML_Q5_1 = 7,
  SL_GGML_Q8_0 = 8,
  SL_GGML_Q8_1 = 9,
  SL_GGML_Q2_K = 10,
  SL_GGML_Q3_K = 11,
  SL_GGML_Q4_K = 12,
  SL_GGML_Q5_K = 13,
  SL_GGML_Q6_K = 14,
  SL_GGML_Q8_K = 15,
  SL_GGML_IQ4_NL = 20,
  SL_GGML_IQ4_XS = 23,
  SL_GGML_BF16 = 30,
} sl_ggml_type;

typedef struct sl_ggml_type_traits {
  const char *name;   /* ggml's name, upper case: "Q4_0" */
  uint32_t blck_size; /* elements per block (1 for F32, F16, BF16) */
  uint32_t type_size; /* bytes per block */
  bool is_quantized;
  bool in_files; /* may appear in a model file (false: Q8_1, an activation
                    type whose size gguf-py and ggml disagree on) */
} sl_ggml_type_traits;

/* The traits of `t`; NULL for a type sluice does not know. */
const sl_ggml_type_traits *sl_ggml_type_traits_of(sl_ggml_type t);

/* Bytes of a row of `n` elements of type `t` into *out and true; false for an
 * unknown type, n < 0, n not a multiple of the block size, or overflow. */
bool sl_ggml_row_size(sl_ggml_type t, int64_t n, size_t *out);

#endif
