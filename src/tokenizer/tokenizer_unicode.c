/* Unicode helpers for the tokenizer: UTF-8 decoding with llama.cpp's error
 * rules, code point categories, and the GPT-2 byte <-> unicode map.
 *
 * Categories come from utf8proc (Unicode 15.0) plus the code points Unicode
 * 15.1 assigned, so they agree with llama.cpp's generated tables (15.1). */
#include <utf8proc.h>

#include "sluice/util.h"
#include "tokenizer_impl.h"

static bool is_white_space(uint32_t c) {
  /* The Unicode White_Space property. */
  if ((c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 ||
      c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
      c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000)
    return true;
  return false;
}

uint16_t sl__cpt_flags(uint32_t cpt) {
  if (cpt >= 0x110000)
    return SL__CPT_UNDEFINED;
  uint16_t f;
  /* Assigned in Unicode 15.1 (utf8proc 2.8 knows 15.0). */
  if ((cpt >= 0x2FFC && cpt <= 0x2FFF) || cpt == 0x31EF) {
    f = SL__CPT_SYMBOL;
  } else if (cpt >= 0x2EBF0 && cpt <= 0x2EE5D) {
    f = SL__CPT_LETTER;
  } else {
    switch (utf8proc_category((utf8proc_int32_t)cpt)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      f = SL__CPT_LETTER;
      break;
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
      f = SL__CPT_ACCENT_MARK;
      break;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      f = SL__CPT_NUMBER;
      break;
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      f = SL__CPT_PUNCTUATION;
      break;
    case UTF8PROC_CATEGORY_SM:
    case UTF8PROC_CATEGORY_SC:
    case UTF8PROC_CATEGORY_SK:
    case UTF8PROC_CATEGORY_SO:
      f = SL__CPT_SYMBOL;
      break;
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      f = SL__CPT_SEPARATOR;
      break;
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
      f = SL__CPT_CONTROL;
      break;
    default:
      f = SL__CPT_UNDEFINED;
      break;
    }
  }
  if (is_white_space(cpt))
    f |= SL__CPT_WHITESPACE;
  return f;
}

sl_status sl__utf8_decode(const char *s, size_t len, uint32_t **cpts,
                          size_t *n) {
  *cpts = NULL;
  *n = 0;
  uint32_t *out = sl_calloc(len ? len : 1, sizeof *out);
  if (!out)
    return SL_ERR_NOMEM;
  size_t off = 0, k = 0;
  while (off < len) {
    uint32_t c;
    if (sl_utf8_decode(s, len, &off, &c)) {
      /* llama.cpp cannot re-encode these (it throws); read as U+FFFD. */
      out[k++] = c > 0x10FFFF ? 0xFFFD : c;
    } else {
      out[k++] = 0xFFFD;
      off++;
    }
  }
  *cpts = out;
  *n = k;
  return SL_OK;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves;
 * the other 68 bytes map, in byte order, to U+0100..U+0143: 0x00-0x20 to
 * 0..32, 0x7F-0xA0 to 33..66, 0xAD to 67 (plus 256). */
static uint32_t byte_cpt(uint8_t b) {
  if (b <= 0x20)
    return 256u + b;
  if (b >= 0x7f && b <= 0xa0)
    return 256u + 33u + (b - 0x7fu);
  if (b == 0xad)
    return 256u + 67u;
  return b;
}

size_t sl__byte_to_unicode(uint8_t b, char out[4]) {
  return sl_utf8_encode(byte_cpt(b), out);
}

int sl__unicode_to_byte(uint32_t cpt) {
  if (cpt < 256)
    return byte_cpt((uint8_t)cpt) == cpt ? (int)cpt : -1;
  if (cpt <= 256 + 32)
    return (int)(cpt - 256);
  if (cpt <= 256 + 66)
    return (int)(cpt - 256 - 33 + 0x7f);
  if (cpt == 256 + 67)
    return 0xad;
  return -1;
}
