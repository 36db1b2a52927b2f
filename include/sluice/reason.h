/* sluice — failure reasons: why a request failed, as the client sees it.
 *
 * One table (libuv style): each reason has its API code string, its HTTP
 * status and a default message. The engine stamps a reason on every failed
 * request; the HTTP layer reads the same entry to build the response, so a
 * client error can never come back as a 500 by a string mismatch. The
 * families' error types follow from the HTTP status (OpenAI: 4xx
 * invalid_request_error, 5xx server_error; Anthropic: its own type per
 * status).
 */
#ifndef SLUICE_REASON_H
#define SLUICE_REASON_H

#include "sluice/status.h"

/* X(NAME, code, http, message) */
#define SL_REASON_MAP(X)                                                       \
  X(NONE, "", 200, "ok")                                                       \
  X(PREFILL_MEMORY_EXCEEDED, "prefill_memory_exceeded", 400,                   \
    "the prefill would exceed the server's memory limit")                      \
  X(CONTEXT_LENGTH_EXCEEDED, "context_length_exceeded", 400,                   \
    "the request needs more KV cache than the server has")                     \
  X(INVALID_REQUEST, "invalid_request", 400, "invalid request")                \
  X(OUT_OF_MEMORY, "out_of_memory", 503,                                       \
    "the server ran out of memory for this request; retry later")              \
  X(SHUTTING_DOWN, "shutting_down", 503, "the server is shutting down")        \
  X(QUEUE_TIMEOUT, "queue_timeout", 503,                                       \
    "the request waited too long for memory or a free slot; retry later")      \
  X(DEVICE_ERROR, "device_error", 500, "the compute device reported an error") \
  X(INTERNAL, "internal_error", 500, "internal server error")

typedef enum sl_reason {
#define SL__REASON_ENUM(name, code, http, msg) SL_REASON_##name,
  SL_REASON_MAP(SL__REASON_ENUM)
#undef SL__REASON_ENUM
      SL_REASON_COUNT
} sl_reason;

/* The API code ("" for NONE), HTTP status and default message of `r`.
 * Out-of-range values read as INTERNAL. Thread-safe. */
const char *sl_reason_code(sl_reason r);
int sl_reason_http(sl_reason r);
const char *sl_reason_message(sl_reason r);

/* The reason a bare status maps to when nothing more specific is known:
 * NOMEM / DEVICE_OOM / MEMORY_LIMIT -> OUT_OF_MEMORY, RANGE ->
 * CONTEXT_LENGTH_EXCEEDED, INVALID_ARG -> INVALID_REQUEST, CANCELLED ->
 * SHUTTING_DOWN, DEVICE* -> DEVICE_ERROR, OK -> NONE, else INTERNAL. */
sl_reason sl_reason_of_status(sl_status st);

#endif
