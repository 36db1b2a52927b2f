/* sluice — status codes.
 *
 * Every fallible action returns an sl_status. Codes and their strings come
 * from the one X-macro below (libuv style). SL_OK is zero; every failure is
 * negative, so `if (st < 0)` and `if (st != SL_OK)` both work.
 */
#ifndef SLUICE_STATUS_H
#define SLUICE_STATUS_H

#define SL_STATUS_MAP(X)                                                       \
  X(OK, 0, "ok")                                                               \
  X(ERR_NOMEM, -1, "out of host memory")                                       \
  X(ERR_MEMORY_LIMIT, -2, "allocation would exceed the memory limit")          \
  X(ERR_DEVICE_OOM, -3, "out of device memory")                                \
  X(ERR_INVALID_ARG, -4, "invalid argument")                                   \
  X(ERR_NO_DEVICE, -5, "device not available")                                 \
  X(ERR_DEVICE, -6, "device error")                                            \
  X(ERR_DEVICE_FATAL, -7, "fatal device error")                                \
  X(ERR_IO, -8, "I/O error")                                                   \
  X(ERR_FORMAT, -9, "malformed input")                                         \
  X(ERR_UNSUPPORTED, -10, "unsupported")                                       \
  X(ERR_NOT_FOUND, -11, "not found")                                           \
  X(ERR_RANGE, -12, "value out of range")                                      \
  X(ERR_STATE, -13, "invalid state")                                           \
  X(ERR_THREAD, -14, "thread error")                                           \
  X(ERR_OVERFLOW, -15, "size overflow")                                        \
  X(ERR_TIMEOUT, -16, "timed out")                                             \
  X(ERR_CANCELLED, -17, "cancelled")

typedef enum sl_status {
#define SL__STATUS_ENUM(name, code, str) SL_##name = (code),
  SL_STATUS_MAP(SL__STATUS_ENUM)
#undef SL__STATUS_ENUM
} sl_status;

/* Returns a static, human-readable string for `st` ("unknown status" for a
 * value outside the map). Thread-safe. */
const char *sl_status_str(sl_status st);

/* Returns the symbolic name of `st`, e.g. "ERR_MEMORY_LIMIT". Thread-safe. */
const char *sl_status_name(sl_status st);

#endif
