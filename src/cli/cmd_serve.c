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
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sluice/engine.h"
#include "sluice/flags.h"
#include "sluice/memsync.h"
#include "sluice/model.h"
#include "sluice/pool.h"
#include "sluice/rt.h"
#include "sluice/server.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

/* Dispatched from main.c as `sluice serve ...`; returns the exit code. */
int sl_cli_serve_main(int argc, char **argv);

#define MAX_MODELS 256

/* What the command line says: the configs, the models and their names. */
typedef struct serve_opts {
  sl_server_config s;
  sl_engine_config e;
  size_t n_files, n_aliases, n_pins;
  const char *files[MAX_MODELS], *aliases[MAX_MODELS], *pins[MAX_MODELS];
  const char *models_dir, *name;
  long idle_ttl;
  uint64_t max_body;
  bool ctx_set, mbt_set;    /* -c, --max-batched-tokens given */
  char allowed_hosts[4096]; /* --allowed-host values, comma-joined */
  char trusted[4096];       /* --trusted-proxy values, comma-joined */
} serve_opts;

/* The options a flag's destination belongs to. */
#define OPTS_OF(dst, field)                                                    \
  ((serve_opts *)((char *)(dst)-offsetof(serve_opts, field)))

/* A repeatable flag's value, appended to a list of MAX_MODELS. */
static bool add_to(size_t *n, const char **list, const char *v) {
  if (*n == MAX_MODELS)
    return false;
  list[(*n)++] = v;
  return true;
}
static bool add_file(void *dst, const char *v) {
  serve_opts *o = OPTS_OF(dst, n_files);
  return add_to(&o->n_files, o->files, v);
}
static bool add_alias(void *dst, const char *v) {
  serve_opts *o = OPTS_OF(dst, n_aliases);
  return strchr(v, '=') && v[0] != '=' && add_to(&o->n_aliases, o->aliases, v);
}
static bool add_pin(void *dst, const char *v) {
  serve_opts *o = OPTS_OF(dst, n_pins);
  return add_to(&o->n_pins, o->pins, v);
}

/* The comma-joined list of 4096 bytes at `list` gets v; `bad`: the
 * characters no value may hold. */
static bool join(char *list, const char *v, const char *bad) {
  size_t have = strlen(list), vl = strlen(v);
  if (!vl || strpbrk(v, bad) || have + vl + 2 > 4096)
    return false;
  snprintf(list + have, 4096 - have, "%s%s", have ? "," : "", v);
  return true;
}
static bool add_host(void *dst, const char *v) {
  return join(dst, v, " \t/@");
}
static bool add_proxy(void *dst, const char *v) {
  return join(dst, v, " \t,");
}

static bool set_pooling(void *dst, const char *v) {
  if (strcmp(v, "mean") && strcmp(v, "last"))
    return false;
  *(sl_pooling *)dst = !strcmp(v, "last") ? SL_POOL_LAST : SL_POOL_MEAN;
  return true;
}
static bool set_lz4(void *dst, const char *v) {
  if (strcmp(v, "lz4") && strcmp(v, "none"))
    return false;
  *(bool *)dst = !strcmp(v, "lz4");
  return true;
}
/* --reasoning-budget: -1 no cap (the config's 0), 0 off (its -1), N. */
static bool set_budget(void *dst, const char *v) {
  long lv;
  if (!sl_parse_long(v, -1, 1 << 24, &lv))
    return false;
  *(int *)dst = lv < 0 ? 0 : lv == 0 ? -1 : (int)lv;
  return true;
}

#define AT(f) SL_FLAG_AT(serve_opts, f)
static const sl_flag serve_flags[] = {
    {.kind = SL_FLAG_GROUP, .names = "models:"},
    {SL_FLAG_FN, "-m, --model", "FILE", AT(n_files), .fn = add_file,
     .help = "a GGUF file to serve; may be repeated",
     .def = "the default model, when neither -m nor --models is given",
     .range = "a file (at most 256)"},
    {SL_FLAG_STR, "--models", "DIR", AT(models_dir),
     .help = "serve every .gguf file in DIR"},
    {SL_FLAG_STR, "--model-name", "NAME", AT(name),
     .help = "the first -m model's name", .def = "its file name without .gguf"},
    {SL_FLAG_FN, "--alias", "NAME=FILE", AT(n_aliases), .fn = add_alias,
     .help = "another name for the model of FILE", .def = "none",
     .range = "NAME=FILE (at most 256)"},
    {SL_FLAG_FN, "--pin", "NAME", AT(n_pins), .fn = add_pin,
     .help = "keep NAME loaded (never evicted nor reclaimed)", .def = "none",
     .range = "a model's name (at most 256)"},
    {SL_FLAG_LONG, "--idle-ttl", "S", AT(idle_ttl), 0, 365L * 86400,
     .help = "unload a model nobody used for S seconds", .def = "0, never"},
    {SL_FLAG_BYTES, "--max-memory", "BYTES", AT(e.max_memory),
     .help = "the budget of every loaded model, and the memory guard's limit",
     .def = "0, none"},
    {.kind = SL_FLAG_GROUP, .names = "engine:"},
    {SL_FLAG_ENUM, "--device", "auto|cpu|cuda", AT(e.device),
     .choices = "auto|cpu|cuda", .help = "where models run"},
    {SL_FLAG_INT, "-c, --ctx", "N", AT(e.n_ctx), 16, 1 << 20,
     .help = "tokens per sequence",
     .def = "the model's training context, at most what the KV cache holds; "
            "the cache holds --max-seqs sequences of %s",
     .seen = SL_FLAG_SEEN(serve_opts, ctx_set)},
    {SL_FLAG_INT, "-t, --threads", "N", AT(e.n_threads), 1, 1024,
     .help = "compute threads", .def = "all CPUs"},
    {SL_FLAG_ENUM, "--speculative", "off|ngram|draft", AT(e.speculative),
     .choices = "off|ngram|draft",
     .help = "speculative decoding on a CPU engine: requests draft by "
             "prompt lookup (and from OpenAI's \"prediction\"), or by a "
             "draft model (draft), and each step verifies the drafts (the "
             "same output, a sampled one for its seed; a request's "
             "\"speculative\": false opts out)"},
    {SL_FLAG_STR, "--draft-model", "FILE", AT(e.draft_model),
     .help = "the draft model of --speculative draft: a smaller GGUF model "
             "with the same vocabulary (implies --speculative draft)"},
    {SL_FLAG_INT, "--draft-max", "N", AT(e.draft_max), 1, 64,
     .help = "tokens a request drafts at most per step"},
    {SL_FLAG_SWITCH, "--draft-fixed", NULL, AT(e.draft_fixed),
     .help = "verify every draft a request may take each step, instead of "
             "the adaptive rule (fewer drafts as their acceptance falls or "
             "the batch grows, so that they pay)"},
    {SL_FLAG_INT, "--draft-min", "N", AT(e.draft_min), 1, 64,
     .help = "draft nothing when fewer would be drafted"},
    {SL_FLAG_INT, "--draft-ngram", "N", AT(e.draft_ngram), 1, 64,
     .help = "the longest suffix prompt lookup matches (down to 2 tokens)",
     .def = "4"},
    {SL_FLAG_INT, "--max-seqs", "N", AT(e.max_seqs), 1, 4096,
     .help = "sequences running at once"},
    {SL_FLAG_INT, "--max-batched-tokens", "N", AT(e.max_batched_tokens), 1,
     1 << 20, .help = "tokens per step", .def = "%s, or --max-seqs when larger",
     .seen = SL_FLAG_SEEN(serve_opts, mbt_set)},
    {SL_FLAG_INT, "--prefill-chunk", "N", AT(e.prefill_chunk), 1, 1 << 20,
     .help = "tokens per prefill chunk"},
    {SL_FLAG_INT, "--kv-block-tokens", "N", AT(e.kv_block_tokens), 1, 4096,
     .help = "tokens per KV block (a power of two)"},
    {SL_FLAG_INT, "--clear-every-tokens", "N", AT(e.clear_every_tokens), 0,
     1 << 30, .help = "a decode clear every N generated tokens (0: off)"},
    {SL_FLAG_INT, "--queue-timeout-ms", "MS", AT(e.queue_timeout_ms), 0,
     86400000,
     .help = "a request never admitted fails (503) after this (0: no limit)"},
    {SL_FLAG_FN, "--pooling", "mean|last", AT(s.pooling), .fn = set_pooling,
     .help = "how /v1/embeddings pools hidden states", .def = "mean",
     .range = "mean or last"},
    {SL_FLAG_CHOICE, "--tool-call-format", "F", AT(s.tool_call_format),
     .choices = "hermes|llama3|mistral|generic",
     .help = "hermes, llama3, mistral or generic: how the model writes tool "
             "calls",
     .def = "what its chat template shows"},
    {SL_FLAG_FN, "--reasoning-budget", "N", AT(s.reasoning_budget),
     .fn = set_budget,
     .help = "thinking tokens a request may use when it sets no budget: -1 "
             "no cap, 0 thinking off, N > 0 the thinking closed after N",
     .def = "-1", .range = "an integer from -1 to 16777216"},
    {SL_FLAG_CHOICE, "--reasoning-format", "F", AT(s.reasoning_format),
     .choices = "none|auto|deepseek",
     .help = "none, auto or deepseek: how thinking is split out of answers "
             "(none: left in the content)",
     .def = "auto, what its chat template shows"},
    {.kind = SL_FLAG_GROUP, .names = "KV tiers:"},
    {SL_FLAG_BYTES, "--hot-cache-bytes", "BYTES", AT(e.hot_cache_bytes),
     .help = "host copies of prefix KV blocks (LRU; on top of --max-memory)",
     .def = "0, none"},
    {SL_FLAG_FN, "--hot-cache-compress", "lz4|none", AT(e.hot_cache_lz4),
     .fn = set_lz4, .help = "compress hot blocks", .def = "none",
     .range = "lz4 or none"},
    {SL_FLAG_STR, "--ssd-cache-dir", "DIR", AT(e.ssd_cache_dir),
     .help = "prefix KV blocks on disk, kept across restarts (a folder per "
             "model when several)"},
    {SL_FLAG_BYTES, "--ssd-cache-bytes", "BYTES", AT(e.ssd_cache_bytes),
     1 << 20, .help = "the SSD tier's budget (LRU)"},
    {SL_FLAG_SWITCH, "--ssd-cache-optional", NULL, AT(e.ssd_cache_optional),
     .help = "a missing or read-only DIR warns instead of failing"},
    {.kind = SL_FLAG_GROUP, .names = "HTTP:"},
    {SL_FLAG_STR, "--host", "H", AT(s.host), .help = "address to bind"},
    {SL_FLAG_INT, "--port", "P", AT(s.port), 0, 65535, .help = "port"},
    {SL_FLAG_STR, "--api-key", "K", AT(s.api_key),
     .help = "required as Bearer or x-api-key, but on /health and the "
             "dashboard page"},
    {SL_FLAG_STR, "--cors-origin", "ORIGINS", AT(s.cors_origin),
     .help = "'*' or a comma-separated list"},
    {SL_FLAG_FN, "--allowed-host", "NAME", AT(allowed_hosts), .fn = add_host,
     .help = "a Host name the server answers besides loopback and --host "
             "(repeatable; .example.com: the names under it; '*': any)",
     .def = "none", .range = "a host name without spaces, '/' or '@'"},
    {SL_FLAG_FN, "--trusted-proxy", "ADDR", AT(trusted), .fn = add_proxy,
     .help = "a proxy (address or ADDR/N range, repeatable) whose "
             "connections name their client by a PROXY header (v1, v2) or "
             "X-Forwarded-For; the per-address limit counts that client",
     .def = "none", .range = "an address or ADDR/N, without spaces or ','"},
    {SL_FLAG_INT, "--max-tokens-default", "N", AT(s.max_tokens_default), 0,
     1 << 30,
     .help = "max_tokens of a chat request without one (0: the room left)"},
    {SL_FLAG_SWITCH, "--parse-special-in-content", NULL,
     AT(s.parse_special_in_content),
     .help = "read special tokens written in chat messages as tokens"},
    {SL_FLAG_BYTES, "--max-body", "BYTES", AT(max_body), 1024, 1ull << 32,
     .help = "larger request bodies get 413"},
    {SL_FLAG_UINT, "--http-timeout", "S", AT(s.http_timeout_s), 1, 86400,
     .help = "idle connection timeout"},
    {SL_FLAG_UINT, "--max-conns", "N", AT(s.max_conns), 1, 1 << 20,
     .help = "open connections (more are refused)"},
    {SL_FLAG_UINT, "--max-conns-per-ip", "N", AT(s.max_conns_per_ip), 0,
     1 << 20, .help = "per client address (0: no limit)"},
    {SL_FLAG_UINT, "--http-threads", "N", AT(s.http_threads), 1, 256,
     .help = "the HTTP thread pool"},
    {SL_FLAG_UINT, "--head-timeout-ms", "MS", AT(s.head_timeout_ms), 100,
     3600000, .help = "a request head must arrive within it"},
    {SL_FLAG_UINT, "--request-timeout-ms", "MS", AT(s.request_timeout_ms), 100,
     86400000, .help = "a whole request must arrive within it"},
    {SL_FLAG_UINT, "--grace-ms", "MS", AT(s.grace_ms), 0, 3600000,
     .help = "shutdown: in-flight requests get this long"},
};
#undef AT

static const char serve_head[] =
    "usage: sluice serve [options]\n"
    "  serves the OpenAI (/v1/chat/completions, /v1/completions,\n"
    "  /v1/embeddings, /v1/models) and Anthropic (/v1/messages,\n"
    "  count_tokens) APIs, /tokenize, /detokenize, /apply-template,\n"
    "  /health, /metrics, the admin API (/admin/api/...) and its\n"
    "  dashboard (/admin). BYTES take K, M, G suffixes (powers of\n"
    "  1024).\n";

static const char serve_tail[] =
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
    "  an eighth (lz4 saved 0.1% of SmolLM2's f16 KV).\n";

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

/* The options from argv: 0, or the exit code (2: a usage error; 0 with
 * *help after --help). */
static int parse_serve(serve_opts *o, int argc, char **argv, bool *help) {
  memset(o, 0, sizeof *o);
  o->s = sl_server_config_defaults();
  o->e = sl_engine_config_defaults();
  /* the KV pool resident from the start, as llama.cpp clears its KV buffer
   * at load (the soak test judges RSS from the first minute on) */
  o->e.kv_prefault = true;
  o->e.ssd_cache_bytes = 10ull << 30;
  o->max_body = o->s.max_body_bytes;
  int rc = sl_flags_parse("serve", SL_FLAGS(serve_flags), o, argc, argv,
                          serve_head, serve_tail, help);
  if (rc || *help)
    return rc;
  o->s.max_body_bytes = (size_t)o->max_body;
  if (o->allowed_hosts[0])
    o->s.allowed_hosts = o->allowed_hosts;
  if (o->trusted[0])
    o->s.trusted_proxies = o->trusted;
  if (o->e.draft_model && o->e.speculative == 0)
    o->e.speculative = 2; /* --draft-model alone: draft */
  if ((o->e.speculative == 2) != (o->e.draft_model != NULL)) {
    fprintf(stderr, "sluice serve: %s\n",
            o->e.draft_model
                ? "--draft-model goes with --speculative draft, not ngram"
                : "--speculative draft needs --draft-model FILE");
    return 2;
  }
  /* every running sequence decodes one token a step */
  if (o->e.max_batched_tokens < o->e.max_seqs) {
    if (o->mbt_set) {
      fprintf(stderr,
              "sluice serve: --max-batched-tokens %d is less than --max-seqs "
              "%d: a step must have room for one token of every running "
              "sequence; raise --max-batched-tokens to at least %d\n",
              o->e.max_batched_tokens, o->e.max_seqs, o->e.max_seqs);
      return 2;
    }
    o->e.max_batched_tokens = o->e.max_seqs;
  }
  return 0;
}

/* The index of the served model that `file` names (its path, file name,
 * stem or name), or -1. */
static int model_of_file(sl_pool_t *pool, const char *file) {
  for (int j = 0; j < sl_pool_count(pool); j++) {
    sl_pool_info in;
    sl_pool_info_at(pool, j, &in);
    char base[256], stem[256];
    model_names(in.path, base, sizeof base, stem, sizeof stem);
    if (!strcmp(file, in.path) || !strcmp(file, base) || !strcmp(file, stem) ||
        !strcmp(file, in.name))
      return j;
  }
  return -1;
}

/* Adds the models of paths[0..n) to the pool with their names, then the
 * aliases and pins of o; false with a message printed. */
static bool add_models(sl_pool_t *pool, const serve_opts *o,
                       const char *const *paths, int n) {
  char err[512] = "";
  /* names: the file's stem (--model-name for the first -m), and its base
   * name as an alias */
  for (int i = 0; i < n; i++) {
    char base[256], stem[256];
    model_names(paths[i], base, sizeof base, stem, sizeof stem);
    const char *nm = i == 0 && o->name ? o->name : stem;
    if (sl_pool_add(pool, nm, paths[i], err, sizeof err) != SL_OK) {
      fprintf(stderr, "sluice serve: %s\n", err);
      return false;
    }
    if (strcmp(base, nm) && sl_pool_find(pool, base) < 0)
      (void)sl_pool_add_alias(pool, base, nm, err, sizeof err);
  }
  for (size_t i = 0; i < o->n_aliases; i++) {
    const char *a = o->aliases[i], *eq = strchr(a, '=');
    char an[256];
    snprintf(an, sizeof an, "%.*s", (int)(eq - a), a);
    int k = model_of_file(pool, eq + 1);
    sl_pool_info in;
    if (k < 0 || !sl_pool_info_at(pool, k, &in)) {
      fprintf(stderr, "sluice serve: --alias %s: no served model is '%s'\n", a,
              eq + 1);
      return false;
    }
    if (sl_pool_add_alias(pool, an, in.name, err, sizeof err) != SL_OK) {
      fprintf(stderr, "sluice serve: --alias %s: %s\n", a, err);
      return false;
    }
  }
  for (size_t i = 0; i < o->n_pins; i++)
    if (sl_pool_set_pinned(pool, o->pins[i], true) != SL_OK) {
      fprintf(stderr, "sluice serve: --pin %s: no such model\n", o->pins[i]);
      return false;
    }
  return true;
}

/* Loads what must be loaded: the only model, and the pinned ones. */
static bool load_at_start(sl_pool_t *pool) {
  char err[512] = "";
  for (int i = 0; i < sl_pool_count(pool); i++) {
    sl_pool_info in;
    sl_pool_info_at(pool, i, &in);
    if (sl_pool_count(pool) > 1 && !in.pinned)
      continue;
    if (sl_pool_load(pool, in.name, err, sizeof err) != SL_OK) {
      fprintf(stderr, "sluice serve: cannot load '%s': %s\n", in.path, err);
      return false;
    }
  }
  return true;
}

/* The line that says the server is up: the first model, where it runs,
 * the address. */
static void say_serving(sl_pool_t *pool, const serve_opts *o,
                        sl_server_t *srv) {
  sl_pool_info first;
  sl_pool_info_at(pool, 0, &first);
  const char *dev_name = "cpu";
  sl_pool_lease fl;
  char devbuf[64] = "";
  if (sl_pool_acquire_loaded(pool, 0, &fl)) {
    snprintf(devbuf, sizeof devbuf, "%s", sl_engine_device_name(fl.engine));
    dev_name = devbuf;
    sl_pool_release(pool, &fl);
  } else if (o->e.device != SL_ENGINE_DEVICE_CPU && sl_cuda_available()) {
    dev_name = "cuda (on load)";
  }
  const char *host = o->s.host ? o->s.host : "127.0.0.1";
  bool v6 = strchr(host, ':') != NULL;
  if (sl_pool_count(pool) > 1)
    fprintf(stderr, "sluice: %d models, the first %s\n", sl_pool_count(pool),
            first.name);
  fprintf(stderr, "sluice: serving %s on %s at http://%s%s%s:%d\n", first.name,
          dev_name, v6 ? "[" : "", host, v6 ? "]" : "", sl_server_port(srv));
  fflush(stderr);
}

/* Makes the pool of the models o names; NULL with a message printed. */
static sl_pool_t *open_pool(const serve_opts *o, const char *const *paths,
                            int n) {
  sl_pool_t *pool = NULL;
  sl_pool_config pc = sl_pool_config_defaults();
  pc.engine = o->e;
  pc.max_memory = o->e.max_memory;
  pc.idle_ttl_s = (unsigned)o->idle_ttl;
  pc.prefault = true; /* a CPU model's weights, at load */
  pc.progress = true;
  pc.on_stage = on_stage;
  pc.n_ctx_fixed = o->ctx_set;
  sl_status st = sl_pool_create(&pc, &pool);
  if (st != SL_OK) {
    fprintf(stderr, "sluice serve: %s\n", sl_status_str(st));
    return NULL;
  }
  if (!add_models(pool, o, paths, n) || !load_at_start(pool)) {
    sl_pool_free(pool);
    return NULL;
  }
  return pool;
}

int sl_cli_serve_main(int argc, char **argv) {
  static serve_opts o; /* ~12 KB of lists: not on the stack */
  bool help;
  int rc = parse_serve(&o, argc, argv, &help);
  if (rc || help)
    return rc;
  char defbuf[PATH_MAX];
  const char *paths[2 * MAX_MODELS];
  char *scanned[MAX_MODELS];
  int n_scanned = 0, n = 0;
  for (size_t i = 0; i < o.n_files; i++)
    paths[n++] = o.files[i];
  if (o.models_dir && !scan_models(o.models_dir, scanned, &n_scanned,
                                   MAX_MODELS - (int)o.n_files))
    return 2;
  for (int i = 0; i < n_scanned; i++)
    paths[n++] = scanned[i];
  if (!n)
    paths[n++] = sl_model_default_path(defbuf, sizeof defbuf);

  /* before any thread exists: only sigwait() below receives these */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN); /* a vanished client is an error return */

  rc = 1;
  char err[512] = "";
  sl_server_t *srv = NULL;
  sl_pool_t *pool = open_pool(&o, paths, n);
  if (!pool)
    goto out;
  if (sl_server_start(pool, &o.s, &srv, err, sizeof err) != SL_OK) {
    fprintf(stderr, "sluice serve: %s\n", err);
    goto out;
  }
  say_serving(pool, &o, srv);
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
