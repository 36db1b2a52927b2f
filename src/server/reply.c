/* sluice — server: the replies (reply.h). A pool thread never waits for
 * the engine: it parks the connection (MHD_suspend_connection), the job's
 * notify hook (sl__srv_reply_wake, on the executor) resumes it, and the
 * pool thread that resumes it sends the answer (non-streaming) or the SSE
 * bytes so far (streaming; the content reader parks again when it has
 * nothing to send). A parked connection is not polled by libmicrohttpd:
 * the watch's tick (sl__srv_reap_parked) notices a client that hung up
 * meanwhile and aborts its job. */
#define _GNU_SOURCE
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "server/anthropic.h"
#include "server/job.h"
#include "server/json.h"
#include "server/openai.h"
#include "server/reply.h"
#include "server/sockwatch.h"
#include "server/state.h"
#include "sluice/reason.h"
#include "sluice/util.h"

/* The request a pool thread is answering (set around on_access): every
 * response it queues carries that request's id and CORS headers. */
static _Thread_local const sl_srv_hdrs *tl_hdrs;
static _Thread_local bool tl_anthropic;

void sl__srv_reply_scope(const sl_srv_hdrs *h, bool anthropic) {
  tl_hdrs = h;
  tl_anthropic = h && anthropic;
}

void sl__srv_std_headers(const sl_srv_hdrs *h, bool anthropic,
                         void (*add)(void *arg, const char *name,
                                     const char *value),
                         void *arg) {
  if (h->rid[0]) {
    add(arg, "x-request-id", h->rid);
    if (anthropic) /* the Anthropic SDK reads this one */
      add(arg, "request-id", h->rid);
  }
  if (h->allow)
    add(arg, "Allow", h->allow);
  if (h->acao[0]) {
    add(arg, "Access-Control-Allow-Origin", h->acao);
    add(arg, "Access-Control-Expose-Headers",
        "x-request-id, request-id, retry-after");
    if (strcmp(h->acao, "*") != 0)
      add(arg, "Vary", "Origin");
  }
}

static void add_to_response(void *arg, const char *name, const char *value) {
  MHD_add_response_header(arg, name, value);
}

static void add_std_headers(struct MHD_Response *r) {
  if (tl_hdrs)
    sl__srv_std_headers(tl_hdrs, tl_anthropic, add_to_response, r);
}

/* ---- answers ---------------------------------------------------------------
 */

enum MHD_Result sl__srv_send_bytes(struct MHD_Connection *c, unsigned status,
                                   const char *ctype, const char *data,
                                   size_t len, bool close,
                                   unsigned retry_after_s) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
  if (!r)
    return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
  add_std_headers(r);
  if (close)
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
  if (retry_after_s) {
    char v[16];
    snprintf(v, sizeof v, "%u", retry_after_s);
    MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, v);
  }
  enum MHD_Result ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

enum MHD_Result sl__srv_send_json(struct MHD_Connection *c, unsigned status,
                                  json_t *j, bool close,
                                  unsigned retry_after_s) {
  sl_sbuf b = {0};
  sl__sbuf_add_json(&b, j);
  json_decref(j);
  enum MHD_Result ret;
  if (b.oom)
    ret = sl__srv_send_bytes(c, 500, "text/plain", "out of memory\n", 14, true,
                             0);
  else
    ret = sl__srv_send_bytes(c, status, "application/json", b.p, b.len, close,
                             retry_after_s);
  sl__sbuf_free(&b);
  return ret;
}

unsigned sl__srv_retry_after(const sl_srv_error *e) {
  if (e->http != 503)
    return 0;
  return strcmp(e->code, sl_reason_code(SL_REASON_QUEUE_TIMEOUT)) == 0 ? 5 : 1;
}

enum MHD_Result sl__srv_send_error(struct MHD_Connection *c, sl_srv_family fam,
                                   const sl_srv_error *e, bool close) {
  return sl__srv_send_json(c, (unsigned)e->http, sl__srv_error_json(fam, e),
                           close, sl__srv_retry_after(e));
}

/* No key is needed (a browser sends none there). The origin is allowed
 * only when add_std_headers adds Access-Control-Allow-Origin. */
enum MHD_Result sl__srv_send_preflight(struct MHD_Connection *c) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
  if (!r)
    return MHD_NO;
  const char *want = MHD_lookup_connection_value(
      c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
  bool ok = want && strlen(want) <= 1024;
  for (const char *p = want; ok && *p; p++)
    ok = *p == ',' || *p == ' ' || *p == '-' || *p == '_' ||
         (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
         (*p >= '0' && *p <= '9');
  if (tl_hdrs && tl_hdrs->allow)
    MHD_add_response_header(r, "Access-Control-Allow-Methods", tl_hdrs->allow);
  MHD_add_response_header(
      r, "Access-Control-Allow-Headers",
      ok ? want
         : "authorization, content-type, x-api-key, anthropic-version, "
           "anthropic-beta, x-request-id");
  MHD_add_response_header(r, "Access-Control-Max-Age", "600");
  add_std_headers(r);
  enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
  MHD_destroy_response(r);
  return ret;
}

/* The dashboard (src/server/dashboard/index.html, built in by
 * tools/embed_file.cmake). It holds no data: what it shows comes from the
 * routes behind the key. Its scripts and styles are inline; the policy
 * lets it reach this server only. */
extern const unsigned char sl__srv_dashboard_html[];
extern const size_t sl__srv_dashboard_html_len;

enum MHD_Result sl__srv_send_page(struct MHD_Connection *c) {
  struct MHD_Response *r = MHD_create_response_from_buffer(
      sl__srv_dashboard_html_len, (void *)sl__srv_dashboard_html,
      MHD_RESPMEM_PERSISTENT);
  if (!r)
    return MHD_NO;
  add_std_headers(r);
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                          "text/html; charset=utf-8");
  MHD_add_response_header(r, "Content-Security-Policy",
                          "default-src 'self'; script-src 'self' "
                          "'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
                          "img-src 'self' data:; frame-ancestors 'none'");
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

/* ---- parking ---------------------------------------------------------------
 */

void sl__srv_reply_wake(sl_srv_job *j) {
  if (j->detached) /* its answer is written by the watch's thread */
    sl__srv_watch_poke(j->srv->watch);
  if (j->parked && !j->resumed && j->conn) {
    j->resumed = true;
    MHD_resume_connection(j->conn);
  }
}

void sl__srv_park(sl_srv_job *j) {
  if (!j->watched) {
    j->watched = true;
    sl__srv_watch_hangup(j->srv->watch, j->fd, true);
  }
  j->parked = true;
  j->resumed = false;
  atomic_fetch_add(&j->srv->n_parked, 1);
  MHD_suspend_connection(j->conn);
}

void sl__srv_unparked(sl_srv_job *j) {
  if (!j->parked)
    return;
  j->parked = j->resumed = false;
  atomic_fetch_sub(&j->srv->n_parked, 1);
}

int sl__srv_peer_state(int fd) {
  if (fd < 0)
    return SL_SRV_PEER_OPEN;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  if (poll(&p, 1, 0) <= 0)
    return SL_SRV_PEER_OPEN;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL))
    return SL_SRV_PEER_GONE;
  return (p.revents & POLLRDHUP) ? SL_SRV_PEER_SHUT : SL_SRV_PEER_OPEN;
}

/* sl__srv_reap_parked's choice: a parked job, not yet aborted, whose
 * client is gone. A FIN alone does not say so: a client that shut only
 * its sending side (shutdown(SHUT_WR), after its whole request) still
 * reads, and one that closed its socket does not, and both send just a
 * FIN. While nothing of the answer was sent, a 100 Continue (which every
 * HTTP/1.1 client skips) asks the client's kernel: a closed socket
 * answers bytes with a reset, which the next look sees as gone. A
 * streamed answer's own writes ask the same; an HTTP/1.0 client, which
 * may not get a 1xx, is taken as gone at its FIN. */
static bool pick_gone(sl_srv_job *j, void *arg) {
  (void)arg;
  if (!j->parked || j->resumed || !j->conn || j->aborted)
    return false;
  int st = sl__srv_peer_state(j->fd);
  if (st == SL_SRV_PEER_OPEN)
    return false;
  if (st == SL_SRV_PEER_SHUT && !j->http10) {
    if (!j->await || j->probed)
      return false; /* the writes, or the probe, will show a reset */
    static const char probe[] = "HTTP/1.1 100 Continue\r\n\r\n";
    j->probed = true;
    if (send(j->fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT) ==
        (ssize_t)sizeof probe - 1)
      return false;
  }
  j->aborted = true;
  return true;
}

/* At once when a watched socket's client hangs up and every
 * SL_SRV_WATCH_TICK_MS: a parked connection is not polled by
 * libmicrohttpd, so a client that hangs up while its request waits in the
 * queue or between tokens is noticed here; its job is aborted, and the
 * abort's event resumes the connection, which then closes. */
void sl__srv_reap_parked(void *arg) {
  sl_server_t *s = arg;
  sl__srv_jobs_abort_where(&s->jobs, pick_gone, NULL);
}

void sl__srv_unpark_all(sl_server_t *s) {
  atomic_store(&s->closing, true);
  for (int round = 0; round < 200 && atomic_load(&s->n_parked) > 0; round++) {
    pthread_mutex_lock(&s->jobs.mu);
    for (sl_srv_job *j = s->jobs.head; j; j = j->next) {
      pthread_mutex_lock(&j->mu);
      sl__srv_reply_wake(j);
      pthread_mutex_unlock(&j->mu);
    }
    pthread_mutex_unlock(&s->jobs.mu);
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (atomic_load(&s->n_parked) > 0)
    SL_LOGW("server: %d connections still parked at the stop",
            atomic_load(&s->n_parked));
  /* connections waiting for a load come back when it ends (a load is
   * bounded); libmicrohttpd cannot stop with them suspended */
  for (int round = 0; atomic_load(&s->n_load_parked) > 0; round++) {
    if (round == 500)
      SL_LOGW("server: %d requests wait for a model's load at the stop",
              atomic_load(&s->n_load_parked));
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

/* ---- streaming -------------------------------------------------------------
 */

json_t *sl__srv_answer_body(sl_srv_job *j) {
  const sl_tokenizer_t *tok = sl__srv_job_lease(j)->tok;
  switch (j->req.api) {
  case SL_SRV_MESSAGES:
    return sl__ant_body(j, j->req.model, tok);
  case SL_SRV_EMBEDDINGS:
    return sl__srv_embed_body(j, j->req.model);
  default:
    return sl__oai_body(j, j->req.model, tok);
  }
}

int sl__srv_sse_next(sl_srv_job *j) {
  for (;;) {
    if (j->out_off < j->out.len)
      return SL_SRV_SSE_BYTES;
    if (j->out.oom)
      return SL_SRV_SSE_OOM;
    if (j->phase == 2)
      return SL_SRV_SSE_END;
    if (j->req.api == SL_SRV_MESSAGES)
      sl__ant_stream(j, j->req.model, sl__srv_job_lease(j)->tok);
    else
      sl__oai_stream(j, j->req.model, sl__srv_job_lease(j)->tok);
    if (j->out.len == 0 && j->phase != 2)
      return SL_SRV_SSE_WAIT;
  }
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  sl_srv_job *j = cls;
  sl_server_t *s = j->srv;
  (void)pos;
  pthread_mutex_lock(&j->mu);
  sl__srv_unparked(j);
  int r = sl__srv_sse_next(j);
  if (r == SL_SRV_SSE_BYTES) {
    size_t n = j->out.len - j->out_off;
    if (n > max)
      n = max;
    memcpy(buf, j->out.p + j->out_off, n);
    j->out_off += n;
    if (j->out_off == j->out.len)
      j->out_off = j->out.len = 0;
    pthread_mutex_unlock(&j->mu);
    return (ssize_t)n;
  }
  if (r == SL_SRV_SSE_END) {
    pthread_mutex_unlock(&j->mu);
    return MHD_CONTENT_READER_END_OF_STREAM;
  }
  if (r == SL_SRV_SSE_WAIT && !atomic_load(&s->closing) && j->conn) {
    /* nothing to send until the engine's next event, which resumes us */
    sl__srv_park(j);
    pthread_mutex_unlock(&j->mu);
    return 0;
  }
  /* out of memory, or MHD is stopping: end the stream as failed */
  pthread_mutex_unlock(&j->mu);
  sl__srv_job_stop(j);
  return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void sse_free(void *cls) {
  sl__srv_job_unref(cls);
}

enum MHD_Result sl__srv_send_stream(struct MHD_Connection *c, sl_srv_job *j) {
  sl__srv_job_ref(j); /* the response's */
  struct MHD_Response *r = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, 16 * 1024, sse_reader, j, sse_free);
  if (!r) {
    sl__srv_job_unref(j);
    sl__srv_job_stop(j);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  add_std_headers(r);
  enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}
