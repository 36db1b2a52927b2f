/* sluice — server: HTTP front end of an engine pool (sluice/pool.h): each
 * request names its model, which the pool loads on first use. OpenAI-compatible
 * (/v1/chat/completions, /v1/completions, /v1/models), Anthropic-compatible
 * (/v1/messages), /health, /metrics (Prometheus text) and /admin/api/stats.
 *
 * HTTP threads (libmicrohttpd, one thread per connection) parse, validate,
 * render the chat template, tokenize, submit to the engine and stream the
 * engine's events back; they never touch tensors. Bad input gets a 4xx in
 * the route's own error shape.
 *
 * Threading: sl_server_start / sl_server_stop are called by one owner thread
 * (the CLI). Everything else happens on the server's own threads.
 */
#ifndef SLUICE_SERVER_H
#define SLUICE_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/engine.h"
#include "sluice/pool.h"
#include "sluice/status.h"

typedef struct sl_server sl_server_t;

typedef struct sl_server_config {
  const char *host;              /* address to bind (default "127.0.0.1") */
  int port;                      /* 0: any free port (see sl_server_port) */
  const char *api_key;           /* NULL or "": no authentication */
  size_t max_body_bytes;         /* request bodies over this get 413 (8 MiB) */
  unsigned http_timeout_s;       /* idle connection timeout (30 s) */
  unsigned max_conns;            /* open connections, all clients (4096; more
                                    are refused at once) */
  unsigned max_conns_per_ip;     /* open connections per client address
                                    (256; 0: no limit) */
  unsigned http_threads;         /* libmicrohttpd's thread pool (4) */
  unsigned head_timeout_ms;      /* a request head's first byte to its end:
                                    408 past this (10 s) */
  unsigned request_timeout_ms;   /* a request's first byte to its body's
                                    end: 408 past this (60 s) */
  unsigned grace_ms;             /* shutdown: wait this long for in-flight
                                    requests before aborting them (10 s) */
  bool parse_special_in_content; /* parse special tokens ("<|im_end|>") in
                                    message text too, as llama.cpp does
                                    (false: only in the chat template's own
                                    text, so a client cannot forge turns) */
  int max_tokens_default;        /* a chat request without max_tokens generates
                                    at most this many (4096; 0: the room left in
                                    the context) */
  sl_pooling pooling; /* /v1/embeddings: SL_POOL_MEAN (also for NONE, the
                         default) or SL_POOL_LAST */
  const char *tool_call_format; /* how the model writes tool calls: "hermes",
                                  "llama3", "mistral" or "generic"; NULL or
                                  "": what its chat template shows */
  const char *reasoning_format; /* how a model's thinking is split out of its
                                  answer: "none" (left in the content),
                                  "deepseek" (<think>...</think>) or
                                  "auto" (NULL, ""): what its chat template
                                  shows */
  int reasoning_budget;      /* a request that sets no thinking budget gets this
                                one (--reasoning-budget): 0 none (the default),
                                N > 0 its thinking closed after N tokens, < 0
                                thinking off (the template's enable_thinking
                                false) */
  const char *cors_origin;   /* NULL or "": no CORS headers; "*": any origin;
                                else a comma-separated list of origins */
  const char *allowed_hosts; /* Host names the server answers besides
                                loopback and the bound address
                                (--allowed-host): comma-separated; a
                                leading "." takes the names under it;
                                "*": any (src/server/origin.h) */
  const char *trusted_proxies; /* proxies whose connections name their client
                                  (--trusted-proxy): comma-separated
                                  addresses or ADDR/N ranges; from these
                                  only, a PROXY protocol header or
                                  X-Forwarded-For sets the address the
                                  per-address limit counts */
} sl_server_config;

/* Defaults as documented above. */
sl_server_config sl_server_config_defaults(void);

/* Starts serving the models of `pool` (borrowed: it must outlive the
 * server; at least one model). A request's "model" is a pool name or alias,
 * or "default" (the pool's first model). The config's strings are copied.
 * On failure returns SL_ERR_INVALID_ARG (bad config, e.g. an unparsable
 * host), SL_ERR_IO (cannot bind) or SL_ERR_NOMEM, with a message in err,
 * and *out is NULL. The caller stops and frees the server with
 * sl_server_stop, then the pool. */
sl_status sl_server_start(sl_pool_t *pool, const sl_server_config *cfg,
                          sl_server_t **out, char *err, size_t errcap);

/* The TCP port the server listens on (useful with port 0). */
int sl_server_port(const sl_server_t *s);

/* Stops accepting connections, lets in-flight requests end for up to the
 * configured grace period, aborts the rest through their engines, waits for
 * their connections to finish and frees the server. NULL is a no-op. The
 * pool is not freed. */
void sl_server_stop(sl_server_t *s);

#endif
