/* sluice — server: libmicrohttpd plumbing, routing, authentication, the
 * generation request's lifecycle, SSE streaming, shutdown.
 *
 * Threads: the front door (door.c) accepts and hands each connection whose
 * first request head is whole to libmicrohttpd, which runs a poll loop on
 * each thread of a small pool: no thread waits for a client. (Its epoll
 * mode, in 0.9.75, lost connections whose client had half-closed after
 * its request: 29 of 200 such requests hung in CLOSE-WAIT, never
 * answered; poll lost none.) A pool thread
 * parses the body, tokenizes and submits to the engine, then parks the
 * connection (MHD_suspend_connection) rather than waiting: the engine's
 * executor fills the job through on_event, which takes the job's mutex for
 * a copy and resumes the parked connection, and the pool thread that
 * resumes it sends the answer (non-streaming) or the SSE bytes so far
 * (streaming; the content reader parks again when it has nothing to send).
 * A parked connection is not polled by libmicrohttpd: the watch's tick
 * (reap_parked) notices a client that hung up meanwhile and aborts its job.
 *
 * Job lifetime: a job is reference counted. The connection holds one
 * reference (dropped in the request-completed callback), the engine one from
 * submit until SL_EV_DONE, and a streaming response one until MHD frees it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/server_impl.h"
#include "sluice/util.h"

enum route {
  ROUTE_NONE = 0,
  ROUTE_HEALTH,
  ROUTE_MODELS,
  ROUTE_METRICS,
  ROUTE_STATS,
  ROUTE_CHAT,
  ROUTE_COMPLETIONS,
  ROUTE_MESSAGES,
  ROUTE_MODEL,          /* GET /v1/models/{id} */
  ROUTE_ADMIN_MODEL,    /* POST /admin/api/models/{id}/{action} */
  ROUTE_ADMIN_CLEAR,    /* POST /admin/api/clear-cache */
  ROUTE_ADMIN_PAGE,     /* GET /admin: the dashboard (no data, no key) */
  ROUTE_COUNT_TOKENS,   /* POST /v1/messages/count_tokens */
  ROUTE_TOKENIZE,       /* POST /tokenize */
  ROUTE_DETOKENIZE,     /* POST /detokenize */
  ROUTE_APPLY_TEMPLATE, /* POST /apply-template */
  ROUTE_EMBEDDINGS,     /* POST /v1/embeddings */
};

/* Per-request state of one connection (MHD's con_cls). */
typedef struct conn {
  enum route route;
  sl_srv_family fam;
  bool responded; /* an early response (401, 413) was queued */
  bool too_large;
  sl_sbuf body;
  sl_srv_job *job;
  bool open;    /* counted in the server's n_open until on_completed */
  bool waiting; /* submitted; the answer is not yet queued */
  /* parked while the model it names loads; resumed with load_err.http 0
   * (loaded) or the load's error */
  bool load_wait;
  sl_srv_error load_err;
  char rid[136];  /* x-request-id: the client's, or made here */
  char acao[264]; /* Access-Control-Allow-Origin ("" : none) */
} conn;

/* The request a pool thread is answering (set around on_access): every
 * response it queues carries that request's id and CORS headers. */
static _Thread_local conn *tl_conn;
static _Thread_local bool tl_anthropic;

static void add_std_headers(struct MHD_Response *r) {
  conn *cn = tl_conn;
  if (!cn)
    return;
  if (cn->rid[0]) {
    MHD_add_response_header(r, "x-request-id", cn->rid);
    if (tl_anthropic) /* the Anthropic SDK reads this one */
      MHD_add_response_header(r, "request-id", cn->rid);
  }
  if (cn->acao[0]) {
    MHD_add_response_header(r, "Access-Control-Allow-Origin", cn->acao);
    MHD_add_response_header(r, "Access-Control-Expose-Headers",
                            "x-request-id, request-id, retry-after");
    if (strcmp(cn->acao, "*") != 0)
      MHD_add_response_header(r, "Vary", "Origin");
  }
}

/* ---- jobs -------------------------------------------------------------------
 */

/* A job's own buffers (a child's too: its req is its parent's). */
static void job_buffers_free(sl_srv_job *j) {
  sl_free(j->text);
  sl_free(j->toks);
  sl__srv_toolcalls_free(&j->calls);
  sl__sbuf_free(&j->out);
  pthread_cond_destroy(&j->cv);
  pthread_mutex_destroy(&j->mu);
}

static void job_unref(sl_srv_job *j) {
  if (atomic_fetch_sub(&j->refs, 1) != 1)
    return;
  for (int i = 0; j->kids && i < j->n_parts; i++)
    job_buffers_free(&j->kids[i]);
  sl_free(j->kids);
  sl__srv_request_free(&j->req);
  sl__srv_model_release(&j->mdl); /* the engine no longer calls back */
  sl_free(j->ids);
  sl_free(j->text);
  sl_free(j->toks);
  sl__srv_toolcalls_free(&j->calls);
  sl_free(j->parts);
  sl_free(j->emb);
  sl__sbuf_free(&j->out);
  pthread_cond_destroy(&j->cv);
  pthread_mutex_destroy(&j->mu);
  sl_free(j);
}

/* The job's model (a child's is its parent's). */
static const sl_pool_lease *job_lease(const sl_srv_job *j) {
  return &(j->parent ? j->parent : j)->mdl.lease;
}

static void make_id(char *buf, size_t cap, const char *prefix) {
  static atomic_uint_fast64_t counter;
  uint64_t x = sl_now_ns() ^ ((uint64_t)getpid() << 32) ^
               (atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  snprintf(buf, cap, "%s%016llx", prefix, (unsigned long long)x);
}

static void server_job_remove(sl_server_t *s, sl_srv_job *j) {
  pthread_mutex_lock(&s->jobs_mu);
  if (j->prev)
    j->prev->next = j->next;
  else if (s->jobs == j)
    s->jobs = j->next;
  if (j->next)
    j->next->prev = j->prev;
  j->prev = j->next = NULL;
  s->n_jobs--;
  pthread_cond_broadcast(&s->jobs_cv);
  pthread_mutex_unlock(&s->jobs_mu);
}

/* Resumes the job's parked connection, once (j->mu held). */
static void wake(sl_srv_job *j) {
  if (j->parked && !j->resumed && j->conn) {
    j->resumed = true;
    MHD_resume_connection(j->conn);
  }
}

/* An event of choice k of parent p (n > 1; executor thread, no lock held):
 * p starts with its first choice's events and is done with the last
 * choice's end, its usage and error taken from the choices then. Each
 * choice holds a reference to p. */
static void kid_event(sl_srv_job *p, bool kid_done, bool kid_started) {
  pthread_mutex_lock(&p->mu);
  if (kid_started) /* (a choice refused before it started does not start
                      the stream: the request then fails with its status) */
    p->started = true;
  if (kid_done)
    p->parts_done++;
  bool all = kid_done && p->parts_done == p->n_parts;
  if (all) {
    p->done = true;
    p->t_done = sl_now_ns();
    p->finish = SL_FINISH_STOP;
    p->completion_tokens = p->n_toks = 0;
    for (int i = 0; i < p->n_parts; i++) {
      sl_srv_job *k = &p->kids[i];
      pthread_mutex_lock(&k->mu);
      if (i == 0) { /* the prompt once: what the first choice computed */
        p->prompt_tokens = k->prompt_tokens;
        p->cached_tokens = k->cached_tokens;
      }
      p->completion_tokens += k->completion_tokens;
      p->n_toks += k->n_toks;
      if (k->t_first && (!p->t_first || k->t_first < p->t_first))
        p->t_first = k->t_first;
      if (k->finish == SL_FINISH_ERROR && p->finish != SL_FINISH_ERROR) {
        p->finish = SL_FINISH_ERROR;
        p->error = k->error;
        p->reason = k->reason;
        memcpy(p->error_msg, k->error_msg, sizeof p->error_msg);
        p->est_bytes = k->est_bytes;
        p->limit_bytes = k->limit_bytes;
      }
      pthread_mutex_unlock(&k->mu);
    }
  }
  if (all || p->req.stream)
    wake(p);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (all) {
    sl__srv_metrics_job(p->srv, p, p->finish == SL_FINISH_ERROR);
    server_job_remove(p->srv, p);
  }
  if (kid_done)
    job_unref(p);
}

/* The engine's callback: executor thread, must not block. */
static void on_event(void *user, const sl_engine_event *ev) {
  sl_srv_job *j = user;
  pthread_mutex_lock(&j->mu);
  switch (ev->kind) {
  case SL_EV_STARTED:
    j->started = true;
    j->prompt_tokens = ev->prompt_tokens;
    j->cached_tokens = ev->cached_tokens;
    break;
  case SL_EV_TOKEN: {
    if (!j->t_first)
      j->t_first = sl_now_ns();
    if (j->oom)
      break;
    if (j->n_toks == j->toks_cap) {
      int cap = j->toks_cap ? j->toks_cap * 2 : 64;
      sl_srv_tok *nt = sl_realloc(j->toks, (size_t)cap * sizeof *nt);
      if (!nt) {
        j->oom = true;
        break;
      }
      j->toks = nt;
      j->toks_cap = cap;
    }
    if (j->text_len + ev->text_len + 1 > j->text_cap) {
      size_t cap = j->text_cap ? j->text_cap : 1024;
      while (cap < j->text_len + ev->text_len + 1)
        cap *= 2;
      char *nt = sl_realloc(j->text, cap);
      if (!nt) {
        j->oom = true;
        break;
      }
      j->text = nt;
      j->text_cap = cap;
    }
    sl_srv_tok *t = &j->toks[j->n_toks++];
    t->id = ev->token;
    t->logprob = ev->logprob;
    t->text_off = j->text_len;
    t->text_len = ev->text_len;
    if (ev->text_len)
      memcpy(j->text + j->text_len, ev->text, ev->text_len);
    j->text_len += ev->text_len;
    j->text[j->text_len] = 0;
    t->n_top = ev->top && ev->n_top > 0 ? ev->n_top : 0;
    if (t->n_top > SL_MAX_TOP_LOGPROBS)
      t->n_top = SL_MAX_TOP_LOGPROBS;
    if (t->n_top)
      memcpy(t->top, ev->top, (size_t)t->n_top * sizeof *t->top);
    break;
  }
  case SL_EV_DONE:
    j->done = true;
    j->t_done = sl_now_ns();
    j->finish = ev->finish;
    j->error = ev->error;
    if (ev->prompt_tokens)
      j->prompt_tokens = ev->prompt_tokens;
    if (ev->cached_tokens || !j->started)
      j->cached_tokens = ev->cached_tokens;
    j->completion_tokens = ev->completion_tokens;
    j->reason = ev->reason;
    snprintf(j->error_msg, sizeof j->error_msg, "%s",
             ev->error_msg ? ev->error_msg : "");
    j->est_bytes = ev->est_bytes;
    j->limit_bytes = ev->limit_bytes;
    if (j->oom && j->finish != SL_FINISH_ERROR) {
      j->finish = SL_FINISH_ERROR;
      j->error = SL_ERR_NOMEM;
      j->reason = SL_REASON_OUT_OF_MEMORY;
    }
    if (j->cut && j->finish == SL_FINISH_ABORT) {
      /* cut off by the shutdown: an error, never a complete answer */
      j->finish = SL_FINISH_ERROR;
      j->error = SL_ERR_CANCELLED;
      j->reason = SL_REASON_SHUTTING_DOWN;
      if (j->started)
        snprintf(j->error_msg, sizeof j->error_msg,
                 "the server is shutting down: the answer was cut off after "
                 "%d tokens; retry",
                 ev->completion_tokens);
      else
        snprintf(j->error_msg, sizeof j->error_msg,
                 "the server is shutting down: the request was not started; "
                 "retry");
    }
    break;
  }
  bool done = j->done;
  if (j->parent) { /* a choice of n: its parent answers */
    bool started = j->started || j->n_toks > 0;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    kid_event(j->parent, done, started);
    return;
  }
  /* a non-streamed answer has nothing to send before the end: its
   * connection stays parked (no pool-thread wake-up per token) */
  if (done || j->req.stream)
    wake(j);
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  if (done) {
    sl_server_t *s = j->srv;
    sl__srv_metrics_job(s, j, j->finish == SL_FINISH_ERROR);
    server_job_remove(s, j);
    job_unref(j);
  }
}

/* The engine's callback for one input of an embeddings job (executor
 * thread): its vector, or the job's error; the job is done with its last
 * input. Each input holds a reference to the job. */
static void on_embed_event(void *user, const sl_engine_event *ev) {
  sl_srv_emb_part *p = user;
  sl_srv_job *j = p->job;
  if (ev->kind != SL_EV_DONE)
    return;
  pthread_mutex_lock(&j->mu);
  if (ev->finish == SL_FINISH_STOP && ev->embedding &&
      ev->n_embd == j->n_embd) {
    memcpy(j->emb + (size_t)p->index * (size_t)j->n_embd, ev->embedding,
           sizeof(float) * (size_t)j->n_embd);
    j->prompt_tokens += ev->prompt_tokens;
  } else if (j->finish != SL_FINISH_ERROR) {
    j->finish = SL_FINISH_ERROR;
    j->error = ev->error != SL_OK ? ev->error : SL_ERR_CANCELLED;
    j->reason = j->cut ? SL_REASON_SHUTTING_DOWN : ev->reason;
    snprintf(j->error_msg, sizeof j->error_msg, "%s",
             j->cut || !ev->error_msg ? "" : ev->error_msg);
    j->est_bytes = ev->est_bytes;
    j->limit_bytes = ev->limit_bytes;
  }
  bool last = ++j->parts_done == j->n_parts;
  if (last) {
    j->done = true;
    j->t_done = sl_now_ns();
    if (j->finish != SL_FINISH_ERROR)
      j->finish = SL_FINISH_STOP;
    wake(j);
  }
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  if (last) {
    sl__srv_metrics_job(j->srv, j, j->finish == SL_FINISH_ERROR);
    server_job_remove(j->srv, j);
  }
  job_unref(j);
}

/* True when the client closed its side of the socket. */
static bool client_gone(int fd) {
  if (fd < 0)
    return false;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  if (poll(&p, 1, 0) <= 0)
    return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* The engine requests of a job (j->mu held): its one, or one per input of
 * an embeddings job; at most cap of them. */
static int job_ids(const sl_srv_job *j, uint64_t *out, int cap) {
  if (!j->parts)
    return cap > 0 ? (out[0] = j->engine_id, 1) : 0;
  int n = 0;
  for (int i = 0; i < j->n_parts && n < cap; i++)
    if (j->parts[i].engine_id)
      out[n++] = j->parts[i].engine_id;
  return n;
}

static void job_abort(sl_srv_job *j) {
  pthread_mutex_lock(&j->mu);
  bool go = j->submitted && !j->done && !j->aborted;
  j->aborted = true;
  int n = 0;
  uint64_t one, *ids = &one;
  if (go && j->parts && !(ids = sl_malloc(sizeof *ids * (size_t)j->n_parts)))
    go = false; /* out of memory: each input runs to its end */
  if (go)
    n = job_ids(j, ids, j->parts ? j->n_parts : 1);
  pthread_mutex_unlock(&j->mu);
  for (int i = 0; i < n; i++)
    if (sl_engine_abort(job_lease(j)->engine, ids[i]) != SL_OK)
      SL_LOGW("server: out of memory recording an abort; request %llu runs "
              "to its end",
              (unsigned long long)ids[i]);
  if (ids != &one)
    sl_free(ids);
}

/* Parks the job's connection until the engine's next event (j->mu held;
 * called from a handler of that connection, as libmicrohttpd requires). */
static void park(sl_srv_job *j) {
  if (!j->watched) {
    j->watched = true;
    sl__srv_watch_hangup(j->srv->watch, j->fd, true);
  }
  j->parked = true;
  j->resumed = false;
  atomic_fetch_add(&j->srv->n_parked, 1);
  MHD_suspend_connection(j->conn);
}

/* A handler of the job's connection runs again (j->mu held). */
static void unparked(sl_srv_job *j) {
  if (!j->parked)
    return;
  j->parked = j->resumed = false;
  atomic_fetch_sub(&j->srv->n_parked, 1);
}

/* The watch's tick, at once when a watched socket's client hangs up and
 * every SL_SRV_WATCH_TICK_MS: a parked connection is not polled by
 * libmicrohttpd, so a client that hangs up while its request waits in the
 * queue or between tokens is noticed here; its job is aborted, and the
 * abort's event resumes the connection, which then closes. */
static void reap_parked(void *arg) {
  sl_server_t *s = arg;
  uint64_t ids[64];
  sl_srv_job *owner[64]; /* each id's job, referenced until its abort */
  int n = 0;
  pthread_mutex_lock(&s->jobs_mu);
  for (sl_srv_job *j = s->jobs; j && n < 64; j = j->next) {
    pthread_mutex_lock(&j->mu);
    if (j->parked && !j->resumed && j->conn && j->submitted && !j->done &&
        !j->aborted && client_gone(j->fd)) {
      if (job_ids(j, ids + n, 64 - n) < (j->parts ? j->n_parts : 1) &&
          n > 0) { /* no room for all of its ids: the next tick */
        pthread_mutex_unlock(&j->mu);
        break;
      }
      j->aborted = true;
      int k = job_ids(j, ids + n, 64 - n);
      for (int i = 0; i < k; i++) {
        owner[n + i] = j;
        atomic_fetch_add(&j->refs, 1); /* its engine stays loaded */
      }
      n += k;
    }
    pthread_mutex_unlock(&j->mu);
  }
  pthread_mutex_unlock(&s->jobs_mu);
  for (int i = 0; i < n; i++) {
    if (sl_engine_abort(job_lease(owner[i])->engine, ids[i]) != SL_OK)
      SL_LOGW("server: out of memory recording an abort; request %llu runs "
              "to its end",
              (unsigned long long)ids[i]);
    job_unref(owner[i]);
  }
}

/* ---- responses
 * ---------------------------------------------------------------- */

/* retry_after_s > 0: a Retry-After header with that many seconds. */
static enum MHD_Result send_bytes_retry(struct MHD_Connection *c,
                                        unsigned status, const char *ctype,
                                        const char *data, size_t len,
                                        bool close, unsigned retry_after_s) {
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

static enum MHD_Result send_bytes(struct MHD_Connection *c, unsigned status,
                                  const char *ctype, const char *data,
                                  size_t len, bool close) {
  return send_bytes_retry(c, status, ctype, data, len, close, 0);
}

/* Sends `j` (a reference is taken over) as JSON. */
static enum MHD_Result send_json_retry(struct MHD_Connection *c,
                                       unsigned status, json_t *j, bool close,
                                       unsigned retry_after_s) {
  sl_sbuf b = {0};
  sl__sbuf_add_json(&b, j);
  json_decref(j);
  enum MHD_Result ret;
  if (b.oom)
    ret = send_bytes(c, 500, "text/plain", "out of memory\n", 14, true);
  else
    ret = send_bytes_retry(c, status, "application/json", b.p, b.len, close,
                           retry_after_s);
  sl__sbuf_free(&b);
  return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status,
                                 json_t *j, bool close) {
  return send_json_retry(c, status, j, close, 0);
}

/* A 503 (shutting down, queue timeout, out of memory: the request was
 * fine, the server could not serve it now) says when to retry: a queue
 * that timed out is busy for a while, the rest are worth retrying soon
 * (another instance takes over a shutdown). */
static enum MHD_Result send_error(struct MHD_Connection *c, sl_srv_family fam,
                                  const sl_srv_error *e, bool close) {
  unsigned retry = 0;
  if (e->http == 503)
    retry =
        strcmp(e->code, sl_reason_code(SL_REASON_QUEUE_TIMEOUT)) == 0 ? 5 : 1;
  return send_json_retry(c, (unsigned)e->http, sl__srv_error_json(fam, e),
                         close, retry);
}

/* ---- streaming
 * --------------------------------------------------------------- */

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  sl_srv_job *j = cls;
  sl_server_t *s = j->srv;
  const char *model = j->req.model;
  (void)pos;
  pthread_mutex_lock(&j->mu);
  unparked(j);
  for (;;) {
    if (j->out_off < j->out.len) {
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
    if (j->out.oom)
      break;
    if (j->phase == 2) {
      pthread_mutex_unlock(&j->mu);
      return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (j->req.api == SL_SRV_MESSAGES)
      sl__ant_stream(j, model, job_lease(j)->tok);
    else
      sl__oai_stream(j, model, job_lease(j)->tok);
    if (j->out.len > 0 || j->phase == 2)
      continue;
    if (atomic_load(&s->closing) || !j->conn)
      break; /* MHD is stopping: end the stream as failed */
    /* nothing to send until the engine's next event, which resumes us */
    park(j);
    pthread_mutex_unlock(&j->mu);
    return 0;
  }
  pthread_mutex_unlock(&j->mu);
  job_abort(j);
  return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void sse_free(void *cls) {
  job_unref(cls);
}

/* ---- generation routes
 * ------------------------------------------------------- */

/* A submitted request's handler, first and after each resume: parks the
 * connection until there is an answer to give (the job is done; or, when
 * streaming, it started, so that a request refused before its first token
 * still gets its error status), then queues it. */
static enum MHD_Result generate_next(sl_server_t *s, struct MHD_Connection *c,
                                     conn *cn) {
  sl_srv_job *j = cn->job;
  sl_srv_error err;
  sl_srv_api api = j->req.api;
  pthread_mutex_lock(&j->mu);
  unparked(j);
  bool ready = j->done || (j->req.stream && (j->started || j->n_toks > 0));
  if (!ready) {
    if (!atomic_load(&s->closing)) {
      park(j);
      pthread_mutex_unlock(&j->mu);
      return MHD_YES;
    }
    pthread_mutex_unlock(&j->mu);
    job_abort(j);
    cn->waiting = false;
    sl__srv_error_set(&err, sl_reason_http(SL_REASON_SHUTTING_DOWN),
                      sl_reason_code(SL_REASON_SHUTTING_DOWN), NULL, "%s",
                      sl_reason_message(SL_REASON_SHUTTING_DOWN));
    return send_error(c, cn->fam, &err, true);
  }
  cn->waiting = false;
  bool failed_early = j->done && j->finish == SL_FINISH_ERROR &&
                      (!j->req.stream || j->n_toks == 0);
  if (failed_early) {
    sl__srv_job_error(j, &err);
    pthread_mutex_unlock(&j->mu);
    return send_error(c, cn->fam, &err, false);
  }
  if (!j->req.stream) {
    json_t *body = api == SL_SRV_MESSAGES
                       ? sl__ant_body(j, j->req.model, job_lease(j)->tok)
                   : api == SL_SRV_EMBEDDINGS
                       ? sl__srv_embed_body(j, j->req.model)
                       : sl__oai_body(j, j->req.model, job_lease(j)->tok);
    pthread_mutex_unlock(&j->mu);
    return send_json(c, 200, body, false);
  }
  pthread_mutex_unlock(&j->mu);
  atomic_fetch_add(&j->refs, 1); /* the response's */
  struct MHD_Response *r = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, 16 * 1024, sse_reader, j, sse_free);
  if (!r) {
    job_unref(j);
    job_abort(j);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  add_std_headers(r);
  enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

/* Registers a submitted job in the server's list (false: the server is
 * stopping, *err says so). `refs`: the references its engine requests will
 * hold. */
static bool job_register(sl_server_t *s, conn *cn, sl_srv_job *j, int refs,
                         sl_srv_error *err) {
  pthread_mutex_lock(&s->jobs_mu);
  if (s->stopping) {
    pthread_mutex_unlock(&s->jobs_mu);
    sl__srv_error_set(err, sl_reason_http(SL_REASON_SHUTTING_DOWN),
                      sl_reason_code(SL_REASON_SHUTTING_DOWN), NULL, "%s",
                      sl_reason_message(SL_REASON_SHUTTING_DOWN));
    return false;
  }
  j->next = s->jobs;
  if (s->jobs)
    s->jobs->prev = j;
  s->jobs = j;
  s->n_jobs++;
  s->n_open++;
  cn->open = true;
  atomic_fetch_add(&j->refs, refs);
  pthread_mutex_unlock(&s->jobs_mu);
  return true;
}

/* The error of a refused sl_engine_submit. */
static void submit_error(sl_status st, int n_ids, sl_srv_error *err) {
  if (st == SL_ERR_RANGE)
    sl__srv_error_set(err, 400, "context_length_exceeded", NULL,
                      "the prompt (%d tokens) does not fit the context", n_ids);
  else if (st == SL_ERR_INVALID_ARG)
    sl__srv_error_set(err, 400, "invalid_value", NULL,
                      "the engine refused the request's parameters");
  else
    sl__srv_error_set(err, 503, NULL, NULL, "cannot queue the request: %s",
                      sl_status_str(st));
}

/* n > 1: a child job per choice, each its own engine request with the
 * seed + its index (so that sampled choices differ and stay
 * reproducible); false when out of memory. */
static bool make_kids(sl_srv_job *j, int n) {
  j->kids = sl_calloc((size_t)n, sizeof *j->kids);
  j->parts = sl_calloc((size_t)n, sizeof *j->parts);
  if (!j->kids || !j->parts) {
    sl_free(j->kids);
    j->kids = NULL;
    return false;
  }
  j->n_parts = n;
  for (int i = 0; i < n; i++) {
    sl_srv_job *k = &j->kids[i];
    atomic_init(&k->refs, 1);
    k->srv = j->srv;
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    k->req = j->req; /* shared, never freed through k */
    k->req.gen.sampling.seed = j->req.gen.sampling.seed + (uint64_t)i;
    k->parent = j;
    k->index = i;
    k->fd = -1;
    memcpy(k->id, j->id, sizeof k->id);
    k->created = j->created;
    k->prompt_tokens = j->n_ids;
    j->parts[i].job = k;
    j->parts[i].index = i;
  }
  return true;
}

/* A submitted job's connection waits for its answer (generate_next). The
 * idle timeout guards the request's arrival (slow clients); while the
 * engine works, the connection is not idle: no timeout until the request
 * completes (on_completed restores it). */
static enum MHD_Result await_answer(sl_server_t *s, struct MHD_Connection *c,
                                    conn *cn, sl_srv_job *j) {
  MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
  pthread_mutex_lock(&j->mu);
  j->conn = c;
  pthread_mutex_unlock(&j->mu);
  cn->waiting = true;
  return generate_next(s, c, cn);
}

/* POST /v1/embeddings, once parsed: each input is one embedding request to
 * the engine; the answer comes when the last is done (generate_next). */
static enum MHD_Result handle_embed(sl_server_t *s, struct MHD_Connection *c,
                                    conn *cn, sl_srv_job *j,
                                    sl_srv_error *err) {
  sl_srv_request *r = &j->req;
  const sl_pool_lease *ml = &j->mdl.lease;
  j->n_embd = (int)sl_model_hparams_of(ml->model)->n_embd;
  if (r->emb_dimensions && r->emb_dimensions != j->n_embd) {
    sl__srv_error_set(err, 400, "unsupported_parameter", "dimensions",
                      "this model's embeddings have %d dimensions; it "
                      "cannot give %d",
                      j->n_embd, r->emb_dimensions);
    goto fail;
  }
  if (sl__srv_embed_ids(r, ml->tok, ml->n_ctx, err) != SL_OK)
    goto fail;
  int n = r->n_inputs;
  j->parts = sl_calloc((size_t)n, sizeof *j->parts);
  j->emb = sl_calloc((size_t)n * (size_t)j->n_embd, sizeof(float));
  if (!j->parts || !j->emb) {
    sl__srv_error_set(err, 503, "out_of_memory", NULL,
                      "the server ran out of memory; retry later");
    goto fail;
  }
  j->n_parts = n;
  j->created = (long long)time(NULL);
  make_id(j->id, sizeof j->id, "embd-");
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  j->fd = ci ? ci->connect_fd : -1;
  if (!job_register(s, cn, j, n, err))
    goto fail;
  sl_gen_params gp = r->gen;
  gp.pooling = s->cfg.pooling == SL_POOL_LAST ? SL_POOL_LAST : SL_POOL_MEAN;
  gp.n_stop = 0;
  gp.grammar = NULL;
  j->t_submit = sl_now_ns();
  int i = 0;
  sl_status st = SL_OK;
  for (; i < n; i++) {
    j->parts[i].job = j;
    j->parts[i].index = i;
    uint64_t eid = 0;
    st = sl_engine_submit(ml->engine, r->inputs[i].ids, r->inputs[i].n_ids, &gp,
                          on_embed_event, &j->parts[i], &eid);
    if (st != SL_OK)
      break;
    pthread_mutex_lock(&j->mu);
    j->parts[i].engine_id = eid;
    j->submitted = true;
    pthread_mutex_unlock(&j->mu);
  }
  if (st != SL_OK) {
    if (st == SL_ERR_UNSUPPORTED)
      sl__srv_error_set(err, 400, "unsupported_device", NULL,
                        "embeddings are not served on this device (%s) yet; "
                        "serve with --device cpu",
                        sl_engine_device_name(ml->engine));
    else
      sl__srv_error_set(err, 503, NULL, NULL, "cannot queue the request: %s",
                        sl_status_str(st));
    /* the inputs not submitted give their references back; the others
     * end by abort */
    pthread_mutex_lock(&j->mu);
    j->parts_done += n - i;
    bool none_left = j->parts_done == j->n_parts;
    if (j->finish != SL_FINISH_ERROR) {
      j->finish = SL_FINISH_ERROR;
      j->error = st;
      j->reason = SL_REASON_NONE;
      snprintf(j->error_msg, sizeof j->error_msg, "%.200s", err->message);
    }
    if (none_left)
      j->done = true;
    pthread_mutex_unlock(&j->mu);
    atomic_fetch_sub(&j->refs, n - i);
    if (none_left) { /* nothing runs: answer now */
      server_job_remove(s, j);
      sl__srv_metrics_failed(s, &j->req, err->http);
      return send_error(c, cn->fam, err, false);
    }
    job_abort(j);
  }
  return await_answer(s, c, cn, j);
fail:
  sl__srv_metrics_failed(s, &j->req, err->http);
  return send_error(c, cn->fam, err, false);
}

static enum MHD_Result handle_generate(sl_server_t *s, struct MHD_Connection *c,
                                       conn *cn) {
  sl_srv_api api = cn->route == ROUTE_CHAT          ? SL_SRV_CHAT
                   : cn->route == ROUTE_COMPLETIONS ? SL_SRV_COMPLETIONS
                   : cn->route == ROUTE_EMBEDDINGS  ? SL_SRV_EMBEDDINGS
                                                    : SL_SRV_MESSAGES;
  sl_srv_error err;
  sl_srv_job *j = sl_calloc(1, sizeof *j);
  if (!j) {
    sl__srv_error_set(&err, 500, NULL, NULL, "out of memory");
    goto fail_respond;
  }
  /* the parse leases the model the body names (released with the job) */
  sl_srv_limits lim = sl__srv_limits_of(s, &j->mdl);
  atomic_init(&j->refs, 1);
  j->srv = s;
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, NULL);
  j->fd = -1;
  cn->job = j;
  if (sl__srv_parse(api, cn->body.p ? cn->body.p : "", cn->body.len, &lim,
                    &j->req, &err) != SL_OK)
    goto fail_respond;
  if (api == SL_SRV_EMBEDDINGS)
    return handle_embed(s, c, cn, j, &err);
  const sl_pool_lease *ml = &j->mdl.lease;
  if (sl__srv_prompt_ids(&j->req, ml->tok, ml->chat_template,
                         s->cfg.parse_special_in_content, &j->ids, &j->n_ids,
                         &err) != SL_OK)
    goto fail_respond;
  if (j->n_ids >= ml->n_ctx) {
    sl__srv_error_set(&err, 400, "context_length_exceeded",
                      api == SL_SRV_COMPLETIONS ? "prompt" : "messages",
                      "this model's maximum context length is %d tokens, "
                      "but the prompt has %d tokens",
                      ml->n_ctx, j->n_ids);
    goto fail_respond;
  }
  size_t nv = sl_tokenizer_vocab_size(ml->tok);
  for (int i = 0; i < j->req.gen.n_logit_bias; i++)
    if ((size_t)j->req.gen.logit_bias[i].id >= nv) {
      sl__srv_error_set(&err, 400, "invalid_value", "logit_bias",
                        "logit_bias: token id %d is outside the vocabulary "
                        "(%zu)",
                        j->req.gen.logit_bias[i].id, nv);
      goto fail_respond;
    }
  /* no max_tokens: --max-tokens-default (0: the room left); above the
   * room left in the context: clamped to it */
  int room = ml->n_ctx - j->n_ids;
  if (!j->req.max_tokens_set && api == SL_SRV_CHAT)
    j->req.gen.max_tokens =
        s->cfg.max_tokens_default > 0 ? s->cfg.max_tokens_default : room;
  if (j->req.gen.max_tokens > room)
    j->req.gen.max_tokens = room;
  j->prompt_tokens = j->n_ids;
  j->created = (long long)time(NULL);
  make_id(j->id, sizeof j->id,
          api == SL_SRV_CHAT          ? "chatcmpl-"
          : api == SL_SRV_COMPLETIONS ? "cmpl-"
                                      : "msg_");
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  j->fd = ci ? ci->connect_fd : -1;

  int n = j->req.n_choices > 1 ? j->req.n_choices : 1;
  if (n > 1 && !make_kids(j, n)) {
    sl__srv_error_set(&err, 503, "out_of_memory", NULL,
                      "the server ran out of memory; retry later");
    goto fail_respond;
  }
  /* register, then submit: the engine holds one reference per request
   * (each choice's) until DONE */
  if (!job_register(s, cn, j, n, &err))
    goto fail_respond;
  /* no lock is held across submit: the executor may already be calling
   * back into this job (and into the jobs list) */
  j->t_submit = sl_now_ns();
  for (int i = 0; i < n; i++) {
    sl_srv_job *k = j->kids ? &j->kids[i] : j;
    uint64_t eid = 0;
    k->t_submit = j->t_submit;
    sl_status st = sl_engine_submit(ml->engine, j->ids, j->n_ids, &k->req.gen,
                                    on_event, k, &eid);
    if (st != SL_OK && i == 0) { /* nothing runs: answer now */
      server_job_remove(s, j);
      atomic_fetch_sub(&j->refs, n);
      submit_error(st, j->n_ids, &err);
      goto fail_respond;
    }
    if (st != SL_OK) { /* a later choice: it ends at once, failed */
      submit_error(st, j->n_ids, &err);
      pthread_mutex_lock(&k->mu);
      k->done = true;
      k->finish = SL_FINISH_ERROR;
      k->error = st;
      k->reason = SL_REASON_NONE;
      snprintf(k->error_msg, sizeof k->error_msg, "choice %d: %.200s", i,
               err.message);
      pthread_mutex_unlock(&k->mu);
      kid_event(j, true, false);
      continue;
    }
    pthread_mutex_lock(&k->mu);
    k->engine_id = eid;
    k->submitted = true;
    pthread_mutex_unlock(&k->mu);
    if (k != j) {
      pthread_mutex_lock(&j->mu);
      j->parts[i].engine_id = eid;
      j->submitted = true;
      pthread_mutex_unlock(&j->mu);
    }
  }

  return await_answer(s, c, cn, j);

fail_respond:
  sl__srv_metrics_failed(s, j ? &j->req : NULL, err.http);
  return send_error(c, cn->fam, &err, false);
}

/* ---- waiting for a model's load --------------------------------------------
 *
 * A generation request for a model that is not loaded does not hold a
 * libmicrohttpd thread through the load: its connection is suspended and
 * the model's helper thread (one per model loading) loads it and resumes
 * every connection waiting for it; each then runs as if it had just
 * arrived (handle_generate). */

typedef struct load_waiter {
  struct load_waiter *next;
  struct MHD_Connection *c;
  conn *cn;
} load_waiter;

struct sl_srv_loading {
  struct sl_srv_loading *next;
  sl_server_t *s;
  int index;
  char name[256];
  load_waiter *waiters;
};

static void *load_helper(void *arg) {
  struct sl_srv_loading *L = arg;
  sl_server_t *s = L->s;
  char why[320] = "";
  sl_status st = sl_pool_load(s->pool, L->name, why, sizeof why);
  pthread_mutex_lock(&s->load_mu);
  for (struct sl_srv_loading **pp = &s->loading; *pp; pp = &(*pp)->next)
    if (*pp == L) {
      *pp = L->next;
      break;
    }
  load_waiter *w = L->waiters;
  pthread_mutex_unlock(&s->load_mu);
  while (w) {
    load_waiter *next = w->next;
    memset(&w->cn->load_err, 0, sizeof w->cn->load_err);
    if (st != SL_OK)
      sl__srv_load_error(st, L->name, why, &w->cn->load_err);
    MHD_resume_connection(w->c);
    atomic_fetch_sub(&s->n_load_parked, 1); /* s may go once all are 0 */
    sl_free(w);
    w = next;
  }
  sl_free(L);
  return NULL;
}

/* When the request's model is known and not loaded, parks the connection
 * until its load ends (true); false: handle it now. */
static bool park_for_load(sl_server_t *s, struct MHD_Connection *c, conn *cn) {
  if (atomic_load(&s->closing) ||
      sl_pool_loaded_count(s->pool) == sl_pool_count(s->pool))
    return false; /* the common case costs no parse */
  sl_srv_error err;
  json_t *root =
      sl__srv_body_object(cn->body.p ? cn->body.p : "", cn->body.len, &err);
  json_t *m = root ? json_object_get(root, "model") : NULL;
  int i = json_is_string(m) ? sl__srv_model_index(s, json_string_value(m)) : -1;
  json_decref(root);
  sl_pool_info in;
  if (i < 0 || !sl_pool_info_at(s->pool, i, &in) || in.state == SL_POOL_LOADED)
    return false; /* unknown or loaded: the parse answers, or it runs */
  load_waiter *w = sl_calloc(1, sizeof *w);
  if (!w)
    return false;
  w->c = c;
  w->cn = cn;
  pthread_mutex_lock(&s->load_mu);
  struct sl_srv_loading *L = s->loading;
  while (L && L->index != i)
    L = L->next;
  if (!L) {
    pthread_t th;
    pthread_attr_t at;
    L = sl_calloc(1, sizeof *L);
    bool ok = L && pthread_attr_init(&at) == 0;
    if (ok) {
      L->s = s;
      L->index = i;
      snprintf(L->name, sizeof L->name, "%s", in.name);
      L->waiters = w;
      pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
      ok = pthread_create(&th, &at, load_helper, L) == 0;
      pthread_attr_destroy(&at);
    }
    if (!ok) { /* no thread: the handler loads it itself */
      pthread_mutex_unlock(&s->load_mu);
      sl_free(L);
      sl_free(w);
      return false;
    }
    L->next = s->loading;
    s->loading = L;
  } else {
    w->next = L->waiters;
    L->waiters = w;
  }
  cn->load_wait = true;
  atomic_fetch_add(&s->n_load_parked, 1);
  /* under load_mu: the helper resumes only after taking it */
  MHD_suspend_connection(c);
  pthread_mutex_unlock(&s->load_mu);
  return true;
}

/* ---- routing
 * ------------------------------------------------------------------ */

static enum route route_of(const char *url, const char *method, bool *post,
                           bool *bad_method, bool *preflight) {
  static const struct {
    const char *path;
    bool post;
    enum route r;
  } table[] = {
      {"/health", false, ROUTE_HEALTH},
      {"/v1/models", false, ROUTE_MODELS},
      {"/metrics", false, ROUTE_METRICS},
      {"/admin/api/stats", false, ROUTE_STATS},
      {"/v1/chat/completions", true, ROUTE_CHAT},
      {"/v1/completions", true, ROUTE_COMPLETIONS},
      {"/v1/messages", true, ROUTE_MESSAGES},
      {"/v1/messages/count_tokens", true, ROUTE_COUNT_TOKENS},
      {"/tokenize", true, ROUTE_TOKENIZE},
      {"/detokenize", true, ROUTE_DETOKENIZE},
      {"/apply-template", true, ROUTE_APPLY_TEMPLATE},
      {"/v1/embeddings", true, ROUTE_EMBEDDINGS},
      {"/admin/api/clear-cache", true, ROUTE_ADMIN_CLEAR},
      {"/admin", false, ROUTE_ADMIN_PAGE},
      {"/admin/", false, ROUTE_ADMIN_PAGE},
      {"/v1/models/", false, ROUTE_MODEL}, /* a prefix: /v1/models/{id} */
      {"/admin/api/models/", true, ROUTE_ADMIN_MODEL}, /* a prefix */
  };
  *bad_method = *preflight = false;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    size_t pl = strlen(table[i].path);
    bool hit = table[i].r == ROUTE_MODEL || table[i].r == ROUTE_ADMIN_MODEL
                   ? strncmp(url, table[i].path, pl) == 0 && url[pl]
                   : strcmp(url, table[i].path) == 0;
    if (!hit)
      continue;
    bool is_post = strcmp(method, "POST") == 0;
    bool is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    *post = table[i].post;
    *preflight = strcmp(method, "OPTIONS") == 0;
    if (!*preflight && (table[i].post ? !is_post : !is_get))
      *bad_method = true;
    return table[i].r;
  }
  return ROUTE_NONE;
}

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
    make_id(out, cap, "req_");
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
  if (!on || on >= cap)
    return;
  for (const char *p = list; *p;) {
    while (*p == ' ' || *p == ',')
      p++;
    size_t n = strcspn(p, ", ");
    if (n == on && !strncmp(p, o, n)) {
      memcpy(out, o, on + 1);
      return;
    }
    p += n;
  }
}

/* A CORS preflight (OPTIONS on a known route): 204, no key needed (a
 * browser sends none there). The origin is allowed only when add_std_headers
 * adds Access-Control-Allow-Origin. */
static enum MHD_Result send_preflight(struct MHD_Connection *c) {
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
  MHD_add_response_header(r, "Allow", "GET, HEAD, POST, OPTIONS");
  MHD_add_response_header(r, "Access-Control-Allow-Methods",
                          "GET, HEAD, POST, OPTIONS");
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

static enum MHD_Result send_page(struct MHD_Connection *c) {
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

/* A route that generates nothing, from its body: its JSON or its error. */
typedef sl_status (*body_route)(sl_server_t *s, const char *body, size_t len,
                                json_t **out, sl_srv_error *err);

static enum MHD_Result answer_body_route(sl_server_t *s,
                                         struct MHD_Connection *c, conn *cn,
                                         body_route fn) {
  json_t *out = NULL;
  sl_srv_error err;
  memset(&err, 0, sizeof err);
  if (fn(s, cn->body.p ? cn->body.p : "", cn->body.len, &out, &err) != SL_OK) {
    if (!err.http)
      sl__srv_error_set(&err, 500, NULL, NULL, "internal error");
    return send_error(c, cn->fam, &err, false);
  }
  return send_json(c, 200, out, false);
}

static enum MHD_Result on_access_req(sl_server_t *s, conn *cn,
                                     struct MHD_Connection *c, const char *url,
                                     const char *upload_data,
                                     size_t *upload_data_size);

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c,
                                 const char *url, const char *method,
                                 const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls) {
  sl_server_t *s = cls;
  conn *cn = *con_cls;
  sl_srv_error err;
  enum MHD_Result ret;
  if (cn) {
    tl_conn = cn;
    tl_anthropic = cn->fam == SL_SRV_FAMILY_ANTHROPIC;
    ret = on_access_req(s, cn, c, url, upload_data, upload_data_size);
    tl_conn = NULL;
    return ret;
  }
  if (!(cn = sl_calloc(1, sizeof *cn)))
    return MHD_NO;
  *con_cls = cn;
  pthread_mutex_lock(&s->m.mu);
  s->m.http_requests++;
  pthread_mutex_unlock(&s->m.mu);
  bool post = false, bad_method, preflight;
  cn->route = route_of(url, method, &post, &bad_method, &preflight);
  cn->fam = sl__srv_anthropic_target(url, strlen(url)) ? SL_SRV_FAMILY_ANTHROPIC
                                                       : SL_SRV_FAMILY_OPENAI;
  request_id(c, cn->rid, sizeof cn->rid);
  cors_origin(s, c, cn->acao, sizeof cn->acao);
  tl_conn = cn;
  tl_anthropic = cn->fam == SL_SRV_FAMILY_ANTHROPIC;
  ret = MHD_YES;
  if (framing_bad(c, version, &err)) {
    cn->responded = true;
    sl__srv_metrics_failed(s, NULL, err.http);
    ret = send_error(c, cn->fam, &err, true);
  } else if (preflight) {
    cn->responded = true;
    ret = send_preflight(c);
  } else if (cn->route != ROUTE_HEALTH && cn->route != ROUTE_ADMIN_PAGE &&
             !authorized(s, c)) {
    sl__srv_error_set(&err, 401, "invalid_api_key", NULL,
                      "invalid or missing API key");
    cn->responded = true;
    ret = send_error(c, cn->fam, &err, true);
  } else if (cn->route == ROUTE_NONE) {
    sl__srv_error_set(&err, 404, "not_found", NULL, "no route for %s %s",
                      method, url);
    cn->responded = true;
    ret = send_error(c, cn->fam, &err, true);
  } else if (bad_method) {
    sl__srv_error_set(&err, 405, "method_not_allowed", NULL,
                      "%s is not allowed on %s", method, url);
    cn->responded = true;
    ret = send_error(c, cn->fam, &err, true);
  } else {
    const char *cl = MHD_lookup_connection_value(
        c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) {
      sl__srv_error_set(&err, 413, "request_too_large", NULL,
                        "the request body exceeds %zu bytes",
                        s->cfg.max_body_bytes);
      cn->responded = true;
      sl__srv_metrics_failed(s, NULL, err.http);
      ret = send_error(c, cn->fam, &err, true);
    }
  }
  tl_conn = NULL;
  return ret;
}

/* The calls after the first: the body's bytes, then its end, then (for a
 * submitted request) each resume. */
static enum MHD_Result on_access_req(sl_server_t *s, conn *cn,
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
    return generate_next(s, c, cn);
  if (cn->load_wait) { /* resumed: the model's load ended */
    cn->load_wait = false;
    pthread_mutex_lock(&s->jobs_mu);
    bool stop = s->stopping;
    pthread_mutex_unlock(&s->jobs_mu);
    if (stop)
      sl__srv_error_set(&cn->load_err, 503, "shutting_down", NULL,
                        "the server is shutting down");
    if (cn->load_err.http) {
      sl__srv_metrics_failed(s, NULL, cn->load_err.http);
      return send_error(c, cn->fam, &cn->load_err, false);
    }
    return handle_generate(s, c, cn);
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
    return send_error(c, cn->fam, &err, true);
  }
  if (cn->body.oom) {
    sl__srv_error_set(&err, 500, NULL, NULL, "out of memory");
    return send_error(c, cn->fam, &err, true);
  }
  bool stopping;
  pthread_mutex_lock(&s->jobs_mu);
  stopping = s->stopping;
  pthread_mutex_unlock(&s->jobs_mu);
  switch (cn->route) {
  case ROUTE_HEALTH:
    return send_json(
        c, stopping ? 503 : 200,
        json_pack("{s:s}", "status", stopping ? "shutting_down" : "ok"), false);
  case ROUTE_MODELS:
    return send_json(c, 200, sl__srv_models_json(s), false);
  case ROUTE_MODEL: {
    json_t *m = sl__srv_model_json(s, url + strlen("/v1/models/"), &err);
    return m ? send_json(c, 200, m, false)
             : send_error(c, cn->fam, &err, false);
  }
  case ROUTE_ADMIN_MODEL: {
    json_t *m =
        sl__srv_admin_model(s, url + strlen("/admin/api/models/"), &err);
    return m ? send_json(c, 200, m, false)
             : send_error(c, cn->fam, &err, false);
  }
  case ROUTE_ADMIN_PAGE:
    return send_page(c);
  case ROUTE_ADMIN_CLEAR: {
    json_t *m = sl__srv_admin_clear(s, &err);
    return m ? send_json(c, 200, m, false)
             : send_error(c, cn->fam, &err, false);
  }
  case ROUTE_COUNT_TOKENS:
    return answer_body_route(s, c, cn, sl__srv_count_tokens);
  case ROUTE_TOKENIZE:
    return answer_body_route(s, c, cn, sl__srv_tokenize);
  case ROUTE_DETOKENIZE:
    return answer_body_route(s, c, cn, sl__srv_detokenize);
  case ROUTE_APPLY_TEMPLATE:
    return answer_body_route(s, c, cn, sl__srv_apply_template);
  case ROUTE_STATS:
    return send_json(c, 200, sl__srv_stats_json(s), false);
  case ROUTE_METRICS: {
    sl_sbuf b = {0};
    sl__srv_metrics_text(s, &b);
    enum MHD_Result r = b.oom ? MHD_NO
                              : send_bytes(c, 200, "text/plain; version=0.0.4",
                                           b.p, b.len, false);
    sl__sbuf_free(&b);
    return r;
  }
  default:
    if (stopping) {
      sl__srv_error_set(&err, 503, "shutting_down", NULL,
                        "the server is shutting down");
      return send_error(c, cn->fam, &err, true);
    }
    if (park_for_load(s, c, cn))
      return MHD_YES;
    return handle_generate(s, c, cn);
  }
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
  conn *cn = *con_cls;
  sl__srv_watch_idle(((sl_server_t *)cls)->watch, sock_of(c));
  if (!cn)
    return;
  if (cn->job) {
    pthread_mutex_lock(&cn->job->mu);
    unparked(cn->job); /* closed while parked: at a daemon stop */
    cn->job->conn = NULL;
    if (cn->job->watched) {
      cn->job->watched = false;
      sl__srv_watch_hangup(((sl_server_t *)cls)->watch, cn->job->fd, false);
    }
    pthread_mutex_unlock(&cn->job->mu);
    /* a client that vanished, a timeout, a shutdown: stop generating */
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
      job_abort(cn->job);
    job_unref(cn->job);
    sl_server_t *s = cls;
    if (cn->open) {
      pthread_mutex_lock(&s->jobs_mu);
      s->n_open--;
      pthread_cond_broadcast(&s->jobs_cv);
      pthread_mutex_unlock(&s->jobs_mu);
    }
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT,
                              (unsigned)s->cfg.http_timeout_s);
  }
  /* a large body's parse left ~30 MB of small blocks in this pool
   * thread's malloc arena: give the free pages back (test_server_limits) */
  bool large = cn->body.cap >= (1u << 20);
  sl__sbuf_free(&cn->body);
  sl_free(cn);
  *con_cls = NULL;
  if (large)
    malloc_trim(0);
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
  if (!s->host || (cfg->api_key && cfg->api_key[0] && !s->api_key) ||
      (cfg->cors_origin && cfg->cors_origin[0] && !s->cors))
    goto fail_strings;
  s->cfg.cors_origin = s->cors;
  s->cfg.tool_call_format = NULL;
  if (cfg->tool_call_format && cfg->tool_call_format[0] &&
      !sl__srv_toolfmt_parse(cfg->tool_call_format, &s->toolfmt)) {
    snprintf(err, errcap,
             "unknown tool-call format '%s' (hermes, llama3, mistral, generic)",
             cfg->tool_call_format);
    st = SL_ERR_INVALID_ARG;
    goto fail_strings;
  }
  s->cfg.host = s->host;
  s->cfg.api_key = s->api_key;
  pthread_mutex_init(&s->jobs_mu, NULL);
  pthread_cond_init(&s->jobs_cv, NULL);
  pthread_mutex_init(&s->load_mu, NULL);
  sl__srv_metrics_init(&s->m);
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
                                s->cfg.request_timeout_ms, reap_parked, s))) {
    freeaddrinfo(ai);
    goto fail_sync; /* out of memory or threads */
  }
  /* no listening socket of its own: the door hands connections in; poll,
   * not epoll (see the top of this file) */
  unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC |
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
                        .hand = hand_connection,
                        .arg = s};
  char derr[160];
  s->door = sl__srv_door_start(&dc, &s->port, derr, sizeof derr);
  freeaddrinfo(ai);
  if (!s->door) {
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
  sl__srv_metrics_destroy(&s->m);
  pthread_cond_destroy(&s->jobs_cv);
  pthread_mutex_destroy(&s->jobs_mu);
  pthread_mutex_destroy(&s->load_mu);
fail_strings:
  sl_free(s->host);
  sl_free(s->api_key);
  sl_free(s->cors);
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

/* Waits until no job is live and every generation response has been
 * handed to its client (MHD's completion callback ran), or `ms` pass.
 * Returns the number of jobs still live plus responses still open. A job
 * leaves the engine before its response is written, so waiting on jobs
 * alone would let MHD_stop_daemon cut a finished answer off mid-send. */
static int wait_jobs(sl_server_t *s, unsigned ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&s->jobs_mu);
  while (s->n_jobs + s->n_open > 0)
    if (pthread_cond_timedwait(&s->jobs_cv, &s->jobs_mu, &ts) == ETIMEDOUT)
      break;
  int n = s->n_jobs + s->n_open;
  pthread_mutex_unlock(&s->jobs_mu);
  return n;
}

/* Shutdown: marks the live jobs (only those not yet started, with
 * queued_only) as cut and asks the engine to abort them, so that they end
 * as errors, not as complete answers. Returns how many were asked (at most
 * 64 a call; ids are copied under the lock, aborted outside it). */
static int cut_jobs(sl_server_t *s, bool queued_only) {
  uint64_t ids[64];
  sl_srv_job *owner[64]; /* each id's job, referenced until its abort */
  int n = 0;
  pthread_mutex_lock(&s->jobs_mu);
  for (sl_srv_job *j = s->jobs; j && n < 64; j = j->next) {
    pthread_mutex_lock(&j->mu);
    if (j->submitted && !j->done && !(queued_only && j->started) &&
        !(queued_only && j->cut)) {
      if (n > 0 && n + (j->parts ? j->n_parts : 1) > 64) {
        pthread_mutex_unlock(&j->mu); /* the next pass */
        break;
      }
      j->cut = true;
      for (int i = 0; j->kids && i < j->n_parts; i++) {
        pthread_mutex_lock(&j->kids[i].mu);
        j->kids[i].cut = true;
        pthread_mutex_unlock(&j->kids[i].mu);
      }
      int k = job_ids(j, ids + n, 64 - n);
      for (int i = 0; i < k; i++) {
        owner[n + i] = j;
        atomic_fetch_add(&j->refs, 1); /* its engine stays loaded */
      }
      n += k;
    }
    pthread_mutex_unlock(&j->mu);
  }
  pthread_mutex_unlock(&s->jobs_mu);
  for (int i = 0; i < n; i++) {
    /* retried next pass */
    (void)sl_engine_abort(job_lease(owner[i])->engine, ids[i]);
    job_unref(owner[i]);
  }
  return n;
}

/* libmicrohttpd cannot stop with a connection suspended: from here on no
 * handler parks, every parked connection is resumed, and this waits (2 s
 * at most) until each is back in a handler (which answers 503 or ends its
 * stream as failed). */
static void unpark_all(sl_server_t *s) {
  atomic_store(&s->closing, true);
  for (int round = 0; round < 200 && atomic_load(&s->n_parked) > 0; round++) {
    pthread_mutex_lock(&s->jobs_mu);
    for (sl_srv_job *j = s->jobs; j; j = j->next) {
      pthread_mutex_lock(&j->mu);
      wake(j);
      pthread_mutex_unlock(&j->mu);
    }
    pthread_mutex_unlock(&s->jobs_mu);
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

void sl_server_stop(sl_server_t *s) {
  if (!s)
    return;
  pthread_mutex_lock(&s->jobs_mu);
  s->stopping = true;
  pthread_mutex_unlock(&s->jobs_mu);
  sl__srv_door_close(s->door); /* no new connection from here on */
  /* requests still queued get their 503 now, so that their clients retry
   * elsewhere; the grace period is for the ones already generating */
  cut_jobs(s, true);
  if (wait_jobs(s, s->cfg.grace_ms) > 0) {
    /* cut what is left: each ends as a 503 or a stream's error event */
    for (;;) {
      int n = cut_jobs(s, false);
      if (wait_jobs(s, 2000) == 0 || n == 0)
        break;
    }
    /* the cut answers are still being written: let them go out */
    wait_jobs(s, 2000);
  }
  unpark_all(s);
  MHD_stop_daemon(s->mhd);
  sl__srv_watch_stop(s->watch);
  sl__srv_door_free(s->door);
  sl__srv_metrics_destroy(&s->m);
  pthread_cond_destroy(&s->jobs_cv);
  pthread_mutex_destroy(&s->jobs_mu);
  pthread_mutex_destroy(&s->load_mu);
  sl_free(s->host);
  sl_free(s->api_key);
  sl_free(s->cors);
  sl_free(s);
}
