/* sluice — server: the generation and embeddings routes (generate.c):
 * /v1/chat/completions, /v1/completions, /v1/messages, /v1/embeddings,
 * from the parsed body to the queued answer, and the wait for a model's
 * load. Each runs on the pool thread of the request's connection. */
#ifndef SLUICE_SERVER_GENERATE_H
#define SLUICE_SERVER_GENERATE_H

#include <microhttpd.h>
#include <stdbool.h>

#include "server/state.h"

/* A whole request body on a generation route: parsed, tokenized and
 * posted to the engine, then handled as sl__srv_generate_next; or
 * answered with its error. */
enum MHD_Result sl__srv_generate(sl_server_t *s, struct MHD_Connection *c,
                                 sl_srv_conn *cn);
/* A posted request's handler, after each resume: parks the connection
 * until there is an answer to give (the job is done; or, when streaming,
 * it started, so that a request refused before its first token still gets
 * its error status), then queues it. */
enum MHD_Result sl__srv_generate_next(sl_server_t *s, struct MHD_Connection *c,
                                      sl_srv_conn *cn);
/* When the request's model is known and not loaded, parks the connection
 * until its load ends (true; the resume sets cn->load_err); false: handle
 * it now. */
bool sl__srv_park_for_load(sl_server_t *s, struct MHD_Connection *c,
                           sl_srv_conn *cn);

#endif
