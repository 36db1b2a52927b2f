/* libFuzzer harness: whom a request may come from (src/server/origin.h).
 * Host, Origin and Content-Type are a client's header values: outside
 * input. The input is cut at its first three NUL bytes into a Host value,
 * a bound address, an --allowed-host list and an Origin (also tried as a
 * Content-Type). Besides never reading out of bounds:
 * - the --allowed-host list only widens: what is allowed without it is
 *   allowed with it, and "*" allows every Host that parses at all;
 * - a Host the server allows is also allowed with a port appended;
 * - an Origin allowed without --cors-origin is allowed with "*" too, and
 *   one allowed under a list is allowed under "*". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/origin.h"

static const char *next(const char **p, const char *end) {
  const char *s = *p;
  const char *z = memchr(s, 0, (size_t)(end - s));
  *p = z ? z + 1 : end;
  return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4096)
    return 0;
  /* a NUL-terminated copy, so that every piece is a C string */
  char *buf = malloc(size + 1);
  if (!buf)
    return 0;
  memcpy(buf, data, size);
  buf[size] = 0;
  const char *p = buf, *end = buf + size;
  const char *host = next(&p, end);
  const char *bound = p < end ? next(&p, end) : "127.0.0.1";
  const char *allowed = p < end ? next(&p, end) : NULL;
  const char *origin = p < end ? next(&p, end) : host;

  bool plain = sl__srv_host_allowed(host, bound, NULL);
  bool listed = sl__srv_host_allowed(host, bound, allowed);
  bool star = sl__srv_host_allowed(host, bound, "*");
  if (plain && !listed)
    abort(); /* --allowed-host narrowed the rule */
  if (listed && !star)
    abort(); /* "*" allows less than a list */
  if (plain && host[0] != '[' && !strchr(host, ':')) {
    char with_port[4200];
    snprintf(with_port, sizeof with_port, "%s:8080", host);
    if (strlen(host) < 4000 && !sl__srv_host_allowed(with_port, bound, NULL))
      abort(); /* a port changed the answer */
  }

  bool own = sl__srv_origin_allowed(origin, host, NULL);
  bool in_list = sl__srv_origin_allowed(origin, host, allowed);
  bool any = sl__srv_origin_allowed(origin, host, "*");
  if ((own || in_list) && !any)
    abort();
  (void)sl__srv_content_type_json(origin);
  free(buf);
  return 0;
}
