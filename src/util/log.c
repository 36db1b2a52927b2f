#define _GNU_SOURCE
#include <execinfo.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "sluice/util.h"

static _Atomic int g_level = -1; /* -1: not yet read from the environment */

static int level_from_env(void) {
  const char *e = getenv("SLUICE_LOG");
  if (!e)
    return SL_LOG_WARN;
  static const char *names[] = {"debug", "info", "warn", "error", "off"};
  for (int i = 0; i < 5; i++)
    if (strcasecmp(e, names[i]) == 0)
      return i;
  return SL_LOG_WARN;
}

sl_log_level sl_log_get_level(void) {
  int l = atomic_load(&g_level);
  if (l < 0) {
    l = level_from_env();
    atomic_store(&g_level, l);
  }
  return (sl_log_level)l;
}

void sl_log_set_level(sl_log_level lvl) {
  atomic_store(&g_level, (int)lvl);
}

void sl_log(sl_log_level lvl, const char *fmt, ...) {
  if (lvl < sl_log_get_level())
    return;
  static const char tag[] = "DIWE";
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "sluice %c: ", tag[lvl < 4 ? lvl : 3]);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = strlen(buf);
  buf[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, buf, len);
  (void)w;
}

_Noreturn void sl__assert_fail(const char *file, int line, const char *expr,
                               const char *msg) {
  fprintf(stderr, "sluice: assertion failed at %s:%d: %s%s%s\n", file, line,
          expr, msg ? ": " : "", msg ? msg : "");
  void *frames[48];
  int n = backtrace(frames, 48);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  abort();
}

uint64_t sl_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
