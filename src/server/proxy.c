/* sluice — server: clients behind a trusted proxy.
 *
 * Behind a proxy every connection comes from the proxy's address, so a
 * per-address limit would count every client as one. `--trusted-proxy`
 * names the proxies (addresses or ranges); from those only, the door
 * takes the client's address from a PROXY protocol header (HAProxy's
 * `send-proxy` / `send-proxy-v2`, before any HTTP byte) or from the
 * X-Forwarded-For fields of the first request head. This file holds the
 * pure parts: ranges, the two PROXY header forms, and the rightmost
 * untrusted X-Forwarded-For entry. The door (door.c) applies them.
 *
 * PROXY v1 (a text line, at most 107 bytes with its CRLF):
 *   "PROXY TCP4 1.2.3.4 5.6.7.8 1234 80\r\n", TCP6 alike, or
 *   "PROXY UNKNOWN ...\r\n" (no address: the proxy's own is kept)
 * PROXY v2 (binary): a 12-byte signature, version/command (0x20 LOCAL,
 * 0x21 PROXY), family/transport (0x11/0x12 IPv4, 0x21/0x22 IPv6; others
 * carry no address used here), a big-endian length, then the addresses
 * (source first) and TLVs, which are skipped.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "server/head.h"
#include "server/proxy.h"
#include "sluice/util.h"

#define SL_PROXY_V1_MAX 107  /* the v1 line with its CRLF (the spec's bound) */
#define SL_PROXY_V2_MAX 4096 /* a v2 block: addresses and TLVs */

static const uint8_t v2_sig[12] = {0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D,
                                   0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A};

static void v4_mapped(const uint8_t v4[4], uint8_t out[16]) {
  memset(out, 0, 10);
  out[10] = out[11] = 0xFF;
  memcpy(out + 12, v4, 4);
}

/* An address alone, IPv4 or IPv6, in s[0..n). */
static bool addr_plain(const char *s, size_t n, uint8_t out[16]) {
  char tmp[64];
  if (n == 0 || n >= sizeof tmp)
    return false;
  memcpy(tmp, s, n);
  tmp[n] = 0;
  uint8_t v4[4];
  if (inet_pton(AF_INET, tmp, v4) == 1) {
    v4_mapped(v4, out);
    return true;
  }
  return inet_pton(AF_INET6, tmp, out) == 1;
}

static bool digits(const char *s, size_t n, unsigned max, unsigned *out) {
  if (n == 0 || n > 5)
    return false;
  unsigned v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    v = v * 10 + (unsigned)(s[i] - '0');
  }
  if (v > max)
    return false;
  if (out)
    *out = v;
  return true;
}

bool sl__srv_addr_parse(const char *s, size_t n, uint8_t out[16]) {
  if (n && s[0] == '[') { /* [v6] or [v6]:port */
    const char *e = memchr(s, ']', n);
    if (!e)
      return false;
    size_t rest = n - (size_t)(e + 1 - s);
    if (rest && (e[1] != ':' || !digits(e + 2, rest - 1, 65535, NULL)))
      return false;
    return addr_plain(s + 1, (size_t)(e - s - 1), out);
  }
  if (addr_plain(s, n, out))
    return true;
  /* a.b.c.d:port (one colon: a v6 address has two or more) */
  const char *c = memchr(s, ':', n);
  if (!c || memchr(c + 1, ':', n - (size_t)(c + 1 - s)))
    return false;
  uint8_t a[16];
  if (!addr_plain(s, (size_t)(c - s), a) || a[10] != 0xFF ||
      !digits(c + 1, n - (size_t)(c + 1 - s), 65535, NULL))
    return false;
  memcpy(out, a, 16);
  return true;
}

bool sl__srv_cidr_parse(const char *s, size_t n, sl_srv_cidr *out) {
  const char *slash = memchr(s, '/', n);
  size_t an = slash ? (size_t)(slash - s) : n;
  if (!addr_plain(s, an, out->addr))
    return false;
  bool v4 = !memchr(s, ':', an);
  unsigned max = v4 ? 32 : 128, bits = max;
  if (slash && !digits(slash + 1, n - an - 1, max, &bits))
    return false;
  out->bits = v4 ? bits + 96 : bits;
  /* the bits past the prefix are not compared: clear them */
  for (unsigned i = out->bits; i < 128; i++)
    out->addr[i / 8] &= (uint8_t) ~(0x80u >> (i % 8));
  return true;
}

int sl__srv_cidr_list(const char *list, sl_srv_cidr **out, size_t *n, char *bad,
                      size_t badcap) {
  *out = NULL;
  *n = 0;
  if (!list || !list[0])
    return SL_OK;
  size_t cap = 1;
  for (const char *c = list; *c; c++)
    cap += *c == ',';
  sl_srv_cidr *v = sl_malloc(cap * sizeof *v);
  if (!v)
    return SL_ERR_NOMEM;
  size_t k = 0;
  for (const char *s = list;;) {
    const char *e = strchr(s, ',');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    if (!sl__srv_cidr_parse(s, len, &v[k])) {
      snprintf(bad, badcap, "%.*s", (int)(len > 100 ? 100 : len), s);
      sl_free(v);
      return SL_ERR_INVALID_ARG;
    }
    k++;
    if (!e)
      break;
    s = e + 1;
  }
  *out = v;
  *n = k;
  return SL_OK;
}

bool sl__srv_cidr_any(const sl_srv_cidr *c, size_t nc, const uint8_t a[16]) {
  for (size_t k = 0; k < nc; k++) {
    unsigned full = c[k].bits / 8, rem = c[k].bits % 8;
    if (memcmp(c[k].addr, a, full) != 0)
      continue;
    if (rem && ((c[k].addr[full] ^ a[full]) & (uint8_t)(0xFF00u >> rem)))
      continue;
    return true;
  }
  return false;
}

/* The v1 line p[0..n), its CRLF excluded. */
static int proxy_v1(const char *p, size_t n, uint8_t addr[16], bool *has_addr) {
  const char *f[7];
  size_t fl[7], nf = 0, i = 0;
  while (i <= n && nf < 7) { /* fields split by single spaces */
    size_t j = i;
    while (j < n && p[j] != ' ')
      j++;
    f[nf] = p + i;
    fl[nf++] = j - i;
    i = j + 1;
  }
  if (nf >= 2 && fl[1] == 7 && !memcmp(f[1], "UNKNOWN", 7))
    return SL_SRV_HEAD_OK; /* the rest is ignored, as the spec says */
  if (i <= n || nf != 6)
    return SL_SRV_HEAD_BAD;
  bool v4 = fl[1] == 4 && !memcmp(f[1], "TCP4", 4);
  bool v6 = fl[1] == 4 && !memcmp(f[1], "TCP6", 4);
  uint8_t src[16], dst[16];
  if ((!v4 && !v6) || !addr_plain(f[2], fl[2], src) ||
      !addr_plain(f[3], fl[3], dst) || !digits(f[4], fl[4], 65535, NULL) ||
      !digits(f[5], fl[5], 65535, NULL))
    return SL_SRV_HEAD_BAD;
  /* the family must be the one named (an IPv6 address may be v4-mapped) */
  bool src4 = !memchr(f[2], ':', fl[2]), dst4 = !memchr(f[3], ':', fl[3]);
  if (src4 != v4 || dst4 != v4)
    return SL_SRV_HEAD_BAD;
  memcpy(addr, src, 16);
  *has_addr = true;
  return SL_SRV_HEAD_OK;
}

int sl__srv_proxy_check(const uint8_t *p, size_t n, size_t *len,
                        uint8_t addr[16], bool *has_addr) {
  *has_addr = false;
  *len = 0;
  static const char v1_sig[6] = "PROXY ";
  size_t m = n < 6 ? n : 6;
  if (memcmp(p, v1_sig, m) == 0) {
    if (n < 6)
      return SL_SRV_HEAD_MORE;
    for (size_t i = 6; i < n && i < SL_PROXY_V1_MAX; i++) {
      if (p[i] == '\r') {
        if (i + 1 == n)
          return SL_SRV_HEAD_MORE;
        if (p[i + 1] != '\n')
          return SL_SRV_HEAD_BAD;
        *len = i + 2;
        return proxy_v1((const char *)p, i, addr, has_addr);
      }
      if (p[i] < 0x20 || p[i] > 0x7E)
        return SL_SRV_HEAD_BAD;
    }
    return n < SL_PROXY_V1_MAX ? SL_SRV_HEAD_MORE : SL_SRV_HEAD_BAD;
  }
  m = n < 12 ? n : 12;
  if (memcmp(p, v2_sig, m) != 0)
    return SL_SRV_PROXY_NONE;
  if (n < 16)
    return SL_SRV_HEAD_MORE;
  unsigned ver = p[12] >> 4, cmd = p[12] & 0xF;
  size_t body = ((size_t)p[14] << 8) | p[15];
  if (ver != 2 || cmd > 1 || body > SL_PROXY_V2_MAX - 16)
    return SL_SRV_HEAD_BAD;
  if (n < 16 + body)
    return SL_SRV_HEAD_MORE;
  *len = 16 + body;
  if (cmd == 0) /* LOCAL: the proxy's own connection (a health check) */
    return SL_SRV_HEAD_OK;
  unsigned fam = p[13] >> 4, proto = p[13] & 0xF;
  if (proto > 2)
    return SL_SRV_HEAD_BAD;
  if (fam == 1 && proto) {
    if (body < 12)
      return SL_SRV_HEAD_BAD;
    v4_mapped(p + 16, addr);
    *has_addr = true;
  } else if (fam == 2 && proto) {
    if (body < 36)
      return SL_SRV_HEAD_BAD;
    memcpy(addr, p + 16, 16);
    *has_addr = true;
  } else if (fam > 3) {
    return SL_SRV_HEAD_BAD;
  } /* UNSPEC or AF_UNIX: no address to use */
  return SL_SRV_HEAD_OK;
}

static bool name_is(const char *s, size_t n, const char *want) {
  size_t wl = strlen(want);
  if (n != wl)
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c >= 'A' && c <= 'Z')
      c = (char)(c - 'A' + 'a');
    if (c != want[i])
      return false;
  }
  return true;
}

#define SL_XFF_MAX 64 /* entries looked at, nearest first */

bool sl__srv_xff_client(const char *h, size_t n, const sl_srv_cidr *trusted,
                        size_t nt, uint8_t addr[16]) {
  const char *e[SL_XFF_MAX];
  size_t el[SL_XFF_MAX], ne = 0, dropped = 0;
  size_t i = 0;
  while (i < n && h[i] != '\n') /* past the request line */
    i++;
  for (i++; i < n;) {
    size_t end = i;
    while (end < n && h[end] != '\n')
      end++;
    size_t le = end > i && h[end - 1] == '\r' ? end - 1 : end;
    const char *colon = memchr(h + i, ':', le - i);
    if (colon && name_is(h + i, (size_t)(colon - (h + i)), "x-forwarded-for")) {
      const char *v = colon + 1, *ve = h + le;
      while (v < ve) {
        const char *c = memchr(v, ',', (size_t)(ve - v));
        const char *ie = c ? c : ve, *s = v;
        while (s < ie && (*s == ' ' || *s == '\t'))
          s++;
        const char *t = ie;
        while (t > s && (t[-1] == ' ' || t[-1] == '\t'))
          t--;
        if (t > s) { /* keep the nearest SL_XFF_MAX */
          if (ne == SL_XFF_MAX) {
            memmove(e, e + 1, (SL_XFF_MAX - 1) * sizeof e[0]);
            memmove(el, el + 1, (SL_XFF_MAX - 1) * sizeof el[0]);
            ne--;
            dropped++;
          }
          e[ne] = s;
          el[ne++] = (size_t)(t - s);
        }
        v = ie + 1;
      }
    }
    i = end + 1;
  }
  uint8_t a[16];
  for (size_t k = ne; k-- > 0;) {
    if (!sl__srv_addr_parse(e[k], el[k], a))
      return false;
    if (!sl__srv_cidr_any(trusted, nt, a) || (k == 0 && !dropped)) {
      memcpy(addr, a, 16);
      return true;
    }
  }
  return false; /* none, or every one of the nearest 64 trusted */
}
