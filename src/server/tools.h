/* sluice — server: tools and tool_choice in requests, tool calls and results
 * in the conversation, the grammar of a forced call (tools.c). */
#ifndef SLUICE_SERVER_TOOLS_H
#define SLUICE_SERVER_TOOLS_H

#include <jansson.h>
#include <stdbool.h>

#include "server/json.h"
#include "server/request.h"
#include "sluice/jinja.h"

/* A JSON value as a template value (new, or NULL when out of memory). */
sl_jv *sl__srv_json_to_jv(json_t *v);
/* Reads tools, tool_choice and parallel_tool_calls (OpenAI) or
 * tool_choice.disable_parallel_tool_use (Anthropic) into r. */
sl_status sl__srv_tools_parse(json_t *root, bool anthropic, sl_srv_request *r,
                              sl_srv_error *err);
/* Sets r->tools_native and r->toolfmt from the template (before the
 * messages are read). */
void sl__srv_tools_decide(sl_srv_request *r, const sl_srv_limits *lim);
/* For a template that does not render tools: the system text that
 * describes them and the JSON to answer with. */
void sl__srv_tools_instructions(const sl_srv_request *r, sl_sbuf *out);
/* r->tmpl_extra for a template that renders tools. */
sl_status sl__srv_tools_template(sl_srv_request *r);
/* An OpenAI chat message (role checked, content already in text) with its
 * tool_calls / tool_call_id and an assistant's reasoning_content (the
 * template's message.reasoning_content), appended to r->messages. */
sl_status sl__srv_msg_openai(json_t *m, const char *role, sl_sbuf *text,
                             const sl_srv_request *r, const char *param,
                             sl_srv_error *err);
/* Whether an Anthropic content list holds blocks other than text:
 * tool_use, tool_result, thinking, redacted_thinking. */
bool sl__srv_ant_has_blocks(json_t *content);
/* Such a message: its tool_result blocks become tool messages, its text
 * and tool_use blocks one message of `role`, with an assistant's thinking
 * blocks as its reasoning_content (redacted ones, opaque, are dropped). */
sl_status sl__srv_msg_anthropic(json_t *content, const char *role,
                                const sl_srv_request *r, const char *param,
                                sl_srv_error *err);
/* The GBNF of the calls r->tool_choice forces (required or named), in
 * r->toolfmt's format; *fmt_out: the format to read the answer with. */
sl_status sl__srv_tools_grammar(const sl_srv_request *r, sl_sbuf *g,
                                sl_srv_toolfmt *fmt_out, char *err,
                                size_t errcap);

#endif
