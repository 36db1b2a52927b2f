/* sluice — server: Anthropic response bodies and SSE events
 * (anthropic.c). */
#ifndef SLUICE_SERVER_ANTHROPIC_H
#define SLUICE_SERVER_ANTHROPIC_H

#include <jansson.h>
#include <stdbool.h>

#include "sluice/tokenizer.h"

typedef struct sl_srv_job sl_srv_job; /* job.h */

/* Anthropic stop_reason; *stop_seq gets the matched stop string or NULL. */
const char *sl__srv_finish_anthropic(const sl_srv_job *j,
                                     const sl_tokenizer_t *tok,
                                     const char **stop_seq);

/* As sl__oai_body / sl__oai_stream (openai.h), in Anthropic's shapes. */
json_t *sl__ant_body(sl_srv_job *j, const char *model,
                     const sl_tokenizer_t *tok);
bool sl__ant_stream(sl_srv_job *j, const char *model,
                    const sl_tokenizer_t *tok);

#endif
