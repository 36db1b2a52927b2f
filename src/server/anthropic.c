/* sluice — server: Anthropic Messages API response bodies and SSE events
 * (message_start, content_block_start, ping, content_block_delta,
 * content_block_stop, message_delta, message_stop). Called with the job's
 * lock held; nothing here blocks. */
#include <string.h>

#include "server/server_impl.h"
#include "sluice/util.h"

/* Which stop string ended generation: the engine cut the text right before
 * it, so the generated tokens' bytes past the emitted text start with it. */
static const char *matched_stop(const sl_srv_job *j,
                                const sl_tokenizer_t *tok) {
  if (j->req.gen.n_stop == 0)
    return NULL;
  sl_sbuf raw = {0};
  for (int i = 0; i < j->n_toks; i++) {
    char piece[256];
    size_t len;
    if (sl_tokenizer_token_to_piece(tok, j->toks[i].id, false, piece,
                                    sizeof piece, &len) == SL_OK)
      sl__sbuf_add(&raw, piece, len);
  }
  const char *found = NULL;
  if (!raw.oom && raw.len >= j->text_len) {
    const char *rest = raw.p ? raw.p + j->text_len : "";
    size_t rest_len = raw.len - j->text_len;
    for (int k = 0; k < j->req.gen.n_stop && !found; k++) {
      const char *s = j->req.gen.stop[k];
      size_t sl = strlen(s);
      if (sl <= rest_len && memcmp(rest, s, sl) == 0)
        found = s;
    }
  }
  sl__sbuf_free(&raw);
  return found;
}

const char *sl__srv_finish_anthropic(const sl_srv_job *j,
                                     const sl_tokenizer_t *tok,
                                     const char **stop_seq) {
  *stop_seq = NULL;
  if (j->finish == SL_FINISH_LENGTH)
    return "max_tokens";
  if (j->finish == SL_FINISH_STOP && (*stop_seq = matched_stop(j, tok)))
    return "stop_sequence";
  return "end_turn";
}

/* Anthropic's input_tokens leaves out the cache reads, which
 * cache_read_input_tokens counts (their sum is the prompt). */
static int uncached(int prompt, int cached) {
  return prompt > cached ? prompt - cached : 0;
}

json_t *sl__ant_body(sl_srv_job *j, const char *model,
                     const sl_tokenizer_t *tok) {
  const char *stop_seq;
  const char *reason = sl__srv_finish_anthropic(j, tok, &stop_seq);
  json_t *text = sl__json_str_lossy(j->text ? j->text : "", j->text_len);
  return json_pack(
      "{s:s,s:s,s:s,s:s,s:[{s:s,s:o}],s:s,s:o,s:{s:i,s:i,s:i,s:i}}", "id",
      j->id, "type", "message", "role", "assistant", "model", model, "content",
      "type", "text", "text", text, "stop_reason", reason, "stop_sequence",
      stop_seq ? json_string(stop_seq) : json_null(), "usage", "input_tokens",
      uncached(j->prompt_tokens, j->cached_tokens), "output_tokens",
      j->completion_tokens, "cache_read_input_tokens", j->cached_tokens,
      "cache_creation_input_tokens", 0);
}

static void emit(sl_srv_job *j, const char *event, json_t *data) {
  sl__sbuf_addf(&j->out, "event: %s\ndata: ", event);
  sl__sbuf_add_json(&j->out, data);
  sl__sbuf_adds(&j->out, "\n\n");
  json_decref(data);
}

bool sl__ant_stream(sl_srv_job *j, const char *model,
                    const sl_tokenizer_t *tok) {
  if (j->phase == 0) {
    if (j->done && j->finish == SL_FINISH_ERROR && j->n_toks == 0) {
      j->phase = 1; /* nothing started: only the error event */
    } else {
      emit(j, "message_start",
           json_pack("{s:s,s:{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:{s:i,s:i,s:i,"
                     "s:i}}}",
                     "type", "message_start", "message", "id", j->id, "type",
                     "message", "role", "assistant", "model", model, "content",
                     "stop_reason", "stop_sequence", "usage", "input_tokens",
                     uncached(j->n_ids, j->cached_tokens), "output_tokens", 0,
                     "cache_read_input_tokens", j->cached_tokens,
                     "cache_creation_input_tokens", 0));
      emit(j, "content_block_start",
           json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_start",
                     "index", 0, "content_block", "type", "text", "text", ""));
      emit(j, "ping", json_pack("{s:s}", "type", "ping"));
      j->phase = 1;
    }
  }
  if (j->phase == 1) {
    for (; j->sent_toks < j->n_toks; j->sent_toks++) {
      const sl_srv_tok *t = &j->toks[j->sent_toks];
      if (t->text_len == 0)
        continue;
      emit(j, "content_block_delta",
           json_pack("{s:s,s:i,s:{s:s,s:o}}", "type", "content_block_delta",
                     "index", 0, "delta", "type", "text_delta", "text",
                     sl__json_str_lossy(j->text + t->text_off, t->text_len)));
    }
    if (!j->done)
      return false;
    if (j->finish == SL_FINISH_ERROR) {
      sl_srv_error e;
      sl__srv_job_error(j, &e);
      emit(j, "error", sl__srv_error_json(SL_SRV_FAMILY_ANTHROPIC, &e));
    } else {
      const char *stop_seq;
      const char *reason = sl__srv_finish_anthropic(j, tok, &stop_seq);
      emit(j, "content_block_stop",
           json_pack("{s:s,s:i}", "type", "content_block_stop", "index", 0));
      emit(j, "message_delta",
           json_pack("{s:s,s:{s:s,s:o},s:{s:i}}", "type", "message_delta",
                     "delta", "stop_reason", reason, "stop_sequence",
                     stop_seq ? json_string(stop_seq) : json_null(), "usage",
                     "output_tokens", j->completion_tokens));
      emit(j, "message_stop", json_pack("{s:s}", "type", "message_stop"));
    }
    j->phase = 2;
  }
  return true;
}
