/* sluice — server: the replies (reply.c): answers queued on a connection,
 * the SSE stream, parking a connection while its job runs and waking it
 * on the job's news, the hang-up watch's tick over parked jobs, the CORS
 * preflight and the dashboard page.
 *
 * Threads: every sl__srv_send_*, park and stream call runs on the pool
 * thread of the connection it answers (libmicrohttpd's rule), inside an
 * sl__srv_reply_scope. sl__srv_reply_wake runs wherever a job has news
 * (the executor, the stopping thread); sl__srv_reap_parked on the watch's
 * thread; sl__srv_unpark_all on the stopping thread. */
#ifndef SLUICE_SERVER_REPLY_H
#define SLUICE_SERVER_REPLY_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

#include "server/job.h"
#include "server/json.h"
#include "server/state.h"

/* The request this pool thread answers from here on (NULL: none): every
 * response queued meanwhile carries its id and CORS headers, and
 * `anthropic` adds request-id. Borrowed until the next call. */
void sl__srv_reply_scope(const sl_srv_hdrs *h, bool anthropic);
/* The headers every answer to request `h` carries (its id, CORS), each
 * passed to add(arg, name, value). */
void sl__srv_std_headers(const sl_srv_hdrs *h, bool anthropic,
                         void (*add)(void *arg, const char *name,
                                     const char *value),
                         void *arg);
/* Retry-After seconds for an error answer (0: none): a 503 says when to
 * retry, 5 s after a queue timeout, else 1 s. */
unsigned sl__srv_retry_after(const sl_srv_error *e);

/* What a client's socket shows of its peer, without reading: open, shut
 * (a FIN: the peer shut its sending side, or closed), gone (a reset, or
 * both sides shut). */
enum { SL_SRV_PEER_OPEN, SL_SRV_PEER_SHUT, SL_SRV_PEER_GONE };
int sl__srv_peer_state(int fd);

/* Queues data[0..len) (copied) with status and content type; close adds
 * Connection: close; retry_after_s > 0 a Retry-After header. */
enum MHD_Result sl__srv_send_bytes(struct MHD_Connection *c, unsigned status,
                                   const char *ctype, const char *data,
                                   size_t len, bool close,
                                   unsigned retry_after_s);
/* Queues `j` as JSON (its reference is taken over; NULL: a 500). */
enum MHD_Result sl__srv_send_json(struct MHD_Connection *c, unsigned status,
                                  json_t *j, bool close,
                                  unsigned retry_after_s);
/* Queues *e in fam's shape. A 503 (shutting down, queue timeout, out of
 * memory: the request was fine, the server could not serve it now) says
 * when to retry: 5 s after a queue timeout, else 1 s. */
enum MHD_Result sl__srv_send_error(struct MHD_Connection *c, sl_srv_family fam,
                                   const sl_srv_error *e, bool close);
/* A CORS preflight (OPTIONS on a known route): 204. */
enum MHD_Result sl__srv_send_preflight(struct MHD_Connection *c);
/* GET /admin: the dashboard. */
enum MHD_Result sl__srv_send_page(struct MHD_Connection *c);
/* A done job's whole answer in its API's shape (j->mu held; new reference,
 * NULL when out of memory). */
json_t *sl__srv_answer_body(sl_srv_job *j);
/* Has the job's SSE bytes ready in j->out (j->mu held): SL_SRV_SSE_BYTES
 * when there are some (j->out from j->out_off), SL_SRV_SSE_END when the
 * stream is complete, SL_SRV_SSE_WAIT until the job's next event,
 * SL_SRV_SSE_OOM when they could not be made. */
enum { SL_SRV_SSE_BYTES, SL_SRV_SSE_END, SL_SRV_SSE_WAIT, SL_SRV_SSE_OOM };
int sl__srv_sse_next(sl_srv_job *j);
/* Queues the job's SSE stream (the response takes a reference). */
enum MHD_Result sl__srv_send_stream(struct MHD_Connection *c, sl_srv_job *j);

/* Parks the job's connection until the job's next news (j->mu held;
 * called from a handler of that connection). */
void sl__srv_park(sl_srv_job *j);
/* A handler of the job's connection runs again (j->mu held). */
void sl__srv_unparked(sl_srv_job *j);
/* Resumes the job's parked connection, once (j->mu held): the registry's
 * notify hook. */
void sl__srv_reply_wake(sl_srv_job *j);
/* The watch's tick (arg: the server): aborts the parked jobs whose client
 * hung up. */
void sl__srv_reap_parked(void *arg);
/* From here on no handler parks; every parked connection is resumed, and
 * this waits until each is back in a handler (2 s at most), and for the
 * requests waiting for a model's load. */
void sl__srv_unpark_all(sl_server_t *s);

#endif
