/* UTF-8: the one encoder, the three decoders, the scanners and the case
 * mapping (see include/sluice/utf8.h). */
#include "sluice/utf8.h"

#include <utf8proc.h>

size_t sl_utf8_encode(uint32_t cp, char *out) {
  unsigned char *o = (unsigned char *)out;
  if (cp <= 0x7f) {
    o[0] = (unsigned char)cp;
    return 1;
  }
  if (cp <= 0x7ff) {
    o[0] = (unsigned char)(0xc0 | ((cp >> 6) & 0x1f));
    o[1] = (unsigned char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp > 0x10ffff)
    cp = 0xfffd;
  if (cp <= 0xffff) {
    o[0] = (unsigned char)(0xe0 | ((cp >> 12) & 0x0f));
    o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[2] = (unsigned char)(0x80 | (cp & 0x3f));
    return 3;
  }
  o[0] = (unsigned char)(0xf0 | ((cp >> 18) & 0x07));
  o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
  o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
  o[3] = (unsigned char)(0x80 | (cp & 0x3f));
  return 4;
}

size_t sl_utf8_seq_len(unsigned char lead) {
  static const unsigned char lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1,
                                           1, 1, 1, 1, 2, 2, 3, 4};
  return lookup[lead >> 4];
}

bool sl_utf8_decode(const char *str, size_t len, size_t *off, uint32_t *cp) {
  const unsigned char *s = (const unsigned char *)str;
  size_t o = *off;
  unsigned char b = s[o];
  if (!(b & 0x80)) {
    *cp = b;
    *off = o + 1;
    return true;
  }
  if (!(b & 0x40))
    return false;
  size_t need;
  uint32_t c;
  if (!(b & 0x20)) {
    need = 1;
    c = b & 0x1f;
  } else if (!(b & 0x10)) {
    need = 2;
    c = b & 0x0f;
  } else if (!(b & 0x08)) {
    need = 3;
    c = b & 0x07;
  } else {
    return false;
  }
  if (o + need >= len)
    return false;
  for (size_t i = 1; i <= need; i++) {
    if (!sl_utf8_is_cont(s[o + i]))
      return false;
    c = (c << 6) | (s[o + i] & 0x3f);
  }
  *cp = c;
  *off = o + need + 1;
  return true;
}

uint32_t sl_utf8_next(const char *p, size_t n, size_t i, size_t *len) {
  unsigned char c = (unsigned char)p[i];
  size_t l = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  if (i + l > n)
    l = 1;
  uint32_t cp = l == 1 ? c : (uint32_t)(c & (0x7F >> l));
  for (size_t k = 1; k < l; k++)
    cp = (cp << 6) | ((unsigned char)p[i + k] & 0x3F);
  *len = l;
  return cp;
}

size_t sl_utf8_count(const char *p, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++)
    if (!sl_utf8_is_cont((unsigned char)p[i]) || i == 0)
      c++;
  return c;
}

size_t sl_utf8_complete_prefix(const char *p, size_t n) {
  size_t i = n, back = 0;
  while (i > 0 && back < 4) {
    unsigned char c = (unsigned char)p[i - 1];
    if (!sl_utf8_is_cont(c))
      return back + 1 >= sl_utf8_seq_len(c) ? n : i - 1;
    i--;
    back++;
  }
  return n;
}

sl_utf8_step sl_utf8_feed(sl_utf8_state *st, unsigned char b, uint32_t *cp) {
  if (st->left) {
    if (b < st->lo || b > st->hi)
      return SL_UTF8_STEP_BAD;
    uint32_t v = (st->cp << 6) | (b & 0x3F);
    if (st->left == 1) {
      *st = (sl_utf8_state){0};
      *cp = v;
      return SL_UTF8_STEP_DONE;
    }
    *st = (sl_utf8_state){v, (uint8_t)(st->left - 1), 0x80, 0xBF};
    return SL_UTF8_STEP_MORE;
  }
  if (b < 0x80) {
    *cp = b;
    return SL_UTF8_STEP_DONE;
  }
  /* Table 3-7: C0, C1 and F5..FF never occur; the second byte's bounds
   * after E0, ED, F0 and F4 rule out overlong forms, surrogates and values
   * past U+10FFFF */
  if (b < 0xC2 || b > 0xF4)
    return SL_UTF8_STEP_BAD;
  if (b < 0xE0)
    *st = (sl_utf8_state){b & 0x1Fu, 1, 0x80, 0xBF};
  else if (b < 0xF0)
    *st = (sl_utf8_state){b & 0x0Fu, 2, b == 0xE0 ? 0xA0 : 0x80,
                          b == 0xED ? 0x9F : 0xBF};
  else
    *st = (sl_utf8_state){b & 0x07u, 3, b == 0xF0 ? 0x90 : 0x80,
                          b == 0xF4 ? 0x8F : 0xBF};
  return SL_UTF8_STEP_MORE;
}

void sl_utf8_state_range(const sl_utf8_state *st, uint32_t *lo, uint32_t *hi) {
  /* the next byte within [st->lo, st->hi], any continuation bytes after */
  unsigned rest = 6u * (st->left - 1u);
  *lo = ((st->cp << 6) | (st->lo & 0x3Fu)) << rest;
  *hi = (((st->cp << 6) | (st->hi & 0x3Fu)) << rest) | ((1u << rest) - 1);
}

bool sl_utf8_decode_valid(const char *s, size_t len, size_t *off,
                          uint32_t *cp) {
  sl_utf8_state st = {0};
  for (size_t o = *off; o < len; o++) {
    sl_utf8_step r = sl_utf8_feed(&st, (unsigned char)s[o], cp);
    if (r == SL_UTF8_STEP_BAD)
      return false;
    if (r == SL_UTF8_STEP_DONE) {
      *off = o + 1;
      return true;
    }
  }
  return false;
}

bool sl_utf8_valid(const char *s, size_t len) {
  size_t i = 0;
  uint32_t cp;
  while (i < len) {
    if (!((unsigned char)s[i] & 0x80)) {
      i++;
      continue;
    }
    if (!sl_utf8_decode_valid(s, len, &i, &cp))
      return false;
  }
  return true;
}

size_t sl_utf8_valid_prefix(const char *s, size_t len) {
  size_t i = 0;
  uint32_t cp;
  while (i < len && sl_utf8_decode_valid(s, len, &i, &cp))
    ;
  return i;
}

uint32_t sl_utf8_upper(uint32_t cp) {
  return cp > 0x10FFFF ? cp : (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp);
}

uint32_t sl_utf8_lower(uint32_t cp) {
  return cp > 0x10FFFF ? cp : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
}

bool sl_utf8_is_cased(uint32_t cp) {
  if (cp > 0x10FFFF)
    return false;
  utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL ||
         c == UTF8PROC_CATEGORY_LT;
}

bool sl_utf8_is_upper(uint32_t cp) {
  return cp <= 0x10FFFF && utf8proc_isupper((utf8proc_int32_t)cp);
}

bool sl_utf8_is_lower(uint32_t cp) {
  return cp <= 0x10FFFF && utf8proc_islower((utf8proc_int32_t)cp);
}
