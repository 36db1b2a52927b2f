/* UTF-8: the one encoder, the two decoders and the case mapping (see
 * include/sluice/utf8.h). */
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
