/* sl_model_tool: the forward pass, driven from Python tests.
 *
 *   sl_model_tool logits MODEL < ids     one sequence of token ids per line;
 *                                         writes every position's logits as
 *                                         little-endian float32 to stdout
 *   sl_model_tool greedy MODEL N < ids   greedy continuation of N tokens per
 *                                         line; prints the ids, one line each
 *   sl_model_tool isa                    prints the CPU kernels' ISA level
 *
 * Each line runs in a fresh KV cache. Exit 1 with a message on error.
 *
 * SLUICE_DEVICE=cpu|cuda|auto picks the device (default cpu); cuda without
 * a GPU exits 77.
 *
 * A test harness: when SLUICE_ISA (or SLUICE_CPU_ISA) names a level, every
 * mode runs on exactly that level or not at all: exit 77 when this CPU cannot
 * run it, exit 2 for a name that is not scalar, avx2 or avx512. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice/engine.h"
#include "sluice/kern_cpu.h"
#include "sluice/memsync.h"
#include "sluice/model.h"
#include "sluice/util.h"

static int read_line_ids(FILE *f, int32_t *ids, int cap) {
  char line[1 << 16];
  if (!fgets(line, sizeof line, f))
    return -1;
  int n = 0;
  char *p = line, *end;
  while (n < cap) {
    long v = strtol(p, &end, 10);
    if (end == p)
      break;
    ids[n++] = (int32_t)v;
    p = end;
  }
  return n;
}

/* 0 when the kernels run the level SLUICE_ISA asks for (or it is unset);
 * else the exit code, with a message. */
static int check_isa(void) {
  sl_kern_isa want;
  sl_status st = sl_kern_cpu_isa_requested(&want);
  if (st == SL_ERR_NOT_FOUND)
    return 0;
  if (st != SL_OK) {
    fprintf(stderr, "sl_model_tool: SLUICE_ISA: not scalar, avx2 or avx512\n");
    return 2;
  }
  if (!sl_kern_cpu_isa_supported(want)) {
    fprintf(stderr, "sl_model_tool: this CPU cannot run %s\n",
            sl_kern_isa_name(want));
    return 77;
  }
  if (sl_kern_cpu_isa() != want) {
    fprintf(stderr, "sl_model_tool: SLUICE_ISA=%s, but the kernels chose %s\n",
            sl_kern_isa_name(want), sl_kern_isa_name(sl_kern_cpu_isa()));
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  int isa_rc = check_isa();
  if (argc == 2 && strcmp(argv[1], "isa") == 0) {
    if (isa_rc == 0)
      printf("%s\n", sl_kern_isa_name(sl_kern_cpu_isa()));
    return isa_rc;
  }
  if (argc == 3 && strcmp(argv[1], "bytes") == 0) {
    /* the weights' bytes, and those one decode token reads */
    char err[512];
    sl_status st;
    sl_model_t *m = sl_model_load(argv[2], &st, err, sizeof err);
    if (!m) {
      fprintf(stderr, "sl_model_tool: %s\n", err);
      return 1;
    }
    printf("{\"weight_bytes\": %llu, \"bytes_per_token\": %llu, "
           "\"n_vocab\": %lld, \"tied\": %s}\n",
           (unsigned long long)sl_model_weight_bytes(m),
           (unsigned long long)sl_model_bytes_per_token(m),
           (long long)sl_model_hparams_of(m)->n_vocab,
           sl_model_hparams_of(m)->tied_embeddings ? "true" : "false");
    sl_model_free(m);
    return 0;
  }
  if (argc < 3 || (strcmp(argv[1], "logits") && strcmp(argv[1], "greedy"))) {
    fprintf(stderr, "usage: sl_model_tool logits|greedy MODEL [N] < ids | "
                    "bytes MODEL | isa\n");
    return 2;
  }
  if (isa_rc)
    return isa_rc;
  bool greedy = strcmp(argv[1], "greedy") == 0;
  int n_gen = greedy && argc > 3 ? atoi(argv[3]) : 0;
  char err[512];
  sl_status st;
  sl_model_t *m = sl_model_load(argv[2], &st, err, sizeof err);
  if (!m) {
    fprintf(stderr, "sl_model_tool: %s\n", err);
    return 1;
  }
  const sl_model_hparams *hp = sl_model_hparams_of(m);
  int n_ctx = 2048;
  sl_device_t *dev = sl_cpu_device();
  const char *dv = getenv("SLUICE_DEVICE");
  sl_engine_device want = SL_ENGINE_DEVICE_CPU;
  if (dv && *dv && !sl_engine_device_parse(dv, &want)) {
    fprintf(stderr, "sl_model_tool: SLUICE_DEVICE: not cpu, cuda or auto\n");
    return 2;
  }
  if (want != SL_ENGINE_DEVICE_CPU) {
    dev = sl_engine_resolve_device(want);
    if (want == SL_ENGINE_DEVICE_CUDA &&
        sl_device_kind_of(dev) != SL_DEVICE_CUDA)
      return 77;
  }
  sl_stream_t *s = sl_thread_stream(dev);
  sl_ctx_t *c;
  if ((st = sl_ctx_create(m, s, n_ctx, 0, &c)) != SL_OK) {
    fprintf(stderr, "sl_model_tool: context: %s\n", sl_status_str(st));
    return 1;
  }
  int32_t *ids = sl_malloc(sizeof(int32_t) * (size_t)n_ctx);
  float *logits =
      sl_malloc(sizeof(float) * (size_t)hp->n_vocab * (size_t)n_ctx);
  int rc = 0, n;
  while (rc == 0 && (n = read_line_ids(stdin, ids, n_ctx)) >= 0) {
    if (n == 0)
      continue;
    sl_ctx_truncate(c, 0);
    if (!greedy) {
      st = sl_ctx_eval(c, ids, n, logits, true);
      if (st == SL_OK)
        fwrite(logits, sizeof(float), (size_t)n * (size_t)hp->n_vocab, stdout);
    } else {
      st = sl_ctx_eval(c, ids, n, logits, false);
      for (int i = 0; st == SL_OK && i < n_gen; i++) {
        int32_t best = 0;
        for (int64_t v = 1; v < hp->n_vocab; v++)
          if (logits[v] > logits[best])
            best = (int32_t)v;
        printf(i ? " %d" : "%d", best);
        if (i + 1 < n_gen)
          st = sl_ctx_eval(c, &best, 1, logits, false);
      }
      printf("\n");
    }
    fflush(stdout);
    if (st != SL_OK) {
      fprintf(stderr, "sl_model_tool: eval: %s\n", sl_status_str(st));
      rc = 1;
    }
  }
  sl_free(logits);
  sl_free(ids);
  sl_ctx_free(c);
  sl_sync_and_clear_cache(s);
  sl_model_free(m);
  sl_clear_thread_streams();
  sl_rt_shutdown();
  return rc;
}
