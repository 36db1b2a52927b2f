/* sluice — server: the request fields that steer a model's thinking
 * (reasoning_req.c). */
#ifndef SLUICE_SERVER_REASONING_REQ_H
#define SLUICE_SERVER_REASONING_REQ_H

#include <jansson.h>

#include "server/json.h"
#include "server/reasoning.h"
#include "sluice/status.h"

typedef struct sl_srv_request sl_srv_request; /* parse.h */
typedef struct sl_srv_limits sl_srv_limits;

/* After the messages and tools were read (root borrowed): the request's
 * reasoning family (from lim), Anthropic's `thinking` (messages route:
 * {type: enabled, budget_tokens: N >= 1, < max_tokens} or {type:
 * disabled}), OpenAI's `reasoning_effort`, and `chat_template_kwargs` (both
 * routes), into r->rfmt, r->think_budget and r->tmpl_extra (the template's
 * enable_thinking, reasoning_effort and each kwarg). A 400 naming the field
 * when one is bad; SL_ERR_NOMEM. */
sl_status sl__srv_reason_request(json_t *root, const sl_srv_limits *lim,
                                 sl_srv_request *r, sl_srv_error *err);

#endif
