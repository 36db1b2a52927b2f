/* Tests for the GGUF reader (src/gguf/gguf.c).
 *
 * Synthetic files are built in memory byte by byte (independently of the
 * reader), opened with sl_gguf_open_mem over exact-size heap copies (so that
 * ASan sees any read past the end), and every getter is checked. A table of
 * malformed files must each give SL_ERR_FORMAT with a message naming the
 * fault; so must every truncation of a valid file. Allocation failures are
 * injected at every allocation of an open. The seed corpus written by gguf-py
 * (tests/fuzz/corpus/gguf) and, when present, the real default model are
 * opened and checked against facts learned with the Python gguf package.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "sluice/gguf.h"
#include "sluice/util.h"

/* ---- a byte builder -------------------------------------------------------
 */

typedef struct buf {
  uint8_t *p;
  size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n)
      cap *= 2;
    b->p = realloc(b->p, cap);
    if (!b->p) {
      fprintf(stderr, "test: out of memory\n");
      exit(2);
    }
    b->cap = cap;
  }
  if (n)
    memcpy(b->p + b->n, d, n);
  b->n += n;
}

static void put_u8(buf *b, uint8_t v) {
  put(b, &v, 1);
}
static void put_u16(buf *b, uint16_t v) {
  put(b, &v, 2);
}
static void put_u32(buf *b, uint32_t v) {
  put(b, &v, 4);
}
static void put_u64(buf *b, uint64_t v) {
  put(b, &v, 8);
}
static void put_f32(buf *b, float v) {
  put(b, &v, 4);
}
static void put_f64(buf *b, double v) {
  put(b, &v, 8);
}
static void put_str(buf *b, const char *s) {
  put_u64(b, strlen(s));
  put(b, s, strlen(s));
}
static void put_key(buf *b, const char *k, uint32_t type) {
  put_str(b, k);
  put_u32(b, type);
}
static void put_header(buf *b, uint32_t ver, uint64_t n_tensors,
                       uint64_t n_kv) {
  put(b, "GGUF", 4);
  put_u32(b, ver);
  put_u64(b, n_tensors);
  put_u64(b, n_kv);
}
static void put_tinfo(buf *b, const char *name, uint32_t n_dims,
                      const uint64_t *ne, uint32_t type, uint64_t offset) {
  put_str(b, name);
  put_u32(b, n_dims);
  for (uint32_t i = 0; i < n_dims; i++)
    put_u64(b, ne[i]);
  put_u32(b, type);
  put_u64(b, offset);
}
static void pad_to(buf *b, size_t align) {
  while (b->n % align)
    put_u8(b, 0);
}
static void put_fill(buf *b, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; i++)
    put_u8(b, (uint8_t)(seed + i * 7));
}

/* Opens an exact-size heap copy of b[0..n); returns the status and copies the
 * message to msg. Closes the result; checks that nothing leaked. */
static sl_status try_open(const uint8_t *p, size_t n, char *msg, size_t cap) {
  uint8_t *copy = malloc(n ? n : 1);
  if (n)
    memcpy(copy, p, n);
  size_t live = sl_malloc_live_bytes();
  sl_status st = SL_ERR_STATE;
  msg[0] = 0;
  sl_gguf_t *g = sl_gguf_open_mem(copy, n, &st, msg, cap);
  if (g) {
    CHECK_EQ_INT(st, SL_OK);
    sl_gguf_close(g);
  } else {
    CHECK(st != SL_OK);
    CHECK_MSG(msg[0] != 0, "no error message for status %d", st);
  }
  CHECK_EQ_INT(sl_malloc_live_bytes(), live);
  free(copy);
  return st;
}

/* ---- type info ------------------------------------------------------------
 */

static void test_type_info(void) {
  /* Values from gguf-py's GGML_QUANT_SIZES. */
  static const struct {
    sl_ggml_type t;
    const char *name;
    uint32_t be, bb;
  } want[] = {
      {SL_GGML_F32, "F32", 1, 4},       {SL_GGML_F16, "F16", 1, 2},
      {SL_GGML_BF16, "BF16", 1, 2},     {SL_GGML_Q4_0, "Q4_0", 32, 18},
      {SL_GGML_Q4_1, "Q4_1", 32, 20},   {SL_GGML_Q5_0, "Q5_0", 32, 22},
      {SL_GGML_Q5_1, "Q5_1", 32, 24},   {SL_GGML_Q8_0, "Q8_0", 32, 34},
      {SL_GGML_Q2_K, "Q2_K", 256, 84},  {SL_GGML_Q3_K, "Q3_K", 256, 110},
      {SL_GGML_Q4_K, "Q4_K", 256, 144}, {SL_GGML_Q5_K, "Q5_K", 256, 176},
      {SL_GGML_Q6_K, "Q6_K", 256, 210}, {SL_GGML_Q8_K, "Q8_K", 256, 292},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    uint32_t be = 0, bb = 0;
    CHECK(sl_ggml_type_info(want[i].t, &be, &bb));
    CHECK_EQ_INT(be, want[i].be);
    CHECK_EQ_INT(bb, want[i].bb);
    CHECK(strcmp(sl_ggml_type_name(want[i].t), want[i].name) == 0);
  }
  uint32_t be = 0;
  CHECK(sl_ggml_type_info(SL_GGML_Q4_K, &be, NULL) && be == 256);
  CHECK(!sl_ggml_type_info(SL_GGML_Q8_1, NULL, NULL));
  CHECK(!sl_ggml_type_info((sl_ggml_type)4, NULL, NULL));
  CHECK(!sl_ggml_type_info((sl_ggml_type)99, NULL, NULL));
  CHECK(strcmp(sl_ggml_type_name((sl_ggml_type)99), "unknown") == 0);
}

static void test_str_eq(void) {
  sl_str s = {"abcdef", 3};
  CHECK(sl_str_eq(s, "abc"));
  CHECK(!sl_str_eq(s, "ab"));
  CHECK(!sl_str_eq(s, "abcd"));
  CHECK(!sl_str_eq(s, "abd"));
  CHECK(sl_str_eq((sl_str){NULL, 0}, ""));
}

/* ---- the full synthetic file ----------------------------------------------
 */

/* One tensor of the full file: shape, type and its expected byte size. */
typedef struct tdesc {
  const char *name;
  uint32_t n_dims;
  uint64_t ne[4];
  uint32_t type;
  uint64_t nbytes;
} tdesc;

static const tdesc k_tensors[] = {
    {"t.f32", 2, {4, 3}, SL_GGML_F32, 48},
    {"t.f16", 1, {8}, SL_GGML_F16, 16},
    {"t.bf16", 3, {2, 2, 2}, SL_GGML_BF16, 16},
    {"t.q4_0", 2, {64, 2}, SL_GGML_Q4_0, 4 * 18},
    {"t.q4_1", 1, {32}, SL_GGML_Q4_1, 20},
    {"t.q5_0", 1, {32}, SL_GGML_Q5_0, 22},
    {"t.q5_1", 2, {32, 3}, SL_GGML_Q5_1, 72},
    {"t.q8_0", 4, {32, 1, 2, 1}, SL_GGML_Q8_0, 68},
    {"t.q2_k", 1, {256}, SL_GGML_Q2_K, 84},
    {"t.q3_k", 1, {256}, SL_GGML_Q3_K, 110},
    {"t.q4_k", 2, {512, 1}, SL_GGML_Q4_K, 288},
    {"t.q5_k", 1, {256}, SL_GGML_Q5_K, 176},
    {"t.q6_k", 1, {256}, SL_GGML_Q6_K, 210},
    {"t.q8_k", 1, {256}, SL_GGML_Q8_K, 292},
    {"t.empty", 2, {0, 5}, SL_GGML_F32, 0},
    {"t.scalar", 0, {0}, SL_GGML_F32, 4},
};
#define N_TENSORS (sizeof k_tensors / sizeof k_tensors[0])
#define N_KV      28

/* Builds the full file (every metadata type, arrays of every element type,
 * general.alignment = `align` unless 0, every tensor type). Stores each
 * tensor's data offset in offs[]. */
static void build_full(buf *b, uint32_t ver, uint32_t align, uint64_t *offs) {
  put_header(b, ver, N_TENSORS, align ? N_KV : N_KV - 1);
  put_key(b, "k.u8", SL_GGUF_UINT8);
  put_u8(b, 200);
  put_key(b, "k.i8", SL_GGUF_INT8);
  put_u8(b, (uint8_t)-100);
  put_key(b, "k.u16", SL_GGUF_UINT16);
  put_u16(b, 60000);
  put_key(b, "k.i16", SL_GGUF_INT16);
  put_u16(b, (uint16_t)-30000);
  put_key(b, "k.u32", SL_GGUF_UINT32);
  put_u32(b, 4000000000u);
  put_key(b, "k.i32", SL_GGUF_INT32);
  put_u32(b, (uint32_t)-2000000000);
  put_key(b, "k.f32", SL_GGUF_FLOAT32);
  put_f32(b, 1.5f);
  put_key(b, "k.bool", SL_GGUF_BOOL);
  put_u8(b, 1);
  put_key(b, "k.str", SL_GGUF_STRING);
  put_str(b, "hello, gguf");
  put_key(b, "k.u64", SL_GGUF_UINT64);
  put_u64(b, (1ull << 63) + 5);
  put_key(b, "k.i64", SL_GGUF_INT64);
  put_u64(b, (uint64_t) - (1ll << 62));
  put_key(b, "k.f64", SL_GGUF_FLOAT64);
  put_f64(b, 3.25);
  put_key(b, "k.bool0", SL_GGUF_BOOL);
  put_u8(b, 0);
  put_key(b, "k.emptystr", SL_GGUF_STRING);
  put_str(b, "");
  /* arrays */
  put_key(b, "a.u8", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_UINT8);
  put_u64(b, 3);
  put_u8(b, 1), put_u8(b, 2), put_u8(b, 255);
  put_key(b, "a.i8", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_INT8);
  put_u64(b, 2);
  put_u8(b, (uint8_t)-1), put_u8(b, 7);
  put_key(b, "a.u16", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_UINT16);
  put_u64(b, 2);
  put_u16(b, 65535), put_u16(b, 1);
  put_key(b, "a.i16", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_INT16);
  put_u64(b, 1);
  put_u16(b, (uint16_t)-2);
  put_key(b, "a.u32", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_UINT32);
  put_u64(b, 2);
  put_u32(b, 7), put_u32(b, 4294967295u);
  put_key(b, "a.i32", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_INT32);
  put_u64(b, 3);
  put_u32(b, 3), put_u32(b, (uint32_t)-3), put_u32(b, 1);
  put_key(b, "a.f32", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_FLOAT32);
  put_u64(b, 2);
  put_f32(b, -0.5f), put_f32(b, 1e-5f);
  put_key(b, "a.bool", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_BOOL);
  put_u64(b, 3);
  put_u8(b, 1), put_u8(b, 0), put_u8(b, 1);
  put_key(b, "a.str", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_STRING);
  put_u64(b, 3);
  put_str(b, "a"), put_str(b, ""), put_str(b, "ccc");
  put_key(b, "a.u64", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_UINT64);
  put_u64(b, 1);
  put_u64(b, UINT64_MAX);
  put_key(b, "a.i64", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_INT64);
  put_u64(b, 2);
  put_u64(b, (uint64_t)INT64_MIN), put_u64(b, 42);
  put_key(b, "a.f64", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_FLOAT64);
  put_u64(b, 1);
  put_f64(b, -2.5);
  put_key(b, "a.empty", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_UINT32);
  put_u64(b, 0);
  if (align) {
    put_key(b, "general.alignment", SL_GGUF_UINT32);
    put_u32(b, align);
  }
  uint32_t a = align ? align : 32;
  /* Tensor data laid out in order, each at the next aligned offset. */
  uint64_t off = 0;
  for (size_t i = 0; i < N_TENSORS; i++) {
    offs[i] = off;
    off += k_tensors[i].nbytes;
    off = (off + a - 1) / a * a;
  }
  /* Tensor infos in reverse order, so that table order != data order. */
  for (size_t j = N_TENSORS; j-- > 0;)
    put_tinfo(b, k_tensors[j].name, k_tensors[j].n_dims, k_tensors[j].ne,
              k_tensors[j].type, offs[j]);
  pad_to(b, a);
  size_t data_start = b->n;
  for (size_t i = 0; i < N_TENSORS; i++) {
    while (b->n < data_start + offs[i])
      put_u8(b, 0);
    put_fill(b, (size_t)k_tensors[i].nbytes, (uint8_t)(i * 13 + 1));
  }
}

static void check_full(const uint8_t *base, size_t size, sl_gguf_t *g,
                       uint32_t ver, uint32_t align, const uint64_t *offs) {
  uint32_t a = align ? align : 32;
  CHECK_EQ_INT(sl_gguf_version(g), ver);
  CHECK_EQ_INT(sl_gguf_alignment(g), a);
  CHECK_EQ_INT(sl_gguf_file_size(g), size);
  CHECK_EQ_INT(sl_gguf_data_offset(g) % a, 0);
  CHECK_EQ_INT(sl_gguf_n_kv(g), align ? N_KV : N_KV - 1);

  /* keys by index, and find() agrees */
  static const char *keys[] = {
      "k.u8",    "k.i8",       "k.u16",   "k.i16",
      "k.u32",   "k.i32",      "k.f32",   "k.bool",
      "k.str",   "k.u64",      "k.i64",   "k.f64",
      "k.bool0", "k.emptystr", "a.u8",    "a.i8",
      "a.u16",   "a.i16",      "a.u32",   "a.i32",
      "a.f32",   "a.bool",     "a.str",   "a.u64",
      "a.i64",   "a.f64",      "a.empty", "general.alignment"};
  for (int64_t i = 0; i < sl_gguf_n_kv(g); i++) {
    CHECK_MSG(sl_str_eq(sl_gguf_key(g, i), keys[i]), "key %lld", (long long)i);
    CHECK_EQ_INT(sl_gguf_find(g, keys[i]), i);
    CHECK(sl_gguf_get(g, keys[i]) == sl_gguf_value_at(g, i));
  }
  CHECK(sl_gguf_key(g, -1).ptr == NULL);
  CHECK(sl_gguf_key(g, sl_gguf_n_kv(g)).ptr == NULL);
  CHECK(sl_gguf_value_at(g, sl_gguf_n_kv(g)) == NULL);
  CHECK(sl_gguf_value_at(g, -1) == NULL);
  CHECK_EQ_INT(sl_gguf_find(g, "k.u"), -1);
  CHECK_EQ_INT(sl_gguf_find(g, "k.u88"), -1);
  CHECK_EQ_INT(sl_gguf_find(g, ""), -1);
  CHECK(sl_gguf_get(g, "nope") == NULL);

  /* scalar types as stored */
  CHECK_EQ_INT(sl_gguf_get(g, "k.u8")->type, SL_GGUF_UINT8);
  CHECK_EQ_INT(sl_gguf_get(g, "k.i16")->type, SL_GGUF_INT16);
  CHECK_EQ_INT(sl_gguf_get(g, "k.f32")->type, SL_GGUF_FLOAT32);
  CHECK_EQ_INT(sl_gguf_get(g, "a.u8")->type, SL_GGUF_ARRAY);

  uint64_t u = 0;
  int64_t s = 0;
  double f = 0;
  bool bo = false;
  sl_str str = {0};
  CHECK(sl_gguf_get_u64(g, "k.u8", &u) && u == 200);
  CHECK(sl_gguf_get_i64(g, "k.u8", &s) && s == 200);
  CHECK(sl_gguf_get_i64(g, "k.i8", &s) && s == -100);
  CHECK(!sl_gguf_get_u64(g, "k.i8", &u)); /* negative */
  CHECK(sl_gguf_get_u64(g, "k.u16", &u) && u == 60000);
  CHECK(sl_gguf_get_i64(g, "k.i16", &s) && s == -30000);
  CHECK(sl_gguf_get_u64(g, "k.u32", &u) && u == 4000000000u);
  CHECK(sl_gguf_get_i64(g, "k.u32", &s) && s == 4000000000ll);
  CHECK(sl_gguf_get_i64(g, "k.i32", &s) && s == -2000000000);
  CHECK(sl_gguf_get_f64(g, "k.f32", &f) && f == 1.5);
  CHECK(!sl_gguf_get_u64(g, "k.f32", &u));
  CHECK(!sl_gguf_get_i64(g, "k.f32", &s));
  CHECK(sl_gguf_get_bool(g, "k.bool", &bo) && bo == true);
  CHECK(sl_gguf_get_bool(g, "k.bool0", &bo) && bo == false);
  CHECK(!sl_gguf_get_bool(g, "k.u8", &bo));
  CHECK(!sl_gguf_get_u64(g, "k.bool", &u));
  CHECK(sl_gguf_get_str(g, "k.str", &str) && sl_str_eq(str, "hello, gguf"));
  CHECK(sl_gguf_get_str(g, "k.emptystr", &str) && str.len == 0);
  CHECK(!sl_gguf_get_str(g, "k.u8", &str));
  CHECK(!sl_gguf_get_u64(g, "k.str", &u));
  CHECK(sl_gguf_get_u64(g, "k.u64", &u) && u == (1ull << 63) + 5);
  CHECK(!sl_gguf_get_i64(g, "k.u64", &s)); /* > INT64_MAX */
  CHECK(sl_gguf_get_i64(g, "k.i64", &s) && s == -(1ll << 62));
  CHECK(sl_gguf_get_f64(g, "k.f64", &f) && f == 3.25);
  CHECK(!sl_gguf_get_f64(g, "k.i64", &f));
  CHECK(!sl_gguf_get_f64(g, "missing", &f));
  CHECK(!sl_gguf_get_u64(g, "a.u8", &u)); /* arrays are not scalars */
  CHECK(!sl_gguf_get_str(g, "a.str", &str));
  if (align)
    CHECK(sl_gguf_get_u64(g, "general.alignment", &u) && u == align);

  /* arrays */
  const sl_gguf_value *v;
  sl_gguf_value e;
  v = sl_gguf_get(g, "a.u8");
  CHECK(v->arr_type == SL_GGUF_UINT8 && v->arr_len == 3);
  CHECK(((const uint8_t *)v->arr_data)[2] == 255);
  CHECK(sl_gguf_arr_elem(v, 2, &e) && e.type == SL_GGUF_UINT8 &&
        e.v.u64 == 255);
  CHECK(!sl_gguf_arr_elem(v, 3, &e));
  v = sl_gguf_get(g, "a.i8");
  CHECK(v->arr_type == SL_GGUF_INT8 && v->arr_len == 2);
  CHECK(sl_gguf_arr_elem(v, 0, &e) && e.v.i64 == -1);
  CHECK(sl_gguf_arr_elem(v, 1, &e) && e.v.i64 == 7);
  v = sl_gguf_get(g, "a.u16");
  CHECK(sl_gguf_arr_elem(v, 0, &e) && e.v.u64 == 65535);
  v = sl_gguf_get(g, "a.i16");
  CHECK(v->arr_len == 1 && sl_gguf_arr_elem(v, 0, &e) && e.v.i64 == -2);
  v = sl_gguf_get(g, "a.u32");
  CHECK(sl_gguf_arr_elem(v, 1, &e) && e.type == SL_GGUF_UINT32 &&
        e.v.u64 == 4294967295u);
  v = sl_gguf_get(g, "a.i32");
  CHECK(v->arr_len == 3 && sl_gguf_arr_elem(v, 1, &e) && e.v.i64 == -3);
  int32_t raw;
  memcpy(&raw, (const uint8_t *)v->arr_data + 4, 4);
  CHECK(raw == -3);
  v = sl_gguf_get(g, "a.f32");
  CHECK(sl_gguf_arr_elem(v, 0, &e) && e.v.f64 == -0.5);
  CHECK(sl_gguf_arr_elem(v, 1, &e) && e.v.f64 == (double)1e-5f);
  v = sl_gguf_get(g, "a.bool");
  CHECK(sl_gguf_arr_elem(v, 1, &e) && e.type == SL_GGUF_BOOL && e.v.u64 == 0);
  CHECK(sl_gguf_arr_elem(v, 2, &e) && e.v.u64 == 1);
  v = sl_gguf_get(g, "a.str");
  CHECK(v->arr_type == SL_GGUF_STRING && v->arr_len == 3);
  CHECK(sl_str_eq(sl_gguf_arr_str(v, 0), "a"));
  CHECK(sl_gguf_arr_str(v, 1).len == 0);
  CHECK(sl_str_eq(sl_gguf_arr_str(v, 2), "ccc"));
  CHECK(sl_gguf_arr_str(v, 3).ptr == NULL);
  CHECK(sl_gguf_arr_elem(v, 2, &e) && e.type == SL_GGUF_STRING &&
        sl_str_eq(e.v.str, "ccc"));
  /* the string views point into the file */
  sl_str c = sl_gguf_arr_str(v, 2);
  CHECK((const uint8_t *)c.ptr > base && (const uint8_t *)c.ptr < base + size);
  CHECK(sl_gguf_arr_str(sl_gguf_get(g, "a.u8"), 0).ptr == NULL);
  CHECK(sl_gguf_arr_str(sl_gguf_get(g, "k.str"), 0).ptr == NULL);
  CHECK(!sl_gguf_arr_elem(sl_gguf_get(g, "k.u8"), 0, &e));
  v = sl_gguf_get(g, "a.u64");
  CHECK(sl_gguf_arr_elem(v, 0, &e) && e.v.u64 == UINT64_MAX);
  v = sl_gguf_get(g, "a.i64");
  CHECK(sl_gguf_arr_elem(v, 0, &e) && e.v.i64 == INT64_MIN);
  CHECK(sl_gguf_arr_elem(v, 1, &e) && e.v.i64 == 42);
  v = sl_gguf_get(g, "a.f64");
  CHECK(sl_gguf_arr_elem(v, 0, &e) && e.type == SL_GGUF_FLOAT64 &&
        e.v.f64 == -2.5);
  v = sl_gguf_get(g, "a.empty");
  CHECK(v->arr_len == 0 && v->arr_type == SL_GGUF_UINT32);
  CHECK(!sl_gguf_arr_elem(v, 0, &e));

  /* tensors: the table is in reverse order of k_tensors */
  CHECK_EQ_INT(sl_gguf_n_tensors(g), N_TENSORS);
  CHECK(sl_gguf_tensor_at(g, -1) == NULL);
  CHECK(sl_gguf_tensor_at(g, (int64_t)N_TENSORS) == NULL);
  CHECK(sl_gguf_find_tensor(g, "t.nope") == NULL);
  CHECK(sl_gguf_find_tensor(g, "t.q4") == NULL);
  for (size_t i = 0; i < N_TENSORS; i++) {
    const tdesc *d = &k_tensors[i];
    const sl_gguf_tensor *t = sl_gguf_find_tensor(g, d->name);
    CHECK_MSG(t != NULL, "tensor %s", d->name);
    if (!t)
      continue;
    CHECK(t == sl_gguf_tensor_at(g, (int64_t)(N_TENSORS - 1 - i)));
    CHECK(sl_str_eq(t->name, d->name));
    CHECK_EQ_INT(t->n_dims, d->n_dims);
    for (uint32_t k = 0; k < 4; k++)
      CHECK_EQ_INT(t->ne[k], k < d->n_dims ? d->ne[k] : 1);
    CHECK_EQ_INT(t->type, d->type);
    CHECK_EQ_INT(t->offset, offs[i]);
    CHECK_MSG(t->nbytes == d->nbytes, "%s: nbytes %llu want %llu", d->name,
              (unsigned long long)t->nbytes, (unsigned long long)d->nbytes);
    CHECK((const uint8_t *)t->data == base + sl_gguf_data_offset(g) + offs[i]);
    /* the data is the pattern put_fill wrote */
    const uint8_t *p = t->data;
    bool same = true;
    for (uint64_t k = 0; k < t->nbytes; k++)
      same &= p[k] == (uint8_t)((uint8_t)(i * 13 + 1) + k * 7);
    CHECK_MSG(same, "%s: data differs", d->name);
  }
}

static void test_full(uint32_t ver, uint32_t align) {
  buf b = {0};
  uint64_t offs[N_TENSORS];
  build_full(&b, ver, align, offs);
  uint8_t *copy = malloc(b.n);
  memcpy(copy, b.p, b.n);
  size_t live = sl_malloc_live_bytes();
  char msg[256] = "";
  sl_status st = SL_ERR_STATE;
  sl_gguf_t *g = sl_gguf_open_mem(copy, b.n, &st, msg, sizeof msg);
  CHECK_MSG(g != NULL, "open: %s", msg);
  CHECK_EQ_INT(st, SL_OK);
  if (g)
    check_full(copy, b.n, g, ver, align, offs);
  sl_gguf_close(g);
  CHECK_EQ_INT(sl_malloc_live_bytes(), live);
  free(copy);
  free(b.p);
}

static void test_full_v3_align64(void) {
  test_full(3, 64);
}
static void test_full_v2_default_align(void) {
  test_full(2, 0);
}
static void test_full_v3_align1(void) {
  test_full(3, 1);
}
static void test_full_v2_align256(void) {
  test_full(2, 256);
}

/* Every proper prefix of a valid file with tensors is malformed. */
static void test_truncations(void) {
  buf b = {0};
  uint64_t offs[N_TENSORS];
  build_full(&b, 3, 64, offs);
  char msg[256];
  int bad = 0;
  for (size_t n = 0; n < b.n; n++) {
    sl_status st = try_open(b.p, n, msg, sizeof msg);
    if (st != SL_ERR_FORMAT) {
      if (bad++ < 5)
        CHECK_MSG(0, "prefix of %zu/%zu bytes gave %d (%s)", n, b.n, st, msg);
    }
  }
  CHECK_EQ_INT(bad, 0);
  CHECK_EQ_INT(try_open(b.p, b.n, msg, sizeof msg), SL_OK);
  /* Extra bytes after the last tensor are allowed. */
  put_fill(&b, 5, 0);
  CHECK_EQ_INT(try_open(b.p, b.n, msg, sizeof msg), SL_OK);
  free(b.p);
}

/* Every allocation of an open may fail: NOMEM, no leak, and then success. */
static void test_alloc_failures(void) {
  buf b = {0};
  uint64_t offs[N_TENSORS];
  build_full(&b, 3, 64, offs);
  char msg[256];
  int n_fail = 0;
  for (uint64_t k = 1; k < 100; k++) {
    sl_malloc_fail_after(k);
    sl_status st = try_open(b.p, b.n, msg, sizeof msg);
    sl_malloc_fail_after(0);
    if (st == SL_OK)
      break;
    CHECK_MSG(st == SL_ERR_NOMEM, "fail at %llu gave %d: %s",
              (unsigned long long)k, st, msg);
    n_fail++;
  }
  CHECK(n_fail >= 4); /* struct, keys, vals, string table, indexes, ... */
  free(b.p);
}

/* ---- malformed files ------------------------------------------------------
 */

static void mk_tensor_file(buf *b, uint32_t align, const char *name,
                           uint32_t n_dims, const uint64_t *ne, uint32_t type,
                           uint64_t offset, size_t data_bytes) {
  put_header(b, 3, 1, align ? 1 : 0);
  if (align) {
    put_key(b, "general.alignment", SL_GGUF_UINT32);
    put_u32(b, align);
  }
  put_tinfo(b, name, n_dims, ne, type, offset);
  pad_to(b, align ? align : 32);
  put_fill(b, data_bytes, 3);
}

static void bad_magic(buf *b) {
  put(b, "GGUG", 4);
  put_u32(b, 3), put_u64(b, 0), put_u64(b, 0);
}
static void bad_version1(buf *b) {
  put_header(b, 1, 0, 0);
}
static void bad_version4(buf *b) {
  put_header(b, 4, 0, 0);
}
static void bad_version0(buf *b) {
  put_header(b, 0, 0, 0);
}
static void bad_big_endian(buf *b) {
  put_header(b, 0x03000000u, 0, 0);
}
static void bad_tiny(buf *b) {
  put(b, "GGUF\3\0\0\0", 8);
}
static void bad_huge_n_kv(buf *b) {
  put_header(b, 3, 0, 1ull << 62);
}
static void bad_huge_n_kv_max(buf *b) {
  put_header(b, 3, 0, UINT64_MAX);
  put_fill(b, 64, 0);
}
static void bad_huge_n_tensors(buf *b) {
  put_header(b, 3, UINT64_MAX / 2, 0);
  put_fill(b, 100, 0);
}
static void bad_key_len(buf *b) {
  put_header(b, 3, 0, 1);
  put_u64(b, 1000);
  put(b, "abc", 3);
  put_fill(b, 40, 0);
}
static void bad_key_len_max(buf *b) {
  put_header(b, 3, 0, 1);
  put_u64(b, UINT64_MAX);
  put_fill(b, 40, 1);
}
static void bad_str_len(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "s", SL_GGUF_STRING);
  put_u64(b, UINT64_MAX - 3);
  put(b, "xyz", 3);
}
static void bad_str_len_by_one(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "s", SL_GGUF_STRING);
  put_u64(b, 4);
  put(b, "xyz", 3);
}
static void bad_arr_count(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "a", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_UINT32);
  put_u64(b, 1ull << 61);
  put_u32(b, 1), put_u32(b, 2);
}
static void bad_arr_count_overflow(buf *b) {
  /* count * 8 wraps to a small number in 64 bits */
  put_header(b, 3, 0, 1);
  put_key(b, "a", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_UINT64);
  put_u64(b, (1ull << 61) + 1);
  put_u64(b, 1), put_u64(b, 2);
}
static void bad_str_arr_count(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "a", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_STRING);
  put_u64(b, UINT64_MAX);
  put_str(b, "x");
}
static void bad_str_arr_elem(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "a", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_STRING);
  put_u64(b, 2);
  put_str(b, "x");
  put_u64(b, 1u << 20);
  put_fill(b, 16, 0);
}
static void bad_nested(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "a", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_ARRAY);
  put_u64(b, 1);
  put_u32(b, SL_GGUF_UINT8);
  put_u64(b, 1);
  put_u8(b, 1);
}
static void bad_value_type(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "x", 13);
  put_u64(b, 0);
}
static void bad_value_type_huge(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "x", 0xffffffffu);
  put_u64(b, 0);
}
static void bad_arr_type(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "a", SL_GGUF_ARRAY);
  put_u32(b, 77);
  put_u64(b, 1);
  put_u64(b, 0);
}
static void bad_bool(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "b", SL_GGUF_BOOL);
  put_u8(b, 2);
}
static void bad_bool_arr(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "b", SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_BOOL);
  put_u64(b, 3);
  put_u8(b, 0), put_u8(b, 1), put_u8(b, 5);
}
static void bad_dup_key(buf *b) {
  put_header(b, 3, 0, 3);
  put_key(b, "a.b", SL_GGUF_UINT8);
  put_u8(b, 1);
  put_key(b, "a.c", SL_GGUF_UINT8);
  put_u8(b, 1);
  put_key(b, "a.b", SL_GGUF_STRING);
  put_str(b, "again");
}
static void bad_empty_key(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "", SL_GGUF_UINT8);
  put_u8(b, 1);
}
static void bad_align_npot(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "general.alignment", SL_GGUF_UINT32);
  put_u32(b, 48);
}
static void bad_align_zero(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "general.alignment", SL_GGUF_UINT32);
  put_u32(b, 0);
}
static void bad_align_huge(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "general.alignment", SL_GGUF_UINT64);
  put_u64(b, 1ull << 40);
}
static void bad_align_type(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "general.alignment", SL_GGUF_STRING);
  put_str(b, "32");
}
static void bad_align_negative(buf *b) {
  put_header(b, 3, 0, 1);
  put_key(b, "general.alignment", SL_GGUF_INT32);
  put_u32(b, (uint32_t)-32);
}
static void bad_n_dims(buf *b) {
  uint64_t ne[5] = {32, 1, 1, 1, 1};
  mk_tensor_file(b, 0, "w", 5, ne, SL_GGML_F32, 0, 128);
}
static void bad_n_dims_huge(buf *b) {
  put_header(b, 3, 1, 0);
  put_str(b, "w");
  put_u32(b, 0xffffffffu);
  put_fill(b, 64, 0);
}
static void bad_tensor_type(buf *b) {
  uint64_t ne[1] = {32};
  mk_tensor_file(b, 0, "w", 1, ne, 99, 0, 128);
}
static void bad_tensor_type_q8_1(buf *b) {
  uint64_t ne[1] = {32};
  mk_tensor_file(b, 0, "w", 1, ne, SL_GGML_Q8_1, 0, 128);
}
static void bad_tensor_type_gap(buf *b) {
  uint64_t ne[1] = {32};
  mk_tensor_file(b, 0, "w", 1, ne, 4, 0, 128); /* Q4_2, removed */
}
static void bad_block_multiple(buf *b) {
  uint64_t ne[2] = {33, 2};
  mk_tensor_file(b, 0, "blk.0.attn_q.weight", 2, ne, SL_GGML_Q4_0, 0, 256);
}
static void bad_block_multiple_k(buf *b) {
  uint64_t ne[1] = {128};
  mk_tensor_file(b, 0, "w", 1, ne, SL_GGML_Q4_K, 0, 256);
}
static void bad_ne_product(buf *b) {
  uint64_t ne[2] = {1ull << 32, 1ull << 32};
  mk_tensor_file(b, 0, "w", 2, ne, SL_GGML_F32, 0, 64);
}
static void bad_ne_product_wrap(buf *b) {
  /* 2^33 * 2^31 = 2^64 wraps to 0 */
  uint64_t ne[3] = {1ull << 33, 1ull << 16, 1ull << 15};
  mk_tensor_file(b, 0, "w", 3, ne, SL_GGML_F16, 0, 64);
}
static void bad_ne_range(buf *b) {
  uint64_t ne[1] = {UINT64_MAX};
  mk_tensor_file(b, 0, "w", 1, ne, SL_GGML_F32, 0, 64);
}
static void bad_nbytes_overflow(buf *b) {
  uint64_t ne[1] = {1ull << 62}; /* 2^62 elements * 4 bytes = 2^64 */
  mk_tensor_file(b, 0, "w", 1, ne, SL_GGML_F32, 0, 64);
}
static void bad_misaligned(buf *b) {
  uint64_t ne[1] = {4};
  mk_tensor_file(b, 0, "blk.0.attn_q.weight", 1, ne, SL_GGML_F32, 16, 64);
}
static void bad_misaligned_custom(buf *b) {
  uint64_t ne[1] = {4};
  mk_tensor_file(b, 128, "w", 1, ne, SL_GGML_F32, 64, 256);
}
static void bad_offset_past_end(buf *b) {
  uint64_t ne[1] = {16};
  mk_tensor_file(b, 0, "w", 1, ne, SL_GGML_F32, 64, 64);
}
static void bad_offset_huge(buf *b) {
  uint64_t ne[1] = {16};
  mk_tensor_file(b, 0, "w", 1, ne, SL_GGML_F32, UINT64_MAX - 31, 64);
}
static void bad_data_past_end(buf *b) {
  uint64_t ne[1] = {17}; /* 68 bytes, 64 present */
  mk_tensor_file(b, 0, "w", 1, ne, SL_GGML_F32, 0, 64);
}
static void bad_overlap(buf *b) {
  put_header(b, 3, 2, 0);
  uint64_t ne[1] = {16};
  put_tinfo(b, "a", 1, ne, SL_GGML_F32, 0);
  put_tinfo(b, "b", 1, ne, SL_GGML_F32, 32);
  pad_to(b, 32);
  put_fill(b, 128, 0);
}
static void bad_overlap_same(buf *b) {
  put_header(b, 3, 3, 0);
  uint64_t ne1[1] = {8}, ne2[1] = {64};
  put_tinfo(b, "a", 1, ne1, SL_GGML_F32, 0);
  put_tinfo(b, "c", 1, ne1, SL_GGML_F32, 128);
  put_tinfo(b, "b", 1, ne2, SL_GGML_F32, 32); /* covers c */
  pad_to(b, 32);
  put_fill(b, 512, 0);
}
static void bad_dup_tensor(buf *b) {
  put_header(b, 3, 2, 0);
  uint64_t ne[1] = {8};
  put_tinfo(b, "w", 1, ne, SL_GGML_F32, 0);
  put_tinfo(b, "w", 1, ne, SL_GGML_F32, 32);
  pad_to(b, 32);
  put_fill(b, 64, 0);
}
static void bad_empty_name(buf *b) {
  uint64_t ne[1] = {8};
  mk_tensor_file(b, 0, "", 1, ne, SL_GGML_F32, 0, 64);
}
static void bad_name_len(buf *b) {
  put_header(b, 3, 1, 0);
  put_u64(b, 1ull << 40);
  put_fill(b, 64, 0);
}
static void bad_no_data_section(buf *b) {
  /* a zero-size tensor, but the file ends before the aligned data start */
  put_header(b, 3, 1, 0);
  uint64_t ne[1] = {0};
  put_tinfo(b, "w", 1, ne, SL_GGML_F32, 0);
  if (b->n % 32 == 0)
    put_u8(b, 0);
}

typedef struct bad_case {
  const char *name;
  void (*mk)(buf *b);
  const char *want; /* substring of the message */
} bad_case;

static const bad_case k_bad[] = {
    {"magic", bad_magic, "bad magic"},
    {"version 1", bad_version1, "version 1 is not supported"},
    {"version 4", bad_version4, "unknown GGUF version 4"},
    {"version 0", bad_version0, "unknown GGUF version 0"},
    {"big endian", bad_big_endian, "big-endian"},
    {"tiny", bad_tiny, "too small"},
    {"huge n_kv", bad_huge_n_kv, "metadata count"},
    {"max n_kv", bad_huge_n_kv_max, "metadata count"},
    {"huge n_tensors", bad_huge_n_tensors, "tensor count"},
    {"key length", bad_key_len, "key: length 1000"},
    {"key length max", bad_key_len_max, "runs past the end"},
    {"string length", bad_str_len, "metadata 's': string value: length"},
    {"string length by one", bad_str_len_by_one, "runs past the end"},
    {"array count", bad_arr_count, "metadata 'a': array of"},
    {"array count wrap", bad_arr_count_overflow, "array of"},
    {"string array count", bad_str_arr_count, "string array of"},
    {"string array elem", bad_str_arr_elem, "array string 1"},
    {"nested array", bad_nested, "nested arrays"},
    {"value type", bad_value_type, "unknown value type 13"},
    {"value type huge", bad_value_type_huge, "unknown value type"},
    {"array type", bad_arr_type, "unknown array element type 77"},
    {"bool", bad_bool, "bool value 2"},
    {"bool array", bad_bool_arr, "bool array element 2"},
    {"dup key", bad_dup_key, "duplicate metadata key 'a.b'"},
    {"empty key", bad_empty_key, "empty key"},
    {"align npot", bad_align_npot, "48 is not a power of two"},
    {"align zero", bad_align_zero, "0 is not a power of two"},
    {"align huge", bad_align_huge, "not a power of two up to"},
    {"align type", bad_align_type, "must be an unsigned integer"},
    {"align negative", bad_align_negative, "must be an unsigned integer"},
    {"n_dims", bad_n_dims, "tensor 'w': n_dims 5"},
    {"n_dims huge", bad_n_dims_huge, "n_dims 4294967295"},
    {"tensor type", bad_tensor_type, "tensor type 99"},
    {"tensor type q8_1", bad_tensor_type_q8_1, "tensor type 9"},
    {"tensor type 4", bad_tensor_type_gap, "tensor type 4"},
    {"block multiple", bad_block_multiple,
     "tensor 'blk.0.attn_q.weight': ne[0] = 33 is not a multiple of the Q4_0 "
     "block size 32"},
    {"block multiple k", bad_block_multiple_k, "Q4_K block size 256"},
    {"ne product", bad_ne_product, "overflows"},
    {"ne product wrap", bad_ne_product_wrap, "overflows"},
    {"ne range", bad_ne_range, "out of range"},
    {"nbytes overflow", bad_nbytes_overflow, "byte size overflows"},
    {"misaligned", bad_misaligned,
     "tensor 'blk.0.attn_q.weight': data offset 16 not aligned to 32"},
    {"misaligned custom", bad_misaligned_custom,
     "data offset 64 not aligned to 128"},
    {"offset past end", bad_offset_past_end, "past the end of the data"},
    {"offset huge", bad_offset_huge, "past the end of the data"},
    {"data past end", bad_data_past_end, "tensor 'w': data [0, +68)"},
    {"overlap", bad_overlap, "overlaps"},
    {"overlap contained", bad_overlap_same,
     "tensor 'c' [128, +32) overlaps "
     "tensor 'b' [32, +256)"},
    {"dup tensor", bad_dup_tensor, "duplicate tensor name 'w'"},
    {"empty tensor name", bad_empty_name, "empty name"},
    {"tensor name length", bad_name_len, "tensor 0: name: length"},
    {"no data section", bad_no_data_section, "data section: starts at byte"},
};

static void test_malformed(void) {
  for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
    buf b = {0};
    k_bad[i].mk(&b);
    char msg[512];
    sl_status st = try_open(b.p, b.n, msg, sizeof msg);
    CHECK_MSG(st == SL_ERR_FORMAT, "case '%s': status %d (%s)", k_bad[i].name,
              st, msg);
    CHECK_MSG(strstr(msg, k_bad[i].want) != NULL,
              "case '%s': message '%s' lacks '%s'", k_bad[i].name, msg,
              k_bad[i].want);
    /* and every prefix of a malformed file is malformed too */
    for (size_t n = 0; n < b.n; n++) {
      st = try_open(b.p, n, msg, sizeof msg);
      CHECK_MSG(st == SL_ERR_FORMAT, "case '%s' cut at %zu: status %d (%s)",
                k_bad[i].name, n, st, msg);
    }
    free(b.p);
  }
}

/* Edge cases that are valid. */
static void test_valid_edges(void) {
  char msg[256];
  buf b = {0};
  put_header(&b, 3, 0, 0); /* header only */
  CHECK_EQ_INT(try_open(b.p, b.n, msg, sizeof msg), SL_OK);
  free(b.p);

  b = (buf){0};
  put_header(&b, 2, 0, 1); /* no tensors: no padding needed */
  put_key(&b, "general.alignment", SL_GGUF_UINT8);
  put_u8(&b, 16);
  CHECK_EQ_INT(try_open(b.p, b.n, msg, sizeof msg), SL_OK);
  sl_gguf_t *g = sl_gguf_open_mem(b.p, b.n, NULL, NULL, 0);
  CHECK(g && sl_gguf_alignment(g) == 16 && sl_gguf_n_tensors(g) == 0);
  sl_gguf_close(g);
  free(b.p);

  /* a zero-size tensor may share an offset with another tensor */
  b = (buf){0};
  put_header(&b, 3, 2, 0);
  uint64_t ne0[2] = {0, 3}, ne1[1] = {8};
  put_tinfo(&b, "empty", 2, ne0, SL_GGML_Q4_0, 0);
  put_tinfo(&b, "w", 1, ne1, SL_GGML_F32, 0);
  pad_to(&b, 32);
  put_fill(&b, 32, 0);
  CHECK_EQ_INT(try_open(b.p, b.n, msg, sizeof msg), SL_OK);
  free(b.p);

  /* NULL out-params are fine; NULL buffer is an argument error */
  CHECK(sl_gguf_open_mem("GGUF", 4, NULL, NULL, 0) == NULL);
  sl_status st = SL_OK;
  CHECK(sl_gguf_open_mem(NULL, 10, &st, NULL, 0) == NULL &&
        st == SL_ERR_INVALID_ARG);
  CHECK(sl_gguf_open_mem(NULL, 0, &st, msg, sizeof msg) == NULL &&
        st == SL_ERR_FORMAT);
  /* a tiny errcap still gives a NUL-terminated message */
  char small[8];
  memset(small, 'x', sizeof small);
  CHECK(sl_gguf_open_mem("GGUF\1\0\0\0"
                         "0000000000000000",
                         24, &st, small, sizeof small) == NULL);
  CHECK(st == SL_ERR_FORMAT && memchr(small, 0, sizeof small) != NULL);
  sl_gguf_close(NULL);
}

/* ---- files ----------------------------------------------------------------
 */

static void test_open_file(void) {
  buf b = {0};
  uint64_t offs[N_TENSORS];
  build_full(&b, 3, 64, offs);
  char path[] = "/tmp/sl_test_gguf_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd < 0)
    return;
  CHECK(write(fd, b.p, b.n) == (ssize_t)b.n);
  close(fd);

  char msg[512] = "";
  sl_status st = SL_ERR_STATE;
  size_t live = sl_malloc_live_bytes();
  sl_gguf_t *g = sl_gguf_open(path, &st, msg, sizeof msg);
  CHECK_MSG(g != NULL && st == SL_OK, "%s", msg);
  if (g) {
    const sl_gguf_tensor *t = sl_gguf_find_tensor(g, "t.q8_k");
    CHECK(t && t->nbytes == 292);
    size_t base = sl_gguf_data_offset(g);
    CHECK(t && memcmp(t->data, b.p + base + t->offset, 292) == 0);
    if (t)
      check_full((const uint8_t *)t->data - base - t->offset, b.n, g, 3, 64,
                 offs);
    sl_gguf_close(g);
  }
  CHECK_EQ_INT(sl_malloc_live_bytes(), live);

  /* a malformed file names itself in the message */
  fd = open(path, O_WRONLY | O_TRUNC);
  CHECK(write(fd, b.p, 100) == 100);
  close(fd);
  CHECK(sl_gguf_open(path, &st, msg, sizeof msg) == NULL);
  CHECK_EQ_INT(st, SL_ERR_FORMAT);
  CHECK_MSG(strstr(msg, path) != NULL, "%s", msg);

  fd = open(path, O_WRONLY | O_TRUNC); /* empty file */
  close(fd);
  CHECK(sl_gguf_open(path, &st, msg, sizeof msg) == NULL);
  CHECK_EQ_INT(st, SL_ERR_FORMAT);
  unlink(path);

  CHECK(sl_gguf_open(path, &st, msg, sizeof msg) == NULL);
  CHECK_EQ_INT(st, SL_ERR_IO);
  CHECK_MSG(strstr(msg, "cannot open") != NULL, "%s", msg);
  CHECK(sl_gguf_open("/tmp", &st, msg, sizeof msg) == NULL);
  CHECK_EQ_INT(st, SL_ERR_IO);
  CHECK_EQ_INT(sl_malloc_live_bytes(), live);
  free(b.p);
}

static const char *source_dir(void) {
  const char *s = getenv("SLUICE_SOURCE_DIR");
  return s ? s : ".";
}

/* The seed corpus is written by gguf-py (tests/fuzz/gen_gguf_corpus.py): an
 * independent writer. Its facts are fixed by that script. */
static void test_corpus_from_gguf_py(void) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/gguf", source_dir());
  char path[1400], msg[512];
  sl_status st;

  snprintf(path, sizeof path, "%s/tiny_v3.gguf", dir);
  sl_gguf_t *g = sl_gguf_open(path, &st, msg, sizeof msg);
  CHECK_MSG(g != NULL, "%s", msg);
  if (g) {
    sl_str s;
    uint64_t u;
    double f;
    CHECK_EQ_INT(sl_gguf_version(g), 3);
    CHECK(sl_gguf_get_str(g, "general.architecture", &s) &&
          sl_str_eq(s, "llama"));
    CHECK(sl_gguf_get_u64(g, "llama.block_count", &u) && u == 2);
    CHECK(sl_gguf_get_f64(g, "llama.rope.freq_base", &f) && f == 10000.0);
    const sl_gguf_value *v = sl_gguf_get(g, "tokenizer.ggml.tokens");
    CHECK(v && v->arr_len == 4 && sl_str_eq(sl_gguf_arr_str(v, 3), "ab"));
    v = sl_gguf_get(g, "tokenizer.ggml.scores");
    sl_gguf_value e;
    CHECK(v && sl_gguf_arr_elem(v, 1, &e) && e.v.f64 == -1.0);
    const sl_gguf_tensor *t = sl_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->type == SL_GGML_F32 && t->ne[0] == 8 && t->ne[1] == 4 &&
          t->nbytes == 128);
    if (t) {
      float x[2];
      memcpy(x, t->data, sizeof x);
      CHECK(x[0] == 0.0f && x[1] == 0.5f); /* arange(32) / 2 */
    }
    t = sl_gguf_find_tensor(g, "blk.0.attn_q.weight");
    CHECK(t && t->type == SL_GGML_Q8_0 && t->ne[0] == 32 && t->ne[1] == 2 &&
          t->nbytes == 68);
    sl_gguf_close(g);
  }
  snprintf(path, sizeof path, "%s/tiny_v2_align64.gguf", dir);
  g = sl_gguf_open(path, &st, msg, sizeof msg);
  CHECK_MSG(g != NULL, "%s", msg);
  if (g) {
    CHECK_EQ_INT(sl_gguf_version(g), 2);
    CHECK_EQ_INT(sl_gguf_alignment(g), 64);
    CHECK_EQ_INT(sl_gguf_data_offset(g) % 64, 0);
    CHECK(sl_gguf_n_tensors(g) >= 2);
    for (int64_t i = 0; i < sl_gguf_n_tensors(g); i++)
      CHECK(sl_gguf_tensor_at(g, i)->offset % 64 == 0);
    sl_gguf_close(g);
  }
  /* every seed opens */
  DIR *d = opendir(dir);
  CHECK_MSG(d != NULL, "no corpus at %s", dir);
  int n = 0;
  for (struct dirent *de; d && (de = readdir(d));) {
    if (de->d_name[0] == '.')
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    g = sl_gguf_open(path, &st, msg, sizeof msg);
    CHECK_MSG(g != NULL, "%s", msg);
    sl_gguf_close(g);
    n++;
  }
  if (d)
    closedir(d);
  CHECK(n >= 3);
}

/* Facts about SmolLM2-135M-Instruct.Q4_1.gguf, learned with gguf-py. */
/* ---- the weights' fingerprint ---------------------------------------------
 */

/* A file with one key and two F32 tensors: "small" (100 floats, hashed whole)
 * and "big" (4096 floats = 16 KiB: its first and last 4 KiB are sampled). */
static void fp_file(buf *b, uint32_t key_value) {
  put_header(b, 3, 2, 1);
  put_key(b, "general.file_type", SL_GGUF_UINT32);
  put_u32(b, key_value);
  uint64_t ne_small[1] = {100}, ne_big[1] = {4096};
  put_tinfo(b, "small", 1, ne_small, SL_GGML_F32, 0);
  put_tinfo(b, "big", 1, ne_big, SL_GGML_F32, 416); /* 400 rounded to 32 */
  pad_to(b, 32);
  put_fill(b, 416, 1);
  put_fill(b, 4096 * 4, 2);
}

/* The fingerprint of b's bytes with byte `at` (from the data section's start;
 * SIZE_MAX for none) xored with `x`. */
static void fp_of(const buf *b, size_t at, uint8_t x, uint8_t out[16]) {
  uint8_t *copy = malloc(b->n);
  memcpy(copy, b->p, b->n);
  sl_status st;
  char msg[256];
  sl_gguf_t *g = sl_gguf_open_mem(copy, b->n, &st, msg, sizeof msg);
  CHECK_MSG(g != NULL, "%s", msg);
  memset(out, 0, 16);
  if (g) {
    size_t off = sl_gguf_data_offset(g);
    sl_gguf_close(g);
    if (at != SIZE_MAX)
      copy[off + at] ^= x;
    g = sl_gguf_open_mem(copy, b->n, &st, msg, sizeof msg);
    CHECK(g != NULL);
    if (g)
      sl_gguf_fingerprint(g, out);
    sl_gguf_close(g);
  }
  free(copy);
}

static void test_fingerprint(void) {
  buf b = {0}, b2 = {0}, b3 = {0};
  fp_file(&b, 3);
  fp_file(&b2, 3); /* another file, the same bytes */
  fp_file(&b3, 4); /* one metadata value differs */
  uint8_t ref[16], fp[16];
  fp_of(&b, SIZE_MAX, 0, ref);
  fp_of(&b2, SIZE_MAX, 0, fp);
  CHECK(memcmp(ref, fp, 16) == 0); /* identical files: the same */
  uint8_t zero[16] = {0};
  CHECK(memcmp(ref, zero, 16) != 0);
  fp_of(&b3, SIZE_MAX, 0, fp);
  CHECK(memcmp(ref, fp, 16) != 0); /* metadata */
  /* one weight byte in the sampled region: another fingerprint */
  static const size_t sampled[] = {0,           57,         399, /* small */
                                   416,         416 + 4095,      /* big, head */
                                   416 + 12288, 416 + 16383};    /* big, tail */
  for (size_t i = 0; i < sizeof sampled / sizeof sampled[0]; i++) {
    fp_of(&b, sampled[i], 0x01, fp);
    CHECK_MSG(memcmp(ref, fp, 16) != 0, "byte %zu", sampled[i]);
  }
  /* ... and outside it (the middle 8 KiB of "big") the same, as stated */
  fp_of(&b, 416 + 4096, 0x01, fp);
  CHECK(memcmp(ref, fp, 16) == 0);
  fp_of(&b, 416 + 12287, 0x80, fp);
  CHECK(memcmp(ref, fp, 16) == 0);
  free(b.p);
  free(b2.p);
  free(b3.p);
}

static void test_real_model(void) {
  char path[1200];
  const char *env = getenv("SLUICE_MODEL");
  if (env)
    snprintf(path, sizeof path, "%s", env);
  else
    snprintf(path, sizeof path, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf",
             source_dir());
  if (access(path, R_OK) != 0) {
    fprintf(stderr, "   skipped: no model at %s\n", path);
    return;
  }
  char msg[512];
  sl_status st;
  uint64_t t0 = sl_now_ns();
  sl_gguf_t *g = sl_gguf_open(path, &st, msg, sizeof msg);
  fprintf(stderr, "   opened in %.2f ms\n", sl_ns_to_ms(sl_now_ns() - t0));
  CHECK_MSG(g != NULL, "%s", msg);
  if (!g)
    return;
  sl_str s;
  uint64_t u;
  double f;
  bool bo;
  CHECK_EQ_INT(sl_gguf_version(g), 3);
  CHECK_EQ_INT(sl_gguf_alignment(g), 32);
  CHECK_EQ_INT(sl_gguf_file_size(g), 98362432);
  CHECK_EQ_INT(sl_gguf_data_offset(g), 1785664);
  CHECK_EQ_INT(sl_gguf_n_kv(g), 33);
  CHECK(sl_gguf_get_str(g, "general.architecture", &s) &&
        sl_str_eq(s, "llama"));
  CHECK(sl_gguf_get_u64(g, "llama.block_count", &u) && u == 30);
  CHECK(sl_gguf_get_u64(g, "llama.embedding_length", &u) && u == 576);
  CHECK(sl_gguf_get_u64(g, "llama.attention.head_count_kv", &u) && u == 3);
  CHECK(sl_gguf_get_f64(g, "llama.rope.freq_base", &f) && f == 100000.0);
  CHECK(sl_gguf_get_f64(g, "llama.attention.layer_norm_rms_epsilon", &f) &&
        fabs(f - 1e-5) < 1e-12);
  CHECK(sl_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bo) && !bo);
  CHECK(sl_gguf_get_str(g, "tokenizer.ggml.model", &s) && sl_str_eq(s, "gpt2"));
  const sl_gguf_value *v = sl_gguf_get(g, "tokenizer.ggml.tokens");
  CHECK(v && v->type == SL_GGUF_ARRAY && v->arr_type == SL_GGUF_STRING &&
        v->arr_len == 49152);
  if (v) {
    CHECK(sl_str_eq(sl_gguf_arr_str(v, 0), "<|endoftext|>"));
    CHECK(sl_str_eq(sl_gguf_arr_str(v, 1), "<|im_start|>"));
    CHECK(sl_str_eq(sl_gguf_arr_str(v, 100), "t"));
    CHECK(sl_str_eq(sl_gguf_arr_str(v, 49151), "ectable"));
  }
  v = sl_gguf_get(g, "tokenizer.ggml.merges");
  CHECK(v && v->arr_len == 48900 &&
        sl_str_eq(sl_gguf_arr_str(v, 0), "\xc4\xa0 t"));
  v = sl_gguf_get(g, "tokenizer.ggml.token_type");
  sl_gguf_value e;
  CHECK(v && v->arr_type == SL_GGUF_INT32 && v->arr_len == 49152);
  CHECK(v && sl_gguf_arr_elem(v, 0, &e) && e.v.i64 == 3);
  CHECK(v && sl_gguf_arr_elem(v, 100, &e) && e.v.i64 == 1);

  CHECK_EQ_INT(sl_gguf_n_tensors(g), 272);
  const sl_gguf_tensor *t = sl_gguf_find_tensor(g, "token_embd.weight");
  CHECK(t != NULL);
  if (t) {
    CHECK_EQ_INT(t->type, SL_GGML_Q8_0);
    CHECK(t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152);
    CHECK_EQ_INT(t->nbytes, 30081024);
    CHECK_EQ_INT(t->offset, 0);
  }
  t = sl_gguf_find_tensor(g, "blk.0.ffn_down.weight");
  CHECK(t && t->type == SL_GGML_Q4_1 && t->ne[0] == 1536 && t->ne[1] == 576 &&
        t->nbytes == 552960);
  t = sl_gguf_find_tensor(g, "output_norm.weight");
  CHECK(t && t->type == SL_GGML_F32 && t->ne[0] == 576 &&
        t->offset == 96574464);
  if (t) {
    float x;
    memcpy(&x, t->data, 4);
    CHECK(x == 1.7578125f);
  }
  int n_q41 = 0, n_f32 = 0;
  for (int64_t i = 0; i < sl_gguf_n_tensors(g); i++) {
    const sl_gguf_tensor *ti = sl_gguf_tensor_at(g, i);
    n_q41 += ti->type == SL_GGML_Q4_1;
    n_f32 += ti->type == SL_GGML_F32;
  }
  CHECK_EQ_INT(n_q41, 210);
  CHECK_EQ_INT(n_f32, 61);
  char name[64];
  for (int l = 0; l < 30; l++) {
    snprintf(name, sizeof name, "blk.%d.attn_q.weight", l);
    CHECK_MSG(sl_gguf_find_tensor(g, name) != NULL, "%s", name);
  }
  CHECK(sl_gguf_find_tensor(g, "blk.30.attn_q.weight") == NULL);
  sl_gguf_close(g);
}

int main(void) {
  RUN(test_type_info);
  RUN(test_str_eq);
  RUN(test_full_v3_align64);
  RUN(test_full_v2_default_align);
  RUN(test_full_v3_align1);
  RUN(test_full_v2_align256);
  RUN(test_truncations);
  RUN(test_alloc_failures);
  RUN(test_malformed);
  RUN(test_valid_edges);
  RUN(test_open_file);
  RUN(test_corpus_from_gguf_py);
  RUN(test_fingerprint);
  RUN(test_real_model);
  return sl_test_finish();
}
