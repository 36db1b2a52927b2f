/* sluice — server: the request watch, for connections libmicrohttpd owns
 * (the front door, door.c, watches them before that). libmicrohttpd waits
 * for a request line until the connection's idle timeout, as long as no
 * line feed comes, and has no deadline for a whole request, only an idle
 * timeout that one byte every few seconds resets. This watch notices bytes
 * that arrived on a connection (the kernel's count, TCP_INFO) and
 *   - made no request line within line_ms: 400;
 *   - made no whole request (head and body) within request_ms of the
 *     request's first byte: 408;
 * answers in JSON (OpenAI's shape: there is no route to choose another),
 * and shuts the socket down, which makes libmicrohttpd close it.
 *
 * The watch's thread also calls the server's tick each round (parked jobs
 * whose client hung up, reply.c).
 *
 * Threads: add / remove / request / read / idle are called by libmicrohttpd's
 * threads; the watch thread scans the list every SL_SRV_WATCH_TICK_MS. An
 * entry's fd is only touched under the mutex, and the entry is removed
 * (under the mutex) before libmicrohttpd closes the fd, so a reused fd
 * number is never written to.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/head.h"
#include "server/json.h"
#include "server/sockwatch.h"
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
  pthread_t thread;
  int efd;     /* hang-ups of parked connections (sl__srv_watch_hangup) */
  int wake[2]; /* stop, and pokes (sl__srv_watch_poke) */
  bool stop;
  unsigned line_ms, request_ms;
  void (*tick)(void *arg);
  void *tick_arg;
  sl_srv_sock *socks;
  sl_sbuf answer_line;    /* the whole 400 response */
  sl_sbuf answer_request; /* the whole 408 response */
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

static void cut(sl_srv_sock *k, const sl_sbuf *answer) {
  k->cut = true;
  ssize_t n = send(k->fd, answer->p, answer->len, MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)n; /* a full send buffer: the client gets the close alone */
  shutdown(k->fd, SHUT_RDWR);
}

static void *watch_main(void *arg) {
  sl_srv_watch *w = arg;
  uint64_t last_scan = 0;
  pthread_mutex_lock(&w->mu);
  while (!w->stop) {
    pthread_mutex_unlock(&w->mu);
    struct epoll_event evs[16];
    int n = epoll_wait(w->efd, evs, 16, SL_SRV_WATCH_TICK_MS);
    bool hangup = false;
    for (int i = 0; i < n; i++) {
      hangup = true; /* a hang-up, or a poke */
      if (evs[i].data.fd == w->wake[0]) {
        char sink[64];
        while (read(w->wake[0], sink, sizeof sink) > 0) {
        }
      }
    }
    pthread_mutex_lock(&w->mu);
    if (w->stop)
      break;
    uint64_t now = sl_now_ns();
    const uint64_t ms = 1000000ull;
    if (now - last_scan >= SL_SRV_WATCH_TICK_MS * ms) {
      last_scan = now;
      for (sl_srv_sock *k = w->socks; k && !w->stop; k = k->next) {
        if (k->cut || k->read)
          continue; /* cut, or its request is in and being answered */
        if (!k->t_bytes) {
          if (bytes_received(k->fd) > k->base)
            k->t_bytes = now;
          continue;
        }
        uint64_t age = now - k->t_bytes;
        if (!k->in_request && age >= (uint64_t)w->line_ms * ms)
          cut(k, &w->answer_line);
        else if (age >= (uint64_t)w->request_ms * ms)
          cut(k, &w->answer_request);
      }
      hangup = true; /* the tick's own scan, every round */
    }
    if (w->tick && hangup) {
      pthread_mutex_unlock(&w->mu);
      w->tick(w->tick_arg);
      pthread_mutex_lock(&w->mu);
    }
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static void make_answer(sl_sbuf *out, int http, const char *code,
                        const char *fmt, unsigned ms) {
  sl_srv_error e;
  sl__srv_error_set(&e, http, code, NULL, fmt, ms);
  sl__srv_raw_error(SL_SRV_FAMILY_OPENAI, &e, out);
}

sl_srv_watch *sl__srv_watch_start(unsigned line_ms, unsigned request_ms,
                                  void (*tick)(void *arg), void *arg) {
  sl_srv_watch *w = sl_calloc(1, sizeof *w);
  if (!w)
    return NULL;
  w->line_ms = line_ms;
  w->request_ms = request_ms;
  w->tick = tick;
  w->tick_arg = arg;
  make_answer(&w->answer_line, 400, "malformed_request",
              "malformed HTTP request: no request line within %u ms of its "
              "first bytes",
              line_ms);
  make_answer(&w->answer_request, 408, "request_timeout",
              "the request did not arrive whole within %u ms of its first "
              "byte",
              request_ms);
  if (w->answer_line.oom || w->answer_request.oom)
    goto fail_body;
  w->wake[0] = w->wake[1] = -1;
  w->efd = epoll_create1(EPOLL_CLOEXEC);
  if (w->efd < 0)
    goto fail_body;
  struct epoll_event wv = {.events = EPOLLIN};
  if (pipe2(w->wake, O_CLOEXEC | O_NONBLOCK) != 0)
    goto fail_fds;
  wv.data.fd = w->wake[0];
  if (epoll_ctl(w->efd, EPOLL_CTL_ADD, w->wake[0], &wv) != 0)
    goto fail_fds;
  pthread_mutex_init(&w->mu, NULL);
  if (pthread_create(&w->thread, NULL, watch_main, w) != 0)
    goto fail_sync;
  return w;

fail_sync:
  pthread_mutex_destroy(&w->mu);
fail_fds:
  close(w->efd);
  if (w->wake[0] >= 0) {
    close(w->wake[0]);
    close(w->wake[1]);
  }
fail_body:
  sl__sbuf_free(&w->answer_line);
  sl__sbuf_free(&w->answer_request);
  sl_free(w);
  return NULL;
}

void sl__srv_watch_stop(sl_srv_watch *w) {
  if (!w)
    return;
  pthread_mutex_lock(&w->mu);
  w->stop = true;
  pthread_mutex_unlock(&w->mu);
  ssize_t n = write(w->wake[1], "x", 1);
  (void)n;
  pthread_join(w->thread, NULL);
  close(w->efd);
  close(w->wake[0]);
  close(w->wake[1]);
  while (w->socks) { /* none once MHD stopped; freed all the same */
    sl_srv_sock *k = w->socks;
    w->socks = k->next;
    sl_free(k);
  }
  pthread_mutex_destroy(&w->mu);
  sl__sbuf_free(&w->answer_line);
  sl__sbuf_free(&w->answer_request);
  sl_free(w);
}

void sl__srv_watch_poke(sl_srv_watch *w) {
  ssize_t n = write(w->wake[1], "p", 1);
  (void)n; /* a full pipe: the tick runs anyway */
}

sl_srv_sock *sl__srv_watch_add(sl_srv_watch *w, int fd, uint64_t t_first) {
  if (!w || fd < 0)
    return NULL;
  sl_srv_sock *k = sl_calloc(1, sizeof *k);
  if (!k)
    return NULL;
  k->fd = fd;
  k->base = 0; /* all its bytes so far are its first request's */
  k->t_bytes = t_first;
  /* the door saw its request line (libmicrohttpd is about to parse it):
   * only the whole-request deadline applies */
  k->in_request = t_first != 0;
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

void sl__srv_watch_hangup(sl_srv_watch *w, int fd, bool on) {
  if (!w || fd < 0)
    return;
  if (on) {
    /* edge-triggered: one wake per hang-up, while it stays registered */
    struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLET, .data.fd = fd};
    epoll_ctl(w->efd, EPOLL_CTL_ADD, fd, &ev);
  } else {
    epoll_ctl(w->efd, EPOLL_CTL_DEL, fd, NULL);
  }
}
