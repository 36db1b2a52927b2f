/* libFuzzer harness: the server's request parsers (OpenAI chat, completions,
 * Anthropic messages) over arbitrary bytes. The first byte picks the API;
 * the rest is the body; bit 2 of the first byte gives the parser a chat
 * template that renders tools (Hermes), bit 3 one that does not. Every input
 * must end in a validated request or an error with a 4xx/5xx status and a
 * message, and the error body must serialize in both API shapes; nothing may
 * leak or crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_impl.h"
#include "sluice/util.h"

static const char *names[] = {"smollm2", "default"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 1 << 16)
    return 0;
  sl_srv_api api = (sl_srv_api)(data[0] % 5); /* count_tokens, embeddings */
  const char *tmpl = data[0] & 4   ? "{{ tools }}<tool_call>"
                     : data[0] & 8 ? "{{ messages }}"
                                   : NULL;
  const sl_srv_limits lim = {.model_names = names,
                             .n_model_names = 2,
                             .n_ctx = 2048,
                             .chat_template = tmpl,
                             .toolfmt = SL_TOOLFMT_NONE};
  size_t live = sl_malloc_live_bytes();
  sl_srv_request r;
  sl_srv_error e;
  sl_status st =
      sl__srv_parse(api, (const char *)data + 1, size - 1, &lim, &r, &e);
  if (st == SL_OK) {
    if (!r.model)
      abort();
    if (api == SL_SRV_EMBEDDINGS
            ? r.n_inputs < 1 || r.n_inputs > SL_SRV_MAX_EMBED_INPUTS
        : api == SL_SRV_COMPLETIONS ? !(r.prompt || r.n_prompt_ids > 0)
                                    : sl_jv_len(r.messages) == 0)
      abort();
    int max_stop = api == SL_SRV_MESSAGES || api == SL_SRV_COUNT_TOKENS
                       ? SL_MAX_STOP
                       : SL_SRV_MAX_STOP_OPENAI;
    /* a grammar (response_format, grammar, json_schema, output_config)
     * compiled: a matcher starts on it */
    if ((r.grammar != NULL) != (r.gen.grammar != NULL))
      abort();
    if (r.grammar) {
      sl_grammar_matcher_t *m = sl_grammar_matcher_create(r.grammar);
      if (!m)
        abort();
      (void)sl_grammar_matcher_accept(m, "{\"a\": [1, true]}", 16);
      sl_grammar_matcher_free(m);
    }
    /* tools: read back in some format exactly when there are tools and
     * a call may come; a forced call is a grammar */
    if ((r.toolfmt != SL_TOOLFMT_NONE) &&
        (!r.tools || r.tool_choice == SL_SRV_TOOLS_NONE))
      abort();
    if (r.tools &&
        (r.tool_choice == SL_SRV_TOOLS_REQUIRED ||
         r.tool_choice == SL_SRV_TOOLS_NAMED) &&
        !r.grammar)
      abort();
    if ((r.tmpl_extra != NULL) != (r.tools && r.tools_native))
      abort();
    /* max_tokens above the context is kept (clamped at submission) */
    if (r.gen.max_tokens < 0 || r.gen.n_stop > max_stop ||
        r.gen.top_logprobs > SL_MAX_TOP_LOGPROBS)
      abort();
    for (int i = 0; i < r.gen.n_stop; i++)
      if (!r.gen.stop[i] || !r.gen.stop[i][0] ||
          strlen(r.gen.stop[i]) > SL_MAX_STOP_BYTES)
        abort();
    sl__srv_request_free(&r);
  } else {
    if (e.http < 400 || e.http > 599 || !e.message[0])
      abort();
    for (int f = 0; f < 2; f++) {
      json_t *j = sl__srv_error_json((sl_srv_family)f, &e);
      if (!j)
        abort();
      sl_sbuf b = {0};
      sl__sbuf_add_json(&b, j);
      if (b.oom || !sl__utf8_valid(b.p, b.len))
        abort();
      sl__sbuf_free(&b);
      json_decref(j);
    }
  }
  if (sl_malloc_live_bytes() != live)
    abort(); /* a leak through the funnel */
  return 0;
}
