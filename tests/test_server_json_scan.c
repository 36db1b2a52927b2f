/* The request body's shape limits (issue 10, item 5; json_scan.c), through
 * sl__srv_parse: nesting past SL__JSON_MAX_DEPTH, more than
 * SL__JSON_MAX_CONTAINERS objects and arrays or SL__JSON_MAX_ELEMENTS
 * elements, and an unknown top-level field over SL__JSON_MAX_UNKNOWN_FIELD
 * bytes each get a 400 with their own code before jansson allocates
 * anything; bodies just inside each limit, known fields of any size, and
 * brackets, commas and escaped quotes inside strings pass; nothing leaks. */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "server/server_impl.h"
#include "sluice/util.h"

static const char *names[] = {"m"};
static const sl_srv_limits lim = {.model_names = names,
                                  .n_model_names = 1,
                                  .n_ctx = 2048,
                                  .chat_template = NULL,
                                  .toolfmt = SL_TOOLFMT_NONE};

static const char *k_head = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                            "\"content\":\"hi\"}]";

/* k_head + ",\"<key>\":" + open + n x unit (joined by sep) + close + "}" */
static char *body_with(const char *key, const char *open, const char *unit,
                       const char *sep, const char *close, int n) {
  size_t cap = strlen(k_head) + strlen(key) + 16 + strlen(open) +
               strlen(close) + (size_t)n * (strlen(unit) + strlen(sep));
  char *b = sl_malloc(cap);
  SL_ASSERT(b);
  size_t o = (size_t)sprintf(b, "%s,\"%s\":%s", k_head, key, open);
  for (int i = 0; i < n; i++) {
    o += (size_t)sprintf(b + o, "%s%s", i ? sep : "", unit);
  }
  sprintf(b + o, "%s}", close);
  return b;
}

/* The parse's status and error code (empty when it passed). */
static sl_status parse_code(const char *body, char *code, size_t cap) {
  sl_srv_request r;
  sl_srv_error e;
  sl_status st = sl__srv_parse(SL_SRV_CHAT, body, strlen(body), &lim, &r, &e);
  snprintf(code, cap, "%s", st == SL_OK ? "" : e.code);
  if (st == SL_OK)
    sl__srv_request_free(&r);
  else
    CHECK_MSG(e.http == 400 || e.http == 404, "http %d (%s)", e.http,
              e.message);
  return st;
}

static void expect(const char *what, char *body, const char *want_code) {
  char code[64];
  parse_code(body, code, sizeof code);
  if (want_code)
    CHECK_MSG(strcmp(code, want_code) == 0, "%s: code '%s', want '%s'", what,
              code, want_code);
  else
    CHECK_MSG(strcmp(code, "json_too_deep") != 0 &&
                  strcmp(code, "json_too_complex") != 0 &&
                  strcmp(code, "unknown_parameter") != 0,
              "%s: refused by the shape limits (%s)", what, code);
  sl_free(body);
}

static char *nested(int depth) {
  /* the user field, known: depth counts the top-level object too */
  char *b = sl_malloc((size_t)depth * 2 + 64);
  SL_ASSERT(b);
  size_t o = (size_t)sprintf(b, "{\"model\":\"m\",\"user\":");
  for (int i = 1; i < depth; i++)
    b[o++] = '[';
  for (int i = 1; i < depth; i++)
    b[o++] = ']';
  b[o++] = '}';
  b[o] = 0;
  return b;
}

static void test_limits(void) {
  size_t live = sl_malloc_live_bytes();
  expect("depth at the limit", nested(SL__JSON_MAX_DEPTH), NULL);
  expect("depth past the limit", nested(SL__JSON_MAX_DEPTH + 1),
         "json_too_deep");
  /* the head has 3 containers (the object, messages, its message) */
  expect("containers at the limit",
         body_with("user", "[", "{}", ",", "]", SL__JSON_MAX_CONTAINERS - 4),
         NULL);
  expect("containers past the limit",
         body_with("user", "[", "{}", ",", "]", SL__JSON_MAX_CONTAINERS - 3),
         "json_too_complex");
  /* the head has 2 commas; the tail's n units add n - 1, plus its own 1 */
  expect("elements at the limit",
         body_with("user", "[", "1", ",", "]", SL__JSON_MAX_ELEMENTS - 2),
         NULL);
  expect("elements past the limit",
         body_with("user", "[", "1", ",", "]", SL__JSON_MAX_ELEMENTS - 1),
         "json_too_complex");
  /* an unknown field's value: at the limit, past it; a known one past it */
  int n = SL__JSON_MAX_UNKNOWN_FIELD - 2;
  expect("unknown field at the limit",
         body_with("junk", "\"", "x", "", "\"", n), NULL);
  expect("unknown field past the limit",
         body_with("junk", "\"", "x", "", "\"", n + 1), "unknown_parameter");
  expect("unknown field, a large array, last",
         body_with("junk", "[", "\"abcdefgh\"", ",", "]", 10000),
         "unknown_parameter");
  expect("known field past the size",
         body_with("user", "\"", "x", "", "\"", n + 1), NULL);
  /* structure inside strings is not structure */
  expect("brackets in a string",
         body_with("user", "\"", "[{[{,\\\"]}]}:", "", "\"", 30000), NULL);
  /* an unknown field's key spelled with an escaped quote is still one key */
  expect("escaped key", body_with("ju\\\"nk", "\"", "x", "", "\"", n + 1),
         "unknown_parameter");
  CHECK_EQ_INT(sl_malloc_live_bytes(), live);
}

/* Truncated and malformed bodies get jansson's own 400, never a crash. */
static void test_malformed(void) {
  const char *bodies[] = {"{\"model\":\"m\",\"junk\":\"\\",
                          "{\"model\":\"m\",\"junk\":[[[[",
                          "]]]]}}}}",
                          "{\"a\"",
                          "\"",
                          "{\"model\":\"m\",\"x\" :   ",
                          ""};
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    char code[64];
    CHECK(parse_code(bodies[i], code, sizeof code) != SL_OK);
    CHECK_MSG(strcmp(code, "invalid_json") == 0, "body %zu: code '%s'", i,
              code);
  }
}

int main(void) {
  RUN(test_limits);
  RUN(test_malformed);
  return sl_test_finish();
}
