#include "sluice/reason.h"

static const struct {
  const char *code;
  int http;
  const char *msg;
} g_reasons[] = {
#define SL__REASON_ROW(name, code, http, msg) {code, http, msg},
    SL_REASON_MAP(SL__REASON_ROW)
#undef SL__REASON_ROW
};

static sl_reason clamp(sl_reason r) {
  return (unsigned)r < SL_REASON_COUNT ? r : SL_REASON_INTERNAL;
}

const char *sl_reason_code(sl_reason r) {
  return g_reasons[clamp(r)].code;
}
int sl_reason_http(sl_reason r) {
  return g_reasons[clamp(r)].http;
}
const char *sl_reason_message(sl_reason r) {
  return g_reasons[clamp(r)].msg;
}

sl_reason sl_reason_of_status(sl_status st) {
  switch (st) {
  case SL_OK:
    return SL_REASON_NONE;
  case SL_ERR_NOMEM:
  case SL_ERR_DEVICE_OOM:
  case SL_ERR_MEMORY_LIMIT:
    return SL_REASON_OUT_OF_MEMORY;
  case SL_ERR_RANGE:
    return SL_REASON_CONTEXT_LENGTH_EXCEEDED;
  case SL_ERR_INVALID_ARG:
    return SL_REASON_INVALID_REQUEST;
  case SL_ERR_CANCELLED:
    return SL_REASON_SHUTTING_DOWN;
  case SL_ERR_DEVICE:
  case SL_ERR_DEVICE_FATAL:
  case SL_ERR_NO_DEVICE:
    return SL_REASON_DEVICE_ERROR;
  default:
    return SL_REASON_INTERNAL;
  }
}
