/* sluice — jinja: private parts of the Jinja engine (include/sluice/jinja.h).
 *
 * Layout: jinja_value.c (values, the arena, untrusted marks, str() /
 * repr()), jinja_json.c (tojson), jinja_lex.c (tokens, whitespace control),
 * jinja_parse.c (the AST), jinja_eval.c
 * (statements, expressions, the public compile / render), jinja_builtins.c
 * (filters, attribute / item access, dict and list methods), jinja_str.c
 * (str methods, case mapping), jinja_globals.c (tests, global functions),
 * jinja_chat.c (the chat-template convenience).
 *
 * Memory: a template's AST lives in the template's arena. Every value made
 * while rendering lives in the render's arena and is freed with it, so the
 * evaluator reports errors by longjmp() to the render entry point without
 * leaking: nothing on the way needs unwinding.
 */
#ifndef SLUICE_MODEL_JINJA_IMPL_H
#define SLUICE_MODEL_JINJA_IMPL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/jinja.h"
#include "sluice/utf8.h"

/* ---- arena --------------------------------------------------------------- */

typedef struct sl__jarena {
  struct sl__jchunk *head;
  size_t used;     /* bytes taken from the funnel */
  size_t limit;    /* 0 = no limit */
  bool over_limit; /* the last failure was the limit, not the funnel */
} sl__jarena;

/* Returns `n` bytes aligned for any value, or NULL (out of memory or over the
 * limit). Freed only by sl__ja_free. */
void *sl__ja_alloc(sl__jarena *a, size_t n);
void sl__ja_free(sl__jarena *a);

/* ---- values -------------------------------------------------------------- */

/* Kinds beyond the public ones exist only during a render. */
enum {
  SL__JV_NAMESPACE = 16, /* a dict whose attributes may be set */
  SL__JV_MACRO = 17,
  SL__JV_FUNC = 18, /* a global builtin function */
  SL__JV_LOOP = 19, /* the `loop` variable of a for loop */
};

struct sl__jnode;

struct sl_jv {
  uint8_t kind;
  bool heap;      /* built by the caller with sl_malloc (owned tree) */
  bool is_tuple;  /* a list that reprs as (a, b) and never equals a list */
  bool untrusted; /* caller-marked (sl_jv_mark_untrusted): all of its text
                     came from outside input */
  union {
    bool b;
    int64_t i;
    double f;
    struct {
      char *p; /* NUL-terminated */
      size_t n;
      uint8_t *t; /* (n) 1 where the byte is untrusted; NULL: none is
                     (render-arena strings only; see the untrusted flag) */
    } s;
    struct {
      sl_jv **v;
      size_t n, cap;
    } l;
    struct { /* dict and namespace */
      sl_jv **k, **v;
      size_t n, cap;
    } d;
    struct {
      const struct sl__jnode *node;
      struct sl__jframe *frame; /* the scope the macro was defined in */
    } m;
    int fn;
    struct {
      size_t i, n;  /* iteration (0-based) and count */
      sl_jv *items; /* the list iterated over */
    } loop;
    const char *undef_name; /* for error messages; may be NULL */
  } u;
};

/* A growable byte buffer in an arena. Untrusted bytes (text that came from
 * a string marked with sl_jv_mark_untrusted) are tracked in `t`. */
typedef struct sl__jbuf {
  char *p;
  size_t n, cap;
  uint8_t *t; /* (cap) 1 where p[i] is untrusted; NULL until one is */
} sl__jbuf;

/* ---- AST ---------------------------------------------------------------- */

typedef enum sl__jnode_kind {
  /* statements */
  JN_TEXT,
  JN_OUTPUT,    /* a */
  JN_IF,        /* a: cond, l1: body, l2: else */
  JN_FOR,       /* names: targets, a: iter, b: filter, l1: body, l2: else */
  JN_SET,       /* names: targets, a: value */
  JN_SET_ATTR,  /* s: variable, s2: attribute, a: value */
  JN_SET_BLOCK, /* names: target, l1: body */
  JN_MACRO,     /* s: name, names: params, l2: defaults (NULL), l1: body */
  JN_BREAK,
  JN_CONTINUE,
  JN_WITH,         /* names/l2: assignments, l1: body */
  JN_FILTER_BLOCK, /* a: filter chain applied to JN_CAPTURE placeholder, l1 */
  JN_BLOCK,        /* a transparent body: l1 ({% generation %}) */
  /* expressions */
  JN_CONST,  /* v */
  JN_NAME,   /* s */
  JN_LIST,   /* l1; op = 1 for a tuple */
  JN_DICT,   /* l1: keys, l2: values */
  JN_ATTR,   /* a.s */
  JN_ITEM,   /* a[b] */
  JN_SLICE,  /* a[b:c:d] (each may be NULL) */
  JN_CALL,   /* a(l1, names=l2) */
  JN_FILTER, /* a|s(l1, names=l2); a NULL in a filter block */
  JN_TEST,   /* a is s(l1); op = 1 for "is not" */
  JN_UNARY,  /* op a */
  JN_BINARY, /* a op b */
  JN_AND,
  JN_OR,
  JN_NOT,
  JN_COND,    /* b if a else c (c may be NULL) */
  JN_COMPARE, /* l1[0] ops[0] l1[1] ops[1] l1[2] ...: a chain, as Python */
} sl__jnode_kind;

typedef enum sl__jop {
  JOP_ADD = 1,
  JOP_SUB,
  JOP_MUL,
  JOP_DIV,
  JOP_FLOORDIV,
  JOP_MOD,
  JOP_POW,
  JOP_CONCAT,
  JOP_EQ,
  JOP_NE,
  JOP_LT,
  JOP_LE,
  JOP_GT,
  JOP_GE,
  JOP_IN,
  JOP_NOTIN,
  JOP_NEG,
  JOP_POS,
} sl__jop;

typedef struct sl__jnode sl__jnode;
struct sl__jnode {
  uint8_t kind, op;
  int line;
  const char *s, *s2;
  size_t n; /* length of s (JN_TEXT) */
  sl_jv *v;
  sl__jnode *a, *b, *c, *d;
  sl__jnode **l1;
  size_t n1;
  sl__jnode **l2;
  size_t n2;
  const char **names;
  size_t nnames;
  const uint8_t *ops; /* JN_COMPARE: n1 - 1 operators */
};

struct sl_jinja_template {
  sl__jarena arena;
  sl__jnode **body;
  size_t nbody;
};

/* ---- lexer -------------------------------------------------------------- */

typedef enum sl__jtok_kind {
  JT_EOF,
  JT_TEXT,        /* raw data between tags */
  JT_VAR_BEGIN,   /* {{ */
  JT_VAR_END,     /* }} */
  JT_BLOCK_BEGIN, /* {% */
  JT_BLOCK_END,   /* %} */
  JT_NAME,
  JT_STRING, /* decoded value in s/n */
  JT_INT,
  JT_FLOAT,
  JT_OP, /* s/n: the operator text */
} sl__jtok_kind;

typedef struct sl__jtok {
  sl__jtok_kind kind;
  int line;
  const char *s; /* arena copy, NUL-terminated */
  size_t n;
  int64_t i;
  double f;
} sl__jtok;

/* Tokenizes `src` with HF's settings. On success stores an arena array of
 * tokens ending in JT_EOF. Returns SL_ERR_FORMAT (message in err) on a lexing
 * error, SL_ERR_NOMEM. */
sl_status sl__jinja_lex(sl__jarena *a, const char *src, size_t len,
                        sl__jtok **toks, size_t *ntoks, char *err,
                        size_t errcap);

/* Parses tokens into t->body. Returns SL_OK, SL_ERR_FORMAT, SL_ERR_NOMEM. */
sl_status sl__jinja_parse(sl_jinja_template_t *t, const sl__jtok *toks,
                          size_t ntoks, char *err, size_t errcap);

/* sl_jinja_render_ex with extra variables bound (borrowed) in the root
 * frame, ahead of the context. */
sl_status sl__jinja_render_bind(const sl_jinja_template_t *t, const sl_jv *ctx,
                                const sl_jinja_limits *lim,
                                const char *const *names,
                                const sl_jv *const *vals, size_t nvars,
                                char **out, size_t *out_len, uint8_t **marks,
                                char *err, size_t errcap);

/* ---- render state ------------------------------------------------------- */

typedef struct sl__jframe sl__jframe;

typedef struct sl__jrender {
  sl__jarena arena;
  jmp_buf jmp;
  sl_status st;
  char *err;
  size_t errcap;
  sl__jbuf *out;
  size_t max_output;
  uint64_t steps, max_steps;
  unsigned depth, max_depth;
  const sl_jv *ctx;
  sl__jframe *root;
} sl__jrender;

/* Records an error and longjmps to the render entry point. */
_Noreturn void sl__jfail(sl__jrender *r, sl_status st, int line,
                         const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Allocation that fails the render (SL_ERR_NOMEM or SL_ERR_RANGE). */
void *sl__jalloc(sl__jrender *r, size_t n);

/* Value constructors in the render arena (never NULL: they fail the render). */
sl_jv *sl__jv_undef(sl__jrender *r, const char *name);
sl_jv *sl__jv_none(sl__jrender *r);
sl_jv *sl__jv_bool(sl__jrender *r, bool b);
sl_jv *sl__jv_int(sl__jrender *r, int64_t i);
sl_jv *sl__jv_float(sl__jrender *r, double f);
sl_jv *sl__jv_str(sl__jrender *r, const char *p, size_t n);
sl_jv *sl__jv_list(sl__jrender *r, size_t cap);
sl_jv *sl__jv_dict(sl__jrender *r, size_t cap, int kind);
void sl__jv_list_push(sl__jrender *r, sl_jv *list, sl_jv *item);
void sl__jv_dict_put(sl__jrender *r, sl_jv *dict, sl_jv *key, sl_jv *val);
/* Borrowed lookup; NULL when missing. */
sl_jv *sl__jv_dict_find(const sl_jv *d, const sl_jv *key);
sl_jv *sl__jv_dict_find_str(const sl_jv *d, const char *key, size_t n);

bool sl__jv_truthy(const sl_jv *v);
bool sl__jv_equal(const sl_jv *a, const sl_jv *b);
/* Python ordering; fails the render on incomparable kinds. */
int sl__jv_compare(sl__jrender *r, int line, const sl_jv *a, const sl_jv *b);
const char *sl__jv_kind_name(const sl_jv *v);
static inline bool sl__jv_is_dict(const sl_jv *v) {
  return v->kind == SL_JV_DICT || v->kind == SL__JV_NAMESPACE;
}
static inline bool sl__jv_is_num(const sl_jv *v) {
  return v->kind == SL_JV_INT || v->kind == SL_JV_FLOAT ||
         v->kind == SL_JV_BOOL;
}

/* Buffers. sl__jbuf_put appends trusted bytes (the template's own text, or
 * text the engine makes up); sl__jbuf_put_sv appends bytes [off, off + n) of
 * string `s` with their untrusted marks; sl__jbuf_mark marks [from, b->n)
 * untrusted (for text derived from untrusted input by a transformation). */
void sl__jbuf_put(sl__jrender *r, sl__jbuf *b, const char *p, size_t n);
void sl__jbuf_put_sv(sl__jrender *r, sl__jbuf *b, const sl_jv *s, size_t off,
                     size_t n);
void sl__jbuf_mark(sl__jrender *r, sl__jbuf *b, size_t from);
/* A string value holding b's bytes and marks (b's memory is taken over). */
sl_jv *sl__jv_str_buf(sl__jrender *r, const sl__jbuf *b);
/* Bytes [off, off + n) of string `s`, marks kept. */
sl_jv *sl__jv_substr(sl__jrender *r, const sl_jv *s, size_t off, size_t n);
/* Whether any byte of string s in [off, off + n) is untrusted. */
bool sl__jv_untrusted_at(const sl_jv *s, size_t off, size_t n);
/* Whether v is caller-marked untrusted, or a string with an untrusted byte. */
static inline bool sl__jv_untrusted(const sl_jv *v) {
  return v->untrusted || (v->kind == SL_JV_STRING && v->u.s.t);
}
static inline void sl__jbuf_puts(sl__jrender *r, sl__jbuf *b, const char *s);
/* Appends Python str(v) (jinja's rendering of a value). */
void sl__jv_write_str(sl__jrender *r, sl__jbuf *b, const sl_jv *v);
/* Appends a null, bool, int or float as Python's str() writes it. */
void sl__jv_write_scalar(sl__jrender *r, sl__jbuf *b, const sl_jv *v);
/* Appends Python repr(v). */
void sl__jv_write_repr(sl__jrender *r, sl__jbuf *b, const sl_jv *v);
/* Appends json.dumps(v, ensure_ascii, indent, separators, sort_keys);
 * indent < 0 means None; item_sep/key_sep NULL mean the defaults. */
void sl__jv_write_json(sl__jrender *r, int line, sl__jbuf *b, const sl_jv *v,
                       bool ensure_ascii, const char *indent,
                       const char *item_sep, const char *key_sep,
                       bool sort_keys, int depth);
/* str(v) as a new value. */
sl_jv *sl__jv_to_str(sl__jrender *r, const sl_jv *v);
/* Python repr of a float. */
void sl__jfloat_repr(double f, char *buf, size_t cap);

static inline void sl__jbuf_puts(sl__jrender *r, sl__jbuf *b, const char *s) {
  size_t n = 0;
  while (s[n])
    n++;
  sl__jbuf_put(r, b, s, n);
}

/* ---- builtins (jinja_builtins.c) ---------------------------------------- */

enum { JFN_RANGE = 1, JFN_NAMESPACE, JFN_DICT, JFN_RAISE, JFN_STRFTIME };

/* Evaluated call arguments. */
typedef struct sl__jargs {
  sl_jv **pos;
  size_t npos;
  const char **kwn;
  sl_jv **kwv;
  size_t nkw;
} sl__jargs;

/* Each fails the render on an error; `line` is for messages. */
sl_jv *sl__jinja_filter(sl__jrender *r, int line, const char *name, sl_jv *v,
                        const sl__jargs *args);
bool sl__jinja_test(sl__jrender *r, int line, const char *name, sl_jv *v,
                    const sl__jargs *args);
/* Returns NULL when `obj` has no method `name` (the caller then treats the
 * call as a call of the attribute). */
sl_jv *sl__jinja_method(sl__jrender *r, int line, sl_jv *obj, const char *name,
                        const sl__jargs *args);
sl_jv *sl__jinja_call_builtin(sl__jrender *r, int line, int fn,
                              const sl__jargs *args);
/* Returns the builtin global function id for `name`, or 0. */
int sl__jinja_builtin_global(const char *name);
/* Python len(); fails for kinds without one. */
int64_t sl__jv_length(sl__jrender *r, int line, const sl_jv *v);
/* Iterable view: a list value for list/dict(keys)/string(chars)/undefined. */
sl_jv *sl__jv_iter_list(sl__jrender *r, int line, sl_jv *v);
/* Attribute / item access as jinja's getattr / getitem. */
sl_jv *sl__jv_getattr(sl__jrender *r, int line, sl_jv *obj, const char *name);
sl_jv *sl__jv_getitem(sl__jrender *r, int line, sl_jv *obj, sl_jv *key);

/* Argument helpers (jinja_builtins.c): the argument at position idx or
 * named `name` (NULL when absent); checks of counts and types that fail the
 * render. */
sl_jv *sl__jarg(const sl__jargs *a, size_t idx, const char *name);
void sl__jcheck_args(sl__jrender *r, int line, const char *what,
                     const sl__jargs *a, size_t maxpos,
                     const char *const *names);
const sl_jv *sl__jneed_str(sl__jrender *r, int line, const char *what,
                           const sl_jv *v);
int64_t sl__jneed_int(sl__jrender *r, int line, const char *what,
                      const sl_jv *v);
static inline bool sl__jopt_bool(const sl_jv *v, bool dflt) {
  return v ? sl__jv_truthy(v) : dflt;
}
_Noreturn void sl__jfail_undef(sl__jrender *r, int line, const sl_jv *v);

/* Strings (jinja_str.c); each returns a new render-arena string. */
bool sl__jis_space(uint32_t cp); /* Python's str.isspace() */
/* which: 1 left, 2 right, 3 both; chars NULL means whitespace */
sl_jv *sl__jstr_strip(sl__jrender *r, const sl_jv *s, const sl_jv *chars,
                      int which);
sl_jv *sl__jstr_upper(sl__jrender *r, const sl_jv *s);
sl_jv *sl__jstr_lower(sl__jrender *r, const sl_jv *s);
sl_jv *sl__jstr_capitalize(sl__jrender *r, const sl_jv *s);
/* jinja_style: the title filter's word rule, else Python's str.title() */
sl_jv *sl__jstr_title(sl__jrender *r, const sl_jv *s, bool jinja_style);
sl_jv *sl__jstr_replace(sl__jrender *r, int line, const sl_jv *s,
                        const sl_jv *old, const sl_jv *neu, int64_t count);
/* A str method call; NULL when `name` is not one. */
sl_jv *sl__jstr_method(sl__jrender *r, int line, sl_jv *s, const char *name,
                       const sl__jargs *args);

/* UTF-8 (the codec is sluice/utf8.h). Byte offsets of each code point (n+1
 * entries, last = n); arena array. */
size_t *sl__utf8_offsets(sl__jrender *r, const char *p, size_t n, size_t *ncp);

#endif
