/* sluice — server: clients behind a trusted proxy (proxy.c): address
 * ranges, the PROXY protocol header (v1 and v2) and X-Forwarded-For. */
#ifndef SLUICE_SERVER_PROXY_H
#define SLUICE_SERVER_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* An address range. Addresses are 16 bytes: IPv6, or IPv4 as
 * ::ffff:a.b.c.d (an IPv4 range's prefix counts 96 bits more). */
typedef struct sl_srv_cidr {
  uint8_t addr[16];
  unsigned bits; /* prefix length, 0..128 */
} sl_srv_cidr;

/* Parses "ADDR" or "ADDR/N" (IPv4 or IPv6). false when it is neither. */
bool sl__srv_cidr_parse(const char *s, size_t n, sl_srv_cidr *out);
/* Parses a comma-separated list of ranges (--trusted-proxy) into *out
 * (sl_malloc'd, *n entries; NULL and 0 for NULL or ""). SL_ERR_INVALID_ARG
 * with the entry that is not a range in `bad`, or SL_ERR_NOMEM. */
int sl__srv_cidr_list(const char *list, sl_srv_cidr **out, size_t *n, char *bad,
                      size_t badcap);
/* Whether `a` lies in any of c[0..nc). */
bool sl__srv_cidr_any(const sl_srv_cidr *c, size_t nc, const uint8_t a[16]);
/* Parses one address (IPv4, IPv6, "[v6]"; a ":port" after IPv4 or after
 * "]" is allowed) into 16 bytes. false when it is none. */
bool sl__srv_addr_parse(const char *s, size_t n, uint8_t out[16]);

enum { SL_SRV_PROXY_NONE = 2 }; /* beside SL_SRV_HEAD_OK/MORE/BAD */

/* A PROXY protocol header (HAProxy's v1 text line or v2 binary block) at
 * the start p[0..n) of a connection's bytes:
 *   SL_SRV_HEAD_OK    a whole one, *len bytes; *has_addr and addr[] the
 *                     client's when it names one (not LOCAL, UNKNOWN or a
 *                     family other than TCP/UDP over IPv4/IPv6)
 *   SL_SRV_HEAD_MORE  what came so far may still become one
 *   SL_SRV_HEAD_BAD   it starts as one and is malformed
 *   SL_SRV_PROXY_NONE the bytes do not start a PROXY header
 * Pure: no allocation. */
int sl__srv_proxy_check(const uint8_t *p, size_t n, size_t *len,
                        uint8_t addr[16], bool *has_addr);

/* The client named by the X-Forwarded-For fields of a request head
 * h[0..n) (fields in order, each a comma-separated list, the nearest hop
 * last): the rightmost address outside trusted[0..nt), or the leftmost
 * when every one is trusted. false when there is no such field, or an
 * entry met on the way is not an address (a proxy that appends its peer
 * makes a forged entry harmless: it is left of the real one). */
bool sl__srv_xff_client(const char *h, size_t n, const sl_srv_cidr *trusted,
                        size_t nt, uint8_t addr[16]);

#endif
