/* sluice — jinja: Jinja filters, and the generic views (len, iteration,
 * attribute and item access) and methods of values, each matching jinja2
 * (3.x) and Python semantics. String methods live in jinja_str.c, tests and
 * global functions in jinja_globals.c, the argument helpers in jinja_args.c.
 */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"
#include "sluice/util.h"

static sl_jv *loop_attr(sl__jrender *r, const sl_jv *lp, const char *name) {
  size_t i = lp->u.loop.i, n = lp->u.loop.n;
  const sl_jv *items = lp->u.loop.items;
  if (!strcmp(name, "index"))
    return sl__jv_int(r, (int64_t)i + 1);
  if (!strcmp(name, "index0"))
    return sl__jv_int(r, (int64_t)i);
  if (!strcmp(name, "revindex"))
    return sl__jv_int(r, (int64_t)(n - i));
  if (!strcmp(name, "revindex0"))
    return sl__jv_int(r, (int64_t)(n - i - 1));
  if (!strcmp(name, "first"))
    return sl__jv_bool(r, i == 0);
  if (!strcmp(name, "last"))
    return sl__jv_bool(r, i + 1 == n);
  if (!strcmp(name, "length"))
    return sl__jv_int(r, (int64_t)n);
  if (!strcmp(name, "depth"))
    return sl__jv_int(r, 1);
  if (!strcmp(name, "depth0"))
    return sl__jv_int(r, 0);
  if (!strcmp(name, "previtem") && i > 0)
    return items->u.l.v[i - 1];
  if (!strcmp(name, "nextitem") && i + 1 < n)
    return items->u.l.v[i + 1];
  return sl__jv_undef(r, name);
}

sl_jv *sl__jv_getattr(sl__jrender *r, int line, sl_jv *obj, const char *name) {
  if (obj->kind == SL_JV_UNDEFINED)
    sl__jfail_undef(r, line, obj);
  if (obj->kind == SL__JV_LOOP)
    return loop_attr(r, obj, name);
  if (sl__jv_is_dict(obj)) {
    sl_jv *v = sl__jv_dict_find_str(obj, name, strlen(name));
    if (v)
      return v;
  }
  return sl__jv_undef(r, name);
}

sl_jv *sl__jv_getitem(sl__jrender *r, int line, sl_jv *obj, sl_jv *key) {
  if (obj->kind == SL_JV_UNDEFINED)
    sl__jfail_undef(r, line, obj);
  if (obj->kind == SL__JV_LOOP && key->kind == SL_JV_STRING)
    return loop_attr(r, obj, key->u.s.p);
  if (sl__jv_is_dict(obj)) {
    sl_jv *v = sl__jv_dict_find(obj, key);
    if (v)
      return v;
  } else if ((obj->kind == SL_JV_LIST || obj->kind == SL_JV_STRING) &&
             (key->kind == SL_JV_INT || key->kind == SL_JV_BOOL)) {
    int64_t i = key->kind == SL_JV_INT ? key->u.i : key->u.b;
    if (obj->kind == SL_JV_LIST) {
      int64_t n = (int64_t)obj->u.l.n;
      if (i < 0)
        i += n;
      if (i >= 0 && i < n)
        return obj->u.l.v[i];
    } else {
      size_t n;
      size_t *off = sl__utf8_offsets(r, obj->u.s.p, obj->u.s.n, &n);
      if (i < 0)
        i += (int64_t)n;
      if (i >= 0 && i < (int64_t)n)
        return sl__jv_substr(r, obj, off[i], off[i + 1] - off[i]);
    }
  }
  if (key->kind == SL_JV_STRING)
    return sl__jv_undef(r, key->u.s.p);
  return sl__jv_undef(r, NULL);
}

static sl_jv *pairs(sl__jrender *r, const sl_jv *d) {
  sl_jv *l = sl__jv_list(r, d->u.d.n);
  for (size_t i = 0; i < d->u.d.n; i++) {
    sl_jv *p = sl__jv_list(r, 2);
    sl__jv_list_push(r, p, d->u.d.k[i]);
    sl__jv_list_push(r, p, d->u.d.v[i]);
    p->is_tuple = true;
    sl__jv_list_push(r, l, p);
  }
  return l;
}

sl_jv *sl__jinja_method(sl__jrender *r, int line, sl_jv *obj, const char *name,
                        const sl__jargs *args) {
  if (obj->kind == SL_JV_STRING)
    return sl__jstr_method(r, line, obj, name, args);
  if (obj->kind == SL_JV_DICT) {
    /* a key of that name shadows nothing: Python finds the method first */
    if (!strcmp(name, "items"))
      return pairs(r, obj);
    if (!strcmp(name, "keys"))
      return sl__jv_iter_list(r, line, obj);
    if (!strcmp(name, "values")) {
      sl_jv *l = sl__jv_list(r, obj->u.d.n);
      for (size_t i = 0; i < obj->u.d.n; i++)
        sl__jv_list_push(r, l, obj->u.d.v[i]);
      return l;
    }
    if (!strcmp(name, "get")) {
      sl_jv *k = sl__jarg(args, 0, NULL), *d = sl__jarg(args, 1, NULL);
      if (!k)
        sl__jfail(r, SL_ERR_FORMAT, line, "get expected at least 1 argument");
      sl_jv *v = sl__jv_dict_find(obj, k);
      return v ? v : d ? d : sl__jv_none(r);
    }
    if (!strcmp(name, "copy"))
      return obj;
    if (!strcmp(name, "update") || !strcmp(name, "pop") ||
        !strcmp(name, "setdefault") || !strcmp(name, "clear"))
      sl__jfail(r, SL_ERR_FORMAT, line,
                "access to attribute '%s' of 'dict' object is unsafe", name);
    return NULL;
  }
  if (obj->kind == SL__JV_LOOP && !strcmp(name, "cycle")) {
    if (args->npos == 0)
      sl__jfail(r, SL_ERR_FORMAT, line, "no items for cycling given");
    return args->pos[obj->u.loop.i % args->npos];
  }
  if (obj->kind == SL_JV_LIST) {
    if (!strcmp(name, "append") || !strcmp(name, "pop") ||
        !strcmp(name, "extend") || !strcmp(name, "insert") ||
        !strcmp(name, "remove") || !strcmp(name, "sort") ||
        !strcmp(name, "reverse") || !strcmp(name, "clear"))
      sl__jfail(r, SL_ERR_FORMAT, line,
                "access to attribute '%s' of 'list' object is unsafe", name);
    if (!strcmp(name, "index") || !strcmp(name, "count")) {
      sl_jv *x = sl__jarg(args, 0, NULL);
      if (!x)
        sl__jfail(r, SL_ERR_FORMAT, line, "%s() takes exactly one argument",
                  name);
      int64_t c = 0;
      for (size_t i = 0; i < obj->u.l.n; i++)
        if (sl__jv_equal(obj->u.l.v[i], x)) {
          if (name[0] == 'i')
            return sl__jv_int(r, (int64_t)i);
          c++;
        }
      if (name[0] == 'i')
        sl__jfail(r, SL_ERR_FORMAT, line, "value is not in list");
      return sl__jv_int(r, c);
    }
  }
  return NULL;
}

/* ---- sorting
 * ---------------------------------------------------------------------- */

typedef struct sortkey {
  sl_jv *key, *item;
} sortkey;

static void merge_sort(sl__jrender *r, int line, sortkey *v, sortkey *tmp,
                       size_t n, bool reverse) {
  if (n < 2)
    return;
  size_t h = n / 2;
  merge_sort(r, line, v, tmp, h, reverse);
  merge_sort(r, line, v + h, tmp, n - h, reverse);
  size_t i = 0, j = h, k = 0;
  while (i < h && j < n) {
    int c = sl__jv_compare(r, line, v[j].key, v[i].key);
    /* stable: take the right one only when strictly first */
    if (reverse ? c > 0 : c < 0)
      tmp[k++] = v[j++];
    else
      tmp[k++] = v[i++];
  }
  while (i < h)
    tmp[k++] = v[i++];
  while (j < n)
    tmp[k++] = v[j++];
  memcpy(v, tmp, n * sizeof *v);
}

/* jinja's make_attrgetter: dotted path, digit parts are int indexes. */
static sl_jv *attr_path(sl__jrender *r, int line, sl_jv *item,
                        const sl_jv *attr) {
  if (attr->kind == SL_JV_INT)
    return sl__jv_getitem(r, line, item, (sl_jv *)attr);
  sl__jneed_str(r, line, "attribute", attr);
  const char *p = attr->u.s.p;
  size_t n = attr->u.s.n, b = 0;
  while (b <= n) {
    size_t e = b;
    while (e < n && p[e] != '.')
      e++;
    bool digits = e > b;
    for (size_t i = b; i < e; i++)
      digits = digits && p[i] >= '0' && p[i] <= '9';
    sl_jv *key = digits ? sl__jv_int(r, strtoll(p + b, NULL, 10))
                        : sl__jv_str(r, p + b, e - b);
    item = sl__jv_getitem(r, line, item, key);
    b = e + 1;
  }
  return item;
}

static sl_jv *fold_case(sl__jrender *r, sl_jv *v, bool case_sensitive) {
  return !case_sensitive && v->kind == SL_JV_STRING ? sl__jstr_lower(r, v) : v;
}

static sl_jv *sort_list(sl__jrender *r, int line, sl_jv *items, bool reverse,
                        bool case_sensitive, const sl_jv *attribute) {
  size_t n = items->u.l.n;
  sortkey *v = sl__jalloc(r, (n + 1) * sizeof *v);
  sortkey *tmp = sl__jalloc(r, (n + 1) * sizeof *tmp);
  for (size_t i = 0; i < n; i++) {
    sl_jv *it = items->u.l.v[i];
    sl_jv *k = attribute && attribute->kind != SL_JV_NULL
                   ? attr_path(r, line, it, attribute)
                   : it;
    v[i].key = fold_case(r, k, case_sensitive);
    v[i].item = it;
  }
  merge_sort(r, line, v, tmp, n, reverse);
  sl_jv *l = sl__jv_list(r, n);
  for (size_t i = 0; i < n; i++)
    sl__jv_list_push(r, l, v[i].item);
  return l;
}

/* ---- filters
 * ---------------------------------------------------------------------- */

static sl_jv *join(sl__jrender *r, int line, sl_jv *seq, const sl_jv *sep,
                   const sl_jv *attribute) {
  sl_jv *items = sl__jv_iter_list(r, line, seq);
  sl__jbuf b = {0};
  for (size_t i = 0; i < items->u.l.n; i++) {
    if (i && sep)
      sl__jv_write_str(r, &b, sep);
    sl_jv *it = items->u.l.v[i];
    if (attribute && attribute->kind != SL_JV_NULL)
      it = attr_path(r, line, it, attribute);
    sl__jv_write_str(r, &b, it);
  }
  return sl__jv_str_buf(r, &b);
}

static sl_jv *html_escape(sl__jrender *r, const sl_jv *s) {
  sl__jbuf b = {0};
  size_t run = 0;
  for (size_t i = 0; i < s->u.s.n; i++) {
    const char *e = NULL;
    switch (s->u.s.p[i]) {
    case '&':
      e = "&amp;";
      break;
    case '<':
      e = "&lt;";
      break;
    case '>':
      e = "&gt;";
      break;
    case '"':
      e = "&#34;";
      break;
    case '\'':
      e = "&#39;";
      break;
    default:
      continue;
    }
    sl__jbuf_put_sv(r, &b, s, run, i - run);
    size_t at = b.n;
    sl__jbuf_puts(r, &b, e);
    if (sl__jv_untrusted_at(s, i, 1))
      sl__jbuf_mark(r, &b, at);
    run = i + 1;
  }
  sl__jbuf_put_sv(r, &b, s, run, s->u.s.n - run);
  return sl__jv_str_buf(r, &b);
}

static bool parse_int_str(const char *p, size_t n, int64_t *out) {
  size_t b = 0, e = n;
  while (b < e && sl__jis_space((unsigned char)p[b]))
    b++;
  while (e > b && sl__jis_space((unsigned char)p[e - 1]))
    e--;
  bool neg = false;
  if (b < e && (p[b] == '+' || p[b] == '-'))
    neg = p[b++] == '-';
  if (b == e)
    return false;
  int64_t v = 0;
  bool prev_us = true;
  for (size_t i = b; i < e; i++) {
    if (p[i] == '_' && !prev_us) {
      prev_us = true;
      continue;
    }
    if (p[i] < '0' || p[i] > '9' || v > (INT64_MAX - 9) / 10)
      return false;
    v = v * 10 + (p[i] - '0');
    prev_us = false;
  }
  if (prev_us)
    return false;
  *out = neg ? -v : v;
  return true;
}

static bool parse_float_str(const char *p, size_t n, double *out) {
  char buf[128];
  size_t b = 0, e = n;
  while (b < e && sl__jis_space((unsigned char)p[b]))
    b++;
  while (e > b && sl__jis_space((unsigned char)p[e - 1]))
    e--;
  if (e == b || e - b >= sizeof buf)
    return false;
  memcpy(buf, p + b, e - b);
  buf[e - b] = 0;
  for (size_t i = 0; buf[i]; i++) /* no hex floats / C-only spellings */
    if (buf[i] == 'x' || buf[i] == 'X' || buf[i] == 'p' || buf[i] == 'P')
      return false;
  char *end;
  double v = strtod(buf, &end);
  if (*end)
    return false;
  *out = v;
  return true;
}

static sl_jv *to_list_of_pairs_sorted(sl__jrender *r, int line, sl_jv *d,
                                      const sl__jargs *a) {
  if (!sl__jv_is_dict(d))
    sl__jfail(r, SL_ERR_FORMAT, line, "dictsort requires a dict");
  bool cs = sl__jopt_bool(sl__jarg(a, 0, "case_sensitive"), false);
  sl_jv *by = sl__jarg(a, 1, "by");
  bool rev = sl__jopt_bool(sl__jarg(a, 2, "reverse"), false);
  sl_jv *l = pairs(r, d);
  sl_jv *idx = sl__jv_int(
      r, by && by->kind == SL_JV_STRING && !strcmp(by->u.s.p, "value") ? 1 : 0);
  return sort_list(r, line, l, rev, cs, idx);
}

static bool select_one(sl__jrender *r, int line, sl_jv *item,
                       const sl__jargs *a, size_t first, bool by_attr) {
  sl_jv *v = item;
  size_t k = first;
  if (by_attr) {
    if (a->npos <= k)
      sl__jfail(r, SL_ERR_FORMAT, line, "missing attribute argument");
    v = attr_path(r, line, item, a->pos[k]);
    k++;
  }
  if (a->npos <= k)
    return sl__jv_truthy(v);
  const sl_jv *test = sl__jneed_str(r, line, "test name", a->pos[k]);
  sl__jargs rest = {.pos = a->pos + k + 1, .npos = a->npos - k - 1};
  return sl__jinja_test(r, line, test->u.s.p, v, &rest);
}

static sl_jv *filter_select(sl__jrender *r, int line, sl_jv *seq,
                            const sl__jargs *a, bool by_attr, bool keep) {
  sl_jv *items = sl__jv_iter_list(r, line, seq);
  sl_jv *l = sl__jv_list(r, 0);
  for (size_t i = 0; i < items->u.l.n; i++)
    if (select_one(r, line, items->u.l.v[i], a, 0, by_attr) == keep)
      sl__jv_list_push(r, l, items->u.l.v[i]);
  return l;
}

static sl_jv *min_max(sl__jrender *r, int line, sl_jv *seq, const sl__jargs *a,
                      bool want_max) {
  sl_jv *items = sl__jv_iter_list(r, line, seq);
  bool cs = sl__jopt_bool(sl__jarg(a, 0, "case_sensitive"), false);
  sl_jv *attr = sl__jarg(a, 1, "attribute");
  sl_jv *best = NULL, *bestk = NULL;
  for (size_t i = 0; i < items->u.l.n; i++) {
    sl_jv *it = items->u.l.v[i];
    sl_jv *k = fold_case(r, attr ? attr_path(r, line, it, attr) : it, cs);
    if (!best || sl__jv_compare(r, line, k, bestk) * (want_max ? 1 : -1) > 0) {
      best = it;
      bestk = k;
    }
  }
  return best ? best : sl__jv_undef(r, NULL);
}

static sl_jv *indent_filter(sl__jrender *r, int line, sl_jv *v,
                            const sl__jargs *a) {
  sl_jv *s = sl__jv_to_str(r, v);
  sl_jv *w = sl__jarg(a, 0, "width");
  bool first = sl__jopt_bool(sl__jarg(a, 1, "first"), false);
  bool blank = sl__jopt_bool(sl__jarg(a, 2, "blank"), false);
  sl__jbuf ind = {0};
  if (w && w->kind == SL_JV_STRING)
    sl__jbuf_put_sv(r, &ind, w, 0, w->u.s.n);
  else
    for (int64_t i = 0, n = w ? sl__jneed_int(r, line, "indent", w) : 4;
         i < n && i < 4096; i++)
      sl__jbuf_puts(r, &ind, " ");
  /* s += "\n"; lines = s.splitlines() */
  sl_jv *lines = sl__jv_list(r, 0);
  const char *p = s->u.s.p;
  size_t n = s->u.s.n, b = 0;
  for (size_t i = 0; i <= n; i++) {
    if (i == n || p[i] == '\n' || p[i] == '\r') {
      sl__jv_list_push(r, lines, sl__jv_substr(r, s, b, i - b));
      if (i < n && p[i] == '\r' && i + 1 < n && p[i + 1] == '\n')
        i++;
      b = i + 1;
    }
  }
  sl__jbuf o = {0};
  const sl_jv *indv = sl__jv_str_buf(r, &ind);
  if (first)
    sl__jbuf_put_sv(r, &o, indv, 0, indv->u.s.n);
  for (size_t i = 0; i < lines->u.l.n; i++) {
    const sl_jv *ln = lines->u.l.v[i];
    if (i) {
      sl__jbuf_puts(r, &o, "\n");
      if (blank || ln->u.s.n)
        sl__jbuf_put_sv(r, &o, indv, 0, indv->u.s.n);
    }
    sl__jbuf_put_sv(r, &o, ln, 0, ln->u.s.n);
  }
  return sl__jv_str_buf(r, &o);
}

static sl_jv *tojson(sl__jrender *r, int line, sl_jv *v, const sl__jargs *a) {
  static const char *const kw[] = {"ensure_ascii", "indent", "separators",
                                   "sort_keys", NULL};
  sl__jcheck_args(r, line, "tojson", a, 4, kw);
  /* HF's signature: tojson(x, ensure_ascii=False, indent=None,
   * separators=None, sort_keys=False); jinja's own takes indent first, and
   * templates only ever pass indent by keyword. */
  sl_jv *ea = sl__jarg(a, 0, "ensure_ascii"), *ind = sl__jarg(a, 1, "indent");
  sl_jv *seps = sl__jarg(a, 2, "separators"), *sk = sl__jarg(a, 3, "sort_keys");
  const char *indent = NULL;
  if (ind && ind->kind != SL_JV_NULL) {
    if (ind->kind == SL_JV_STRING) {
      indent = ind->u.s.p;
    } else {
      int64_t k = sl__jneed_int(r, line, "tojson indent", ind);
      if (k > 4096)
        sl__jfail(r, SL_ERR_RANGE, line, "tojson indent too large");
      char *sp = sl__jalloc(r, (size_t)(k > 0 ? k : 0) + 1);
      memset(sp, ' ', (size_t)(k > 0 ? k : 0));
      sp[k > 0 ? k : 0] = 0;
      indent = sp;
    }
  }
  const char *isep = NULL, *ksep = NULL;
  if (seps && seps->kind != SL_JV_NULL) {
    if (seps->kind != SL_JV_LIST || seps->u.l.n != 2)
      sl__jfail(r, SL_ERR_FORMAT, line, "tojson separators must be a pair");
    isep = sl__jneed_str(r, line, "separators", seps->u.l.v[0])->u.s.p;
    ksep = sl__jneed_str(r, line, "separators", seps->u.l.v[1])->u.s.p;
  }
  sl__jbuf b = {0};
  sl__jv_write_json(r, line, &b, v, sl__jopt_bool(ea, false), indent, isep,
                    ksep, sl__jopt_bool(sk, false), 0);
  /* indent and separators from untrusted values spread all through */
  bool spread = ind && sl__jv_untrusted(ind);
  if (seps && seps->kind == SL_JV_LIST)
    spread = spread || sl__jv_untrusted(seps->u.l.v[0]) ||
             sl__jv_untrusted(seps->u.l.v[1]);
  if (spread)
    sl__jbuf_mark(r, &b, 0);
  return sl__jv_str_buf(r, &b);
}

static sl_jv *round_filter(sl__jrender *r, int line, sl_jv *v,
                           const sl__jargs *a) {
  sl_jv *pv = sl__jarg(a, 0, "precision"), *mv = sl__jarg(a, 1, "method");
  int64_t prec = pv ? sl__jneed_int(r, line, "round", pv) : 0;
  const char *method =
      mv ? sl__jneed_str(r, line, "round", mv)->u.s.p : "common";
  if (!sl__jv_is_num(v)) {
    if (v->kind == SL_JV_UNDEFINED)
      sl__jfail_undef(r, line, v);
    sl__jfail(r, SL_ERR_FORMAT, line, "round expects a number, not '%s'",
              sl__jv_kind_name(v));
  }
  if (prec < -300 || prec > 300)
    sl__jfail(r, SL_ERR_RANGE, line, "round precision out of range");
  double x = v->kind == SL_JV_FLOAT ? v->u.f
             : v->kind == SL_JV_INT ? (double)v->u.i
                                    : (double)v->u.b;
  if (!strcmp(method, "common")) {
    if (v->kind != SL_JV_FLOAT && prec >= 0)
      return v->kind == SL_JV_BOOL ? sl__jv_int(r, v->u.b) : v;
    if (!isfinite(x))
      return sl__jv_float(r, x);
    if (prec == 0)
      return sl__jv_float(r, nearbyint(x));
    if (prec > 0) {
      char buf[512];
      snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
      return sl__jv_float(r, strtod(buf, NULL));
    }
    double p10 = pow(10.0, (double)-prec);
    return sl__jv_float(r, nearbyint(x / p10) * p10);
  }
  double p10 = pow(10.0, (double)prec);
  if (!strcmp(method, "floor"))
    return sl__jv_float(r, floor(x * p10) / p10);
  if (!strcmp(method, "ceil"))
    return sl__jv_float(r, ceil(x * p10) / p10);
  sl__jfail(r, SL_ERR_FORMAT, line,
            "method must be 'common', 'ceil' or 'floor'");
}

sl_jv *sl__jinja_filter(sl__jrender *r, int line, const char *f, sl_jv *v,
                        const sl__jargs *a) {
  sl_jv *a0 = sl__jarg(a, 0, NULL);
  if (!strcmp(f, "default") || !strcmp(f, "d")) {
    sl_jv *dv = sl__jarg(a, 0, "default_value");
    bool boolean = sl__jopt_bool(sl__jarg(a, 1, "boolean"), false);
    bool use = v->kind == SL_JV_UNDEFINED || (boolean && !sl__jv_truthy(v));
    return use ? (dv ? dv : sl__jv_str(r, "", 0)) : v;
  }
  if (!strcmp(f, "tojson"))
    return tojson(r, line, v, a);
  if (!strcmp(f, "string"))
    return sl__jv_to_str(r, v);
  if (!strcmp(f, "safe"))
    return sl__jv_to_str(r, v);
  if (!strcmp(f, "escape") || !strcmp(f, "e") || !strcmp(f, "forceescape"))
    return html_escape(r, sl__jv_to_str(r, v));
  if (!strcmp(f, "length") || !strcmp(f, "count"))
    return sl__jv_int(r, sl__jv_length(r, line, v));
  if (!strcmp(f, "trim")) {
    sl_jv *chars = sl__jarg(a, 0, "chars");
    return sl__jstr_strip(r, sl__jv_to_str(r, v),
                          chars && chars->kind != SL_JV_NULL
                              ? sl__jneed_str(r, line, "trim", chars)
                              : NULL,
                          3);
  }
  if (!strcmp(f, "upper"))
    return sl__jstr_upper(r, sl__jv_to_str(r, v));
  if (!strcmp(f, "lower"))
    return sl__jstr_lower(r, sl__jv_to_str(r, v));
  if (!strcmp(f, "capitalize"))
    return sl__jstr_capitalize(r, sl__jv_to_str(r, v));
  if (!strcmp(f, "title"))
    return sl__jstr_title(r, sl__jv_to_str(r, v), true);
  if (!strcmp(f, "replace")) {
    sl_jv *old = sl__jarg(a, 0, "old"), *neu = sl__jarg(a, 1, "new");
    sl_jv *cnt = sl__jarg(a, 2, "count");
    if (!old || !neu)
      sl__jfail(r, SL_ERR_FORMAT, line, "replace needs 'old' and 'new'");
    return sl__jstr_replace(r, line, sl__jv_to_str(r, v), sl__jv_to_str(r, old),
                            sl__jv_to_str(r, neu),
                            cnt && cnt->kind != SL_JV_NULL
                                ? sl__jneed_int(r, line, "replace", cnt)
                                : -1);
  }
  if (!strcmp(f, "first") || !strcmp(f, "last")) {
    sl_jv *items = sl__jv_iter_list(r, line, v);
    if (items->u.l.n == 0)
      return sl__jv_undef(r, NULL);
    return items->u.l.v[f[0] == 'f' ? 0 : items->u.l.n - 1];
  }
  if (!strcmp(f, "join"))
    return join(r, line, v, sl__jarg(a, 0, "d"), sl__jarg(a, 1, "attribute"));
  if (!strcmp(f, "list")) {
    sl_jv *items = sl__jv_iter_list(r, line, v);
    if (items->is_tuple) {
      sl_jv *l = sl__jv_list(r, items->u.l.n);
      for (size_t i = 0; i < items->u.l.n; i++)
        sl__jv_list_push(r, l, items->u.l.v[i]);
      return l;
    }
    return items;
  }
  if (!strcmp(f, "items")) {
    if (v->kind == SL_JV_UNDEFINED)
      return sl__jv_list(r, 0);
    if (!sl__jv_is_dict(v))
      sl__jfail(r, SL_ERR_FORMAT, line,
                "can only get item pairs from a "
                "mapping");
    return pairs(r, v);
  }
  if (!strcmp(f, "int")) {
    sl_jv *dflt = sl__jarg(a, 0, "default");
    sl_jv *base = sl__jarg(a, 1, "base");
    if (base && !(base->kind == SL_JV_INT && base->u.i == 10))
      sl__jfail(r, SL_ERR_UNSUPPORTED, line,
                "unsupported construct: int filter with a base");
    int64_t i;
    double d;
    if (v->kind == SL_JV_INT)
      return v;
    if (v->kind == SL_JV_BOOL)
      return sl__jv_int(r, v->u.b);
    if (v->kind == SL_JV_FLOAT && isfinite(v->u.f) && fabs(v->u.f) < 9.2e18)
      return sl__jv_int(r, (int64_t)v->u.f);
    if (v->kind == SL_JV_STRING) {
      if (parse_int_str(v->u.s.p, v->u.s.n, &i))
        return sl__jv_int(r, i);
      if (parse_float_str(v->u.s.p, v->u.s.n, &d) && isfinite(d) &&
          fabs(d) < 9.2e18)
        return sl__jv_int(r, (int64_t)d);
    }
    return dflt ? dflt : sl__jv_int(r, 0);
  }
  if (!strcmp(f, "float")) {
    sl_jv *dflt = sl__jarg(a, 0, "default");
    double d;
    if (v->kind == SL_JV_FLOAT)
      return v;
    if (v->kind == SL_JV_INT || v->kind == SL_JV_BOOL)
      return sl__jv_float(r, v->kind == SL_JV_INT ? (double)v->u.i : v->u.b);
    if (v->kind == SL_JV_STRING && parse_float_str(v->u.s.p, v->u.s.n, &d))
      return sl__jv_float(r, d);
    return dflt ? dflt : sl__jv_float(r, 0.0);
  }
  if (!strcmp(f, "abs")) {
    if (v->kind == SL_JV_INT) {
      if (v->u.i == INT64_MIN)
        sl__jfail(r, SL_ERR_RANGE, line, "integer overflow");
      return sl__jv_int(r, v->u.i < 0 ? -v->u.i : v->u.i);
    }
    if (v->kind == SL_JV_BOOL)
      return sl__jv_int(r, v->u.b);
    if (v->kind == SL_JV_FLOAT)
      return sl__jv_float(r, fabs(v->u.f));
    if (v->kind == SL_JV_UNDEFINED)
      sl__jfail_undef(r, line, v);
    sl__jfail(r, SL_ERR_FORMAT, line, "bad operand type for abs(): '%s'",
              sl__jv_kind_name(v));
  }
  if (!strcmp(f, "round"))
    return round_filter(r, line, v, a);
  if (!strcmp(f, "reverse")) {
    if (v->kind == SL_JV_STRING) {
      size_t n;
      size_t *off = sl__utf8_offsets(r, v->u.s.p, v->u.s.n, &n);
      sl__jbuf b = {0};
      for (size_t i = n; i-- > 0;)
        sl__jbuf_put_sv(r, &b, v, off[i], off[i + 1] - off[i]);
      return sl__jv_str_buf(r, &b);
    }
    sl_jv *items = sl__jv_iter_list(r, line, v);
    sl_jv *l = sl__jv_list(r, items->u.l.n);
    for (size_t i = items->u.l.n; i-- > 0;)
      sl__jv_list_push(r, l, items->u.l.v[i]);
    return l;
  }
  if (!strcmp(f, "sort")) {
    static const char *const kw[] = {"reverse", "case_sensitive", "attribute",
                                     NULL};
    sl__jcheck_args(r, line, "sort", a, 3, kw);
    return sort_list(r, line, sl__jv_iter_list(r, line, v),
                     sl__jopt_bool(sl__jarg(a, 0, "reverse"), false),
                     sl__jopt_bool(sl__jarg(a, 1, "case_sensitive"), false),
                     sl__jarg(a, 2, "attribute"));
  }
  if (!strcmp(f, "dictsort"))
    return to_list_of_pairs_sorted(r, line, v, a);
  if (!strcmp(f, "unique")) {
    bool cs = sl__jopt_bool(sl__jarg(a, 0, "case_sensitive"), false);
    sl_jv *attr = sl__jarg(a, 1, "attribute");
    sl_jv *items = sl__jv_iter_list(r, line, v);
    sl_jv *l = sl__jv_list(r, 0), *seen = sl__jv_list(r, 0);
    for (size_t i = 0; i < items->u.l.n; i++) {
      sl_jv *it = items->u.l.v[i];
      sl_jv *k = fold_case(r, attr ? attr_path(r, line, it, attr) : it, cs);
      bool dup = false;
      for (size_t j = 0; j < seen->u.l.n && !dup; j++)
        dup = sl__jv_equal(seen->u.l.v[j], k);
      if (!dup) {
        sl__jv_list_push(r, seen, k);
        sl__jv_list_push(r, l, it);
      }
    }
    return l;
  }
  if (!strcmp(f, "map")) {
    sl_jv *items = sl__jv_iter_list(r, line, v);
    sl_jv *l = sl__jv_list(r, items->u.l.n);
    sl_jv *attr = NULL, *dflt = NULL;
    for (size_t i = 0; i < a->nkw; i++) {
      if (!strcmp(a->kwn[i], "attribute"))
        attr = a->kwv[i];
      else if (!strcmp(a->kwn[i], "default"))
        dflt = a->kwv[i];
    }
    if (attr) {
      for (size_t i = 0; i < items->u.l.n; i++) {
        sl_jv *x = attr_path(r, line, items->u.l.v[i], attr);
        sl__jv_list_push(r, l, x->kind == SL_JV_UNDEFINED && dflt ? dflt : x);
      }
      return l;
    }
    if (!a0)
      sl__jfail(r, SL_ERR_FORMAT, line, "map requires a filter argument");
    const sl_jv *fname = sl__jneed_str(r, line, "map", a0);
    sl__jargs rest = {.pos = a->pos + 1,
                      .npos = a->npos - 1,
                      .kwn = a->kwn,
                      .kwv = a->kwv,
                      .nkw = a->nkw};
    for (size_t i = 0; i < items->u.l.n; i++)
      sl__jv_list_push(
          r, l,
          sl__jinja_filter(r, line, fname->u.s.p, items->u.l.v[i], &rest));
    return l;
  }
  if (!strcmp(f, "select") || !strcmp(f, "reject"))
    return filter_select(r, line, v, a, false, f[0] == 's');
  if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr"))
    return filter_select(r, line, v, a, true, f[0] == 's');
  if (!strcmp(f, "min") || !strcmp(f, "max"))
    return min_max(r, line, v, a, f[1] == 'a');
  if (!strcmp(f, "sum")) {
    sl_jv *attr = sl__jarg(a, 0, "attribute"), *start = sl__jarg(a, 1, "start");
    sl_jv *items = sl__jv_iter_list(r, line, v);
    sl_jv *acc = start ? start : sl__jv_int(r, 0);
    for (size_t i = 0; i < items->u.l.n; i++) {
      sl_jv *x =
          attr ? attr_path(r, line, items->u.l.v[i], attr) : items->u.l.v[i];
      if (!sl__jv_is_num(x) || !sl__jv_is_num(acc))
        sl__jfail(r, SL_ERR_FORMAT, line, "sum of non-numbers");
      if (acc->kind == SL_JV_FLOAT || x->kind == SL_JV_FLOAT) {
        double s = (acc->kind == SL_JV_FLOAT ? acc->u.f
                    : acc->kind == SL_JV_INT ? (double)acc->u.i
                                             : acc->u.b) +
                   (x->kind == SL_JV_FLOAT ? x->u.f
                    : x->kind == SL_JV_INT ? (double)x->u.i
                                           : x->u.b);
        acc = sl__jv_float(r, s);
      } else {
        int64_t s;
        if (__builtin_add_overflow(acc->kind == SL_JV_INT ? acc->u.i : acc->u.b,
                                   x->kind == SL_JV_INT ? x->u.i : x->u.b, &s))
          sl__jfail(r, SL_ERR_RANGE, line, "integer overflow");
        acc = sl__jv_int(r, s);
      }
    }
    return acc;
  }
  if (!strcmp(f, "indent"))
    return indent_filter(r, line, v, a);
  if (!strcmp(f, "attr")) {
    if (!a0)
      sl__jfail(r, SL_ERR_FORMAT, line, "attr needs a name");
    return sl__jv_getattr(r, line, v,
                          sl__jneed_str(r, line, "attr", a0)->u.s.p);
  }
  if (!strcmp(f, "wordcount")) {
    sl_jv *s = sl__jv_to_str(r, v);
    int64_t c = 0;
    bool in = false;
    for (size_t i = 0; i < s->u.s.n; i++) {
      char ch = s->u.s.p[i];
      bool w = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
               (ch >= '0' && ch <= '9') || ch == '_' ||
               (unsigned char)ch >= 0x80;
      if (w && !in)
        c++;
      in = w;
    }
    return sl__jv_int(r, c);
  }
  sl__jfail(r, SL_ERR_UNSUPPORTED, line, "unsupported filter '%s'", f);
}
