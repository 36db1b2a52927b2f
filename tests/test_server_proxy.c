/* Clients behind a trusted proxy (src/server/proxy.c):
 *   - address ranges: IPv4 and IPv6, prefixes, bad ones refused;
 *   - PROXY v1 and v2 headers as HAProxy sends them: the client's address
 *     and the header's length; every strict prefix is "more"; malformed
 *     ones "bad"; HTTP bytes "none";
 *   - X-Forwarded-For: the rightmost address not trusted, several fields
 *     in order, ports, a forged entry left of the real one is ignored. */
#include <arpa/inet.h>
#include <string.h>

#include "harness.h"
#include "server/head.h"
#include "server/proxy.h"

static void v4(const char *s, uint8_t out[16]) {
  memset(out, 0, 16);
  out[10] = out[11] = 0xFF;
  inet_pton(AF_INET, s, out + 12);
}

static bool cidr(const char *s, sl_srv_cidr *c) {
  return sl__srv_cidr_parse(s, strlen(s), c);
}

static void test_cidr(void) {
  sl_srv_cidr c[3];
  uint8_t a[16];
  CHECK(cidr("10.0.0.0/8", &c[0]));
  CHECK(cidr("192.168.1.7", &c[1]));
  CHECK(cidr("fd00::/8", &c[2]));
  CHECK_EQ_INT(c[0].bits, 104);
  CHECK_EQ_INT(c[1].bits, 128);
  v4("10.200.3.4", a);
  CHECK(sl__srv_cidr_any(c, 3, a));
  v4("11.0.0.1", a);
  CHECK(!sl__srv_cidr_any(c, 3, a));
  v4("192.168.1.7", a);
  CHECK(sl__srv_cidr_any(c, 3, a));
  v4("192.168.1.8", a);
  CHECK(!sl__srv_cidr_any(c, 3, a));
  inet_pton(AF_INET6, "fd12::1", a);
  CHECK(sl__srv_cidr_any(c, 3, a));
  inet_pton(AF_INET6, "fe80::1", a);
  CHECK(!sl__srv_cidr_any(c, 3, a));
  /* a prefix that is not a multiple of 8, and host bits set in the range */
  CHECK(cidr("172.16.5.9/12", &c[0]));
  v4("172.31.255.255", a);
  CHECK(sl__srv_cidr_any(c, 1, a));
  v4("172.32.0.0", a);
  CHECK(!sl__srv_cidr_any(c, 1, a));
  CHECK(cidr("0.0.0.0/0", &c[0]));
  CHECK(sl__srv_cidr_any(c, 1, a));
  inet_pton(AF_INET6, "::1", a);
  CHECK(!sl__srv_cidr_any(c, 1, a)); /* an IPv4 range holds no IPv6 */
  CHECK(cidr("::/0", &c[0]));
  CHECK(sl__srv_cidr_any(c, 1, a));
  CHECK(!sl__srv_cidr_any(c, 0, a));
  static const char *const bad[] = {"",          "10.0.0.0/33", "10.0.0/8",
                                    "::1/129",   "10.0.0.0/",   "10.0.0.0/8x",
                                    "localhost", "1.2.3.4 ",    "10.0.0.0/-1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CHECK_MSG(!cidr(bad[i], &c[0]), "'%s' parsed as a range", bad[i]);
}

static void test_addr(void) {
  uint8_t a[16], want[16];
  v4("1.2.3.4", want);
  CHECK(sl__srv_addr_parse("1.2.3.4", 7, a) && !memcmp(a, want, 16));
  CHECK(sl__srv_addr_parse("1.2.3.4:8080", 12, a) && !memcmp(a, want, 16));
  inet_pton(AF_INET6, "2001:db8::5", want);
  CHECK(sl__srv_addr_parse("2001:db8::5", 11, a) && !memcmp(a, want, 16));
  CHECK(sl__srv_addr_parse("[2001:db8::5]", 13, a) && !memcmp(a, want, 16));
  CHECK(sl__srv_addr_parse("[2001:db8::5]:443", 17, a) && !memcmp(a, want, 16));
  CHECK(!sl__srv_addr_parse("unknown", 7, a));
  CHECK(!sl__srv_addr_parse("1.2.3.4:", 8, a));
  CHECK(!sl__srv_addr_parse("1.2.3.4:99999", 13, a));
  CHECK(!sl__srv_addr_parse("[2001:db8::5", 12, a));
  CHECK(!sl__srv_addr_parse("_hidden", 7, a));
}

/* Every strict prefix of p[0..n) is "more"; the whole is OK with length n. */
static int whole(const uint8_t *p, size_t n, uint8_t addr[16], bool *has) {
  size_t len;
  for (size_t k = 1; k < n; k++) {
    uint8_t a[16];
    bool h;
    int r = sl__srv_proxy_check(p, k, &len, a, &h);
    CHECK_MSG(r == SL_SRV_HEAD_MORE, "prefix %zu of %zu: %d", k, n, r);
    if (r != SL_SRV_HEAD_MORE)
      return r;
  }
  /* HTTP bytes after it are not part of it */
  uint8_t buf[600];
  memcpy(buf, p, n);
  memcpy(buf + n, "GET / HTTP/1.1\r\n", 16);
  int r = sl__srv_proxy_check(buf, n + 16, &len, addr, has);
  if (r == SL_SRV_HEAD_OK)
    CHECK_EQ_INT(len, n);
  return r;
}

#define STR(s) (const uint8_t *)(s), sizeof(s) - 1

static void test_v1(void) {
  uint8_t a[16], want[16];
  bool has;
  v4("203.0.113.9", want);
  CHECK_EQ_INT(
      whole(STR("PROXY TCP4 203.0.113.9 10.0.0.1 51234 8080\r\n"), a, &has),
      SL_SRV_HEAD_OK);
  CHECK(has && !memcmp(a, want, 16));
  inet_pton(AF_INET6, "2001:db8::1", want);
  CHECK_EQ_INT(
      whole(STR("PROXY TCP6 2001:db8::1 2001:db8::2 4000 443\r\n"), a, &has),
      SL_SRV_HEAD_OK);
  CHECK(has && !memcmp(a, want, 16));
  CHECK_EQ_INT(whole(STR("PROXY UNKNOWN\r\n"), a, &has), SL_SRV_HEAD_OK);
  CHECK(!has);
  CHECK_EQ_INT(whole(STR("PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n"), a, &has),
               SL_SRV_HEAD_OK);
  CHECK(!has);
  static const char *const bad[] = {
      "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", /* no CR */
      "PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
      "PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
      "PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n",
      "PROXY TCP4 2001:db8::1 5.6.7.8 1 2\r\n", /* family mismatch */
      "PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n",
      "PROXY TCP4 1.2.3.4 5.6.7.8 1 65536\r\n",
      "PROXY TCP4 1.2.3.400 5.6.7.8 1 2\r\n",
      "PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
      "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\r\n",
      "PROXY TCP4 1.2.\x01.4 5.6.7.8 1 2\r\n",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t len;
    int r = sl__srv_proxy_check((const uint8_t *)bad[i], strlen(bad[i]), &len,
                                a, &has);
    CHECK_MSG(r == SL_SRV_HEAD_BAD, "bad v1 %zu: %d", i, r);
  }
  /* no line end within the spec's 107 bytes */
  char longl[200];
  memset(longl, 'x', sizeof longl);
  memcpy(longl, "PROXY UNKNOWN ", 14);
  size_t len;
  CHECK_EQ_INT(sl__srv_proxy_check((const uint8_t *)longl, 106, &len, a, &has),
               SL_SRV_HEAD_MORE);
  CHECK_EQ_INT(
      sl__srv_proxy_check((const uint8_t *)longl, sizeof longl, &len, a, &has),
      SL_SRV_HEAD_BAD);
}

static size_t v2(uint8_t *out, uint8_t vc, uint8_t fam, const uint8_t *addr,
                 size_t alen, size_t tlv) {
  static const uint8_t sig[12] = {0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D,
                                  0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A};
  memcpy(out, sig, 12);
  out[12] = vc;
  out[13] = fam;
  size_t body = alen + tlv;
  out[14] = (uint8_t)(body >> 8);
  out[15] = (uint8_t)body;
  memcpy(out + 16, addr, alen);
  memset(out + 16 + alen, 0xAB, tlv);
  return 16 + body;
}

static void test_v2(void) {
  uint8_t h[600], a[16], want[16];
  bool has;
  /* TCP over IPv4, with a few TLV bytes after the addresses */
  uint8_t a4[12] = {198, 51, 100, 7, 10, 0, 0, 1, 0xC8, 0x10, 0x1F, 0x90};
  size_t n = v2(h, 0x21, 0x11, a4, 12, 24);
  v4("198.51.100.7", want);
  CHECK_EQ_INT(whole(h, n, a, &has), SL_SRV_HEAD_OK);
  CHECK(has && !memcmp(a, want, 16));
  uint8_t a6[36] = {0};
  inet_pton(AF_INET6, "2001:db8::77", a6);
  inet_pton(AF_INET6, "2001:db8::1", a6 + 16);
  n = v2(h, 0x21, 0x21, a6, 36, 0);
  CHECK_EQ_INT(whole(h, n, a, &has), SL_SRV_HEAD_OK);
  CHECK(has && !memcmp(a, a6, 16));
  /* LOCAL (a health check) and UNSPEC: no address */
  n = v2(h, 0x20, 0x00, a4, 0, 0);
  CHECK_EQ_INT(whole(h, n, a, &has), SL_SRV_HEAD_OK);
  CHECK(!has);
  n = v2(h, 0x21, 0x00, a4, 0, 0);
  CHECK_EQ_INT(whole(h, n, a, &has), SL_SRV_HEAD_OK);
  CHECK(!has);
  size_t len;
  struct {
    uint8_t vc, fam;
    size_t alen;
  } bad[] = {{0x11, 0x11, 12}, /* version 1 */
             {0x22, 0x11, 12}, /* command 2 */
             {0x21, 0x11, 8},  /* IPv4 addresses cut short */
             {0x21, 0x21, 12}, /* IPv6 addresses cut short */
             {0x21, 0x13, 12}, /* transport 3 */
             {0x21, 0x41, 12}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    n = v2(h, bad[i].vc, bad[i].fam, a6, bad[i].alen, 0);
    CHECK_MSG(sl__srv_proxy_check(h, n, &len, a, &has) == SL_SRV_HEAD_BAD,
              "bad v2 %zu", i);
  }
  /* a length past the bound: refused from the fixed part alone */
  v2(h, 0x21, 0x11, a4, 12, 0);
  h[14] = 0x20;
  CHECK_EQ_INT(sl__srv_proxy_check(h, 16, &len, a, &has), SL_SRV_HEAD_BAD);
}

static void test_none(void) {
  static const char *const http[] = {
      "GET / HTTP/1.1\r\n", "POST", "P", "PROXZ", "\r\n\r\nX", "PRO XY"};
  uint8_t a[16];
  bool has;
  size_t len;
  for (size_t i = 0; i < sizeof http / sizeof http[0]; i++) {
    int r = sl__srv_proxy_check((const uint8_t *)http[i], strlen(http[i]), &len,
                                a, &has);
    size_t l = strlen(http[i]);
    bool prefix = (l <= 6 && !memcmp(http[i], "PROXY ", l)) ||
                  (l <= 4 && !memcmp(http[i], "\r\n\r\n", l));
    CHECK_MSG(r == (prefix ? SL_SRV_HEAD_MORE : SL_SRV_PROXY_NONE), "'%s': %d",
              http[i], r);
  }
}

static bool xff(const char *head, const sl_srv_cidr *t, size_t nt,
                const char *want) {
  uint8_t a[16], w[16];
  bool ok = sl__srv_xff_client(head, strlen(head), t, nt, a);
  if (!want)
    return !ok;
  if (!sl__srv_addr_parse(want, strlen(want), w))
    return false;
  return ok && !memcmp(a, w, 16);
}

static void test_xff(void) {
  sl_srv_cidr t[2];
  CHECK(cidr("10.0.0.0/8", &t[0]));
  CHECK(cidr("2001:db8:ffff::/48", &t[1]));
  const char *r = "GET / HTTP/1.1\r\nHost: x\r\n";
  char h[1024];
#define HEAD(fields) (snprintf(h, sizeof h, "%s%s\r\n", r, fields), h)
  CHECK(xff(HEAD("X-Forwarded-For: 203.0.113.5\r\n"), t, 2, "203.0.113.5"));
  /* the nearest untrusted hop, not what the client wrote */
  CHECK(xff(HEAD("X-Forwarded-For: 1.1.1.1, 203.0.113.5, 10.1.1.1\r\n"), t, 2,
            "203.0.113.5"));
  CHECK(xff(HEAD("x-forwarded-for:9.9.9.9\r\nX-FORWARDED-FOR: 8.8.8.8 , "
                 "10.2.2.2\r\n"),
            t, 2, "8.8.8.8"));
  CHECK(xff(HEAD("X-Forwarded-For: 203.0.113.5:4711, [2001:db8::9]:80\r\n"), t,
            2, "2001:db8::9"));
  /* all trusted: the leftmost */
  CHECK(xff(HEAD("X-Forwarded-For: 10.9.9.9, 10.1.1.1\r\n"), t, 2, "10.9.9.9"));
  /* a forged word left of the real hop does not matter; right of it does */
  CHECK(xff(HEAD("X-Forwarded-For: unknown, 203.0.113.5\r\n"), t, 2,
            "203.0.113.5"));
  CHECK(xff(HEAD("X-Forwarded-For: 203.0.113.5, unknown\r\n"), t, 2, NULL));
  CHECK(xff(HEAD("X-Forwarded-Host: 1.2.3.4\r\n"), t, 2, NULL));
  CHECK(xff(HEAD("X-Forwarded-For:\r\n"), t, 2, NULL));
  CHECK(xff(HEAD(""), t, 2, NULL));
  /* bare LF heads too; a field in the request line is not one */
  CHECK(xff("GET /X-Forwarded-For:1.2.3.4 HTTP/1.1\nX-Forwarded-For: "
            "5.6.7.8\n\n",
            t, 2, "5.6.7.8"));
  /* more than 64 trusted entries: the nearest 64 are all trusted -> none */
  char many[1200] = "X-Forwarded-For: 203.0.113.5";
  for (int i = 0; i < 70; i++)
    strcat(many, ", 10.0.0.1");
  strcat(many, "\r\n");
  CHECK(xff(HEAD(many), t, 2, NULL));
#undef HEAD
}

int main(void) {
  RUN(test_cidr);
  RUN(test_addr);
  RUN(test_v1);
  RUN(test_v2);
  RUN(test_none);
  RUN(test_xff);
  return sl_test_finish();
}
