/* sl_model_tool: the forward pass, driven from Python tests.
 *
 *   sl_model_tool logits MODEL < ids     one sequence of token ids per line;
 *                                         writes every position's logits as
 *                                         little-endian float32 to stdout
 *   sl_model_tool greedy MODEL N < ids   greedy continuation of N tokens per
 *                                         line; prints the ids, one line each
 *   sl_model_tool batch MODEL N < ids    greedy continuation of N tokens of
 *                                         every line (at most 16) at once:
 *                                         one prefill batch of all lines,
 *                                         then N decode steps of them all;
 *                                         prints what greedy prints, so a
 *                                         test compares a sequence alone
 *                                         with it in company (DESIGN.md I9)
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

/* The stream of SLUICE_DEVICE (cpu by default); NULL with *rc set when it
 * cannot be had. */
static sl_stream_t *tool_stream(int *rc) {
  sl_device_t *dev = sl_cpu_device();
  const char *dv = getenv("SLUICE_DEVICE");
  sl_engine_device want = SL_ENGINE_DEVICE_CPU;
  if (dv && *dv && !sl_engine_device_parse(dv, &want)) {
    fprintf(stderr, "sl_model_tool: SLUICE_DEVICE: not cpu, cuda or auto\n");
    *rc = 2;
    return NULL;
  }
  if (want != SL_ENGINE_DEVICE_CPU) {
    dev = sl_engine_resolve_device(want);
    if (want == SL_ENGINE_DEVICE_CUDA &&
        sl_device_kind_of(dev) != SL_DEVICE_CUDA) {
      *rc = 77;
      return NULL;
    }
  }
  return sl_thread_stream(dev);
}

#define BATCH_MAX   16
#define BATCH_CTX   1024 /* positions per sequence */
#define BATCH_BLOCK 16

/* The batch mode (see the top). */
static int run_batch(const char *path, int n_gen) {
  char err[512];
  sl_status st;
  sl_model_t *m = sl_model_load(path, &st, err, sizeof err);
  if (!m) {
    fprintf(stderr, "sl_model_tool: %s\n", err);
    return 1;
  }
  const sl_model_hparams *hp = sl_model_hparams_of(m);
  int rc = 0;
  sl_stream_t *s = tool_stream(&rc);
  if (!s) {
    sl_model_free(m);
    return rc;
  }
  static int32_t prompt[BATCH_MAX][BATCH_CTX];
  int plen[BATCH_MAX], ns = 0, n;
  while (ns < BATCH_MAX &&
         (n = read_line_ids(stdin, prompt[ns], BATCH_CTX)) >= 0)
    if (n > 0)
      plen[ns++] = n;
  int bps = BATCH_CTX / BATCH_BLOCK; /* blocks per sequence */
  sl_kv_view kv = {NULL, (int)hp->n_layer, bps * (ns ? ns : 1), BATCH_BLOCK,
                   (int)(hp->n_head_kv * hp->head_dim)};
  int32_t *table = sl_malloc(sizeof(int32_t) * (size_t)kv.n_blocks);
  int32_t *tokens = sl_malloc(sizeof(int32_t) * BATCH_MAX * BATCH_CTX);
  float *logits = sl_malloc(sizeof(float) * BATCH_MAX * (size_t)hp->n_vocab);
  int32_t out[BATCH_MAX][BATCH_CTX];
  sl_batch_seq seqs[BATCH_MAX];
  sl_batch_ctx_t *bc = NULL;
  for (int i = 0; i < kv.n_blocks; i++)
    table[i] = i;
  if ((st = sl_buf_alloc(s, sl_kv_view_bytes(&kv), &kv.buf)) != SL_OK ||
      (st = sl_batch_ctx_create2(m, &kv, s, 0, &bc, err, sizeof err)) !=
          SL_OK) {
    fprintf(stderr, "sl_model_tool: context: %s %s\n", sl_status_str(st), err);
    rc = 1;
    goto done;
  }
  for (int step = 0; step <= n_gen && ns > 0 && rc == 0; step++) {
    /* step 0: every prompt in one batch; then one token each */
    int nt = 0;
    for (int i = 0; i < ns; i++) {
      int k = step == 0 ? plen[i] : 1,
          pos0 = step == 0 ? 0 : plen[i] + step - 1;
      if (pos0 + k > BATCH_CTX) {
        fprintf(stderr, "sl_model_tool: batch: past %d positions\n", BATCH_CTX);
        rc = 1;
        goto done;
      }
      seqs[i] =
          (sl_batch_seq){table + i * bps, bps,   pos0,     nt,   k,    true,
                         false,           false, step > 0, NULL, false};
      if (step == 0)
        memcpy(tokens + nt, prompt[i], sizeof(int32_t) * (size_t)k);
      else
        tokens[nt] = out[i][step - 1];
      nt += k;
    }
    if (step == n_gen)
      break;
    sl_batch b = {tokens, nt, seqs, ns};
    if ((st = sl_batch_ctx_run(bc, &b, logits)) != SL_OK) {
      fprintf(stderr, "sl_model_tool: batch: %s\n", sl_status_str(st));
      rc = 1;
      break;
    }
    for (int i = 0; i < ns; i++) {
      const float *lg = logits + (size_t)i * (size_t)hp->n_vocab;
      int32_t best = 0;
      for (int64_t v = 1; v < hp->n_vocab; v++)
        if (lg[v] > lg[best])
          best = (int32_t)v;
      out[i][step] = best;
    }
  }
  for (int i = 0; rc == 0 && i < ns; i++) {
    for (int k = 0; k < n_gen; k++)
      printf(k ? " %d" : "%d", out[i][k]);
    printf("\n");
  }
done:
  sl_batch_ctx_free(bc);
  sl_buf_release(kv.buf);
  sl_free(logits);
  sl_free(tokens);
  sl_free(table);
  sl_sync_and_clear_cache(s);
  sl_model_free(m);
  sl_clear_thread_streams();
  sl_rt_shutdown();
  return rc;
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
  if (argc < 3 || (strcmp(argv[1], "logits") && strcmp(argv[1], "greedy") &&
                   strcmp(argv[1], "batch"))) {
    fprintf(stderr, "usage: sl_model_tool logits|greedy|batch MODEL [N] < ids "
                    "| bytes MODEL | isa\n");
    return 2;
  }
  if (isa_rc)
    return isa_rc;
  if (strcmp(argv[1], "batch") == 0)
    return run_batch(argv[2], argc > 3 ? atoi(argv[3]) : 0);
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
  int src = 0;
  sl_stream_t *s = tool_stream(&src);
  if (!s)
    return src;
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
