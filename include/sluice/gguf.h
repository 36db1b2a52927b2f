/* sluice — GGUF reader (versions 2 and 3).
 *
 * sl_gguf_open() mmaps the file read-only, validates the header, every
 * metadata entry and the tensor table (every offset and count is bounds
 * checked), and keeps borrowed views into the mapping. Nothing it returns
 * needs freeing except the sl_gguf_t itself; all strings and arrays are views
 * valid until sl_gguf_close(). A malformed file gets SL_ERR_FORMAT and a
 * message, never a crash.
 *
 * Threading: after open, every read-only function may be called from any
 * thread.
 */
#ifndef SLUICE_GGUF_H
#define SLUICE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/ggml_type.h"
#include "sluice/status.h"

typedef struct sl_gguf sl_gguf_t;

typedef enum sl_gguf_type {
  SL_GGUF_UINT8 = 0,
  SL_GGUF_INT8 = 1,
  SL_GGUF_UINT16 = 2,
  SL_GGUF_INT16 = 3,
  SL_GGUF_UINT32 = 4,
  SL_GGUF_INT32 = 5,
  SL_GGUF_FLOAT32 = 6,
  SL_GGUF_BOOL = 7,
  SL_GGUF_STRING = 8,
  SL_GGUF_ARRAY = 9,
  SL_GGUF_UINT64 = 10,
  SL_GGUF_INT64 = 11,
  SL_GGUF_FLOAT64 = 12,
} sl_gguf_type;

/* A string view (not NUL-terminated). */
typedef struct sl_str {
  const char *ptr;
  size_t len;
} sl_str;

/* One metadata value. For arrays, `arr_type`, `arr_len` and `arr_data` give
 * the element type, count and a pointer to the first element in the mapping;
 * that pointer may be unaligned, so read elements with memcpy or, simpler,
 * with sl_gguf_arr_elem(). For string arrays `arr_data` is instead a table of
 * `arr_len` sl_str built at open and owned by the sl_gguf_t; use
 * sl_gguf_arr_str(). Nested arrays are refused. */
typedef struct sl_gguf_value {
  sl_gguf_type type;
  union {
    uint64_t u64; /* every unsigned integer type and bool, widened */
    int64_t i64;  /* every signed integer type, widened */
    double f64;   /* FLOAT32 and FLOAT64, widened */
    sl_str str;
  } v;
  sl_gguf_type arr_type;
  uint64_t arr_len;
  const void *arr_data;
} sl_gguf_value;

typedef struct sl_gguf_tensor {
  sl_str name;
  uint32_t n_dims;
  uint64_t ne[4]; /* ne[0] is the innermost (contiguous) dimension */
  sl_ggml_type type;
  uint64_t offset; /* from the start of the data section */
  uint64_t nbytes;
  const void *data; /* view into the mapping */
} sl_gguf_tensor;

/* Opens and validates `path`. Stores the status in *st when `st` is not NULL
 * (SL_OK on success). On failure returns NULL with SL_ERR_IO, SL_ERR_FORMAT or
 * SL_ERR_NOMEM and, if `err` is not NULL, writes a message saying what is
 * wrong and where (at most errcap bytes, NUL-terminated). The caller closes
 * the result with sl_gguf_close(). */
sl_gguf_t *sl_gguf_open(const char *path, sl_status *st, char *err,
                        size_t errcap);

/* Same, over a caller-owned buffer that must outlive the result (fuzzing,
 * tests). A NULL `data` with a nonzero `size` gives SL_ERR_INVALID_ARG. */
sl_gguf_t *sl_gguf_open_mem(const void *data, size_t size, sl_status *st,
                            char *err, size_t errcap);

/* Frees `g` and unmaps its file; every view it handed out dies with it.
 * NULL is a no-op. */
void sl_gguf_close(sl_gguf_t *g);

uint32_t sl_gguf_version(const sl_gguf_t *g);
uint32_t sl_gguf_alignment(const sl_gguf_t *g);
size_t sl_gguf_file_size(const sl_gguf_t *g);
/* Byte offset of the data section from the start of the file (a multiple of
 * the alignment; tensor offsets are relative to it). */
size_t sl_gguf_data_offset(const sl_gguf_t *g);

/* Metadata. sl_gguf_key() returns {NULL, 0} and sl_gguf_value_at() NULL
 * when `i` is outside [0, n_kv). Keys are views, not NUL-terminated. */
int64_t sl_gguf_n_kv(const sl_gguf_t *g);
sl_str sl_gguf_key(const sl_gguf_t *g, int64_t i);
const sl_gguf_value *sl_gguf_value_at(const sl_gguf_t *g, int64_t i);
/* Index of `key`, or -1. */
int64_t sl_gguf_find(const sl_gguf_t *g, const char *key);
const sl_gguf_value *sl_gguf_get(const sl_gguf_t *g, const char *key);

/* Typed getters: return true and store the value when `key` exists with a
 * compatible type (any integer type for get_u64/get_i64 when in range; float
 * types for get_f64), else false. */
bool sl_gguf_get_u64(const sl_gguf_t *g, const char *key, uint64_t *out);
bool sl_gguf_get_i64(const sl_gguf_t *g, const char *key, int64_t *out);
bool sl_gguf_get_f64(const sl_gguf_t *g, const char *key, double *out);
bool sl_gguf_get_bool(const sl_gguf_t *g, const char *key, bool *out);
bool sl_gguf_get_str(const sl_gguf_t *g, const char *key, sl_str *out);

/* Element `i` of a string array (the array was validated at open); {NULL, 0}
 * when `v` is not a string array or `i` >= arr_len. */
sl_str sl_gguf_arr_str(const sl_gguf_value *v, uint64_t i);

/* Element `i` of any array, decoded into `*out` as a scalar value of type
 * v->arr_type (strings as views). Returns false when `v` is not an array or
 * `i` >= arr_len. */
bool sl_gguf_arr_elem(const sl_gguf_value *v, uint64_t i, sl_gguf_value *out);

/* Tensors. sl_gguf_tensor_at() returns NULL when `i` is outside
 * [0, n_tensors); sl_gguf_find_tensor() returns NULL for an unknown name.
 * Lookups by name use a hash index built at open. */
int64_t sl_gguf_n_tensors(const sl_gguf_t *g);
const sl_gguf_tensor *sl_gguf_tensor_at(const sl_gguf_t *g, int64_t i);
const sl_gguf_tensor *sl_gguf_find_tensor(const sl_gguf_t *g, const char *name);

/* Gives back to the OS the resident pages of the mapping that lie wholly
 * inside [p, p + n) (a range within a tensor's data), for a caller that has
 * copied that data elsewhere (e.g. repacked weights): madvise(MADV_DONTNEED)
 * on the page-aligned interior. The bytes stay readable: the mapping is a
 * private, unmodified file mapping, so a later read faults them in again
 * from the file. Returns the bytes released: 0 for a file opened with
 * sl_gguf_open_mem, a range smaller than a page or outside the mapping, or
 * a failing madvise. Any thread; the data must not be in use as a pointer
 * to keep resident. */
size_t sl_gguf_release_pages(const sl_gguf_t *g, const void *p, size_t n);

/* Bytes sampled at each end of a tensor's data by sl_gguf_fingerprint. */
#define SL_GGUF_FP_SAMPLE 4096

/* The weights' identity, for the prefix cache's key (DESIGN.md): XXH3-128
 * over, in order,
 *   - the file size (8 bytes, little-endian),
 *   - the header and metadata, bytes [0, data_offset) of the file: every key,
 *     value and tensor description (names, shapes, types, offsets),
 *   - for each tensor in file order, its data when nbytes <= 2 *
 *     SL_GGUF_FP_SAMPLE, else its first and its last SL_GGUF_FP_SAMPLE bytes.
 * Bytes in the middle of a large tensor are not read: two files that differ
 * only there get the same fingerprint (a stated sample, so that loading reads
 * at most 8 KiB per tensor). Writes 16 bytes to `out` (XXH128_canonical:
 * high half first, big-endian). Pure; any thread. */
void sl_gguf_fingerprint(const sl_gguf_t *g, uint8_t out[16]);

/* Block size (elements) and bytes per block of a ggml type that may appear in
 * a model file (sl_ggml_type_traits_of, in_files); false for a type sluice
 * does not know or one that never appears in model files (Q8_1).
 * Either out pointer may be NULL. sl_ggml_type_name() gives "unknown" for
 * such a type. */
bool sl_ggml_type_info(sl_ggml_type t, uint32_t *block_elems,
                       uint32_t *block_bytes);
const char *sl_ggml_type_name(sl_ggml_type t);

/* True when sl_str equals the C string `s`. */
bool sl_str_eq(sl_str a, const char *s);

#endif
