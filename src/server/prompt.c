/* sluice — server: a validated request -> the prompt's token ids (chat
 * template rendering, tokenization). Runs on HTTP threads; the tokenizer
 * and the template source are immutable and shared. */
#include <stdio.h>
#include <string.h>

#include "server/json.h"
#include "server/prompt.h"
#include "sluice/util.h"

/* The text of token `id` as a C string in buf ("" when absent). */
static void token_text(const sl_tokenizer_t *tok, int32_t id, char *buf,
                       size_t cap) {
  size_t len;
  const char *p;
  buf[0] = 0;
  if (id >= 0 && (p = sl_tokenizer_piece(tok, id, &len)) && len < cap) {
    memcpy(buf, p, len);
    buf[len] = 0;
  }
}

/* The chat template's text for r (chat / messages) in *out (free with
 * sl_free) and *len; with want_mask, *untrusted marks the bytes that came
 * from the request (else NULL). A continued last message (prefill) cuts
 * the text where that message's own bytes end. */
static sl_status render_chat(const sl_srv_request *r, const char *chat_template,
                             const char *bos, const char *eos, bool want_mask,
                             char **out, size_t *len, uint8_t **untrusted,
                             sl_srv_error *err) {
  *out = NULL;
  *untrusted = NULL;
  if (!chat_template) {
    sl__srv_error_set(err, 400, "no_chat_template", NULL,
                      "the model has no chat template; use /v1/completions");
    return SL_ERR_UNSUPPORTED;
  }
  char terr[256] = "";
  bool cont = r->continue_final;
  sl_status st = sl_chat_template_render_marked(
      chat_template, r->messages, !cont, bos, eos, r->tmpl_extra, out, len,
      want_mask || cont ? untrusted : NULL, terr, sizeof terr);
  if (st == SL_ERR_NOMEM) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return st;
  }
  if (st != SL_OK) {
    /* raise_exception() in a template rejects the conversation (e.g.
     * roles not alternating): the client's fault */
    sl__srv_error_set(err, 400, "invalid_messages", "messages",
                      "the chat template rejected the messages: %s", terr);
    return SL_ERR_FORMAT;
  }
  if (cont) {
    /* a prefill: the prompt ends where the last message's own text ends
     * (the last bytes that came from the request), before the template
     * closes the turn (HF's continue_final_message cuts at the content
     * the same way) */
    size_t end = *len;
    while (end > 0 && !(*untrusted && (*untrusted)[end - 1]))
      end--;
    if (!end) {
      sl_free(*untrusted);
      sl_free(*out);
      *untrusted = NULL;
      *out = NULL;
      sl__srv_error_set(err, 400, "invalid_messages", "messages",
                        "the chat template does not write the last "
                        "assistant message: it cannot be continued");
      return SL_ERR_FORMAT;
    }
    *len = end;
    (*out)[end] = 0;
    if (!want_mask) { /* the mask only found the end */
      sl_free(*untrusted);
      *untrusted = NULL;
    }
  }
  return SL_OK;
}

sl_status sl__srv_prompt_text(const sl_srv_request *r,
                              const sl_tokenizer_t *tok,
                              const char *chat_template, char **text,
                              size_t *len, sl_srv_error *err) {
  char bos[256], eos[256];
  uint8_t *mask = NULL;
  token_text(tok, sl_tokenizer_bos(tok), bos, sizeof bos);
  token_text(tok, sl_tokenizer_eos(tok), eos, sizeof eos);
  sl_status st =
      render_chat(r, chat_template, bos, eos, false, text, len, &mask, err);
  sl_free(mask);
  return st;
}

sl_status sl__srv_prompt_ids(const sl_srv_request *r, const sl_tokenizer_t *tok,
                             const char *chat_template,
                             bool parse_special_in_content, int n_ctx,
                             int32_t **ids, int *n, sl_srv_error *err) {
  *ids = NULL;
  *n = 0;
  if (r->api == SL_SRV_COMPLETIONS && r->prompt_ids) {
    size_t nv = sl_tokenizer_vocab_size(tok);
    for (int i = 0; i < r->n_prompt_ids; i++)
      if ((size_t)r->prompt_ids[i] >= nv) {
        sl__srv_error_set(err, 400, "invalid_value", "prompt",
                          "token id %d at prompt[%d] is outside the "
                          "vocabulary (%zu)",
                          r->prompt_ids[i], i, nv);
        return SL_ERR_RANGE;
      }
    int32_t *c = sl_calloc((size_t)r->n_prompt_ids, sizeof *c);
    if (!c)
      goto fail_nomem;
    memcpy(c, r->prompt_ids, (size_t)r->n_prompt_ids * sizeof *c);
    *ids = c;
    *n = r->n_prompt_ids;
    return SL_OK;
  }

  char *rendered = NULL;
  uint8_t *untrusted = NULL; /* 1 where the rendered byte is message text */
  const char *text;
  size_t text_len;
  bool add_bos = sl_tokenizer_add_bos(tok);
  char bos[256], eos[256];
  token_text(tok, sl_tokenizer_bos(tok), bos, sizeof bos);
  token_text(tok, sl_tokenizer_eos(tok), eos, sizeof eos);
  if (r->api == SL_SRV_COMPLETIONS) {
    text = r->prompt;
    text_len = r->prompt_len;
  } else {
    sl_status st =
        render_chat(r, chat_template, bos, eos, !parse_special_in_content,
                    &rendered, &text_len, &untrusted, err);
    if (st != SL_OK)
      return st;
    text = rendered;
    /* the template wrote BOS itself: do not add a second one */
    if (bos[0] && text_len >= strlen(bos) &&
        memcmp(text, bos, strlen(bos)) == 0 &&
        !(untrusted && memchr(untrusted, 1, strlen(bos))))
      add_bos = false;
  }
  size_t nn = 0;
  int32_t *out = NULL;
  /* the template's text has its special tokens parsed, the messages' not;
   * a prompt that cannot fit is refused as soon as that is known */
  size_t limit = n_ctx > 0 ? (size_t)n_ctx - 1 : SIZE_MAX;
  sl_status st = sl_tokenizer_encode_limited(tok, text, text_len, add_bos,
                                             untrusted, limit, &out, &nn);
  sl_free(untrusted);
  sl_free(rendered);
  if (st == SL_ERR_NOMEM)
    goto fail_nomem;
  if (st == SL_ERR_RANGE && n_ctx > 0) {
    size_t mtb = sl_tokenizer_max_token_bytes(tok);
    if (mtb && text_len / mtb >= (size_t)n_ctx)
      sl__srv_error_set(err, 400, "context_length_exceeded",
                        r->api == SL_SRV_COMPLETIONS ? "prompt" : "messages",
                        "this model's maximum context length is %d tokens, "
                        "but the prompt is %zu bytes, at least %zu tokens "
                        "(no token of its vocabulary is over %zu bytes)",
                        n_ctx, text_len, text_len / mtb, mtb);
    else
      sl__srv_error_set(err, 400, "context_length_exceeded",
                        r->api == SL_SRV_COMPLETIONS ? "prompt" : "messages",
                        "this model's maximum context length is %d tokens, "
                        "but the prompt has more",
                        n_ctx);
    return st;
  }
  if (st != SL_OK) {
    sl__srv_error_set(err, 400, "invalid_prompt", "prompt",
                      "cannot tokenize the prompt: %s", sl_status_str(st));
    return st;
  }
  if (nn == 0) {
    sl_free(out);
    sl__srv_error_set(err, 400, "invalid_value", "prompt",
                      "the prompt is empty");
    return SL_ERR_FORMAT;
  }
  if (nn > INT32_MAX) {
    sl_free(out);
    sl__srv_error_set(err, 400, "context_length_exceeded", "messages",
                      "the prompt is too long");
    return SL_ERR_RANGE;
  }
  *ids = out;
  *n = (int)nn;
  return SL_OK;
fail_nomem:
  sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
  return SL_ERR_NOMEM;
}
