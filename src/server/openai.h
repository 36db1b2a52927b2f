/* sluice — server: OpenAI response bodies and SSE chunks (openai.c). */
#ifndef SLUICE_SERVER_OPENAI_H
#define SLUICE_SERVER_OPENAI_H

#include <jansson.h>
#include <stdbool.h>

#include "sluice/engine.h"
#include "sluice/tokenizer.h"

typedef struct sl_srv_job sl_srv_job; /* job.h */

/* The finish reason string. */
const char *sl__srv_finish_openai(sl_finish f);

/* Called with j->mu held. sl__oai_body: the whole non-streaming body (new
 * reference or NULL on OOM). sl__oai_stream: appends every SSE byte that
 * the job's new events allow to j->out and returns true once the stream is
 * complete. */
json_t *sl__oai_body(sl_srv_job *j, const char *model,
                     const sl_tokenizer_t *tok);
bool sl__oai_stream(sl_srv_job *j, const char *model,
                    const sl_tokenizer_t *tok);

/* The /v1/embeddings answer of a done embeddings job (new reference, or
 * NULL when out of memory). */
json_t *sl__srv_embed_body(const sl_srv_job *j, const char *model);

#endif
