/* sluice — server: the server's state and one request's state on its
 * connection, as the HTTP front (http.c) makes them; read by the routes
 * (generate.c, routes.c, admin.c), the replies (reply.c) and the answers
 * to half-closed clients (detach.c). Types only: the front's functions
 * are sluice/server.h's, and no file but http.c needs more of it.
 *
 * Layers inside the server, bottom first: a file includes the headers of
 * the entries listed before its own only (each .c has its own header; .h
 * entries are types only). tools/check_layers.py checks this order.
 *   metrics.h   the counters behind /metrics and the stats, as a type
 *   json.c      UTF-8 checks, a string builder, API error bodies (no engine)
 *   json_scan.c a body's shape, before jansson builds it
 *   reasoning.c thinking split out of a model's text, per format family
 *   toolcall.c  tool calls read out of a model's text, per format family
 *   request.h   a parsed request and the limits it is checked against
 *   schema.c    JSON Schema -> GBNF (structured output)
 *   tools.c     tools and tool_choice, tool calls and results in the
 *               conversation, the grammar of a forced call
 *   reasoning_req.c a request's thinking switches and budget
 *   constrain.c response_format and grammar fields -> a grammar
 *   embed.c     /v1/embeddings request inputs, checked and tokenized
 *   prompt.c    sl_srv_request -> prompt token ids (chat template, tokenizer)
 *   parse.c     request bodies -> sl_srv_request, or an sl_srv_error
 *   head.c      the request head check, raw (pre-libmicrohttpd) error answers
 *   origin.c    whom the server answers: Host, Origin, Content-Type
 *   proxy.c     trusted proxies: ranges, PROXY v1/v2, X-Forwarded-For
 *   door.c      the front door: accept, connection limits, the first head
 *   sockwatch.c the request watch (a 400 for bytes that make no line, a
 *               408 past the request deadline), and the parked-job tick
 *   job.c       the job: engine events, posting, aborts, its failure as
 *               an API error, its model's lease given back; the live jobs
 *   answer.c    a job's answer as text: its thinking split out, its tool
 *               calls, what a stream sends next
 *   state.h     this header: the server's and a connection's state
 *   routes.c    model leases taken; /v1/models, count_tokens, /tokenize,
 *               /detokenize, /apply-template, the admin model actions
 *   openai.c    OpenAI response bodies and SSE chunks, the embeddings body
 *   anthropic.c Anthropic response bodies and SSE events
 *   admin.c     /health, /metrics, /admin/api/stats
 *   reply.c     answers, parked connections and their wake-ups, SSE
 *   detach.c    answers to clients that half-closed, on a dup of the socket
 *   generate.c  the generation and embeddings routes, waiting for a load
 *   http.c      libmicrohttpd callbacks, framing, auth, routing, start and
 *               stop
 */
#ifndef SLUICE_SERVER_STATE_H
#define SLUICE_SERVER_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "server/door.h"
#include "server/job.h"
#include "server/json.h"
#include "server/metrics.h"
#include "server/sockwatch.h"
#include "server/toolcall.h"
#include "sluice/pool.h"
#include "sluice/server.h"

struct MHD_Daemon; /* libmicrohttpd's */

struct sl_server {
  sl_pool_t *pool;      /* the models (borrowed); "default" is entry 0 */
  sl_server_config cfg; /* strings below are owned copies */
  char *host, *api_key, *cors, *allowed_hosts;
  struct sl_srv_cidr *trusted; /* --trusted-proxy ranges (n_trusted) */
  size_t n_trusted;
  /* answers to clients that half-closed, written by the watch's thread
   * (detach.c); det_mu guards the list and the count */
  pthread_mutex_t det_mu;
  struct sl_srv_detached *detached;
  uint64_t n_detached_total;
  sl_srv_toolfmt toolfmt; /* --tool-call-format (NONE: the template's) */
  sl_srv_rfmt rfmt;       /* --reasoning-format (AUTO: the template's) */
  struct MHD_Daemon *mhd;
  sl_srv_door *door;   /* NULL: not started */
  sl_srv_watch *watch; /* NULL: not started */
  atomic_int n_parked; /* connections suspended, not yet back in a handler */
  /* generation requests parked while the model they name loads
   * (generate.c: one helper thread per model loading, which resumes
   * them) */
  pthread_mutex_t load_mu;
  struct sl_srv_loading *loading;
  atomic_int n_load_parked;
  int port;
  uint64_t t_start_ns;
  long long started_at; /* wall clock, seconds (the models' "created") */

  sl_srv_jobs jobs;    /* live jobs, open responses, the stopping flag */
  atomic_bool closing; /* MHD is about to stop: a handler parks nothing */

  sl_srv_metrics m;
};

/* A route: its path, its methods and its handler (http.c's table; the
 * type is the front's own). */
struct sl_srv_route;

/* The headers every answer to one request carries (reply.c adds them). */
typedef struct sl_srv_hdrs {
  char rid[136];     /* x-request-id: the client's, or made here */
  char acao[264];    /* Access-Control-Allow-Origin ("" : none) */
  const char *allow; /* the route's methods (Allow: on a 405, a preflight) */
} sl_srv_hdrs;

/* Per-request state of one connection (MHD's con_cls): made and freed by
 * http.c, on the connection's pool thread only. */
typedef struct sl_srv_conn {
  const struct sl_srv_route *route; /* NULL: no route has the path */
  sl_srv_api api;                   /* a generation route's API */
  sl_srv_family fam;
  bool responded; /* an early response (401, 413) was queued */
  bool too_large;
  sl_sbuf body;
  sl_srv_job *job;
  bool open;    /* counted in the jobs' n_open until on_completed */
  bool waiting; /* submitted; the answer is not yet queued */
  bool http10;  /* the request is HTTP/1.0 */
  /* parked while the model it names loads; resumed with load_err.http 0
   * (loaded) or the load's error */
  bool load_wait;
  sl_srv_error load_err;
  sl_srv_hdrs hdrs;
} sl_srv_conn;

#endif
