/* sluice — server: a job's answer as text (answer.c): its thinking split
 * out of the content, its tool calls, and what a stream sends next. The
 * consumer's state, under the job's mu. Here rather than in reasoning.c
 * and toolcall.c, which parse text and know no job. */
#ifndef SLUICE_SERVER_ANSWER_H
#define SLUICE_SERVER_ANSWER_H

#include <stdbool.h>
#include <stddef.h>

#include "server/job.h"
#include "server/reasoning.h"
#include "server/toolcall.h"

/* True when the job's answer is split (a chat or messages job whose
 * family is not NONE). */
bool sl__srv_job_splits(const sl_srv_job *j);
/* Feeds the job's text up to byte `upto` (at most text_len) to its
 * splitter, and finishes it once the job is done and all is fed. Returns
 * the splitter (NULL when the job does not split). */
sl_srv_rsplit *sl__srv_job_split(sl_srv_job *j, size_t upto);
/* The answer's content: the split's when it splits (all of the text fed),
 * else the text. *len its bytes. */
const char *sl__srv_job_content(sl_srv_job *j, size_t *len);
/* The answer's tokens that are thinking (usage's reasoning_tokens): those
 * whose text starts inside the think block (its tags included); 0 when the
 * job does not split. */
int sl__srv_job_reasoning_tokens(sl_srv_job *j);

/* The calls in a finished job's answer: NULL when the request reads none
 * (no tools, tool_choice none, completions) or the answer holds none. */
const sl_srv_toolcalls *sl__srv_job_calls(sl_srv_job *j);
/* With tools, the content to stream now (*p, the byte count; 0: none):
 * the text up to where a call may start while the job runs; once it is
 * done, the rest of the text, or of the calls' content when it holds
 * calls. Advances j->sent_text. */
size_t sl__srv_tool_stream_text(sl_srv_job *j, const char **p);
/* The id of the job's call i: prefix + the job id's own part + i. */
void sl__srv_tool_id(const sl_srv_job *j, int i, const char *prefix, char *buf,
                     size_t cap);

#endif
