/* sluice — server: request bodies -> sl_srv_request, or an sl_srv_error
 * (parse.c). No engine, no HTTP. */
#ifndef SLUICE_SERVER_PARSE_H
#define SLUICE_SERVER_PARSE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/json.h"
#include "server/request.h"

/* Parses and validates a request body for `api`. The body need not be
 * NUL-terminated and may be any bytes. On SL_OK *out is filled (free it with
 * sl__srv_request_free); otherwise *err says why (its http field is the
 * status to answer with) and *out holds nothing to free. Returns
 * SL_ERR_FORMAT for bad input, SL_ERR_NOT_FOUND for an unknown model,
 * SL_ERR_UNSUPPORTED for unsupported values, SL_ERR_NOMEM. */
sl_status sl__srv_parse(sl_srv_api api, const char *body, size_t len,
                        const sl_srv_limits *lim, sl_srv_request *out,
                        sl_srv_error *err);

void sl__srv_request_free(sl_srv_request *r);

/* A request body as a JSON object (new reference): UTF-8 checked, its shape
 * scanned (json_scan.c), parsed. NULL with *err filled otherwise (400; 503
 * when out of memory). Every route with a body reads it through this. */
json_t *sl__srv_body_object(const char *body, size_t len, sl_srv_error *err);

/* Joins a content value into text: a string, or a list of {type: "text",
 * text} parts. 1 on success, -1 with err set. */
int sl__srv_content_text(json_t *c, const char *param, bool allow_null,
                         sl_sbuf *out, sl_srv_error *err);

#endif
