/* sluice — server: the front door.
 *
 * One thread owns the listening socket and every new connection until its
 * first request head has arrived whole. It accepts, refuses at once what
 * is over the limits (all connections, connections per client address),
 * and watches the new sockets with epoll, edge-triggered: on each arrival
 * it peeks (MSG_PEEK, nothing is consumed) at what came so far and checks
 * it (head.c). A valid head hands the socket to libmicrohttpd, which then
 * reads it from the first byte; anything else is answered here, in JSON,
 * and closed:
 *
 *   bytes that cannot start a request (TLS, garbage)      400 at once
 *   bytes with no line end within line_ms                 400
 *   a head not whole within head_ms of its first byte     408 (slowloris)
 *   no further byte of a head for idle_ms                 408
 *   a head over SL_SRV_HEAD_MAX, a long target, HTTP/2    431, 414, 505
 *   a chunked body's first chunk over the body limit     413
 *   no byte at all within idle_ms                         closed
 *
 * So a slow or idle client costs one socket and one list entry, no thread;
 * libmicrohttpd (a small thread pool) sees only connections that
 * sent a whole head.
 *
 * Accounting: a connection counts against the limits from accept until it
 * is closed, here or (after the hand-off) by libmicrohttpd, whose close
 * notification calls sl__srv_door_release. Counters and the per-address
 * table are under `mu` (the door thread and libmicrohttpd's threads).
 *
 * Behind a proxy (cfg.trusted, --trusted-proxy): a connection from a
 * trusted address counts against max_conns only, until it names its client:
 * a PROXY protocol header (v1 or v2, before any HTTP byte; consumed here,
 * so libmicrohttpd reads from the head on) or, without one, the first
 * head's X-Forwarded-For (proxy.c). Then it is re-counted as that client's
 * (over max_per_ip: 429), and libmicrohttpd is given the client's address.
 * From any other address neither is read: a PROXY line is a bad head (400)
 * and X-Forwarded-For is an ordinary field.
 *
 * An answered connection lingers: its write side is shut, what the client
 * still sends is read and dropped, and it is closed at the client's EOF or
 * after SL_DOOR_LINGER_MS, so that closing with unread bytes does not
 * reset the connection before the client has read the answer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/door.h"
#include "server/head.h"
#include "server/json.h"
#include "server/proxy.h"
#include "sluice/util.h"

#define SL_DOOR_TICK_MS   50
#define SL_DOOR_LINGER_MS 1000
#define SL_DOOR_BUCKETS   4096 /* per-address table */

typedef struct ip_node {
  uint8_t addr[16]; /* IPv6, IPv4 as ::ffff:a.b.c.d */
  unsigned count;
  struct ip_node *next;
} ip_node;

typedef struct pend {
  int fd;
  bool lingering;
  bool line_seen;    /* a line end came */
  uint64_t t_accept; /* ns */
  uint64_t t_first;  /* first byte seen (0: none yet) */
  uint64_t t_last;   /* bytes last arrived */
  uint64_t t_linger; /* lingering since */
  bool trusted;      /* from a --trusted-proxy address */
  bool proxy_seen;   /* trusted: a PROXY header was read, or cannot come */
  bool named;        /* trusted: counted as the client it named */
  struct sockaddr_storage addr;
  socklen_t alen;
  struct pend *prev, *next;
} pend;

typedef struct fd_slot {
  ip_node *ip; /* NULL: the fd is not one of ours */
  uint64_t t_first;
} fd_slot;

struct sl_srv_door {
  sl_srv_door_cfg cfg;
  int lfd, efd, wake[2];
  pthread_t thread;
  bool started;
  atomic_bool stop;
  pend *pends;
  char *buf; /* peek buffer: a head and a first chunk line */

  pthread_mutex_t mu; /* the fields below */
  ip_node *buckets[SL_DOOR_BUCKETS];
  fd_slot *slots;
  int n_slots;
  unsigned n_live; /* connections counted against the limits */
  sl_srv_door_stats st;
};

static void addr_key(const struct sockaddr_storage *a, uint8_t key[16]) {
  memset(key, 0, 16);
  if (a->ss_family == AF_INET) {
    const struct sockaddr_in *v4 = (const struct sockaddr_in *)a;
    key[10] = key[11] = 0xFF;
    memcpy(key + 12, &v4->sin_addr, 4);
  } else if (a->ss_family == AF_INET6) {
    memcpy(key, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
  }
}

static unsigned bucket_of(const uint8_t key[16]) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < 16; i++)
    h = (h ^ key[i]) * 0x100000001b3ull;
  return (unsigned)(h >> 20) % SL_DOOR_BUCKETS;
}

/* The node of address `key`, counted once more: NULL (*why set) when it
 * is over max_per_ip (unless `trusted`) or out of memory. Under mu. */
static ip_node *count_addr(sl_srv_door *d, const uint8_t key[16], bool trusted,
                           const char **why) {
  unsigned b = bucket_of(key);
  ip_node *n = d->buckets[b];
  while (n && memcmp(n->addr, key, 16) != 0)
    n = n->next;
  if (n && !trusted && d->cfg.max_per_ip && n->count >= d->cfg.max_per_ip) {
    d->st.refused_per_ip++;
    *why = "per-address";
    return NULL;
  }
  if (!n) {
    if (!(n = sl_calloc(1, sizeof *n))) {
      d->st.refused_total++;
      *why = "out of memory";
      return NULL;
    }
    memcpy(n->addr, key, 16);
    n->next = d->buckets[b];
    d->buckets[b] = n;
  }
  n->count++;
  return n;
}

/* Under mu: one count less for n, freed at zero. */
static void uncount_addr(sl_srv_door *d, ip_node *n) {
  if (--n->count)
    return;
  ip_node **pp = &d->buckets[bucket_of(n->addr)];
  while (*pp != n)
    pp = &(*pp)->next;
  *pp = n->next;
  sl_free(n);
}

/* Counts a new connection from `key` under the limits (a trusted proxy's
 * under max_conns only). Returns its address node, or NULL (*why set) when
 * refused. Under mu. */
static ip_node *admit(sl_srv_door *d, const uint8_t key[16], bool trusted,
                      const char **why) {
  if (d->n_live >= d->cfg.max_conns) {
    d->st.refused_total++;
    *why = "total";
    return NULL;
  }
  ip_node *n = count_addr(d, key, trusted, why);
  if (n)
    d->n_live++;
  return n;
}

/* Under mu. */
static void unadmit(sl_srv_door *d, ip_node *n) {
  d->n_live--;
  uncount_addr(d, n);
}

/* A trusted proxy's connection p named its client `key`: it counts as the
 * client's from now on, and libmicrohttpd gets that address. false when
 * the client is over max_per_ip (p stays counted as the proxy's). */
static bool rename_client(sl_srv_door *d, pend *p, const uint8_t key[16]) {
  const char *why = NULL;
  bool ok = false;
  pthread_mutex_lock(&d->mu);
  ip_node *n = count_addr(d, key, false, &why);
  if (n) {
    uncount_addr(d, d->slots[p->fd].ip);
    d->slots[p->fd].ip = n;
    d->st.forwarded++;
    ok = true;
  }
  pthread_mutex_unlock(&d->mu);
  if (!ok)
    return false;
  p->named = true;
  memset(&p->addr, 0, sizeof p->addr);
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  if (memcmp(key, mapped, 12) == 0) {
    struct sockaddr_in *v4 = (struct sockaddr_in *)&p->addr;
    v4->sin_family = AF_INET;
    memcpy(&v4->sin_addr, key + 12, 4);
    p->alen = sizeof *v4;
  } else {
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&p->addr;
    v6->sin6_family = AF_INET6;
    memcpy(&v6->sin6_addr, key, 16);
    p->alen = sizeof *v6;
  }
  return true;
}

static void release_fd(sl_srv_door *d, int fd) {
  pthread_mutex_lock(&d->mu);
  if (fd >= 0 && fd < d->n_slots && d->slots[fd].ip) {
    unadmit(d, d->slots[fd].ip);
    d->slots[fd].ip = NULL;
    d->slots[fd].t_first = 0;
  }
  pthread_mutex_unlock(&d->mu);
}

static void pend_unlink(sl_srv_door *d, pend *p) {
  if (p->prev)
    p->prev->next = p->next;
  else
    d->pends = p->next;
  if (p->next)
    p->next->prev = p->prev;
}

/* Closes a connection that never reached libmicrohttpd. */
static void pend_close(sl_srv_door *d, pend *p) {
  pend_unlink(d, p);
  epoll_ctl(d->efd, EPOLL_CTL_DEL, p->fd, NULL);
  release_fd(d, p->fd);
  close(p->fd);
  sl_free(p);
}

/* Answers `e` and lingers. */
static void pend_answer(sl_srv_door *d, pend *p, sl_srv_family fam,
                        const sl_srv_error *e) {
  sl_sbuf b = {0};
  sl__srv_raw_error(fam, e, &b);
  if (!b.oom) {
    ssize_t n = send(p->fd, b.p, b.len, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n; /* a full send buffer: the client gets the close alone */
  }
  sl__sbuf_free(&b);
  pthread_mutex_lock(&d->mu);
  if (e->http == 408)
    d->st.head_timeouts++;
  else
    d->st.head_errors++;
  pthread_mutex_unlock(&d->mu);
  shutdown(p->fd, SHUT_WR);
  p->lingering = true;
  p->t_linger = sl_now_ns();
}

static void pend_drain(sl_srv_door *d, pend *p) {
  char sink[4096];
  for (;;) {
    ssize_t n = recv(p->fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n > 0)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      return;
    pend_close(d, p); /* EOF or an error */
    return;
  }
}

static void pend_hand(sl_srv_door *d, pend *p) {
  pend_unlink(d, p);
  epoll_ctl(d->efd, EPOLL_CTL_DEL, p->fd, NULL);
  /* libmicrohttpd takes blocking-agnostic sockets; it sets its own flags */
  pthread_mutex_lock(&d->mu);
  d->slots[p->fd].t_first = p->t_first;
  d->st.handed++;
  pthread_mutex_unlock(&d->mu);
  int fd = p->fd;
  struct sockaddr_storage a = p->addr;
  socklen_t alen = p->alen;
  sl_free(p);
  /* on failure libmicrohttpd has closed the socket: uncount it here */
  if (!d->cfg.hand(d->cfg.arg, fd, (const struct sockaddr *)&a, alen))
    release_fd(d, fd);
}

/* The answer to a connection whose named client is over max_per_ip. */
static void over_limit(const sl_srv_door *d, sl_srv_error *e) {
  sl__srv_error_set(e, 429, "too_many_connections", NULL,
                    "too many open connections from the client address the "
                    "proxy named (--max-conns-per-ip %u)",
                    d->cfg.max_per_ip);
}

/* A trusted proxy's connection before its first HTTP byte: a PROXY header
 * among the n bytes peeked into d->buf is consumed and names the client.
 * SL_SRV_HEAD_OK when HTTP bytes may follow (the header was read, or there
 * is none); otherwise p waits for more, or was answered or closed. */
static int proxy_read(sl_srv_door *d, pend *p, size_t n, bool hup) {
  size_t len;
  uint8_t client[16];
  bool has;
  sl_srv_error e;
  int r = sl__srv_proxy_check((const uint8_t *)d->buf, n, &len, client, &has);
  if (r == SL_SRV_PROXY_NONE) {
    p->proxy_seen = true;
    return SL_SRV_HEAD_OK;
  }
  if (r == SL_SRV_HEAD_MORE) {
    if (hup)
      pend_close(d, p);
    return r;
  }
  if (r == SL_SRV_HEAD_BAD) {
    sl__srv_error_set(&e, 400, "malformed_request", NULL,
                      "malformed PROXY protocol header");
    pend_answer(d, p, SL_SRV_FAMILY_OPENAI, &e);
    return r;
  }
  /* consume it: libmicrohttpd reads from the first HTTP byte; the bytes
   * were peeked, so this recv takes exactly them */
  char sink[512];
  while (len) {
    ssize_t got =
        recv(p->fd, sink, len < sizeof sink ? len : sizeof sink, MSG_DONTWAIT);
    if (got <= 0) {
      pend_close(d, p);
      return SL_SRV_HEAD_BAD;
    }
    len -= (size_t)got;
  }
  p->proxy_seen = true;
  /* the request's clocks start now: a proxy that connects when its client
   * does sends the header at once, and the client may stay idle */
  p->t_accept = sl_now_ns();
  p->t_first = p->t_last = 0;
  if (has && !rename_client(d, p, client)) {
    over_limit(d, &e);
    pend_answer(d, p, SL_SRV_FAMILY_OPENAI, &e);
    return SL_SRV_HEAD_BAD;
  }
  if (!has)
    p->named = true; /* LOCAL or UNKNOWN: the proxy's own connection */
  return SL_SRV_HEAD_OK;
}

/* New bytes (or EOF) on a waiting connection. */
static void pend_read(sl_srv_door *d, pend *p, bool hup) {
  if (p->lingering) {
    pend_drain(d, p);
    return;
  }
  ssize_t n = recv(p->fd, d->buf, SL_SRV_HEAD_MAX + SL_SRV_CHUNK_LINE_MAX,
                   MSG_PEEK | MSG_DONTWAIT);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      pend_close(d, p);
    return;
  }
  if (n == 0) { /* the client left before a whole head */
    pend_close(d, p);
    return;
  }
  p->t_last = sl_now_ns();
  if (!p->t_first)
    p->t_first = p->t_last;
  sl_srv_head_info hi;
  sl_srv_error e;
  if (p->trusted && !p->proxy_seen) {
    int r = proxy_read(d, p, (size_t)n, hup);
    if (r != SL_SRV_HEAD_OK)
      return; /* more to come, or answered */
    n = recv(p->fd, d->buf, SL_SRV_HEAD_MAX + SL_SRV_CHUNK_LINE_MAX,
             MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0) { /* the header alone so far */
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        pend_close(d, p);
      return;
    }
    if (!p->t_first) /* HTTP bytes after the header */
      p->t_first = p->t_last = sl_now_ns();
  }
  int r = sl__srv_head_check(d->buf, (size_t)n, &hi, &e);
  if (memchr(d->buf, '\n', (size_t)n))
    p->line_seen = true;
  /* a chunked body's first chunk line too: a size past the body limit is
   * refused here (libmicrohttpd would wait for those bytes until the
   * request's deadline); not when the client waits for "100 Continue"
   * before its body, which libmicrohttpd sends */
  if (r == SL_SRV_HEAD_OK && hi.chunked && !hi.expect)
    r = sl__srv_chunk_check(d->buf + hi.len, (size_t)n - hi.len,
                            d->cfg.max_body, &e);
  uint8_t client[16];
  if (r == SL_SRV_HEAD_OK && p->trusted && !p->named &&
      sl__srv_xff_client(d->buf, hi.len, d->cfg.trusted, d->cfg.n_trusted,
                         client) &&
      !rename_client(d, p, client)) {
    over_limit(d, &e);
    r = SL_SRV_HEAD_BAD;
  }
  if (r == SL_SRV_HEAD_OK)
    pend_hand(d, p);
  else if (r == SL_SRV_HEAD_MORE && hup)
    pend_close(d, p); /* its side is shut: the head can never be whole */
  else if (r == SL_SRV_HEAD_BAD)
    pend_answer(d, p,
                hi.anthropic ? SL_SRV_FAMILY_ANTHROPIC : SL_SRV_FAMILY_OPENAI,
                &e);
}

static void accept_all(sl_srv_door *d) {
  for (;;) {
    struct sockaddr_storage a;
    socklen_t alen = sizeof a;
    int fd = accept4(d->lfd, (struct sockaddr *)&a, &alen,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      if (errno == EMFILE || errno == ENFILE) {
        pthread_mutex_lock(&d->mu);
        d->st.refused_total++;
        pthread_mutex_unlock(&d->mu);
      }
      return; /* EAGAIN, or out of fds: the backlog waits */
    }
    const char *why = NULL;
    uint8_t key[16];
    addr_key(&a, key);
    bool trusted = sl__srv_cidr_any(d->cfg.trusted, d->cfg.n_trusted, key);
    pthread_mutex_lock(&d->mu);
    ip_node *n = NULL;
    if (fd >= d->n_slots) {
      d->st.refused_total++;
      why = "file descriptors";
    } else if ((n = admit(d, key, trusted, &why))) {
      d->slots[fd].ip = n;
      d->slots[fd].t_first = 0;
    }
    pthread_mutex_unlock(&d->mu);
    pend *p = n ? sl_calloc(1, sizeof *p) : NULL;
    if (!p) {
      if (n)
        release_fd(d, fd);
      /* refused at once: an RST, not a connection that hangs */
      struct linger lg = {.l_onoff = 1, .l_linger = 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
      close(fd);
      continue;
    }
    p->fd = fd;
    p->trusted = trusted;
    p->addr = a;
    p->alen = alen;
    p->t_accept = sl_now_ns();
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET,
                             .data.ptr = p};
    if (epoll_ctl(d->efd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      release_fd(d, fd);
      close(fd);
      sl_free(p);
      continue;
    }
    p->next = d->pends;
    if (d->pends)
      d->pends->prev = p;
    d->pends = p;
    /* bytes may have come before the registration: look now */
    pend_read(d, p, false);
  }
}

static void sweep(sl_srv_door *d) {
  uint64_t now = sl_now_ns();
  const uint64_t ms = 1000000ull;
  for (pend *p = d->pends, *nx; p; p = nx) {
    nx = p->next;
    sl_srv_error e;
    if (p->lingering) {
      if (now - p->t_linger >= SL_DOOR_LINGER_MS * ms)
        pend_close(d, p);
    } else if (!p->t_first) {
      if (now - p->t_accept >= (uint64_t)d->cfg.idle_ms * ms)
        pend_close(d, p);
    } else if (!p->line_seen &&
               now - p->t_first >= (uint64_t)d->cfg.line_ms * ms) {
      sl__srv_error_set(&e, 400, "malformed_request", NULL,
                        "malformed HTTP request: no request line within %u "
                        "ms of its first bytes",
                        d->cfg.line_ms);
      pend_answer(d, p, SL_SRV_FAMILY_OPENAI, &e);
    } else if (now - p->t_first >= (uint64_t)d->cfg.head_ms * ms) {
      sl__srv_error_set(&e, 408, "request_timeout", NULL,
                        "the request head did not arrive within %u ms of "
                        "its first byte",
                        d->cfg.head_ms);
      pend_answer(d, p, SL_SRV_FAMILY_OPENAI, &e);
    } else if (now - p->t_last >= (uint64_t)d->cfg.idle_ms * ms) {
      sl__srv_error_set(&e, 408, "request_timeout", NULL,
                        "no byte of the request head for %u ms",
                        d->cfg.idle_ms);
      pend_answer(d, p, SL_SRV_FAMILY_OPENAI, &e);
    }
  }
}

static void *door_main(void *arg) {
  sl_srv_door *d = arg;
  struct epoll_event evs[64];
  uint64_t last_sweep = sl_now_ns();
  while (!atomic_load(&d->stop)) {
    int n = epoll_wait(d->efd, evs, 64, SL_DOOR_TICK_MS);
    for (int i = 0; i < n; i++) {
      void *ptr = evs[i].data.ptr;
      if (ptr == &d->lfd)
        accept_all(d);
      else if (ptr != &d->wake)
        pend_read(d, ptr, (evs[i].events & (EPOLLRDHUP | EPOLLHUP)) != 0);
    }
    uint64_t now = sl_now_ns();
    if (now - last_sweep >= SL_DOOR_TICK_MS * 1000000ull) {
      sweep(d);
      last_sweep = now;
    }
  }
  while (d->pends)
    pend_close(d, d->pends);
  return NULL;
}

/* Raises the soft limit on open files toward the hard one so that
 * max_conns sockets fit; returns the limit in effect. */
static rlim_t raise_nofile(rlim_t want) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return 1024;
  if (rl.rlim_cur < want) {
    rlim_t to =
        rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    struct rlimit nr = {.rlim_cur = to, .rlim_max = rl.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &nr) == 0)
      rl.rlim_cur = to;
  }
  return rl.rlim_cur;
}

sl_srv_door *sl__srv_door_start(const sl_srv_door_cfg *cfg, int *port,
                                char *err, size_t errcap) {
  sl_srv_door *d = sl_calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errcap, "out of memory");
    return NULL;
  }
  d->cfg = *cfg;
  d->lfd = d->efd = d->wake[0] = d->wake[1] = -1;
  pthread_mutex_init(&d->mu, NULL);
  /* every connection, the pool's threads, the model, logs: some spare */
  rlim_t lim = raise_nofile((rlim_t)cfg->max_conns + 256);
  if (lim < (rlim_t)cfg->max_conns + 64) {
    unsigned fit = lim > 128 ? (unsigned)lim - 64 : 64;
    SL_LOGW("server: the open-file limit (%llu) holds %u connections, not "
            "%u: serving at most %u",
            (unsigned long long)lim, fit, cfg->max_conns, fit);
    d->cfg.max_conns = fit;
  }
  d->n_slots = lim > (1u << 20) ? (1 << 20) : (int)lim;
  d->slots = sl_calloc((size_t)d->n_slots, sizeof *d->slots);
  d->buf = sl_malloc(SL_SRV_HEAD_MAX + SL_SRV_CHUNK_LINE_MAX);
  if (!d->slots || !d->buf) {
    snprintf(err, errcap, "out of memory");
    goto fail;
  }
  d->lfd = socket(cfg->addr->sa_family,
                  SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (d->lfd < 0 ||
      setsockopt(d->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(d->lfd, cfg->addr, cfg->addrlen) != 0 || listen(d->lfd, 1024) != 0) {
    snprintf(err, errcap, "%s", strerror(errno));
    goto fail;
  }
  struct sockaddr_storage bound;
  socklen_t bl = sizeof bound;
  if (getsockname(d->lfd, (struct sockaddr *)&bound, &bl) == 0)
    *port = ntohs(bound.ss_family == AF_INET6
                      ? ((struct sockaddr_in6 *)&bound)->sin6_port
                      : ((struct sockaddr_in *)&bound)->sin_port);
  d->efd = epoll_create1(EPOLL_CLOEXEC);
  if (d->efd < 0 || pipe2(d->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    snprintf(err, errcap, "%s", strerror(errno));
    goto fail;
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &d->lfd};
  struct epoll_event wv = {.events = EPOLLIN, .data.ptr = &d->wake};
  if (epoll_ctl(d->efd, EPOLL_CTL_ADD, d->lfd, &ev) != 0 ||
      epoll_ctl(d->efd, EPOLL_CTL_ADD, d->wake[0], &wv) != 0) {
    snprintf(err, errcap, "%s", strerror(errno));
    goto fail;
  }
  if (cfg->publish)
    *cfg->publish = d;
  if (pthread_create(&d->thread, NULL, door_main, d) != 0) {
    snprintf(err, errcap, "cannot start a thread");
    goto fail;
  }
  d->started = true;
  return d;
fail:
  if (cfg->publish)
    *cfg->publish = NULL;
  sl__srv_door_free(d);
  return NULL;
}

void sl__srv_door_close(sl_srv_door *d) {
  if (!d || !d->started)
    return;
  atomic_store(&d->stop, true);
  ssize_t n = write(d->wake[1], "x", 1);
  (void)n;
  pthread_join(d->thread, NULL);
  d->started = false;
  close(d->lfd);
  d->lfd = -1;
}

void sl__srv_door_free(sl_srv_door *d) {
  if (!d)
    return;
  sl__srv_door_close(d);
  if (d->lfd >= 0)
    close(d->lfd);
  if (d->efd >= 0)
    close(d->efd);
  if (d->wake[0] >= 0) {
    close(d->wake[0]);
    close(d->wake[1]);
  }
  for (int b = 0; b < SL_DOOR_BUCKETS; b++)
    while (d->buckets[b]) {
      ip_node *n = d->buckets[b];
      d->buckets[b] = n->next;
      sl_free(n);
    }
  pthread_mutex_destroy(&d->mu);
  sl_free(d->slots);
  sl_free(d->buf);
  sl_free(d);
}

void sl__srv_door_release(sl_srv_door *d, int fd) {
  if (d)
    release_fd(d, fd);
}

bool sl__srv_door_move(sl_srv_door *d, int from, int to) {
  bool ok = false;
  pthread_mutex_lock(&d->mu);
  if (from >= 0 && from < d->n_slots && to >= 0 && to < d->n_slots &&
      d->slots[from].ip && !d->slots[to].ip) {
    d->slots[to] = d->slots[from];
    d->slots[from].ip = NULL;
    d->slots[from].t_first = 0;
    ok = true;
  }
  pthread_mutex_unlock(&d->mu);
  return ok;
}

uint64_t sl__srv_door_first_byte(sl_srv_door *d, int fd) {
  uint64_t t = 0;
  if (!d)
    return 0;
  pthread_mutex_lock(&d->mu);
  if (fd >= 0 && fd < d->n_slots)
    t = d->slots[fd].t_first;
  pthread_mutex_unlock(&d->mu);
  return t;
}

void sl__srv_door_stats_get(sl_srv_door *d, sl_srv_door_stats *out) {
  memset(out, 0, sizeof *out);
  if (!d)
    return;
  pthread_mutex_lock(&d->mu);
  *out = d->st;
  out->live = d->n_live;
  pthread_mutex_unlock(&d->mu);
}
