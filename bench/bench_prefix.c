/* `sluice bench prefix`: what the prefix cache and the tiers save on one
 * long prompt (issue 11). First the disk: --disk-mib MiB written in 1 MiB
 * writes and fsynced, dropped with posix_fadvise, read back. Then time to
 * first token (submit -> first token event; max_tokens 1, greedy) in five
 * phases: cold (a fresh engine, an empty directory), pool (the same prompt
 * on that engine), hot (on that engine, after another prompt pushed ours
 * out of the pool: from the hot RAM tier), ssd (a new engine on the same
 * directory, after posix_fadvise(DONTNEED) on each block file) and
 * ssd_warm (the same restart, the page cache left alone). Each rep runs
 * all five, so that every cold phase is cold; medians are reported. The engine
 * caches in a new subdirectory of --ssd-cache-dir, removed at the end: no file
 * of the user's is touched and no earlier run's blocks warm a cold phase. CPU
 * only, as the SSD tier is for now. JSON on stdout, progress on stderr. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "sluice/engine.h"
#include "sluice/flags.h"
#include "sluice/memsync.h"
#include "sluice/model.h"
#include "sluice/util.h"

#define MAX_REPS 50
enum { PH_COLD, PH_POOL, PH_HOT, PH_SSD, PH_SSD_WARM, N_PHASES };
static const char *const PHASE_NAME[N_PHASES] = {"cold", "pool", "hot", "ssd",
                                                 "ssd_warm"};

/* One request's events, filled on the executor thread. */
typedef struct probe {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  uint64_t first_ns; /* the first SL_EV_TOKEN; 0 until then */
  int cached;
  sl_finish finish;
  sl_status error;
} probe;

/* Per phase, per rep; ssd figures only for the two ssd phases. */
typedef struct phase_runs {
  double ttft_ms[MAX_REPS], cached[MAX_REPS];
  double get_bytes[MAX_REPS], get_ms[MAX_REPS], restore_mb_s[MAX_REPS];
} phase_runs;

static void on_event(void *ud, const sl_engine_event *ev) {
  probe *p = ud;
  pthread_mutex_lock(&p->mu);
  if (ev->kind == SL_EV_TOKEN && !p->first_ns)
    p->first_ns = sl_now_ns();
  if (ev->kind == SL_EV_DONE) {
    p->done = true;
    p->cached = ev->cached_tokens;
    p->finish = ev->finish;
    p->error = ev->error;
    pthread_cond_broadcast(&p->cv);
  }
  pthread_mutex_unlock(&p->mu);
}

/* Runs prompt[0..n) with max_tokens 1 and waits for its end; *ttft_ms is
 * submit -> first token. A request that ends without a token fails. */
static sl_status run_one(sl_engine_t *e, const int32_t *prompt, int n,
                         double *ttft_ms, int *cached) {
  probe p = {.done = false};
  pthread_mutex_init(&p.mu, NULL);
  pthread_cond_init(&p.cv, NULL);
  sl_gen_params g = {.max_tokens = 1, .top_logprobs = -1, .ignore_eos = true};
  g.sampling = sl_sampler_defaults();
  g.sampling.temperature = 0;
  uint64_t t0 = sl_now_ns();
  sl_status st = sl_engine_submit(e, prompt, n, &g, on_event, &p, NULL);
  if (st == SL_OK) {
    pthread_mutex_lock(&p.mu);
    while (!p.done)
      pthread_cond_wait(&p.cv, &p.mu);
    pthread_mutex_unlock(&p.mu);
    if (p.finish == SL_FINISH_ERROR || !p.first_ns)
      st = p.error != SL_OK ? p.error : SL_ERR_STATE;
  }
  pthread_cond_destroy(&p.cv);
  pthread_mutex_destroy(&p.mu);
  *ttft_ms = sl_ns_to_ms(p.first_ns - t0);
  *cached = p.cached;
  return st;
}

/* The counters of the tier named `name` ("hot", "ssd") and of the store
 * worker; false when the engine has no such tier (the engine numbers its
 * tiers in lookup order). */
static bool tier_stats(sl_engine_t *e, const char *name, sl_kv_tier_stats *ts,
                       sl_engine_store_stats *ws) {
  for (int i = 0; sl_engine_tier_stats(e, i, ts, ws); i++)
    if (ts->name && !strcmp(ts->name, name))
      return true;
  return false;
}

/* Waits (at most a minute) until the store worker has nothing queued, so
 * that the next phase does not share the cores with its writes. */
static void store_settle(sl_engine_t *e) {
  sl_kv_tier_stats ts;
  sl_engine_store_stats ws;
  for (int k = 0; k < 6000 && tier_stats(e, "ssd", &ts, &ws); k++) {
    if (ws.written + ws.failed + ws.dropped >= ws.queued)
      return;
    usleep(10000);
  }
}

/* Calls fn(dirfd, name) for each entry of dir ending in `suffix` ("" for
 * all but . and ..); returns how many, or -1 when dir cannot be read. */
static int each_file(const char *dir, const char *suffix,
                     void (*fn)(int dfd, const char *name)) {
  DIR *d = opendir(dir);
  if (!d)
    return -1;
  int n = 0;
  size_t sl = strlen(suffix);
  for (struct dirent *de; (de = readdir(d));) {
    size_t l = strlen(de->d_name);
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || l < sl ||
        strcmp(de->d_name + l - sl, suffix))
      continue;
    fn(dirfd(d), de->d_name);
    n++;
  }
  closedir(d);
  return n;
}

/* Best effort: DONTNEED drops only clean pages, and the tier fsyncs each
 * block before its rename, so the files should leave the page cache. */
static void drop_cached(int dfd, const char *name) {
  int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

static void remove_file(int dfd, const char *name) {
  unlinkat(dfd, name, 0);
}

/* The disk's write (1 MiB writes + fsync) and read (1 MiB reads after
 * DONTNEED) bandwidth on a temporary file in dir, in MB/s (10^6 bytes). */
static sl_status disk_bandwidth(const char *dir, int mib, double *w_mb_s,
                                double *r_mb_s) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/.sluice-bench-prefix-disk-XXXXXX", dir);
  size_t chunk = 1u << 20;
  uint64_t *buf = sl_malloc(chunk);
  int fd = buf ? mkostemp(path, O_CLOEXEC) : -1;
  if (fd < 0) {
    sl_free(buf);
    return buf ? SL_ERR_IO : SL_ERR_NOMEM;
  }
  /* not zeros: a file system that compresses or skips zero pages would
   * show a bandwidth the KV blocks never get */
  for (size_t i = 0; i < chunk / 8; i++)
    buf[i] = (i + 1) * 0x9E3779B97F4A7C15ull;
  sl_status st = SL_ERR_IO;
  uint64_t t0 = sl_now_ns();
  for (int i = 0; i < mib; i++)
    if (write(fd, buf, chunk) != (ssize_t)chunk)
      goto fail_file;
  if (fsync(fd) != 0)
    goto fail_file;
  double bytes = (double)mib * (double)chunk;
  *w_mb_s = bytes / 1e6 / ((double)(sl_now_ns() - t0) / 1e9);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  if (lseek(fd, 0, SEEK_SET) != 0)
    goto fail_file;
  t0 = sl_now_ns();
  for (int i = 0; i < mib; i++)
    if (read(fd, buf, chunk) != (ssize_t)chunk)
      goto fail_file;
  *r_mb_s = bytes / 1e6 / ((double)(sl_now_ns() - t0) / 1e9);
  st = SL_OK;
fail_file:
  close(fd);
  unlink(path);
  sl_free(buf);
  return st;
}

/* Exactly n tokens of words chosen by a fixed LCG (the words of
 * tests/py/test_kv_ssd.py), in a new array (free with sl_free), or NULL. */
static int32_t *make_prompt(const sl_tokenizer_t *tok, int n) {
  static const char *const W[] = {
      "river",  "stone",  "cloud",   "lamp",   "orchard", "violin",
      "copper", "meadow", "signal",  "harbor", "lantern", "quiet",
      "silver", "marble", "thunder", "garden", "window",  "pepper",
      "canyon", "falcon", "ember",   "willow"};
  for (size_t words = (size_t)n + 16;; words *= 2) {
    char *text = sl_malloc(words * 9);
    if (!text)
      return NULL;
    size_t o = 0;
    uint32_t x = 7;
    for (size_t i = 0; i < words; i++) {
      x = x * 1664525u + 1013904223u;
      o += (size_t)sprintf(text + o, "%s%s", i ? " " : "", W[(x >> 16) % 22]);
    }
    int32_t *ids = NULL;
    size_t got = 0;
    sl_status st = sl_tokenizer_encode(tok, text, o, false, false, &ids, &got);
    sl_free(text);
    if (st != SL_OK || got >= (size_t)n || !got)
      return st == SL_OK && got ? ids : NULL;
    sl_free(ids);
  }
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(const double *v, int n) {
  double s[MAX_REPS];
  memcpy(s, v, sizeof *v * (size_t)n);
  qsort(s, (size_t)n, sizeof *s, cmp_d);
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* Writes s as a JSON string literal. */
static void json_put_str(const char *s) {
  sl_fput_json_str(stdout, s, strlen(s));
}

/* The CPU's model name from /proc/cpuinfo, or "unknown". */
static void cpu_model(char *out, size_t cap) {
  char line[512], *colon = NULL;
  FILE *f = fopen("/proc/cpuinfo", "r");
  while (f && !colon && fgets(line, sizeof line, f))
    if (!strncmp(line, "model name", 10) && (colon = strchr(line, ':')))
      line[strcspn(line, "\n")] = 0;
  snprintf(out, cap, "%s", colon ? colon + 1 + (colon[1] == ' ') : "unknown");
  if (f)
    fclose(f);
}

/* What `sluice bench prefix`'s command line says. */
typedef struct prefix_opts {
  const char *model, *dir, *device;
  int threads, n_prompt, reps, disk_mib;
} prefix_opts;

#define AT(f) SL_FLAG_AT(prefix_opts, f)
static const sl_flag prefix_flags[] = {
    {SL_FLAG_STR, "--ssd-cache-dir", "DIR", AT(dir),
     .help = "the SSD tier's directory (required; must be writable)"},
    {SL_FLAG_STR, "-m, --model", "FILE", AT(model), .help = "the GGUF file",
     .def = "the default model"},
    {SL_FLAG_INT, "-t, --threads", "N", AT(threads), 1, 1024,
     .help = "compute threads", .def = "all CPUs"},
    {SL_FLAG_CHOICE, "--device", "cpu|cuda|auto", AT(device),
     .choices = "cpu|cuda|auto", .help = "where the engines run"},
    {SL_FLAG_INT, "--prompt-tokens", "N", AT(n_prompt), 32, 65536,
     .help = "the prompt's length"},
    {SL_FLAG_INT, "--reps", "N", AT(reps), 1, MAX_REPS,
     .help = "repetitions of each measure"},
    {SL_FLAG_INT, "--disk-mib", "N", AT(disk_mib), 1, 1 << 20,
     .help = "MiB written and read to measure DIR's bandwidth"},
};
#undef AT

static const char prefix_head[] =
    "usage: sluice bench prefix --ssd-cache-dir DIR [options]\n"
    "  TTFT of one long prompt: cold, from the prefix cache, from the SSD\n"
    "  tier after a restart; DIR's disk bandwidth. DIR must be a writable\n"
    "  directory.\n";

int sl_bench_prefix_main(int argc, char **argv) {
  char defbuf[PATH_MAX], sub[PATH_MAX], err[512], cpu[256], date[32];
  const prefix_opts defaults = {
      .device = "cpu", .n_prompt = 4000, .reps = 3, .disk_mib = 256};
  prefix_opts o = defaults;
  bool help;
  int prc = sl_flags_parse("bench prefix", SL_FLAGS(prefix_flags), &o, argc,
                           argv, prefix_head, NULL, &help);
  if (prc || help)
    return prc;
  const char *model = o.model, *dir = o.dir, *device = o.device;
  int threads = o.threads, n_prompt = o.n_prompt, reps = o.reps,
      disk_mib = o.disk_mib;
  if (!dir) {
    fprintf(stderr, "sluice bench prefix: --ssd-cache-dir DIR is required\n");
    sl_flags_usage(stderr, SL_FLAGS(prefix_flags), &defaults, prefix_head,
                   NULL);
    return 2;
  }
  sl_engine_device dev = SL_ENGINE_DEVICE_CPU;
  (void)sl_engine_device_parse(device, &dev); /* one of the table's */
  /* the device the engines will run on (a CUDA request without a GPU
   * falls back to the CPU, with one line saying so) */
  const char *dev_name = sl_device_name(sl_engine_resolve_device(dev));
  /* the engine's own directory, made now: as root, access() says yes to
   * a directory where no file can be made (/proc), so making one is the
   * test of "writable" */
  struct stat sb;
  errno = 0;
  snprintf(sub, sizeof sub, "%s/sluice-bench-prefix-XXXXXX", dir);
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode) || !mkdtemp(sub)) {
    fprintf(stderr,
            "sluice bench prefix: --ssd-cache-dir '%s' is not a writable "
            "directory (%s)\n",
            dir, errno ? strerror(errno) : "not a directory");
    return 2;
  }
  if (threads <= 0)
    threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (!model)
    model = sl_model_default_path(defbuf, sizeof defbuf);

  int rc = 1;
  sl_model_t *m = NULL;
  sl_tokenizer_t *tok = NULL;
  int32_t *prompt = NULL, *other = NULL;
  phase_runs *runs = NULL;
  double w_mb_s = 0, r_mb_s = 0;
  fprintf(stderr, "sluice bench prefix: disk: %d MiB in %s\n", disk_mib, dir);
  sl_status st = disk_bandwidth(dir, disk_mib, &w_mb_s, &r_mb_s);
  if (st != SL_OK) {
    fprintf(stderr, "sluice bench prefix: disk test in '%s' failed: %s (%s)\n",
            dir, sl_status_str(st), strerror(errno));
    goto out;
  }
  if (!(m = sl_model_load(model, &st, err, sizeof err))) {
    fprintf(stderr, "sluice bench prefix: %s\n", err);
    goto out;
  }
  sl_model_prefault(m, false); /* page faults on weights are not TTFT */
  if (!(runs = sl_calloc(N_PHASES, sizeof *runs)) ||
      sl_tokenizer_load(sl_model_gguf(m), &tok, err, sizeof err) != SL_OK ||
      !(prompt = make_prompt(tok, n_prompt))) {
    fprintf(stderr, "sluice bench prefix: cannot make the prompt\n");
    goto out;
  }
  sl_engine_config c = sl_engine_config_defaults();
  c.device = dev;
  c.n_threads = threads;
  c.n_ctx = (n_prompt + 64 + 255) / 256 * 256;
  c.max_seqs = 2;       /* one request at a time: a small pool, as serve -c */
  c.kv_prefault = true; /* as serve: KV page faults are not TTFT */
  c.queue_timeout_ms = 0;
  c.ssd_cache_dir = sub;
  c.ssd_cache_bytes = 64ull << 30;
  /* The first engine (cold, pool, hot) also has the hot tier, room for
   * three prompts, and a pool with room for one: another prompt of the
   * same length (its first token changed, so no block is shared) evicts
   * the prompt's blocks from the pool, and the hot phase restores them
   * from the hot tier. The restarts (ssd, ssd_warm) have only SSD. */
  const sl_model_hparams *hp = sl_model_hparams_of(m);
  sl_engine_config c1 = c;
  c1.hot_cache_bytes = 3ull * (uint64_t)c.n_ctx * 4u *
                       (uint64_t)(hp->n_layer * hp->n_head_kv * hp->head_dim);
  c1.kv_blocks = (n_prompt + c.kv_block_tokens) / c.kv_block_tokens + 2;
  if (!(other = sl_malloc(sizeof *other * (size_t)n_prompt)))
    goto out;
  memcpy(other, prompt, sizeof *other * (size_t)n_prompt);
  other[0] = prompt[0] != prompt[1] ? prompt[1] : prompt[0] + 1;
  /* shorter than one block: nothing is published, nothing shared */
  static const int32_t warm[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int files_dropped = 0;
  sl_engine_t *e = NULL; /* cold's engine serves pool too */
  for (int r = 0; r < reps; r++) {
    each_file(sub, "", remove_file);
    for (int ph = PH_COLD; ph < N_PHASES; ph++) {
      if (ph == PH_SSD)
        files_dropped = each_file(sub, ".slkv", drop_cached);
      double wt;
      int wc;
      if (ph != PH_POOL && ph != PH_HOT) {
        e = NULL; /* sl_engine_create leaves it as it is on failure */
        if ((st = sl_engine_create(m, tok, ph == PH_COLD ? &c1 : &c, &e)) !=
                SL_OK ||
            (st = run_one(e, warm, 8, &wt, &wc)) != SL_OK) {
          fprintf(stderr, "sluice bench prefix: engine: %s\n",
                  sl_status_str(st));
          sl_engine_free(e);
          goto out;
        }
      }
      if (ph == PH_HOT) { /* the other prompt pushes ours out of the pool */
        if ((st = run_one(e, other, n_prompt, &wt, &wc)) != SL_OK) {
          fprintf(stderr, "sluice bench prefix: the other prompt: %s\n",
                  sl_status_str(st));
          sl_engine_free(e);
          goto out;
        }
        store_settle(e);
      }
      phase_runs *pr = &runs[ph];
      int cached = 0;
      if ((st = run_one(e, prompt, n_prompt, &pr->ttft_ms[r], &cached)) !=
          SL_OK) {
        fprintf(stderr, "sluice bench prefix: %s request: %s\n", PHASE_NAME[ph],
                sl_status_str(st));
        sl_engine_free(e);
        goto out;
      }
      pr->cached[r] = cached;
      sl_kv_tier_stats ts;
      sl_engine_store_stats ws;
      if (ph >= PH_HOT &&
          tier_stats(e, ph == PH_HOT ? "hot" : "ssd", &ts, &ws)) {
        pr->get_bytes[r] = (double)ts.get_bytes;
        pr->get_ms[r] = ts.get_ms_total;
        pr->restore_mb_s[r] = ts.get_ms_total > 0
                                  ? (double)ts.get_bytes / 1e3 / ts.get_ms_total
                                  : 0;
        /* SSD: the group's files are read in parallel, so the wall time
         * of the reads, not the sum of each read's time */
        sl_engine_stats es = sl_engine_get_stats(e);
        if (ph >= PH_SSD && es.restore_read_ns)
          pr->restore_mb_s[r] = (double)es.restore_read_bytes / 1e3 /
                                ((double)es.restore_read_ns / 1e6);
      }
      fprintf(stderr,
              "sluice bench prefix: rep %d/%d %-8s TTFT %9.1f ms, %d of %d "
              "tokens cached\n",
              r + 1, reps, PHASE_NAME[ph], pr->ttft_ms[r], cached, n_prompt);
      store_settle(e);
      if (ph != PH_COLD && ph != PH_POOL) { /* writes what is queued first */
        sl_engine_free(e);
        e = NULL;
      }
    }
  }
  time_t now = time(NULL);
  struct tm tmv;
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tmv));
  cpu_model(cpu, sizeof cpu);
  printf("{\"bench\": \"prefix\", \"date\": \"%s\", \"machine\": {\"cpu\": ",
         date);
  json_put_str(cpu);
  printf(", \"cores\": %d}, \"device\": ", (int)sysconf(_SC_NPROCESSORS_ONLN));
  json_put_str(dev_name);
  printf(", \"model\": ");
  json_put_str(model);
  printf(",\n \"flags\": {\"threads\": %d, \"prompt_tokens\": %d, "
         "\"reps\": %d, \"disk_mib\": %d, \"ssd_cache_dir\": ",
         threads, n_prompt, reps, disk_mib);
  json_put_str(dir);
  printf("}, \"n_ctx\": %d, \"kv_block_tokens\": %d, \"max_tokens\": 1,\n"
         " \"disk\": {\"write_mb_s\": %.1f, \"read_mb_s\": %.1f, "
         "\"chunk_bytes\": 1048576, \"write_includes_fsync\": true, "
         "\"page_cache_dropped_by\": \"posix_fadvise\"},\n"
         " \"ssd_page_cache_dropped_by\": \"posix_fadvise\", "
         "\"ssd_block_files\": %d,\n \"phases\": {",
         c.n_ctx, c.kv_block_tokens, w_mb_s, r_mb_s, files_dropped);
  double ttft[N_PHASES];
  for (int ph = PH_COLD; ph < N_PHASES; ph++) {
    const phase_runs *pr = &runs[ph];
    ttft[ph] = median(pr->ttft_ms, reps);
    printf("%s\n  \"%s\": {\"ttft_ms\": %.2f, \"cached_tokens\": %.0f",
           ph ? "," : "", PHASE_NAME[ph], ttft[ph], median(pr->cached, reps));
    if (ph >= PH_HOT) {
      double mb_s = median(pr->restore_mb_s, reps);
      /* the time a restore adds to a pool hit, and the bandwidth that
       * makes (the hot tier lends its blocks in place: its get time is 0,
       * the copy runs on the engine stream) */
      double gb = median(pr->get_bytes, reps);
      double extra = ttft[ph] - median(runs[PH_POOL].ttft_ms, reps);
      printf(", \"get_bytes\": %.0f, \"get_ms_total\": %.2f, "
             "\"restore_mb_s\": %.1f, \"ms_over_pool\": %.2f, "
             "\"mb_s_over_pool\": %.1f",
             gb, median(pr->get_ms, reps), mb_s, extra,
             extra > 0 ? gb / 1e3 / extra : 0.0);
      if (ph >= PH_SSD)
        printf(", \"restore_vs_disk_read\": %.3f",
               r_mb_s > 0 ? mb_s / r_mb_s : 0.0);
    }
    printf(", \"ttft_ms_reps\": [");
    for (int r = 0; r < reps; r++)
      printf("%s%.2f", r ? ", " : "", pr->ttft_ms[r]);
    printf("]}");
  }
  printf("},\n \"ratio_cold_pool\": %.2f, \"ratio_cold_hot\": %.2f, "
         "\"ratio_cold_ssd\": %.2f, "
         "\"ratio_cold_ssd_warm\": %.2f,\n"
         " \"note\": \"medians over reps; TTFT = submit to the first token "
         "event; restore_mb_s = hot: the tier's get_bytes / get_ms_total (0 "
         "where it lends blocks in place), ssd: bytes read / the wall time "
         "of the parallel reads; mb_s_over_pool = get_bytes / "
         "(TTFT - the pool's TTFT); whether "
         "posix_fadvise(DONTNEED) emptied the page cache is not checked\"}\n",
         ttft[PH_POOL] > 0 ? ttft[PH_COLD] / ttft[PH_POOL] : 0.0,
         ttft[PH_HOT] > 0 ? ttft[PH_COLD] / ttft[PH_HOT] : 0.0,
         ttft[PH_SSD] > 0 ? ttft[PH_COLD] / ttft[PH_SSD] : 0.0,
         ttft[PH_SSD_WARM] > 0 ? ttft[PH_COLD] / ttft[PH_SSD_WARM] : 0.0);
  fflush(stdout);
  rc = 0;
out:
  each_file(sub, "", remove_file);
  rmdir(sub);
  sl_free(runs);
  sl_free(prompt);
  sl_free(other);
  sl_tokenizer_free(tok);
  sl_model_free(m);
  sl_clear_thread_streams();
  return rc;
}
