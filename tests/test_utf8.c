/* test_utf8: the one UTF-8 codec (include/sluice/utf8.h): the encoder against
 * the RFC 3629 examples and glibc's iconv for every scalar value, the strict
 * and lenient decoders on well-formed and broken input. */
#include <iconv.h>

#include "harness.h"

#include "sluice/utf8.h"

static void test_encode_examples(void) {
  /* RFC 3629, section 7, and the 2/3/4-byte limits */
  static const struct {
    uint32_t cp;
    const char *want;
  } ex[] = {
      {0x41, "A"},
      {0x24, "\x24"},
      {0xA2, "\xc2\xa2"},
      {0x7FF, "\xdf\xbf"},
      {0x800, "\xe0\xa0\x80"},
      {0x20AC, "\xe2\x82\xac"},
      {0xD55C, "\xed\x95\x9c"},
      {0xFFFF, "\xef\xbf\xbf"},
      {0x10000, "\xf0\x90\x80\x80"},
      {0x10348, "\xf0\x90\x8d\x88"},
      {0x10FFFF, "\xf4\x8f\xbf\xbf"},
      {0x110000, "\xef\xbf\xbd"}, /* past the range: U+FFFD */
      {0xD800, "\xed\xa0\x80"},   /* a surrogate, encoded as llama.cpp does */
  };
  for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
    char o[4];
    size_t n = sl_utf8_encode(ex[i].cp, o);
    CHECK_MSG(n == strlen(ex[i].want) && memcmp(o, ex[i].want, n) == 0,
              "U+%04X", (unsigned)ex[i].cp);
  }
}

/* Every scalar value: the encoding equals iconv's (UTF-32LE -> UTF-8), both
 * decoders read it back with its length, and the count is 1. */
static void test_all_scalars(void) {
  iconv_t cd = iconv_open("UTF-8", "UTF-32LE");
  CHECK(cd != (iconv_t)-1);
  if (cd == (iconv_t)-1)
    return;
  int bad = 0;
  for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
    if (cp >= 0xD800 && cp <= 0xDFFF)
      continue;
    char o[4], ref[8];
    size_t n = sl_utf8_encode(cp, o);
    uint8_t in[4] = {(uint8_t)cp, (uint8_t)(cp >> 8), (uint8_t)(cp >> 16), 0};
    char *ip = (char *)in, *op = ref;
    size_t il = 4, ol = sizeof ref;
    bool ok = iconv(cd, &ip, &il, &op, &ol) != (size_t)-1 &&
              (size_t)(op - ref) == n && memcmp(o, ref, n) == 0;
    size_t off = 0, l = 0;
    uint32_t d = 0;
    ok = ok && sl_utf8_decode(o, n, &off, &d) && d == cp && off == n;
    ok = ok && sl_utf8_next(o, n, 0, &l) == cp && l == n;
    ok = ok && sl_utf8_seq_len((unsigned char)o[0]) == n;
    ok = ok && sl_utf8_count(o, n) == 1;
    if (!ok && bad++ < 5)
      fprintf(stderr, "   U+%04X\n", (unsigned)cp);
  }
  iconv_close(cd);
  CHECK_EQ_INT(bad, 0);
}

static void test_broken_input(void) {
  size_t off = 0, l;
  uint32_t cp;
  /* a lone continuation byte, a truncated sequence, a bad continuation */
  CHECK(!sl_utf8_decode("\x80", 1, &off, &cp) && off == 0);
  CHECK(!sl_utf8_decode("\xe2\x82", 2, &off, &cp) && off == 0);
  CHECK(!sl_utf8_decode("\xe2\x41\x41", 3, &off, &cp) && off == 0);
  CHECK(!sl_utf8_decode("\xf8\x80\x80\x80\x80", 5, &off, &cp));
  /* lenient: unusable bytes one at a time, by value */
  CHECK(sl_utf8_next("\x80", 1, 0, &l) == 0x80 && l == 1);
  CHECK(sl_utf8_next("\xe2\x82", 2, 0, &l) == 0xe2 && l == 1);
  CHECK(sl_utf8_next("a\xc3\xa9", 3, 1, &l) == 0xe9 && l == 2);
  CHECK_EQ_INT(sl_utf8_count("h\xc3\xa9llo", 6), 5);
  CHECK_EQ_INT(sl_utf8_count("\x80\x80", 2), 1); /* a leading continuation */
  CHECK(sl_utf8_is_cont(0x80) && sl_utf8_is_cont(0xBF));
  CHECK(!sl_utf8_is_cont(0x7F) && !sl_utf8_is_cont(0xC0));
}

static void test_case(void) {
  CHECK_EQ_INT(sl_utf8_upper('a'), 'A');
  CHECK_EQ_INT(sl_utf8_upper(0x561), 0x531); /* Armenian ayb */
  CHECK_EQ_INT(sl_utf8_lower(0x1E00), 0x1E01);
  /* utf8proc maps sharp s to capital sharp s (U+1E9E); Python's "SS" is
   * the template engine's own special case */
  CHECK_EQ_INT(sl_utf8_upper(0xDF), 0x1E9E);
  CHECK_EQ_INT(sl_utf8_upper(0x110000), 0x110000);
  CHECK(sl_utf8_is_cased(0x1C5) && !sl_utf8_is_upper(0x1C5) &&
        !sl_utf8_is_lower(0x1C5)); /* titlecase Dž */
  CHECK(sl_utf8_is_upper(0x531) && sl_utf8_is_lower(0x561));
  CHECK(!sl_utf8_is_cased('1') && !sl_utf8_is_cased(0x4E00));
}

int main(void) {
  RUN(test_encode_examples);
  RUN(test_all_scalars);
  RUN(test_broken_input);
  RUN(test_case);
  return sl_test_finish();
}
