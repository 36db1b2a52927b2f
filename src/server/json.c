/* sluice — server: UTF-8 checks, the string builder, API error bodies. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "server/json.h"
#include "sluice/utf8.h"
#include "sluice/util.h"

/* Well-formed UTF-8 (RFC 3629): util/utf8's strict checks. */
bool sl__utf8_valid(const char *buf, size_t len) {
  return sl_utf8_valid(buf, len);
}

size_t sl__utf8_valid_prefix(const char *buf, size_t len) {
  return sl_utf8_valid_prefix(buf, len);
}

void sl__sbuf_add(sl_sbuf *b, const void *data, size_t n) {
  if (b->oom)
    return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) {
      if (cap > SIZE_MAX / 2) {
        b->oom = true;
        return;
      }
      cap *= 2;
    }
    char *np = sl_realloc(b->p, cap);
    if (!np) {
      b->oom = true;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
  if (n)
    memcpy(b->p + b->len, data, n);
  b->len += n;
  b->p[b->len] = 0;
}

void sl__sbuf_adds(sl_sbuf *b, const char *s) {
  sl__sbuf_add(b, s, strlen(s));
}

void sl__sbuf_addf(sl_sbuf *b, const char *fmt, ...) {
  char small[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->oom = true;
    return;
  }
  if ((size_t)n < sizeof small) {
    sl__sbuf_add(b, small, (size_t)n);
    return;
  }
  char *big = sl_malloc((size_t)n + 1);
  if (!big) {
    b->oom = true;
    return;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  sl__sbuf_add(b, big, (size_t)n);
  sl_free(big);
}

static int dump_cb(const char *buf, size_t size, void *data) {
  sl_sbuf *b = data;
  sl__sbuf_add(b, buf, size);
  return b->oom ? -1 : 0;
}

void sl__sbuf_add_json(sl_sbuf *b, const json_t *j) {
  if (!j) {
    b->oom = true;
    return;
  }
  if (json_dump_callback(j, dump_cb, b, JSON_COMPACT) != 0)
    b->oom = true;
}

void sl__sbuf_free(sl_sbuf *b) {
  sl_free(b->p);
  *b = (sl_sbuf){0};
}

json_t *sl__json_str_lossy(const char *buf, size_t len) {
  if (sl__utf8_valid(buf, len))
    return json_stringn(buf, len);
  sl_sbuf b = {0};
  size_t i = 0;
  while (i < len) {
    size_t at = i;
    uint32_t cp;
    if (sl_utf8_decode_valid(buf, len, &i, &cp)) {
      sl__sbuf_add(&b, buf + at, i - at);
    } else {
      sl__sbuf_add(&b, "\xEF\xBF\xBD", 3);
      i++;
    }
  }
  json_t *s = b.oom ? NULL : json_stringn(b.p ? b.p : "", b.len);
  sl__sbuf_free(&b);
  return s;
}

/* jansson keeps libc's allocator: jansson 2.14 dereferences NULL when an
 * allocation fails inside json_loadb (found by the fault-injection test), so
 * routing it through sl_malloc's fault injection would only crash tests, and
 * a per-request budget cannot fail an allocation either. Its memory is
 * bounded before it runs instead (sl__srv_json_scan). Everything the server
 * itself allocates goes through sl_malloc. */
void sl__srv_json_init(void) {}

void sl__srv_error_set(sl_srv_error *e, int http, const char *code,
                       const char *param, const char *fmt, ...) {
  memset(e, 0, sizeof *e);
  e->http = http;
  snprintf(e->code, sizeof e->code, "%s", code ? code : "");
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
}

static const char *anthropic_type(int http) {
  switch (http) {
  case 401:
    return "authentication_error";
  case 403:
    return "permission_error";
  case 404:
    return "not_found_error";
  case 413:
    return "request_too_large";
  case 429:
    return "rate_limit_error";
  case 503:
  case 529:
    return "overloaded_error";
  default:
    return http >= 500 ? "api_error" : "invalid_request_error";
  }
}

json_t *sl__srv_error_json(sl_srv_family fam, const sl_srv_error *e) {
  json_t *msg = sl__json_str_lossy(e->message, strlen(e->message));
  if (fam == SL_SRV_FAMILY_ANTHROPIC)
    return json_pack("{s:s,s:{s:s,s:o}}", "type", "error", "error", "type",
                     anthropic_type(e->http), "message", msg);
  const char *type = e->http >= 500 ? "server_error" : "invalid_request_error";
  json_t *err =
      json_pack("{s:o,s:s,s:o,s:o}", "message", msg, "type", type, "param",
                e->param[0] ? json_string(e->param) : json_null(), "code",
                e->code[0] ? json_string(e->code) : json_null());
  if (err && (e->est_bytes || e->limit_bytes)) {
    json_object_set_new(err, "estimated_bytes",
                        json_integer((json_int_t)e->est_bytes));
    json_object_set_new(err, "limit_bytes",
                        json_integer((json_int_t)e->limit_bytes));
  }
  return err ? json_pack("{s:o}", "error", err) : NULL;
}
