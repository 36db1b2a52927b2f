/* test_utf8: the one UTF-8 codec (include/sluice/utf8.h): the encoder against
 * the RFC 3629 examples and glibc's iconv for every scalar value, the strict
 * and lenient decoders on well-formed and broken input, the well-formed
 * decoder (whole and a byte at a time) against Unicode's Table 3-7 over
 * every sequence of up to three bytes and a boundary set of four, and the
 * prefix scanners. */
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
    off = 0;
    ok = ok && sl_utf8_decode_valid(o, n, &off, &d) && d == cp && off == n;
    ok = ok && sl_utf8_valid(o, n) && sl_utf8_valid_prefix(o, n) == n;
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

/* Unicode's Table 3-7, the well-formed byte sequences: a lead byte range
 * and the range of each byte after it. */
static const struct {
  unsigned char lead_lo, lead_hi, n;
  unsigned char lo[3], hi[3];
} T37[] = {
    {0x00, 0x7F, 1, {0}, {0}},
    {0xC2, 0xDF, 2, {0x80}, {0xBF}},
    {0xE0, 0xE0, 3, {0xA0, 0x80}, {0xBF, 0xBF}},
    {0xE1, 0xEC, 3, {0x80, 0x80}, {0xBF, 0xBF}},
    {0xED, 0xED, 3, {0x80, 0x80}, {0x9F, 0xBF}},
    {0xEE, 0xEF, 3, {0x80, 0x80}, {0xBF, 0xBF}},
    {0xF0, 0xF0, 4, {0x90, 0x80, 0x80}, {0xBF, 0xBF, 0xBF}},
    {0xF1, 0xF3, 4, {0x80, 0x80, 0x80}, {0xBF, 0xBF, 0xBF}},
    {0xF4, 0xF4, 4, {0x80, 0x80, 0x80}, {0x8F, 0xBF, 0xBF}},
};

/* The table's verdict on b[0, n): the length of the well-formed sequence
 * it starts with (0: none), and in *bad the index of the first byte no
 * well-formed sequence can have there (n when every byte can be). */
static size_t t37(const unsigned char *b, size_t n, size_t *bad) {
  for (size_t r = 0; r < sizeof T37 / sizeof T37[0]; r++) {
    if (b[0] < T37[r].lead_lo || b[0] > T37[r].lead_hi)
      continue;
    for (size_t i = 1; i < T37[r].n; i++) {
      if (i == n) {
        *bad = n;
        return 0;
      }
      if (b[i] < T37[r].lo[i - 1] || b[i] > T37[r].hi[i - 1]) {
        *bad = i;
        return 0;
      }
    }
    *bad = n;
    return T37[r].n;
  }
  *bad = 0;
  return 0;
}

/* One buffer through every well-formed entry point, checked against t37:
 * the whole decoder's verdict, length and value (that of the lax decoder,
 * which reads any lead byte and its continuation bytes); a byte at a time,
 * each byte refused exactly where the table first refuses one, and each
 * partial sequence's range that of its completions, all scalar values.
 * Returns whether everything agreed. */
static bool check_well_formed(const unsigned char *b, size_t n) {
  size_t bad, want = t37(b, n, &bad);
  size_t off = 0, loff = 0;
  uint32_t cp = 0, lcp = 0;
  bool ok = sl_utf8_decode_valid((const char *)b, n, &off, &cp) == (want > 0);
  if (want)
    ok = ok && off == want && sl_utf8_decode((const char *)b, n, &loff, &lcp) &&
         lcp == cp && loff == want && !(cp >= 0xD800 && cp <= 0xDFFF) &&
         cp <= 0x10FFFF;
  else
    ok = ok && off == 0;
  ok = ok && sl_utf8_valid_prefix((const char *)b, n) >= want;
  sl_utf8_state st = {0};
  for (size_t i = 0; ok && i < n; i++) {
    sl_utf8_state before = st;
    uint32_t c = 0;
    sl_utf8_step r = sl_utf8_feed(&st, b[i], &c);
    if (i == bad) { /* refused here, the state kept */
      ok = r == SL_UTF8_STEP_BAD && memcmp(&st, &before, sizeof st) == 0;
      break;
    }
    if (want && i + 1 == want) {
      ok = r == SL_UTF8_STEP_DONE && c == cp && st.left == 0;
      break;
    }
    ok = r == SL_UTF8_STEP_MORE && st.left > 0;
    if (!ok)
      break;
    /* the completions: the next byte's range, then any continuation */
    uint32_t lo, hi;
    sl_utf8_state_range(&st, &lo, &hi);
    unsigned char mn[4], mx[4];
    memcpy(mn, b, i + 1);
    memcpy(mx, b, i + 1);
    size_t r0 = 0, len = 0;
    for (size_t k = 0; k < sizeof T37 / sizeof T37[0]; k++)
      if (b[0] >= T37[k].lead_lo && b[0] <= T37[k].lead_hi)
        r0 = k, len = T37[k].n;
    for (size_t k = i + 1; k < len; k++) {
      mn[k] = T37[r0].lo[k - 1];
      mx[k] = T37[r0].hi[k - 1];
    }
    size_t o1 = 0, o2 = 0;
    uint32_t want_lo = 0, want_hi = 0;
    ok = sl_utf8_decode((const char *)mn, len, &o1, &want_lo) &&
         sl_utf8_decode((const char *)mx, len, &o2, &want_hi) &&
         lo == want_lo && hi == want_hi && (hi < 0xD800 || lo > 0xDFFF) &&
         hi <= 0x10FFFF;
  }
  return ok;
}

static void test_well_formed(void) {
  int bad = 0;
  /* every sequence of one to three bytes */
  for (uint32_t v = 0; v < 1u << 24; v++) {
    unsigned char b[3] = {(unsigned char)(v >> 16), (unsigned char)(v >> 8),
                          (unsigned char)v};
    for (size_t n = 1; n <= 3; n++) {
      if (n < 3 && (v & ((1u << (8 * (3 - n))) - 1)))
        continue; /* each shorter prefix once */
      if (!check_well_formed(b, n) && bad++ < 5)
        fprintf(stderr, "   %zu bytes %06X\n", n, (unsigned)v);
    }
  }
  /* four bytes from the table's boundaries and their neighbours */
  static const unsigned char edge[] = {0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0,
                                       0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1,
                                       0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3,
                                       0xF4, 0xF5, 0xF7, 0xF8, 0xFF};
  size_t ne = sizeof edge;
  for (size_t i = 0; i < ne * ne * ne * ne; i++) {
    unsigned char b[4] = {edge[i / (ne * ne * ne)], edge[i / (ne * ne) % ne],
                          edge[i / ne % ne], edge[i % ne]};
    if (!check_well_formed(b, 4) && bad++ < 5)
      fprintf(stderr, "   %02X %02X %02X %02X\n", b[0], b[1], b[2], b[3]);
  }
  CHECK_EQ_INT(bad, 0);
  /* the named ill-formed classes */
  size_t off = 0;
  uint32_t cp;
  CHECK(!sl_utf8_decode_valid("\xc0\x80", 2, &off, &cp)); /* overlong NUL */
  CHECK(!sl_utf8_decode_valid("\xc1\xb3", 2, &off, &cp)); /* overlong s */
  CHECK(!sl_utf8_decode_valid("\xe0\x81\xb3", 3, &off, &cp));
  CHECK(!sl_utf8_decode_valid("\xf0\x80\x81\xb3", 4, &off, &cp));
  CHECK(!sl_utf8_decode_valid("\xed\xa0\x80", 3, &off, &cp)); /* U+D800 */
  CHECK(!sl_utf8_decode_valid("\xed\xbf\xbf", 3, &off, &cp)); /* U+DFFF */
  CHECK(!sl_utf8_decode_valid("\xf4\x90\x80\x80", 4, &off, &cp));
  CHECK(!sl_utf8_decode_valid("\xf8\x88\x80\x80\x80", 5, &off, &cp));
  CHECK(off == 0);
  CHECK(sl_utf8_decode_valid("\xed\x9f\xbf", 3, &off, &cp) && cp == 0xD7FF);
  /* decoding goes on at *off */
  off = 1;
  CHECK(sl_utf8_decode_valid("a\xc3\xa9", 3, &off, &cp) && cp == 0xE9 &&
        off == 3);
}

static void test_scanners(void) {
  CHECK(sl_utf8_valid("", 0));
  CHECK(sl_utf8_valid("h\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 10));
  CHECK(!sl_utf8_valid("abc\xc0\x80", 5));      /* after ASCII */
  CHECK(!sl_utf8_valid("\xe0\x80\xaf", 3));     /* overlong / */
  CHECK(!sl_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
  CHECK(!sl_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
  CHECK(!sl_utf8_valid("\xe2\x82", 2));         /* cut short */
  CHECK(!sl_utf8_valid("a\x80", 2));            /* a lone continuation */
  CHECK_EQ_INT(sl_utf8_valid_prefix("", 0), 0);
  CHECK_EQ_INT(sl_utf8_valid_prefix("ab\xc3\xa9", 4), 4);
  CHECK_EQ_INT(sl_utf8_valid_prefix("ab\xe2\x82", 4), 2);
  CHECK_EQ_INT(sl_utf8_valid_prefix("ab\xc0\x80\x63\x64", 6), 2);
  CHECK_EQ_INT(sl_utf8_valid_prefix("\xed\xa0\x80", 3), 0);
  /* complete prefixes: a sequence cut short at the end is held back */
  CHECK_EQ_INT(sl_utf8_complete_prefix("", 0), 0);
  CHECK_EQ_INT(sl_utf8_complete_prefix("abc", 3), 3);
  CHECK_EQ_INT(sl_utf8_complete_prefix("a\xc3", 2), 1);
  CHECK_EQ_INT(sl_utf8_complete_prefix("a\xc3\xa9", 3), 3);
  CHECK_EQ_INT(sl_utf8_complete_prefix("a\xe2\x82", 3), 1);
  CHECK_EQ_INT(sl_utf8_complete_prefix("a\xe2\x82\xac", 4), 4);
  CHECK_EQ_INT(sl_utf8_complete_prefix("\xf0\x9f\x98", 3), 0);
  CHECK_EQ_INT(sl_utf8_complete_prefix("\xf0\x9f\x98\x80", 4), 4);
  /* not UTF-8 but not cut short either: kept */
  CHECK_EQ_INT(sl_utf8_complete_prefix("a\x80\x80", 3), 3);
  CHECK_EQ_INT(sl_utf8_complete_prefix("\xc3\xa9\xa9", 3), 3);
  CHECK_EQ_INT(sl_utf8_complete_prefix("\x80\x80\x80\x80\x80", 5), 5);
  /* a byte past 0xF7 announces four (sl_utf8_seq_len): held back alone */
  CHECK_EQ_INT(sl_utf8_complete_prefix("a\xff", 2), 1);
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
  RUN(test_well_formed);
  RUN(test_scanners);
  RUN(test_case);
  return sl_test_finish();
}
