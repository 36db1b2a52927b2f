/* sluice — server: the HTTP front. libmicrohttpd's callbacks, request
 * framing, authentication, routing, and the server's start and stop.
 *
 * Threads: the front door (door.c) accepts and hands each connection whose
 * first request head is whole to libmicrohttpd, which runs a poll loop on
 * each thread of a small pool: no thread waits for a client. (Its epoll
 * mode, in 0.9.75, lost connections whose client had half-closed after
 * its request: 29 of 200 such requests hung in CLOSE-WAIT, never
 * answered; poll lost none.) A pool thread routes each request here; a
 * generation request goes on to generate.c, which posts its job
 * (job.c) and parks the connection; the replies, the parking and the
 * wake-ups are reply.c's.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/admin.h"
#include "server/detach.h"
#include "server/door.h"
#include "server/generate.h"
#include "server/head.h"
#include "server/job.h"
#include "server/json.h"
#include "server/json_scan.h"
#include "server/origin.h"
#include "server/proxy.h"
#include "server/reply.h"
#include "server/routes.h"
#include "server/sockwatch.h"
#include "server/state.h"
#include "server/toolcall.h"
#include "sluice/util.h"

/* Constant-time comparison of a header value with the key. */
static bool key_eq(const char *got, const char *want) {
  size_t gl = strlen(got), wl = strlen(want);
  unsigned diff = gl != wl;
  for (size_t i = 0; i < wl; i++)
    diff |= (unsigned)(unsigned char)want[i] ^
            (unsigned)(unsigned char)(i < gl ? got[i] : 0);
  return diff == 0;
}

static bool authorized(sl_server_t *s, struct MHD_Connection *c) {
  if (!s->api_key)
    return true;
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                              MHD_HTTP_HEADER_AUTHORIZATION);
  if (h && strncasecmp(h, "Bearer ", 7) == 0) {
    h += 7;
    while (*h == ' ')
      h++;
    if (key_eq(h, s->api_key))
      return true;
  }
  h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
  return h && key_eq(h, s->api_key);
}

/* The connection's request-line watch entry (NULL when not watched). */
static sl_srv_sock *sock_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* ---- request framing
 * ---------------------------------------------------------- */

typedef struct framing {
  int n_host, n_length, n_coding;
  bool chunked; /* the one Transfer-Encoding is exactly "chunked" */
} framing;

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind,
                                     const char *key, const char *value) {
  framing *f = cls;
  (void)kind;
  if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0)
    f->n_host++;
  else if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0)
    f->n_length++;
  else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
    f->n_coding++;
    f->chunked = value && strcasecmp(value, "chunked") == 0;
  }
  return MHD_YES;
}

/* True when the request's framing headers are ambiguous: what a proxy in
 * front and this server take for the body (or the host) could differ, the
 * ground of request smuggling; *err then says why (a 400). libmicrohttpd
 * takes the first Content-Length, lets Transfer-Encoding win over it,
 * waits for the close on a coding it does not know, and accepts HTTP/1.1
 * without Host: all refused here. */
static bool framing_bad(struct MHD_Connection *c, const char *version,
                        sl_srv_error *err) {
  framing f = {0};
  MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
  const char *why = NULL;
  if (f.n_length > 1)
    why = "more than one Content-Length header";
  else if (f.n_length && f.n_coding)
    why = "both Content-Length and Transfer-Encoding";
  else if (f.n_coding > 1 || (f.n_coding && !f.chunked))
    why = "a Transfer-Encoding other than a single \"chunked\"";
  else if (f.n_host > 1)
    why = "more than one Host header";
  else if (!f.n_host && version && strcmp(version, MHD_HTTP_VERSION_1_0) != 0)
    why = "an HTTP/1.1 request without a Host header";
  if (!why)
    return false;
  sl__srv_error_set(err, 400, "malformed_request", NULL,
                    "malformed HTTP request: %s", why);
  return true;
}

/* A client's x-request-id is echoed when it is 1 to 128 characters of
 * [A-Za-z0-9._:/=+-]; otherwise (or without one) a new id is made. */
static void request_id(struct MHD_Connection *c, char *out, size_t cap) {
  const char *h =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-request-id");
  size_t n = h ? strlen(h) : 0;
  bool ok = n >= 1 && n <= 128 && n < cap;
  for (size_t i = 0; ok && i < n; i++) {
    unsigned char ch = (unsigned char)h[i];
    ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         (ch >= '0' && ch <= '9') || strchr("._:/=+-", ch);
  }
  if (ok)
    memcpy(out, h, n + 1);
  else
    sl__srv_make_id(out, cap, "req_");
}

/* Access-Control-Allow-Origin for this request under --cors-origin: "*",
 * or the request's Origin when it is one of the listed origins; "" when
 * CORS is off or the origin is not listed. */
static void cors_origin(sl_server_t *s, struct MHD_Connection *c, char *out,
                        size_t cap) {
  out[0] = 0;
  const char *list = s->cfg.cors_origin;
  if (!list || !list[0])
    return;
  if (!strcmp(list, "*")) {
    snprintf(out, cap, "*");
    return;
  }
  const char *o = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
  size_t on = o ? strlen(o) : 0;
  if (on && on < cap && sl__srv_origin_listed(list, o, on))
    memcpy(out, o, on + 1);
}

/* Whom the request may come from (origin.h): its Host must name this
 * server, its Origin (when sent) be the server's own or one --cors-origin
 * allows, and a POST's body be application/json. A 403 or 415 in the
 * route's shape, with *err set, when one fails: its SL_SRV_REFUSED_* reason
 * (0: let through). HTTP/1.0 without Host is let through (no browser sends
 * that). */
static int sender_refused(sl_server_t *s, struct MHD_Connection *c, bool post,
                          sl_srv_error *err) {
  const char *host =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
  const char *origin =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
  if (host && !sl__srv_host_allowed(host, s->host, s->allowed_hosts)) {
    sl__srv_error_set(err, 403, "host_not_allowed", NULL,
                      "Host '%.100s' is not one of this server's names "
                      "(loopback, the bound address, --allowed-host)",
                      host);
    return SL_SRV_REFUSED_HOST;
  }
  if (origin && !sl__srv_origin_allowed(origin, host, s->cfg.cors_origin)) {
    sl__srv_error_set(err, 403, "origin_not_allowed", NULL,
                      "Origin '%.100s' may not use this server (its own "
                      "origin, or one --cors-origin allows)",
                      origin);
    return SL_SRV_REFUSED_ORIGIN;
  }
  if (post) {
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!sl__srv_content_type_json(ct)) {
      sl__srv_error_set(err, 415, "unsupported_media_type", NULL,
                        "a POST body must be sent as Content-Type: "
                        "application/json (got %.60s)",
                        ct ? ct : "none");
      return SL_SRV_REFUSED_TYPE;
    }
  }
  return 0;
}

/* ---- routes
 * ------------------------------------------------------------------- */

/* A route that generates nothing, from its body: its JSON or its error. */
typedef sl_status (*body_route)(sl_server_t *s, const char *body, size_t len,
                                json_t **out, sl_srv_error *err);

enum {
  GET = 1u,    /* GET and HEAD */
  POST = 2u,   /* POST, its body application/json */
  PREFIX = 4u, /* the path is a prefix; the rest (not empty) goes on */
  OPEN = 8u,   /* answered without the API key */
};

/* One route, one line: its path, how it is reached, and what answers it:
 * exactly one of the handlers. 404, 405 and a preflight's methods come
 * from here. */
typedef struct sl_srv_route {
  const char *path;
  unsigned how;
  json_t *(*get)(sl_server_t *s);                    /* the JSON of a GET */
  json_t *(*act)(sl_server_t *s, sl_srv_error *err); /* JSON, or *err */
  json_t *(*sub)(sl_server_t *s, const char *rest,
                 sl_srv_error *err); /* PREFIX: JSON for the rest, or *err */
  body_route body;                   /* JSON from the body, or *err */
  enum MHD_Result (*send)(sl_server_t *s, struct MHD_Connection *c,
                          sl_srv_conn *cn); /* answers itself */
  sl_srv_api api; /* with send = generate_route: the generation API */
} sl_srv_route;

static enum MHD_Result send_health(sl_server_t *s, struct MHD_Connection *c,
                                   sl_srv_conn *cn) {
  (void)cn;
  bool stopping = sl__srv_jobs_stopping(&s->jobs);
  return sl__srv_send_json(
      c, stopping ? 503 : 200,
      json_pack("{s:s}", "status", stopping ? "shutting_down" : "ok"), false,
      0);
}

static enum MHD_Result send_metrics(sl_server_t *s, struct MHD_Connection *c,
                                    sl_srv_conn *cn) {
  (void)cn;
  sl_sbuf b = {0};
  sl__srv_metrics_text(s, &b);
  enum MHD_Result r =
      b.oom ? MHD_NO
            : sl__srv_send_bytes(c, 200, "text/plain; version=0.0.4", b.p,
                                 b.len, false, 0);
  sl__sbuf_free(&b);
  return r;
}

static enum MHD_Result send_page(sl_server_t *s, struct MHD_Connection *c,
                                 sl_srv_conn *cn) {
  (void)s, (void)cn;
  return sl__srv_send_page(c);
}

/* A generation route: refused while stopping, parked while its model
 * loads, else generated (generate.c). */
static enum MHD_Result generate_route(sl_server_t *s, struct MHD_Connection *c,
                                      sl_srv_conn *cn) {
  if (sl__srv_jobs_stopping(&s->jobs)) {
    sl_srv_error err;
    sl__srv_error_set(&err, 503, "shutting_down", NULL,
                      "the server is shutting down");
    return sl__srv_send_error(c, cn->fam, &err, true);
  }
  if (sl__srv_park_for_load(s, c, cn))
    return MHD_YES;
  return sl__srv_generate(s, c, cn);
}

static const sl_srv_route routes[] = {
    {"/health", GET | OPEN, .send = send_health},
    {"/v1/models", GET, .get = sl__srv_models_json},
    {"/v1/models/", GET | PREFIX, .sub = sl__srv_model_json}, /* {id} */
    {"/metrics", GET, .send = send_metrics},
    {"/admin/api/stats", GET, .get = sl__srv_stats_json},
    {"/v1/chat/completions", POST, .send = generate_route, .api = SL_SRV_CHAT},
    {"/v1/completions", POST, .send = generate_route,
     .api = SL_SRV_COMPLETIONS},
    {"/v1/messages", POST, .send = generate_route, .api = SL_SRV_MESSAGES},
    {"/v1/messages/count_tokens", POST, .body = sl__srv_count_tokens},
    {"/v1/embeddings", POST, .send = generate_route, .api = SL_SRV_EMBEDDINGS},
    {"/tokenize", POST, .body = sl__srv_tokenize},
    {"/detokenize", POST, .body = sl__srv_detokenize},
    {"/apply-template", POST, .body = sl__srv_apply_template},
    {"/admin", GET | OPEN, .send = send_page},
    {"/admin/", GET | OPEN, .send = send_page},
    {"/admin/api/clear-cache", POST, .act = sl__srv_admin_clear},
    {"/admin/api/models/", POST | PREFIX, /* {id}/{action} */
     .sub = sl__srv_admin_model},
};

/* The route of url (NULL: none); *allowed whether method may use it. */
static const sl_srv_route *route_of(const char *url, const char *method,
                                    bool *allowed) {
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
    const sl_srv_route *r = &routes[i];
    size_t pl = strlen(r->path);
    bool hit = r->how & PREFIX ? strncmp(url, r->path, pl) == 0 && url[pl]
                               : strcmp(url, r->path) == 0;
    if (!hit)
      continue;
    *allowed = r->how & POST
                   ? strcmp(method, "POST") == 0
                   : strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    return r;
  }
  return NULL;
}

/* The methods of a route, as Allow and a preflight list them. */
static const char *methods_of(const sl_srv_route *r) {
  return r->how & POST ? "POST, OPTIONS" : "GET, HEAD, OPTIONS";
}

static enum MHD_Result answer_body_route(sl_server_t *s,
                                         struct MHD_Connection *c,
                                         sl_srv_conn *cn, body_route fn) {
  json_t *out = NULL;
  sl_srv_error err;
  memset(&err, 0, sizeof err);
  if (fn(s, cn->body.p ? cn->body.p : "", cn->body.len, &out, &err) != SL_OK) {
    if (!err.http)
      sl__srv_error_set(&err, 500, NULL, NULL, "internal error");
    return sl__srv_send_error(c, cn->fam, &err, false);
  }
  return sl__srv_send_json(c, 200, out, false, 0);
}

/* A whole request on its route: the handler the table names. */
static enum MHD_Result answer_route(sl_server_t *s, struct MHD_Connection *c,
                                    sl_srv_conn *cn, const char *url) {
  const sl_srv_route *r = cn->route;
  if (r->send)
    return r->send(s, c, cn);
  if (r->body)
    return answer_body_route(s, c, cn, r->body);
  if (r->get)
    return sl__srv_send_json(c, 200, r->get(s), false, 0);
  sl_srv_error err;
  memset(&err, 0, sizeof err);
  json_t *m = r->act ? r->act(s, &err) : r->sub(s, url + strlen(r->path), &err);
  if (m)
    return sl__srv_send_json(c, 200, m, false, 0);
  if (!err.http)
    sl__srv_error_set(&err, 500, NULL, NULL, "internal error");
  return sl__srv_send_error(c, cn->fam, &err, false);
}

static enum MHD_Result on_access_req(sl_server_t *s, sl_srv_conn *cn,
                                     struct MHD_Connection *c, const char *url,
                                     const char *upload_data,
                                     size_t *upload_data_size);

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c,
                                 const char *url, const char *method,
                                 const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls) {
  sl_server_t *s = cls;
  sl_srv_conn *cn = *con_cls;
  sl_srv_error err;
  enum MHD_Result ret;
  if (cn) {
    sl__srv_reply_scope(&cn->hdrs, cn->fam == SL_SRV_FAMILY_ANTHROPIC);
    ret = on_access_req(s, cn, c, url, upload_data, upload_data_size);
    sl__srv_reply_scope(NULL, false);
    return ret;
  }
  if (!(cn = sl_calloc(1, sizeof *cn)))
    return MHD_NO;
  *con_cls = cn;
  pthread_mutex_lock(&s->m.mu);
  s->m.http_requests++;
  pthread_mutex_unlock(&s->m.mu);
  bool allowed = false;
  cn->route = route_of(url, method, &allowed);
  bool preflight = cn->route && strcmp(method, "OPTIONS") == 0;
  bool bad_method = cn->route && !allowed && !preflight;
  if (cn->route)
    cn->api = cn->route->api;
  cn->fam = sl__srv_anthropic_target(url, strlen(url)) ? SL_SRV_FAMILY_ANTHROPIC
                                                       : SL_SRV_FAMILY_OPENAI;
  request_id(c, cn->hdrs.rid, sizeof cn->hdrs.rid);
  cors_origin(s, c, cn->hdrs.acao, sizeof cn->hdrs.acao);
  cn->http10 = version && strcmp(version, MHD_HTTP_VERSION_1_0) == 0;
  sl__srv_reply_scope(&cn->hdrs, cn->fam == SL_SRV_FAMILY_ANTHROPIC);
  ret = MHD_YES;
  int refused = 0;
  if (framing_bad(c, version, &err)) {
    cn->responded = true;
    sl__srv_metrics_failed(s, NULL, err.http);
    ret = sl__srv_send_error(c, cn->fam, &err, true);
  } else if ((refused = sender_refused(
                  s, c, cn->route && cn->route->how & POST && allowed, &err))) {
    cn->responded = true;
    sl__srv_metrics_refused(s, refused);
    ret = sl__srv_send_error(c, cn->fam, &err, true);
  } else if (preflight) {
    cn->responded = true;
    cn->hdrs.allow = methods_of(cn->route);
    ret = sl__srv_send_preflight(c);
  } else if (!(cn->route && cn->route->how & OPEN) && !authorized(s, c)) {
    sl__srv_error_set(&err, 401, "invalid_api_key", NULL,
                      "invalid or missing API key");
    cn->responded = true;
    ret = sl__srv_send_error(c, cn->fam, &err, true);
  } else if (!cn->route) {
    sl__srv_error_set(&err, 404, "not_found", NULL, "no route for %s %s",
                      method, url);
    cn->responded = true;
    ret = sl__srv_send_error(c, cn->fam, &err, true);
  } else if (bad_method) {
    sl__srv_error_set(&err, 405, "method_not_allowed", NULL,
                      "%s is not allowed on %s", method, url);
    cn->responded = true;
    cn->hdrs.allow = methods_of(cn->route);
    ret = sl__srv_send_error(c, cn->fam, &err, true);
  } else {
    const char *cl = MHD_lookup_connection_value(
        c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) {
      sl__srv_error_set(&err, 413, "request_too_large", NULL,
                        "the request body exceeds %zu bytes",
                        s->cfg.max_body_bytes);
      cn->responded = true;
      sl__srv_metrics_failed(s, NULL, err.http);
      ret = sl__srv_send_error(c, cn->fam, &err, true);
    }
  }
  sl__srv_reply_scope(NULL, false);
  return ret;
}

/* The calls after the first: the body's bytes, then its end, then (for a
 * submitted request) each resume. */
static enum MHD_Result on_access_req(sl_server_t *s, sl_srv_conn *cn,
                                     struct MHD_Connection *c, const char *url,
                                     const char *upload_data,
                                     size_t *upload_data_size) {
  sl_srv_error err;
  if (*upload_data_size) {
    if (!cn->too_large &&
        cn->body.len + *upload_data_size > s->cfg.max_body_bytes) {
      cn->too_large = true; /* count, keep draining, answer at the end */
      sl__sbuf_free(&cn->body);
    }
    if (!cn->too_large && !cn->responded)
      sl__sbuf_add(&cn->body, upload_data, *upload_data_size);
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (cn->waiting) /* resumed: the engine has news */
    return sl__srv_generate_next(s, c, cn);
  if (cn->load_wait) { /* resumed: the model's load ended */
    cn->load_wait = false;
    if (sl__srv_jobs_stopping(&s->jobs))
      sl__srv_error_set(&cn->load_err, 503, "shutting_down", NULL,
                        "the server is shutting down");
    if (cn->load_err.http) {
      sl__srv_metrics_failed(s, NULL, cn->load_err.http);
      return sl__srv_send_error(c, cn->fam, &cn->load_err, false);
    }
    return sl__srv_generate(s, c, cn);
  }
  sl__srv_watch_read(s->watch, sock_of(c)); /* the whole request is in */
  if (cn->responded)
    return MHD_YES;
  cn->responded = true;
  if (cn->too_large) {
    sl__srv_error_set(&err, 413, "request_too_large", NULL,
                      "the request body exceeds %zu bytes",
                      s->cfg.max_body_bytes);
    sl__srv_metrics_failed(s, NULL, err.http);
    return sl__srv_send_error(c, cn->fam, &err, true);
  }
  if (cn->body.oom) {
    sl__srv_error_set(&err, 500, NULL, NULL, "out of memory");
    return sl__srv_send_error(c, cn->fam, &err, true);
  }
  return answer_route(s, c, cn, url);
}

/* MHD's pool thread that takes the connection (started) and the one that
 * closes it (closed, before the socket is closed). */
static void on_connection(void *cls, struct MHD_Connection *c,
                          void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  sl_server_t *s = cls;
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  int fd = ci ? ci->connect_fd : -1;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    *socket_context =
        sl__srv_watch_add(s->watch, fd, sl__srv_door_first_byte(s->door, fd));
  } else {
    sl__srv_watch_remove(s->watch, *socket_context);
    *socket_context = NULL;
    sl__srv_door_release(s->door, fd);
  }
}

/* Called by MHD once a request line is parsed, before its headers. Its
 * result becomes the request's con_cls: NULL, as on_access expects. */
static void *on_request_line(void *cls, const char *uri,
                             struct MHD_Connection *c) {
  sl_server_t *s = cls;
  (void)uri;
  sl__srv_watch_request(s->watch, sock_of(c));
  return NULL;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  sl_srv_conn *cn = *con_cls;
  sl__srv_watch_idle(((sl_server_t *)cls)->watch, sock_of(c));
  if (!cn)
    return;
  /* an embeddings answer of many vectors was built as as many small JSON
   * values (~11 MB for 400 x 576 floats): its pages go back below too */
  bool large = cn->job && cn->job->emb &&
               (size_t)cn->job->n_parts * (size_t)cn->job->n_embd >= 1u << 16;
  if (cn->job) {
    sl_server_t *s = cls;
    pthread_mutex_lock(&cn->job->mu);
    sl__srv_unparked(cn->job); /* closed while parked: at a daemon stop */
    cn->job->conn = NULL;
    if (cn->job->watched) {
      cn->job->watched = false;
      sl__srv_watch_hangup(s->watch, cn->job->fd, false);
    }
    pthread_mutex_unlock(&cn->job->mu);
    /* libmicrohttpd read the EOF of a client that shut only its sending
     * side: the answer goes out on a dup of the socket (detach.c), which
     * takes the job's reference and its open response */
    bool detached = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK &&
                    sl__srv_detach(s, cn, cn->job->fd);
    /* a client that vanished, a timeout, a shutdown: stop generating */
    if (!detached && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
      sl__srv_job_stop(cn->job);
    if (!detached)
      sl__srv_job_unref(cn->job);
    if (cn->open && !detached)
      sl__srv_jobs_closed(&s->jobs);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT,
                              (unsigned)s->cfg.http_timeout_s);
  }
  /* a large body's parse left ~30 MB of small blocks in this pool
   * thread's malloc arena: give the free pages back (test_server_limits) */
  large = large || cn->body.cap >= (1u << 20);
  sl__sbuf_free(&cn->body);
  sl_free(cn);
  *con_cls = NULL;
  if (large)
    malloc_trim(0);
}

/* The watch's tick: parked jobs whose client hung up (reply.c), and the
 * answers of clients that half-closed (detach.c). */
static void watch_tick(void *arg) {
  sl__srv_reap_parked(arg);
  sl__srv_detached_pump(arg);
}

/* ---- lifecycle
 * ------------------------------------------------------------------ */

/* The door's hand-off: libmicrohttpd takes the socket (and closes it on
 * failure). */
static bool hand_connection(void *arg, int fd, const struct sockaddr *a,
                            unsigned alen) {
  sl_server_t *s = arg;
  return MHD_add_connection(s->mhd, fd, a, (socklen_t)alen) == MHD_YES;
}

sl_server_config sl_server_config_defaults(void) {
  return (sl_server_config){.host = "127.0.0.1",
                            .port = 8080,
                            .max_body_bytes = 8u << 20,
                            .http_timeout_s = 30,
                            .max_conns = 4096,
                            .max_conns_per_ip = 256,
                            .http_threads = 4,
                            .head_timeout_ms = 10000,
                            .request_timeout_ms = 60000,
                            .grace_ms = 10000,
                            .max_tokens_default = 4096};
}

static char *dup_or_null(const char *s) {
  return s && s[0] ? sl_strdup(s) : NULL;
}

sl_status sl_server_start(sl_pool_t *pool, const sl_server_config *cfg,
                          sl_server_t **out, char *err, size_t errcap) {
  *out = NULL;
  if (!pool || sl_pool_count(pool) < 1 || !cfg || cfg->port < 0 ||
      cfg->port > 65535) {
    snprintf(err, errcap, "bad server configuration");
    return SL_ERR_INVALID_ARG;
  }
  sl__srv_json_init();
  sl__srv_malloc_init();
  sl_status st = SL_ERR_NOMEM;
  sl_server_t *s = sl_calloc(1, sizeof *s);
  if (!s)
    goto fail_nomem;
  s->pool = pool;
  s->cfg = *cfg;
  if (!s->cfg.max_body_bytes)
    s->cfg.max_body_bytes = 8u << 20;
  if (!s->cfg.http_timeout_s)
    s->cfg.http_timeout_s = 30;
  if (!s->cfg.max_conns)
    s->cfg.max_conns = 4096;
  if (!s->cfg.http_threads)
    s->cfg.http_threads = 4;
  if (!s->cfg.head_timeout_ms)
    s->cfg.head_timeout_ms = 10000;
  if (!s->cfg.request_timeout_ms)
    s->cfg.request_timeout_ms = 60000;
  s->host = sl_strdup(cfg->host ? cfg->host : "127.0.0.1");
  s->api_key = dup_or_null(cfg->api_key);
  s->cors = dup_or_null(cfg->cors_origin);
  s->allowed_hosts = dup_or_null(cfg->allowed_hosts);
  if (!s->host || (cfg->api_key && cfg->api_key[0] && !s->api_key) ||
      (cfg->cors_origin && cfg->cors_origin[0] && !s->cors) ||
      (cfg->allowed_hosts && cfg->allowed_hosts[0] && !s->allowed_hosts))
    goto fail_strings;
  s->cfg.cors_origin = s->cors;
  s->cfg.allowed_hosts = s->allowed_hosts;
  char bad[128];
  st = sl__srv_cidr_list(cfg->trusted_proxies, &s->trusted, &s->n_trusted, bad,
                         sizeof bad);
  s->cfg.trusted_proxies = NULL;
  if (st == SL_ERR_NOMEM)
    goto fail_strings;
  if (st != SL_OK) {
    snprintf(err, errcap,
             "--trusted-proxy '%s' is not an IPv4 or IPv6 address or an "
             "ADDR/N range",
             bad);
    goto fail_strings;
  }
  st = SL_ERR_NOMEM; /* what a failure below without its own words is */
  s->cfg.tool_call_format = NULL;
  if (cfg->tool_call_format && cfg->tool_call_format[0] &&
      !sl__srv_toolfmt_parse(cfg->tool_call_format, &s->toolfmt)) {
    snprintf(err, errcap,
             "unknown tool-call format '%s' (hermes, llama3, mistral, generic)",
             cfg->tool_call_format);
    st = SL_ERR_INVALID_ARG;
    goto fail_strings;
  }
  s->cfg.reasoning_format = NULL;
  s->rfmt = SL_RFMT_AUTO;
  if (cfg->reasoning_format && cfg->reasoning_format[0] &&
      !sl__srv_rfmt_parse(cfg->reasoning_format, &s->rfmt)) {
    snprintf(err, errcap,
             "unknown reasoning format '%s' (none, auto, deepseek)",
             cfg->reasoning_format);
    st = SL_ERR_INVALID_ARG;
    goto fail_strings;
  }
  s->cfg.host = s->host;
  s->cfg.api_key = s->api_key;
  pthread_mutex_init(&s->load_mu, NULL);
  pthread_mutex_init(&s->det_mu, NULL);
  sl__srv_metrics_init(&s->m);
  sl__srv_jobs_init(&s->jobs, sl__srv_metrics_job, &s->m, sl__srv_reply_wake);
  s->t_start_ns = sl_now_ns();
  s->started_at = (long long)time(NULL);

  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  struct addrinfo *ai = NULL;
  char port[16];
  snprintf(port, sizeof port, "%d", cfg->port);
  int gai = getaddrinfo(s->host, port, &hints, &ai);
  if (gai != 0 || !ai) {
    snprintf(err, errcap, "cannot resolve host '%s': %s", s->host,
             gai_strerror(gai));
    st = SL_ERR_INVALID_ARG;
    goto fail_sync;
  }
  if (!(s->watch =
            sl__srv_watch_start(SL_SRV_LINE_DEADLINE_MS,
                                s->cfg.request_timeout_ms, watch_tick, s))) {
    freeaddrinfo(ai);
    goto fail_sync; /* out of memory or threads */
  }
  /* no listening socket of its own: the door hands connections in; poll,
   * not epoll (see the top of this file); TURBO: a close without
   * shutdown(), so that a dup of the socket outlives it (detach.c) */
  unsigned flags = MHD_USE_TURBO | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC |
                   MHD_ALLOW_SUSPEND_RESUME | MHD_USE_NO_LISTEN_SOCKET;
  if (ai->ai_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  s->mhd = MHD_start_daemon(
      flags, 0, NULL, NULL, on_access, s, MHD_OPTION_NOTIFY_COMPLETED,
      on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
      MHD_OPTION_URI_LOG_CALLBACK, on_request_line, s,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.http_timeout_s,
      MHD_OPTION_THREAD_POOL_SIZE, s->cfg.http_threads,
      /* the door enforces the limits; each pool thread may hold them all */
      MHD_OPTION_CONNECTION_LIMIT, s->cfg.max_conns * s->cfg.http_threads,
      MHD_OPTION_END);
  if (!s->mhd) {
    freeaddrinfo(ai);
    snprintf(err, errcap, "cannot start the HTTP server: %s", strerror(errno));
    st = SL_ERR_IO;
    goto fail_watch;
  }
  sl_srv_door_cfg dc = {.addr = ai->ai_addr,
                        .addrlen = (unsigned)ai->ai_addrlen,
                        .max_conns = s->cfg.max_conns,
                        .max_per_ip = s->cfg.max_conns_per_ip,
                        .idle_ms = s->cfg.http_timeout_s * 1000u,
                        .line_ms = SL_SRV_LINE_DEADLINE_MS,
                        .head_ms = s->cfg.head_timeout_ms,
                        .max_body = s->cfg.max_body_bytes,
                        .trusted = s->trusted,
                        .n_trusted = s->n_trusted,
                        .hand = hand_connection,
                        .arg = s,
                        .publish = &s->door};
  char derr[160];
  sl_srv_door *door = sl__srv_door_start(&dc, &s->port, derr, sizeof derr);
  freeaddrinfo(ai);
  if (!door) {
    snprintf(err, errcap, "cannot listen on %s:%d: %s", s->host, cfg->port,
             derr);
    st = SL_ERR_IO;
    goto fail_mhd;
  }
  *out = s;
  return SL_OK;

fail_mhd:
  MHD_stop_daemon(s->mhd);
fail_watch:
  sl__srv_watch_stop(s->watch);
fail_sync:
  sl__srv_jobs_destroy(&s->jobs);
  sl__srv_metrics_destroy(&s->m);
  pthread_mutex_destroy(&s->load_mu);
  pthread_mutex_destroy(&s->det_mu);
fail_strings:
  sl_free(s->host);
  sl_free(s->api_key);
  sl_free(s->cors);
  sl_free(s->allowed_hosts);
  sl_free(s->trusted);
  sl_free(s);
  if (st != SL_ERR_NOMEM)
    return st; /* err already says why */
fail_nomem:
  snprintf(err, errcap, "out of memory");
  return SL_ERR_NOMEM;
}

int sl_server_port(const sl_server_t *s) {
  return s->port;
}

/* The wait is for every live job and every generation response not yet
 * handed to its client (MHD's completion callback ran): a job leaves the
 * engine before its response is written, so waiting on jobs alone would
 * let MHD_stop_daemon cut a finished answer off mid-send. libmicrohttpd
 * cannot stop with a connection suspended: sl__srv_unpark_all resumes
 * them first. */
void sl_server_stop(sl_server_t *s) {
  if (!s)
    return;
  sl__srv_jobs_stop(&s->jobs);
  sl__srv_door_close(s->door); /* no new connection from here on */
  /* requests still queued get their 503 now, so that their clients retry
   * elsewhere; the grace period is for the ones already generating */
  sl__srv_jobs_cut(&s->jobs, true);
  if (sl__srv_jobs_wait(&s->jobs, s->cfg.grace_ms) > 0) {
    /* cut what is left: each ends as a 503 or a stream's error event */
    for (;;) {
      int n = sl__srv_jobs_cut(&s->jobs, false);
      if (sl__srv_jobs_wait(&s->jobs, 2000) == 0 || n == 0)
        break;
    }
    /* the cut answers are still being written: let them go out */
    sl__srv_jobs_wait(&s->jobs, 2000);
  }
  sl__srv_unpark_all(s);
  MHD_stop_daemon(s->mhd);
  sl__srv_watch_stop(s->watch);
  sl__srv_detached_free(s);
  sl__srv_door_free(s->door);
  sl__srv_jobs_destroy(&s->jobs);
  sl__srv_metrics_destroy(&s->m);
  pthread_mutex_destroy(&s->load_mu);
  pthread_mutex_destroy(&s->det_mu);
  sl_free(s->host);
  sl_free(s->api_key);
  sl_free(s->cors);
  sl_free(s->allowed_hosts);
  sl_free(s->trusted);
  sl_free(s);
}
