/* sluice — jinja: the Jinja lexer.
 *
 * Follows jinja2's lexer with trim_blocks=True, lstrip_blocks=True,
 * keep_trailing_newline=False: newlines are normalized to "\n" and one
 * trailing newline of the source is dropped; "{%-" / "-%}" strip all
 * whitespace on that side; "%}" and "#}" eat one following newline; a block
 * or comment tag alone on its line after only spaces and tabs has those
 * stripped ("{%+" keeps them); "{{" tags are never lstripped.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"
#include "sluice/utf8.h"
#include "sluice/util.h"

typedef struct lexer {
  sl__jarena *a;
  const char *src;
  size_t len, pos;
  int line;
  sl__jtok *toks;
  size_t n, cap;
  char *err;
  size_t errcap;
  sl_status st;
} lexer;

static sl_status lex_fail(lexer *L, sl_status st, int line, const char *fmt,
                          ...) {
  if (L->err && L->errcap) {
    int k = snprintf(L->err, L->errcap, "line %d: ", line);
    if (k < 0 || (size_t)k >= L->errcap)
      k = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->err + k, L->errcap - (size_t)k, fmt, ap);
    va_end(ap);
  }
  L->st = st;
  return st;
}

static sl__jtok *push(lexer *L, sl__jtok_kind kind) {
  if (L->n == L->cap) {
    size_t cap = L->cap ? L->cap * 2 : 256, bytes;
    if (!sl_mul_ok(cap, sizeof(sl__jtok), &bytes))
      return NULL;
    sl__jtok *nt = sl__ja_alloc(L->a, bytes);
    if (!nt)
      return NULL;
    if (L->n)
      memcpy(nt, L->toks, L->n * sizeof(sl__jtok));
    L->toks = nt;
    L->cap = cap;
  }
  sl__jtok *t = &L->toks[L->n++];
  memset(t, 0, sizeof *t);
  t->kind = kind;
  t->line = L->line;
  return t;
}

static char *dup_bytes(lexer *L, const char *p, size_t n) {
  char *s = sl__ja_alloc(L->a, n + 1);
  if (!s)
    return NULL;
  if (n)
    memcpy(s, p, n);
  s[n] = 0;
  return s;
}

static int count_nl(const char *p, size_t n) {
  int c = 0;
  for (size_t i = 0; i < n; i++)
    c += p[i] == '\n';
  return c;
}

static bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
         c == '\f' || (c >= 0x1c && c <= 0x1f);
}

static bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
static bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (unsigned char)c >= 0x80;
}
static bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

static bool starts(const lexer *L, size_t pos, const char *s) {
  size_t n = strlen(s);
  return pos + n <= L->len && memcmp(L->src + pos, s, n) == 0;
}

/* Emits data text src[b, e) after applying the strip rules for the tag that
 * follows it: `sign` is the tag's '-', '+' or 0; `lstrip` says the tag is a
 * block or comment; `line_starting` whether the text starts a line. */
static sl_status emit_text(lexer *L, size_t b, size_t e, char sign, bool lstrip,
                           bool line_starting) {
  size_t end = e;
  if (sign == '-') {
    while (end > b && is_ws(L->src[end - 1]))
      end--;
  } else if (sign != '+' && lstrip) {
    size_t l = end;
    while (l > b && L->src[l - 1] != '\n')
      l--;
    bool has_nl = l > b;
    if ((has_nl || line_starting) && l < end) {
      bool all_ws = true;
      for (size_t i = l; i < end; i++)
        if (!is_ws(L->src[i]))
          all_ws = false;
      if (all_ws)
        end = l;
    }
  }
  if (end > b) {
    sl__jtok *t = push(L, JT_TEXT);
    if (!t)
      return SL_ERR_NOMEM;
    t->s = L->src + b; /* the normalized source lives in the arena */
    t->n = end - b;
  }
  L->line += count_nl(L->src + b, e - b);
  return SL_OK;
}

/* Decodes a string literal body per Python's unicode-escape rules. */
static char *decode_string(lexer *L, const char *p, size_t n, size_t *out_n) {
  char *o = sl__ja_alloc(L->a, n * 2 + 1);
  if (!o)
    return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    char c = p[i];
    if (c != '\\' || i + 1 >= n) {
      o[k++] = c;
      continue;
    }
    char e = p[++i];
    uint32_t cp = 0;
    int hex = 0;
    switch (e) {
    case '\n':
      continue;
    case '\\':
      o[k++] = '\\';
      continue;
    case '\'':
      o[k++] = '\'';
      continue;
    case '"':
      o[k++] = '"';
      continue;
    case 'n':
      o[k++] = '\n';
      continue;
    case 't':
      o[k++] = '\t';
      continue;
    case 'r':
      o[k++] = '\r';
      continue;
    case 'b':
      o[k++] = '\b';
      continue;
    case 'f':
      o[k++] = '\f';
      continue;
    case 'v':
      o[k++] = '\v';
      continue;
    case 'a':
      o[k++] = '\a';
      continue;
    case 'x':
      hex = 2;
      break;
    case 'u':
      hex = 4;
      break;
    case 'U':
      hex = 8;
      break;
    default:
      if (e >= '0' && e <= '7') {
        cp = (uint32_t)(e - '0');
        for (int d = 0;
             d < 2 && i + 1 < n && p[i + 1] >= '0' && p[i + 1] <= '7'; d++)
          cp = cp * 8 + (uint32_t)(p[++i] - '0');
        goto encode;
      }
      o[k++] = '\\';
      o[k++] = e;
      continue;
    }
    for (int d = 0; d < hex; d++) {
      char h = i + 1 < n ? p[i + 1] : 0;
      int v = h >= '0' && h <= '9'   ? h - '0'
              : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                     : -1;
      if (v < 0)
        return NULL; /* truncated \x escape: a syntax error */
      cp = cp * 16 + (uint32_t)v;
      i++;
    }
    if (cp > 0x10FFFF)
      return NULL;
  encode:
    k += sl_utf8_encode(cp, o + k);
  }
  o[k] = 0;
  *out_n = k;
  return o;
}

static const char *const k_ops[] = {
    "//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
    "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};

/* Tokenizes the inside of a {{ }} or {% %} tag starting at L->pos. On return
 * L->pos is past the end tag; *end_sign is '-', '+' or 0. */
static sl_status lex_tag(lexer *L, bool block, char *end_sign) {
  int depth = 0;
  int open_line = L->line;
  for (;;) {
    if (L->pos >= L->len)
      return lex_fail(L, SL_ERR_FORMAT, open_line,
                      "unexpected end of template inside a %s tag",
                      block ? "{% %}" : "{{ }}");
    size_t p = L->pos;
    const char *s = L->src + p;
    if (depth == 0) {
      if (block && starts(L, p, "+%}")) {
        L->pos += 3;
        *end_sign = '+';
        return push(L, JT_BLOCK_END) ? SL_OK : SL_ERR_NOMEM;
      }
      if (starts(L, p, block ? "-%}" : "-}}")) {
        if (!push(L, block ? JT_BLOCK_END : JT_VAR_END))
          return SL_ERR_NOMEM;
        L->pos += 3;
        *end_sign = '-';
        return SL_OK;
      }
      if (starts(L, p, block ? "%}" : "}}")) {
        if (!push(L, block ? JT_BLOCK_END : JT_VAR_END))
          return SL_ERR_NOMEM;
        L->pos += 2;
        *end_sign = 0;
        return SL_OK;
      }
    }
    if (is_ws(*s)) {
      if (*s == '\n')
        L->line++;
      L->pos++;
      continue;
    }
    if (is_digit(*s)) {
      bool after_dot = p > 0 && L->src[p - 1] == '.'; /* x.0: no float */
      /* float: digits ( .digits (e[+-]digits)? | e[+-]digits ) ; int: digits */
      size_t q = p;
      while (q < L->len && (is_digit(L->src[q]) || L->src[q] == '_'))
        q++;
      bool is_float = false;
      if (!after_dot && q + 1 < L->len && L->src[q] == '.' &&
          is_digit(L->src[q + 1])) {
        is_float = true;
        q++;
        while (q < L->len && (is_digit(L->src[q]) || L->src[q] == '_'))
          q++;
      }
      if (!after_dot && q < L->len && (L->src[q] == 'e' || L->src[q] == 'E')) {
        size_t e = q + 1;
        if (e < L->len && (L->src[e] == '+' || L->src[e] == '-'))
          e++;
        if (e < L->len && is_digit(L->src[e])) {
          while (e < L->len && (is_digit(L->src[e]) || L->src[e] == '_'))
            e++;
          is_float = true;
          q = e;
        }
      }
      char num[128];
      size_t k = 0;
      for (size_t i = p; i < q && k + 1 < sizeof num; i++)
        if (L->src[i] != '_')
          num[k++] = L->src[i];
      num[k] = 0;
      sl__jtok *t = push(L, is_float ? JT_FLOAT : JT_INT);
      if (!t)
        return SL_ERR_NOMEM;
      if (is_float) {
        t->f = strtod(num, NULL);
      } else {
        int64_t v = 0;
        for (size_t i = 0; i < k; i++) {
          if (v > (INT64_MAX - 9) / 10)
            return lex_fail(L, SL_ERR_UNSUPPORTED, L->line,
                            "integer literal too large");
          v = v * 10 + (num[i] - '0');
        }
        t->i = v;
      }
      L->pos = q;
      continue;
    }
    if (is_name_start(*s)) {
      size_t q = p;
      while (q < L->len && is_name_char(L->src[q]))
        q++;
      sl__jtok *t = push(L, JT_NAME);
      if (!t || !(t->s = dup_bytes(L, s, q - p)))
        return SL_ERR_NOMEM;
      t->n = q - p;
      L->pos = q;
      continue;
    }
    if (*s == '\'' || *s == '"') {
      char qc = *s;
      size_t q = p + 1;
      while (q < L->len && L->src[q] != qc) {
        if (L->src[q] == '\\')
          q++;
        q++;
      }
      if (q >= L->len)
        return lex_fail(L, SL_ERR_FORMAT, L->line, "unterminated string");
      sl__jtok *t = push(L, JT_STRING);
      if (!t)
        return SL_ERR_NOMEM;
      t->s = decode_string(L, s + 1, q - p - 1, &t->n);
      if (!t->s)
        return lex_fail(L, SL_ERR_FORMAT, L->line,
                        "invalid escape in string literal");
      L->line += count_nl(s, q - p);
      L->pos = q + 1;
      continue;
    }
    size_t i;
    for (i = 0; i < sizeof k_ops / sizeof k_ops[0]; i++)
      if (starts(L, p, k_ops[i]))
        break;
    if (i == sizeof k_ops / sizeof k_ops[0])
      return lex_fail(L, SL_ERR_FORMAT, L->line, "unexpected char '%c'", *s);
    const char *op = k_ops[i];
    if (op[0] == '(' || op[0] == '[' || op[0] == '{')
      depth++;
    else if (op[0] == ')' || op[0] == ']' || op[0] == '}') {
      if (depth == 0)
        return lex_fail(L, SL_ERR_FORMAT, L->line, "unexpected '%c'", op[0]);
      depth--;
    }
    sl__jtok *t = push(L, JT_OP);
    if (!t)
      return SL_ERR_NOMEM;
    t->s = op;
    t->n = strlen(op);
    L->pos += t->n;
  }
}

/* Applies a closing tag's whitespace rule: '-' eats all following
 * whitespace, 0 eats one newline (trim_blocks; only for blocks/comments).
 * Returns whether the consumed text ended with a newline. */
static bool after_tag(lexer *L, char sign, bool trim) {
  bool nl = false;
  if (sign == '-') {
    while (L->pos < L->len && is_ws(L->src[L->pos])) {
      nl = L->src[L->pos] == '\n';
      if (nl)
        L->line++;
      L->pos++;
    }
  } else if (sign == 0 && trim && L->pos < L->len && L->src[L->pos] == '\n') {
    L->pos++;
    L->line++;
    nl = true;
  }
  return nl;
}

/* Matches "{%[-+]?\s*raw\s*-?%}" at pos; on a match returns its length and
 * whether it ended with '-'. */
static size_t match_raw(const lexer *L, size_t pos, const char *word,
                        char *sign_in, char *sign_out) {
  size_t p = pos + 2;
  *sign_in = 0;
  if (p < L->len && (L->src[p] == '-' || L->src[p] == '+'))
    *sign_in = L->src[p++];
  while (p < L->len && is_ws(L->src[p]))
    p++;
  size_t wn = strlen(word);
  if (!starts(L, p, word))
    return 0;
  p += wn;
  if (p < L->len && is_name_char(L->src[p]))
    return 0;
  while (p < L->len && is_ws(L->src[p]))
    p++;
  *sign_out = 0;
  if (p < L->len && (L->src[p] == '-' || L->src[p] == '+'))
    *sign_out = L->src[p++];
  if (!starts(L, p, "%}"))
    return 0;
  return p + 2 - pos;
}

sl_status sl__jinja_lex(sl__jarena *a, const char *src, size_t len,
                        sl__jtok **toks, size_t *ntoks, char *err,
                        size_t errcap) {
  lexer L = {.a = a, .line = 1, .err = err, .errcap = errcap};
  /* normalize newlines; drop one trailing newline */
  char *norm = sl__ja_alloc(a, len + 1);
  if (!norm)
    return SL_ERR_NOMEM;
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    if (src[i] == '\r') {
      norm[n++] = '\n';
      if (i + 1 < len && src[i + 1] == '\n')
        i++;
    } else {
      norm[n++] = src[i];
    }
  }
  if (n && norm[n - 1] == '\n')
    n--;
  norm[n] = 0;
  L.src = norm;
  L.len = n;

  bool line_starting = true;
  sl_status st;
  while (L.pos < L.len) {
    /* find the next tag start */
    size_t q = L.pos;
    const char *hit = NULL;
    while (q + 1 < L.len) {
      hit = memchr(L.src + q, '{', L.len - q - 1);
      if (!hit)
        break;
      char c = hit[1];
      if (c == '{' || c == '%' || c == '#')
        break;
      q = (size_t)(hit - L.src) + 1;
      hit = NULL;
    }
    if (!hit) {
      if ((st = emit_text(&L, L.pos, L.len, 0, false, line_starting)))
        return st;
      L.pos = L.len;
      break;
    }
    size_t tag = (size_t)(hit - L.src);
    char kind = hit[1];
    char sign =
        tag + 2 < L.len && (L.src[tag + 2] == '-' || L.src[tag + 2] == '+')
            ? L.src[tag + 2]
            : 0;
    char rin = 0, rout = 0;
    size_t rawlen = kind == '%' ? match_raw(&L, tag, "raw", &rin, &rout) : 0;
    if (rawlen && rout == '+')
      rawlen = 0; /* jinja2's raw_begin accepts only '-' or nothing */
    if ((st = emit_text(&L, L.pos, tag, sign, kind != '{', line_starting)))
      return st;
    if (rawlen) {
      L.pos = tag + rawlen;
      after_tag(&L, rout, false);
      /* find {% endraw %} */
      size_t e = L.pos;
      size_t elen = 0;
      char ein = 0, eout = 0;
      for (; e + 1 < L.len; e++)
        if (L.src[e] == '{' && L.src[e + 1] == '%' &&
            (elen = match_raw(&L, e, "endraw", &ein, &eout)))
          break;
      if (!elen)
        return lex_fail(&L, SL_ERR_FORMAT, L.line,
                        "missing end of raw directive");
      if ((st = emit_text(&L, L.pos, e, ein, true, false)))
        return st;
      L.pos = e + elen;
      line_starting = after_tag(&L, eout, true);
      continue;
    }
    L.pos = tag + 2 + (sign ? 1 : 0);
    if (kind == '#') {
      /* comment: ends at the first "#}" */
      const char *e = NULL;
      for (size_t k = L.pos; k + 1 < L.len; k++)
        if (L.src[k] == '#' && L.src[k + 1] == '}') {
          e = L.src + k;
          break;
        }
      if (!e)
        return lex_fail(&L, SL_ERR_FORMAT, L.line,
                        "missing end of comment tag");
      size_t end = (size_t)(e - L.src);
      char esign = 0;
      if (end > L.pos && (L.src[end - 1] == '-' || L.src[end - 1] == '+'))
        esign = L.src[end - 1];
      L.line += count_nl(L.src + L.pos, end + 2 - L.pos);
      L.pos = end + 2;
      line_starting = after_tag(&L, esign, true);
      if (!line_starting)
        line_starting = L.src[L.pos - 1] == '\n';
      continue;
    }
    bool block = kind == '%';
    if (!push(&L, block ? JT_BLOCK_BEGIN : JT_VAR_BEGIN))
      return SL_ERR_NOMEM;
    char esign = 0;
    if ((st = lex_tag(&L, block, &esign)))
      return st == SL_ERR_NOMEM ? lex_fail(&L, st, L.line, "out of memory")
                                : st;
    line_starting = after_tag(&L, esign, block);
  }
  if (!push(&L, JT_EOF))
    return lex_fail(&L, SL_ERR_NOMEM, L.line, "out of memory");
  *toks = L.toks;
  *ntoks = L.n;
  return SL_OK;
}
