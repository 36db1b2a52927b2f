/* sluice — jinja: Jinja values, the arena, untrusted marks, str() / repr()
 * (json.dumps is jinja_json.c). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"
#include "sluice/utf8.h"
#include "sluice/util.h"

/* ---- arena ----------------------------------------------------------------
 */

typedef struct sl__jchunk {
  struct sl__jchunk *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
} sl__jchunk;

#define JA_CHUNK 65536u

void *sl__ja_alloc(sl__jarena *a, size_t n) {
  n = (n + 15u) & ~(size_t)15u;
  if (n == 0)
    n = 16;
  sl__jchunk *c = a->head;
  if (c && c->cap - c->used >= n) {
    void *p = c->data + c->used;
    c->used += n;
    return p;
  }
  size_t cap = n > JA_CHUNK / 4 ? n : JA_CHUNK;
  size_t total = sizeof(sl__jchunk) + cap;
  if (total < cap)
    return NULL;
  if (a->limit && (a->used + total > a->limit || a->used + total < a->used)) {
    a->over_limit = true;
    return NULL;
  }
  sl__jchunk *nc = sl_malloc(total);
  if (!nc)
    return NULL;
  a->used += total;
  nc->cap = cap;
  nc->used = n;
  if (c && n > JA_CHUNK / 4) {
    /* a big block: keep the current chunk on top for small allocations */
    nc->next = c->next;
    c->next = nc;
  } else {
    nc->next = c;
    a->head = nc;
  }
  return nc->data;
}

void sl__ja_free(sl__jarena *a) {
  sl__jchunk *c = a->head;
  while (c) {
    sl__jchunk *next = c->next;
    sl_free(c);
    c = next;
  }
  a->head = NULL;
  a->used = 0;
}

/* ---- render errors and allocation ------------------------------------------
 */

void sl__jfail(sl__jrender *r, sl_status st, int line, const char *fmt, ...) {
  if (r->err && r->errcap) {
    int k = 0;
    if (line > 0)
      k = snprintf(r->err, r->errcap, "line %d: ", line);
    if (k < 0 || (size_t)k >= r->errcap)
      k = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + k, r->errcap - (size_t)k, fmt, ap);
    va_end(ap);
  }
  r->st = st;
  longjmp(r->jmp, 1);
}

void *sl__jalloc(sl__jrender *r, size_t n) {
  void *p = sl__ja_alloc(&r->arena, n);
  if (!p) {
    if (r->arena.over_limit)
      sl__jfail(r, SL_ERR_RANGE, 0,
                "template render exceeded its memory limit");
    sl__jfail(r, SL_ERR_NOMEM, 0, "out of memory while rendering");
  }
  return p;
}

/* ---- render-arena constructors ---------------------------------------------
 */

static sl_jv *jv_new(sl__jrender *r, int kind) {
  sl_jv *v = sl__jalloc(r, sizeof *v);
  memset(v, 0, sizeof *v);
  v->kind = (uint8_t)kind;
  return v;
}

sl_jv *sl__jv_undef(sl__jrender *r, const char *name) {
  sl_jv *v = jv_new(r, SL_JV_UNDEFINED);
  v->u.undef_name = name;
  return v;
}
sl_jv *sl__jv_none(sl__jrender *r) {
  return jv_new(r, SL_JV_NULL);
}
sl_jv *sl__jv_bool(sl__jrender *r, bool b) {
  sl_jv *v = jv_new(r, SL_JV_BOOL);
  v->u.b = b;
  return v;
}
sl_jv *sl__jv_int(sl__jrender *r, int64_t i) {
  sl_jv *v = jv_new(r, SL_JV_INT);
  v->u.i = i;
  return v;
}
sl_jv *sl__jv_float(sl__jrender *r, double f) {
  sl_jv *v = jv_new(r, SL_JV_FLOAT);
  v->u.f = f;
  return v;
}
sl_jv *sl__jv_str(sl__jrender *r, const char *p, size_t n) {
  sl_jv *v = jv_new(r, SL_JV_STRING);
  char *s = sl__jalloc(r, n + 1);
  if (n)
    memcpy(s, p, n);
  s[n] = 0;
  v->u.s.p = s;
  v->u.s.n = n;
  return v;
}
sl_jv *sl__jv_list(sl__jrender *r, size_t cap) {
  sl_jv *v = jv_new(r, SL_JV_LIST);
  if (cap) {
    size_t bytes;
    if (!sl_mul_ok(cap, sizeof(sl_jv *), &bytes))
      sl__jfail(r, SL_ERR_RANGE, 0, "list too large");
    v->u.l.v = sl__jalloc(r, bytes);
    v->u.l.cap = cap;
  }
  return v;
}
sl_jv *sl__jv_dict(sl__jrender *r, size_t cap, int kind) {
  sl_jv *v = jv_new(r, kind);
  if (cap) {
    size_t bytes;
    if (!sl_mul_ok(cap, sizeof(sl_jv *), &bytes))
      sl__jfail(r, SL_ERR_RANGE, 0, "dict too large");
    v->u.d.k = sl__jalloc(r, bytes);
    v->u.d.v = sl__jalloc(r, bytes);
    v->u.d.cap = cap;
  }
  return v;
}

void sl__jv_list_push(sl__jrender *r, sl_jv *list, sl_jv *item) {
  SL_ASSERT(list->kind == SL_JV_LIST && !list->heap);
  if (list->u.l.n == list->u.l.cap) {
    size_t cap = list->u.l.cap ? list->u.l.cap * 2 : 8, bytes;
    if (!sl_mul_ok(cap, sizeof(sl_jv *), &bytes))
      sl__jfail(r, SL_ERR_RANGE, 0, "list too large");
    sl_jv **nv = sl__jalloc(r, bytes);
    if (list->u.l.n)
      memcpy(nv, list->u.l.v, list->u.l.n * sizeof(sl_jv *));
    list->u.l.v = nv;
    list->u.l.cap = cap;
  }
  list->u.l.v[list->u.l.n++] = item;
}

void sl__jv_dict_put(sl__jrender *r, sl_jv *d, sl_jv *key, sl_jv *val) {
  SL_ASSERT(sl__jv_is_dict(d) && !d->heap);
  for (size_t i = 0; i < d->u.d.n; i++)
    if (sl__jv_equal(d->u.d.k[i], key)) {
      d->u.d.v[i] = val;
      return;
    }
  if (d->u.d.n == d->u.d.cap) {
    size_t cap = d->u.d.cap ? d->u.d.cap * 2 : 8, bytes;
    if (!sl_mul_ok(cap, sizeof(sl_jv *), &bytes))
      sl__jfail(r, SL_ERR_RANGE, 0, "dict too large");
    sl_jv **nk = sl__jalloc(r, bytes), **nv = sl__jalloc(r, bytes);
    if (d->u.d.n) {
      memcpy(nk, d->u.d.k, d->u.d.n * sizeof(sl_jv *));
      memcpy(nv, d->u.d.v, d->u.d.n * sizeof(sl_jv *));
    }
    d->u.d.k = nk;
    d->u.d.v = nv;
    d->u.d.cap = cap;
  }
  d->u.d.k[d->u.d.n] = key;
  d->u.d.v[d->u.d.n] = val;
  d->u.d.n++;
}

sl_jv *sl__jv_dict_find(const sl_jv *d, const sl_jv *key) {
  for (size_t i = 0; i < d->u.d.n; i++)
    if (sl__jv_equal(d->u.d.k[i], key))
      return d->u.d.v[i];
  return NULL;
}

sl_jv *sl__jv_dict_find_str(const sl_jv *d, const char *key, size_t n) {
  for (size_t i = 0; i < d->u.d.n; i++) {
    const sl_jv *k = d->u.d.k[i];
    if (k->kind == SL_JV_STRING && k->u.s.n == n &&
        memcmp(k->u.s.p, key, n) == 0)
      return d->u.d.v[i];
  }
  return NULL;
}

/* ---- public constructors (caller-owned trees) -----------------------------
 */

static sl_jv *heap_new(int kind) {
  sl_jv *v = sl_calloc(1, sizeof *v);
  if (v) {
    v->kind = (uint8_t)kind;
    v->heap = true;
  }
  return v;
}

sl_jv *sl_jv_null(void) {
  return heap_new(SL_JV_NULL);
}
sl_jv *sl_jv_bool(bool b) {
  sl_jv *v = heap_new(SL_JV_BOOL);
  if (v)
    v->u.b = b;
  return v;
}
sl_jv *sl_jv_int(int64_t i) {
  sl_jv *v = heap_new(SL_JV_INT);
  if (v)
    v->u.i = i;
  return v;
}
sl_jv *sl_jv_float(double f) {
  sl_jv *v = heap_new(SL_JV_FLOAT);
  if (v)
    v->u.f = f;
  return v;
}
sl_jv *sl_jv_string_n(const char *s, size_t len) {
  if (!s && len)
    return NULL;
  sl_jv *v = heap_new(SL_JV_STRING);
  if (!v)
    return NULL;
  char *p = len + 1 ? sl_malloc(len + 1) : NULL;
  if (!p) {
    sl_free(v);
    return NULL;
  }
  if (len)
    memcpy(p, s, len);
  p[len] = 0;
  v->u.s.p = p;
  v->u.s.n = len;
  return v;
}
sl_jv *sl_jv_string(const char *s) {
  return s ? sl_jv_string_n(s, strlen(s)) : NULL;
}
sl_jv *sl_jv_list(void) {
  return heap_new(SL_JV_LIST);
}
sl_jv *sl_jv_dict(void) {
  return heap_new(SL_JV_DICT);
}

sl_status sl_jv_list_append(sl_jv *list, sl_jv *item) {
  if (!item)
    return SL_ERR_NOMEM;
  if (!list || list->kind != SL_JV_LIST || !list->heap) {
    sl_jv_free(item);
    return SL_ERR_INVALID_ARG;
  }
  if (list->u.l.n == list->u.l.cap) {
    size_t cap = list->u.l.cap ? list->u.l.cap * 2 : 4, bytes;
    sl_jv **nv = NULL;
    if (sl_mul_ok(cap, sizeof(sl_jv *), &bytes))
      nv = sl_realloc(list->u.l.v, bytes);
    if (!nv) {
      sl_jv_free(item);
      return SL_ERR_NOMEM;
    }
    list->u.l.v = nv;
    list->u.l.cap = cap;
  }
  list->u.l.v[list->u.l.n++] = item;
  return SL_OK;
}

sl_status sl_jv_dict_set(sl_jv *d, const char *key, sl_jv *val) {
  if (!val)
    return SL_ERR_NOMEM;
  if (!d || d->kind != SL_JV_DICT || !d->heap || !key) {
    sl_jv_free(val);
    return SL_ERR_INVALID_ARG;
  }
  size_t kn = strlen(key);
  for (size_t i = 0; i < d->u.d.n; i++) {
    sl_jv *k = d->u.d.k[i];
    if (k->u.s.n == kn && memcmp(k->u.s.p, key, kn) == 0) {
      sl_jv_free(d->u.d.v[i]);
      d->u.d.v[i] = val;
      return SL_OK;
    }
  }
  sl_jv *k = sl_jv_string_n(key, kn);
  if (!k) {
    sl_jv_free(val);
    return SL_ERR_NOMEM;
  }
  if (d->u.d.n == d->u.d.cap) {
    size_t cap = d->u.d.cap ? d->u.d.cap * 2 : 4, bytes;
    sl_jv **nk = NULL, **nv = NULL;
    if (sl_mul_ok(cap, sizeof(sl_jv *), &bytes)) {
      nk = sl_realloc(d->u.d.k, bytes);
      if (nk)
        d->u.d.k = nk;
      nv = nk ? sl_realloc(d->u.d.v, bytes) : NULL;
      if (nv)
        d->u.d.v = nv;
    }
    if (!nk || !nv) {
      sl_jv_free(k);
      sl_jv_free(val);
      return SL_ERR_NOMEM;
    }
    d->u.d.cap = cap;
  }
  d->u.d.k[d->u.d.n] = k;
  d->u.d.v[d->u.d.n] = val;
  d->u.d.n++;
  return SL_OK;
}

void sl_jv_mark_untrusted(sl_jv *v) {
  if (!v)
    return;
  SL_ASSERT(v->heap);
  v->untrusted = true;
  if (v->kind == SL_JV_LIST)
    for (size_t i = 0; i < v->u.l.n; i++)
      sl_jv_mark_untrusted(v->u.l.v[i]);
  if (v->kind == SL_JV_DICT)
    for (size_t i = 0; i < v->u.d.n; i++) {
      sl_jv_mark_untrusted(v->u.d.k[i]);
      sl_jv_mark_untrusted(v->u.d.v[i]);
    }
}

sl_jv_kind sl_jv_kind_of(const sl_jv *v) {
  return v && v->kind <= SL_JV_DICT ? (sl_jv_kind)v->kind : SL_JV_UNDEFINED;
}

size_t sl_jv_len(const sl_jv *v) {
  if (!v)
    return 0;
  switch (v->kind) {
  case SL_JV_STRING:
    return v->u.s.n;
  case SL_JV_LIST:
    return v->u.l.n;
  case SL_JV_DICT:
    return v->u.d.n;
  default:
    return 0;
  }
}

const sl_jv *sl_jv_list_get(const sl_jv *list, size_t i) {
  if (!list || list->kind != SL_JV_LIST || i >= list->u.l.n)
    return NULL;
  return list->u.l.v[i];
}

const sl_jv *sl_jv_dict_get(const sl_jv *d, const char *key) {
  if (!d || d->kind != SL_JV_DICT || !key)
    return NULL;
  return sl__jv_dict_find_str(d, key, strlen(key));
}

const char *sl_jv_str(const sl_jv *v) {
  return v && v->kind == SL_JV_STRING ? v->u.s.p : NULL;
}

void sl_jv_free(sl_jv *v) {
  if (!v)
    return;
  SL_ASSERT(v->heap);
  switch (v->kind) {
  case SL_JV_STRING:
    sl_free(v->u.s.p);
    break;
  case SL_JV_LIST:
    for (size_t i = 0; i < v->u.l.n; i++)
      sl_jv_free(v->u.l.v[i]);
    sl_free(v->u.l.v);
    break;
  case SL_JV_DICT:
    for (size_t i = 0; i < v->u.d.n; i++) {
      sl_jv_free(v->u.d.k[i]);
      sl_jv_free(v->u.d.v[i]);
    }
    sl_free(v->u.d.k);
    sl_free(v->u.d.v);
    break;
  default:
    break;
  }
  sl_free(v);
}

/* ---- semantics
 * --------------------------------------------------------------- */

bool sl__jv_truthy(const sl_jv *v) {
  switch (v->kind) {
  case SL_JV_UNDEFINED:
  case SL_JV_NULL:
    return false;
  case SL_JV_BOOL:
    return v->u.b;
  case SL_JV_INT:
    return v->u.i != 0;
  case SL_JV_FLOAT:
    return v->u.f != 0.0;
  case SL_JV_STRING:
    return v->u.s.n != 0;
  case SL_JV_LIST:
    return v->u.l.n != 0;
  case SL_JV_DICT:
    return v->u.d.n != 0;
  default:
    return true;
  }
}

static double num_of(const sl_jv *v) {
  return v->kind == SL_JV_FLOAT ? v->u.f
         : v->kind == SL_JV_INT ? (double)v->u.i
                                : (double)v->u.b;
}

#define JV_MAX_NEST 200 /* values built by templates can nest without bound */

static bool equal_depth(const sl_jv *a, const sl_jv *b, int depth);

bool sl__jv_equal(const sl_jv *a, const sl_jv *b) {
  return equal_depth(a, b, 0);
}

/* Deeper than JV_MAX_NEST compares unequal rather than overflow the stack. */
static bool equal_depth(const sl_jv *a, const sl_jv *b, int depth) {
  if (a == b)
    return true;
  if (depth > JV_MAX_NEST)
    return false;
  if (sl__jv_is_num(a) && sl__jv_is_num(b)) {
    if (a->kind != SL_JV_FLOAT && b->kind != SL_JV_FLOAT) {
      int64_t x = a->kind == SL_JV_INT ? a->u.i : a->u.b;
      int64_t y = b->kind == SL_JV_INT ? b->u.i : b->u.b;
      return x == y;
    }
    return num_of(a) == num_of(b);
  }
  if (a->kind != b->kind || a->is_tuple != b->is_tuple)
    return false;
  switch (a->kind) {
  case SL_JV_UNDEFINED:
  case SL_JV_NULL:
    return true;
  case SL_JV_STRING:
    return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
  case SL_JV_LIST:
    if (a->u.l.n != b->u.l.n)
      return false;
    for (size_t i = 0; i < a->u.l.n; i++)
      if (!equal_depth(a->u.l.v[i], b->u.l.v[i], depth + 1))
        return false;
    return true;
  case SL_JV_DICT:
    if (a->u.d.n != b->u.d.n)
      return false;
    for (size_t i = 0; i < a->u.d.n; i++) {
      sl_jv *o = sl__jv_dict_find(b, a->u.d.k[i]);
      if (!o || !equal_depth(a->u.d.v[i], o, depth + 1))
        return false;
    }
    return true;
  case SL__JV_MACRO:
    return a->u.m.node == b->u.m.node;
  case SL__JV_FUNC:
    return a->u.fn == b->u.fn;
  default:
    return false; /* namespaces compare by identity */
  }
}

const char *sl__jv_kind_name(const sl_jv *v) {
  switch (v->kind) {
  case SL_JV_UNDEFINED:
    return "Undefined";
  case SL_JV_NULL:
    return "NoneType";
  case SL_JV_BOOL:
    return "bool";
  case SL_JV_INT:
    return "int";
  case SL_JV_FLOAT:
    return "float";
  case SL_JV_STRING:
    return "str";
  case SL_JV_LIST:
    return "list";
  case SL_JV_DICT:
    return "dict";
  case SL__JV_NAMESPACE:
    return "Namespace";
  case SL__JV_MACRO:
    return "Macro";
  case SL__JV_LOOP:
    return "LoopContext";
  default:
    return "builtin_function";
  }
}

static int compare_depth(sl__jrender *r, int line, const sl_jv *a,
                         const sl_jv *b, int depth);

int sl__jv_compare(sl__jrender *r, int line, const sl_jv *a, const sl_jv *b) {
  return compare_depth(r, line, a, b, 0);
}

static int compare_depth(sl__jrender *r, int line, const sl_jv *a,
                         const sl_jv *b, int depth) {
  if (depth > JV_MAX_NEST)
    sl__jfail(r, SL_ERR_RANGE, line, "values nested too deeply to compare");
  if (sl__jv_is_num(a) && sl__jv_is_num(b)) {
    if (a->kind != SL_JV_FLOAT && b->kind != SL_JV_FLOAT) {
      int64_t x = a->kind == SL_JV_INT ? a->u.i : a->u.b;
      int64_t y = b->kind == SL_JV_INT ? b->u.i : b->u.b;
      return x < y ? -1 : x > y;
    }
    double x = num_of(a), y = num_of(b);
    return x < y ? -1 : x > y;
  }
  if (a->kind == SL_JV_STRING && b->kind == SL_JV_STRING) {
    size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
    int c = memcmp(a->u.s.p, b->u.s.p, n);
    if (c)
      return c < 0 ? -1 : 1;
    return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
  }
  if (a->kind == SL_JV_LIST && b->kind == SL_JV_LIST) {
    for (size_t i = 0; i < a->u.l.n && i < b->u.l.n; i++) {
      if (sl__jv_equal(a->u.l.v[i], b->u.l.v[i]))
        continue;
      return compare_depth(r, line, a->u.l.v[i], b->u.l.v[i], depth + 1);
    }
    return a->u.l.n < b->u.l.n ? -1 : a->u.l.n > b->u.l.n;
  }
  sl__jfail(r, SL_ERR_FORMAT, line,
            "'<' not supported between instances of '%s' and '%s'",
            sl__jv_kind_name(a), sl__jv_kind_name(b));
}

/* ---- text
 * --------------------------------------------------------------------- */

/* Makes room for n more bytes (and the NUL), the marks growing alongside. */
static void jbuf_reserve(sl__jrender *r, sl__jbuf *b, size_t n) {
  if (b == r->out && b->n + n > r->max_output)
    sl__jfail(r, SL_ERR_RANGE, 0, "template output exceeded %zu bytes",
              r->max_output);
  if (b->n + n + 1 <= b->cap)
    return;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->n + n + 1) {
    if (cap > SIZE_MAX / 2)
      sl__jfail(r, SL_ERR_RANGE, 0, "string too large");
    cap *= 2;
  }
  char *np = sl__jalloc(r, cap);
  if (b->n)
    memcpy(np, b->p, b->n);
  b->p = np;
  if (b->t) {
    uint8_t *nt = sl__jalloc(r, cap);
    memcpy(nt, b->t, b->n);
    b->t = nt;
  }
  b->cap = cap;
}

void sl__jbuf_put(sl__jrender *r, sl__jbuf *b, const char *p, size_t n) {
  if (n == 0)
    return;
  jbuf_reserve(r, b, n);
  memcpy(b->p + b->n, p, n);
  if (b->t)
    memset(b->t + b->n, 0, n);
  b->n += n;
  b->p[b->n] = 0;
}

/* Gives b its marks array (all trusted so far). */
static void jbuf_marks(sl__jrender *r, sl__jbuf *b) {
  if (b->t || b->cap == 0)
    return;
  b->t = sl__jalloc(r, b->cap);
  memset(b->t, 0, b->cap);
}

void sl__jbuf_mark(sl__jrender *r, sl__jbuf *b, size_t from) {
  if (from >= b->n)
    return;
  jbuf_marks(r, b);
  memset(b->t + from, 1, b->n - from);
}

void sl__jbuf_put_sv(sl__jrender *r, sl__jbuf *b, const sl_jv *s, size_t off,
                     size_t n) {
  SL_ASSERT(s->kind == SL_JV_STRING && off <= s->u.s.n && n <= s->u.s.n - off);
  size_t at = b->n;
  sl__jbuf_put(r, b, s->u.s.p + off, n);
  if (s->untrusted) {
    sl__jbuf_mark(r, b, at);
  } else if (s->u.s.t && n) {
    jbuf_marks(r, b);
    memcpy(b->t + at, s->u.s.t + off, n);
  }
}

bool sl__jv_untrusted_at(const sl_jv *s, size_t off, size_t n) {
  if (s->untrusted)
    return n > 0;
  return s->u.s.t && n && memchr(s->u.s.t + off, 1, n) != NULL;
}

sl_jv *sl__jv_str_buf(sl__jrender *r, const sl__jbuf *b) {
  sl_jv *v = jv_new(r, SL_JV_STRING);
  v->u.s.p = b->p ? b->p : (char *)"";
  v->u.s.n = b->n;
  if (b->t && memchr(b->t, 1, b->n))
    v->u.s.t = b->t;
  return v;
}

sl_jv *sl__jv_substr(sl__jrender *r, const sl_jv *s, size_t off, size_t n) {
  sl__jbuf b = {0};
  sl__jbuf_put_sv(r, &b, s, off, n);
  return sl__jv_str_buf(r, &b);
}

void sl__jfloat_repr(double f, char *buf, size_t cap) {
  if (isnan(f)) {
    snprintf(buf, cap, "nan");
    return;
  }
  if (isinf(f)) {
    snprintf(buf, cap, f < 0 ? "-inf" : "inf");
    return;
  }
  if (f == 0) {
    snprintf(buf, cap, signbit(f) ? "-0.0" : "0.0");
    return;
  }
  char tmp[64];
  int prec;
  for (prec = 0; prec < 17; prec++) {
    snprintf(tmp, sizeof tmp, "%.*e", prec, f);
    if (strtod(tmp, NULL) == f)
      break;
  }
  /* tmp is [-]d[.ddd]e[+-]XX; pull out the digits and the exponent */
  char digits[40];
  size_t nd = 0;
  const char *p = tmp;
  bool neg = false;
  if (*p == '-') {
    neg = true;
    p++;
  }
  for (; *p && *p != 'e'; p++)
    if (*p >= '0' && *p <= '9')
      digits[nd++] = *p;
  int exp10 = atoi(p + 1);
  while (nd > 1 && digits[nd - 1] == '0')
    nd--;
  digits[nd] = 0;
  int decpt = exp10 + 1;
  size_t o = 0;
  char out[80];
  if (neg)
    out[o++] = '-';
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out[o++] = '0';
      out[o++] = '.';
      for (int i = 0; i < -decpt; i++)
        out[o++] = '0';
      for (size_t i = 0; i < nd; i++)
        out[o++] = digits[i];
    } else if ((size_t)decpt >= nd) {
      for (size_t i = 0; i < nd; i++)
        out[o++] = digits[i];
      for (size_t i = nd; i < (size_t)decpt; i++)
        out[o++] = '0';
      out[o++] = '.';
      out[o++] = '0';
    } else {
      for (size_t i = 0; i < nd; i++) {
        if (i == (size_t)decpt)
          out[o++] = '.';
        out[o++] = digits[i];
      }
    }
    out[o] = 0;
  } else {
    out[o++] = digits[0];
    if (nd > 1) {
      out[o++] = '.';
      for (size_t i = 1; i < nd; i++)
        out[o++] = digits[i];
    }
    snprintf(out + o, sizeof out - o, "e%c%02d", exp10 < 0 ? '-' : '+',
             exp10 < 0 ? -exp10 : exp10);
  }
  snprintf(buf, cap, "%s", out);
}

static void write_str_repr(sl__jrender *r, sl__jbuf *b, const char *s,
                           size_t n) {
  bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
  char q = has_sq && !has_dq ? '"' : '\'';
  sl__jbuf_put(r, b, &q, 1);
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    const char *esc = NULL;
    char hex[8];
    if (c == '\\')
      esc = "\\\\";
    else if (c == (unsigned char)q)
      esc = q == '\'' ? "\\'" : "\\\"";
    else if (c == '\n')
      esc = "\\n";
    else if (c == '\r')
      esc = "\\r";
    else if (c == '\t')
      esc = "\\t";
    else if (c < 0x20 || c == 0x7f) {
      snprintf(hex, sizeof hex, "\\x%02x", c);
      esc = hex;
    }
    if (esc) {
      sl__jbuf_put(r, b, s + run, i - run);
      sl__jbuf_puts(r, b, esc);
      run = i + 1;
    }
  }
  sl__jbuf_put(r, b, s + run, n - run);
  sl__jbuf_put(r, b, &q, 1);
}

void sl__jv_write_scalar(sl__jrender *r, sl__jbuf *b, const sl_jv *v) {
  char tmp[64];
  switch (v->kind) {
  case SL_JV_NULL:
    sl__jbuf_puts(r, b, "None");
    break;
  case SL_JV_BOOL:
    sl__jbuf_puts(r, b, v->u.b ? "True" : "False");
    break;
  case SL_JV_INT:
    snprintf(tmp, sizeof tmp, "%lld", (long long)v->u.i);
    sl__jbuf_puts(r, b, tmp);
    break;
  case SL_JV_FLOAT:
    sl__jfloat_repr(v->u.f, tmp, sizeof tmp);
    sl__jbuf_puts(r, b, tmp);
    break;
  default:
    break;
  }
}

static void write_repr_depth(sl__jrender *r, sl__jbuf *b, const sl_jv *v,
                             int depth) {
  if (depth > 200)
    sl__jfail(r, SL_ERR_RANGE, 0, "value nested too deeply");
  switch (v->kind) {
  case SL_JV_UNDEFINED:
    break;
  case SL_JV_STRING: {
    size_t at = b->n;
    write_str_repr(r, b, v->u.s.p, v->u.s.n);
    if (sl__jv_untrusted(v)) /* escaped: marked whole */
      sl__jbuf_mark(r, b, at);
    break;
  }
  case SL_JV_LIST:
    sl__jbuf_puts(r, b, v->is_tuple ? "(" : "[");
    for (size_t i = 0; i < v->u.l.n; i++) {
      if (i)
        sl__jbuf_puts(r, b, ", ");
      write_repr_depth(r, b, v->u.l.v[i], depth + 1);
    }
    sl__jbuf_puts(r, b, !v->is_tuple ? "]" : v->u.l.n == 1 ? ",)" : ")");
    break;
  case SL_JV_DICT:
  case SL__JV_NAMESPACE:
    if (v->kind == SL__JV_NAMESPACE)
      sl__jbuf_puts(r, b, "<Namespace ");
    sl__jbuf_puts(r, b, "{");
    for (size_t i = 0; i < v->u.d.n; i++) {
      if (i)
        sl__jbuf_puts(r, b, ", ");
      write_repr_depth(r, b, v->u.d.k[i], depth + 1);
      sl__jbuf_puts(r, b, ": ");
      write_repr_depth(r, b, v->u.d.v[i], depth + 1);
    }
    sl__jbuf_puts(r, b, "}");
    if (v->kind == SL__JV_NAMESPACE)
      sl__jbuf_puts(r, b, ">");
    break;
  case SL__JV_MACRO:
    sl__jbuf_puts(r, b, "<Macro>");
    break;
  case SL__JV_LOOP: {
    char tmp[64];
    snprintf(tmp, sizeof tmp, "<LoopContext %zu/%zu>", v->u.loop.i + 1,
             v->u.loop.n);
    sl__jbuf_puts(r, b, tmp);
    break;
  }
  case SL__JV_FUNC:
    sl__jbuf_puts(r, b, "<built-in function>");
    break;
  default: {
    size_t at = b->n;
    sl__jv_write_scalar(r, b, v);
    if (v->untrusted)
      sl__jbuf_mark(r, b, at);
    break;
  }
  }
}

void sl__jv_write_repr(sl__jrender *r, sl__jbuf *b, const sl_jv *v) {
  write_repr_depth(r, b, v, 0);
}

void sl__jv_write_str(sl__jrender *r, sl__jbuf *b, const sl_jv *v) {
  if (v->kind == SL_JV_STRING)
    sl__jbuf_put_sv(r, b, v, 0, v->u.s.n);
  else
    write_repr_depth(r, b, v, 0);
}

sl_jv *sl__jv_to_str(sl__jrender *r, const sl_jv *v) {
  if (v->kind == SL_JV_STRING)
    return (sl_jv *)v;
  sl__jbuf b = {0};
  sl__jv_write_str(r, &b, v);
  return sl__jv_str_buf(r, &b);
}

/* ---- UTF-8
 * ------------------------------------------------------------------------ */

size_t *sl__utf8_offsets(sl__jrender *r, const char *p, size_t n, size_t *ncp) {
  size_t c = sl_utf8_count(p, n);
  size_t bytes;
  if (!sl_mul_ok(c + 1, sizeof(size_t), &bytes))
    sl__jfail(r, SL_ERR_RANGE, 0, "string too large");
  size_t *off = sl__jalloc(r, bytes);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (!sl_utf8_is_cont((unsigned char)p[i]) || i == 0)
      off[k++] = i;
  off[k] = n;
  *ncp = k;
  return off;
}
