/* sluice — server: a model's thinking split out of its text (reasoning.c),
 * per format family, the family picked from the chat template or forced
 * with --reasoning-format. The request fields that steer thinking are
 * reasoning_req.h's.
 *
 * The splitter is incremental: it is fed the generated text piece by piece
 * as tokens arrive and appends each byte, once decided, to its reasoning
 * or to its content. A byte that may still turn out to be part of a tag
 * (a "</thi" at the end of a piece) or blanks that may end the reasoning
 * are held back until the next piece or the end decides them. Whatever
 * the pieces, the two texts are the same as when fed the whole at once
 * (test_server_reason checks every split). */
#ifndef SLUICE_SERVER_REASONING_H
#define SLUICE_SERVER_REASONING_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/json.h"
#include "sluice/status.h"
#include "sluice/tokenizer.h"

/* The families of reasoning formats (llama.cpp's --reasoning-format
 * names). */
typedef enum sl_srv_rfmt {
  SL_RFMT_NONE = 0, /* thinking stays in the content */
  SL_RFMT_AUTO,     /* the template's family (a setting, never a request's) */
  SL_RFMT_DEEPSEEK, /* <think>...</think> (DeepSeek-R1, Qwen3, QwQ) */
} sl_srv_rfmt;

/* "none", "auto", "deepseek" -> *out; false for another name. */
bool sl__srv_rfmt_parse(const char *s, sl_srv_rfmt *out);
const char *sl__srv_rfmt_name(sl_srv_rfmt f);
/* The family a chat template's text implies (NONE when it shows none). */
sl_srv_rfmt sl__srv_rfmt_of_template(const char *tmpl);
/* A setting (AUTO or a family) and a model's template -> a request's
 * family. */
sl_srv_rfmt sl__srv_rfmt_pick(sl_srv_rfmt setting, const char *tmpl);

/* True when the prompt text p[0..n) leaves the answer inside a think block
 * of family f: the template opened it in the generation prompt (DeepSeek-R1,
 * Qwen3-thinking write "<think>\n" after the assistant's header). */
bool sl__srv_think_opened_text(sl_srv_rfmt f, const char *p, size_t n);
/* The same read from the prompt's last token ids (their pieces, special
 * tokens as written). */
bool sl__srv_think_opened(sl_srv_rfmt f, const sl_tokenizer_t *tok,
                          const int32_t *ids, int n);
/* The text that closes an open think block of family f ("\n</think>\n\n");
 * what the thinking budget forces. */
const char *sl__srv_think_close(sl_srv_rfmt f);

/* The splitter's state. Owns its buffers: free with sl__srv_rsplit_free. */
typedef struct sl_srv_rsplit {
  sl_srv_rfmt f;
  int state;         /* reasoning.c's R_* */
  bool finished;     /* sl__srv_rsplit_finish ran: nothing is held */
  sl_sbuf hold;      /* fed bytes not yet decided */
  sl_sbuf reasoning; /* the thinking, without its tags and outer blanks */
  sl_sbuf content;   /* the rest, as the answer's content */
  size_t fed;        /* bytes fed so far */
  bool thought;      /* a think block opened (in the prompt or the text) */
  size_t think_end;  /* where the block closed: the input's bytes up to
                        and with the closing tag (0: not closed) */
} sl_srv_rsplit;

/* A splitter for family f; `opened`: the prompt opened the think block.
 * With NONE everything is content. */
void sl__srv_rsplit_init(sl_srv_rsplit *p, sl_srv_rfmt f, bool opened);
/* Feeds s[0..n) (any bytes). Out of memory shows in reasoning.oom,
 * content.oom or hold.oom. Not after sl__srv_rsplit_finish. */
void sl__srv_rsplit_feed(sl_srv_rsplit *p, const char *s, size_t n);
/* The text is complete: what is held is decided (a think block cut off
 * stays reasoning). Idempotent. */
void sl__srv_rsplit_finish(sl_srv_rsplit *p);
/* True while the text fed so far ends inside a think block. */
bool sl__srv_rsplit_thinking(const sl_srv_rsplit *p);
bool sl__srv_rsplit_oom(const sl_srv_rsplit *p);
/* The bytes of the input fed so far that belong to the thinking, its tags
 * with it: 0 without a think block, up to the closing tag's end once it
 * closed, everything fed while it is open. */
size_t sl__srv_rsplit_think_bytes(const sl_srv_rsplit *p);
void sl__srv_rsplit_free(sl_srv_rsplit *p);

#endif
