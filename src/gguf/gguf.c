/* GGUF reader (versions 2 and 3), see include/sluice/gguf.h.
 *
 * Layout of a GGUF file (little-endian):
 *   header:   "GGUF", u32 version, u64 n_tensors, u64 n_kv
 *   metadata: n_kv x { string key, u32 type, value }
 *   tensors:  n_tensors x { string name, u32 n_dims, u64 ne[n_dims],
 *                           u32 ggml type, u64 offset }
 *   padding to general.alignment (default 32), then the data section;
 *   each tensor's offset is relative to the start of the data section.
 * A string is { u64 len, len bytes }; an array is { u32 elem type, u64 count,
 * count elements }.
 *
 * Every read is bounds checked against the bytes that remain, and every count
 * is checked against the smallest number of bytes its items could occupy
 * before anything is allocated, so host allocations stay within a small
 * multiple of the file size whatever the counts claim.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "sluice/gguf.h"
#include "sluice/util.h"

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_DIMS          4u
#define GGUF_HEADER_BYTES      24u
/* Smallest encodings: a key/value is key length (8) + type (4) + a 1-byte
 * value; a tensor info is name length (8) + n_dims (4) + type (4) + offset
 * (8); a string is its length (8). */
#define GGUF_MIN_KV_BYTES     13u
#define GGUF_MIN_TENSOR_BYTES 24u
#define GGUF_MIN_STRING_BYTES 8u

_Static_assert(sizeof(size_t) == 8, "sluice needs a 64-bit size_t");

/* Open-addressing hash index over names: slot holds (item index + 1), 0 is
 * empty. Capacity is a power of two at least twice the item count. */
typedef struct name_index {
  uint64_t *slots;
  size_t mask;
} name_index;

struct sl_gguf {
  const uint8_t *base; /* the file's bytes (mapping or caller's buffer) */
  size_t size;
  void *map; /* non-NULL when sl_gguf_open() mapped the file */
  uint32_t version;
  uint32_t alignment;
  size_t data_offset; /* start of the data section, from the file start */

  int64_t n_kv;
  sl_str *keys;        /* (n_kv) views into the mapping */
  sl_gguf_value *vals; /* (n_kv); string arrays own an sl_str table */
  name_index kv_index;

  int64_t n_tensors;
  sl_gguf_tensor *tensors; /* (n_tensors) */
  name_index tensor_index;
};

/* ---- type tables ----------------------------------------------------------
 */

/* The ggml types a model file may hold (sl_ggml_type_traits_of, in_files);
 * NULL for others. */
static const sl_ggml_type_traits *ggml_desc(uint32_t t) {
  const sl_ggml_type_traits *d = sl_ggml_type_traits_of((sl_ggml_type)t);
  return d && d->in_files ? d : NULL;
}

bool sl_ggml_type_info(sl_ggml_type t, uint32_t *block_elems,
                       uint32_t *block_bytes) {
  const sl_ggml_type_traits *d = ggml_desc((uint32_t)t);
  if (!d)
    return false;
  if (block_elems)
    *block_elems = d->blck_size;
  if (block_bytes)
    *block_bytes = d->type_size;
  return true;
}

const char *sl_ggml_type_name(sl_ggml_type t) {
  const sl_ggml_type_traits *d = ggml_desc((uint32_t)t);
  return d ? d->name : "unknown";
}

/* Encoded size of one scalar of GGUF type `t`; 0 for STRING, ARRAY and
 * unknown types. */
static size_t gguf_scalar_size(uint32_t t) {
  switch (t) {
  case SL_GGUF_UINT8:
  case SL_GGUF_INT8:
  case SL_GGUF_BOOL:
    return 1;
  case SL_GGUF_UINT16:
  case SL_GGUF_INT16:
    return 2;
  case SL_GGUF_UINT32:
  case SL_GGUF_INT32:
  case SL_GGUF_FLOAT32:
    return 4;
  case SL_GGUF_UINT64:
  case SL_GGUF_INT64:
  case SL_GGUF_FLOAT64:
    return 8;
  default:
    return 0;
  }
}

static const char *gguf_type_name(uint32_t t) {
  static const char *names[] = {
      "UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",  "FLOAT32",
      "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
  return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

bool sl_str_eq(sl_str a, const char *s) {
  size_t n = strlen(s);
  return a.len == n && (n == 0 || memcmp(a.ptr, s, n) == 0);
}

/* ---- the parser -----------------------------------------------------------
 */

typedef struct parser {
  const uint8_t *p;
  size_t size;
  size_t off;
  sl_status st;
  char *err;
  size_t errcap;
  char where[200]; /* what is being read, for messages */
} parser;

static bool failf(parser *ps, sl_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the first failure (status and message prefixed with ps->where).
 * Always returns false so that callers can `return failf(...)`. */
static bool failf(parser *ps, sl_status st, const char *fmt, ...) {
  if (ps->st != SL_OK)
    return false;
  ps->st = st;
  if (ps->err && ps->errcap > 0) {
    int n = 0;
    if (ps->where[0])
      n = snprintf(ps->err, ps->errcap, "%s: ", ps->where);
    if (n < 0 || (size_t)n >= ps->errcap)
      return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err + n, ps->errcap - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return false;
}

static void set_where(parser *ps, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_where(parser *ps, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ps->where, sizeof ps->where, fmt, ap);
  va_end(ap);
}

static size_t remaining(const parser *ps) {
  return ps->size - ps->off;
}

/* Fails unless `n` more bytes can be read. */
static bool need(parser *ps, uint64_t n, const char *what) {
  if (n > remaining(ps))
    return failf(ps, SL_ERR_FORMAT,
                 "%s at byte offset %zu needs %llu bytes but only %zu remain",
                 what, ps->off, (unsigned long long)n, remaining(ps));
  return true;
}

static bool rd_bytes(parser *ps, void *dst, size_t n, const char *what) {
  if (!need(ps, n, what))
    return false;
  memcpy(dst, ps->p + ps->off, n);
  ps->off += n;
  return true;
}

static bool rd_u32(parser *ps, uint32_t *v, const char *what) {
  return rd_bytes(ps, v, sizeof *v, what);
}

static bool rd_u64(parser *ps, uint64_t *v, const char *what) {
  return rd_bytes(ps, v, sizeof *v, what);
}

static bool rd_str(parser *ps, sl_str *s, const char *what) {
  uint64_t len;
  if (!rd_u64(ps, &len, what))
    return false;
  if (len > remaining(ps))
    return failf(ps, SL_ERR_FORMAT,
                 "%s: length %llu at byte offset %zu runs past the end of the "
                 "file (%zu bytes remain)",
                 what, (unsigned long long)len, ps->off - 8, remaining(ps));
  s->ptr = (const char *)ps->p + ps->off;
  s->len = (size_t)len;
  ps->off += (size_t)len;
  return true;
}

/* Decodes one scalar of type `t` (not STRING/ARRAY) at `src` into `v`. */
static void decode_scalar(uint32_t t, const uint8_t *src, sl_gguf_value *v) {
  memset(v, 0, sizeof *v);
  v->type = (sl_gguf_type)t;
  switch (t) {
  case SL_GGUF_UINT8:
  case SL_GGUF_BOOL:
    v->v.u64 = src[0];
    break;
  case SL_GGUF_INT8:
    v->v.i64 = (int8_t)src[0];
    break;
  case SL_GGUF_UINT16: {
    uint16_t x;
    memcpy(&x, src, 2);
    v->v.u64 = x;
    break;
  }
  case SL_GGUF_INT16: {
    int16_t x;
    memcpy(&x, src, 2);
    v->v.i64 = x;
    break;
  }
  case SL_GGUF_UINT32: {
    uint32_t x;
    memcpy(&x, src, 4);
    v->v.u64 = x;
    break;
  }
  case SL_GGUF_INT32: {
    int32_t x;
    memcpy(&x, src, 4);
    v->v.i64 = x;
    break;
  }
  case SL_GGUF_FLOAT32: {
    float x;
    memcpy(&x, src, 4);
    v->v.f64 = x;
    break;
  }
  case SL_GGUF_UINT64:
    memcpy(&v->v.u64, src, 8);
    break;
  case SL_GGUF_INT64:
    memcpy(&v->v.i64, src, 8);
    break;
  case SL_GGUF_FLOAT64:
    memcpy(&v->v.f64, src, 8);
    break;
  default:
    SL_ASSERT_MSG(0, "decode_scalar: not a scalar type");
  }
}

/* Parses a value of type `t` into `v`. String arrays get an sl_str table
 * allocated here (owned by v->arr_data, freed by gguf_free). */
static bool parse_value(parser *ps, uint32_t t, sl_gguf_value *v) {
  memset(v, 0, sizeof *v);
  v->type = (sl_gguf_type)t;
  if (t == SL_GGUF_STRING)
    return rd_str(ps, &v->v.str, "string value");
  if (t != SL_GGUF_ARRAY) {
    size_t sz = gguf_scalar_size(t);
    if (sz == 0)
      return failf(ps, SL_ERR_FORMAT, "unknown value type %u", t);
    if (!need(ps, sz, "value"))
      return false;
    decode_scalar(t, ps->p + ps->off, v);
    if (t == SL_GGUF_BOOL && v->v.u64 > 1)
      return failf(ps, SL_ERR_FORMAT, "bool value %llu at byte offset %zu",
                   (unsigned long long)v->v.u64, ps->off);
    ps->off += sz;
    return true;
  }

  uint32_t et;
  uint64_t n;
  if (!rd_u32(ps, &et, "array element type") || !rd_u64(ps, &n, "array length"))
    return false;
  if (et == SL_GGUF_ARRAY)
    return failf(ps, SL_ERR_FORMAT, "nested arrays are not supported");
  v->arr_type = (sl_gguf_type)et;
  v->arr_len = n;
  if (et == SL_GGUF_STRING) {
    if (n > remaining(ps) / GGUF_MIN_STRING_BYTES)
      return failf(ps, SL_ERR_FORMAT,
                   "string array of %llu elements at byte offset %zu cannot "
                   "fit in the %zu bytes that remain",
                   (unsigned long long)n, ps->off, remaining(ps));
    if (n == 0)
      return true;
    sl_str *tab = sl_calloc((size_t)n, sizeof *tab);
    if (!tab)
      return failf(ps, SL_ERR_NOMEM, "out of memory for a %llu-string array",
                   (unsigned long long)n);
    v->arr_data = tab;
    for (uint64_t i = 0; i < n; i++) {
      char what[64];
      snprintf(what, sizeof what, "array string %llu", (unsigned long long)i);
      if (!rd_str(ps, &tab[i], what))
        return false;
    }
    return true;
  }
  size_t esz = gguf_scalar_size(et);
  if (esz == 0)
    return failf(ps, SL_ERR_FORMAT, "unknown array element type %u", et);
  if (n > remaining(ps) / esz)
    return failf(ps, SL_ERR_FORMAT,
                 "array of %llu %s elements at byte offset %zu runs past the "
                 "end of the file (%zu bytes remain)",
                 (unsigned long long)n, gguf_type_name(et), ps->off,
                 remaining(ps));
  const uint8_t *data = ps->p + ps->off;
  if (et == SL_GGUF_BOOL)
    for (uint64_t i = 0; i < n; i++)
      if (data[i] > 1)
        return failf(ps, SL_ERR_FORMAT, "bool array element %llu is %u",
                     (unsigned long long)i, data[i]);
  v->arr_data = data;
  ps->off += (size_t)(n * esz);
  return true;
}

/* ---- name index -----------------------------------------------------------
 */

static uint64_t hash_name(const char *p, size_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++) {
    h ^= (uint8_t)p[i];
    h *= 1099511628211ull;
  }
  return h;
}

typedef sl_str (*name_of_fn)(const sl_gguf_t *g, int64_t i);

static sl_str kv_name(const sl_gguf_t *g, int64_t i) {
  return g->keys[i];
}
static sl_str tensor_name(const sl_gguf_t *g, int64_t i) {
  return g->tensors[i].name;
}

static bool name_eq(sl_str a, const char *p, size_t n) {
  return a.len == n && (n == 0 || memcmp(a.ptr, p, n) == 0);
}

/* Index of the item named (p, n), or -1. */
static int64_t index_find(const sl_gguf_t *g, const name_index *ix,
                          name_of_fn name_of, const char *p, size_t n) {
  if (!ix->slots)
    return -1;
  for (size_t s = hash_name(p, n) & ix->mask;; s = (s + 1) & ix->mask) {
    uint64_t e = ix->slots[s];
    if (e == 0)
      return -1;
    if (name_eq(name_of(g, (int64_t)(e - 1)), p, n))
      return (int64_t)(e - 1);
  }
}

/* Builds the index over `n` items. On a duplicate name fails with
 * SL_ERR_FORMAT naming it (`what` is "metadata key" or "tensor name"). */
static bool index_build(parser *ps, const sl_gguf_t *g, name_index *ix,
                        name_of_fn name_of, int64_t n, const char *what) {
  if (n == 0)
    return true;
  size_t cap = 8;
  while (cap < (size_t)n * 2)
    cap *= 2;
  ix->slots = sl_calloc(cap, sizeof *ix->slots);
  if (!ix->slots)
    return failf(ps, SL_ERR_NOMEM, "out of memory for the %s index", what);
  ix->mask = cap - 1;
  for (int64_t i = 0; i < n; i++) {
    sl_str nm = name_of(g, i);
    size_t s = hash_name(nm.ptr, nm.len) & ix->mask;
    for (; ix->slots[s] != 0; s = (s + 1) & ix->mask)
      if (name_eq(name_of(g, (int64_t)(ix->slots[s] - 1)), nm.ptr, nm.len)) {
        ps->where[0] = 0;
        return failf(ps, SL_ERR_FORMAT,
                     "duplicate %s '%.*s' (entries %lld "
                     "and %lld)",
                     what, (int)(nm.len > 80 ? 80 : nm.len), nm.ptr,
                     (long long)(ix->slots[s] - 1), (long long)i);
      }
    ix->slots[s] = (uint64_t)i + 1;
  }
  return true;
}

/* ---- open / close ---------------------------------------------------------
 */

static void gguf_free(sl_gguf_t *g) {
  if (!g)
    return;
  if (g->vals)
    for (int64_t i = 0; i < g->n_kv; i++)
      if (g->vals[i].type == SL_GGUF_ARRAY &&
          g->vals[i].arr_type == SL_GGUF_STRING)
        sl_free((void *)g->vals[i].arr_data);
  sl_free(g->vals);
  sl_free(g->keys);
  sl_free(g->tensors);
  sl_free(g->kv_index.slots);
  sl_free(g->tensor_index.slots);
  if (g->map)
    munmap(g->map, g->size);
  sl_free(g);
}

static int cmp_by_offset(const void *a, const void *b) {
  const sl_gguf_tensor *x = *(const sl_gguf_tensor *const *)a;
  const sl_gguf_tensor *y = *(const sl_gguf_tensor *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int name_len_for_msg(sl_str s) {
  return (int)(s.len > 80 ? 80 : s.len);
}

static bool parse_header(parser *ps, sl_gguf_t *g, uint64_t *n_tensors,
                         uint64_t *n_kv) {
  set_where(ps, "header");
  if (ps->size < GGUF_HEADER_BYTES)
    return failf(ps, SL_ERR_FORMAT,
                 "file is %zu bytes, too small for a GGUF header (%u)",
                 ps->size, GGUF_HEADER_BYTES);
  if (memcmp(ps->p, "GGUF", 4) != 0)
    return failf(ps, SL_ERR_FORMAT,
                 "bad magic %02x %02x %02x %02x (expected \"GGUF\")", ps->p[0],
                 ps->p[1], ps->p[2], ps->p[3]);
  ps->off = 4;
  uint32_t ver;
  rd_u32(ps, &ver, "version");
  if (ver == 1)
    return failf(ps, SL_ERR_FORMAT,
                 "GGUF version 1 is not supported (only "
                 "versions 2 and 3); re-convert the model");
  if (ver != 2 && ver != 3) {
    uint32_t sw = __builtin_bswap32(ver);
    if (sw == 2 || sw == 3)
      return failf(ps, SL_ERR_FORMAT, "big-endian GGUF is not supported");
    return failf(ps, SL_ERR_FORMAT, "unknown GGUF version %u", ver);
  }
  g->version = ver;
  rd_u64(ps, n_tensors, "tensor count");
  rd_u64(ps, n_kv, "metadata count");
  /* A count that could not fit in the rest of the file is refused before
   * anything is allocated for it. */
  if (*n_kv > remaining(ps) / GGUF_MIN_KV_BYTES)
    return failf(ps, SL_ERR_FORMAT,
                 "metadata count %llu cannot fit in the %zu bytes that follow",
                 (unsigned long long)*n_kv, remaining(ps));
  if (*n_tensors > remaining(ps) / GGUF_MIN_TENSOR_BYTES)
    return failf(ps, SL_ERR_FORMAT,
                 "tensor count %llu cannot fit in the %zu bytes that follow",
                 (unsigned long long)*n_tensors, remaining(ps));
  return true;
}

static bool parse_metadata(parser *ps, sl_gguf_t *g, uint64_t n_kv) {
  g->keys = sl_calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->keys);
  g->vals = sl_calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->vals);
  if (!g->keys || !g->vals)
    return failf(ps, SL_ERR_NOMEM, "out of memory for %llu metadata entries",
                 (unsigned long long)n_kv);
  for (uint64_t i = 0; i < n_kv; i++) {
    set_where(ps, "metadata entry %llu", (unsigned long long)i);
    sl_str key;
    uint32_t t;
    if (!rd_str(ps, &key, "key"))
      return false;
    g->keys[i] = key;
    /* Count the entry before parsing its value, so that gguf_free sees a
     * string table allocated by a value that then fails half-way. */
    g->n_kv = (int64_t)i + 1;
    set_where(ps, "metadata '%.*s'", name_len_for_msg(key), key.ptr);
    if (key.len == 0)
      return failf(ps, SL_ERR_FORMAT, "empty key");
    if (!rd_u32(ps, &t, "value type") || !parse_value(ps, t, &g->vals[i]))
      return false;
  }
  ps->where[0] = 0;
  return index_build(ps, g, &g->kv_index, kv_name, g->n_kv, "metadata key");
}

static bool parse_alignment(parser *ps, sl_gguf_t *g) {
  g->alignment = GGUF_DEFAULT_ALIGNMENT;
  int64_t i = index_find(g, &g->kv_index, kv_name, "general.alignment",
                         strlen("general.alignment"));
  if (i < 0)
    return true;
  set_where(ps, "metadata 'general.alignment'");
  uint64_t a;
  if (!sl_gguf_get_u64(g, "general.alignment", &a))
    return failf(ps, SL_ERR_FORMAT, "must be an unsigned integer, not %s",
                 gguf_type_name(g->vals[i].type));
  if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30))
    return failf(ps, SL_ERR_FORMAT, "%llu is not a power of two up to 2^30",
                 (unsigned long long)a);
  g->alignment = (uint32_t)a;
  return true;
}

/* Size in bytes of a tensor of type `d` and shape ne, with overflow checks. */
static bool tensor_nbytes(parser *ps, const sl_ggml_type_traits *d,
                          const uint64_t ne[4], uint64_t *out) {
  if (ne[0] % d->blck_size != 0)
    return failf(ps, SL_ERR_FORMAT,
                 "ne[0] = %llu is not a multiple of the %s block size %u",
                 (unsigned long long)ne[0], d->name, d->blck_size);
  uint64_t nel = ne[0];
  for (int k = 1; k < 4; k++)
    if (__builtin_mul_overflow(nel, ne[k], &nel) || nel > INT64_MAX)
      return failf(ps, SL_ERR_FORMAT,
                   "element count %llu x %llu x %llu x %llu overflows",
                   (unsigned long long)ne[0], (unsigned long long)ne[1],
                   (unsigned long long)ne[2], (unsigned long long)ne[3]);
  uint64_t n = 0;
  if (__builtin_mul_overflow(nel / d->blck_size, (uint64_t)d->type_size, &n))
    return failf(ps, SL_ERR_FORMAT, "byte size overflows");
  *out = n;
  return true;
}

static bool parse_tensors(parser *ps, sl_gguf_t *g, uint64_t n_tensors) {
  g->tensors = sl_calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
  if (!g->tensors)
    return failf(ps, SL_ERR_NOMEM, "out of memory for %llu tensors",
                 (unsigned long long)n_tensors);
  for (uint64_t i = 0; i < n_tensors; i++) {
    sl_gguf_tensor *t = &g->tensors[i];
    set_where(ps, "tensor %llu", (unsigned long long)i);
    if (!rd_str(ps, &t->name, "name"))
      return false;
    set_where(ps, "tensor '%.*s'", name_len_for_msg(t->name), t->name.ptr);
    if (t->name.len == 0)
      return failf(ps, SL_ERR_FORMAT, "empty name");
    if (!rd_u32(ps, &t->n_dims, "n_dims"))
      return false;
    if (t->n_dims > GGUF_MAX_DIMS)
      return failf(ps, SL_ERR_FORMAT, "n_dims %u is more than %u", t->n_dims,
                   GGUF_MAX_DIMS);
    for (uint32_t k = 0; k < 4; k++) {
      t->ne[k] = 1;
      if (k < t->n_dims && !rd_u64(ps, &t->ne[k], "ne"))
        return false;
      if (t->ne[k] > INT64_MAX)
        return failf(ps, SL_ERR_FORMAT, "ne[%u] = %llu is out of range", k,
                     (unsigned long long)t->ne[k]);
    }
    uint32_t type;
    if (!rd_u32(ps, &type, "type") || !rd_u64(ps, &t->offset, "offset"))
      return false;
    const sl_ggml_type_traits *d = ggml_desc(type);
    if (!d)
      return failf(ps, SL_ERR_FORMAT, "unknown or unsupported tensor type %u",
                   type);
    t->type = (sl_ggml_type)type;
    if (!tensor_nbytes(ps, d, t->ne, &t->nbytes))
      return false;
    if (t->offset % g->alignment != 0)
      return failf(ps, SL_ERR_FORMAT, "data offset %llu not aligned to %u",
                   (unsigned long long)t->offset, g->alignment);
    g->n_tensors = (int64_t)i + 1;
  }

  /* The data section starts at the next alignment boundary. */
  set_where(ps, "data section");
  uint64_t start =
      ((uint64_t)ps->off + g->alignment - 1) & ~((uint64_t)g->alignment - 1);
  if (n_tensors > 0 && start > ps->size)
    return failf(ps, SL_ERR_FORMAT,
                 "starts at byte %llu, past the end of the file (%zu bytes)",
                 (unsigned long long)start, ps->size);
  g->data_offset = start > ps->size ? ps->size : (size_t)start;
  size_t data_size = ps->size - g->data_offset;

  for (int64_t i = 0; i < g->n_tensors; i++) {
    sl_gguf_tensor *t = &g->tensors[i];
    if (t->offset > data_size || t->nbytes > data_size - t->offset) {
      set_where(ps, "tensor '%.*s'", name_len_for_msg(t->name), t->name.ptr);
      return failf(ps, SL_ERR_FORMAT,
                   "data [%llu, +%llu) runs past the end of the data section "
                   "(%zu bytes)",
                   (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                   data_size);
    }
    t->data = g->base + g->data_offset + t->offset;
  }

  ps->where[0] = 0;
  if (!index_build(ps, g, &g->tensor_index, tensor_name, g->n_tensors,
                   "tensor name"))
    return false;

  /* No two tensors' bytes may overlap. */
  if (g->n_tensors > 1) {
    const sl_gguf_tensor **by_off =
        sl_calloc((size_t)g->n_tensors, sizeof *by_off);
    if (!by_off)
      return failf(ps, SL_ERR_NOMEM, "out of memory checking tensor overlap");
    for (int64_t i = 0; i < g->n_tensors; i++)
      by_off[i] = &g->tensors[i];
    qsort(by_off, (size_t)g->n_tensors, sizeof *by_off, cmp_by_offset);
    const sl_gguf_tensor *prev = NULL; /* the non-empty tensor ending last */
    bool ok = true;
    for (int64_t i = 0; i < g->n_tensors && ok; i++) {
      const sl_gguf_tensor *t = by_off[i];
      if (t->nbytes == 0)
        continue;
      if (prev && t->offset < prev->offset + prev->nbytes) {
        failf(ps, SL_ERR_FORMAT,
              "tensor '%.*s' [%llu, +%llu) overlaps tensor '%.*s' "
              "[%llu, +%llu)",
              name_len_for_msg(t->name), t->name.ptr,
              (unsigned long long)t->offset, (unsigned long long)t->nbytes,
              name_len_for_msg(prev->name), prev->name.ptr,
              (unsigned long long)prev->offset,
              (unsigned long long)prev->nbytes);
        ok = false;
      }
      if (!prev || t->offset + t->nbytes > prev->offset + prev->nbytes)
        prev = t;
    }
    sl_free(by_off);
    if (!ok)
      return false;
  }
  return true;
}

/* Parses `size` bytes at `base` into a new sl_gguf_t that owns `map` (may be
 * NULL) from then on, even on failure. */
static sl_gguf_t *gguf_parse(const uint8_t *base, size_t size, void *map,
                             sl_status *st, char *err, size_t errcap) {
  parser ps = {.p = base, .size = size, .err = err, .errcap = errcap};
  if (err && errcap)
    err[0] = 0;
  sl_gguf_t *g = sl_calloc(1, sizeof *g);
  if (!g) {
    if (map)
      munmap(map, size);
    failf(&ps, SL_ERR_NOMEM, "out of memory");
    goto fail_report;
  }
  g->base = base;
  g->size = size;
  g->map = map;

  uint64_t n_tensors = 0, n_kv = 0;
  if (!parse_header(&ps, g, &n_tensors, &n_kv) ||
      !parse_metadata(&ps, g, n_kv) || !parse_alignment(&ps, g) ||
      !parse_tensors(&ps, g, n_tensors))
    goto fail_gguf;
  if (st)
    *st = SL_OK;
  return g;

fail_gguf:
  gguf_free(g);
fail_report:
  if (st)
    *st = ps.st;
  return NULL;
}

sl_gguf_t *sl_gguf_open_mem(const void *data, size_t size, sl_status *st,
                            char *err, size_t errcap) {
  if (!data && size > 0) {
    if (err && errcap)
      snprintf(err, errcap, "NULL buffer of %zu bytes", size);
    if (st)
      *st = SL_ERR_INVALID_ARG;
    return NULL;
  }
  static const uint8_t empty[1];
  return gguf_parse(data ? data : empty, size, NULL, st, err, errcap);
}

sl_gguf_t *sl_gguf_open(const char *path, sl_status *st, char *err,
                        size_t errcap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (err && errcap)
      snprintf(err, errcap, "%s: cannot open: %s", path, strerror(errno));
    goto fail_io;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    if (err && errcap)
      snprintf(err, errcap, "%s: not a regular file", path);
    goto fail_fd;
  }
  size_t size = (size_t)sb.st_size;
  if (size < GGUF_HEADER_BYTES) {
    close(fd);
    if (err && errcap)
      snprintf(err, errcap,
               "%s: file is %zu bytes, too small for a GGUF header", path,
               size);
    if (st)
      *st = SL_ERR_FORMAT;
    return NULL;
  }
  void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    if (err && errcap)
      snprintf(err, errcap, "%s: mmap of %zu bytes failed: %s", path, size,
               strerror(errno));
    goto fail_fd;
  }
  close(fd);
  char msg[512];
  sl_gguf_t *g = gguf_parse(map, size, map, st, msg, sizeof msg);
  if (!g && err && errcap)
    snprintf(err, errcap, "%s: %s", path, msg);
  return g;

fail_fd:
  close(fd);
fail_io:
  if (st)
    *st = SL_ERR_IO;
  return NULL;
}

void sl_gguf_close(sl_gguf_t *g) {
  gguf_free(g);
}

size_t sl_gguf_release_pages(const sl_gguf_t *g, const void *p, size_t n) {
  if (!g || !g->map || !p || n == 0)
    return 0;
  uintptr_t base = (uintptr_t)g->base, a = (uintptr_t)p;
  if (a < base || a - base > g->size || n > g->size - (a - base))
    return 0;
  long ps = sysconf(_SC_PAGESIZE);
  uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096;
  uintptr_t lo = (a + page - 1) & ~(page - 1), hi = (a + n) & ~(page - 1);
  if (hi <= lo)
    return 0;
  if (madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0)
    return 0;
  return hi - lo;
}

/* ---- accessors ------------------------------------------------------------
 */

uint32_t sl_gguf_version(const sl_gguf_t *g) {
  return g->version;
}
uint32_t sl_gguf_alignment(const sl_gguf_t *g) {
  return g->alignment;
}
size_t sl_gguf_file_size(const sl_gguf_t *g) {
  return g->size;
}
void sl_gguf_fingerprint(const sl_gguf_t *g, uint8_t out[16]) {
  XXH3_state_t s;
  XXH3_128bits_reset(&s);
  uint8_t size_le[8];
  for (int i = 0; i < 8; i++)
    size_le[i] = (uint8_t)((uint64_t)g->size >> (8 * i));
  XXH3_128bits_update(&s, size_le, sizeof size_le);
  XXH3_128bits_update(&s, g->base, g->data_offset);
  for (int64_t i = 0; i < g->n_tensors; i++) {
    const sl_gguf_tensor *t = &g->tensors[i];
    const uint8_t *d = t->data;
    if (t->nbytes <= 2 * SL_GGUF_FP_SAMPLE) {
      XXH3_128bits_update(&s, d, (size_t)t->nbytes);
    } else {
      XXH3_128bits_update(&s, d, SL_GGUF_FP_SAMPLE);
      XXH3_128bits_update(&s, d + t->nbytes - SL_GGUF_FP_SAMPLE,
                          SL_GGUF_FP_SAMPLE);
    }
  }
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&s));
  memcpy(out, c.digest, 16);
}

size_t sl_gguf_data_offset(const sl_gguf_t *g) {
  return g->data_offset;
}

int64_t sl_gguf_n_kv(const sl_gguf_t *g) {
  return g->n_kv;
}

sl_str sl_gguf_key(const sl_gguf_t *g, int64_t i) {
  if (i < 0 || i >= g->n_kv)
    return (sl_str){NULL, 0};
  return g->keys[i];
}

const sl_gguf_value *sl_gguf_value_at(const sl_gguf_t *g, int64_t i) {
  if (i < 0 || i >= g->n_kv)
    return NULL;
  return &g->vals[i];
}

int64_t sl_gguf_find(const sl_gguf_t *g, const char *key) {
  if (!g || !key)
    return -1;
  return index_find(g, &g->kv_index, kv_name, key, strlen(key));
}

const sl_gguf_value *sl_gguf_get(const sl_gguf_t *g, const char *key) {
  int64_t i = sl_gguf_find(g, key);
  return i < 0 ? NULL : &g->vals[i];
}

static bool is_unsigned_int(sl_gguf_type t) {
  return t == SL_GGUF_UINT8 || t == SL_GGUF_UINT16 || t == SL_GGUF_UINT32 ||
         t == SL_GGUF_UINT64;
}

static bool is_signed_int(sl_gguf_type t) {
  return t == SL_GGUF_INT8 || t == SL_GGUF_INT16 || t == SL_GGUF_INT32 ||
         t == SL_GGUF_INT64;
}

static bool value_u64(const sl_gguf_value *v, uint64_t *out) {
  if (is_unsigned_int(v->type)) {
    *out = v->v.u64;
    return true;
  }
  if (is_signed_int(v->type) && v->v.i64 >= 0) {
    *out = (uint64_t)v->v.i64;
    return true;
  }
  return false;
}

static bool value_i64(const sl_gguf_value *v, int64_t *out) {
  if (is_signed_int(v->type)) {
    *out = v->v.i64;
    return true;
  }
  if (is_unsigned_int(v->type) && v->v.u64 <= INT64_MAX) {
    *out = (int64_t)v->v.u64;
    return true;
  }
  return false;
}

bool sl_gguf_get_u64(const sl_gguf_t *g, const char *key, uint64_t *out) {
  const sl_gguf_value *v = sl_gguf_get(g, key);
  return v && value_u64(v, out);
}

bool sl_gguf_get_i64(const sl_gguf_t *g, const char *key, int64_t *out) {
  const sl_gguf_value *v = sl_gguf_get(g, key);
  return v && value_i64(v, out);
}

bool sl_gguf_get_f64(const sl_gguf_t *g, const char *key, double *out) {
  const sl_gguf_value *v = sl_gguf_get(g, key);
  if (!v || (v->type != SL_GGUF_FLOAT32 && v->type != SL_GGUF_FLOAT64))
    return false;
  *out = v->v.f64;
  return true;
}

bool sl_gguf_get_bool(const sl_gguf_t *g, const char *key, bool *out) {
  const sl_gguf_value *v = sl_gguf_get(g, key);
  if (!v || v->type != SL_GGUF_BOOL)
    return false;
  *out = v->v.u64 != 0;
  return true;
}

bool sl_gguf_get_str(const sl_gguf_t *g, const char *key, sl_str *out) {
  const sl_gguf_value *v = sl_gguf_get(g, key);
  if (!v || v->type != SL_GGUF_STRING)
    return false;
  *out = v->v.str;
  return true;
}

sl_str sl_gguf_arr_str(const sl_gguf_value *v, uint64_t i) {
  if (!v || v->type != SL_GGUF_ARRAY || v->arr_type != SL_GGUF_STRING ||
      i >= v->arr_len)
    return (sl_str){NULL, 0};
  return ((const sl_str *)v->arr_data)[i];
}

bool sl_gguf_arr_elem(const sl_gguf_value *v, uint64_t i, sl_gguf_value *out) {
  if (!v || v->type != SL_GGUF_ARRAY || i >= v->arr_len)
    return false;
  if (v->arr_type == SL_GGUF_STRING) {
    memset(out, 0, sizeof *out);
    out->type = SL_GGUF_STRING;
    out->v.str = ((const sl_str *)v->arr_data)[i];
    return true;
  }
  size_t esz = gguf_scalar_size(v->arr_type);
  decode_scalar(v->arr_type, (const uint8_t *)v->arr_data + i * esz, out);
  return true;
}

int64_t sl_gguf_n_tensors(const sl_gguf_t *g) {
  return g->n_tensors;
}

const sl_gguf_tensor *sl_gguf_tensor_at(const sl_gguf_t *g, int64_t i) {
  if (i < 0 || i >= g->n_tensors)
    return NULL;
  return &g->tensors[i];
}

const sl_gguf_tensor *sl_gguf_find_tensor(const sl_gguf_t *g,
                                          const char *name) {
  if (!g || !name)
    return NULL;
  int64_t i = index_find(g, &g->tensor_index, tensor_name, name, strlen(name));
  return i < 0 ? NULL : &g->tensors[i];
}
