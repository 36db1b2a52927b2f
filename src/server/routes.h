/* sluice — server: the models a request leases, and the routes that
 * generate nothing: /v1/models, count_tokens, /tokenize, /detokenize,
 * /apply-template, the admin model actions (routes.c). */
#ifndef SLUICE_SERVER_ROUTES_H
#define SLUICE_SERVER_ROUTES_H

#include <jansson.h>
#include <stddef.h>

#include "server/job.h"
#include "server/json.h"
#include "server/parse.h"
#include "sluice/pool.h"
#include "sluice/server.h"

/* What the parser checks a request of this server against: the
 * model it names is leased into *m (released by sl__srv_model_release). */
sl_srv_limits sl__srv_limits_of(sl_server_t *s, sl_srv_model *m);
/* Leases the model `name` ("default": the first) into *m, loading it if
 * needed; on failure *err holds the answer (404: no such model; 503: it
 * cannot be loaded now). */
sl_status sl__srv_model_acquire(sl_server_t *s, const char *name,
                                sl_srv_model *m, sl_srv_error *err);
/* The pool entry a request's "model" names ("default": the first), or -1. */
int sl__srv_model_index(sl_server_t *s, const char *id);
/* The answer to a pool load that failed with `st` (why: the pool's words):
 * 404, 503 insufficient_memory, or 500 model_load_failed. */
void sl__srv_load_error(sl_status st, const char *name, const char *why,
                        sl_srv_error *err);
/* routes.c: the routes that generate nothing. On failure each fills *err
 * (the status and body to answer with) and returns NULL / not SL_OK. */
json_t *sl__srv_models_json(sl_server_t *s);
/* POST /admin/api/models/{id}/{load|unload|pin|unpin} (`rest` is
 * "{id}/{action}"): the model's entry after the action, or NULL with *err
 * set (404: no such model or action; 409: an unload of a model pinned or
 * serving requests; 503: a load that cannot fit). */
json_t *sl__srv_admin_model(sl_server_t *s, const char *rest,
                            sl_srv_error *err);
/* POST /admin/api/clear-cache: every loaded engine clears on its executor;
 * with none loaded, the drain-all clear of the devices. */
json_t *sl__srv_admin_clear(sl_server_t *s, sl_srv_error *err);
/* One model by id (any accepted name), or NULL with a 404 in *err. */
json_t *sl__srv_model_json(sl_server_t *s, const char *id, sl_srv_error *err);
sl_status sl__srv_count_tokens(sl_server_t *s, const char *body, size_t len,
                               json_t **out, sl_srv_error *err);
sl_status sl__srv_tokenize(sl_server_t *s, const char *body, size_t len,
                           json_t **out, sl_srv_error *err);
sl_status sl__srv_detokenize(sl_server_t *s, const char *body, size_t len,
                             json_t **out, sl_srv_error *err);
/* POST /apply-template: an OpenAI chat body -> {"prompt": the template's
 * text} (llama.cpp's server has it). */
sl_status sl__srv_apply_template(sl_server_t *s, const char *body, size_t len,
                                 json_t **out, sl_srv_error *err);

#endif
