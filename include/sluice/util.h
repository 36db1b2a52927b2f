/* sluice — util: assertions, logging, the host allocation funnel, clocks.
 *
 * Threading: everything here may be called from any thread.
 */
#ifndef SLUICE_UTIL_H
#define SLUICE_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sluice/status.h"

/* ---- assertions: bugs abort ------------------------------------------- */

/* Prints file, line, the failed expression and a backtrace, then aborts.
 * Always on, whatever NDEBUG says. */
_Noreturn void sl__assert_fail(const char *file, int line, const char *expr,
                               const char *msg);

#define SL_ASSERT(cond)                                                        \
  ((cond) ? (void)0 : sl__assert_fail(__FILE__, __LINE__, #cond, NULL))
#define SL_ASSERT_MSG(cond, msg)                                               \
  ((cond) ? (void)0 : sl__assert_fail(__FILE__, __LINE__, #cond, (msg)))

/* ---- logging ------------------------------------------------------------ */

typedef enum sl_log_level {
  SL_LOG_DEBUG = 0,
  SL_LOG_INFO = 1,
  SL_LOG_WARN = 2,
  SL_LOG_ERROR = 3,
  SL_LOG_OFF = 4,
} sl_log_level;

/* Sets the minimum level written to stderr (default SL_LOG_WARN, or the
 * SLUICE_LOG environment variable: debug|info|warn|error|off). */
void sl_log_set_level(sl_log_level lvl);
sl_log_level sl_log_get_level(void);

/* printf-style; writes one line to stderr when `lvl` is enabled. */
void sl_log(sl_log_level lvl, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define SL_LOGD(...) sl_log(SL_LOG_DEBUG, __VA_ARGS__)
#define SL_LOGI(...) sl_log(SL_LOG_INFO, __VA_ARGS__)
#define SL_LOGW(...) sl_log(SL_LOG_WARN, __VA_ARGS__)
#define SL_LOGE(...) sl_log(SL_LOG_ERROR, __VA_ARGS__)

/* ---- host memory funnel -------------------------------------------------- */

/* Host allocations. The plain forms return NULL on failure (callers turn that
 * into SL_ERR_NOMEM). All are counted; sl_free(NULL) is a no-op. The caller
 * owns what is returned and frees it with sl_free. */
void *sl_malloc(size_t n);
void *sl_calloc(size_t count, size_t size); /* checks count*size overflow */
void *sl_realloc(void *p, size_t n);
char *sl_strdup(const char *s);
void sl_free(void *p);

/* Returns true and stores a*b in *out unless the product overflows. */
bool sl_mul_ok(size_t a, size_t b, size_t *out);

/* Fault injection (tests): the Nth host allocation from now fails (1 = the
 * next one); 0 disables. Returns the number of allocations made so far. */
void sl_malloc_fail_after(uint64_t n);
uint64_t sl_malloc_count(void);
/* Bytes currently held through the funnel. */
size_t sl_malloc_live_bytes(void);

/* ---- parsing ------------------------------------------------------------ */

/* A whole decimal integer within [lo, hi]; false on junk, overflow or out
 * of range (nothing stored then). For flags and settings. */
bool sl_parse_long(const char *s, long lo, long hi, long *out);

/* Writes s[0..n) to f as a JSON string literal (quotes, backslashes and
 * control bytes escaped; other bytes as they are). For the CLI's and the
 * benches' JSON output. */
void sl_fput_json_str(FILE *f, const char *s, size_t n);

/* ---- clocks ------------------------------------------------------------- */

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t sl_now_ns(void);
static inline double sl_ns_to_ms(uint64_t ns) {
  return (double)ns / 1e6;
}

#endif
