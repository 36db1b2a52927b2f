/* sluice — server: a request's prompt token ids: chat template, tokenizer
 * (prompt.c). */
#ifndef SLUICE_SERVER_PROMPT_H
#define SLUICE_SERVER_PROMPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/json.h"
#include "server/request.h"
#include "sluice/tokenizer.h"

/* Renders the chat template (chat / messages) or takes the prompt text or
 * ids (completions), and tokenizes. `chat_template` may be NULL (no template
 * in the model: chat requests then fail with 400). Special tokens (e.g.
 * "<|im_end|>") are parsed in the template's own text but not in the text of
 * the messages, unless `parse_special_in_content` (llama.cpp's behaviour);
 * a completion's prompt text is the client's whole prompt and always has
 * them parsed. `n_ctx` > 0: a prompt of n_ctx tokens or more is refused
 * (400 context_length_exceeded) as soon as that is known, before it is
 * tokenized whole (sl_tokenizer_encode_limited: a text over n_ctx x the
 * vocabulary's longest token is refused unread); 0: no limit (count_tokens).
 * On SL_OK stores a new array (free with sl_free) in *ids and its length in
 * *n; on failure fills *err. */
sl_status sl__srv_prompt_ids(const sl_srv_request *r, const sl_tokenizer_t *tok,
                             const char *chat_template,
                             bool parse_special_in_content, int n_ctx,
                             int32_t **ids, int *n, sl_srv_error *err);

/* The chat template's text for a chat / messages request, as the prompt
 * is made of it (llama.cpp's /apply-template): *text (free with sl_free),
 * *len. Errors as above. */
sl_status sl__srv_prompt_text(const sl_srv_request *r,
                              const sl_tokenizer_t *tok,
                              const char *chat_template, char **text,
                              size_t *len, sl_srv_error *err);

#endif
