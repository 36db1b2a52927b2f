/* libFuzzer harness for the GGUF reader.
 *
 * Opens the input with sl_gguf_open_mem over an exact-size copy (so ASan
 * sees any read past its end), and on success touches every key, value,
 * array element and the first and last byte of every tensor, and checks the
 * invariants the reader promises: lookups find what the tables hold, tensor
 * data lies inside the buffer and is aligned, no two tensors' bytes overlap
 * at their starts. Failures must come with a status and a message.
 *
 *   CC=clang cmake -B build-fuzz -DSLUICE_FUZZ=ON -DSLUICE_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_gguf
 *   ./build-fuzz/fuzz_gguf -max_total_time=60 tests/fuzz/corpus/gguf
 * Seeds: tests/fuzz/gen_gguf_corpus.py.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sluice/gguf.h"
#include "sluice/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t g_sink;

static void touch(const void *p, size_t n) {
  if (n == 0)
    return;
  const uint8_t *b = p;
  g_sink += b[0] + b[n - 1];
}

static void check(int cond) {
  if (!cond)
    abort();
}

static void touch_value(const sl_gguf_value *v) {
  if (v->type == SL_GGUF_STRING) {
    touch(v->v.str.ptr, v->v.str.len);
    return;
  }
  if (v->type != SL_GGUF_ARRAY) {
    g_sink += v->v.u64;
    return;
  }
  check(v->arr_type != SL_GGUF_ARRAY);
  for (uint64_t i = 0; i < v->arr_len; i++) {
    sl_gguf_value e;
    check(sl_gguf_arr_elem(v, i, &e));
    check(e.type == v->arr_type);
    if (v->arr_type == SL_GGUF_STRING) {
      sl_str s = sl_gguf_arr_str(v, i);
      check(s.ptr == e.v.str.ptr && s.len == e.v.str.len);
      touch(s.ptr, s.len);
    } else {
      g_sink += e.v.u64;
    }
  }
  sl_gguf_value e;
  check(!sl_gguf_arr_elem(v, v->arr_len, &e));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *copy = malloc(size ? size : 1);
  if (!copy)
    return 0;
  memcpy(copy, data, size);
  size_t live = sl_malloc_live_bytes();
  char err[256];
  err[0] = 0;
  sl_status st = SL_OK;
  sl_gguf_t *g = sl_gguf_open_mem(copy, size, &st, err, sizeof err);
  if (!g) {
    check(st == SL_ERR_FORMAT && err[0] != 0);
    check(sl_malloc_live_bytes() == live);
    free(copy);
    return 0;
  }
  check(st == SL_OK);
  uint32_t align = sl_gguf_alignment(g);
  check(align != 0 && (align & (align - 1)) == 0);
  check(sl_gguf_file_size(g) == size);
  check(sl_gguf_data_offset(g) <= size);

  for (int64_t i = 0; i < sl_gguf_n_kv(g); i++) {
    sl_str k = sl_gguf_key(g, i);
    touch(k.ptr, k.len);
    const sl_gguf_value *v = sl_gguf_value_at(g, i);
    check(v != NULL);
    touch_value(v);
    /* look the key up by name when it has no NUL inside */
    if (k.len < 256 && memchr(k.ptr, 0, k.len) == NULL) {
      char name[256];
      memcpy(name, k.ptr, k.len);
      name[k.len] = 0;
      check(sl_gguf_find(g, name) == i);
      uint64_t u;
      int64_t s;
      double f;
      bool b;
      sl_str str;
      g_sink += sl_gguf_get_u64(g, name, &u) + sl_gguf_get_i64(g, name, &s) +
                sl_gguf_get_f64(g, name, &f) + sl_gguf_get_bool(g, name, &b) +
                sl_gguf_get_str(g, name, &str);
    }
  }
  check(sl_gguf_value_at(g, sl_gguf_n_kv(g)) == NULL);

  const uint8_t *end = copy + size;
  for (int64_t i = 0; i < sl_gguf_n_tensors(g); i++) {
    const sl_gguf_tensor *t = sl_gguf_tensor_at(g, i);
    check(t != NULL && t->n_dims <= 4);
    check(t->offset % align == 0);
    uint32_t be, bb;
    check(sl_ggml_type_info(t->type, &be, &bb));
    check(t->ne[0] % be == 0);
    const uint8_t *p = t->data;
    check(p >= copy && p <= end && t->nbytes <= (uint64_t)(end - p));
    check((size_t)(p - copy) % align == 0);
    touch(p, (size_t)t->nbytes);
    g_sink += (uintptr_t)sl_ggml_type_name(t->type);
    if (t->name.len < 256 && memchr(t->name.ptr, 0, t->name.len) == NULL) {
      char name[256];
      memcpy(name, t->name.ptr, t->name.len);
      name[t->name.len] = 0;
      check(sl_gguf_find_tensor(g, name) == t);
    }
  }
  check(sl_gguf_tensor_at(g, sl_gguf_n_tensors(g)) == NULL);
  sl_gguf_close(g);
  check(sl_malloc_live_bytes() == live);
  free(copy);
  return 0;
}
