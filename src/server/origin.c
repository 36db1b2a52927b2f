/* sluice — server: whom a request may come from (origin.h). */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "server/origin.h"

/* A host as the checks compare it: the name or address without brackets,
 * port or trailing dot; lower case. */
typedef struct host_name {
  char s[256];
  size_t n;
  bool v4, v6; /* an IP address (then a4 / a6 hold it) */
  struct in_addr a4;
  struct in6_addr a6;
} host_name;

static bool all_digits(const char *p, size_t n) {
  if (n == 0 || n > 5)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!isdigit((unsigned char)p[i]))
      return false;
  return true;
}

/* Reads "name", "name:port", "[v6]" or "[v6]:port" (p[0..n)); false when
 * malformed. `port_ok`: a ":port" may follow (a Host value; not an
 * --allowed-host or --host entry, which are bare). */
static bool host_parse(const char *p, size_t n, bool port_ok, host_name *h) {
  memset(h, 0, sizeof *h);
  const char *name = p;
  size_t len = n;
  if (n && p[0] == '[') {
    const char *end = memchr(p, ']', n);
    if (!end)
      return false;
    name = p + 1;
    len = (size_t)(end - name);
    size_t rest = n - (size_t)(end + 1 - p);
    if (rest && !(port_ok && end[1] == ':' && all_digits(end + 2, rest - 1)))
      return false;
  } else {
    const char *colon = memchr(p, ':', n);
    if (colon) {
      size_t rest = n - (size_t)(colon + 1 - p);
      /* a second colon: a bare IPv6 address (a Host value must bracket
       * it; a bare --host or --allowed-host entry may not) */
      if (memchr(colon + 1, ':', rest)) {
        if (port_ok)
          return false;
      } else {
        if (!port_ok || !all_digits(colon + 1, rest))
          return false;
        len = (size_t)(colon - p);
      }
    }
  }
  if (len && name[len - 1] == '.')
    len--;
  if (len == 0 || len >= sizeof h->s)
    return false;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)name[i];
    if (c <= ' ' || c == '/' || c == '\\' || c == '@' || c >= 0x7f)
      return false;
    h->s[i] = (char)tolower(c);
  }
  h->s[len] = 0;
  h->n = len;
  h->v4 = inet_pton(AF_INET, h->s, &h->a4) == 1;
  h->v6 = !h->v4 && inet_pton(AF_INET6, h->s, &h->a6) == 1;
  return true;
}

static bool is_loopback(const host_name *h) {
  static const char sfx[] = ".localhost";
  const size_t sl = sizeof sfx - 1;
  if (!strcmp(h->s, "localhost") ||
      (h->n > sl && !strcmp(h->s + h->n - sl, sfx)))
    return true;
  if (h->v4)
    return (ntohl(h->a4.s_addr) >> 24) == 127;
  if (h->v6) {
    if (IN6_IS_ADDR_LOOPBACK(&h->a6))
      return true;
    return IN6_IS_ADDR_V4MAPPED(&h->a6) && h->a6.s6_addr[12] == 127;
  }
  return false;
}

static bool same_host(const host_name *a, const host_name *b) {
  if (a->v4 && b->v4)
    return a->a4.s_addr == b->a4.s_addr;
  if (a->v6 && b->v6)
    return !memcmp(&a->a6, &b->a6, sizeof a->a6);
  return !strcmp(a->s, b->s);
}

static bool is_wildcard(const char *bound) {
  return !bound || !bound[0] || !strcmp(bound, "0.0.0.0") ||
         !strcmp(bound, "::") || !strcmp(bound, "[::]") || !strcmp(bound, "*");
}

/* One --allowed-host entry e[0..n) against h. */
static bool entry_allows(const char *e, size_t n, const host_name *h) {
  if (n == 1 && e[0] == '*')
    return true;
  if (n > 1 && e[0] == '.') { /* the name and every name under it */
    host_name d;
    if (!host_parse(e + 1, n - 1, false, &d) || h->v4 || h->v6)
      return false;
    return !strcmp(h->s, d.s) || (h->n > d.n && h->s[h->n - d.n - 1] == '.' &&
                                  !strcmp(h->s + h->n - d.n, d.s));
  }
  host_name a;
  return host_parse(e, n, false, &a) && same_host(&a, h);
}

bool sl__srv_host_allowed(const char *host, const char *bound,
                          const char *allowed) {
  host_name h;
  if (!host || !host_parse(host, strlen(host), true, &h))
    return false;
  if (is_loopback(&h))
    return true;
  if (is_wildcard(bound)) {
    if (h.v4 || h.v6)
      return true;
  } else {
    host_name b;
    if (host_parse(bound, strlen(bound), false, &b) && same_host(&b, &h))
      return true;
  }
  for (const char *p = allowed; p && *p;) {
    while (*p == ',' || *p == ' ')
      p++;
    size_t n = strcspn(p, ", ");
    if (n && entry_allows(p, n, &h))
      return true;
    p += n;
  }
  return false;
}

bool sl__srv_origin_listed(const char *list, const char *origin, size_t n) {
  for (const char *p = list; p && *p;) {
    while (*p == ' ' || *p == ',')
      p++;
    size_t k = strcspn(p, ", ");
    if (k && k == n && !strncmp(p, origin, n))
      return true;
    p += k;
  }
  return false;
}

/* True when origin is scheme + "://" + host, case-insensitively. */
static bool origin_is(const char *origin, const char *scheme,
                      const char *host) {
  size_t sl = strlen(scheme);
  return !strncasecmp(origin, scheme, sl) && !strncmp(origin + sl, "://", 3) &&
         !strcasecmp(origin + sl + 3, host);
}

bool sl__srv_origin_allowed(const char *origin, const char *host,
                            const char *cors) {
  if (!origin)
    return false;
  if (cors && !strcmp(cors, "*"))
    return true;
  if (sl__srv_origin_listed(cors, origin, strlen(origin)))
    return true;
  return host && host[0] &&
         (origin_is(origin, "http", host) || origin_is(origin, "https", host));
}

bool sl__srv_content_type_json(const char *ct) {
  static const char want[] = "application/json";
  const size_t wl = sizeof want - 1;
  if (!ct)
    return false;
  while (*ct == ' ' || *ct == '\t')
    ct++;
  if (strncasecmp(ct, want, wl) != 0)
    return false;
  const char *p = ct + wl;
  while (*p == ' ' || *p == '\t')
    p++;
  return *p == 0 || *p == ';';
}
