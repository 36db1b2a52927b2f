/* sluice — server: Anthropic Messages API response bodies and SSE events
 * (message_start, content_block_start, ping, content_block_delta,
 * content_block_stop, message_delta, message_stop). Called with the job's
 * lock held; nothing here blocks. */
#include <stdio.h>
#include <string.h>

#include "server/answer.h"
#include "server/anthropic.h"
#include "server/job.h"
#include "server/json.h"
#include "server/parse.h"
#include "server/reasoning.h"
#include "server/toolcall.h"
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

/* A tool_use block: {type, id, name, input}; input parsed back from the
 * arguments toolcall.c wrote (always an object). */
static json_t *tool_use(const sl_srv_job *j, const sl_srv_toolcalls *tc,
                        int i) {
  char id[64];
  sl__srv_tool_id(j, i, "toolu_", id, sizeof id);
  json_t *input = json_loads(tc->v[i].arguments, 0, NULL);
  return json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", id, "name",
                   tc->v[i].name, "input", input ? input : json_object());
}

/* A thinking block's signature: Anthropic's is an encrypted digest that
 * clients hand back unread; ours is an opaque digest of the job's id and
 * the thinking (FNV-1a), never checked. */
static void signature(const sl_srv_job *j, const char *p, size_t n, char *buf,
                      size_t cap) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *s = j->id; *s; s++)
    h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
  snprintf(buf, cap, "sluice-%016llx", (unsigned long long)h);
}

json_t *sl__ant_body(sl_srv_job *j, const char *model,
                     const sl_tokenizer_t *tok) {
  const char *stop_seq;
  const char *reason = sl__srv_finish_anthropic(j, tok, &stop_seq);
  const sl_srv_toolcalls *tc = sl__srv_job_calls(j);
  json_t *content = json_array();
  size_t clen;
  const char *ctext = sl__srv_job_content(j, &clen);
  const sl_srv_rsplit *rs = sl__srv_job_split(j, j->text_len);
  bool think = rs && !sl__srv_rsplit_oom(rs) && rs->reasoning.len;
  if (think) { /* the thinking block comes first */
    char sig[48];
    signature(j, rs->reasoning.p, rs->reasoning.len, sig, sizeof sig);
    json_array_append_new(
        content,
        json_pack("{s:s,s:o,s:s}", "type", "thinking", "thinking",
                  sl__json_str_lossy(rs->reasoning.p, rs->reasoning.len),
                  "signature", sig));
  }
  if (tc) {
    reason = "tool_use";
    stop_seq = NULL;
    if (tc->content_len)
      json_array_append_new(
          content, json_pack("{s:s,s:o}", "type", "text", "text",
                             sl__json_str_lossy(tc->content, tc->content_len)));
    for (int i = 0; content && i < tc->n; i++)
      json_array_append_new(content, tool_use(j, tc, i));
  } else if (clen || !think) { /* (only thinking: no empty text block) */
    json_array_append_new(content,
                          json_pack("{s:s,s:o}", "type", "text", "text",
                                    sl__json_str_lossy(ctext, clen)));
  }
  return json_pack(
      "{s:s,s:s,s:s,s:s,s:o,s:s,s:o,s:{s:i,s:i,s:i,s:i}}", "id", j->id, "type",
      "message", "role", "assistant", "model", model, "content", content,
      "stop_reason", reason, "stop_sequence",
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

/* Text into the open text block (opened first when none is). */
static void text_delta(sl_srv_job *j, const char *p, size_t n) {
  if (!n)
    return;
  if (!j->ant_open) {
    emit(j, "content_block_start",
         json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_start",
                   "index", j->ant_blocks, "content_block", "type", "text",
                   "text", ""));
    j->ant_open = true;
  }
  emit(j, "content_block_delta",
       json_pack("{s:s,s:i,s:{s:s,s:o}}", "type", "content_block_delta",
                 "index", j->ant_blocks, "delta", "type", "text_delta", "text",
                 sl__json_str_lossy(p, n)));
}

static void close_block(sl_srv_job *j) {
  if (!j->ant_open)
    return;
  if (j->ant_think) { /* as Anthropic ends a thinking block */
    const sl_srv_rsplit *rs = &j->rs;
    char sig[48];
    signature(j, rs->reasoning.p ? rs->reasoning.p : "", rs->reasoning.len, sig,
              sizeof sig);
    emit(j, "content_block_delta",
         json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta",
                   "index", j->ant_blocks, "delta", "type", "signature_delta",
                   "signature", sig));
    j->ant_think = false;
  }
  emit(j, "content_block_stop",
       json_pack("{s:s,s:i}", "type", "content_block_stop", "index",
                 j->ant_blocks));
  j->ant_open = false;
  j->ant_blocks++;
}

/* Thinking into the open thinking block (opened first when none is). */
static void thinking_delta(sl_srv_job *j, const char *p, size_t n) {
  if (!n)
    return;
  if (!j->ant_open) {
    emit(j, "content_block_start",
         json_pack("{s:s,s:i,s:{s:s,s:s,s:s}}", "type", "content_block_start",
                   "index", j->ant_blocks, "content_block", "type", "thinking",
                   "thinking", "", "signature", ""));
    j->ant_open = j->ant_think = true;
  }
  emit(j, "content_block_delta",
       json_pack("{s:s,s:i,s:{s:s,s:o}}", "type", "content_block_delta",
                 "index", j->ant_blocks, "delta", "type", "thinking_delta",
                 "thinking", sl__json_str_lossy(p, n)));
}

/* The split of the text up to byte `upto` not yet streamed: thinking into
 * the thinking block, then (with `content`) content into a text block,
 * which closes the thinking block first. */
static void split_deltas(sl_srv_job *j, size_t upto, bool content) {
  sl_srv_rsplit *rs = sl__srv_job_split(j, upto);
  if (sl__srv_rsplit_oom(rs))
    return;
  if (rs->reasoning.len > j->sent_reason) {
    thinking_delta(j, rs->reasoning.p + j->sent_reason,
                   rs->reasoning.len - j->sent_reason);
    j->sent_reason = rs->reasoning.len;
  }
  if (content && rs->content.len > j->sent_content) {
    if (j->ant_think)
      close_block(j);
    text_delta(j, rs->content.p + j->sent_content,
               rs->content.len - j->sent_content);
    j->sent_content = rs->content.len;
  }
}

/* With tools: text streams up to where a call may start; once the answer
 * is done, each call is a tool_use block whose input comes as one
 * input_json_delta. Returns true when calls were sent. */
static bool stream_tools(sl_srv_job *j) {
  if (j->done && j->finish == SL_FINISH_ERROR)
    return false;
  if (sl__srv_job_splits(j)) /* the thinking first, as it comes */
    split_deltas(j, j->text_len, false);
  const char *p;
  size_t n = sl__srv_tool_stream_text(j, &p);
  if (n && j->ant_think)
    close_block(j);
  text_delta(j, p, n);
  const sl_srv_toolcalls *tc = sl__srv_job_calls(j);
  if (!tc)
    return false;
  close_block(j);
  for (int i = 0; i < tc->n; i++) {
    json_t *b = tool_use(j, tc, i);
    if (b)
      json_object_set_new(b, "input", json_object());
    emit(j, "content_block_start",
         json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index",
                   j->ant_blocks, "content_block", b));
    emit(j, "content_block_delta",
         json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta",
                   "index", j->ant_blocks, "delta", "type", "input_json_delta",
                   "partial_json", tc->v[i].arguments));
    emit(j, "content_block_stop",
         json_pack("{s:s,s:i}", "type", "content_block_stop", "index",
                   j->ant_blocks));
    j->ant_blocks++;
  }
  return true;
}

bool sl__ant_stream(sl_srv_job *j, const char *model,
                    const sl_tokenizer_t *tok) {
  bool tools = j->req.toolfmt != SL_TOOLFMT_NONE;
  bool split = !tools && sl__srv_job_splits(j);
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
      if (!tools && !split) { /* with tools, the first block may be a
                                 tool_use; with a split, a thinking one */
        emit(j, "content_block_start",
             json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_start",
                       "index", 0, "content_block", "type", "text", "text",
                       ""));
        j->ant_open = true;
      }
      emit(j, "ping", json_pack("{s:s}", "type", "ping"));
      j->phase = 1;
    }
  }
  if (j->phase == 1) {
    bool called = tools && stream_tools(j);
    if (split) {
      split_deltas(j, j->text_len, true);
      j->sent_toks = j->n_toks;
    }
    for (; !tools && !split && j->sent_toks < j->n_toks; j->sent_toks++) {
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
      if (called) {
        reason = "tool_use";
        stop_seq = NULL;
      } else if (!j->ant_open && !j->ant_blocks) {
        emit(j, "content_block_start",
             json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_start",
                       "index", 0, "content_block", "type", "text", "text",
                       ""));
        j->ant_open = true;
      }
      close_block(j);
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
