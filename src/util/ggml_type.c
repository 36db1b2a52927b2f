/* ggml tensor type traits: one table, indexed by type (see ggml_type.h). */
#include "sluice/ggml_type.h"

#include "sluice/util.h"

/* As ggml.c's type_traits (QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0 = QK8_1 =
 * 32, QK_K = 256; block sizes are the block_* structs' sizeof with ggml_half
 * d / dmin / s fields). */
static const sl_ggml_type_traits g_traits[] = {
    [SL_GGML_F32] = {"F32", 1, 4, false, true},
    [SL_GGML_F16] = {"F16", 1, 2, false, true},
    [SL_GGML_Q4_0] = {"Q4_0", 32, 18, true, true},
    [SL_GGML_Q4_1] = {"Q4_1", 32, 20, true, true},
    [SL_GGML_Q5_0] = {"Q5_0", 32, 22, true, true},
    [SL_GGML_Q5_1] = {"Q5_1", 32, 24, true, true},
    [SL_GGML_Q8_0] = {"Q8_0", 32, 34, true, true},
    [SL_GGML_Q8_1] = {"Q8_1", 32, 36, true, false},
    [SL_GGML_Q2_K] = {"Q2_K", 256, 84, true, true},
    [SL_GGML_Q3_K] = {"Q3_K", 256, 110, true, true},
    [SL_GGML_Q4_K] = {"Q4_K", 256, 144, true, true},
    [SL_GGML_Q5_K] = {"Q5_K", 256, 176, true, true},
    [SL_GGML_Q6_K] = {"Q6_K", 256, 210, true, true},
    [SL_GGML_Q8_K] = {"Q8_K", 256, 292, true, true},
    [SL_GGML_IQ4_NL] = {"IQ4_NL", 32, 18, true, true},
    [SL_GGML_IQ4_XS] = {"IQ4_XS", 256, 136, true, true},
    [SL_GGML_BF16] = {"BF16", 1, 2, false, true},
};

const sl_ggml_type_traits *sl_ggml_type_traits_of(sl_ggml_type t) {
  if ((unsigned)t >= sizeof g_traits / sizeof g_traits[0] || !g_traits[t].name)
    return NULL;
  return &g_traits[t];
}

bool sl_ggml_row_size(sl_ggml_type t, int64_t n, size_t *out) {
  const sl_ggml_type_traits *tr = sl_ggml_type_traits_of(t);
  if (!tr || n < 0 || n % tr->blck_size != 0)
    return false;
  size_t bytes;
  if (!sl_mul_ok((size_t)(n / tr->blck_size), tr->type_size, &bytes))
    return false;
  if (out)
    *out = bytes;
  return true;
}
