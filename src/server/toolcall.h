/* sluice — server: tool calls read out of a model's text, per format family
 * (toolcall.c). */
#ifndef SLUICE_SERVER_TOOLCALL_H
#define SLUICE_SERVER_TOOLCALL_H

#include <stdbool.h>
#include <stddef.h>

#include "sluice/status.h"

/* The families of tool-call formats a model writes. */
typedef enum sl_srv_toolfmt {
  SL_TOOLFMT_NONE = 0,
  SL_TOOLFMT_HERMES,  /* <tool_call>{"name", "arguments"}</tool_call> */
  SL_TOOLFMT_LLAMA3,  /* {"name", "parameters"}, maybe after <|python_tag|> */
  SL_TOOLFMT_MISTRAL, /* [TOOL_CALLS][{...}] or [TOOL_CALLS]name[ARGS]{...} */
  SL_TOOLFMT_GENERIC, /* {"tool_calls": [...]}, {"tool_call": {...}}, or a
                         list of {"name", "arguments"} */
} sl_srv_toolfmt;

/* The family a chat template's text implies (GENERIC when it shows none). */
sl_srv_toolfmt sl__srv_toolfmt_of_template(const char *tmpl);
const char *sl__srv_toolfmt_name(sl_srv_toolfmt f); /* "hermes", ... */
/* True when s[0..n) is letters, digits, '_', '-', '.' (a function name). */
bool sl__srv_name_chars(const char *s, size_t n);
bool sl__srv_toolfmt_parse(const char *s, sl_srv_toolfmt *out);

typedef struct sl_srv_toolcall {
  char *name;
  char *arguments; /* a JSON object, compact */
} sl_srv_toolcall;

typedef struct sl_srv_toolcalls {
  sl_srv_toolcall *v;
  int n, cap;
  char *content; /* the text that is not a call (NUL-terminated) */
  size_t content_len;
} sl_srv_toolcalls;

/* Reads the calls in text[0..len) written in format f. A call whose JSON is
 * broken, or that has no name or no object of arguments, is left as text.
 * With no call, content is the whole text. SL_ERR_NOMEM (nothing to
 * free). */
sl_status sl__srv_toolcalls_parse(sl_srv_toolfmt f, const char *text,
                                  size_t len, sl_srv_toolcalls *out);
void sl__srv_toolcalls_free(sl_srv_toolcalls *t);

/* While an answer in format f streams: how many bytes of text[0..len) are
 * content for sure (before the first place a call may start, trailing
 * blanks held back too). */
size_t sl__srv_toolcall_safe(sl_srv_toolfmt f, const char *text, size_t len);

#endif
