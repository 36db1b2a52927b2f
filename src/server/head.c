/* sluice — server: the request head check, and raw error responses.
 *
 * The front door (door.c) holds every new connection until its first
 * request head has arrived whole, and checks it here before libmicrohttpd
 * reads a byte. libmicrohttpd answers what it cannot parse with its own
 * HTML pages (400, 414, 431, 505), and closes a request line with no space
 * without a word; everything it would refuse is refused here first, with
 * JSON in the API's shape. The check is a strict subset of RFC 9112:
 *
 *   request-line = method SP request-target SP HTTP-version (CR)LF
 *   method       = 1*32 tchar
 *   target       = 1*8192 visible ASCII                (414 past that)
 *   version      = "HTTP/1.0" / "HTTP/1.1"             (505: other digits)
 *   header-line  = field-name ":" *(SP / HTAB / VCHAR / obs-text) (CR)LF
 *   field-name   = 1*tchar       (no space before the colon, no folding)
 *   Content-Length = 1*19 DIGIT, blanks before it but none after
 *                    (libmicrohttpd trims a value's leading blanks only,
 *                    and answers "19 " with its HTML 400)
 *   head         = request-line *header-line (CR)LF    (431 past 16 KiB)
 *
 * A prefix is judged as it arrives: a byte that no valid head could hold
 * (a TLS handshake's first byte, a NUL in a header) is refused at once,
 * without waiting for a line end.
 */
#include <stdio.h>
#include <string.h>

#include "server/head.h"
#include "server/json.h"

static bool is_tchar(unsigned char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
      (c >= 'A' && c <= 'Z'))
    return true;
  return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool is_value_char(unsigned char c) {
  return c == ' ' || c == '\t' || (c >= 0x21 && c != 0x7F);
}

static int bad(sl_srv_error *err, int http, const char *code, const char *why) {
  sl__srv_error_set(err, http, code, NULL, "malformed HTTP request: %s", why);
  return SL_SRV_HEAD_BAD;
}

bool sl__srv_anthropic_target(const char *t, size_t n) {
  if (n < 12 || memcmp(t, "/v1/messages", 12) != 0)
    return false;
  return n == 12 || t[12] == '/' || t[12] == '?';
}

/* The request line p[0..n) (no line end). */
static int check_line(const char *p, size_t n, bool whole,
                      sl_srv_head_info *info, sl_srv_error *err) {
  size_t i = 0;
  while (i < n && is_tchar((unsigned char)p[i]))
    i++;
  if (i > SL_SRV_METHOD_MAX)
    return bad(err, 400, "malformed_request", "the method is too long");
  if (i == n)
    return whole ? bad(err, 400, "malformed_request",
                       "a request line without a target")
                 : SL_SRV_HEAD_MORE;
  if (i == 0 || p[i] != ' ')
    return bad(err, 400, "malformed_request",
               "the request line does not start with a method");
  size_t t0 = ++i;
  while (i < n && (unsigned char)p[i] > 0x20 && (unsigned char)p[i] < 0x7F)
    i++;
  size_t tn = i - t0;
  info->anthropic = sl__srv_anthropic_target(p + t0, tn);
  if (tn > SL_SRV_TARGET_MAX) {
    sl__srv_error_set(err, 414, "uri_too_long", NULL,
                      "the request target is longer than %d bytes",
                      SL_SRV_TARGET_MAX);
    return SL_SRV_HEAD_BAD;
  }
  if (i == n)
    return whole ? bad(err, 400, "malformed_request",
                       "a request line without an HTTP version")
                 : SL_SRV_HEAD_MORE;
  if (tn == 0 || p[i] != ' ')
    return bad(err, 400, "malformed_request",
               "the request target holds a control character or a second "
               "space, or is empty");
  i++;
  static const char proto[] = "HTTP/";
  size_t v0 = i;
  for (; i < n && i - v0 < 5; i++)
    if (p[i] != proto[i - v0])
      return bad(err, 400, "malformed_request",
                 "the request line does not end with an HTTP version");
  /* "HTTP/" DIGIT "." DIGIT */
  for (; i < n && i - v0 < 8; i++) {
    size_t k = i - v0;
    bool ok = k == 6 ? p[i] == '.' : (p[i] >= '0' && p[i] <= '9');
    if (!ok)
      return bad(err, 400, "malformed_request",
                 "the request line does not end with an HTTP version");
  }
  if (i < n)
    return bad(err, 400, "malformed_request",
               "bytes after the HTTP version on the request line");
  if (i - v0 < 8)
    return whole ? bad(err, 400, "malformed_request",
                       "the request line does not end with an HTTP version")
                 : SL_SRV_HEAD_MORE;
  if (p[v0 + 5] != '1' || (p[v0 + 7] != '0' && p[v0 + 7] != '1')) {
    sl__srv_error_set(err, 505, "http_version_not_supported", NULL,
                      "HTTP version %.8s is not supported: use HTTP/1.1",
                      p + v0);
    return SL_SRV_HEAD_BAD;
  }
  return SL_SRV_HEAD_OK;
}

/* One header line p[0..n) (no line end); `whole`: its end was seen.
 * Notes in *info a Transfer-Encoding of "chunked" (the framing check,
 * http.c, refuses any other coding and a second field) and an Expect. */
static int check_field(const char *p, size_t n, bool whole,
                       sl_srv_head_info *info, sl_srv_error *err) {
  if (n && (p[0] == ' ' || p[0] == '\t'))
    return bad(err, 400, "malformed_request",
               "a folded header line (obsolete line folding)");
  size_t i = 0;
  while (i < n && is_tchar((unsigned char)p[i]))
    i++;
  if (i == n)
    return whole ? bad(err, 400, "malformed_request",
                       "a header line without a colon")
                 : SL_SRV_HEAD_MORE;
  if (i == 0 || p[i] != ':')
    return bad(err, 400, "malformed_request",
               "a header name holds a character outside the token set");
  size_t name_n = i++;
  for (size_t k = i; k < n; k++)
    if (!is_value_char((unsigned char)p[k]))
      return bad(err, 400, "malformed_request",
                 "a header value holds a control character");
  if (name_n == 17 && strncasecmp(p, "transfer-encoding", 17) == 0) {
    size_t k = i, e = n;
    while (k < e && (p[k] == ' ' || p[k] == '\t'))
      k++;
    while (e > k && (p[e - 1] == ' ' || p[e - 1] == '\t'))
      e--;
    if (e - k == 7 && strncasecmp(p + k, "chunked", 7) == 0)
      info->chunked = true;
  }
  if (name_n == 6 && strncasecmp(p, "expect", 6) == 0)
    info->expect = true;
  if (name_n == 14 && strncasecmp(p, "content-length", 14) == 0) {
    size_t k = i;
    while (k < n && (p[k] == ' ' || p[k] == '\t'))
      k++;
    size_t d0 = k;
    while (k < n && p[k] >= '0' && p[k] <= '9')
      k++;
    size_t nd = k - d0;
    if (nd > 19 || k < n || (whole && nd == 0))
      return bad(err, 400, "malformed_request",
                 "Content-Length is not a decimal number of bytes");
  }
  return whole ? SL_SRV_HEAD_OK : SL_SRV_HEAD_MORE;
}

int sl__srv_head_check(const char *p, size_t n, sl_srv_head_info *info,
                       sl_srv_error *err) {
  memset(info, 0, sizeof *info);
  size_t pos = 0;
  bool first = true;
  int fields = 0;
  while (pos < n) {
    const char *nl = memchr(p + pos, '\n', n - pos);
    size_t end = nl ? (size_t)(nl - p) : n; /* p[end] is '\n' or past */
    size_t len = end - pos;
    if (nl && len && p[end - 1] == '\r')
      len--;
    const char *cr = memchr(p + pos, '\r', len);
    if (cr && (nl || (size_t)(cr - p) + 1 < n))
      return bad(err, 400, "malformed_request",
                 "a bare carriage return inside a line");
    if (!nl && cr) /* a trailing CR: its LF may come next */
      len--;
    if (first) {
      int r = check_line(p + pos, len, nl != NULL, info, err);
      if (r != SL_SRV_HEAD_OK)
        return nl || r == SL_SRV_HEAD_BAD ? r : SL_SRV_HEAD_MORE;
      if (!nl)
        return SL_SRV_HEAD_MORE; /* the line is whole but its end is not */
      info->line_done = true;
      first = false;
    } else if (nl && len == 0) {
      info->len = end + 1; /* the empty line ends the head */
      if (info->len <= SL_SRV_HEAD_MAX)
        return SL_SRV_HEAD_OK;
      break;
    } else {
      int r = check_field(p + pos, len, nl != NULL, info, err);
      if (r == SL_SRV_HEAD_BAD)
        return r;
      if (!nl)
        break;
      /* libmicrohttpd keeps a record per field in its connection's memory
       * (MHD_OPTION_CONNECTION_MEMORY_LIMIT): past what it holds it would
       * answer its own HTML 431 to a head that passed here */
      if (++fields > SL_SRV_FIELDS_MAX) {
        sl__srv_error_set(err, 431, "request_header_fields_too_large", NULL,
                          "the request head has more than %d header fields",
                          SL_SRV_FIELDS_MAX);
        return SL_SRV_HEAD_BAD;
      }
    }
    pos = end + 1;
  }
  if (n > SL_SRV_HEAD_MAX) {
    sl__srv_error_set(err, 431, "request_header_fields_too_large", NULL,
                      "the request head is larger than %d bytes",
                      SL_SRV_HEAD_MAX);
    return SL_SRV_HEAD_BAD;
  }
  return SL_SRV_HEAD_MORE;
}

static const char *reason_phrase(int http) {
  switch (http) {
  case 400:
    return "Bad Request";
  case 408:
    return "Request Timeout";
  case 414:
    return "URI Too Long";
  case 431:
    return "Request Header Fields Too Large";
  case 503:
    return "Service Unavailable";
  case 505:
    return "HTTP Version Not Supported";
  default:
    return "Error";
  }
}

void sl__srv_raw_error(sl_srv_family fam, const sl_srv_error *e, sl_sbuf *out) {
  sl_sbuf body = {0};
  json_t *j = sl__srv_error_json(fam, e);
  if (!j) {
    out->oom = true;
    return;
  }
  sl__sbuf_add_json(&body, j);
  json_decref(j);
  sl__sbuf_addf(out,
                "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                e->http, reason_phrase(e->http), body.len);
  sl__sbuf_add(out, body.p, body.len);
  if (body.oom)
    out->oom = true;
  sl__sbuf_free(&body);
}

int sl__srv_chunk_check(const char *p, size_t n, uint64_t max_body,
                        sl_srv_error *err) {
  uint64_t size = 0;
  size_t i = 0;
  for (; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    int v = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (v < 0)
      break;
    if (size > (max_body >> 4)) { /* size * 16 + v > max_body */
      sl__srv_error_set(err, 413, "request_too_large", NULL,
                        "a chunk of the body declares more than the %llu "
                        "bytes a request body may have",
                        (unsigned long long)max_body);
      return SL_SRV_HEAD_BAD;
    }
    size = size * 16 + (uint64_t)v;
  }
  if (size > max_body) {
    sl__srv_error_set(err, 413, "request_too_large", NULL,
                      "a chunk of the body declares %llu bytes; a request "
                      "body may have %llu",
                      (unsigned long long)size, (unsigned long long)max_body);
    return SL_SRV_HEAD_BAD;
  }
  if (i == n)
    return n < SL_SRV_CHUNK_LINE_MAX ? SL_SRV_HEAD_MORE : SL_SRV_HEAD_OK;
  if (i == 0)
    return bad(err, 400, "malformed_request",
               "a chunked body that does not start with a hex chunk size");
  /* the size's end: a line end, or an extension (";") after blanks */
  const char *nl = memchr(p + i, '\n', n - i);
  if (nl || n >= SL_SRV_CHUNK_LINE_MAX)
    return SL_SRV_HEAD_OK;
  return SL_SRV_HEAD_MORE;
}
