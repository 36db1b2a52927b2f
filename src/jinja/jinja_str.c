/* sluice — jinja: Jinja string operations: Python's str methods
 * (startswith, split, strip, replace, ...) and the case mappings the filters
 * share. Strings are UTF-8 and indexed by code point (sluice/utf8.h). Case
 * mapping is Unicode's simple mapping (utf8proc); Python's full and context
 * rules (final sigma, dotted I, ligatures) are not modelled, except that
 * sharp s upper is "SS".
 */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <string.h>

#include "jinja_impl.h"
#include "sluice/utf8.h"
#include "sluice/util.h"

bool sl__jis_space(uint32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) ||
         c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool in_chars(uint32_t c, const sl_jv *chars) {
  if (!chars)
    return sl__jis_space(c);
  for (size_t i = 0, l; i < chars->u.s.n; i += l)
    if (sl_utf8_next(chars->u.s.p, chars->u.s.n, i, &l) == c)
      return true;
  return false;
}

/* strip(chars): which = 1 left, 2 right, 3 both; chars NULL = whitespace */
sl_jv *sl__jstr_strip(sl__jrender *r, const sl_jv *s, const sl_jv *chars,
                      int which) {
  const char *p = s->u.s.p;
  size_t n = s->u.s.n, b = 0, e = n, l;
  if (which & 1)
    while (b < e && in_chars(sl_utf8_next(p, n, b, &l), chars))
      b += l;
  if (which & 2)
    while (e > b) {
      size_t k = e - 1;
      while (k > b && sl_utf8_is_cont((unsigned char)p[k]))
        k--;
      if (!in_chars(sl_utf8_next(p, n, k, &l), chars))
        break;
      e = k;
    }
  return sl__jv_substr(r, s, b, e - b);
}

/* Case mapping and the cased / upper / lower predicates: Unicode simple case
 * mapping (sluice/utf8.h, utf8proc). 0xDF (sharp s) upper is "SS" and
 * handled by the caller. */
static uint32_t cp_upper(uint32_t c) {
  return sl_utf8_upper(c);
}
static uint32_t cp_lower(uint32_t c) {
  return sl_utf8_lower(c);
}
static bool cp_cased(uint32_t c) {
  return sl_utf8_is_cased(c);
}
static bool cp_is_upper(uint32_t c) {
  return sl_utf8_is_upper(c);
}
static bool cp_is_lower(uint32_t c) {
  return sl_utf8_is_lower(c);
}

static void put_cp(sl__jrender *r, sl__jbuf *b, uint32_t cp) {
  char o[4];
  sl__jbuf_put(r, b, o, sl_utf8_encode(cp, o));
}

/* Appends one code point mapped up (upper) or down; bytes that are not a
 * valid sequence pass through unchanged. */
static void put_mapped(sl__jrender *r, sl__jbuf *b, const char *p, size_t l,
                       uint32_t cp, bool upper) {
  uint32_t m = upper ? cp_upper(cp) : cp_lower(cp);
  if (upper && cp == 0xDF)
    sl__jbuf_puts(r, b, "SS");
  else if (m == cp)
    sl__jbuf_put(r, b, p, l);
  else
    put_cp(r, b, m);
}

/* mode: 0 lower, 1 upper, 2 capitalize, 3 Python title, 4 jinja title */
static sl_jv *case_map(sl__jrender *r, const sl_jv *s, int mode) {
  sl__jbuf b = {0};
  const char *p = s->u.s.p;
  size_t n = s->u.s.n, l;
  bool prev_cased = false, word_start = true;
  for (size_t i = 0; i < n; i += l) {
    uint32_t cp = sl_utf8_next(p, n, i, &l);
    size_t at = b.n;
    bool upper;
    switch (mode) {
    case 0:
      upper = false;
      break;
    case 1:
      upper = true;
      break;
    case 2:
      upper = i == 0;
      break;
    case 3:
      upper = !prev_cased;
      prev_cased = cp_cased(cp);
      break;
    default: {
      bool sep = sl__jis_space(cp) || cp == '-' || cp == '(' || cp == '{' ||
                 cp == '[' || cp == '<';
      upper = word_start;
      word_start = sep;
      if (sep) {
        sl__jbuf_put_sv(r, &b, s, i, l);
        continue;
      }
    }
    }
    put_mapped(r, &b, p + i, l, cp, upper);
    if (sl__jv_untrusted_at(s, i, l)) /* a mapped code point keeps its mark */
      sl__jbuf_mark(r, &b, at);
  }
  return sl__jv_str_buf(r, &b);
}

sl_jv *sl__jstr_upper(sl__jrender *r, const sl_jv *s) {
  return case_map(r, s, 1);
}
sl_jv *sl__jstr_lower(sl__jrender *r, const sl_jv *s) {
  return case_map(r, s, 0);
}
sl_jv *sl__jstr_capitalize(sl__jrender *r, const sl_jv *s) {
  return case_map(r, s, 2);
}
sl_jv *sl__jstr_title(sl__jrender *r, const sl_jv *s, bool jinja_style) {
  return case_map(r, s, jinja_style ? 4 : 3);
}

sl_jv *sl__jstr_replace(sl__jrender *r, int line, const sl_jv *s,
                        const sl_jv *old, const sl_jv *neu, int64_t count) {
  sl__jneed_str(r, line, "replace", old);
  sl__jneed_str(r, line, "replace", neu);
  sl__jbuf b = {0};
  const char *p = s->u.s.p;
  size_t n = s->u.s.n, i = 0;
  int64_t done = 0;
  if (old->u.s.n == 0) {
    /* Python inserts `new` before every character and at the end */
    size_t l;
    for (i = 0; i <= n; i += l) {
      l = 1;
      if (count < 0 || done < count) {
        sl__jbuf_put_sv(r, &b, neu, 0, neu->u.s.n);
        done++;
      }
      if (i == n)
        break;
      sl_utf8_next(p, n, i, &l);
      sl__jbuf_put_sv(r, &b, s, i, l);
    }
    return sl__jv_str_buf(r, &b);
  }
  while (i < n) {
    const char *hit = (count < 0 || done < count)
                          ? memmem(p + i, n - i, old->u.s.p, old->u.s.n)
                          : NULL;
    if (!hit) {
      sl__jbuf_put_sv(r, &b, s, i, n - i);
      break;
    }
    size_t h = (size_t)(hit - p);
    sl__jbuf_put_sv(r, &b, s, i, h - i);
    sl__jbuf_put_sv(r, &b, neu, 0, neu->u.s.n);
    i = h + old->u.s.n;
    done++;
  }
  return sl__jv_str_buf(r, &b);
}

static sl_jv *str_split(sl__jrender *r, int line, const sl_jv *s,
                        const sl_jv *sep, int64_t maxsplit) {
  sl_jv *l = sl__jv_list(r, 0);
  const char *p = s->u.s.p;
  size_t n = s->u.s.n;
  if (!sep || sep->kind == SL_JV_NULL) {
    size_t i = 0, len;
    int64_t splits = 0;
    for (;;) {
      while (i < n && sl__jis_space(sl_utf8_next(p, n, i, &len)))
        i += len;
      if (i >= n)
        break;
      if (maxsplit >= 0 && splits >= maxsplit) {
        /* the rest, right-stripped */
        size_t e = n;
        sl__jv_list_push(
            r, l, sl__jstr_strip(r, sl__jv_substr(r, s, i, e - i), NULL, 2));
        break;
      }
      size_t b = i;
      while (i < n && !sl__jis_space(sl_utf8_next(p, n, i, &len)))
        i += len;
      sl__jv_list_push(r, l, sl__jv_substr(r, s, b, i - b));
      splits++;
    }
    return l;
  }
  sl__jneed_str(r, line, "split", sep);
  if (sep->u.s.n == 0)
    sl__jfail(r, SL_ERR_FORMAT, line, "empty separator");
  size_t i = 0;
  int64_t splits = 0;
  for (;;) {
    const char *hit = (maxsplit < 0 || splits < maxsplit)
                          ? memmem(p + i, n - i, sep->u.s.p, sep->u.s.n)
                          : NULL;
    if (!hit) {
      sl__jv_list_push(r, l, sl__jv_substr(r, s, i, n - i));
      return l;
    }
    size_t h = (size_t)(hit - p);
    sl__jv_list_push(r, l, sl__jv_substr(r, s, i, h - i));
    i = h + sep->u.s.n;
    splits++;
  }
}

static bool str_prefix_test(sl__jrender *r, int line, const sl_jv *s,
                            const sl_jv *x, bool suffix) {
  if (x->kind == SL_JV_LIST) {
    for (size_t i = 0; i < x->u.l.n; i++)
      if (str_prefix_test(r, line, s, x->u.l.v[i], suffix))
        return true;
    return false;
  }
  sl__jneed_str(r, line, suffix ? "endswith" : "startswith", x);
  if (x->u.s.n > s->u.s.n)
    return false;
  const char *at = suffix ? s->u.s.p + s->u.s.n - x->u.s.n : s->u.s.p;
  return memcmp(at, x->u.s.p, x->u.s.n) == 0;
}

sl_jv *sl__jstr_method(sl__jrender *r, int line, sl_jv *s, const char *m,
                       const sl__jargs *a) {
  sl_jv *a0 = sl__jarg(a, 0, NULL), *a1 = sl__jarg(a, 1, NULL);
  if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
    if (!a0)
      sl__jfail(r, SL_ERR_FORMAT, line, "%s() takes at least 1 argument", m);
    return sl__jv_bool(r, str_prefix_test(r, line, s, a0, m[0] == 'e'));
  }
  if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
    const sl_jv *chars =
        a0 && a0->kind != SL_JV_NULL ? sl__jneed_str(r, line, m, a0) : NULL;
    return sl__jstr_strip(r, s, chars, m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3);
  }
  if (!strcmp(m, "split")) {
    sl_jv *sep = sl__jarg(a, 0, "sep"), *mx = sl__jarg(a, 1, "maxsplit");
    return str_split(r, line, s, sep, mx ? sl__jneed_int(r, line, m, mx) : -1);
  }
  if (!strcmp(m, "upper"))
    return sl__jstr_upper(r, s);
  if (!strcmp(m, "lower"))
    return sl__jstr_lower(r, s);
  if (!strcmp(m, "title"))
    return sl__jstr_title(r, s, false);
  if (!strcmp(m, "capitalize"))
    return sl__jstr_capitalize(r, s);
  if (!strcmp(m, "replace")) {
    if (!a0 || !a1)
      sl__jfail(r, SL_ERR_FORMAT, line, "replace() takes at least 2 arguments");
    sl_jv *c = sl__jarg(a, 2, "count");
    return sl__jstr_replace(r, line, s, a0, a1,
                            c ? sl__jneed_int(r, line, m, c) : -1);
  }
  if (!strcmp(m, "find") || !strcmp(m, "count")) {
    if (!a0)
      sl__jfail(r, SL_ERR_FORMAT, line, "%s() takes at least 1 argument", m);
    sl__jneed_str(r, line, m, a0);
    if (m[0] == 'f') {
      const char *h = a0->u.s.n == 0
                          ? s->u.s.p
                          : memmem(s->u.s.p, s->u.s.n, a0->u.s.p, a0->u.s.n);
      return sl__jv_int(
          r, h ? (int64_t)sl_utf8_count(s->u.s.p, (size_t)(h - s->u.s.p)) : -1);
    }
    if (a0->u.s.n == 0)
      return sl__jv_int(r, (int64_t)sl_utf8_count(s->u.s.p, s->u.s.n) + 1);
    int64_t c = 0;
    for (size_t i = 0; i + a0->u.s.n <= s->u.s.n;) {
      const char *h = memmem(s->u.s.p + i, s->u.s.n - i, a0->u.s.p, a0->u.s.n);
      if (!h)
        break;
      c++;
      i = (size_t)(h - s->u.s.p) + a0->u.s.n;
    }
    return sl__jv_int(r, c);
  }
  if (!strcmp(m, "join")) {
    if (!a0)
      sl__jfail(r, SL_ERR_FORMAT, line, "join() takes exactly 1 argument");
    sl_jv *items = sl__jv_iter_list(r, line, a0);
    sl__jbuf b = {0};
    for (size_t i = 0; i < items->u.l.n; i++) {
      const sl_jv *it = sl__jneed_str(r, line, "join", items->u.l.v[i]);
      if (i)
        sl__jbuf_put_sv(r, &b, s, 0, s->u.s.n);
      sl__jbuf_put_sv(r, &b, it, 0, it->u.s.n);
    }
    return sl__jv_str_buf(r, &b);
  }
  if (!strcmp(m, "isdigit") || !strcmp(m, "isalpha") || !strcmp(m, "isspace") ||
      !strcmp(m, "islower") || !strcmp(m, "isupper") || !strcmp(m, "isalnum")) {
    bool ok = s->u.s.n > 0, cased = false;
    size_t l;
    for (size_t i = 0; i < s->u.s.n; i += l) {
      uint32_t c = sl_utf8_next(s->u.s.p, s->u.s.n, i, &l);
      bool d = c >= '0' && c <= '9';
      switch (m[2]) {
      case 'd':
        ok = ok && d;
        break;
      case 'a':
        ok = ok && (m[4] == 'h' ? cp_cased(c) : cp_cased(c) || d);
        break;
      case 's':
        ok = ok && sl__jis_space(c);
        break;
      case 'l':
        ok = ok && !cp_is_upper(c);
        cased = cased || cp_is_lower(c);
        break;
      default:
        ok = ok && !cp_is_lower(c);
        cased = cased || cp_is_upper(c);
        break;
      }
    }
    if (m[2] == 'l' || m[2] == 'u')
      ok = ok && cased;
    return sl__jv_bool(r, ok);
  }
  if (!strcmp(m, "format"))
    sl__jfail(r, SL_ERR_UNSUPPORTED, line,
              "unsupported construct: str.format()");
  return NULL;
}
