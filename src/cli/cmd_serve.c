/* `sluice serve`: load a model, start its engine and the HTTP server, serve
 * until SIGINT / SIGTERM, then shut down cleanly (exit 0).
 *
 * Signals: SIGINT and SIGTERM are blocked before any thread starts, so every
 * thread inherits the mask and only this thread, in sigwait(), sees them. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sluice/engine.h"
#include "sluice/memsync.h"
#include "sluice/model.h"
#include "sluice/pool.h"
#include "sluice/rt.h"
#include "sluice/server.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

/* Dispatched from main.c as `sluice serve ...`; returns the exit code. */
int sl_cli_serve_main(int argc, char **argv);

/* One flag of the usage: its name and value, what it does, its default. */
static void flag(FILE *f, const char *name, const char *what, const char *def) {
  fprintf(f, "  %-30s %s (default: %s)\n", name, what, def);
}

static void serve_usage(FILE *f) {
  sl_engine_config e = sl_engine_config_defaults();
  sl_server_config s = sl_server_config_defaults();
  char b[160];
#define NUM(v) (snprintf(b, sizeof b, "%lld", (long long)(v)), b)
#define MIB(v)                                                                 \
  (snprintf(b, sizeof b, "%lluM", (unsigned long long)(v) >> 20), b)
  fprintf(f, "usage: sluice serve [options]\n"
             "  serves the OpenAI (/v1/chat/completions, /v1/completions,\n"
             "  /v1/embeddings, /v1/models) and Anthropic (/v1/messages,\n"
             "  count_tokens) APIs, /tokenize, /detokenize, /apply-template,\n"
             "  /health, /metrics, the admin API (/admin/api/...) and its\n"
             "  dashboard (/admin). BYTES take K, M, G suffixes (powers of\n"
             "  1024).\n"
             "models:\n");
  flag(f, "-m, --model FILE", "a GGUF file to serve; may be repeated",
       "the default model, when neither -m nor --models is given");
  flag(f, "--models DIR", "serve every .gguf file in DIR", "none");
  flag(f, "--model-name NAME", "the first -m model's name",
       "its file name without .gguf");
  flag(f, "--alias NAME=FILE", "another name for the model of FILE", "none");
  flag(f, "--pin NAME", "keep NAME loaded (never evicted nor reclaimed)",
       "none");
  flag(f, "--idle-ttl S", "unload a model nobody used for S seconds",
       "0, never");
  flag(f, "--max-memory BYTES",
       "the budget of every loaded model, and the memory guard's limit",
       "0, none");
  fprintf(f, "engine:\n");
  flag(f, "--device auto|cpu|cuda", "where models run", "auto");
  flag(f, "-c, --ctx N", "tokens per sequence",
       (snprintf(b, sizeof b,
                 "the model's training context, at most what the KV cache "
                 "holds; the cache holds --max-seqs sequences of %d",
                 e.n_ctx),
        b));
  flag(f, "-t, --threads N", "compute threads", "all CPUs");
  flag(f, "--max-seqs N", "sequences running at once", NUM(e.max_seqs));
  flag(f, "--max-batched-tokens N", "tokens per step",
       (snprintf(b, sizeof b, "%d, or --max-seqs when larger",
                 e.max_batched_tokens),
        b));
  flag(f, "--prefill-chunk N", "tokens per prefill chunk",
       NUM(e.prefill_chunk));
  flag(f, "--kv-block-tokens N", "tokens per KV block (a power of two)",
       NUM(e.kv_block_tokens));
  flag(f, "--clear-every-tokens N",
       "a decode clear every N generated tokens (0: off)",
       NUM(e.clear_every_tokens));
  flag(f, "--queue-timeout-ms MS",
       "a request never admitted fails (503) after this (0: no limit)",
       NUM(e.queue_timeout_ms));
  flag(f, "--pooling mean|last", "how /v1/embeddings pools hidden states",
       "mean");
  flag(f, "--tool-call-format F",
       "hermes, llama3, mistral or generic: how the model writes tool calls",
       "what its chat template shows");
  flag(f, "--reasoning-budget N",
       "thinking tokens a request may use when it sets no budget: -1 no "
       "cap, 0 thinking off, N > 0 the thinking closed after N",
       "-1");
  flag(f, "--reasoning-format F",
       "none, auto or deepseek: how thinking is split out of answers "
       "(none: left in the content)",
       "auto, what its chat template shows");
  fprintf(f, "KV tiers:\n");
  flag(f, "--hot-cache-bytes BYTES",
       "host copies of prefix KV blocks (LRU; on top of --max-memory)",
       "0, none");
  flag(f, "--hot-cache-compress lz4|none", "compress hot blocks", "none");
  flag(f, "--ssd-cache-dir DIR",
       "prefix KV blocks on disk, kept across restarts (a folder per model "
       "when several)",
       "none");
  flag(f, "--ssd-cache-bytes BYTES", "the SSD tier's budget (LRU)", "10G");
  flag(f, "--ssd-cache-optional",
       "a missing or read-only DIR warns instead of failing", "off");
  fprintf(f, "HTTP:\n");
  flag(f, "--host H", "address to bind", s.host);
  flag(f, "--port P", "port", NUM(s.port));
  flag(f, "--api-key K",
       "required as Bearer or x-api-key, but on /health "
       "and the dashboard page",
       "none");
  flag(f, "--cors-origin ORIGINS", "'*' or a comma-separated list", "none");
  flag(f, "--allowed-host NAME",
       "a Host name the server answers besides loopback and --host "
       "(repeatable; .example.com: the names under it; '*': any)",
       "none");
  flag(f, "--trusted-proxy ADDR",
       "a proxy (address or ADDR/N range, repeatable) whose connections "
       "name their client by a PROXY header (v1, v2) or X-Forwarded-For; "
       "the per-address limit counts that client",
       "none");
  flag(f, "--max-tokens-default N",
       "max_tokens of a chat request without one (0: the room left)",
       NUM(s.max_tokens_default));
  flag(f, "--parse-special-in-content",
       "read special tokens written in chat messages as tokens", "off");
  flag(f, "--max-body BYTES", "larger request bodies get 413",
       MIB(s.max_body_bytes));
  flag(f, "--http-timeout S", "idle connection timeout", NUM(s.http_timeout_s));
  flag(f, "--max-conns N", "open connections (more are refused)",
       NUM(s.max_conns));
  flag(f, "--max-conns-per-ip N", "per client address (0: no limit)",
       NUM(s.max_conns_per_ip));
  flag(f, "--http-threads N", "the HTTP thread pool", NUM(s.http_threads));
  flag(f, "--head-timeout-ms MS", "a request head must arrive within it",
       NUM(s.head_timeout_ms));
  flag(f, "--request-timeout-ms MS", "a whole request must arrive within it",
       NUM(s.request_timeout_ms));
  flag(f, "--grace-ms MS", "shutdown: in-flight requests get this long",
       NUM(s.grace_ms));
  flag(f, "-h, --help", "this text", "-");
#undef NUM
#undef MIB
  fprintf(
      f,
      "notes:\n"
      "  A request names its model (\"default\": the first). A model loads\n"
      "  on first use, or at start when it is the only one or pinned. A\n"
      "  load that would pass --max-memory unloads the least recently used\n"
      "  idle model first (never a pinned one, nor one serving requests),\n"
      "  and fails that request with a 503 when nothing can go.\n"
      "  A max_tokens above the room left in the context is clamped to it.\n"
      "  A request that fits the memory alone waits for room up to\n"
      "  --queue-timeout-ms, then gets a 503.\n"
      "  --parse-special-in-content: by default special tokens such as\n"
      "  <|im_end|> are plain text in chat messages (only the chat\n"
      "  template's own text has them), so a client cannot forge a turn;\n"
      "  /v1/completions prompts always have them parsed.\n"
      "  A template that does not render tools gets them described in a\n"
      "  system message and answers in the generic JSON form.\n"
      "  --hot-cache-compress lz4 keeps a block compressed where that saves\n"
      "  an eighth (lz4 saved 0.1%% of SmolLM2's f16 KV).\n");
}

/* "4G", "512M", "123456", "1.5G" -> bytes. */
static bool parse_bytes(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || !(v >= 0))
    return false;
  double mul = 1;
  switch (*end) {
  case 'k':
  case 'K':
    mul = 1024.0;
    end++;
    break;
  case 'm':
  case 'M':
    mul = 1024.0 * 1024;
    end++;
    break;
  case 'g':
  case 'G':
    mul = 1024.0 * 1024 * 1024;
    end++;
    break;
  case 't':
  case 'T':
    mul = 1024.0 * 1024 * 1024 * 1024;
    end++;
    break;
  default:
    break;
  }
  if (*end == 'i' || *end == 'B')
    end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
  if (*end || v * mul > 1.8e19)
    return false;
  *out = (uint64_t)(v * mul);
  return true;
}

/* The file's name without directories, and without ".gguf" in *stem. */
static void model_names(const char *path, char *base, size_t bcap, char *stem,
                        size_t scap) {
  const char *b = strrchr(path, '/');
  b = b ? b + 1 : path;
  snprintf(base, bcap, "%s", b);
  snprintf(stem, scap, "%s", b);
  size_t n = strlen(stem);
  if (n > 5 && strcmp(stem + n - 5, ".gguf") == 0)
    stem[n - 5] = 0;
}

#define MAX_MODELS 256

/* The pool's load and unload stages: one line each in the log. */
static void on_stage(void *ud, const char *model, const char *what) {
  (void)ud;
  fprintf(stderr, "sluice: %s: %s\n", model, what);
  fflush(stderr);
}

/* The .gguf files of `dir`, sorted by name, appended to paths[] (owned
 * copies in *owned); false with a message when the folder cannot be read. */
static bool scan_models(const char *dir, char **paths, int *n, int cap) {
  struct dirent **ents = NULL;
  int k = scandir(dir, &ents, NULL, alphasort);
  if (k < 0) {
    fprintf(stderr, "sluice serve: cannot read --models '%s': %s\n", dir,
            strerror(errno));
    return false;
  }
  bool ok = true;
  for (int i = 0; i < k; i++) {
    const char *nm = ents[i]->d_name;
    size_t l = strlen(nm);
    if (ok && nm[0] != '.' && l > 5 && !strcmp(nm + l - 5, ".gguf")) {
      if (*n == cap) {
        fprintf(stderr, "sluice serve: more than %d models\n", cap);
        ok = false;
      } else {
        size_t pl = strlen(dir) + l + 2;
        if (!(paths[*n] = malloc(pl)))
          ok = false;
        else
          snprintf(paths[(*n)++], pl, "%s/%s", dir, nm);
      }
    }
    free(ents[i]);
  }
  free(ents);
  return ok;
}

int sl_cli_serve_main(int argc, char **argv) {
  char defbuf[PATH_MAX];
  const char *name = NULL;
  const char *files[MAX_MODELS], *aliases[MAX_MODELS], *pins[MAX_MODELS];
  int n_files = 0, n_aliases = 0, n_pins = 0;
  const char *models_dir = NULL;
  char *scanned[MAX_MODELS];
  int n_scanned = 0;
  long idle_ttl = 0;
  sl_server_config scfg = sl_server_config_defaults();
  char allowed_hosts[4096] = ""; /* --allowed-host values, comma-joined */
  char trusted[4096] = "";       /* --trusted-proxy values, comma-joined */
  sl_engine_config ecfg = sl_engine_config_defaults();
  /* the KV pool resident from the start, as llama.cpp clears its KV buffer
   * at load (the soak test judges RSS from the first minute on) */
  ecfg.kv_prefault = true;
  ecfg.ssd_cache_bytes = 10ull << 30;
  bool ctx_set = false, mbt_set = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long lv;
    uint64_t bv;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
      SL_CLI_NEED_VALUE("serve");
      if (n_files == MAX_MODELS)
        SL_CLI_BAD_VALUE("serve");
      files[n_files++] = v;
    } else if (!strcmp(a, "--models")) {
      SL_CLI_NEED_VALUE("serve");
      models_dir = v;
    } else if (!strcmp(a, "--alias")) {
      SL_CLI_NEED_VALUE("serve");
      if (!strchr(v, '=') || v[0] == '=' || n_aliases == MAX_MODELS)
        SL_CLI_BAD_VALUE("serve");
      aliases[n_aliases++] = v;
    } else if (!strcmp(a, "--pin")) {
      SL_CLI_NEED_VALUE("serve");
      if (n_pins == MAX_MODELS)
        SL_CLI_BAD_VALUE("serve");
      pins[n_pins++] = v;
    } else if (!strcmp(a, "--idle-ttl")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 0, 365L * 86400, &idle_ttl))
        SL_CLI_BAD_VALUE("serve");
    } else if (!strcmp(a, "--host")) {
      SL_CLI_NEED_VALUE("serve");
      scfg.host = v;
    } else if (!strcmp(a, "--port")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 0, 65535, &lv))
        SL_CLI_BAD_VALUE("serve");
      scfg.port = (int)lv;
    } else if (!strcmp(a, "--api-key")) {
      SL_CLI_NEED_VALUE("serve");
      scfg.api_key = v;
    } else if (!strcmp(a, "--model-name")) {
      SL_CLI_NEED_VALUE("serve");
      name = v;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 16, 1 << 20, &lv))
        SL_CLI_BAD_VALUE("serve");
      ecfg.n_ctx = (int)lv;
      ctx_set = true;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 1, 1024, &lv))
        SL_CLI_BAD_VALUE("serve");
      ecfg.n_threads = (int)lv;
    } else if (!strcmp(a, "--max-memory")) {
      SL_CLI_NEED_VALUE("serve");
      if (!parse_bytes(v, &bv))
        SL_CLI_BAD_VALUE("serve");
      ecfg.max_memory = bv;
    } else if (!strcmp(a, "--clear-every-tokens")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 0, 1 << 30, &lv))
        SL_CLI_BAD_VALUE("serve");
      ecfg.clear_every_tokens = (int)lv;
    } else if (!strcmp(a, "--device")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_engine_device_parse(v, &ecfg.device))
        SL_CLI_BAD_VALUE("serve");
    } else if (!strcmp(a, "--max-seqs")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 1, 4096, &lv))
        SL_CLI_BAD_VALUE("serve");
      ecfg.max_seqs = (int)lv;
    } else if (!strcmp(a, "--max-batched-tokens")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 1, 1 << 20, &lv))
        SL_CLI_BAD_VALUE("serve");
      ecfg.max_batched_tokens = (int)lv;
      mbt_set = true;
    } else if (!strcmp(a, "--prefill-chunk")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 1, 1 << 20, &lv))
        SL_CLI_BAD_VALUE("serve");
      ecfg.prefill_chunk = (int)lv;
    } else if (!strcmp(a, "--kv-block-tokens")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 1, 4096, &lv))
        SL_CLI_BAD_VALUE("serve");
      ecfg.kv_block_tokens = (int)lv;
    } else if (!strcmp(a, "--http-timeout")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 1, 86400, &lv))
        SL_CLI_BAD_VALUE("serve");
      scfg.http_timeout_s = (unsigned)lv;
    } else if (!strcmp(a, "--max-body")) {
      SL_CLI_NEED_VALUE("serve");
      if (!parse_bytes(v, &bv) || bv < 1024 || bv > (1ull << 32))
        SL_CLI_BAD_VALUE("serve");
      scfg.max_body_bytes = (size_t)bv;
    } else if (!strcmp(a, "--max-conns")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 1, 1 << 20, &lv))
        SL_CLI_BAD_VALUE("serve");
      scfg.max_conns = (unsigned)lv;
    } else if (!strcmp(a, "--max-conns-per-ip")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 0, 1 << 20, &lv))
        SL_CLI_BAD_VALUE("serve");
      scfg.max_conns_per_ip = (unsigned)lv;
    } else if (!strcmp(a, "--http-threads")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 1, 256, &lv))
        SL_CLI_BAD_VALUE("serve");
      scfg.http_threads = (unsigned)lv;
    } else if (!strcmp(a, "--head-timeout-ms")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 100, 3600000, &lv))
        SL_CLI_BAD_VALUE("serve");
      scfg.head_timeout_ms = (unsigned)lv;
    } else if (!strcmp(a, "--request-timeout-ms")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 100, 86400000, &lv))
        SL_CLI_BAD_VALUE("serve");
      scfg.request_timeout_ms = (unsigned)lv;
    } else if (!strcmp(a, "--grace-ms")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 0, 3600000, &lv))
        SL_CLI_BAD_VALUE("serve");
      scfg.grace_ms = (unsigned)lv;
    } else if (!strcmp(a, "--max-tokens-default")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 0, 1 << 30, &lv))
        SL_CLI_BAD_VALUE("serve");
      scfg.max_tokens_default = (int)lv;
    } else if (!strcmp(a, "--pooling")) {
      SL_CLI_NEED_VALUE("serve");
      if (strcmp(v, "mean") && strcmp(v, "last"))
        SL_CLI_BAD_VALUE("serve");
      scfg.pooling = !strcmp(v, "last") ? SL_POOL_LAST : SL_POOL_MEAN;
    } else if (!strcmp(a, "--tool-call-format")) {
      SL_CLI_NEED_VALUE("serve");
      if (strcmp(v, "hermes") && strcmp(v, "llama3") && strcmp(v, "mistral") &&
          strcmp(v, "generic"))
        SL_CLI_BAD_VALUE("serve");
      scfg.tool_call_format = v;
    } else if (!strcmp(a, "--reasoning-budget")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, -1, 1 << 24, &lv))
        SL_CLI_BAD_VALUE("serve");
      scfg.reasoning_budget = lv < 0 ? 0 : lv == 0 ? -1 : (int)lv;
    } else if (!strcmp(a, "--reasoning-format")) {
      SL_CLI_NEED_VALUE("serve");
      if (strcmp(v, "none") && strcmp(v, "auto") && strcmp(v, "deepseek"))
        SL_CLI_BAD_VALUE("serve");
      scfg.reasoning_format = v;
    } else if (!strcmp(a, "--cors-origin")) {
      SL_CLI_NEED_VALUE("serve");
      scfg.cors_origin = v;
    } else if (!strcmp(a, "--allowed-host")) {
      SL_CLI_NEED_VALUE("serve");
      size_t have = strlen(allowed_hosts), vl = strlen(v);
      if (!vl || strpbrk(v, " \t/@") || have + vl + 2 > sizeof allowed_hosts)
        SL_CLI_BAD_VALUE("serve");
      snprintf(allowed_hosts + have, sizeof allowed_hosts - have, "%s%s",
               have ? "," : "", v);
      scfg.allowed_hosts = allowed_hosts;
    } else if (!strcmp(a, "--trusted-proxy")) {
      SL_CLI_NEED_VALUE("serve");
      size_t have = strlen(trusted), vl = strlen(v);
      if (!vl || strpbrk(v, " \t,") || have + vl + 2 > sizeof trusted)
        SL_CLI_BAD_VALUE("serve");
      snprintf(trusted + have, sizeof trusted - have, "%s%s", have ? "," : "",
               v);
      scfg.trusted_proxies = trusted;
    } else if (!strcmp(a, "--parse-special-in-content")) {
      scfg.parse_special_in_content = true;
    } else if (!strcmp(a, "--ssd-cache-dir")) {
      SL_CLI_NEED_VALUE("serve");
      ecfg.ssd_cache_dir = v;
    } else if (!strcmp(a, "--ssd-cache-bytes")) {
      SL_CLI_NEED_VALUE("serve");
      if (!parse_bytes(v, &bv) || bv < (1u << 20))
        SL_CLI_BAD_VALUE("serve");
      ecfg.ssd_cache_bytes = bv;
    } else if (!strcmp(a, "--ssd-cache-optional")) {
      ecfg.ssd_cache_optional = true;
    } else if (!strcmp(a, "--hot-cache-bytes")) {
      SL_CLI_NEED_VALUE("serve");
      if (!parse_bytes(v, &bv))
        SL_CLI_BAD_VALUE("serve");
      ecfg.hot_cache_bytes = bv;
    } else if (!strcmp(a, "--hot-cache-compress")) {
      SL_CLI_NEED_VALUE("serve");
      if (strcmp(v, "lz4") && strcmp(v, "none"))
        SL_CLI_BAD_VALUE("serve");
      ecfg.hot_cache_lz4 = !strcmp(v, "lz4");
    } else if (!strcmp(a, "--queue-timeout-ms")) {
      SL_CLI_NEED_VALUE("serve");
      if (!sl_parse_long(v, 0, 86400000, &lv))
        SL_CLI_BAD_VALUE("serve");
      ecfg.queue_timeout_ms = (int)lv;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      serve_usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "sluice serve: unknown option '%s'\n", a);
      serve_usage(stderr);
      return 2;
    }
  }
  if (models_dir &&
      !scan_models(models_dir, scanned, &n_scanned, MAX_MODELS - n_files))
    return 2;
  if (!n_files && !n_scanned)
    files[n_files++] = sl_model_default_path(defbuf, sizeof defbuf);
  /* every running sequence decodes one token a step */
  if (ecfg.max_batched_tokens < ecfg.max_seqs) {
    if (mbt_set) {
      fprintf(stderr,
              "sluice serve: --max-batched-tokens %d is less than --max-seqs "
              "%d: a step must have room for one token of every running "
              "sequence; raise --max-batched-tokens to at least %d\n",
              ecfg.max_batched_tokens, ecfg.max_seqs, ecfg.max_seqs);
      return 2;
    }
    ecfg.max_batched_tokens = ecfg.max_seqs;
  }

  /* before any thread exists: only sigwait() below receives these */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN); /* a vanished client is an error return */

  int rc = 1;
  char err[512] = "";
  sl_status st;
  sl_pool_t *pool = NULL;
  sl_server_t *srv = NULL;
  sl_pool_config pc = sl_pool_config_defaults();
  pc.engine = ecfg;
  pc.max_memory = ecfg.max_memory;
  pc.idle_ttl_s = (unsigned)idle_ttl;
  pc.prefault = true; /* a CPU model's weights, at load */
  pc.progress = true;
  pc.on_stage = on_stage;
  pc.n_ctx_fixed = ctx_set;
  if ((st = sl_pool_create(&pc, &pool)) != SL_OK) {
    fprintf(stderr, "sluice serve: %s\n", sl_status_str(st));
    goto out;
  }
  /* names: the file's stem (--model-name for the first -m), and its base
   * name as an alias */
  for (int i = 0; i < n_files + n_scanned; i++) {
    const char *path = i < n_files ? files[i] : scanned[i - n_files];
    char base[256], stem[256];
    model_names(path, base, sizeof base, stem, sizeof stem);
    const char *nm = i == 0 && name ? name : stem;
    if ((st = sl_pool_add(pool, nm, path, err, sizeof err)) != SL_OK) {
      fprintf(stderr, "sluice serve: %s\n", err);
      goto out;
    }
    if (strcmp(base, nm) && sl_pool_find(pool, base) < 0)
      (void)sl_pool_add_alias(pool, base, nm, err, sizeof err);
  }
  for (int i = 0; i < n_aliases; i++) {
    char an[256];
    const char *eq = strchr(aliases[i], '=');
    snprintf(an, sizeof an, "%.*s", (int)(eq - aliases[i]), aliases[i]);
    const char *file = eq + 1;
    int k = -1;
    for (int j = 0; k < 0 && j < sl_pool_count(pool); j++) {
      sl_pool_info in;
      sl_pool_info_at(pool, j, &in);
      char base[256], stem[256];
      model_names(in.path, base, sizeof base, stem, sizeof stem);
      if (!strcmp(file, in.path) || !strcmp(file, base) ||
          !strcmp(file, stem) || !strcmp(file, in.name))
        k = j;
    }
    sl_pool_info in;
    if (k < 0 || !sl_pool_info_at(pool, k, &in)) {
      fprintf(stderr, "sluice serve: --alias %s: no served model is '%s'\n",
              aliases[i], file);
      goto out;
    }
    if (sl_pool_add_alias(pool, an, in.name, err, sizeof err) != SL_OK) {
      fprintf(stderr, "sluice serve: --alias %s: %s\n", aliases[i], err);
      goto out;
    }
  }
  for (int i = 0; i < n_pins; i++)
    if (sl_pool_set_pinned(pool, pins[i], true) != SL_OK) {
      fprintf(stderr, "sluice serve: --pin %s: no such model\n", pins[i]);
      goto out;
    }
  /* load what must be loaded: the only model, and the pinned ones */
  for (int i = 0; i < sl_pool_count(pool); i++) {
    sl_pool_info in;
    sl_pool_info_at(pool, i, &in);
    if (sl_pool_count(pool) > 1 && !in.pinned)
      continue;
    if ((st = sl_pool_load(pool, in.name, err, sizeof err)) != SL_OK) {
      fprintf(stderr, "sluice serve: cannot load '%s': %s\n", in.path, err);
      goto out;
    }
  }
  if ((st = sl_server_start(pool, &scfg, &srv, err, sizeof err)) != SL_OK) {
    fprintf(stderr, "sluice serve: %s\n", err);
    goto out;
  }
  sl_pool_info first;
  sl_pool_info_at(pool, 0, &first);
  const char *dev_name = "cpu";
  sl_pool_lease fl;
  char devbuf[64] = "";
  if (sl_pool_acquire_loaded(pool, 0, &fl)) {
    snprintf(devbuf, sizeof devbuf, "%s", sl_engine_device_name(fl.engine));
    dev_name = devbuf;
    sl_pool_release(pool, &fl);
  } else if (ecfg.device != SL_ENGINE_DEVICE_CPU && sl_cuda_available()) {
    dev_name = "cuda (on load)";
  }
  const char *host = scfg.host ? scfg.host : "127.0.0.1";
  bool v6 = strchr(host, ':') != NULL;
  if (sl_pool_count(pool) > 1)
    fprintf(stderr, "sluice: %d models, the first %s\n", sl_pool_count(pool),
            first.name);
  fprintf(stderr, "sluice: serving %s on %s at http://%s%s%s:%d\n", first.name,
          dev_name, v6 ? "[" : "", host, v6 ? "]" : "", sl_server_port(srv));
  fflush(stderr);

  int sig = 0;
  while (sigwait(&sigs, &sig) != 0)
    ;
  fprintf(stderr, "sluice: %s, shutting down\n",
          sig == SIGINT ? "SIGINT" : "SIGTERM");
  sl_server_stop(srv);
  rc = 0;
out:
  sl_pool_free(pool);
  for (int i = 0; i < n_scanned; i++)
    free(scanned[i]);
  return rc;
}
