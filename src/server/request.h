/* sluice — server: a parsed request (sl_srv_request) and what the parser
 * checks it against (sl_srv_limits), as types: the parsers of its parts
 * (constrain.c, embed.c, prompt.c, tools.c, reasoning_req.c) fill them,
 * and parse.c, above them, calls those. Types only. */
#ifndef SLUICE_SERVER_REQUEST_H
#define SLUICE_SERVER_REQUEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/json.h"
#include "server/reasoning.h"
#include "server/toolcall.h"
#include "sluice/engine.h"
#include "sluice/jinja.h"

typedef enum sl_srv_api {
  SL_SRV_CHAT = 0,         /* POST /v1/chat/completions */
  SL_SRV_COMPLETIONS = 1,  /* POST /v1/completions */
  SL_SRV_MESSAGES = 2,     /* POST /v1/messages */
  SL_SRV_COUNT_TOKENS = 3, /* POST /v1/messages/count_tokens: as messages,
                              without max_tokens; nothing is generated */
  SL_SRV_EMBEDDINGS = 4,   /* POST /v1/embeddings (embed.c) */
} sl_srv_api;

/* One input of an embeddings request: text (tokenized by
 * sl__srv_embed_ids) or token ids. */
typedef struct sl_srv_input {
  char *text; /* NUL-terminated, or NULL */
  size_t len;
  int32_t *ids;
  int n_ids;
} sl_srv_input;

#define SL_SRV_MAX_EMBED_INPUTS 2048 /* OpenAI's limit */
#define SL_SRV_MAX_N            16   /* choices per request (n) */

/* What the parser checks against. */
typedef struct sl_srv_limits {
  const char *const *model_names; /* accepted "model" values */
  int n_model_names;
  int n_ctx; /* max_tokens may not exceed it */
  /* the model's chat template (NULL: none) and a forced tool-call format
   * (NONE: the template's): how tools and tool calls are written */
  const char *chat_template;
  sl_srv_toolfmt toolfmt;
  /* --reasoning-format: AUTO (the template's family), NONE or a family */
  sl_srv_rfmt rfmt;
  /* --reasoning-budget: sl_server_config.reasoning_budget */
  int reasoning_budget;
  /* when set, called with the request's "model" in place of the names
   * check: it fills n_ctx, chat_template and toolfmt of *lim (the server
   * leases the model from its pool here), or fails with *err set */
  sl_status (*resolve)(void *user, const char *model, struct sl_srv_limits *lim,
                       struct sl_srv_error *err);
  void *resolve_user;
} sl_srv_limits;

typedef enum sl_srv_tool_choice {
  SL_SRV_TOOLS_AUTO = 0,
  SL_SRV_TOOLS_NONE,
  SL_SRV_TOOLS_REQUIRED, /* OpenAI's required, Anthropic's any */
  SL_SRV_TOOLS_NAMED,
} sl_srv_tool_choice;

/* Stop strings allowed on the OpenAI routes (the OpenAI API's own limit);
 * Anthropic's stop_sequences take up to SL_MAX_STOP. Each string is at most
 * SL_MAX_STOP_BYTES long on both. */
#define SL_SRV_MAX_STOP_OPENAI 4

/* A validated request. Owns everything it points to; free with
 * sl__srv_request_free. */
typedef struct sl_srv_request {
  sl_srv_api api;
  char *model;     /* as the client wrote it */
  sl_jv *messages; /* chat / messages: list of {role, content} */
  char *prompt;    /* completions, text form (NUL-terminated) */
  size_t prompt_len;
  int32_t *prompt_ids; /* completions, token form */
  int n_prompt_ids;
  /* OpenAI's predicted output (its text), and its tokens once tokenized
   * (gen.prediction points there): drafts for speculative decoding */
  char *prediction;
  size_t prediction_len;
  int32_t *prediction_ids;
  bool stream;
  int n_choices;      /* n (OpenAI): choices, each its own engine request */
  bool include_usage; /* stream_options.include_usage */
  bool logprobs;      /* chat: logprobs; completions: logprobs != null */
  int top_logprobs;   /* number of alternatives per token */
  bool max_tokens_set;
  /* the last message (the assistant's) is continued rather than answered:
   * an Anthropic prefill, or chat's continue_final_message */
  bool continue_final;
  /* tools (tools.c): [{name, description?, parameters}] or NULL */
  json_t *tools;
  sl_srv_tool_choice tool_choice;
  char *tool_name;     /* SL_SRV_TOOLS_NAMED */
  bool tools_parallel; /* more than one call per answer */
  bool tools_native;   /* the template renders tools and tool_calls */
  /* how the answer's calls are read (NONE: no tools, or tool_choice none:
   * the answer is text) */
  sl_srv_toolfmt toolfmt;
  sl_jv *tmpl_extra; /* {"tools": [...], "enable_thinking", ...} for the
                        template, or NULL */
  /* reasoning (reasoning.c): how the answer's thinking is split out (NONE:
   * it stays content); the prompt opened the think block (set with the
   * prompt's ids); Anthropic's thinking.budget_tokens (0: no cap) */
  sl_srv_rfmt rfmt;
  bool think_open;
  int think_budget;
  /* embeddings (embed.c) */
  sl_srv_input *inputs;
  int n_inputs;
  bool emb_base64;       /* encoding_format base64 */
  int emb_dimensions;    /* 0: not given */
  sl_logit_bias *bias;   /* gen.logit_bias points here */
  sl_grammar_t *grammar; /* constrained decoding (gen.grammar), or NULL */
  sl_gen_params gen;     /* gen.stop points into stops[] */
  char *stops[SL_MAX_STOP];
} sl_srv_request;

#endif
