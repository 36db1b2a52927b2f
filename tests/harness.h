/* A small test harness: each tests/test_<module>.c is one ctest binary.
 *
 *   static void test_foo(void) { CHECK(1 + 1 == 2); CHECK_EQ_INT(a, b); }
 *   int main(int argc, char **argv) {
 *     SL_TEST_CHILDREN(argc, argv, {"boom", child_boom});  // optional
 *     RUN(test_foo);
 *     return sl_test_finish();
 *   }
 *
 * SL_TEST_ONLY="test_foo test_bar" runs only the cases it names.
 * Exit code 77 marks the whole binary as skipped (ctest SKIP_RETURN_CODE).
 * Death tests: sl_test_spawn_child("boom", &status, err, sizeof err) re-runs
 * this binary as `<self> --child boom` and returns its wait status and its
 * stderr, so aborts and exit codes can be checked without fork()ing a process
 * that holds threads.
 */
#ifndef SLUICE_TEST_HARNESS_H
#define SLUICE_TEST_HARNESS_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* SL_TEST_TSAN: 1 in the ThreadSanitizer build (gcc defines
 * __SANITIZE_THREAD__, clang has the feature), where every memory access
 * costs 5-15 times as much; SL_TEST_ASAN the same for AddressSanitizer
 * (2-3 times). SL_TEST_SANITIZED: either. The engine tests then take the
 * same code paths (the same threads, locks, clears, chunk boundaries and
 * checks) on a lighter workload: fewer tokens, fewer rounds, fewer
 * prompts. The normal build runs the full workloads (and the mutants), so
 * what only the number of rounds shows is shown there, once. */
#if defined(__SANITIZE_THREAD__)
#define SL_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SL_TEST_TSAN 1
#endif
#endif
#ifndef SL_TEST_TSAN
#define SL_TEST_TSAN 0
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SL_TEST_ASAN 1
#endif
#endif
#ifndef SL_TEST_ASAN
#define SL_TEST_ASAN 0
#endif
#define SL_TEST_SANITIZED (SL_TEST_TSAN || SL_TEST_ASAN)

static int sl_test_failures;
static int sl_test_checks;
static const char *sl_test_current = "";

#define CHECK(cond)                                                            \
  do {                                                                         \
    sl_test_checks++;                                                          \
    if (!(cond)) {                                                             \
      sl_test_failures++;                                                      \
      fprintf(stderr, "FAIL %s:%d [%s]: %s\n", __FILE__, __LINE__,             \
              sl_test_current, #cond);                                         \
    }                                                                          \
  } while (0)

#define CHECK_MSG(cond, ...)                                                   \
  do {                                                                         \
    sl_test_checks++;                                                          \
    if (!(cond)) {                                                             \
      sl_test_failures++;                                                      \
      fprintf(stderr, "FAIL %s:%d [%s]: %s: ", __FILE__, __LINE__,             \
              sl_test_current, #cond);                                         \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
    }                                                                          \
  } while (0)

#define CHECK_EQ_INT(a, b)                                                     \
  CHECK_MSG((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a),  \
            (long long)(b))

#define CHECK_OK(expr)                                                         \
  do {                                                                         \
    int sl__st = (int)(expr);                                                  \
    CHECK_MSG(sl__st == 0, "status %d", sl__st);                               \
  } while (0)

/* Whether case `name` runs: every case unless SL_TEST_ONLY names some (a
 * list of case names, separated by spaces or commas); tools/mutants.py sets
 * it from a mutant's `case:` line, so that a kill needs only the case that
 * makes it. */
static inline bool sl_test_selected(const char *name) {
  const char *only = getenv("SL_TEST_ONLY");
  if (!only || !*only)
    return true;
  size_t n = strlen(name);
  for (const char *p = only; *p;) {
    p += strspn(p, " ,");
    size_t w = strcspn(p, " ,");
    if (w == n && memcmp(p, name, n) == 0)
      return true;
    p += w;
  }
  return false;
}

#define RUN(fn)                                                                \
  do {                                                                         \
    if (!sl_test_selected(#fn))                                                \
      break;                                                                   \
    sl_test_current = #fn;                                                     \
    int sl__before = sl_test_failures;                                         \
    fprintf(stderr, "-- %s\n", #fn);                                           \
    fn();                                                                      \
    fprintf(stderr, "   %s %s\n", #fn,                                         \
            sl_test_failures == sl__before ? "ok" : "FAILED");                 \
  } while (0)

/* A whole file's bytes, NUL-terminated (free with free()); NULL when it
 * cannot be read. */
static inline char *sl_test_read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
    free(p);
    p = NULL;
  }
  if (p)
    p[n] = 0;
  fclose(f);
  return p;
}

static inline int sl_test_finish(void) {
  fprintf(stderr, "%d checks, %d failures\n", sl_test_checks, sl_test_failures);
  return sl_test_failures ? 1 : 0;
}

typedef struct sl_test_child {
  const char *name;
  void (*fn)(void);
} sl_test_child;

/* Dispatches `--child NAME` to the matching function, which should not
 * return (it aborts or exits); if it does, the child exits 0. */
#define SL_TEST_CHILDREN(argc, argv, ...)                                      \
  do {                                                                         \
    static const sl_test_child sl__kids[] = {__VA_ARGS__};                     \
    if ((argc) == 3 && strcmp((argv)[1], "--child") == 0) {                    \
      for (size_t i = 0; i < sizeof sl__kids / sizeof sl__kids[0]; i++)        \
        if (strcmp(sl__kids[i].name, (argv)[2]) == 0) {                        \
          sl__kids[i].fn();                                                    \
          exit(0);                                                             \
        }                                                                      \
      exit(99);                                                                \
    }                                                                          \
  } while (0)

/* Runs this binary with `--child name`; stores its wait status and up to
 * errcap-1 bytes of its stderr (NUL-terminated). Returns 0 on success. */
static inline int sl_test_spawn_child(const char *name, int *wstatus, char *err,
                                      size_t errcap) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    return -1;
  self[n] = 0;
  char tmpl[] = "/tmp/sl_test_child_XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0)
    return -1;
  unlink(tmpl);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd, 2);
  char *args[] = {self, (char *)"--child", (char *)name, NULL};
  pid_t pid;
  int rc = posix_spawn(&pid, self, &fa, NULL, args, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    close(fd);
    return -1;
  }
  /* a child that hangs is killed after SL_TEST_CHILD_TIMEOUT_S (120 s):
   * death tests must never hang the suite or leave a process behind */
  const char *tv = getenv("SL_TEST_CHILD_TIMEOUT_S");
  int limit_ms = (tv && atoi(tv) > 0 ? atoi(tv) : 120) * 1000;
  bool timed_out = false;
  for (int waited = 0;; waited += 10) {
    pid_t w = waitpid(pid, wstatus, WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR))
      break;
    if (waited >= limit_ms) {
      kill(pid, SIGKILL);
      waitpid(pid, wstatus, 0);
      timed_out = true;
      break;
    }
    usleep(10000);
  }
  ssize_t got = pread(fd, err, errcap - 1, 0);
  err[got > 0 ? got : 0] = 0;
  if (timed_out)
    snprintf(err + strlen(err), errcap - strlen(err),
             "\n[harness: the child hung and was killed after %d s]\n",
             limit_ms / 1000);
  close(fd);
  return 0;
}

#endif
