/* sluice — server: text and JSON helpers (json.c): UTF-8 checks, a string
 * builder, API error bodies. No engine, no HTTP. */
#ifndef SLUICE_SERVER_JSON_H
#define SLUICE_SERVER_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True when buf[0..len) is well-formed UTF-8 (no overlongs, no surrogates,
 * nothing above U+10FFFF). */
bool sl__utf8_valid(const char *buf, size_t len);

/* Length of the longest prefix of buf[0..len) that is whole, valid UTF-8
 * characters (an incomplete sequence at the end is left out). */
size_t sl__utf8_valid_prefix(const char *buf, size_t len);

/* A growable byte string; `oom` sticks once an append failed. */
typedef struct sl_sbuf {
  char *p;
  size_t len, cap;
  bool oom;
} sl_sbuf;

void sl__sbuf_add(sl_sbuf *b, const void *data, size_t n);
void sl__sbuf_adds(sl_sbuf *b, const char *s);
void sl__sbuf_addf(sl_sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Appends the compact serialization of `j` (borrowed). */
void sl__sbuf_add_json(sl_sbuf *b, const json_t *j);
void sl__sbuf_free(sl_sbuf *b);

/* A JSON string of buf[0..len), invalid UTF-8 replaced by U+FFFD. New
 * reference, or NULL when out of memory. */
json_t *sl__json_str_lossy(const char *buf, size_t len);

/* One-time JSON setup (none needed today; jansson keeps libc malloc). */
void sl__srv_json_init(void);

/* Which API's error shape to use. */
typedef enum sl_srv_family {
  SL_SRV_FAMILY_OPENAI = 0,
  SL_SRV_FAMILY_ANTHROPIC = 1,
} sl_srv_family;

/* An API error: HTTP status, and the fields of the error body. */
typedef struct sl_srv_error {
  int http;       /* 400, 401, 404, 405, 413, 500, 503 */
  char code[48];  /* OpenAI error.code ("" = null) */
  char param[64]; /* OpenAI error.param ("" = null) */
  char message[512];
  uint64_t est_bytes, limit_bytes; /* memory-guard refusals (0: absent) */
} sl_srv_error;

/* Fills *e. `code` and `param` may be NULL. */
void sl__srv_error_set(sl_srv_error *e, int http, const char *code,
                       const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* The error body in the family's shape:
 *   OpenAI:    {"error":{"message","type","param","code"}}
 *   Anthropic: {"type":"error","error":{"type","message"}}
 * New reference, or NULL when out of memory. */
json_t *sl__srv_error_json(sl_srv_family fam, const sl_srv_error *e);

#endif
