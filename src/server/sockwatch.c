/* sluice — server: the request-line watch. libmicrohttpd waits for a
 * request line until the connection's idle timeout, as long as no line
 * feed comes: a client that speaks TLS or any other protocol to this port
 * got no answer and held its connection for 30 s. This watch notices bytes
 * that arrived on a connection (the kernel's count, TCP_INFO) without
 * making a request line within SL_SRV_LINE_DEADLINE_MS, answers 400 (JSON,
 * OpenAI's shape: there is no route to choose another) and shuts the
 * socket down, which makes libmicrohttpd close it.
 *
 * Threads: add / remove / request / read / idle are called by libmicrohttpd's
 * threads; the watch thread scans the list every SL_SRV_WATCH_TICK_MS. An
 * entry's fd is only touched under the mutex, and the entry is removed
 * (under the mutex) before libmicrohttpd closes the fd, so a reused fd
 * number is never written to.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "server/server_impl.h"
#include "sluice/util.h"

#define SL_SRV_WATCH_TICK_MS 100

struct sl_srv_sock {
  int fd;
  bool in_request;  /* a request line was parsed; until it completes */
  bool cut;         /* answered 400 and shut down */
  bool read;        /* the request in progress was read whole */
  uint64_t base;    /* bytes received up to the end of the last request */
  uint64_t t_bytes; /* when bytes past `base` were first seen (0: none) */
  sl_srv_sock *prev, *next;
};

struct sl_srv_watch {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  bool stop;
  unsigned deadline_ms;
  sl_srv_sock *socks;
  char *answer; /* the whole 400 response */
  size_t answer_len;
};

/* Bytes the kernel received on fd so far; 0 when it cannot tell. */
static uint64_t bytes_received(int fd) {
  struct tcp_info ti;
  socklen_t len = sizeof ti;
  memset(&ti, 0, sizeof ti);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
    return 0;
  if (len < offsetof(struct tcp_info, tcpi_bytes_received) +
                sizeof ti.tcpi_bytes_received)
    return 0; /* an old kernel: never cut */
  return ti.tcpi_bytes_received;
}

static void cut(sl_srv_watch *w, sl_srv_sock *k) {
  k->cut = true;
  ssize_t n =
      send(k->fd, w->answer, w->answer_len, MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)n; /* a full send buffer: the client gets the close alone */
  shutdown(k->fd, SHUT_RDWR);
}

static void *watch_main(void *arg) {
  sl_srv_watch *w = arg;
  pthread_mutex_lock(&w->mu);
  while (!w->stop) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += SL_SRV_WATCH_TICK_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    uint64_t now = sl_now_ns();
    for (sl_srv_sock *k = w->socks; k && !w->stop; k = k->next) {
      if (k->in_request || k->cut || bytes_received(k->fd) <= k->base)
        continue;
      if (!k->t_bytes)
        k->t_bytes = now;
      else if (now - k->t_bytes >= (uint64_t)w->deadline_ms * 1000000ull)
        cut(w, k);
    }
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

sl_srv_watch *sl__srv_watch_start(unsigned deadline_ms) {
  sl_srv_watch *w = sl_calloc(1, sizeof *w);
  if (!w)
    return NULL;
  w->deadline_ms = deadline_ms;
  sl_srv_error e;
  sl__srv_error_set(&e, 400, "malformed_request", NULL,
                    "malformed HTTP request: no request line within %u ms "
                    "of its first bytes",
                    deadline_ms);
  sl_sbuf body = {0};
  json_t *j = sl__srv_error_json(SL_SRV_FAMILY_OPENAI, &e);
  sl__sbuf_add_json(&body, j);
  json_decref(j);
  char head[160];
  int hl = snprintf(head, sizeof head,
                    "HTTP/1.1 400 Bad Request\r\n"
                    "Content-Type: application/json\r\n"
                    "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                    body.len);
  if (body.oom || hl <= 0 || (size_t)hl >= sizeof head)
    goto fail_body;
  w->answer_len = (size_t)hl + body.len;
  if (!(w->answer = sl_malloc(w->answer_len)))
    goto fail_body;
  memcpy(w->answer, head, (size_t)hl);
  memcpy(w->answer + hl, body.p, body.len);
  sl__sbuf_free(&body);
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  if (pthread_create(&w->thread, NULL, watch_main, w) != 0)
    goto fail_sync;
  return w;

fail_sync:
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  sl_free(w->answer);
  sl_free(w);
  return NULL;
fail_body:
  sl__sbuf_free(&body);
  sl_free(w);
  return NULL;
}

void sl__srv_watch_stop(sl_srv_watch *w) {
  if (!w)
    return;
  pthread_mutex_lock(&w->mu);
  w->stop = true;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  while (w->socks) { /* none once MHD stopped; freed all the same */
    sl_srv_sock *k = w->socks;
    w->socks = k->next;
    sl_free(k);
  }
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  sl_free(w->answer);
  sl_free(w);
}

sl_srv_sock *sl__srv_watch_add(sl_srv_watch *w, int fd) {
  if (!w || fd < 0)
    return NULL;
  sl_srv_sock *k = sl_calloc(1, sizeof *k);
  if (!k)
    return NULL;
  k->fd = fd;
  k->base = 0; /* all its bytes so far are its first request's */
  pthread_mutex_lock(&w->mu);
  k->next = w->socks;
  if (w->socks)
    w->socks->prev = k;
  w->socks = k;
  pthread_mutex_unlock(&w->mu);
  return k;
}

void sl__srv_watch_remove(sl_srv_watch *w, sl_srv_sock *k) {
  if (!w || !k)
    return;
  pthread_mutex_lock(&w->mu);
  if (k->prev)
    k->prev->next = k->next;
  else
    w->socks = k->next;
  if (k->next)
    k->next->prev = k->prev;
  pthread_mutex_unlock(&w->mu);
  sl_free(k);
}

void sl__srv_watch_request(sl_srv_watch *w, sl_srv_sock *k) {
  if (!w || !k)
    return;
  pthread_mutex_lock(&w->mu);
  k->in_request = true;
  pthread_mutex_unlock(&w->mu);
}

void sl__srv_watch_read(sl_srv_watch *w, sl_srv_sock *k) {
  if (!w || !k)
    return;
  pthread_mutex_lock(&w->mu);
  k->base = bytes_received(k->fd);
  k->read = true;
  pthread_mutex_unlock(&w->mu);
}

void sl__srv_watch_idle(sl_srv_watch *w, sl_srv_sock *k) {
  if (!w || !k)
    return;
  pthread_mutex_lock(&w->mu);
  /* a request that ended before it was read whole ends its connection;
   * count what came so far as its own all the same */
  if (!k->read)
    k->base = bytes_received(k->fd);
  k->in_request = k->read = false;
  k->t_bytes = 0;
  pthread_mutex_unlock(&w->mu);
}
