/* sluice — server: /v1/embeddings, its body and its answer (embed.c). */
#ifndef SLUICE_SERVER_EMBED_H
#define SLUICE_SERVER_EMBED_H

#include <jansson.h>

#include "server/json.h"
#include "server/request.h"
#include "sluice/tokenizer.h"

sl_status sl__srv_parse_embeddings(json_t *root, const sl_srv_limits *lim,
                                   sl_srv_request *r, sl_srv_error *err);
void sl__srv_embed_free(sl_srv_request *r);
/* Tokenizes the text inputs (special tokens parsed, BOS as the model adds
 * it) and checks every input's ids: in the vocabulary, fewer than n_ctx. */
sl_status sl__srv_embed_ids(sl_srv_request *r, const sl_tokenizer_t *tok,
                            int n_ctx, sl_srv_error *err);

#endif
