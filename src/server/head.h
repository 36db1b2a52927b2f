/* sluice — server: the request head check, raw (pre-libmicrohttpd) error
 * answers (head.c). */
#ifndef SLUICE_SERVER_HEAD_H
#define SLUICE_SERVER_HEAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/json.h"

#define SL_SRV_HEAD_MAX       16384 /* request head bytes (431 past this) */
#define SL_SRV_TARGET_MAX     8192  /* request-target bytes (414 past this) */
#define SL_SRV_METHOD_MAX     32
#define SL_SRV_FIELDS_MAX     100 /* header lines (431 past this) */
#define SL_SRV_CHUNK_LINE_MAX 256 /* a first chunk line read at the door */

enum { SL_SRV_HEAD_BAD = -1, SL_SRV_HEAD_MORE = 0, SL_SRV_HEAD_OK = 1 };

typedef struct sl_srv_head_info {
  size_t len;     /* SL_SRV_HEAD_OK: the head's bytes, its empty line too */
  bool anthropic; /* the target is /v1/messages or below */
  bool line_done; /* the request line was seen whole */
  bool chunked;   /* a Transfer-Encoding field says "chunked" */
  bool expect;    /* an Expect field: the body waits for "100 Continue" */
} sl_srv_head_info;

/* Checks the start p[0..n) of a connection's bytes: SL_SRV_HEAD_OK when a
 * whole, valid head is there; SL_SRV_HEAD_MORE when what came so far can
 * still start one; SL_SRV_HEAD_BAD with *err (400, 414, 431 or 505)
 * otherwise. Pure: no allocation. */
int sl__srv_head_check(const char *p, size_t n, sl_srv_head_info *info,
                       sl_srv_error *err);

/* Checks the first chunk line of a chunked body, p[0..n) (the bytes after
 * the head): SL_SRV_HEAD_OK when it is whole and declares at most
 * `max_body` bytes, or when no line end comes within SL_SRV_CHUNK_LINE_MAX
 * bytes (left to libmicrohttpd); SL_SRV_HEAD_MORE while it may still
 * become one; SL_SRV_HEAD_BAD with *err: 413 for a size over max_body
 * (known from its digits, before the line ends), 400 for a line that does
 * not start with a hex size. Pure. */
int sl__srv_chunk_check(const char *p, size_t n, uint64_t max_body,
                        sl_srv_error *err);

/* Whether errors on target t[0..n) take Anthropic's shape: /v1/messages
 * and the paths under it (a query string aside), not /v1/messagesXYZ.
 * Every other path, known or not, answers in OpenAI's shape. */
bool sl__srv_anthropic_target(const char *t, size_t n);

/* Appends a whole HTTP/1.1 response for `e` (JSON in `fam`'s shape,
 * Connection: close) to out. */
void sl__srv_raw_error(sl_srv_family fam, const sl_srv_error *e, sl_sbuf *out);

#endif
