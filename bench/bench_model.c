/* `sluice bench model`: prefill and decode speed in llama-bench's sense
 * (pp512: one 512-token batch; tg128: 128 tokens one at a time from an empty
 * context), decode bandwidth against the machine's read bandwidth measured in
 * the same run, peak RSS, and optionally llama.cpp on the same file. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "sluice/engine.h"
#include "sluice/flags.h"
#include "sluice/kern_cpu.h"
#include "sluice/kern_cuda.h"
#include "sluice/memsync.h"
#include "sluice/model.h"
#include "sluice/util.h"

typedef struct read_job {
  const uint64_t *buf;
  size_t n; /* words */
  uint64_t out[64];
} read_job;

static void read_worker(void *p, int ith, int nth) {
  read_job *j = p;
  size_t per = (j->n / (size_t)nth) & ~(size_t)7;
  const uint64_t *b = j->buf + per * (size_t)ith;
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
  for (size_t i = 0; i < per; i += 8) {
    a0 += b[i], a1 += b[i + 1], a2 += b[i + 2], a3 += b[i + 3];
    a4 += b[i + 4], a5 += b[i + 5], a6 += b[i + 6], a7 += b[i + 7];
  }
  j->out[ith & 63] = a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7;
}

/* Read bandwidth of `pool`'s threads over a buffer far larger than the
 * caches; best of 5 passes. */
static double measure_read_gbps(sl_kern_pool_t *pool) {
  size_t bytes = 512ull << 20;
  uint64_t *buf = sl_malloc(bytes);
  if (!buf)
    return 0;
  for (size_t i = 0; i < bytes / 8; i++)
    buf[i] = i * 0x9E3779B97F4A7C15ull;
  read_job j = {buf, bytes / 8, {0}};
  double best = 0;
  for (int r = 0; r < 5; r++) {
    uint64_t t0 = sl_now_ns();
    sl_kern_pool_run(pool, read_worker, &j);
    double s = (double)(sl_now_ns() - t0) / 1e9;
    if (bytes / s / 1e9 > best)
      best = bytes / s / 1e9;
  }
  sl_free(buf);
  return best;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Runs the peer and returns its JSON line (caller frees), or NULL. */
typedef struct read_arg {
  sl_buf_t *b;
  size_t bytes;
} read_arg;

static sl_status read_task(const sl_task_ctx *ctx, void *p) {
  read_arg *a = p;
  char *base = sl_buf_ptr(a->b);
  return sl_kcu_read_bench(ctx->native, base + 64, a->bytes, (unsigned *)base);
}

/* Read bandwidth of the device: a pure-read kernel over 4 GiB (or a
 * quarter of what is free), best of 10 passes. */
static double measure_device_read_gbps(sl_stream_t *s) {
  uint64_t total = 0,
           avail = sl_device_mem_available(sl_stream_device(s), &total);
  size_t bytes = 4ull << 30;
  if (avail && bytes > avail / 4)
    bytes = (size_t)(avail / 4) & ~(size_t)15;
  sl_buf_t *b = NULL;
  if (bytes < (64u << 20) || sl_buf_alloc(s, bytes + 64, &b) != SL_OK)
    return 0;
  double best = 0;
  for (int r = 0; r < 10; r++) {
    read_arg a = {b, bytes};
    uint64_t t0 = sl_now_ns(), seq;
    if (sl_stream_submit(s, read_task, &a, sizeof a, &b, 1, &seq) != SL_OK ||
        sl_stream_wait_seq(s, seq) != SL_OK)
      break;
    double gbps = (double)bytes / ((double)(sl_now_ns() - t0));
    if (r > 0 && gbps > best) /* the first pass warms up */
      best = gbps;
  }
  sl_buf_release(b);
  return best;
}

static char *run_peer(const char *model, int threads) {
  char self[PATH_MAX], script[PATH_MAX + 64], cmd[3 * PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  const char *src = getenv("SLUICE_SOURCE_DIR");
  if (src)
    snprintf(script, sizeof script, "%s/scripts/peer_llamacpp.py", src);
  else if (n > 0) {
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
      *slash = 0;
    snprintf(script, sizeof script, "%s/../scripts/peer_llamacpp.py", self);
  } else
    return NULL;
  snprintf(cmd, sizeof cmd, "python3 '%s' --model '%s' --threads %d", script,
           model, threads);
  FILE *p = popen(cmd, "r");
  if (!p)
    return NULL;
  char *line = sl_malloc(4096);
  if (line && !fgets(line, 4096, p)) {
    sl_free(line);
    line = NULL;
  }
  int rc = pclose(p);
  if (rc != 0 && line) {
    sl_free(line);
    line = NULL;
  }
  if (line)
    line[strcspn(line, "\n")] = 0;
  return line;
}

/* Pulls a number after "key": from a flat JSON line. */
static double json_num(const char *json, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(json, pat);
  return p ? strtod(p + strlen(pat), NULL) : 0.0;
}

/* What `sluice bench model`'s command line says. */
typedef struct model_opts {
  const char *model, *peer;
  int threads, reps;
  sl_engine_device dev;
} model_opts;
_Static_assert(sizeof(sl_engine_device) == sizeof(int), "an SL_FLAG_ENUM");

#define AT(f) SL_FLAG_AT(model_opts, f)
static const sl_flag model_flags[] = {
    {SL_FLAG_STR, "-m, --model", "FILE", AT(model), .help = "the GGUF file",
     .def = "the default model"},
    {SL_FLAG_INT, "-t, --threads", "N", AT(threads), 1, 1024,
     .help = "compute threads", .def = "all CPUs"},
    {SL_FLAG_INT, "--reps", "N", AT(reps), 1, 50,
     .help = "repetitions of pp512 and tg128 (the median is reported)"},
    {SL_FLAG_CHOICE, "--peer", "llama-cpp", AT(peer), .choices = "llama-cpp",
     .help = "the same model under llama.cpp's llama-bench, as a ratio"},
    {SL_FLAG_ENUM, "--device", "auto|cpu|cuda", AT(dev),
     .choices = "auto|cpu|cuda", .help = "where the model runs"},
};
#undef AT

static const char model_head[] =
    "usage: sluice bench model [options]\n"
    "  prefill (pp512) and decode (tg128) speed of one model; prints JSON.\n";

int sl_bench_model_main(int argc, char **argv) {
  char defbuf[PATH_MAX];
  model_opts o = {.reps = 3};
  bool help;
  int prc = sl_flags_parse("bench model", SL_FLAGS(model_flags), &o, argc, argv,
                           model_head, NULL, &help);
  if (prc || help)
    return prc;
  const char *model = o.model;
  int threads = o.threads, reps = o.reps;
  bool peer = o.peer != NULL;
  sl_engine_device devsel = o.dev;
  if (threads <= 0)
    threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (!model)
    model = sl_model_default_path(defbuf, sizeof defbuf);
  char err[512];
  sl_status st;
  sl_model_t *m = sl_model_load(model, &st, err, sizeof err);
  if (!m) {
    fprintf(stderr, "sluice bench model: %s\n", err);
    return 1;
  }
  sl_device_t *dev = sl_engine_resolve_device(devsel);
  bool gpu = sl_device_kind_of(dev) == SL_DEVICE_CUDA;
  if (!gpu)
    sl_model_prefault(m, true);
  const sl_model_hparams *hp = sl_model_hparams_of(m);
  sl_stream_t *s = sl_thread_stream(dev);
  sl_ctx_t *c = NULL;
  int rc = 1;
  enum { PP = 512, TG = 128 };
  int32_t *toks = sl_malloc(sizeof(int32_t) * PP);
  float *logits = sl_malloc(sizeof(float) * (size_t)hp->n_vocab);
  double pp[50], tg[50];
  char cerr[320] = "";
  if (!toks || !logits ||
      (st = sl_ctx_create2(m, s, 2048, threads, &c, cerr, sizeof cerr)) !=
          SL_OK) {
    fprintf(stderr, "sluice bench model: cannot make a context%s%s\n",
            cerr[0] ? ": " : "", cerr);
    goto out;
  }
  for (int i = 0; i < PP; i++)
    toks[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
  sl_ctx_eval(c, toks, 16, logits, false); /* warm-up */
  for (int r = 0; r < reps; r++) {
    sl_ctx_truncate(c, 0);
    uint64_t t0 = sl_now_ns();
    if ((st = sl_ctx_eval(c, toks, PP, logits, false)) != SL_OK)
      goto fail_eval;
    pp[r] = PP / ((double)(sl_now_ns() - t0) / 1e9);
    sl_ctx_truncate(c, 0);
    t0 = sl_now_ns();
    for (int i = 0; i < TG; i++)
      if ((st = sl_ctx_eval(c, &toks[i], 1, logits, false)) != SL_OK)
        goto fail_eval;
    tg[r] = TG / ((double)(sl_now_ns() - t0) / 1e9);
  }
  struct rusage ru; /* before the bandwidth probe's 512 MiB buffer */
  getrusage(RUSAGE_SELF, &ru);
  double read_gbps = 0;
  if (gpu) {
    read_gbps = measure_device_read_gbps(s);
  } else {
    sl_kern_pool_t *pool = sl_kern_pool_create(threads);
    read_gbps = pool ? measure_read_gbps(pool) : 0;
    sl_kern_pool_destroy(pool);
  }
  struct stat sb;
  uint64_t model_bytes = stat(model, &sb) == 0 ? (uint64_t)sb.st_size : 0;
  double pp_tps = median(pp, reps), tg_tps = median(tg, reps);
  double dec_gbps = (double)sl_model_bytes_per_token(m) * tg_tps / 1e9;
  printf("{\"bench\": \"model\", \"device\": \"%s\", \"model\": \"%s\", "
         "\"arch\": \"%s\", "
         "\"threads\": %d, \"reps\": %d, \"model_bytes\": %llu, "
         "\"weight_bytes_per_token\": %llu, \"isa\": \"%s\",\n"
         " \"pp512_tps\": %.2f, \"tg128_tps\": %.2f, \"decode_gbps\": %.3f, "
         "\"%s\": %.3f, \"decode_bw_fraction\": %.3f, "
         "\"peak_rss_bytes\": %llu",
         sl_device_name(dev), model, sl_arch_name(hp->arch), threads, reps,
         (unsigned long long)model_bytes,
         (unsigned long long)sl_model_bytes_per_token(m),
         sl_kern_isa_name(sl_kern_cpu_isa()), pp_tps, tg_tps, dec_gbps,
         gpu ? "hbm_read_gbps" : "mem_read_gbps", read_gbps,
         read_gbps > 0 ? dec_gbps / read_gbps : 0.0,
         (unsigned long long)ru.ru_maxrss * 1024ull);
  if (peer) {
    char *pj = run_peer(model, threads);
    if (!pj) {
      fprintf(stderr, "sluice bench model: the llama.cpp peer failed (is "
                      "llama-cpp-python installed?)\n");
      printf("}\n");
      goto fail_eval;
    }
    double ppp = json_num(pj, "pp512_tps"), ptg = json_num(pj, "tg128_tps");
    double prss = json_num(pj, "peak_rss_bytes");
    printf(",\n \"peer\": %s,\n \"ratio_pp512\": %.3f, \"ratio_tg128\": %.3f, "
           "\"ratio_peak_rss\": %.3f",
           pj, ppp > 0 ? pp_tps / ppp : 0.0, ptg > 0 ? tg_tps / ptg : 0.0,
           prss > 0 ? (double)ru.ru_maxrss * 1024.0 / prss : 0.0);
    sl_free(pj);
  }
  printf("}\n");
  rc = 0;
  goto out;
fail_eval:
  if (st != SL_OK)
    fprintf(stderr, "sluice bench model: eval failed: %s\n", sl_status_str(st));
out:
  sl_ctx_free(c);
  sl_sync_and_clear_cache(s);
  sl_free(logits);
  sl_free(toks);
  sl_model_free(m);
  sl_clear_thread_streams();
  return rc;
}
