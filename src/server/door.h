/* sluice — server: the front door (door.c): accept, connection limits, the
 * first head. */
#ifndef SLUICE_SERVER_DOOR_H
#define SLUICE_SERVER_DOOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sockaddr;
struct sl_srv_cidr;

typedef struct sl_srv_door sl_srv_door;

typedef struct sl_srv_door_cfg {
  const struct sockaddr *addr; /* where to listen */
  unsigned addrlen;
  unsigned max_conns;  /* open connections, all clients */
  unsigned max_per_ip; /* open connections per client address (0: any) */
  unsigned idle_ms;    /* a new connection that sends nothing: closed */
  unsigned line_ms;    /* bytes with no line end: 400 */
  unsigned head_ms;    /* first byte to whole head: 408 */
  uint64_t max_body;   /* a chunked body's first chunk declaring more: 413 */
  /* proxies (--trusted-proxy): a connection from one is not limited per
   * address until it names its client (a PROXY header, or the first
   * head's X-Forwarded-For); then it counts as that client's */
  const struct sl_srv_cidr *trusted;
  size_t n_trusted;
  /* hands a connection whose first head is whole (and valid) on; false
   * when it was not taken (the socket is closed then) */
  bool (*hand)(void *arg, int fd, const struct sockaddr *a, unsigned alen);
  void *arg;
  /* set to the door before its thread starts, so that whoever the door
   * hands a connection to can read it there (NULL: not published) */
  sl_srv_door **publish;
} sl_srv_door_cfg;

typedef struct sl_srv_door_stats {
  uint64_t refused_total;  /* over max_conns (or out of fds) */
  uint64_t refused_per_ip; /* over max_per_ip */
  uint64_t head_errors;    /* answered 400/414/431/505 at the door */
  uint64_t head_timeouts;  /* answered 408 at the door */
  uint64_t handed;         /* passed on to libmicrohttpd */
  uint64_t forwarded;      /* from a trusted proxy, counted as its client */
  unsigned live;           /* connections open now */
} sl_srv_door_stats;

/* Binds, listens and starts the door's thread; *port gets the bound port.
 * NULL with a message in err on failure. */
sl_srv_door *sl__srv_door_start(const sl_srv_door_cfg *cfg, int *port,
                                char *err, size_t errcap);
/* Stops accepting: closes the listening socket and every connection not
 * yet handed on, and joins the thread. Handed connections stay counted
 * until released. */
void sl__srv_door_close(sl_srv_door *d);
/* Frees the door (closing it first); after libmicrohttpd stopped. */
void sl__srv_door_free(sl_srv_door *d);
/* A handed connection's socket is about to be closed. */
void sl__srv_door_release(sl_srv_door *d, int fd);
/* A handed connection's socket lives on as `to` (a dup of `from`, which
 * libmicrohttpd is about to close): it stays counted under `to` until
 * released. false when `to` cannot be tracked (the caller closes it). */
bool sl__srv_door_move(sl_srv_door *d, int from, int to);
/* When the first byte of a handed connection came (sl_now_ns; 0: unknown). */
uint64_t sl__srv_door_first_byte(sl_srv_door *d, int fd);
void sl__srv_door_stats_get(sl_srv_door *d, sl_srv_door_stats *out);

#endif
