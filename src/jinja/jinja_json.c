/* sluice — jinja: Jinja's tojson, Python's json.dumps of a value with its
 * options, untrusted marks kept (a string or scalar from an untrusted value
 * is untrusted in the output, quotes and escapes included). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "jinja_impl.h"
#include "sluice/utf8.h"
#include "sluice/util.h"

/* ---- json.dumps
 * ---------------------------------------------------------------- */

static void json_string(sl__jrender *r, sl__jbuf *b, const char *s, size_t n,
                        bool ensure_ascii) {
  sl__jbuf_puts(r, b, "\"");
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char tmp[16];
    const char *esc = NULL;
    size_t skip = 1;
    switch (c) {
    case '"':
      esc = "\\\"";
      break;
    case '\\':
      esc = "\\\\";
      break;
    case '\n':
      esc = "\\n";
      break;
    case '\r':
      esc = "\\r";
      break;
    case '\t':
      esc = "\\t";
      break;
    case '\b':
      esc = "\\b";
      break;
    case '\f':
      esc = "\\f";
      break;
    default:
      if (c < 0x20) {
        snprintf(tmp, sizeof tmp, "\\u%04x", c);
        esc = tmp;
      } else if (c >= 0x80 && ensure_ascii) {
        /* decode one UTF-8 sequence; invalid bytes pass through as U+FFFD */
        size_t len;
        uint32_t cp = sl_utf8_next(s, n, i, &len);
        if (len > 1)
          skip = len;
        else
          cp = 0xFFFD;
        if (cp >= 0x10000) {
          cp -= 0x10000;
          snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                   0xDC00 + (cp & 0x3FF));
        } else {
          snprintf(tmp, sizeof tmp, "\\u%04x", cp);
        }
        esc = tmp;
      }
    }
    if (esc) {
      sl__jbuf_put(r, b, s + run, i - run);
      sl__jbuf_puts(r, b, esc);
      i += skip - 1;
      run = i + 1;
    }
  }
  sl__jbuf_put(r, b, s + run, n - run);
  sl__jbuf_puts(r, b, "\"");
}

static void json_newline(sl__jrender *r, sl__jbuf *b, const char *indent,
                         int level) {
  sl__jbuf_puts(r, b, "\n");
  for (int i = 0; i < level; i++)
    sl__jbuf_puts(r, b, indent);
}

void sl__jv_write_json(sl__jrender *r, int line, sl__jbuf *b, const sl_jv *v,
                       bool ensure_ascii, const char *indent,
                       const char *item_sep, const char *key_sep,
                       bool sort_keys, int depth) {
  if (depth > 200)
    sl__jfail(r, SL_ERR_RANGE, line, "tojson: value nested too deeply");
  if (!item_sep)
    item_sep = indent ? "," : ", ";
  if (!key_sep)
    key_sep = ": ";
  char tmp[64];
  size_t at = b->n; /* a scalar's text is marked as the scalar is */
  switch (v->kind) {
  case SL_JV_NULL:
    sl__jbuf_puts(r, b, "null");
    break;
  case SL_JV_BOOL:
    sl__jbuf_puts(r, b, v->u.b ? "true" : "false");
    break;
  case SL_JV_INT:
    sl__jv_write_scalar(r, b, v);
    break;
  case SL_JV_FLOAT:
    if (isnan(v->u.f))
      sl__jbuf_puts(r, b, "NaN");
    else if (isinf(v->u.f))
      sl__jbuf_puts(r, b, v->u.f < 0 ? "-Infinity" : "Infinity");
    else {
      sl__jfloat_repr(v->u.f, tmp, sizeof tmp);
      sl__jbuf_puts(r, b, tmp);
    }
    break;
  case SL_JV_STRING:
    json_string(r, b, v->u.s.p, v->u.s.n, ensure_ascii);
    break;
  case SL_JV_LIST:
    if (v->u.l.n == 0) {
      sl__jbuf_puts(r, b, "[]");
      return;
    }
    sl__jbuf_puts(r, b, "[");
    for (size_t i = 0; i < v->u.l.n; i++) {
      if (i)
        sl__jbuf_puts(r, b, item_sep);
      if (indent)
        json_newline(r, b, indent, depth + 1);
      sl__jv_write_json(r, line, b, v->u.l.v[i], ensure_ascii, indent, item_sep,
                        key_sep, sort_keys, depth + 1);
    }
    if (indent)
      json_newline(r, b, indent, depth);
    sl__jbuf_puts(r, b, "]");
    return;
  case SL_JV_DICT: {
    if (v->u.d.n == 0) {
      sl__jbuf_puts(r, b, "{}");
      return;
    }
    size_t n = v->u.d.n;
    size_t *order = sl__jalloc(r, n * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
      const sl_jv *k = v->u.d.k[i];
      if (k->kind != SL_JV_STRING && k->kind != SL_JV_INT &&
          k->kind != SL_JV_BOOL && k->kind != SL_JV_NULL &&
          k->kind != SL_JV_FLOAT)
        sl__jfail(r, SL_ERR_FORMAT, line,
                  "tojson: keys must be str, int, float, bool or None");
      order[i] = i;
    }
    if (sort_keys) /* insertion sort keeps this simple; dicts are small */
      for (size_t i = 1; i < n; i++)
        for (size_t j = i;
             j > 0 && sl__jv_compare(r, line, v->u.d.k[order[j - 1]],
                                     v->u.d.k[order[j]]) > 0;
             j--) {
          size_t t = order[j];
          order[j] = order[j - 1];
          order[j - 1] = t;
        }
    sl__jbuf_puts(r, b, "{");
    for (size_t i = 0; i < n; i++) {
      const sl_jv *k = v->u.d.k[order[i]];
      if (i)
        sl__jbuf_puts(r, b, item_sep);
      if (indent)
        json_newline(r, b, indent, depth + 1);
      size_t kat = b->n;
      if (k->kind == SL_JV_STRING) {
        json_string(r, b, k->u.s.p, k->u.s.n, ensure_ascii);
      } else {
        sl__jbuf b2 = {0};
        sl__jv_write_json(r, line, &b2, k, ensure_ascii, NULL, NULL, NULL,
                          false, depth + 1);
        json_string(r, b, b2.p, b2.n, ensure_ascii);
      }
      if (sl__jv_untrusted(k))
        sl__jbuf_mark(r, b, kat);
      sl__jbuf_puts(r, b, key_sep);
      sl__jv_write_json(r, line, b, v->u.d.v[order[i]], ensure_ascii, indent,
                        item_sep, key_sep, sort_keys, depth + 1);
    }
    if (indent)
      json_newline(r, b, indent, depth);
    sl__jbuf_puts(r, b, "}");
    return;
  }
  default:
    sl__jfail(r, SL_ERR_FORMAT, line,
              "tojson: Object of type %s is not JSON serializable",
              sl__jv_kind_name(v));
  }
  if (sl__jv_untrusted(v)) /* escaped: marked whole */
    sl__jbuf_mark(r, b, at);
}
