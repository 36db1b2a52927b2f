/* test_ggml_type: the one table of ggml type traits
 * (include/sluice/ggml_type.h) against ggml's own values, and the kernels'
 * block sizes against the table. */
#include "harness.h"

#include "sluice/ggml_type.h"
#include "sluice/kern_cpu.h"

/* ggml.c type_traits (blck_size, type_size, is_quantized), typed in from
 * ggml's sources, not from sluice's table. */
static const struct {
  sl_ggml_type t;
  const char *name;
  uint32_t blck, size;
  bool quant;
} g_ggml[] = {
    {SL_GGML_F32, "F32", 1, 4, false},
    {SL_GGML_F16, "F16", 1, 2, false},
    {SL_GGML_Q4_0, "Q4_0", 32, 18, true},
    {SL_GGML_Q4_1, "Q4_1", 32, 20, true},
    {SL_GGML_Q5_0, "Q5_0", 32, 22, true},
    {SL_GGML_Q5_1, "Q5_1", 32, 24, true},
    {SL_GGML_Q8_0, "Q8_0", 32, 34, true},
    {SL_GGML_Q8_1, "Q8_1", 32, 36, true},
    {SL_GGML_Q2_K, "Q2_K", 256, 84, true},
    {SL_GGML_Q3_K, "Q3_K", 256, 110, true},
    {SL_GGML_Q4_K, "Q4_K", 256, 144, true},
    {SL_GGML_Q5_K, "Q5_K", 256, 176, true},
    {SL_GGML_Q6_K, "Q6_K", 256, 210, true},
    {SL_GGML_Q8_K, "Q8_K", 256, 292, true},
    {SL_GGML_IQ4_NL, "IQ4_NL", 32, 18, true},
    {SL_GGML_BF16, "BF16", 1, 2, false},
};
#define N_GGML (sizeof g_ggml / sizeof g_ggml[0])

static void test_table_is_ggmls(void) {
  for (size_t i = 0; i < N_GGML; i++) {
    const sl_ggml_type_traits *tr = sl_ggml_type_traits_of(g_ggml[i].t);
    CHECK(tr != NULL);
    if (!tr)
      continue;
    CHECK(strcmp(tr->name, g_ggml[i].name) == 0);
    CHECK_EQ_INT(tr->blck_size, g_ggml[i].blck);
    CHECK_EQ_INT(tr->type_size, g_ggml[i].size);
    CHECK(tr->is_quantized == g_ggml[i].quant);
    CHECK(tr->in_files == (g_ggml[i].t != SL_GGML_Q8_1));
  }
  /* the holes in ggml's numbering (4, 5: removed Q4_2, Q4_3) and past it */
  CHECK(sl_ggml_type_traits_of((sl_ggml_type)4) == NULL);
  CHECK(sl_ggml_type_traits_of((sl_ggml_type)5) == NULL);
  CHECK(sl_ggml_type_traits_of((sl_ggml_type)16) == NULL);
  CHECK(sl_ggml_type_traits_of((sl_ggml_type)31) == NULL);
  CHECK(sl_ggml_type_traits_of((sl_ggml_type)-1) == NULL);
}

static void test_row_size(void) {
  size_t b = 0;
  CHECK(sl_ggml_row_size(SL_GGML_Q4_1, 576, &b) && b == 576 / 32 * 20);
  CHECK(sl_ggml_row_size(SL_GGML_F16, 3, &b) && b == 6);
  CHECK(sl_ggml_row_size(SL_GGML_Q6_K, 0, &b) && b == 0);
  CHECK(!sl_ggml_row_size(SL_GGML_Q4_K, 255, &b));
  CHECK(!sl_ggml_row_size(SL_GGML_F32, -1, &b));
  CHECK(!sl_ggml_row_size((sl_ggml_type)4, 32, &b));
  CHECK(!sl_ggml_row_size(SL_GGML_F32, INT64_MAX, &b)); /* overflows */
}

/* The kernels' sizes (their block structs) agree with the table for every
 * type they handle. */
static void test_kern_agrees(void) {
  int handled = 0;
  for (size_t i = 0; i < N_GGML; i++) {
    int64_t be = 0;
    size_t bb = 0;
    if (!sl_kern_type_block(g_ggml[i].t, &be, &bb))
      continue;
    handled++;
    const sl_ggml_type_traits *tr = sl_ggml_type_traits_of(g_ggml[i].t);
    CHECK_EQ_INT(be, tr->blck_size);
    CHECK_EQ_INT(bb, tr->type_size);
  }
  CHECK(handled >=
        11); /* F32 F16 BF16 Q4_0 Q4_1 Q8_0 Q8_1 Q4_K Q5_K Q6_K Q8_K */
}

int main(void) {
  RUN(test_table_is_ggmls);
  RUN(test_row_size);
  RUN(test_kern_agrees);
  return sl_test_finish();
}
