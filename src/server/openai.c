/* sluice — server: OpenAI response bodies and SSE chunks for
 * /v1/chat/completions and /v1/completions. Called with the job's lock
 * held; nothing here blocks. */
#include <string.h>

#include "server/answer.h"
#include "server/job.h"
#include "server/json.h"
#include "server/openai.h"
#include "server/parse.h"
#include "server/reasoning.h"
#include "server/toolcall.h"
#include "sluice/util.h"

const char *sl__srv_finish_openai(sl_finish f) {
  return f == SL_FINISH_LENGTH ? "length" : "stop";
}

static json_t *token_str(const sl_tokenizer_t *tok, int32_t id) {
  size_t len = 0;
  const char *p = sl_tokenizer_piece(tok, id, &len);
  return sl__json_str_lossy(p ? p : "", len);
}

static json_t *token_bytes(const sl_tokenizer_t *tok, int32_t id) {
  size_t len = 0;
  const char *p = sl_tokenizer_piece(tok, id, &len);
  json_t *a = json_array();
  for (size_t i = 0; a && i < len; i++)
    json_array_append_new(a, json_integer((unsigned char)p[i]));
  return a;
}

/* Chat: one entry of choices[].logprobs.content. */
static json_t *chat_lp_entry(const sl_srv_tok *t, const sl_tokenizer_t *tok,
                             int top_n) {
  json_t *top = json_array();
  for (int k = 0; top && k < t->n_top && k < top_n; k++)
    json_array_append_new(
        top, json_pack("{s:o,s:f,s:o}", "token", token_str(tok, t->top[k].id),
                       "logprob", (double)t->top[k].logprob, "bytes",
                       token_bytes(tok, t->top[k].id)));
  return json_pack("{s:o,s:f,s:o,s:o}", "token", token_str(tok, t->id),
                   "logprob", (double)t->logprob, "bytes",
                   token_bytes(tok, t->id), "top_logprobs", top);
}

/* Completions: the logprobs object for toks[from..to). */
static json_t *cmpl_logprobs(const sl_srv_job *j, int from, int to,
                             const sl_tokenizer_t *tok) {
  json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
         *offs = json_array();
  for (int i = from; i < to; i++) {
    const sl_srv_tok *t = &j->toks[i];
    if (t->id < 0)
      continue; /* flushed text without a token */
    json_array_append_new(tokens, token_str(tok, t->id));
    json_array_append_new(lps, json_real(t->logprob));
    json_t *top = json_object();
    for (int k = 0; top && k < t->n_top && k < j->req.top_logprobs; k++) {
      size_t len = 0;
      const char *p = sl_tokenizer_piece(tok, t->top[k].id, &len);
      json_t *key = sl__json_str_lossy(p ? p : "", len);
      if (key)
        json_object_set_new(top, json_string_value(key),
                            json_real(t->top[k].logprob));
      json_decref(key);
    }
    json_array_append_new(tops, top);
    json_array_append_new(offs, json_integer((json_int_t)t->text_off));
  }
  return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps,
                   "top_logprobs", tops, "text_offset", offs);
}

/* usage; completion_tokens_details.reasoning_tokens counts the answer's
 * thinking tokens (OpenAI's field; 0 without a think block), its
 * accepted_ / rejected_prediction_tokens the speculative drafts the
 * target kept and did not (0 without speculation). A parent of n choices
 * sums its children's. */
static json_t *usage_json(sl_srv_job *j) {
  int reasoning = 0;
  if (j->kids)
    for (int i = 0; i < j->n_parts; i++)
      reasoning += sl__srv_job_reasoning_tokens(&j->kids[i]);
  else
    reasoning = sl__srv_job_reasoning_tokens(j);
  return json_pack("{s:i,s:i,s:i,s:{s:i},s:{s:i,s:i,s:i}}", "prompt_tokens",
                   j->prompt_tokens, "completion_tokens", j->completion_tokens,
                   "total_tokens", j->prompt_tokens + j->completion_tokens,
                   "prompt_tokens_details", "cached_tokens", j->cached_tokens,
                   "completion_tokens_details", "reasoning_tokens", reasoning,
                   "accepted_prediction_tokens", j->draft_accepted,
                   "rejected_prediction_tokens", j->draft_rejected);
}

/* message.tool_calls (or one chunk's delta.tool_calls entry). */
static json_t *tool_calls_json(const sl_srv_job *j,
                               const sl_srv_toolcalls *tc) {
  json_t *a = json_array();
  for (int i = 0; a && i < tc->n; i++) {
    char id[64];
    sl__srv_tool_id(j, i, "call_", id, sizeof id);
    json_array_append_new(a, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id,
                                       "type", "function", "function", "name",
                                       tc->v[i].name, "arguments",
                                       tc->v[i].arguments));
  }
  return a;
}

/* One choice of a done job (a lone job, or a child of one with n > 1). */
static json_t *choice_json(sl_srv_job *j, const sl_tokenizer_t *tok) {
  /* the thinking split out (reasoning_content), the rest as content */
  size_t clen;
  const char *ctext = sl__srv_job_content(j, &clen);
  const sl_srv_rsplit *rs = sl__srv_job_split(j, j->text_len);
  bool think = rs && !sl__srv_rsplit_oom(rs) && rs->reasoning.len;
  json_t *text = clen || !think ? sl__json_str_lossy(ctext, clen) : json_null();
  json_t *lp = json_null();
  if (j->req.logprobs) {
    if (j->req.api == SL_SRV_CHAT) {
      json_t *content = json_array();
      for (int i = 0; content && i < j->n_toks; i++)
        if (j->toks[i].id >= 0)
          json_array_append_new(
              content, chat_lp_entry(&j->toks[i], tok, j->req.top_logprobs));
      json_decref(lp);
      lp = json_pack("{s:o}", "content", content);
    } else {
      json_decref(lp);
      lp = cmpl_logprobs(j, 0, j->n_toks, tok);
    }
  }
  const char *fin = sl__srv_finish_openai(j->finish);
  const sl_srv_toolcalls *tc = sl__srv_job_calls(j);
  if (tc) { /* the text around the calls is the content (null if none) */
    json_decref(text);
    text = tc->content_len ? sl__json_str_lossy(tc->content, tc->content_len)
                           : json_null();
    fin = "tool_calls";
  }
  json_t *choice;
  if (j->req.api == SL_SRV_CHAT) {
    choice = json_pack("{s:i,s:{s:s,s:o,s:n},s:o,s:s}", "index", j->index,
                       "message", "role", "assistant", "content", text,
                       "refusal", "logprobs", lp, "finish_reason", fin);
    if (choice && tc)
      json_object_set_new(json_object_get(choice, "message"), "tool_calls",
                          tool_calls_json(j, tc));
    if (choice && think) /* as llama.cpp's server and vLLM name it */
      json_object_set_new(
          json_object_get(choice, "message"), "reasoning_content",
          sl__json_str_lossy(rs->reasoning.p, rs->reasoning.len));
  } else
    choice = json_pack("{s:o,s:i,s:o,s:s}", "text", text, "index", j->index,
                       "logprobs", lp, "finish_reason", fin);
  return choice;
}

json_t *sl__oai_body(sl_srv_job *j, const char *model,
                     const sl_tokenizer_t *tok) {
  json_t *choices = json_array();
  int n = j->kids ? j->n_parts : 1;
  for (int i = 0; choices && i < n; i++) {
    sl_srv_job *k = j->kids ? &j->kids[i] : j;
    if (k != j)
      pthread_mutex_lock(&k->mu);
    json_array_append_new(choices, choice_json(k, tok));
    if (k != j)
      pthread_mutex_unlock(&k->mu);
  }
  return json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", j->id, "object",
                   j->req.api == SL_SRV_CHAT ? "chat.completion"
                                             : "text_completion",
                   "created", (json_int_t)j->created, "model", model, "choices",
                   choices, "usage", usage_json(j));
}

/* {id, object, created, model, choices: [choice]} (+ usage: null). */
static void emit_chunk(sl_srv_job *j, const char *model, json_t *choice) {
  json_t *c = json_pack(
      "{s:s,s:s,s:I,s:s,s:[o]}", "id", j->id, "object",
      j->req.api == SL_SRV_CHAT ? "chat.completion.chunk" : "text_completion",
      "created", (json_int_t)j->created, "model", model, "choices", choice);
  if (c && j->req.include_usage)
    json_object_set_new(c, "usage", json_null());
  sl__sbuf_adds(&j->out, "data: ");
  sl__sbuf_add_json(&j->out, c);
  sl__sbuf_adds(&j->out, "\n\n");
  json_decref(c);
}

static void content_delta(sl_srv_job *j, const char *model, const char *p,
                          size_t n) {
  if (n)
    emit_chunk(j, model,
               json_pack("{s:i,s:{s:o},s:n,s:n}", "index", j->index, "delta",
                         "content", sl__json_str_lossy(p, n), "logprobs",
                         "finish_reason"));
}

/* The thinking split out of the text up to byte `upto` that is not yet
 * streamed: one delta of reasoning_content (with `lp`, taken over, when
 * given), then one of content with what the split let through past what
 * went out (with the logprobs when no reasoning took them). Without
 * tools only: with them the content streams as stream_tools says. */
static void split_deltas(sl_srv_job *j, const char *model, size_t upto,
                         bool content, json_t *lp) {
  sl_srv_rsplit *rs = sl__srv_job_split(j, upto);
  if (sl__srv_rsplit_oom(rs)) {
    json_decref(lp);
    return;
  }
  if (rs->reasoning.len > j->sent_reason) {
    emit_chunk(j, model,
               json_pack("{s:i,s:{s:o},s:o,s:n}", "index", j->index, "delta",
                         "reasoning_content",
                         sl__json_str_lossy(rs->reasoning.p + j->sent_reason,
                                            rs->reasoning.len - j->sent_reason),
                         "logprobs", lp ? lp : json_null(), "finish_reason"));
    j->sent_reason = rs->reasoning.len;
    lp = NULL;
  }
  if (content && (rs->content.len > j->sent_content || lp)) {
    emit_chunk(
        j, model,
        json_pack("{s:i,s:{s:o},s:o,s:n}", "index", j->index, "delta",
                  "content",
                  sl__json_str_lossy(
                      rs->content.p ? rs->content.p + j->sent_content : "",
                      rs->content.len - j->sent_content),
                  "logprobs", lp ? lp : json_null(), "finish_reason"));
    j->sent_content = rs->content.len;
    lp = NULL;
  }
  json_decref(lp);
}

/* With tools, content streams by text, up to where a call may start; the
 * calls follow when the answer is done: each as one delta with its id and
 * name, then one with its arguments. Returns the finish reason to give
 * (NULL: the job's own). No logprobs in these deltas. */
static const char *stream_tools(sl_srv_job *j, const char *model) {
  if (j->done && j->finish == SL_FINISH_ERROR)
    return NULL;
  if (sl__srv_job_splits(j)) /* the thinking first, as it comes */
    split_deltas(j, model, j->text_len, false, NULL);
  const char *p;
  size_t n = sl__srv_tool_stream_text(j, &p);
  content_delta(j, model, p, n);
  const sl_srv_toolcalls *tc = sl__srv_job_calls(j);
  if (!tc)
    return NULL;
  for (int i = 0; i < tc->n; i++) {
    char id[64];
    sl__srv_tool_id(j, i, "call_", id, sizeof id);
    emit_chunk(j, model,
               json_pack("{s:i,s:{s:[{s:i,s:s,s:s,s:{s:s,s:s}}]},s:n,s:n}",
                         "index", j->index, "delta", "tool_calls", "index", i,
                         "id", id, "type", "function", "function", "name",
                         tc->v[i].name, "arguments", "", "logprobs",
                         "finish_reason"));
    emit_chunk(j, model,
               json_pack("{s:i,s:{s:[{s:i,s:{s:s}}]},s:n,s:n}", "index",
                         j->index, "delta", "tool_calls", "index", i,
                         "function", "arguments", tc->v[i].arguments,
                         "logprobs", "finish_reason"));
  }
  return "tool_calls";
}

/* One choice's chunks, into j->out: the role, the new tokens, and its
 * finish (or the error) once done. Returns 0 while it runs, 1 once it
 * finished, -1 when it ended in an error (the error chunk is written). */
static int choice_stream(sl_srv_job *j, const char *model,
                         const sl_tokenizer_t *tok) {
  bool chat = j->req.api == SL_SRV_CHAT;
  if (j->phase == 0) {
    if (chat && !(j->done && j->finish == SL_FINISH_ERROR && j->n_toks == 0))
      emit_chunk(j, model,
                 json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", j->index,
                           "delta", "role", "assistant", "content", "",
                           "logprobs", "finish_reason"));
    j->phase = 1;
  }
  if (j->phase == 1) {
    bool tools = chat && j->req.toolfmt != SL_TOOLFMT_NONE;
    bool split = !tools && sl__srv_job_splits(j);
    const char *tools_fin = tools ? stream_tools(j, model) : NULL;
    for (; split && j->sent_toks < j->n_toks; j->sent_toks++) {
      /* each token's text through the split, its logprobs on its delta */
      const sl_srv_tok *t = &j->toks[j->sent_toks];
      json_t *lp = j->req.logprobs && t->id >= 0
                       ? json_pack("{s:[o]}", "content",
                                   chat_lp_entry(t, tok, j->req.top_logprobs))
                       : NULL;
      split_deltas(j, model, t->text_off + t->text_len, true, lp);
    }
    if (split && j->done) /* what the split held back */
      split_deltas(j, model, j->text_len, true, NULL);
    for (; !tools && !split && j->sent_toks < j->n_toks; j->sent_toks++) {
      const sl_srv_tok *t = &j->toks[j->sent_toks];
      /* id < 0: text the engine flushed at the end, with no token */
      bool with_lp = j->req.logprobs && t->id >= 0;
      if (t->text_len == 0 && !with_lp)
        continue;
      json_t *piece = sl__json_str_lossy(j->text + t->text_off, t->text_len);
      json_t *lp = json_null();
      if (with_lp) {
        json_decref(lp);
        lp = chat ? json_pack("{s:[o]}", "content",
                              chat_lp_entry(t, tok, j->req.top_logprobs))
                  : cmpl_logprobs(j, j->sent_toks, j->sent_toks + 1, tok);
      }
      if (chat)
        emit_chunk(j, model,
                   json_pack("{s:i,s:{s:o},s:o,s:n}", "index", j->index,
                             "delta", "content", piece, "logprobs", lp,
                             "finish_reason"));
      else
        emit_chunk(j, model,
                   json_pack("{s:o,s:i,s:o,s:n}", "text", piece, "index",
                             j->index, "logprobs", lp, "finish_reason"));
    }
    if (!j->done)
      return 0;
    if (j->finish == SL_FINISH_ERROR) {
      sl_srv_error e;
      sl__srv_job_error(j, &e);
      json_t *ej = sl__srv_error_json(SL_SRV_FAMILY_OPENAI, &e);
      sl__sbuf_adds(&j->out, "data: ");
      sl__sbuf_add_json(&j->out, ej);
      sl__sbuf_adds(&j->out, "\n\n");
      json_decref(ej);
      j->phase = 2;
      return -1;
    }
    const char *fin = tools_fin ? tools_fin : sl__srv_finish_openai(j->finish);
    if (chat)
      emit_chunk(j, model,
                 json_pack("{s:i,s:{},s:n,s:s}", "index", j->index, "delta",
                           "logprobs", "finish_reason", fin));
    else
      emit_chunk(j, model,
                 json_pack("{s:s,s:i,s:n,s:s}", "text", "", "index", j->index,
                           "logprobs", "finish_reason", fin));
    j->phase = 2;
  }
  return j->phase == 2 && j->finish == SL_FINISH_ERROR ? -1 : 1;
}

bool sl__oai_stream(sl_srv_job *j, const char *model,
                    const sl_tokenizer_t *tok) {
  if (j->phase == 2)
    return true;
  int n = j->kids ? j->n_parts : 1, finished = 0;
  bool failed = false;
  for (int i = 0; i < n && !failed; i++) {
    sl_srv_job *k = j->kids ? &j->kids[i] : j;
    if (k == j) {
      int r = choice_stream(j, model, tok);
      finished += r != 0;
      failed = r < 0;
      continue;
    }
    pthread_mutex_lock(&k->mu);
    int r = choice_stream(k, model, tok);
    sl__sbuf_add(&j->out, k->out.p, k->out.len); /* the child's chunks */
    if (k->out.oom)
      j->out.oom = true;
    k->out.len = 0;
    pthread_mutex_unlock(&k->mu);
    finished += r != 0;
    failed = r < 0;
  }
  if (failed) {
    /* no [DONE]: the stream did not complete (the SDKs raise on the
     * error chunk; a client that waits for [DONE] sees the close) */
    j->phase = 2;
    return true;
  }
  if (finished < n || (j->kids && !j->done))
    return false;
  if (j->req.include_usage) {
    json_t *c = json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", j->id, "object",
                          j->req.api == SL_SRV_CHAT ? "chat.completion.chunk"
                                                    : "text_completion",
                          "created", (json_int_t)j->created, "model", model,
                          "choices", "usage", usage_json(j));
    sl__sbuf_adds(&j->out, "data: ");
    sl__sbuf_add_json(&j->out, c);
    sl__sbuf_adds(&j->out, "\n\n");
    json_decref(c);
  }
  sl__sbuf_adds(&j->out, "data: [DONE]\n\n");
  j->phase = 2;
  return true;
}

/* ---- embeddings ------------------------------------------------------------
 */

/* base64 of n little-endian float32s (x86-64 is little-endian). */
static json_t *b64_floats(const float *v, int n) {
  static const char tab[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const unsigned char *p = (const unsigned char *)v;
  size_t len = (size_t)n * 4, olen = (len + 2) / 3 * 4;
  char *o = sl_malloc(olen + 1);
  if (!o)
    return NULL;
  size_t k = 0;
  for (size_t i = 0; i < len; i += 3) {
    uint32_t x = (uint32_t)p[i] << 16;
    if (i + 1 < len)
      x |= (uint32_t)p[i + 1] << 8;
    if (i + 2 < len)
      x |= p[i + 2];
    o[k++] = tab[(x >> 18) & 63];
    o[k++] = tab[(x >> 12) & 63];
    o[k++] = i + 1 < len ? tab[(x >> 6) & 63] : '=';
    o[k++] = i + 2 < len ? tab[x & 63] : '=';
  }
  o[k] = 0;
  json_t *s = json_stringn(o, k);
  sl_free(o);
  return s;
}

json_t *sl__srv_embed_body(const sl_srv_job *j, const char *model) {
  json_t *data = json_array();
  for (int i = 0; data && i < j->req.n_inputs; i++) {
    const float *v = j->emb + (size_t)i * (size_t)j->n_embd;
    json_t *e;
    if (j->req.emb_base64) {
      e = b64_floats(v, j->n_embd);
    } else {
      e = json_array();
      for (int k = 0; e && k < j->n_embd; k++)
        if (json_array_append_new(e, json_real(v[k])) != 0) {
          json_decref(e);
          e = NULL;
        }
    }
    if (!e || json_array_append_new(data, json_pack("{s:s,s:i,s:o}", "object",
                                                    "embedding", "index", i,
                                                    "embedding", e)) != 0) {
      json_decref(data);
      return NULL;
    }
  }
  return json_pack("{s:s,s:o,s:s,s:{s:i,s:i}}", "object", "list", "data", data,
                   "model", model, "usage", "prompt_tokens", j->prompt_tokens,
                   "total_tokens", j->prompt_tokens);
}
