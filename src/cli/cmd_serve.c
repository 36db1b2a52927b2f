/* `sluice serve`: load a model, start its engine and the HTTP server, serve
 * until SIGINT / SIGTERM, then shut down cleanly (exit 0).
 *
 * Signals: SIGINT and SIGTERM are blocked before any thread starts, so every
 * thread inherits the mask and only this thread, in sigwait(), sees them. */
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
#include "sluice/rt.h"
#include "sluice/server.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

/* Dispatched from main.c as `sluice serve ...`; returns the exit code. */
int sl_cli_serve_main(int argc, char **argv);

static void serve_usage(FILE *f) {
  fprintf(
      f,
      "usage: sluice serve [-m MODEL] [--host H] [--port P] [--api-key K]\n"
      "                    [--model-name NAME] [-c CTX] [-t THREADS]\n"
      "                    [--max-memory BYTES] [--max-seqs N]\n"
      "                    [--device auto|cpu|cuda] [--clear-every-tokens N]\n"
      "                    [--max-batched-tokens N] [--prefill-chunk N]\n"
      "                    [--kv-block-tokens N] [--http-timeout S]\n"
      "                    [--max-body BYTES] [--grace-ms MS]\n"
      "                    [--parse-special-in-content]\n"
      "                    [--queue-timeout-ms MS] [--max-conns N]\n"
      "                    [--max-conns-per-ip N] [--http-threads N]\n"
      "                    [--head-timeout-ms MS] [--request-timeout-ms MS]\n"
      "                    [--ssd-cache-dir DIR] [--ssd-cache-bytes BYTES]\n"
      "                    [--ssd-cache-optional] [--hot-cache-bytes BYTES]\n"
      "                    [--hot-cache-compress lz4|none]\n"
      "                    [--max-tokens-default N] [--cors-origin ORIGINS]\n"
      "                    [--tool-call-format hermes|llama3|mistral|generic]\n"
      "                    [--pooling mean|last]\n"
      "  serves the OpenAI (/v1/chat/completions, /v1/completions,\n"
      "  /v1/models) and Anthropic (/v1/messages, count_tokens) APIs,\n"
      "  /tokenize and /detokenize, /health, /metrics and\n"
      "  /admin/api/stats; binds 127.0.0.1:8080 unless told otherwise.\n"
      "  --max-tokens-default (4096; 0: the room left in the context) caps a\n"
      "  chat request that gives no max_tokens; a max_tokens above the room\n"
      "  left in the context is clamped to it.\n"
      "  --cors-origin: '*' or a comma-separated list of origins allowed to\n"
      "  call from a browser (off by default: no CORS headers).\n"
      "  --pooling: how /v1/embeddings pools a text's hidden states (mean,\n"
      "  the default, or the last token's); the vector is L2-normalized.\n"
      "  --tool-call-format: how the model writes tool calls (default: what\n"
      "  its chat template shows; a template that does not render tools gets\n"
      "  them described in a system message and answers in the generic\n"
      "  JSON form).\n"
      "  BYTES accept K, M, G suffixes (powers of 1024).\n"
      "  --max-batched-tokens defaults to 512, or to --max-seqs when that is\n"
      "  larger (each running sequence needs a token of every step).\n"
      "  --parse-special-in-content: read special tokens such as\n"
      "  <|im_end|> written in chat messages as those tokens, as llama.cpp\n"
      "  does; by default they are plain text there (only the chat\n"
      "  template's own text has special tokens), so a client cannot close\n"
      "  its turn and forge a system turn. /v1/completions prompts always\n"
      "  have special tokens parsed: the client writes the whole prompt.\n"
      "  A request that fits the memory alone waits for room up to\n"
      "  --queue-timeout-ms (30000; 0: no limit), then gets a 503.\n"
      "  Connections: at most --max-conns (4096) open, --max-conns-per-ip\n"
      "  (256; 0: no limit) from one client address; more are refused at\n"
      "  once. A request head must arrive whole within --head-timeout-ms\n"
      "  (10000) of its first byte, the whole request within\n"
      "  --request-timeout-ms (60000): 408 past that. --http-threads (4)\n"
      "  sizes the HTTP thread pool (no thread waits for a client).\n"
      "  --ssd-cache-dir: prefix KV blocks are also written there (one\n"
      "  checksummed file per block, at most --ssd-cache-bytes, 10G by\n"
      "  default, least recently used out first) and restored from there,\n"
      "  across restarts. A missing or read-only DIR is an error, or with\n"
      "  --ssd-cache-optional a warning and no SSD cache.\n"
      "  --hot-cache-bytes (0: none): copies of prefix KV blocks in host\n"
      "  memory, looked up after the pool and before the SSD cache (least\n"
      "  recently used out first; on top of --max-memory), held\n"
      "  lz4-compressed where that saves an eighth with --hot-cache-compress\n"
      "  lz4 (none by default: lz4 saved 0.1%% of SmolLM2's f16 KV).\n");
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

int sl_cli_serve_main(int argc, char **argv) {
  char defbuf[PATH_MAX];
  const char *model = NULL, *name = NULL;
  sl_server_config scfg = sl_server_config_defaults();
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
#define NEED_VALUE                                                             \
  if (!v) {                                                                    \
    fprintf(stderr, "sluice serve: %s needs a value\n", a);                    \
    return 2;                                                                  \
  }                                                                            \
  i++;
#define BAD_VALUE                                                              \
  {                                                                            \
    fprintf(stderr, "sluice serve: bad value '%s' for %s\n", v, a);            \
    return 2;                                                                  \
  }
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
      NEED_VALUE model = v;
    } else if (!strcmp(a, "--host")) {
      NEED_VALUE scfg.host = v;
    } else if (!strcmp(a, "--port")) {
      NEED_VALUE if (!sl_parse_long(v, 0, 65535, &lv)) BAD_VALUE scfg.port =
          (int)lv;
    } else if (!strcmp(a, "--api-key")) {
      NEED_VALUE scfg.api_key = v;
    } else if (!strcmp(a, "--model-name")) {
      NEED_VALUE name = v;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
      NEED_VALUE if (!sl_parse_long(v, 16, 1 << 20, &lv)) BAD_VALUE ecfg.n_ctx =
          (int)lv;
      ctx_set = true;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
      NEED_VALUE if (!sl_parse_long(v, 1, 1024, &lv)) BAD_VALUE ecfg.n_threads =
          (int)lv;
    } else if (!strcmp(a, "--max-memory")) {
      NEED_VALUE if (!parse_bytes(v, &bv)) BAD_VALUE ecfg.max_memory = bv;
    } else if (!strcmp(a, "--clear-every-tokens")) {
      NEED_VALUE if (!sl_parse_long(v, 0, 1 << 30, &lv))
          BAD_VALUE ecfg.clear_every_tokens = (int)lv;
    } else if (!strcmp(a, "--device")) {
      NEED_VALUE if (!sl_engine_device_parse(v, &ecfg.device)) BAD_VALUE
    } else if (!strcmp(a, "--max-seqs")) {
      NEED_VALUE if (!sl_parse_long(v, 1, 4096, &lv)) BAD_VALUE ecfg.max_seqs =
          (int)lv;
    } else if (!strcmp(a, "--max-batched-tokens")) {
      NEED_VALUE if (!sl_parse_long(v, 1, 1 << 20, &lv))
          BAD_VALUE ecfg.max_batched_tokens = (int)lv;
      mbt_set = true;
    } else if (!strcmp(a, "--prefill-chunk")) {
      NEED_VALUE if (!sl_parse_long(v, 1, 1 << 20, &lv))
          BAD_VALUE ecfg.prefill_chunk = (int)lv;
    } else if (!strcmp(a, "--kv-block-tokens")) {
      NEED_VALUE if (!sl_parse_long(v, 1, 4096, &lv))
          BAD_VALUE ecfg.kv_block_tokens = (int)lv;
    } else if (!strcmp(a, "--http-timeout")) {
      NEED_VALUE if (!sl_parse_long(v, 1, 86400, &lv))
          BAD_VALUE scfg.http_timeout_s = (unsigned)lv;
    } else if (!strcmp(a, "--max-body")) {
      NEED_VALUE if (!parse_bytes(v, &bv) || bv < 1024 || bv > (1ull << 32))
          BAD_VALUE scfg.max_body_bytes = (size_t)bv;
    } else if (!strcmp(a, "--max-conns")) {
      NEED_VALUE if (!sl_parse_long(v, 1, 1 << 20, &lv))
          BAD_VALUE scfg.max_conns = (unsigned)lv;
    } else if (!strcmp(a, "--max-conns-per-ip")) {
      NEED_VALUE if (!sl_parse_long(v, 0, 1 << 20, &lv))
          BAD_VALUE scfg.max_conns_per_ip = (unsigned)lv;
    } else if (!strcmp(a, "--http-threads")) {
      NEED_VALUE if (!sl_parse_long(v, 1, 256, &lv))
          BAD_VALUE scfg.http_threads = (unsigned)lv;
    } else if (!strcmp(a, "--head-timeout-ms")) {
      NEED_VALUE if (!sl_parse_long(v, 100, 3600000, &lv))
          BAD_VALUE scfg.head_timeout_ms = (unsigned)lv;
    } else if (!strcmp(a, "--request-timeout-ms")) {
      NEED_VALUE if (!sl_parse_long(v, 100, 86400000, &lv))
          BAD_VALUE scfg.request_timeout_ms = (unsigned)lv;
    } else if (!strcmp(a, "--grace-ms")) {
      NEED_VALUE if (!sl_parse_long(v, 0, 3600000, &lv))
          BAD_VALUE scfg.grace_ms = (unsigned)lv;
    } else if (!strcmp(a, "--max-tokens-default")) {
      NEED_VALUE if (!sl_parse_long(v, 0, 1 << 30, &lv))
          BAD_VALUE scfg.max_tokens_default = (int)lv;
    } else if (!strcmp(a, "--pooling")) {
      NEED_VALUE if (strcmp(v, "mean") && strcmp(v, "last"))
          BAD_VALUE scfg.pooling =
          !strcmp(v, "last") ? SL_POOL_LAST : SL_POOL_MEAN;
    } else if (!strcmp(a, "--tool-call-format")) {
      NEED_VALUE if (strcmp(v, "hermes") && strcmp(v, "llama3") &&
                     strcmp(v, "mistral") && strcmp(v, "generic"))
          BAD_VALUE scfg.tool_call_format = v;
    } else if (!strcmp(a, "--cors-origin")) {
      NEED_VALUE scfg.cors_origin = v;
    } else if (!strcmp(a, "--parse-special-in-content")) {
      scfg.parse_special_in_content = true;
    } else if (!strcmp(a, "--ssd-cache-dir")) {
      NEED_VALUE ecfg.ssd_cache_dir = v;
    } else if (!strcmp(a, "--ssd-cache-bytes")) {
      NEED_VALUE if (!parse_bytes(v, &bv) || bv < (1u << 20))
          BAD_VALUE ecfg.ssd_cache_bytes = bv;
    } else if (!strcmp(a, "--ssd-cache-optional")) {
      ecfg.ssd_cache_optional = true;
    } else if (!strcmp(a, "--hot-cache-bytes")) {
      NEED_VALUE if (!parse_bytes(v, &bv)) BAD_VALUE ecfg.hot_cache_bytes = bv;
    } else if (!strcmp(a, "--hot-cache-compress")) {
      NEED_VALUE if (strcmp(v, "lz4") && strcmp(v, "none"))
          BAD_VALUE ecfg.hot_cache_lz4 = !strcmp(v, "lz4");
    } else if (!strcmp(a, "--queue-timeout-ms")) {
      NEED_VALUE if (!sl_parse_long(v, 0, 86400000, &lv))
          BAD_VALUE ecfg.queue_timeout_ms = (int)lv;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      serve_usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "sluice serve: unknown option '%s'\n", a);
      serve_usage(stderr);
      return 2;
    }
#undef NEED_VALUE
#undef BAD_VALUE
  }
  if (!model)
    model = sl_model_default_path(defbuf, sizeof defbuf);
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
  sl_tokenizer_t *tok = NULL;
  sl_engine_t *engine = NULL;
  sl_server_t *srv = NULL;
  sl_model_t *m = sl_model_load(model, &st, err, sizeof err);
  if (!m) {
    fprintf(stderr, "sluice serve: cannot load '%s': %s\n", model, err);
    goto out;
  }
  if (ecfg.device == SL_ENGINE_DEVICE_CPU || !sl_cuda_available())
    sl_model_prefault(m, true); /* on a GPU the upload reads them */
  if (sl_tokenizer_load(sl_model_gguf(m), &tok, err, sizeof err) != SL_OK) {
    fprintf(stderr, "sluice serve: tokenizer: %s\n", err);
    goto out_model;
  }
  const sl_model_hparams *hp = sl_model_hparams_of(m);
  if (!ctx_set && hp->n_ctx_train > 0 && hp->n_ctx_train < ecfg.n_ctx)
    ecfg.n_ctx = (int)hp->n_ctx_train;
  if ((st = sl_engine_create(m, tok, &ecfg, &engine)) != SL_OK) {
    fprintf(stderr, "sluice serve: cannot start the engine: %s\n",
            sl_status_str(st));
    goto out_tok;
  }
  char base[256], stem[256];
  model_names(model, base, sizeof base, stem, sizeof stem);
  scfg.model_name = name ? name : stem;
  scfg.model_alias = base;
  scfg.n_ctx = ecfg.n_ctx;
  if ((st = sl_server_start(engine, m, tok, &scfg, &srv, err, sizeof err)) !=
      SL_OK) {
    fprintf(stderr, "sluice serve: %s\n", err);
    goto out_engine;
  }
  const char *host = scfg.host ? scfg.host : "127.0.0.1";
  bool v6 = strchr(host, ':') != NULL;
  fprintf(stderr, "sluice: serving %s on %s at http://%s%s%s:%d\n",
          scfg.model_name, sl_engine_device_name(engine), v6 ? "[" : "", host,
          v6 ? "]" : "", sl_server_port(srv));
  fflush(stderr);

  int sig = 0;
  while (sigwait(&sigs, &sig) != 0)
    ;
  fprintf(stderr, "sluice: %s, shutting down\n",
          sig == SIGINT ? "SIGINT" : "SIGTERM");
  sl_server_stop(srv);
  rc = 0;
out_engine:
  sl_engine_free(engine);
out_tok:
  sl_tokenizer_free(tok);
out_model:
  sl_model_free(m);
out:
  return rc;
}
