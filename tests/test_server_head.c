/* The door's request head check (src/server/head.c):
 *   - every strict prefix of a valid head is "more", never "bad" (the door
 *     judges bytes as they arrive: a valid request cut anywhere by TCP
 *     must not be refused), and the whole head is "ok" with its length;
 *   - each kind of invalid head is refused with its status, and as early
 *     as its first impossible byte;
 *   - the target decides the error's shape (/v1/messages and below). */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "server/server_impl.h"

static int check(const char *p, size_t n, sl_srv_head_info *hi,
                 sl_srv_error *e) {
  return sl__srv_head_check(p, n, hi, e);
}

static const char *const k_good[] = {
    "GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "GET /health HTTP/1.0\r\n\r\n",
    "GET /health HTTP/1.1\nHost: x\n\n",
    "POST /v1/messages?beta=true HTTP/1.1\r\nHost: a.b:8080\r\n"
    "Content-Type: application/json\r\nContent-Length:  42\r\n"
    "X-Empty:\r\nUser-Agent: A/1 (\xc3\xa9)\r\n\r\n",
    "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
};

#define BAD(h, st, at)                                                         \
  { h, sizeof(h) - 1, st, at }
static const struct {
  const char *head;
  size_t len;
  int status;
  size_t by; /* refused by this many bytes at the latest (0: the whole) */
} k_bad[] = {
    BAD("GARBAGE\r\n\r\n", 400, 0),
    BAD("\x16\x03\x01\x02\x00", 400, 1),
    BAD("GET  /x HTTP/1.1\r\n\r\n", 400, 5),
    BAD("GET /x HTTP/1.1 \r\n\r\n", 400, 16),
    BAD("GET /x HTTP/2.0\r\n\r\n", 505, 15),
    BAD("GET /x HTTQ/1.1\r\n\r\n", 400, 11),
    BAD("GET /x\x01y HTTP/1.1\r\n\r\n", 400, 7),
    BAD("GET /x HTTP/1.1\r\n folded\r\n\r\n", 400, 18),
    BAD("GET /x HTTP/1.1\r\nHost : x\r\n\r\n", 400, 22),
    BAD("GET /x HTTP/1.1\r\nNo colon\r\n\r\n", 400, 20),
    BAD("GET /x HTTP/1.1\r\nA: b\x00c\r\n\r\n", 400, 23),
    BAD("GET /x HTTP/1.1\r\nA: b\rc\r\n\r\n", 400, 24),
    BAD("GET /x HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", 400, 35),
    BAD("GET /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, 34),
    /* libmicrohttpd keeps the trailing blank, then fails the number */
    BAD("GET /x HTTP/1.1\r\nContent-Length: 42 \r\n\r\n", 400, 36),
};

int main(void) {
  sl_srv_head_info hi;
  sl_srv_error e;
  for (size_t g = 0; g < sizeof k_good / sizeof *k_good; g++) {
    const char *h = k_good[g];
    size_t n = strlen(h);
    for (size_t k = 0; k < n; k++)
      CHECK(check(h, k, &hi, &e) == SL_SRV_HEAD_MORE);
    CHECK(check(h, n, &hi, &e) == SL_SRV_HEAD_OK && hi.len == n);
    /* bytes of a body after the head do not change the verdict */
    char buf[512];
    snprintf(buf, sizeof buf, "%s{\"x\":1}\r\n\x01", h);
    CHECK(check(buf, strlen(buf), &hi, &e) == SL_SRV_HEAD_OK && hi.len == n);
  }
  for (size_t b = 0; b < sizeof k_bad / sizeof *k_bad; b++) {
    const char *h = k_bad[b].head;
    size_t n = k_bad[b].len, first = 0;
    /* "more" until one byte decides, then "bad" with the same status */
    for (size_t k = 1; k <= n && !first; k++)
      if (check(h, k, &hi, &e) != SL_SRV_HEAD_MORE)
        first = k;
    CHECK_MSG(first && (!k_bad[b].by || first <= k_bad[b].by),
              "bad head %zu decided at %zu", b, first);
    for (size_t k = first; k && k <= n; k++)
      CHECK(check(h, k, &hi, &e) == SL_SRV_HEAD_BAD &&
            e.http == k_bad[b].status);
  }
  /* sizes: a target over 8 KiB is 414 before its end; a head over 16 KiB
   * without its end is 431 */
  static char big[40000];
  memcpy(big, "GET /", 5);
  memset(big + 5, 'a', 9000);
  CHECK(check(big, 5 + SL_SRV_TARGET_MAX + 1, &hi, &e) == SL_SRV_HEAD_BAD &&
        e.http == 414);
  size_t n = (size_t)snprintf(big, sizeof big, "GET /x HTTP/1.1\r\n");
  while (n < SL_SRV_HEAD_MAX + 100) /* long fields: fewer than 100 */
    n += (size_t)snprintf(big + n, sizeof big - n, "X-Pad: %0200d\r\n", 7);
  CHECK(check(big, SL_SRV_HEAD_MAX, &hi, &e) == SL_SRV_HEAD_MORE);
  CHECK(check(big, n, &hi, &e) == SL_SRV_HEAD_BAD && e.http == 431);
  /* fields: 100 pass, the 101st is 431 as soon as its line ends */
  n = (size_t)snprintf(big, sizeof big, "GET /x HTTP/1.1\r\n");
  for (int i = 0; i < SL_SRV_FIELDS_MAX; i++)
    n += (size_t)snprintf(big + n, sizeof big - n, "X-%d: 1\r\n", i);
  size_t hundred = n;
  n += (size_t)snprintf(big + n, sizeof big - n, "\r\n");
  CHECK(check(big, n, &hi, &e) == SL_SRV_HEAD_OK);
  n = hundred +
      (size_t)snprintf(big + hundred, sizeof big - hundred, "X-last: 1\r\n");
  CHECK(check(big, n - 1, &hi, &e) == SL_SRV_HEAD_MORE);
  CHECK(check(big, n, &hi, &e) == SL_SRV_HEAD_BAD && e.http == 431);
  /* a chunked body's first chunk line (max 8 MiB): a size over it is 413
   * from its digits, before the line ends */
  static const struct {
    const char *s;
    int r, http;
  } chunks[] = {
      {"ffffffffffffffff", SL_SRV_HEAD_BAD, 413},
      {"fffffffffffffffffffffffff\r\n", SL_SRV_HEAD_BAD, 413},
      {"800001\r\n", SL_SRV_HEAD_BAD, 413},
      {"8000010", SL_SRV_HEAD_BAD, 413},
      {"800000\r\n", SL_SRV_HEAD_OK, 0},
      {"1a\r\n{\"model\"", SL_SRV_HEAD_OK, 0},
      {"5;name=value\r\n", SL_SRV_HEAD_OK, 0},
      {"0\r\n\r\n", SL_SRV_HEAD_OK, 0},
      {"", SL_SRV_HEAD_MORE, 0},
      {"1", SL_SRV_HEAD_MORE, 0},
      {"80000", SL_SRV_HEAD_MORE, 0},
      {"5 ;x", SL_SRV_HEAD_MORE, 0},
      {"zz\r\n", SL_SRV_HEAD_BAD, 400},
      {"\r\n", SL_SRV_HEAD_BAD, 400},
  };
  for (size_t i = 0; i < sizeof chunks / sizeof *chunks; i++) {
    memset(&e, 0, sizeof e);
    int r = sl__srv_chunk_check(chunks[i].s, strlen(chunks[i].s), 8u << 20, &e);
    CHECK_MSG(r == chunks[i].r && e.http == chunks[i].http,
              "chunk line %zu: %d %d", i, r, e.http);
  }
  /* a line end never coming within SL_SRV_CHUNK_LINE_MAX: left to
   * libmicrohttpd */
  memset(big, '1', SL_SRV_CHUNK_LINE_MAX);
  big[0] = '5', big[1] = ';';
  CHECK(sl__srv_chunk_check(big, SL_SRV_CHUNK_LINE_MAX, 8u << 20, &e) ==
        SL_SRV_HEAD_OK);
  /* the head notes chunked (any case, blanks around) and Expect */
  static const char ch[] = "POST /x HTTP/1.1\r\nTransfer-Encoding:  Chunked "
                           "\r\nExpect: 100-continue\r\n\r\n";
  CHECK(check(ch, strlen(ch), &hi, &e) == SL_SRV_HEAD_OK && hi.chunked &&
        hi.expect);
  static const char gz[] =
      "POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n";
  CHECK(check(gz, strlen(gz), &hi, &e) == SL_SRV_HEAD_OK && !hi.chunked &&
        !hi.expect);
  /* the shape follows the target */
  static const char *const ant[] = {
      "POST /v1/messages HTTP/1.1\r\nA b\r\n\r\n",
      "POST /v1/messages/count_tokens HTTP/1.1\r\nA b\r\n\r\n",
      "POST /v1/messages?x HTTP/1.1\r\nA b\r\n\r\n"};
  for (size_t i = 0; i < 3; i++)
    CHECK(check(ant[i], strlen(ant[i]), &hi, &e) == SL_SRV_HEAD_BAD &&
          hi.anthropic);
  static const char oai[] = "POST /v1/messagesXYZ HTTP/1.1\r\nA b\r\n\r\n";
  CHECK(check(oai, strlen(oai), &hi, &e) == SL_SRV_HEAD_BAD && !hi.anthropic);
  return sl_test_finish();
}
