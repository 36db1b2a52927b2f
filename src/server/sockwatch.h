/* sluice — server: the request watch (sockwatch.c): a 400 for bytes that
 * make no line, a 408 past the request deadline, and the parked-job tick. */
#ifndef SLUICE_SERVER_SOCKWATCH_H
#define SLUICE_SERVER_SOCKWATCH_H

#include <stdbool.h>
#include <stdint.h>

/* A connection whose bytes make no request line within this long of their
 * arrival gets a 400 and is closed. */
#define SL_SRV_LINE_DEADLINE_MS 1000

typedef struct sl_srv_watch sl_srv_watch;
typedef struct sl_srv_sock sl_srv_sock;

/* Starts the watch and its thread. Every SL_SRV_WATCH_TICK_MS it cuts the
 * connections past their deadlines (line_ms: bytes but no request line,
 * 400; request_ms: a request's first byte to its last, 408), then calls
 * tick(arg) with no lock held. Returns NULL when out of memory or
 * threads. Stop it with sl__srv_watch_stop once every connection it
 * watches was removed (after MHD_stop_daemon). */
sl_srv_watch *sl__srv_watch_start(unsigned line_ms, unsigned request_ms,
                                  void (*tick)(void *arg), void *arg);
void sl__srv_watch_stop(sl_srv_watch *w);
/* Starts watching a connection's socket; t_first: when its first request's
 * first byte came (0: not yet). Returns its entry, or NULL (not watched)
 * when out of memory; every entry must be removed before its fd closes. */
sl_srv_sock *sl__srv_watch_add(sl_srv_watch *w, int fd, uint64_t t_first);
/* Stops watching and frees k. */
void sl__srv_watch_remove(sl_srv_watch *w, sl_srv_sock *k);
/* A request line was parsed. */
void sl__srv_watch_request(sl_srv_watch *w, sl_srv_sock *k);
/* The request in progress was read whole: no deadline until the next. */
void sl__srv_watch_read(sl_srv_watch *w, sl_srv_sock *k);
/* The request completed (the connection is idle, or closes). */
void sl__srv_watch_idle(sl_srv_watch *w, sl_srv_sock *k);
/* on: wake the tick as soon as fd's client hangs up (a parked job's
 * connection, which libmicrohttpd does not poll); off: before fd closes.
 * Without it the tick still runs every SL_SRV_WATCH_TICK_MS. */
void sl__srv_watch_hangup(sl_srv_watch *w, int fd, bool on);
/* Runs the tick soon (the detached answers' news, detach.c). Any thread;
 * never blocks. */
void sl__srv_watch_poke(sl_srv_watch *w);

#endif
