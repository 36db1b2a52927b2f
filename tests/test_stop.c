/* Stop strings: the engine's incremental matcher (stop.c, through
 * sl__detok_append) against a naive reference that rescans all the pending
 * text at every token, on random texts cut into random pieces: stop strings
 * split across pieces, overlapping and repeated prefixes, multibyte UTF-8
 * split inside a character. Each piece's emitted bytes and the stop
 * decision must be the same. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "harness.h"
#include "sluice/utf8.h"
#include "sluice/util.h"

static uint64_t g_rng = 0x5eed5eedull;
static int g_stopped, g_max_hold; /* coverage of the random cases */
static uint32_t rnd(void) {
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(g_rng >> 33);
}

/* ---- the reference: what the engine did before matching incrementally */

typedef struct ref {
  const char *stop[SL_MAX_STOP];
  int n;
  char pend[8192];
  size_t len;
} ref;

/* The longest prefix of s[0..n) made of whole characters, walking forward
 * from a character boundary (s is a piece of valid UTF-8 that starts on
 * one). */
static size_t ref_whole_chars(const char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned char c = (unsigned char)s[i];
    size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i + l > n)
      break;
    i += l;
  }
  return i;
}

/* Appends a piece; *emit bytes of pend may go out; true at a stop string
 * (which begins at *emit). */
static bool ref_step(ref *r, const char *p, size_t n, size_t *emit) {
  SL_ASSERT(r->len + n <= sizeof r->pend);
  memcpy(r->pend + r->len, p, n);
  r->len += n;
  size_t cut = SIZE_MAX;
  for (int i = 0; i < r->n; i++) {
    size_t sl = strlen(r->stop[i]);
    for (size_t k = 0; k + sl <= r->len && k < cut; k++)
      if (memcmp(r->pend + k, r->stop[i], sl) == 0) {
        cut = k;
        break;
      }
  }
  if (cut != SIZE_MAX) {
    *emit = cut;
    return true;
  }
  size_t hold = 0;
  for (int i = 0; i < r->n; i++) {
    size_t sl = strlen(r->stop[i]);
    for (size_t k = 1; k < sl && k <= r->len; k++)
      if (k > hold && memcmp(r->pend + r->len - k, r->stop[i], k) == 0)
        hold = k;
  }
  *emit = ref_whole_chars(r->pend, r->len - hold);
  return false;
}

static void ref_consume(ref *r, size_t emit) {
  memmove(r->pend, r->pend + emit, r->len - emit);
  r->len -= emit;
}

/* ---- random cases ---------------------------------------------------- */

static const char *const CHARS[] = {
    "a", "b", "c", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"};
#define N_CHARS (int)(sizeof CHARS / sizeof CHARS[0])

/* Appends `n` characters drawn from the first `k` of CHARS, keeping the
 * result under cap bytes. */
static size_t rand_chars(char *out, size_t len, size_t cap, int n, int k) {
  for (int i = 0; i < n; i++) {
    const char *c = CHARS[rnd() % (uint32_t)k];
    size_t cl = strlen(c);
    if (len + cl >= cap)
      break;
    memcpy(out + len, c, cl);
    len += cl;
  }
  out[len] = 0;
  return len;
}

/* Start of the character holding byte i of valid UTF-8 text s. */
static size_t char_start(const char *s, size_t i) {
  while (i > 0 && sl_utf8_is_cont((unsigned char)s[i]))
    i--;
  return i;
}

/* One random case; returns false on the first mismatch (reported). */
static bool one_case(int trial) {
  char text[2048], stops[SL_MAX_STOP][SL_MAX_STOP_BYTES + 1];
  const char *sp[SL_MAX_STOP];
  int k = 2 + (int)(rnd() % (N_CHARS - 1)); /* the alphabet's size */
  /* random characters, with runs of 'a' against the stop strings' runs */
  size_t tlen = 0, want = rnd() % 1200;
  text[0] = 0;
  while (tlen < want) {
    if (rnd() % 4 == 0) {
      size_t run = 1 + rnd() % 300;
      for (size_t i = 0; i < run && tlen < 1500; i++)
        text[tlen++] = 'a';
      text[tlen] = 0;
    } else {
      tlen = rand_chars(text, tlen, 1500, (int)(rnd() % 60), k);
    }
  }
  int n_stop = 1 + (int)(rnd() % SL_MAX_STOP);
  for (int i = 0; i < n_stop; i++) {
    size_t sl = 0;
    uint32_t kind = rnd() % 4;
    if (kind == 0 && tlen > 0) { /* a piece of the text: it will match */
      size_t a = char_start(text, rnd() % tlen);
      size_t b = a + 1 + rnd() % 24;
      if (b > tlen)
        b = tlen;
      while (b < tlen && sl_utf8_is_cont((unsigned char)text[b]))
        b++;
      sl = b - a;
      if (sl > SL_MAX_STOP_BYTES)
        sl = char_start(text, a + SL_MAX_STOP_BYTES) - a;
      memcpy(stops[i], text + a, sl);
      stops[i][sl] = 0;
    } else if (kind == 1) { /* a long run and a tail: KMP's fallbacks */
      size_t run = 1 + rnd() % (SL_MAX_STOP_BYTES - 8);
      for (; sl < run; sl++)
        stops[i][sl] = 'a';
      sl = rand_chars(stops[i], sl, SL_MAX_STOP_BYTES + 1, 1, k);
    } else { /* short, over the same few characters: overlapping */
      sl = rand_chars(stops[i], 0, SL_MAX_STOP_BYTES + 1, 1 + (int)(rnd() % 6),
                      k);
    }
    if (sl == 0)
      sl = rand_chars(stops[i], 0, SL_MAX_STOP_BYTES + 1, 1, k);
    SL_ASSERT(sl > 0 && sl <= SL_MAX_STOP_BYTES);
    sp[i] = stops[i];
  }
  sl__req r;
  memset(&r, 0, sizeof r);
  CHECK_OK(sl__stops_init(&r.stops, sp, n_stop));
  ref rf = {.n = n_stop};
  for (int i = 0; i < n_stop; i++)
    rf.stop[i] = sp[i];

  bool ok = true, stopped = false;
  size_t pos = 0;
  while (ok) {
    size_t n = rnd() % 13; /* may be 0: a token without text */
    if (n > tlen - pos)
      n = tlen - pos;
    size_t e_got, e_want;
    bool s_got;
    if (sl__detok_append(&r, text + pos, n, &e_got, &s_got) != SL_OK) {
      CHECK_MSG(false, "out of memory");
      break;
    }
    bool s_want = ref_step(&rf, text + pos, n, &e_want);
    pos += n;
    if (s_got != s_want || e_got != e_want ||
        memcmp(r.pend, rf.pend, e_want) != 0) {
      CHECK_MSG(false,
                "trial %d at byte %zu: emit %zu stop %d, reference emit %zu "
                "stop %d",
                trial, pos, e_got, s_got, e_want, s_want);
      ok = false;
    }
    sl__detok_consume(&r, e_got, s_got);
    ref_consume(&rf, e_want);
    stopped = s_got;
    g_stopped += s_got;
    if (!s_got && (int)(r.pend_len) > g_max_hold)
      g_max_hold = (int)r.pend_len;
    if (s_got || pos == tlen)
      break;
  }
  /* what is left (flushed at the end of the request) matches too */
  if (ok && !stopped &&
      (r.pend_len != rf.len || memcmp(r.pend, rf.pend, rf.len) != 0)) {
    CHECK_MSG(false, "trial %d: %zu bytes left, reference %zu", trial,
              r.pend_len, rf.len);
    ok = false;
  }
  sl_free(r.pend);
  return ok;
}

static void test_random_against_reference(void) {
  int bad = 0;
  for (int t = 0; t < 20000 && bad < 5; t++)
    bad += !one_case(t);
  CHECK_EQ_INT(bad, 0);
  fprintf(stderr, "   %d of 20000 cases stopped; up to %d bytes held back\n",
          g_stopped, g_max_hold);
  CHECK(g_stopped > 5000 && g_stopped < 19000);
  CHECK(g_max_hold > SL_MAX_STOP_BYTES / 2);
}

/* A stop string split over every pair of pieces, at the text's start and
 * after a near miss that shares its prefix. */
static void test_split_everywhere(void) {
  static const char *const stop = "ab\xe2\x82\xac"
                                  "ab!";
  static const char *const text = "xab\xe2\x82\xac"
                                  "ab\xe2\x82\xac"
                                  "ab!tail";
  size_t tl = strlen(text), want_cut = 6; /* the second "ab€" */
  for (size_t a = 0; a <= tl; a++)
    for (size_t b = a; b <= tl; b++) {
      sl__req r;
      memset(&r, 0, sizeof r);
      const char *sp[1] = {stop};
      CHECK_OK(sl__stops_init(&r.stops, sp, 1));
      size_t cuts[3] = {a, b - a, tl - b}, pos = 0, out = 0, emit;
      bool stopped = false;
      for (int i = 0; i < 3 && !stopped; i++) {
        CHECK_OK(sl__detok_append(&r, text + pos, cuts[i], &emit, &stopped));
        out += emit;
        sl__detok_consume(&r, emit, stopped);
        pos += cuts[i];
      }
      CHECK_MSG(stopped && out == want_cut, "pieces %zu %zu: stop %d at %zu", a,
                b, stopped, out);
      sl_free(r.pend);
    }
}

static void test_init_limits(void) {
  sl__stops m;
  char big[SL_MAX_STOP_BYTES + 2];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = 0;
  const char *too_long[1] = {big};
  CHECK(sl__stops_init(&m, too_long, 1) == SL_ERR_INVALID_ARG);
  big[SL_MAX_STOP_BYTES] = 0; /* exactly the limit */
  CHECK_OK(sl__stops_init(&m, too_long, 1));
  const char *empty[1] = {""};
  CHECK(sl__stops_init(&m, empty, 1) == SL_ERR_INVALID_ARG);
  const char *many[SL_MAX_STOP + 1];
  for (int i = 0; i <= SL_MAX_STOP; i++)
    many[i] = "s";
  CHECK(sl__stops_init(&m, many, SL_MAX_STOP + 1) == SL_ERR_INVALID_ARG);
  CHECK_OK(sl__stops_init(&m, many, SL_MAX_STOP));
}

int main(void) {
  RUN(test_init_limits);
  RUN(test_split_everywhere);
  RUN(test_random_against_reference);
  return sl_test_finish();
}
