/* sluice — server: answers to clients that half-closed (detach.c).
 *
 * Threads: sl__srv_detach runs on the pool thread that completes the
 * connection (http.c's on_completed); sl__srv_detached_pump on the watch's
 * thread (its tick); sl__srv_detached_free on the stopping thread, after
 * the watch stopped. */
#ifndef SLUICE_SERVER_DETACH_H
#define SLUICE_SERVER_DETACH_H

#include <stdbool.h>

#include "server/state.h"

/* libmicrohttpd is closing connection fd (the socket still open) with its
 * request's answer not yet sent: when the client only shut its sending
 * side, takes the job over (the connection's reference and its open
 * response) and answers it on a dup of the socket. true when taken. */
bool sl__srv_detach(sl_server_t *s, sl_srv_conn *cn, int fd);
/* Writes what the detached jobs have ready; ends those answered or whose
 * client is gone. */
void sl__srv_detached_pump(sl_server_t *s);
/* At the stop: ends every detached answer still open (its job stopped). */
void sl__srv_detached_free(sl_server_t *s);

#endif
