/* sluice — jinja: Jinja tests (`x is defined`, ...) and the global
 * functions (range, namespace, dict, raise_exception, strftime_now).
 */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "jinja_impl.h"
#include "sluice/util.h"

#define MAX_RANGE 100000 /* jinja2's sandbox limit */

/* ---- tests
 * ---------------------------------------------------------------------- */

bool sl__jinja_test(sl__jrender *r, int line, const char *t, sl_jv *v,
                    const sl__jargs *a) {
  sl_jv *a0 = sl__jarg(a, 0, NULL);
  int k = v->kind;
  if (!strcmp(t, "defined"))
    return k != SL_JV_UNDEFINED;
  if (!strcmp(t, "undefined"))
    return k == SL_JV_UNDEFINED;
  if (!strcmp(t, "none"))
    return k == SL_JV_NULL;
  if (!strcmp(t, "string"))
    return k == SL_JV_STRING;
  if (!strcmp(t, "number"))
    return k == SL_JV_INT || k == SL_JV_FLOAT || k == SL_JV_BOOL;
  if (!strcmp(t, "integer"))
    return k == SL_JV_INT;
  if (!strcmp(t, "float"))
    return k == SL_JV_FLOAT;
  if (!strcmp(t, "boolean"))
    return k == SL_JV_BOOL;
  if (!strcmp(t, "true"))
    return k == SL_JV_BOOL && v->u.b;
  if (!strcmp(t, "false"))
    return k == SL_JV_BOOL && !v->u.b;
  if (!strcmp(t, "mapping"))
    return k == SL_JV_DICT;
  if (!strcmp(t, "iterable"))
    return k == SL_JV_STRING || k == SL_JV_LIST || k == SL_JV_DICT ||
           k == SL_JV_UNDEFINED;
  if (!strcmp(t, "sequence"))
    return k == SL_JV_STRING || k == SL_JV_LIST || k == SL_JV_DICT;
  if (!strcmp(t, "callable"))
    return k == SL__JV_MACRO || k == SL__JV_FUNC;
  if (!strcmp(t, "even") || !strcmp(t, "odd")) {
    if (k == SL_JV_UNDEFINED)
      sl__jfail_undef(r, line, v);
    if (k != SL_JV_INT && k != SL_JV_BOOL)
      sl__jfail(r, SL_ERR_FORMAT, line, "test '%s' needs an integer", t);
    int64_t x = k == SL_JV_INT ? v->u.i : v->u.b;
    return (x % 2 == 0) == (t[0] == 'e');
  }
  if (!strcmp(t, "divisibleby")) {
    if (!a0)
      sl__jfail(r, SL_ERR_FORMAT, line, "divisibleby needs an argument");
    int64_t x = sl__jneed_int(r, line, "divisibleby", v);
    int64_t d = sl__jneed_int(r, line, "divisibleby", a0);
    if (d == 0)
      sl__jfail(r, SL_ERR_FORMAT, line, "integer modulo by zero");
    return d == -1 || x % d == 0;
  }
  if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
    if (k != SL_JV_STRING)
      return false;
    sl_jv *s =
        sl__jstr_method(r, line, v, t[0] == 'l' ? "islower" : "isupper", a);
    return s->u.b;
  }
  static const struct {
    const char *name;
    int op;
  } cmp[] = {{"eq", JOP_EQ},       {"equalto", JOP_EQ}, {"==", JOP_EQ},
             {"ne", JOP_NE},       {"!=", JOP_NE},      {"lt", JOP_LT},
             {"lessthan", JOP_LT}, {"<", JOP_LT},       {"le", JOP_LE},
             {"<=", JOP_LE},       {"gt", JOP_GT},      {"greaterthan", JOP_GT},
             {">", JOP_GT},        {"ge", JOP_GE},      {">=", JOP_GE},
             {"in", JOP_IN},       {"sameas", JOP_EQ}};
  for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++) {
    if (strcmp(t, cmp[i].name))
      continue;
    if (!a0)
      sl__jfail(r, SL_ERR_FORMAT, line, "test '%s' needs an argument", t);
    switch (cmp[i].op) {
    case JOP_EQ:
      if (t[0] == 's') /* sameas: identity; equal scalars of one kind */
        return v == a0 || (v->kind == a0->kind && v->kind <= SL_JV_BOOL &&
                           sl__jv_equal(v, a0));
      return sl__jv_equal(v, a0);
    case JOP_NE:
      return !sl__jv_equal(v, a0);
    case JOP_IN:
      if (a0->kind == SL_JV_STRING && v->kind == SL_JV_STRING)
        return v->u.s.n == 0 ||
               (v->u.s.n <= a0->u.s.n &&
                memmem(a0->u.s.p, a0->u.s.n, v->u.s.p, v->u.s.n));
      if (a0->kind == SL_JV_LIST) {
        for (size_t j = 0; j < a0->u.l.n; j++)
          if (sl__jv_equal(a0->u.l.v[j], v))
            return true;
        return false;
      }
      if (sl__jv_is_dict(a0))
        return sl__jv_dict_find(a0, v) != NULL;
      sl__jfail(r, SL_ERR_FORMAT, line, "test 'in' needs a container");
    default: {
      if (v->kind == SL_JV_UNDEFINED)
        sl__jfail_undef(r, line, v);
      int c = sl__jv_compare(r, line, v, a0);
      return cmp[i].op == JOP_LT   ? c < 0
             : cmp[i].op == JOP_LE ? c <= 0
             : cmp[i].op == JOP_GT ? c > 0
                                   : c >= 0;
    }
    }
  }
  sl__jfail(r, SL_ERR_UNSUPPORTED, line, "unsupported test '%s'", t);
}

/* ---- globals
 * --------------------------------------------------------------------- */

int sl__jinja_builtin_global(const char *name) {
  if (!strcmp(name, "range"))
    return JFN_RANGE;
  if (!strcmp(name, "namespace"))
    return JFN_NAMESPACE;
  if (!strcmp(name, "dict"))
    return JFN_DICT;
  if (!strcmp(name, "raise_exception"))
    return JFN_RAISE;
  if (!strcmp(name, "strftime_now"))
    return JFN_STRFTIME;
  return 0;
}

sl_jv *sl__jinja_call_builtin(sl__jrender *r, int line, int fn,
                              const sl__jargs *a) {
  switch (fn) {
  case JFN_RANGE: {
    if (a->nkw || a->npos < 1 || a->npos > 3)
      sl__jfail(r, SL_ERR_FORMAT, line, "range expects 1 to 3 arguments");
    int64_t start = 0, stop, stp = 1;
    if (a->npos == 1) {
      stop = sl__jneed_int(r, line, "range", a->pos[0]);
    } else {
      start = sl__jneed_int(r, line, "range", a->pos[0]);
      stop = sl__jneed_int(r, line, "range", a->pos[1]);
      if (a->npos == 3)
        stp = sl__jneed_int(r, line, "range", a->pos[2]);
    }
    if (stp == 0)
      sl__jfail(r, SL_ERR_FORMAT, line, "range() arg 3 must not be zero");
    double cnt = ((double)stop - (double)start) / (double)stp;
    if (cnt > MAX_RANGE)
      sl__jfail(r, SL_ERR_RANGE, line,
                "range too big, max %d items are allowed", MAX_RANGE);
    sl_jv *l = sl__jv_list(r, 0);
    for (int64_t i = start; stp > 0 ? i < stop : i > stop; i += stp)
      sl__jv_list_push(r, l, sl__jv_int(r, i));
    return l;
  }
  case JFN_NAMESPACE:
  case JFN_DICT: {
    sl_jv *d =
        sl__jv_dict(r, 0, fn == JFN_NAMESPACE ? SL__JV_NAMESPACE : SL_JV_DICT);
    if (a->npos > 1)
      sl__jfail(r, SL_ERR_FORMAT, line,
                "expected at most 1 positional "
                "argument");
    if (a->npos == 1) {
      sl_jv *src = a->pos[0];
      if (sl__jv_is_dict(src)) {
        for (size_t i = 0; i < src->u.d.n; i++)
          sl__jv_dict_put(r, d, src->u.d.k[i], src->u.d.v[i]);
      } else {
        sl_jv *items = sl__jv_iter_list(r, line, src);
        for (size_t i = 0; i < items->u.l.n; i++) {
          sl_jv *p = sl__jv_iter_list(r, line, items->u.l.v[i]);
          if (p->u.l.n != 2)
            sl__jfail(r, SL_ERR_FORMAT, line,
                      "dictionary update sequence "
                      "element has wrong length");
          sl__jv_dict_put(r, d, p->u.l.v[0], p->u.l.v[1]);
        }
      }
    }
    for (size_t i = 0; i < a->nkw; i++)
      sl__jv_dict_put(r, d, sl__jv_str(r, a->kwn[i], strlen(a->kwn[i])),
                      a->kwv[i]);
    return d;
  }
  case JFN_RAISE: {
    sl__jbuf b = {0};
    if (a->npos)
      sl__jv_write_str(r, &b, a->pos[0]);
    /* the message is the template's own words: no line prefix */
    sl__jfail(r, SL_ERR_FORMAT, 0, "%s", b.p ? b.p : "");
  }
  case JFN_STRFTIME: {
    if (a->npos != 1)
      sl__jfail(r, SL_ERR_FORMAT, line, "strftime_now expects 1 argument");
    const sl_jv *fmt = sl__jneed_str(r, line, "strftime_now", a->pos[0]);
    time_t now = time(NULL);
    struct tm tmv;
    localtime_r(&now, &tmv);
    char buf[512];
    size_t n = fmt->u.s.n ? strftime(buf, sizeof buf, fmt->u.s.p, &tmv) : 0;
    sl__jbuf o = {0};
    sl__jbuf_put(r, &o, buf, n);
    if (sl__jv_untrusted(fmt))
      sl__jbuf_mark(r, &o, 0);
    return sl__jv_str_buf(r, &o);
  }
  default:
    break;
  }
  sl__jfail(r, SL_ERR_UNSUPPORTED, line, "unsupported function");
}
