/* sluice — server: a job's answer as text (answer.h). */
#include <stdio.h>
#include <string.h>

#include "server/answer.h"
#include "server/json.h"

static bool is_blank(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/* ---- the split of its thinking ---------------------------------------------
 */

bool sl__srv_job_splits(const sl_srv_job *j) {
  return j->req.rfmt != SL_RFMT_NONE && j->req.api != SL_SRV_COMPLETIONS &&
         j->req.api != SL_SRV_EMBEDDINGS;
}

sl_srv_rsplit *sl__srv_job_split(sl_srv_job *j, size_t upto) {
  if (!sl__srv_job_splits(j))
    return NULL;
  if (!j->rs_on) {
    sl__srv_rsplit_init(&j->rs, j->req.rfmt, j->req.think_open);
    j->rs_on = true;
  }
  if (upto > j->text_len)
    upto = j->text_len;
  if (upto > j->rs_fed && !j->rs.finished) {
    sl__srv_rsplit_feed(&j->rs, j->text + j->rs_fed, upto - j->rs_fed);
    j->rs_fed = upto;
  }
  if (j->done && j->rs_fed == j->text_len)
    sl__srv_rsplit_finish(&j->rs);
  return &j->rs;
}

const char *sl__srv_job_content(sl_srv_job *j, size_t *len) {
  sl_srv_rsplit *rs = sl__srv_job_split(j, j->text_len);
  if (!rs || sl__srv_rsplit_oom(rs)) { /* out of memory: the text as it is */
    *len = j->text_len;
    return j->text ? j->text : "";
  }
  *len = rs->content.len;
  return rs->content.p ? rs->content.p : "";
}

int sl__srv_job_reasoning_tokens(sl_srv_job *j) {
  sl_srv_rsplit *rs = sl__srv_job_split(j, j->text_len);
  if (!rs || sl__srv_rsplit_oom(rs))
    return 0;
  size_t tb = sl__srv_rsplit_think_bytes(rs);
  int n = 0;
  for (int i = 0; i < j->n_toks && j->toks[i].text_off < tb; i++)
    n += j->toks[i].id >= 0; /* (id < 0: flushed text, no token) */
  return n;
}

/* ---- its tool calls ---------------------------------------------------------
 */

const sl_srv_toolcalls *sl__srv_job_calls(sl_srv_job *j) {
  if (j->req.toolfmt == SL_TOOLFMT_NONE || j->req.api == SL_SRV_COMPLETIONS ||
      !j->done)
    return NULL;
  if (!j->calls_read) {
    j->calls_read = true;
    size_t len; /* the content: after the thinking is split out */
    const char *text = sl__srv_job_content(j, &len);
    if (sl__srv_toolcalls_parse(j->req.toolfmt, text, len, &j->calls) != SL_OK)
      memset(&j->calls, 0, sizeof j->calls); /* out of memory: as text */
  }
  return j->calls.n ? &j->calls : NULL;
}

size_t sl__srv_tool_stream_text(sl_srv_job *j, const char **p) {
  size_t tlen; /* the content: after the thinking is split out */
  const char *text = sl__srv_job_content(j, &tlen);
  if (!j->sent_text) /* leading blanks are never content */
    while (j->sent_text < tlen && is_blank(text[j->sent_text]))
      j->sent_text++;
  *p = text + j->sent_text;
  if (!j->done) {
    size_t safe = sl__srv_toolcall_safe(j->req.toolfmt, text, tlen);
    if (safe <= j->sent_text)
      return 0;
    size_t n = sl__utf8_valid_prefix(*p, safe - j->sent_text);
    j->sent_text += n;
    return n;
  }
  const sl_srv_toolcalls *tc = sl__srv_job_calls(j);
  size_t from = j->sent_text;
  j->sent_text = tlen;
  if (!tc) /* no call: the rest is text */
    return tlen - from;
  /* what went out is the start of the calls' content (the text before the
   * first call, blanks trimmed); the rest of that content follows */
  size_t lead = 0;
  while (lead < tlen && is_blank(text[lead]))
    lead++;
  size_t sent = from - lead;
  *p = tc->content + (sent <= tc->content_len ? sent : tc->content_len);
  return sent <= tc->content_len ? tc->content_len - sent : 0;
}

void sl__srv_tool_id(const sl_srv_job *j, int i, const char *prefix, char *buf,
                     size_t cap) {
  const char *own = j->id;
  for (const char *p = j->id; *p; p++)
    if (*p == '-' || *p == '_')
      own = p + 1;
  snprintf(buf, cap, "%s%s%02d", prefix, own, i);
}
