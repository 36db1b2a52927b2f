/* sluice — server: what a request body says to constrain its tokens
 * (constrain.c): response_format, llama.cpp's grammar and json_schema
 * (each becomes the request's grammar, gen.grammar), and logit_bias.
 * Called by the parser (parse.c); no engine, no HTTP. */
#ifndef SLUICE_SERVER_CONSTRAIN_H
#define SLUICE_SERVER_CONSTRAIN_H

#include <jansson.h>
#include <stddef.h>

#include "server/json.h"
#include "server/request.h"
#include "sluice/status.h"

/* Compiles GBNF into r->grammar; a 400 naming `param` when it does not. */
sl_status sl__srv_set_grammar(sl_srv_request *r, const char *gbnf, size_t len,
                              const char *param, sl_srv_error *err);
/* A JSON Schema (borrowed) as r's grammar; `param` names it in errors. */
sl_status sl__srv_set_schema(sl_srv_request *r, json_t *schema,
                             const char *param, sl_srv_error *err);
/* response_format (OpenAI), and llama.cpp's grammar and json_schema, of
 * the body `root` (borrowed): at most one of them, as r's grammar. */
sl_status sl__srv_parse_structured(json_t *root, sl_srv_request *r,
                                   sl_srv_error *err);
/* OpenAI's logit_bias `v` (borrowed; NULL: none) into r->bias and
 * r->gen.logit_bias. */
sl_status sl__srv_parse_logit_bias(json_t *v, sl_srv_request *r,
                                   sl_srv_error *err);

#endif
