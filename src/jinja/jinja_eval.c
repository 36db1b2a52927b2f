/* sluice — jinja: the Jinja evaluator, and the public compile / render API.
 *
 * Scoping follows jinja2: each for-loop iteration, macro call and with block
 * gets a fresh frame whose parent is the enclosing one; {% if %} makes none;
 * {% set %} binds in the innermost frame, so loop-body assignments vanish at
 * the end of the iteration (namespace() objects are how templates carry state
 * out). Name lookup walks the frames, then the context, then the globals.
 */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "jinja_impl.h"
#include "sluice/util.h"

struct sl__jframe {
  sl__jframe *parent;
  const char **names;
  sl_jv **vals;
  size_t n, cap;
};

typedef enum flow { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE } flow;

static sl__jframe *frame_new(sl__jrender *r, sl__jframe *parent) {
  sl__jframe *f = sl__jalloc(r, sizeof *f);
  memset(f, 0, sizeof *f);
  f->parent = parent;
  return f;
}

static void frame_set(sl__jrender *r, sl__jframe *f, const char *name,
                      sl_jv *v) {
  for (size_t i = 0; i < f->n; i++)
    if (!strcmp(f->names[i], name)) {
      f->vals[i] = v;
      return;
    }
  if (f->n == f->cap) {
    size_t cap = f->cap ? f->cap * 2 : 8;
    const char **nn = sl__jalloc(r, cap * sizeof(char *));
    sl_jv **nv = sl__jalloc(r, cap * sizeof(sl_jv *));
    if (f->n) {
      memcpy(nn, f->names, f->n * sizeof(char *));
      memcpy(nv, f->vals, f->n * sizeof(sl_jv *));
    }
    f->names = nn;
    f->vals = nv;
    f->cap = cap;
  }
  f->names[f->n] = name;
  f->vals[f->n] = v;
  f->n++;
}

static sl_jv *lookup(sl__jrender *r, sl__jframe *f, const char *name) {
  for (; f; f = f->parent)
    for (size_t i = f->n; i-- > 0;)
      if (!strcmp(f->names[i], name))
        return f->vals[i];
  if (r->ctx) {
    sl_jv *v = sl__jv_dict_find_str(r->ctx, name, strlen(name));
    if (v)
      return v;
  }
  int fn = sl__jinja_builtin_global(name);
  if (fn) {
    sl_jv *v = sl__jalloc(r, sizeof *v);
    memset(v, 0, sizeof *v);
    v->kind = SL__JV_FUNC;
    v->u.fn = fn;
    return v;
  }
  return sl__jv_undef(r, name);
}

static void step(sl__jrender *r, int line) {
  if (++r->steps > r->max_steps)
    sl__jfail(r, SL_ERR_RANGE, line,
              "template exceeded its step limit (runaway loop?)");
}

static void deeper(sl__jrender *r, int line) {
  if (++r->depth > r->max_depth)
    sl__jfail(r, SL_ERR_RANGE, line,
              "template recursion deeper than %u (runaway macro?)",
              r->max_depth);
}

_Noreturn static void fail_undefined(sl__jrender *r, int line, const sl_jv *v) {
  if (v->u.undef_name)
    sl__jfail(r, SL_ERR_FORMAT, line, "'%s' is undefined", v->u.undef_name);
  sl__jfail(r, SL_ERR_FORMAT, line, "undefined value used");
}

static sl_jv *eval(sl__jrender *r, sl__jframe *f, const sl__jnode *nd);
static flow exec_body(sl__jrender *r, sl__jframe *f, sl__jnode *const *body,
                      size_t n);

/* ---- arithmetic -------------------------------------------------------------
 */

static int64_t as_int(const sl_jv *v) {
  return v->kind == SL_JV_INT ? v->u.i : v->kind == SL_JV_BOOL ? v->u.b : 0;
}
static double as_num(const sl_jv *v) {
  return v->kind == SL_JV_FLOAT ? v->u.f : (double)as_int(v);
}

static const char *op_name(int op) {
  switch (op) {
  case JOP_ADD:
    return "+";
  case JOP_SUB:
    return "-";
  case JOP_MUL:
    return "*";
  case JOP_DIV:
    return "/";
  case JOP_FLOORDIV:
    return "//";
  case JOP_MOD:
    return "%";
  case JOP_POW:
    return "**";
  default:
    return "?";
  }
}

_Noreturn static void type_error(sl__jrender *r, int line, int op,
                                 const sl_jv *a, const sl_jv *b) {
  if (a->kind == SL_JV_UNDEFINED)
    fail_undefined(r, line, a);
  if (b->kind == SL_JV_UNDEFINED)
    fail_undefined(r, line, b);
  sl__jfail(r, SL_ERR_FORMAT, line,
            "unsupported operand type(s) for %s: '%s' and '%s'", op_name(op),
            sl__jv_kind_name(a), sl__jv_kind_name(b));
}

static sl_jv *repeat(sl__jrender *r, int line, const sl_jv *seq, int64_t k) {
  if (k < 0)
    k = 0;
  if (seq->kind == SL_JV_STRING) {
    size_t total;
    if (!sl_mul_ok(seq->u.s.n, (size_t)k, &total) || total > r->max_output)
      sl__jfail(r, SL_ERR_RANGE, line, "string repetition too large");
    sl__jbuf b = {0};
    for (int64_t i = 0; i < k; i++)
      sl__jbuf_put_sv(r, &b, seq, 0, seq->u.s.n);
    return sl__jv_str_buf(r, &b);
  }
  size_t total;
  if (!sl_mul_ok(seq->u.l.n, (size_t)k, &total) || total > (1u << 24))
    sl__jfail(r, SL_ERR_RANGE, line, "list repetition too large");
  sl_jv *l = sl__jv_list(r, total);
  for (int64_t i = 0; i < k; i++)
    for (size_t j = 0; j < seq->u.l.n; j++)
      sl__jv_list_push(r, l, seq->u.l.v[j]);
  return l;
}

static sl_jv *arith(sl__jrender *r, int line, int op, sl_jv *a, sl_jv *b) {
  bool nums = sl__jv_is_num(a) && sl__jv_is_num(b);
  bool ints = nums && a->kind != SL_JV_FLOAT && b->kind != SL_JV_FLOAT;
  if (op == JOP_ADD) {
    if (ints) {
      int64_t x;
      if (__builtin_add_overflow(as_int(a), as_int(b), &x))
        sl__jfail(r, SL_ERR_RANGE, line, "integer overflow");
      return sl__jv_int(r, x);
    }
    if (nums)
      return sl__jv_float(r, as_num(a) + as_num(b));
    if (a->kind == SL_JV_STRING && b->kind == SL_JV_STRING) {
      sl__jbuf buf = {0};
      sl__jbuf_put_sv(r, &buf, a, 0, a->u.s.n);
      sl__jbuf_put_sv(r, &buf, b, 0, b->u.s.n);
      return sl__jv_str_buf(r, &buf);
    }
    if (a->kind == SL_JV_LIST && b->kind == SL_JV_LIST) {
      sl_jv *l = sl__jv_list(r, a->u.l.n + b->u.l.n);
      for (size_t i = 0; i < a->u.l.n; i++)
        sl__jv_list_push(r, l, a->u.l.v[i]);
      for (size_t i = 0; i < b->u.l.n; i++)
        sl__jv_list_push(r, l, b->u.l.v[i]);
      return l;
    }
    type_error(r, line, op, a, b);
  }
  if (op == JOP_MUL) {
    if (ints) {
      int64_t x;
      if (__builtin_mul_overflow(as_int(a), as_int(b), &x))
        sl__jfail(r, SL_ERR_RANGE, line, "integer overflow");
      return sl__jv_int(r, x);
    }
    if (nums)
      return sl__jv_float(r, as_num(a) * as_num(b));
    if ((a->kind == SL_JV_STRING || a->kind == SL_JV_LIST) &&
        (b->kind == SL_JV_INT || b->kind == SL_JV_BOOL))
      return repeat(r, line, a, as_int(b));
    if ((b->kind == SL_JV_STRING || b->kind == SL_JV_LIST) &&
        (a->kind == SL_JV_INT || a->kind == SL_JV_BOOL))
      return repeat(r, line, b, as_int(a));
    type_error(r, line, op, a, b);
  }
  if (!nums) {
    if (op == JOP_MOD && a->kind == SL_JV_STRING)
      sl__jfail(r, SL_ERR_UNSUPPORTED, line,
                "unsupported construct: %%-formatting of strings");
    type_error(r, line, op, a, b);
  }
  switch (op) {
  case JOP_SUB:
    if (ints) {
      int64_t x;
      if (__builtin_sub_overflow(as_int(a), as_int(b), &x))
        sl__jfail(r, SL_ERR_RANGE, line, "integer overflow");
      return sl__jv_int(r, x);
    }
    return sl__jv_float(r, as_num(a) - as_num(b));
  case JOP_DIV:
    if (as_num(b) == 0)
      sl__jfail(r, SL_ERR_FORMAT, line, "division by zero");
    return sl__jv_float(r, as_num(a) / as_num(b));
  case JOP_FLOORDIV:
  case JOP_MOD:
    if (as_num(b) == 0)
      sl__jfail(r, SL_ERR_FORMAT, line, "integer division or modulo by zero");
    if (ints) {
      int64_t x = as_int(a), y = as_int(b);
      if (x == INT64_MIN && y == -1)
        sl__jfail(r, SL_ERR_RANGE, line, "integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        q--;
        m += y;
      }
      return sl__jv_int(r, op == JOP_MOD ? m : q);
    } else {
      double x = as_num(a), y = as_num(b);
      /* CPython's float divmod */
      double m = fmod(x, y), d = (x - m) / y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        m += y;
        d -= 1.0;
      }
      if (op == JOP_MOD)
        return sl__jv_float(r, m != 0 ? m : copysign(0.0, y));
      double fd = floor(d);
      if (d - fd > 0.5)
        fd += 1.0;
      return sl__jv_float(r, d != 0 ? fd : copysign(0.0, x / y));
    }
  case JOP_POW:
    if (ints && as_int(b) >= 0) {
      int64_t base = as_int(a), e = as_int(b), x = 1;
      while (e-- > 0)
        if (__builtin_mul_overflow(x, base, &x))
          sl__jfail(r, SL_ERR_RANGE, line, "integer overflow");
      return sl__jv_int(r, x);
    }
    return sl__jv_float(r, pow(as_num(a), as_num(b)));
  default:
    break;
  }
  type_error(r, line, op, a, b);
}

static bool contains(sl__jrender *r, int line, sl_jv *needle, sl_jv *hay) {
  switch (hay->kind) {
  case SL_JV_STRING:
    if (needle->kind != SL_JV_STRING)
      sl__jfail(r, SL_ERR_FORMAT, line,
                "'in <string>' requires string as left operand, not %s",
                sl__jv_kind_name(needle));
    if (needle->u.s.n == 0)
      return true;
    if (needle->u.s.n > hay->u.s.n)
      return false;
    return memmem(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n) != NULL;
  case SL_JV_LIST:
    for (size_t i = 0; i < hay->u.l.n; i++)
      if (sl__jv_equal(hay->u.l.v[i], needle))
        return true;
    return false;
  case SL_JV_DICT:
  case SL__JV_NAMESPACE:
    return sl__jv_dict_find(hay, needle) != NULL;
  case SL_JV_UNDEFINED:
    return false;
  default:
    sl__jfail(r, SL_ERR_FORMAT, line, "argument of type '%s' is not iterable",
              sl__jv_kind_name(hay));
  }
}

static sl_jv *binary(sl__jrender *r, const sl__jnode *nd, sl_jv *a, sl_jv *b) {
  int line = nd->line;
  switch (nd->op) {
  case JOP_CONCAT: {
    sl__jbuf buf = {0};
    sl__jv_write_str(r, &buf, a);
    sl__jv_write_str(r, &buf, b);
    return sl__jv_str_buf(r, &buf);
  }
  case JOP_EQ:
    return sl__jv_bool(r, sl__jv_equal(a, b));
  case JOP_NE:
    return sl__jv_bool(r, !sl__jv_equal(a, b));
  case JOP_LT:
  case JOP_LE:
  case JOP_GT:
  case JOP_GE: {
    if (a->kind == SL_JV_UNDEFINED)
      fail_undefined(r, line, a);
    if (b->kind == SL_JV_UNDEFINED)
      fail_undefined(r, line, b);
    int c = sl__jv_compare(r, line, a, b);
    bool res = nd->op == JOP_LT   ? c < 0
               : nd->op == JOP_LE ? c <= 0
               : nd->op == JOP_GT ? c > 0
                                  : c >= 0;
    return sl__jv_bool(r, res);
  }
  case JOP_IN:
    return sl__jv_bool(r, contains(r, line, a, b));
  case JOP_NOTIN:
    return sl__jv_bool(r, !contains(r, line, a, b));
  default:
    return arith(r, line, nd->op, a, b);
  }
}

/* ---- slicing
 * ----------------------------------------------------------------- */

static int64_t slice_index(sl__jrender *r, sl__jframe *f, const sl__jnode *nd,
                           bool *present) {
  *present = false;
  if (!nd)
    return 0;
  sl_jv *v = eval(r, f, nd);
  if (v->kind == SL_JV_NULL)
    return 0;
  if (v->kind != SL_JV_INT && v->kind != SL_JV_BOOL)
    sl__jfail(r, SL_ERR_FORMAT, nd->line,
              "slice indices must be integers or None");
  *present = true;
  return as_int(v);
}

static sl_jv *eval_slice(sl__jrender *r, sl__jframe *f, const sl__jnode *nd) {
  sl_jv *obj = eval(r, f, nd->a);
  bool hs, he, hst;
  int64_t start = slice_index(r, f, nd->b, &hs);
  int64_t stop = slice_index(r, f, nd->c, &he);
  int64_t stp = slice_index(r, f, nd->d, &hst);
  if (!hst)
    stp = 1;
  if (stp == 0)
    sl__jfail(r, SL_ERR_FORMAT, nd->line, "slice step cannot be zero");
  size_t *off = NULL;
  int64_t len;
  if (obj->kind == SL_JV_LIST) {
    len = (int64_t)obj->u.l.n;
  } else if (obj->kind == SL_JV_STRING) {
    size_t ncp;
    off = sl__utf8_offsets(r, obj->u.s.p, obj->u.s.n, &ncp);
    len = (int64_t)ncp;
  } else {
    if (obj->kind == SL_JV_UNDEFINED)
      fail_undefined(r, nd->line, obj);
    sl__jfail(r, SL_ERR_FORMAT, nd->line, "'%s' object is not subscriptable",
              sl__jv_kind_name(obj));
  }
  /* Python's slice.indices() */
  int64_t lo = stp < 0 ? -1 : 0, hi = stp < 0 ? len - 1 : len;
  if (!hs)
    start = stp < 0 ? hi : lo;
  else {
    if (start < 0)
      start += len;
    start = start < lo ? lo : start > hi ? hi : start;
  }
  if (!he)
    stop = stp < 0 ? lo : hi;
  else {
    if (stop < 0)
      stop += len;
    stop = stop < lo ? lo : stop > hi ? hi : stop;
  }
  if (obj->kind == SL_JV_LIST) {
    sl_jv *l = sl__jv_list(r, 0);
    for (int64_t i = start; stp > 0 ? i < stop : i > stop; i += stp)
      sl__jv_list_push(r, l, obj->u.l.v[i]);
    return l;
  }
  sl__jbuf b = {0};
  for (int64_t i = start; stp > 0 ? i < stop : i > stop; i += stp)
    sl__jbuf_put_sv(r, &b, obj, off[i], off[i + 1] - off[i]);
  return sl__jv_str_buf(r, &b);
}

/* ---- calls
 * ----------------------------------------------------------------------- */

static void eval_args(sl__jrender *r, sl__jframe *f, const sl__jnode *nd,
                      sl__jargs *args) {
  memset(args, 0, sizeof *args);
  if (nd->n1) {
    args->pos = sl__jalloc(r, nd->n1 * sizeof(sl_jv *));
    for (size_t i = 0; i < nd->n1; i++)
      args->pos[i] = eval(r, f, nd->l1[i]);
    args->npos = nd->n1;
  }
  if (nd->n2) {
    args->kwv = sl__jalloc(r, nd->n2 * sizeof(sl_jv *));
    for (size_t i = 0; i < nd->n2; i++)
      args->kwv[i] = eval(r, f, nd->l2[i]);
    args->kwn = nd->names;
    args->nkw = nd->n2;
  }
}

static sl_jv *call_macro(sl__jrender *r, int line, const sl_jv *m,
                         const sl__jargs *args) {
  const sl__jnode *def = m->u.m.node;
  deeper(r, line);
  step(r, line);
  sl__jframe *f = frame_new(r, m->u.m.frame);
  if (args->npos > def->nnames)
    sl__jfail(r, SL_ERR_FORMAT, line,
              "macro '%s' takes not more than %zu "
              "argument(s)",
              def->s, def->nnames);
  for (size_t i = 0; i < args->npos; i++)
    frame_set(r, f, def->names[i], args->pos[i]);
  for (size_t k = 0; k < args->nkw; k++) {
    size_t i;
    for (i = 0; i < def->nnames; i++)
      if (!strcmp(def->names[i], args->kwn[k]))
        break;
    if (i == def->nnames)
      sl__jfail(r, SL_ERR_FORMAT, line, "macro '%s' has no argument named '%s'",
                def->s, args->kwn[k]);
    if (i < args->npos)
      sl__jfail(r, SL_ERR_FORMAT, line,
                "macro '%s' got multiple values for argument '%s'", def->s,
                args->kwn[k]);
    frame_set(r, f, def->names[i], args->kwv[k]);
  }
  for (size_t i = args->npos; i < def->nnames; i++) {
    bool given = false;
    for (size_t k = 0; k < args->nkw; k++)
      if (!strcmp(def->names[i], args->kwn[k]))
        given = true;
    if (given)
      continue;
    sl_jv *v =
        def->l2[i] ? eval(r, f, def->l2[i]) : sl__jv_undef(r, def->names[i]);
    frame_set(r, f, def->names[i], v);
  }
  sl__jbuf *saved = r->out, buf = {0};
  r->out = &buf;
  exec_body(r, f, def->l1, def->n1);
  r->out = saved;
  r->depth--;
  return sl__jv_str_buf(r, &buf);
}

static sl_jv *call_value(sl__jrender *r, int line, sl_jv *callee,
                         const sl__jargs *args) {
  if (callee->kind == SL__JV_MACRO)
    return call_macro(r, line, callee, args);
  if (callee->kind == SL__JV_FUNC)
    return sl__jinja_call_builtin(r, line, callee->u.fn, args);
  if (callee->kind == SL_JV_UNDEFINED)
    fail_undefined(r, line, callee);
  sl__jfail(r, SL_ERR_FORMAT, line, "'%s' object is not callable",
            sl__jv_kind_name(callee));
}

static sl_jv *eval_call(sl__jrender *r, sl__jframe *f, const sl__jnode *nd) {
  sl__jargs args;
  if (nd->a->kind == JN_ATTR) {
    sl_jv *obj = eval(r, f, nd->a->a);
    eval_args(r, f, nd, &args);
    sl_jv *res = sl__jinja_method(r, nd->line, obj, nd->a->s, &args);
    if (res)
      return res;
    if (obj->kind == SL_JV_UNDEFINED)
      fail_undefined(r, nd->line, obj);
    sl_jv *callee = sl__jv_getattr(r, nd->line, obj, nd->a->s);
    if (callee->kind == SL_JV_UNDEFINED)
      sl__jfail(r, SL_ERR_UNSUPPORTED, nd->line,
                "unsupported method '%s' on a %s value", nd->a->s,
                sl__jv_kind_name(obj));
    return call_value(r, nd->line, callee, &args);
  }
  sl_jv *callee = eval(r, f, nd->a);
  eval_args(r, f, nd, &args);
  return call_value(r, nd->line, callee, &args);
}

/* ---- expressions
 * --------------------------------------------------------------- */

static sl_jv *eval_inner(sl__jrender *r, sl__jframe *f, const sl__jnode *nd) {
  switch (nd->kind) {
  case JN_CONST:
    return nd->v;
  case JN_NAME:
    return lookup(r, f, nd->s);
  case JN_LIST: {
    sl_jv *l = sl__jv_list(r, nd->n1);
    for (size_t i = 0; i < nd->n1; i++)
      sl__jv_list_push(r, l, eval(r, f, nd->l1[i]));
    l->is_tuple = nd->op == 1;
    return l;
  }
  case JN_DICT: {
    sl_jv *d = sl__jv_dict(r, nd->n1, SL_JV_DICT);
    for (size_t i = 0; i < nd->n1; i++) {
      sl_jv *k = eval(r, f, nd->l1[i]);
      if (k->kind == SL_JV_LIST || sl__jv_is_dict(k))
        sl__jfail(r, SL_ERR_FORMAT, nd->line, "unhashable type: '%s'",
                  sl__jv_kind_name(k));
      sl__jv_dict_put(r, d, k, eval(r, f, nd->l2[i]));
    }
    return d;
  }
  case JN_ATTR:
    return sl__jv_getattr(r, nd->line, eval(r, f, nd->a), nd->s);
  case JN_ITEM:
    return sl__jv_getitem(r, nd->line, eval(r, f, nd->a), eval(r, f, nd->b));
  case JN_SLICE:
    return eval_slice(r, f, nd);
  case JN_CALL:
    return eval_call(r, f, nd);
  case JN_FILTER: {
    sl_jv *v = eval(r, f, nd->a);
    sl__jargs args;
    eval_args(r, f, nd, &args);
    return sl__jinja_filter(r, nd->line, nd->s, v, &args);
  }
  case JN_TEST: {
    sl_jv *v = eval(r, f, nd->a);
    sl__jargs args;
    eval_args(r, f, nd, &args);
    bool res = sl__jinja_test(r, nd->line, nd->s, v, &args);
    return sl__jv_bool(r, nd->op ? !res : res);
  }
  case JN_UNARY: {
    sl_jv *v = eval(r, f, nd->a);
    if (!sl__jv_is_num(v)) {
      if (v->kind == SL_JV_UNDEFINED)
        fail_undefined(r, nd->line, v);
      sl__jfail(r, SL_ERR_FORMAT, nd->line,
                "bad operand type for unary %s: "
                "'%s'",
                nd->op == JOP_NEG ? "-" : "+", sl__jv_kind_name(v));
    }
    if (nd->op == JOP_POS)
      return v->kind == SL_JV_BOOL ? sl__jv_int(r, v->u.b) : v;
    if (v->kind == SL_JV_FLOAT)
      return sl__jv_float(r, -v->u.f);
    if (as_int(v) == INT64_MIN)
      sl__jfail(r, SL_ERR_RANGE, nd->line, "integer overflow");
    return sl__jv_int(r, -as_int(v));
  }
  case JN_BINARY: {
    sl_jv *a = eval(r, f, nd->a);
    sl_jv *b = eval(r, f, nd->b);
    return binary(r, nd, a, b);
  }
  case JN_AND: {
    sl_jv *a = eval(r, f, nd->a);
    return sl__jv_truthy(a) ? eval(r, f, nd->b) : a;
  }
  case JN_OR: {
    sl_jv *a = eval(r, f, nd->a);
    return sl__jv_truthy(a) ? a : eval(r, f, nd->b);
  }
  case JN_NOT:
    return sl__jv_bool(r, !sl__jv_truthy(eval(r, f, nd->a)));
  case JN_COMPARE: {
    /* a < b < c is (a < b) and (b < c), each operand evaluated once */
    sl_jv *lhs = eval(r, f, nd->l1[0]), *res = NULL;
    for (size_t i = 1; i < nd->n1; i++) {
      sl_jv *rhs = eval(r, f, nd->l1[i]);
      sl__jnode op = {
          .kind = JN_BINARY, .op = nd->ops[i - 1], .line = nd->line};
      res = binary(r, &op, lhs, rhs);
      if (!sl__jv_truthy(res))
        return res;
      lhs = rhs;
    }
    return res;
  }
  case JN_COND:
    if (sl__jv_truthy(eval(r, f, nd->a)))
      return eval(r, f, nd->b);
    return nd->c ? eval(r, f, nd->c) : sl__jv_undef(r, NULL);
  default:
    break;
  }
  sl__jfail(r, SL_ERR_UNSUPPORTED, nd->line, "unsupported expression");
}

static sl_jv *eval(sl__jrender *r, sl__jframe *f, const sl__jnode *nd) {
  deeper(r, nd->line);
  sl_jv *v = eval_inner(r, f, nd);
  r->depth--;
  return v;
}

/* ---- statements
 * ----------------------------------------------------------------- */

static void assign(sl__jrender *r, sl__jframe *f, const sl__jnode *nd,
                   sl_jv *v) {
  if (nd->nnames == 1) {
    frame_set(r, f, nd->names[0], v);
    return;
  }
  sl_jv *l = sl__jv_iter_list(r, nd->line, v);
  if (l->u.l.n != nd->nnames)
    sl__jfail(r, SL_ERR_FORMAT, nd->line,
              "cannot unpack %zu values into %zu names", l->u.l.n, nd->nnames);
  for (size_t i = 0; i < nd->nnames; i++)
    frame_set(r, f, nd->names[i], l->u.l.v[i]);
}

/* The loop variable is computed on access (see sl__jv_getattr), so that an
 * iteration costs one small value, not a dict. */
static sl_jv *make_loop(sl__jrender *r, size_t i, size_t n, sl_jv *items) {
  sl_jv *l = sl__jalloc(r, sizeof *l);
  memset(l, 0, sizeof *l);
  l->kind = SL__JV_LOOP;
  l->u.loop.i = i;
  l->u.loop.n = n;
  l->u.loop.items = items;
  return l;
}

static flow exec_for(sl__jrender *r, sl__jframe *f, const sl__jnode *nd) {
  sl_jv *it = eval(r, f, nd->a);
  sl_jv *items = sl__jv_iter_list(r, nd->line, it);
  if (nd->b) {
    sl_jv *kept = sl__jv_list(r, 0);
    for (size_t i = 0; i < items->u.l.n; i++) {
      step(r, nd->line);
      sl__jframe *ff = frame_new(r, f);
      assign(r, ff, nd, items->u.l.v[i]);
      if (sl__jv_truthy(eval(r, ff, nd->b)))
        sl__jv_list_push(r, kept, items->u.l.v[i]);
    }
    items = kept;
  }
  size_t n = items->u.l.n;
  for (size_t i = 0; i < n; i++) {
    step(r, nd->line);
    sl__jframe *ff = frame_new(r, f);
    frame_set(r, ff, "loop", make_loop(r, i, n, items));
    assign(r, ff, nd, items->u.l.v[i]);
    flow fl = exec_body(r, ff, nd->l1, nd->n1);
    if (fl == FLOW_BREAK)
      break;
  }
  if (n == 0 && nd->n2)
    return exec_body(r, frame_new(r, f), nd->l2, nd->n2);
  return FLOW_NORMAL;
}

static sl_jv *capture(sl__jrender *r, sl__jframe *f, sl__jnode *const *body,
                      size_t n) {
  sl__jbuf *saved = r->out, buf = {0};
  r->out = &buf;
  exec_body(r, f, body, n);
  r->out = saved;
  return sl__jv_str_buf(r, &buf);
}

static flow exec_node(sl__jrender *r, sl__jframe *f, const sl__jnode *nd) {
  step(r, nd->line);
  switch (nd->kind) {
  case JN_TEXT:
    sl__jbuf_put(r, r->out, nd->s, nd->n);
    return FLOW_NORMAL;
  case JN_OUTPUT: {
    sl_jv *v = eval(r, f, nd->a);
    sl__jv_write_str(r, r->out, v);
    return FLOW_NORMAL;
  }
  case JN_IF:
    if (sl__jv_truthy(eval(r, f, nd->a)))
      return exec_body(r, f, nd->l1, nd->n1);
    return exec_body(r, f, nd->l2, nd->n2);
  case JN_FOR:
    return exec_for(r, f, nd);
  case JN_SET:
    assign(r, f, nd, eval(r, f, nd->a));
    return FLOW_NORMAL;
  case JN_SET_ATTR: {
    sl_jv *ns = lookup(r, f, nd->s);
    if (ns->kind != SL__JV_NAMESPACE)
      sl__jfail(r, SL_ERR_FORMAT, nd->line,
                "cannot assign attribute on non-namespace object '%s'", nd->s);
    sl_jv *v = eval(r, f, nd->a);
    sl__jv_dict_put(r, ns, sl__jv_str(r, nd->s2, strlen(nd->s2)), v);
    return FLOW_NORMAL;
  }
  case JN_SET_BLOCK:
    assign(r, f, nd, capture(r, f, nd->l1, nd->n1));
    return FLOW_NORMAL;
  case JN_MACRO: {
    sl_jv *m = sl__jalloc(r, sizeof *m);
    memset(m, 0, sizeof *m);
    m->kind = SL__JV_MACRO;
    m->u.m.node = nd;
    m->u.m.frame = f;
    frame_set(r, f, nd->s, m);
    return FLOW_NORMAL;
  }
  case JN_BREAK:
    return FLOW_BREAK;
  case JN_CONTINUE:
    return FLOW_CONTINUE;
  case JN_WITH: {
    sl__jframe *ff = frame_new(r, f);
    for (size_t i = 0; i < nd->n2; i++)
      frame_set(r, ff, nd->names[i], eval(r, f, nd->l2[i]));
    return exec_body(r, ff, nd->l1, nd->n1);
  }
  case JN_FILTER_BLOCK: {
    sl_jv *v = capture(r, f, nd->l1, nd->n1);
    /* apply the chain innermost first */
    const sl__jnode *chain[64];
    size_t k = 0;
    for (const sl__jnode *c = nd->a; c && k < 64; c = c->a)
      chain[k++] = c;
    while (k-- > 0) {
      sl__jargs args;
      eval_args(r, f, chain[k], &args);
      v = sl__jinja_filter(r, chain[k]->line, chain[k]->s, v, &args);
    }
    sl__jv_write_str(r, r->out, v);
    return FLOW_NORMAL;
  }
  case JN_BLOCK:
    return exec_body(r, f, nd->l1, nd->n1);
  default:
    break;
  }
  sl__jfail(r, SL_ERR_UNSUPPORTED, nd->line, "unsupported statement");
}

static flow exec_body(sl__jrender *r, sl__jframe *f, sl__jnode *const *body,
                      size_t n) {
  deeper(r, n ? body[0]->line : 0);
  for (size_t i = 0; i < n; i++) {
    flow fl = exec_node(r, f, body[i]);
    if (fl != FLOW_NORMAL) {
      r->depth--;
      return fl;
    }
  }
  r->depth--;
  return FLOW_NORMAL;
}

/* ---- public API
 * ----------------------------------------------------------------- */

static void set_err(char *err, size_t errcap, const char *msg) {
  if (err && errcap)
    snprintf(err, errcap, "%s", msg);
}

sl_jinja_template_t *sl_jinja_compile(const char *src, size_t len, char *err,
                                      size_t errcap) {
  if (err && errcap)
    err[0] = 0;
  if (!src && len) {
    set_err(err, errcap, "no template source");
    return NULL;
  }
  sl_jinja_template_t *t = sl_calloc(1, sizeof *t);
  if (!t) {
    set_err(err, errcap, "out of memory");
    return NULL;
  }
  sl__jtok *toks;
  size_t ntoks;
  sl_status st =
      sl__jinja_lex(&t->arena, src ? src : "", len, &toks, &ntoks, err, errcap);
  if (st == SL_OK)
    st = sl__jinja_parse(t, toks, ntoks, err, errcap);
  if (st != SL_OK) {
    if (st == SL_ERR_NOMEM)
      set_err(err, errcap, "out of memory");
    goto fail_template;
  }
  return t;

fail_template:
  sl_jinja_free(t);
  return NULL;
}

void sl_jinja_free(sl_jinja_template_t *t) {
  if (!t)
    return;
  sl__ja_free(&t->arena);
  sl_free(t);
}

sl_status sl_jinja_render(const sl_jinja_template_t *t, const sl_jv *ctx,
                          char **out, size_t *out_len, char *err,
                          size_t errcap) {
  return sl_jinja_render_ex(t, ctx, NULL, out, out_len, err, errcap);
}

sl_status sl_jinja_render_ex(const sl_jinja_template_t *t, const sl_jv *ctx,
                             const sl_jinja_limits *lim, char **out,
                             size_t *out_len, char *err, size_t errcap) {
  return sl__jinja_render_bind(t, ctx, lim, NULL, NULL, 0, out, out_len, NULL,
                               err, errcap);
}

sl_status sl__jinja_render_bind(const sl_jinja_template_t *t, const sl_jv *ctx,
                                const sl_jinja_limits *lim,
                                const char *const *names,
                                const sl_jv *const *vals, size_t nvars,
                                char **out, size_t *out_len, uint8_t **marks,
                                char *err, size_t errcap) {
  if (err && errcap)
    err[0] = 0;
  if (marks)
    *marks = NULL;
  if (!out || !t) {
    set_err(err, errcap, "invalid argument");
    return SL_ERR_INVALID_ARG;
  }
  *out = NULL;
  if (out_len)
    *out_len = 0;
  if (ctx && ctx->kind != SL_JV_DICT) {
    set_err(err, errcap, "the context must be a dict");
    return SL_ERR_INVALID_ARG;
  }
  /* The state is heap-allocated so that nothing setjmp() could clobber
   * lives in this frame's registers. */
  sl__jrender *r = sl_calloc(1, sizeof *r);
  if (!r) {
    set_err(err, errcap, "out of memory");
    return SL_ERR_NOMEM;
  }
  sl_jinja_limits L = {0};
  if (lim)
    L = *lim;
  r->arena.limit = L.max_memory ? L.max_memory : (size_t)512 << 20;
  r->max_output = L.max_output ? L.max_output : (size_t)64 << 20;
  r->max_steps = L.max_steps ? L.max_steps : 10000000ull;
  r->max_depth = L.max_depth ? L.max_depth : 200;
  r->err = err;
  r->errcap = errcap;
  r->ctx = ctx;
  sl_status st = SL_OK;
  if (setjmp(r->jmp)) {
    st = r->st;
    goto fail_arena;
  }
  sl__jbuf *main_out = sl__jalloc(r, sizeof *main_out);
  memset(main_out, 0, sizeof *main_out);
  r->out = main_out;
  r->root = frame_new(r, NULL);
  for (size_t i = 0; i < nvars; i++)
    frame_set(r, r->root, names[i], (sl_jv *)vals[i]);
  exec_body(r, r->root, t->body, t->nbody);
  char *res = sl_malloc(main_out->n + 1);
  if (!res)
    sl__jfail(r, SL_ERR_NOMEM, 0, "out of memory");
  if (main_out->n)
    memcpy(res, main_out->p, main_out->n);
  res[main_out->n] = 0;
  if (marks && main_out->t && memchr(main_out->t, 1, main_out->n)) {
    *marks = sl_malloc(main_out->n);
    if (!*marks) {
      sl_free(res);
      sl__jfail(r, SL_ERR_NOMEM, 0, "out of memory");
    }
    memcpy(*marks, main_out->t, main_out->n);
  }
  *out = res;
  if (out_len)
    *out_len = main_out->n;

fail_arena:
  sl__ja_free(&r->arena);
  sl_free(r);
  return st;
}
