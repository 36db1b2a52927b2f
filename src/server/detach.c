/* sluice — server: answers to clients that half-closed.
 *
 * A client may send its whole request and then shut its sending side
 * (shutdown(SHUT_WR)), and read the answer: RFC 9112 lets it, and some
 * clients and proxies do. libmicrohttpd 0.9.75 closes a connection as soon
 * as it reads the EOF while no response is queued (its own source marks
 * the case "TODO"), and a parked request's connection reads it when it is
 * resumed for the answer. So the answer is written here instead:
 *
 *   - the watch's tick (reply.c) sees the FIN of a parked request and, as
 *     nothing of the answer went out, sends a 100 Continue: a client that
 *     closed its socket answers with a reset and its job is aborted; one
 *     that only shut its side stays;
 *   - when libmicrohttpd then closes the connection (http.c's
 *     on_completed), the server runs it with MHD_USE_TURBO, which closes
 *     without a shutdown() of the socket, so a dup of the socket taken here
 *     keeps the connection open: the job goes on, detached, with the
 *     connection's reference and its open response;
 *   - the watch's thread writes the answer (woken by each of the job's
 *     events): the whole JSON answer, or an SSE stream, with
 *     Connection: close, then closes the socket. A reset or a write error
 *     stops the job.
 *
 * The answer has the same body, status and headers (request id, CORS) as
 * through libmicrohttpd, without Date. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/detach.h"
#include "server/job.h"
#include "server/json.h"
#include "server/reply.h"
#include "sluice/util.h"

typedef struct sl_srv_detached sl_srv_detached;
struct sl_srv_detached {
  sl_srv_job *j; /* the connection's reference */
  int fd;        /* a dup of the client's socket */
  sl_srv_family fam;
  sl_srv_hdrs hdrs;
  bool head_sent; /* the status line and headers are in out */
  bool last;      /* out ends the answer */
  sl_sbuf out;    /* to write */
  size_t off;
  sl_srv_detached *next;
};

bool sl__srv_detach(sl_server_t *s, sl_srv_conn *cn, int fd) {
  sl_srv_job *j = cn->job;
  if (!j || !cn->waiting || !cn->open || atomic_load(&s->closing) ||
      sl__srv_peer_state(fd) != SL_SRV_PEER_SHUT)
    return false;
  pthread_mutex_lock(&j->mu);
  bool live = !j->aborted && !j->cut && !j->detached;
  pthread_mutex_unlock(&j->mu);
  if (!live)
    return false;
  sl_srv_detached *d = sl_calloc(1, sizeof *d);
  if (!d)
    return false;
  d->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (d->fd < 0 || !sl__srv_door_move(s->door, fd, d->fd)) {
    if (d->fd >= 0)
      close(d->fd);
    sl_free(d);
    return false;
  }
  d->j = j;
  d->fam = cn->fam;
  d->hdrs = cn->hdrs;
  pthread_mutex_lock(&j->mu);
  j->detached = true;
  pthread_mutex_unlock(&j->mu);
  pthread_mutex_lock(&s->det_mu);
  d->next = s->detached;
  s->detached = d;
  s->n_detached_total++;
  pthread_mutex_unlock(&s->det_mu);
  sl__srv_watch_hangup(s->watch, d->fd, true); /* a reset wakes the tick */
  sl__srv_watch_poke(s->watch);
  return true;
}

static void add_header(void *arg, const char *name, const char *value) {
  sl__sbuf_addf(arg, "%s: %s\r\n", name, value);
}

/* The status line and headers; len: the body's (SIZE_MAX: a stream). */
static void put_head(sl_srv_detached *d, unsigned status, const char *ctype,
                     size_t len, unsigned retry_after_s) {
  const char *why = MHD_get_reason_phrase_for(status);
  sl__sbuf_addf(&d->out, "HTTP/1.1 %u %s\r\nContent-Type: %s\r\n", status,
                why && why[0] ? why : "Unknown", ctype);
  if (len != SIZE_MAX)
    sl__sbuf_addf(&d->out, "Content-Length: %zu\r\n", len);
  else
    sl__sbuf_adds(&d->out, "Cache-Control: no-cache\r\n");
  if (retry_after_s)
    sl__sbuf_addf(&d->out, "Retry-After: %u\r\n", retry_after_s);
  sl__srv_std_headers(&d->hdrs, d->fam == SL_SRV_FAMILY_ANTHROPIC, add_header,
                      &d->out);
  sl__sbuf_adds(&d->out, "Connection: close\r\n\r\n");
}

/* A whole JSON answer (its reference taken; NULL: out of memory). */
static void put_json(sl_srv_detached *d, unsigned status, json_t *body,
                     unsigned retry_after_s) {
  sl_sbuf b = {0};
  if (body)
    sl__sbuf_add_json(&b, body);
  json_decref(body);
  if (!body || b.oom) {
    sl__sbuf_free(&b);
    d->out.oom = true;
    return;
  }
  put_head(d, status, "application/json", b.len, retry_after_s);
  sl__sbuf_add(&d->out, b.p, b.len);
  sl__sbuf_free(&b);
  d->last = true;
}

/* Moves what the job has to say into d->out (j->mu held): as
 * generate.c's sl__srv_generate_next and reply.c's SSE reader do for a
 * connection libmicrohttpd holds. */
static void fill(sl_srv_detached *d) {
  sl_srv_job *j = d->j;
  if (!d->head_sent) {
    if (!sl__srv_job_ready(j))
      return;
    d->head_sent = true;
    if (sl__srv_job_failed_early(j)) {
      sl_srv_error err;
      sl__srv_job_error(j, &err);
      put_json(d, (unsigned)err.http, sl__srv_error_json(d->fam, &err),
               sl__srv_retry_after(&err));
      return;
    }
    if (!j->req.stream) {
      put_json(d, 200, sl__srv_answer_body(j), 0);
      return;
    }
    put_head(d, 200, "text/event-stream", SIZE_MAX, 0);
  }
  switch (sl__srv_sse_next(j)) {
  case SL_SRV_SSE_BYTES:
    sl__sbuf_add(&d->out, j->out.p + j->out_off, j->out.len - j->out_off);
    j->out_off = j->out.len = 0;
    break;
  case SL_SRV_SSE_OOM:
    d->out.oom = true;
    break;
  case SL_SRV_SSE_END:
    d->last = true;
    break;
  default: /* nothing until the job's next event */
    break;
  }
}

/* One detached answer's turn: false once it is over (answered, or its
 * client is gone: then its job is stopped). */
static bool pump_one(sl_srv_detached *d) {
  if (sl__srv_peer_state(d->fd) == SL_SRV_PEER_GONE)
    goto gone;
  if (d->off == d->out.len) {
    d->off = d->out.len = 0;
    pthread_mutex_lock(&d->j->mu);
    fill(d);
    pthread_mutex_unlock(&d->j->mu);
  }
  if (d->out.oom)
    goto gone;
  while (d->off < d->out.len) {
    ssize_t n = send(d->fd, d->out.p + d->off, d->out.len - d->off,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      d->off += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      return true; /* the next tick goes on */
    goto gone;
  }
  return !d->last;
gone:
  sl__srv_job_stop(d->j);
  return false;
}

/* watched: the watch still runs (not at the stop). */
static void end_one(sl_server_t *s, sl_srv_detached *d, bool watched) {
  pthread_mutex_lock(&d->j->mu);
  d->j->detached = false;
  pthread_mutex_unlock(&d->j->mu);
  if (watched)
    sl__srv_watch_hangup(s->watch, d->fd, false);
  sl__srv_door_release(s->door, d->fd);
  close(d->fd);
  sl__srv_job_unref(d->j);
  sl__srv_jobs_closed(&s->jobs);
  sl__sbuf_free(&d->out);
  sl_free(d);
}

void sl__srv_detached_pump(sl_server_t *s) {
  pthread_mutex_lock(&s->det_mu);
  sl_srv_detached *list = s->detached;
  s->detached = NULL;
  pthread_mutex_unlock(&s->det_mu);
  sl_srv_detached *keep = NULL;
  while (list) {
    sl_srv_detached *d = list;
    list = d->next;
    if (pump_one(d)) {
      d->next = keep;
      keep = d;
    } else {
      end_one(s, d, true);
    }
  }
  if (!keep)
    return;
  pthread_mutex_lock(&s->det_mu);
  sl_srv_detached **tail = &keep;
  while (*tail)
    tail = &(*tail)->next;
  *tail = s->detached; /* any detached meanwhile */
  s->detached = keep;
  pthread_mutex_unlock(&s->det_mu);
}

void sl__srv_detached_free(sl_server_t *s) {
  pthread_mutex_lock(&s->det_mu);
  sl_srv_detached *list = s->detached;
  s->detached = NULL;
  pthread_mutex_unlock(&s->det_mu);
  while (list) {
    sl_srv_detached *d = list;
    list = d->next;
    sl__srv_job_stop(d->j);
    end_one(s, d, false);
  }
}
