/* Model helpers shared by the CLI, the benchmarks and the server: the
 * default model's location and prefaulting the weights. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sluice/model.h"

#define DEFAULT_MODEL_NAME "SmolLM2-135M-Instruct.Q4_1.gguf"

const char *sl_model_default_path(char *buf, size_t cap) {
  const char *env = getenv("SLUICE_MODEL");
  if (env && *env)
    return env;
  snprintf(buf, cap, "models/%s", DEFAULT_MODEL_NAME);
  if (access(buf, R_OK) == 0)
    return buf;
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      snprintf(buf, cap, "%s/../models/%s", exe, DEFAULT_MODEL_NAME);
      if (access(buf, R_OK) == 0)
        return buf;
    }
  }
  snprintf(buf, cap, "models/%s", DEFAULT_MODEL_NAME);
  return buf;
}

void sl_model_prefault(const sl_model_t *m, bool progress) {
  const sl_gguf_t *g = sl_model_gguf(m);
  int64_t nt = sl_gguf_n_tensors(g);
  uint64_t total = 0, done = 0;
  for (int64_t i = 0; i < nt; i++)
    total += sl_gguf_tensor_at(g, i)->nbytes;
  bool tty = progress && isatty(STDERR_FILENO);
  volatile unsigned char sink = 0;
  int last = -1;
  for (int64_t i = 0; i < nt; i++) {
    const sl_gguf_tensor *t = sl_gguf_tensor_at(g, i);
    const unsigned char *p = t->data;
    for (uint64_t o = 0; o < t->nbytes; o += 4096)
      sink ^= p[o];
    done += t->nbytes;
    int pct = total ? (int)(100 * done / total) : 100;
    if (tty && pct != last) {
      int bar = pct / 4;
      fprintf(stderr, "\rloading [%.*s%*s] %3d%%", bar,
              "#########################", 25 - bar, "", pct);
      last = pct;
    }
  }
  if (tty)
    fputc('\n', stderr);
  (void)sink;
}
