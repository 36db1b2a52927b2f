/* sluice — jinja: the argument helpers and the checks on values that the
 * filters (jinja_builtins.c), string methods (jinja_str.c) and tests and
 * globals (jinja_globals.c) share. Below all three: it calls only the value
 * layer (jinja_value.c), so that those files do not call each other in a
 * loop.
 */
#include <string.h>

#include "jinja_impl.h"
#include "sluice/util.h"

_Noreturn void sl__jfail_undef(sl__jrender *r, int line, const sl_jv *v) {
  if (v->u.undef_name)
    sl__jfail(r, SL_ERR_FORMAT, line, "'%s' is undefined", v->u.undef_name);
  sl__jfail(r, SL_ERR_FORMAT, line, "undefined value used");
}

/* ---- argument helpers ---------------------------------------------------- */

/* The argument at position `idx` or named `name`, or NULL. */
sl_jv *sl__jarg(const sl__jargs *a, size_t idx, const char *name) {
  if (idx < a->npos)
    return a->pos[idx];
  for (size_t i = 0; i < a->nkw; i++)
    if (name && !strcmp(a->kwn[i], name))
      return a->kwv[i];
  return NULL;
}

void sl__jcheck_args(sl__jrender *r, int line, const char *what,
                     const sl__jargs *a, size_t maxpos,
                     const char *const *names) {
  if (a->npos > maxpos)
    sl__jfail(r, SL_ERR_FORMAT, line,
              "%s takes at most %zu positional "
              "argument(s)",
              what, maxpos);
  for (size_t i = 0; i < a->nkw; i++) {
    bool ok = false;
    for (size_t k = 0; names && names[k]; k++)
      if (!strcmp(names[k], a->kwn[i]))
        ok = true;
    if (!ok)
      sl__jfail(r, SL_ERR_FORMAT, line,
                "%s got an unexpected keyword "
                "argument '%s'",
                what, a->kwn[i]);
  }
}

const sl_jv *sl__jneed_str(sl__jrender *r, int line, const char *what,
                           const sl_jv *v) {
  if (v->kind != SL_JV_STRING) {
    if (v->kind == SL_JV_UNDEFINED)
      sl__jfail_undef(r, line, v);
    sl__jfail(r, SL_ERR_FORMAT, line, "%s expects a string, not '%s'", what,
              sl__jv_kind_name(v));
  }
  return v;
}

int64_t sl__jneed_int(sl__jrender *r, int line, const char *what,
                      const sl_jv *v) {
  if (v->kind == SL_JV_INT)
    return v->u.i;
  if (v->kind == SL_JV_BOOL)
    return v->u.b;
  sl__jfail(r, SL_ERR_FORMAT, line, "%s expects an integer, not '%s'", what,
            sl__jv_kind_name(v));
}

/* ---- generic views
 * ------------------------------------------------------------ */

int64_t sl__jv_length(sl__jrender *r, int line, const sl_jv *v) {
  switch (v->kind) {
  case SL_JV_STRING:
    return (int64_t)sl_utf8_count(v->u.s.p, v->u.s.n);
  case SL_JV_LIST:
    return (int64_t)v->u.l.n;
  case SL_JV_DICT:
    return (int64_t)v->u.d.n;
  case SL_JV_UNDEFINED:
    return 0;
  default:
    sl__jfail(r, SL_ERR_FORMAT, line, "object of type '%s' has no len()",
              sl__jv_kind_name(v));
  }
}

sl_jv *sl__jv_iter_list(sl__jrender *r, int line, sl_jv *v) {
  switch (v->kind) {
  case SL_JV_LIST:
    return v;
  case SL_JV_DICT: {
    sl_jv *l = sl__jv_list(r, v->u.d.n);
    for (size_t i = 0; i < v->u.d.n; i++)
      sl__jv_list_push(r, l, v->u.d.k[i]);
    return l;
  }
  case SL_JV_STRING: {
    size_t n;
    size_t *off = sl__utf8_offsets(r, v->u.s.p, v->u.s.n, &n);
    sl_jv *l = sl__jv_list(r, n);
    for (size_t i = 0; i < n; i++)
      sl__jv_list_push(r, l, sl__jv_substr(r, v, off[i], off[i + 1] - off[i]));
    return l;
  }
  case SL_JV_UNDEFINED:
    return sl__jv_list(r, 0);
  default:
    sl__jfail(r, SL_ERR_FORMAT, line, "'%s' object is not iterable",
              sl__jv_kind_name(v));
  }
}
