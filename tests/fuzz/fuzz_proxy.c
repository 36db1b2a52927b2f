/* libFuzzer harness: what a proxy sends before and in the first head
 * (src/server/proxy.h). A PROXY header's bytes and a head's
 * X-Forwarded-For are outside input (a trusted proxy relays what its
 * clients write); --trusted-proxy values are an operator's. Besides never
 * reading out of bounds, for a PROXY header p[0..n):
 * - OK names a length within n, and every shorter prefix than that length
 *   is MORE (the door judges bytes as they arrive); bytes after it do not
 *   change the verdict, the length or the address;
 * - BAD and NONE stay so when more bytes come;
 * and for the rest of the input, read as a range list and a head:
 * - a parsed range holds its own address;
 * - X-Forwarded-For's client is outside the trusted ranges unless every
 *   entry was trusted. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/head.h"
#include "server/proxy.h"
#include "sluice/util.h"

static int check(const uint8_t *p, size_t n, size_t *len, uint8_t a[16],
                 bool *has) {
  return sl__srv_proxy_check(p, n, len, a, has);
}

static void proxy_props(const uint8_t *data, size_t size) {
  size_t len;
  uint8_t a[16];
  bool has;
  int r = check(data, size, &len, a, &has);
  if (r == SL_SRV_HEAD_OK) {
    if (len > size || len < 8)
      abort();
    size_t l2;
    uint8_t a2[16];
    bool h2;
    for (size_t k = 1; k < len; k += 1 + k / 4)
      if (check(data, k, &l2, a2, &h2) != SL_SRV_HEAD_MORE)
        abort(); /* a prefix of a good header was judged */
    if (check(data, len, &l2, a2, &h2) != SL_SRV_HEAD_OK || l2 != len ||
        h2 != has || (has && memcmp(a, a2, 16)))
      abort(); /* the bytes after it changed the verdict */
  } else if (r != SL_SRV_HEAD_MORE && r != SL_SRV_HEAD_BAD &&
             r != SL_SRV_PROXY_NONE) {
    abort();
  }
  /* a prefix judged BAD, NONE or OK: the whole is judged the same */
  for (size_t k = 1; k < size; k += 1 + k / 4) {
    size_t lk;
    int rk = check(data, k, &lk, a, &has);
    if (rk != SL_SRV_HEAD_MORE &&
        (rk != r || (rk == SL_SRV_HEAD_OK && lk != len)))
      abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 8192)
    return 0;
  proxy_props(data, size);
  /* the input as "RANGES\0HEAD": a range list, then a head */
  const uint8_t *z = memchr(data, 0, size);
  if (!z)
    return 0;
  size_t rl = (size_t)(z - data);
  char *list = malloc(rl + 1);
  if (!list)
    return 0;
  memcpy(list, data, rl);
  list[rl] = 0;
  sl_srv_cidr *t = NULL;
  size_t nt = 0;
  char bad[128];
  if (sl__srv_cidr_list(list, &t, &nt, bad, sizeof bad) == 0) {
    for (size_t i = 0; i < nt; i++)
      if (t[i].bits > 128 || !sl__srv_cidr_any(&t[i], 1, t[i].addr))
        abort();
    const char *h = (const char *)z + 1;
    size_t hn = size - rl - 1;
    uint8_t a[16];
    if (sl__srv_xff_client(h, hn, t, nt, a) && sl__srv_cidr_any(t, nt, a)) {
      /* trusted: allowed only as the leftmost of all-trusted entries;
       * with no ranges nothing is trusted */
      if (!nt)
        abort();
    }
    sl_free(t);
  }
  free(list);
  return 0;
}
