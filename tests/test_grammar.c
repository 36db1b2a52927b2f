/* The grammar engine (constrained decoding): GBNF compiled or refused with a
 * message (ill-formed UTF-8 in its text among the refusals); sentences
 * accepted and others refused, repetitions, classes, UTF-8 split across
 * calls; and the token mask checked against brute force (every token of the
 * default model's vocabulary fed to a matcher at the same point) at several
 * points of a JSON grammar. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "default_model.h"
#include "harness.h"
#include "sluice/grammar.h"
#include "sluice/util.h"

static sl_grammar_t *compile(const char *src) {
  sl_grammar_t *g = NULL;
  char err[256];
  sl_status st =
      sl_grammar_compile(src, strlen(src), NULL, &g, err, sizeof err);
  if (st != SL_OK)
    fprintf(stderr, "compile: %s\n", err);
  return g;
}

/* Whether the whole of text is a sentence of g (fed in one call, or a byte
 * at a time). */
static bool matches(sl_grammar_t *g, const char *text, bool bytewise) {
  sl_grammar_matcher_t *m = sl_grammar_matcher_create(g);
  bool ok = true;
  size_t n = strlen(text);
  if (bytewise)
    for (size_t i = 0; ok && i < n; i++)
      ok = sl_grammar_matcher_accept(m, text + i, 1);
  else
    ok = sl_grammar_matcher_accept(m, text, n);
  ok = ok && sl_grammar_matcher_done(m);
  sl_grammar_matcher_free(m);
  return ok;
}

static void test_errors(void) {
  static const char *bad[] = {
      "root ::= foo",                              /* undefined */
      "root ::= root \"a\" | \"b\"",               /* left recursion */
      "root ::= a\na ::= b? a \"x\"\nb ::= \"y\"", /* left, through b? */
      "root ::= \"abc",                            /* unterminated */
      "root ::= [abc",
      "root ::= []",
      "root ::= (\"a\"",
      "root ::= \"a\")",
      "root ::= [z-a]",
      "root ::= \"a\"{3,1}",
      "root ::= \"\\q\"",
      "other ::= \"a\"", /* no root */
      "root ::= \"a\"\nroot ::= \"b\"",
      "::= \"a\"",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    sl_grammar_t *g = NULL;
    char err[256] = "";
    CHECK(sl_grammar_compile(bad[i], strlen(bad[i]), NULL, &g, err,
                             sizeof err) == SL_ERR_FORMAT);
    CHECK(g == NULL && strncmp(err, "grammar: ", 9) == 0);
  }
}

/* The grammar's own text is well-formed UTF-8 or refused: an overlong form,
 * a surrogate or a value past U+10FFFF in a literal or a class would be a
 * character no model output can spell (the matcher takes well-formed UTF-8
 * only), and an overlong one reads as another character ("s", "/"). */
static void test_source_utf8(void) {
  static const char *bad[] = {
      "root ::= \"\xc1\xb3\"",         /* "s" in two bytes */
      "root ::= \"\xc0\xaf\"",         /* "/" in two bytes */
      "root ::= \"\xe0\x81\xb3\"",     /* "s" in three */
      "root ::= \"\xf0\x80\x81\xb3\"", /* "s" in four */
      "root ::= \"a\xe0\x9f\xbf\"",    /* U+07FF in three */
      "root ::= [\xc0\x80-\xc1\xbf]",  /* overlong in a class */
      "root ::= [a-\xe0\x80\x80]",     /* overlong at a range's end */
      "root ::= \"\xed\xa0\x80\"",     /* surrogate U+D800 */
      "root ::= \"\xf4\x90\x80\x80\"", /* U+110000 */
      "root ::= \"\xf5\x80\x80\x80\"", /* no such lead byte */
      "root ::= \"\xc3\"",             /* cut short */
      "root ::= \"\xc3\x41\"",         /* not a continuation */
      "root ::= \"\x80\"",             /* a lone continuation */
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    sl_grammar_t *g = NULL;
    char err[256] = "";
    CHECK_MSG(sl_grammar_compile(bad[i], strlen(bad[i]), NULL, &g, err,
                                 sizeof err) == SL_ERR_FORMAT,
              "source %zu", i);
    CHECK_MSG(g == NULL && strncmp(err, "grammar: invalid UTF-8", 22) == 0,
              "source %zu: %s", i, err);
    sl_grammar_unref(g);
  }
  /* the shortest forms compile, and match themselves */
  static const char *good[] = {
      "\xc2\x80",     "\xdf\xbf",         "\xe0\xa0\x80",    "\xed\x9f\xbf",
      "\xee\x80\x80", "\xf0\x90\x80\x80", "\xf4\x8f\xbf\xbf"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    char src[64];
    snprintf(src, sizeof src, "root ::= \"%s\" [%s]", good[i], good[i]);
    sl_grammar_t *g = compile(src);
    CHECK_MSG(g != NULL, "good %zu", i);
    if (!g)
      continue;
    char text[16];
    snprintf(text, sizeof text, "%s%s", good[i], good[i]);
    CHECK_MSG(matches(g, text, false) && matches(g, text, true), "good %zu", i);
    sl_grammar_unref(g);
  }
}

static void test_sentences(void) {
  sl_grammar_t *g = compile("root ::= \"a\" [b-d]+ (\"x\" | \"yz\")? tail\n"
                            "tail ::= [^\\n]{0,2} # a comment\n");
  CHECK(g != NULL);
  static const char *yes[] = {"ab",   "abcd",   "abx",       "abyz",
                              "abbq", "abyz!!", "ad\xc3\xa9"};
  static const char *no[] = {"a", "b", "abyz!!!", "ab\n", "ae", ""};
  for (int bw = 0; bw < 2; bw++) {
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
      CHECK(matches(g, yes[i], bw));
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
      CHECK(!matches(g, no[i], bw));
  }
  sl_grammar_unref(g);

  g = compile("root ::= \"a\"{2,3} \"b\"{2} \"c\"{1,} [\\u00e9\\x41]*");
  CHECK(g && matches(g, "aabbc", false) && matches(g, "aaabbccc", false));
  CHECK(matches(g,
                "aabbc\xc3\xa9"
                "A",
                true));
  CHECK(!matches(g, "abbc", false) && !matches(g, "aaaabbc", false) &&
        !matches(g, "aabc", false) && !matches(g, "aabb", false));
  sl_grammar_unref(g);

  /* done and complete */
  g = compile("root ::= \"ab\" \"c\"?");
  sl_grammar_matcher_t *m = sl_grammar_matcher_create(g);
  CHECK(!sl_grammar_matcher_done(m));
  CHECK(sl_grammar_matcher_accept(m, "ab", 2));
  CHECK(sl_grammar_matcher_done(m) && !sl_grammar_matcher_complete(m));
  CHECK(!sl_grammar_matcher_accept(m, "x", 1)); /* refused: state kept */
  CHECK(sl_grammar_matcher_accept(m, "c", 1));
  CHECK(sl_grammar_matcher_complete(m));
  /* a code point split over two calls */
  sl_grammar_matcher_free(m);
  sl_grammar_unref(g);
  g = compile("root ::= [\\u00e0-\\u00ff]+");
  m = sl_grammar_matcher_create(g);
  CHECK(sl_grammar_matcher_accept(m, "\xc3", 1));
  CHECK(!sl_grammar_matcher_done(m));
  CHECK(sl_grammar_matcher_accept(m, "\xa9", 1) && sl_grammar_matcher_done(m));
  CHECK(!sl_grammar_matcher_accept(m, "\xc2", 1)); /* U+0080..00BF: out */
  CHECK(!sl_grammar_matcher_accept(m, "\xff", 1)); /* not UTF-8 */
  sl_grammar_matcher_free(m);
  sl_grammar_unref(g);
  /* overlong encodings of ASCII never pass as the character: "s" is
   * E0 81 B3 or C1 B3 spelled long, which a model can emit byte by byte */
  g = compile("root ::= \"s\" [\\x00-\\U0010FFFF]*");
  m = sl_grammar_matcher_create(g);
  CHECK(!sl_grammar_matcher_accept(m, "\xe0\x81\xb3", 3));
  CHECK(!sl_grammar_matcher_accept(m, "\xe0", 1));
  CHECK(!sl_grammar_matcher_accept(m, "\xc1\xb3", 2));
  CHECK(sl_grammar_matcher_accept(m, "s", 1));
  /* where any code point may come: still no overlong spelling */
  CHECK(!sl_grammar_matcher_accept(m, "\xe0\x81\xb3", 3));
  CHECK(!sl_grammar_matcher_accept(m, "\xf0\x80\x81\xb3", 4));
  CHECK(sl_grammar_matcher_accept(m, "\xe0\xa0\x80", 3));  /* U+0800 */
  CHECK(!sl_grammar_matcher_accept(m, "\xed\xa0\x80", 3)); /* U+D800 */
  CHECK(!sl_grammar_matcher_accept(m, "\xf4\x90\x80\x80", 4));
  CHECK(sl_grammar_matcher_accept(m, "\xf4\x8f\xbf\xbf", 4)); /* 10FFFF */
  CHECK(sl_grammar_matcher_accept(m, "\xe2\x82", 2));
  CHECK(!sl_grammar_matcher_done(m));
  CHECK(sl_grammar_matcher_accept(m, "\xac", 1) && sl_grammar_matcher_done(m));
  sl_grammar_matcher_free(m);
  sl_grammar_unref(g);
}

/* A JSON grammar as constrained decoding uses it. */
static const char *JSON_G =
    "root ::= ws value ws\n"
    "value ::= object | array | string | number | \"true\" | \"false\" | "
    "\"null\"\n"
    "object ::= \"{\" ws ( member ( ws \",\" ws member )* )? ws \"}\"\n"
    "member ::= string ws \":\" ws value\n"
    "array ::= \"[\" ws ( value ( ws \",\" ws value )* )? ws \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | "
    "\"u\" [0-9a-fA-F]{4} ) )* \"\\\"\"\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] "
    "[-+]? [0-9]+ )?\n"
    "ws ::= [ \\t\\n]{0,8}\n";

static void test_json(void) {
  sl_grammar_t *g = compile(JSON_G);
  CHECK(g != NULL);
  static const char *yes[] = {"{}",
                              "[]",
                              "{\"a\": [1, 2.5, -3e+2, true, null]}",
                              " \"x\\u00e9\\n\" ",
                              "{\"k\":{\"n\":{\"m\":[[[]]]}}}",
                              "0",
                              "\"caf\xc3\xa9\""};
  static const char *no[] = {"{",          "{\"a\" 1}", "[1,]",     "01", "\"a",
                             "{\"a\":1}}", "tru",       "\"\x01\"", "1.", "-"};
  for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
    CHECK(matches(g, yes[i], i % 2));
  for (size_t i = 0; i < sizeof no / sizeof *no; i++)
    CHECK(!matches(g, no[i], i % 2));
  sl_grammar_unref(g);
}

/* The mask against brute force: at each point of `prefix`, a token is
 * allowed exactly when a matcher at that point accepts its bytes (EOG
 * tokens exactly when the text so far is done). */
static void test_mask(void) {
  sl_model_t *model;
  sl_tokenizer_t *tok;
  if (load_default_model(&model, &tok) != 0) {
    printf("   (no model: mask test skipped)\n");
    return;
  }
  sl_grammar_vocab_t *v = sl_grammar_vocab_create(tok);
  CHECK(v != NULL);
  size_t nv = sl_tokenizer_vocab_size(tok);
  uint8_t *allowed = malloc(nv);
  sl_grammar_t *g = compile(JSON_G);
  static const char *points[] = {"",
                                 "{",
                                 "{\"na",
                                 "{\"name\": ",
                                 "{\"name\": \"caf\xc3",
                                 "{\"name\": \"x\", \"n\": [1, 2",
                                 "[true",
                                 "{\"a\": {}}"};
  char piece[512];
  for (size_t k = 0; k < sizeof points / sizeof *points; k++) {
    sl_grammar_matcher_t *m = sl_grammar_matcher_create(g);
    CHECK(sl_grammar_matcher_accept(m, points[k], strlen(points[k])));
    uint64_t t0 = sl_now_ns();
    size_t n = sl_grammar_matcher_mask(m, v, tok, allowed);
    double ms = (double)(sl_now_ns() - t0) / 1e6;
    size_t want = 0, diff = 0;
    for (size_t id = 0; id < nv; id++) {
      size_t len = 0;
      bool ok;
      if (sl_tokenizer_is_eog(tok, (int32_t)id)) {
        ok = sl_grammar_matcher_done(m);
      } else if (sl_tokenizer_token_to_piece(tok, (int32_t)id, false, piece,
                                             sizeof piece, &len) != SL_OK ||
                 len == 0) {
        ok = false;
      } else {
        sl_grammar_matcher_t *b = sl_grammar_matcher_create(g);
        ok = sl_grammar_matcher_accept(b, points[k], strlen(points[k])) &&
             sl_grammar_matcher_accept(b, piece, len);
        sl_grammar_matcher_free(b);
      }
      want += ok;
      diff += ok != (allowed[id] != 0);
    }
    printf("   after %-32.32s %6zu allowed (brute force %6zu, %zu differ), "
           "mask %.2f ms\n",
           points[k], n, want, diff, ms);
    CHECK(n == want && diff == 0 && n > 0);
    CHECK(!sl_grammar_matcher_overrun(m));
    sl_grammar_matcher_free(m);
  }
  /* the grammar's cache of masks by state: along a text, each mask of one
   * matcher (cached where the state came back) equals a fresh matcher's
   * on a grammar compiled anew (an empty cache) at the same point; inside
   * the string most are copies */
  const char *text = "{\"name\": \"hello there world\", \"n\": [1, 22]}";
  uint8_t *fresh = malloc(nv);
  sl_grammar_matcher_t *m = sl_grammar_matcher_create(g);
  double t_cached = 0, t_fresh = 0;
  for (size_t i = 0; i <= strlen(text); i++) {
    if (i)
      CHECK(sl_grammar_matcher_accept(m, text + i - 1, 1));
    uint64_t t0 = sl_now_ns();
    size_t n1 = sl_grammar_matcher_mask(m, v, tok, allowed);
    t_cached += (double)(sl_now_ns() - t0) / 1e6;
    sl_grammar_t *g2 = compile(JSON_G); /* its own, empty cache */
    sl_grammar_matcher_t *f = sl_grammar_matcher_create(g2);
    CHECK(sl_grammar_matcher_accept(f, text, i));
    t0 = sl_now_ns();
    size_t n2 = sl_grammar_matcher_mask(f, v, tok, fresh);
    t_fresh += (double)(sl_now_ns() - t0) / 1e6;
    sl_grammar_matcher_free(f);
    sl_grammar_unref(g2);
    CHECK(n1 == n2 && !memcmp(allowed, fresh, nv));
  }
  printf("   along %zu bytes: masks %.1f ms with the cache, %.1f ms without\n",
         strlen(text), t_cached, t_fresh);
  /* grammars shared by text: one compiled grammar, one cache for all */
  {
    char err[256];
    sl_grammar_t *s1 = NULL, *s2 = NULL, *s3 = NULL;
    CHECK_OK(sl_grammar_compile_shared(JSON_G, strlen(JSON_G), &s1, err,
                                       sizeof err));
    CHECK_OK(sl_grammar_compile_shared(JSON_G, strlen(JSON_G), &s2, err,
                                       sizeof err));
    CHECK(s1 == s2);
    CHECK_OK(
        sl_grammar_compile_shared("root ::= \"x\"", 12, &s3, err, sizeof err));
    CHECK(s3 != s1);
    sl_grammar_t *s4 = NULL; /* a bad text: an error, nothing kept */
    CHECK(sl_grammar_compile_shared("root ::= (", 10, &s4, err, sizeof err) ==
              SL_ERR_FORMAT &&
          s4 == NULL);
    sl_grammar_matcher_t *a = sl_grammar_matcher_create(s1);
    sl_grammar_matcher_t *b = sl_grammar_matcher_create(s2);
    CHECK(sl_grammar_matcher_accept(a, "{\"k\": \"ab", 9));
    CHECK(sl_grammar_matcher_accept(b, "{\"q\": \"zz", 9));
    uint64_t t0 = sl_now_ns();
    size_t na = sl_grammar_matcher_mask(a, v, tok, allowed);
    double ta = (double)(sl_now_ns() - t0) / 1e6;
    t0 = sl_now_ns();
    size_t nb = sl_grammar_matcher_mask(b, v, tok, fresh);
    double tb = (double)(sl_now_ns() - t0) / 1e6;
    CHECK(na == nb && !memcmp(allowed, fresh, nv)); /* the same state */
    printf("   a shared grammar: the state's mask %.2f ms, then %.2f ms for "
           "another matcher\n",
           ta, tb);
    sl_grammar_matcher_free(a);
    sl_grammar_matcher_free(b);
    sl_grammar_unref(s1);
    sl_grammar_unref(s2);
    sl_grammar_unref(s3);
  }
  sl_grammar_matcher_free(m);
  /* an ambiguous grammar (each x empty, or a character and four more x's:
   * the live parses multiply with every byte) stops at the mask's work
   * budget or a byte's expansion budget, a fraction of a second, instead
   * of running for hours (a
   * request with this grammar held an engine past 10 minutes for 50
   * tokens); the sequence is then ended as the client's error */
  static const char *const ambiguous[] = {
      "root ::= x x x x x x x x\nx ::= \"\" | . \"\" x x x x",
      "root ::= x x x x x x x x x x x x\nx ::= \"\" | . x x x x x x",
      /* each byte under the expansion budget, the mask past its own */
      "root ::= x x\nx ::= \"\" | . x x"};
  for (size_t k = 0; k < 3; k++) {
    sl_grammar_t *ga = compile(ambiguous[k]);
    sl_grammar_matcher_t *ma = sl_grammar_matcher_create(ga);
    CHECK(ma != NULL);
    if (!ma) {
      sl_grammar_unref(ga);
      continue;
    }
    uint64_t t0 = sl_now_ns(), w0 = sl_grammar_work_done();
    size_t n = sl_grammar_matcher_mask(ma, v, tok, allowed);
    double ms = (double)(sl_now_ns() - t0) / 1e6;
    uint64_t work = sl_grammar_work_done() - w0;
    printf("   an ambiguous grammar: mask %zu allowed, overrun %d, work %llu "
           "(budget %ld), %.0f ms\n",
           n, sl_grammar_matcher_overrun(ma), (unsigned long long)work,
           SL_GRAMMAR_MASK_WORK, ms);
    CHECK(n == 0 && sl_grammar_matcher_overrun(ma));
    /* the work done, counted where it is done, within the budget */
    CHECK(work <= 2 * (uint64_t)SL_GRAMMAR_MASK_WORK);
    sl_grammar_matcher_free(ma);
    sl_grammar_unref(ga);
  }
  free(fresh);
  sl_grammar_unref(g);
  free(allowed);
  sl_grammar_vocab_free(v);
  sl_tokenizer_free(tok);
  sl_model_free(model);
}

/* A repetition of many alternatives keeps each live parse: with 500
 * values ("item0" .. "item499") the parses after "item4" number ~600, and
 * a cap of 512 dropped some in silence ("item499" was refused at its last
 * byte); 2,000 values too. Past the cap a grammar is an overrun, never a
 * parse dropped (a mask then says so). */
static void test_many_alternatives(void) {
  for (int nalt = 500; nalt <= 2000; nalt += 1500) {
    size_t cap = 32 + (size_t)nalt * 16, o = 0;
    char *src = malloc(cap);
    if (!src)
      return;
    o += (size_t)snprintf(src + o, cap - o, "root ::= ( ");
    for (int i = 0; i < nalt; i++)
      o +=
          (size_t)snprintf(src + o, cap - o, "%s\"item%d\"", i ? " | " : "", i);
    snprintf(src + o, cap - o, " )+");
    sl_grammar_t *g = compile(src);
    free(src);
    CHECK(g != NULL);
    if (!g)
      return;
    char last[32], three[64];
    snprintf(last, sizeof last, "item%d", nalt - 1);
    snprintf(three, sizeof three, "item1item22item%d", nalt - 1);
    for (int bytewise = 0; bytewise < 2; bytewise++) {
      CHECK_MSG(matches(g, last, bytewise), "%d: %s", nalt, last);
      CHECK_MSG(matches(g, three, bytewise), "%d: %s", nalt, three);
      CHECK(matches(g, "item4item40item400", bytewise));
      CHECK(!matches(g, "item", bytewise) && !matches(g, "itemx", bytewise));
    }
    char past[32];
    snprintf(past, sizeof past, "item%d", nalt);
    CHECK(!matches(g, past, false));
    sl_grammar_unref(g);
  }
  /* 5,000 values: past the cap at the start, so no matcher (the server
   * answers that with a 400, "too ambiguous to follow"), rather than one
   * that silently knows only the first 4,096 */
  size_t cap = 32 + 5000 * 16, o = 0;
  char *src = malloc(cap);
  if (!src)
    return;
  o += (size_t)snprintf(src + o, cap - o, "root ::= ");
  for (int i = 0; i < 5000; i++)
    o += (size_t)snprintf(src + o, cap - o, "%s\"x%d\"", i ? " | " : "", i);
  sl_grammar_t *g = compile(src);
  free(src);
  CHECK(g != NULL);
  sl_grammar_matcher_t *m = g ? sl_grammar_matcher_create(g) : NULL;
  CHECK(m == NULL);
  sl_grammar_matcher_free(m);
  sl_grammar_unref(g);
}

int main(void) {
  RUN(test_errors);
  RUN(test_source_utf8);
  RUN(test_sentences);
  RUN(test_json);
  RUN(test_mask);
  RUN(test_many_alternatives);
  return sl_test_finish();
}
