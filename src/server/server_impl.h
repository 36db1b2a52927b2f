/* sluice — server internals shared by the files of src/server/.
 *
 * Layers inside the server:
 *   json.c      UTF-8 checks, a string builder, API error bodies (no engine)
 *   parse.c     request bodies -> sl_srv_request, or an sl_srv_error
 *   prompt.c    sl_srv_request -> prompt token ids (chat template, tokenizer)
 *   schema.c    JSON Schema -> GBNF (structured output)
 *   tools.c     tools and tool_choice, tool calls and results in the
 *               conversation, the grammar of a forced call
 *   toolcall.c  tool calls read out of a model's text, per format family
 *   openai.c    OpenAI response bodies and SSE chunks
 *   anthropic.c Anthropic response bodies and SSE events
 *   admin.c     /health, /metrics, /admin/api/stats
 *   routes.c    /v1/models, count_tokens, /tokenize, /detokenize,
 *               /apply-template
 *   http.c      libmicrohttpd plumbing, routing, auth, the request lifecycle
 *   head.c      the request head check, raw (pre-libmicrohttpd) error answers
 *   door.c      the front door: accept, connection limits, the first head
 *   sockwatch.c the request watch (a 400 for bytes that make no line, a
 *               408 past the request deadline), and the parked-job tick
 */
#ifndef SLUICE_SERVER_IMPL_H
#define SLUICE_SERVER_IMPL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/engine.h"
#include "sluice/jinja.h"
#include "sluice/memsync.h"
#include "sluice/pool.h"
#include "sluice/server.h"
#include "sluice/tokenizer.h"

struct MHD_Connection; /* libmicrohttpd's, http.c only */
struct MHD_Daemon;

/* ---- json.c: text and JSON helpers --------------------------------------- */

/* True when buf[0..len) is well-formed UTF-8 (no overlongs, no surrogates,
 * nothing above U+10FFFF). */
bool sl__utf8_valid(const char *buf, size_t len);

/* Length of the longest prefix of buf[0..len) that is whole, valid UTF-8
 * characters (an incomplete sequence at the end is left out). */
size_t sl__utf8_valid_prefix(const char *buf, size_t len);

/* A growable byte string; `oom` sticks once an append failed. */
typedef struct sl_sbuf {
  char *p;
  size_t len, cap;
  bool oom;
} sl_sbuf;

void sl__sbuf_add(sl_sbuf *b, const void *data, size_t n);
void sl__sbuf_adds(sl_sbuf *b, const char *s);
void sl__sbuf_addf(sl_sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Appends the compact serialization of `j` (borrowed). */
void sl__sbuf_add_json(sl_sbuf *b, const json_t *j);
void sl__sbuf_free(sl_sbuf *b);

/* A JSON string of buf[0..len), invalid UTF-8 replaced by U+FFFD. New
 * reference, or NULL when out of memory. */
json_t *sl__json_str_lossy(const char *buf, size_t len);

/* One-time JSON setup (none needed today; jansson keeps libc malloc). */
void sl__srv_json_init(void);

/* Which API's error shape to use. */
typedef enum sl_srv_family {
  SL_SRV_FAMILY_OPENAI = 0,
  SL_SRV_FAMILY_ANTHROPIC = 1,
} sl_srv_family;

/* An API error: HTTP status, and the fields of the error body. */
typedef struct sl_srv_error {
  int http;       /* 400, 401, 404, 405, 413, 500, 503 */
  char code[48];  /* OpenAI error.code ("" = null) */
  char param[64]; /* OpenAI error.param ("" = null) */
  char message[512];
  uint64_t est_bytes, limit_bytes; /* memory-guard refusals (0: absent) */
} sl_srv_error;

/* Fills *e. `code` and `param` may be NULL. */
void sl__srv_error_set(sl_srv_error *e, int http, const char *code,
                       const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* The error body in the family's shape:
 *   OpenAI:    {"error":{"message","type","param","code"}}
 *   Anthropic: {"type":"error","error":{"type","message"}}
 * New reference, or NULL when out of memory. */
json_t *sl__srv_error_json(sl_srv_family fam, const sl_srv_error *e);

/* ---- json_scan.c: a body's shape, before jansson builds it -------------- */
#define SL__JSON_MAX_DEPTH         64
#define SL__JSON_MAX_CONTAINERS    20000  /* objects and arrays */
#define SL__JSON_MAX_ELEMENTS      262144 /* commas: 2^18 */
#define SL__JSON_MAX_UNKNOWN_FIELD 65536  /* bytes of an unknown field */

/* SL_OK, or SL_ERR_FORMAT with a 400 in *err for a body past one of
 * the limits above (a body that is not JSON passes: jansson says why). */
sl_status sl__srv_json_scan(const char *body, size_t len, sl_srv_error *err);
/* Once per process (sl_server_create): bodies of 1 MiB and more mmapped,
 * so freed at once. */
void sl__srv_malloc_init(void);

/* ---- parse.c: request bodies --------------------------------------------- */

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

/* The families of tool-call formats a model writes. */
typedef enum sl_srv_toolfmt {
  SL_TOOLFMT_NONE = 0,
  SL_TOOLFMT_HERMES,  /* <tool_call>{"name", "arguments"}</tool_call> */
  SL_TOOLFMT_LLAMA3,  /* {"name", "parameters"}, maybe after <|python_tag|> */
  SL_TOOLFMT_MISTRAL, /* [TOOL_CALLS][{...}] or [TOOL_CALLS]name[ARGS]{...} */
  SL_TOOLFMT_GENERIC, /* {"tool_calls": [...]}, {"tool_call": {...}}, or a
                         list of {"name", "arguments"} */
} sl_srv_toolfmt;

/* What the parser checks against. */
typedef struct sl_srv_limits {
  const char *const *model_names; /* accepted "model" values */
  int n_model_names;
  int n_ctx; /* max_tokens may not exceed it */
  /* the model's chat template (NULL: none) and a forced tool-call format
   * (NONE: the template's): how tools and tool calls are written */
  const char *chat_template;
  sl_srv_toolfmt toolfmt;
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
  sl_jv *tmpl_extra; /* {"tools": [...]} for the template, or NULL */
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

/* Parses and validates a request body for `api`. The body need not be
 * NUL-terminated and may be any bytes. On SL_OK *out is filled (free it with
 * sl__srv_request_free); otherwise *err says why (its http field is the
 * status to answer with) and *out holds nothing to free. Returns
 * SL_ERR_FORMAT for bad input, SL_ERR_NOT_FOUND for an unknown model,
 * SL_ERR_UNSUPPORTED for unsupported values, SL_ERR_NOMEM. */
sl_status sl__srv_parse(sl_srv_api api, const char *body, size_t len,
                        const sl_srv_limits *lim, sl_srv_request *out,
                        sl_srv_error *err);

void sl__srv_request_free(sl_srv_request *r);

/* A request body as a JSON object (new reference): UTF-8 checked, its shape
 * scanned (json_scan.c), parsed. NULL with *err filled otherwise (400; 503
 * when out of memory). Every route with a body reads it through this. */
json_t *sl__srv_body_object(const char *body, size_t len, sl_srv_error *err);

/* Joins a content value into text: a string, or a list of {type: "text",
 * text} parts. 1 on success, -1 with err set. */
int sl__srv_content_text(json_t *c, const char *param, bool allow_null,
                         sl_sbuf *out, sl_srv_error *err);
/* Compiles GBNF into r->grammar; a 400 naming `param` when it does not. */
sl_status sl__srv_set_grammar(sl_srv_request *r, const char *gbnf, size_t len,
                              const char *param, sl_srv_error *err);

/* ---- tools.c: tools in requests ------------------------------------------ */

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
 * tool_calls / tool_call_id, appended to r->messages. */
sl_status sl__srv_msg_openai(json_t *m, const char *role, sl_sbuf *text,
                             const sl_srv_request *r, const char *param,
                             sl_srv_error *err);
/* Whether an Anthropic content list holds tool_use / tool_result blocks. */
bool sl__srv_ant_has_tool_blocks(json_t *content);
/* Such a message: its tool_result blocks become tool messages, its text
 * and tool_use blocks one message of `role`. */
sl_status sl__srv_msg_anthropic(json_t *content, const char *role,
                                const sl_srv_request *r, const char *param,
                                sl_srv_error *err);
/* The GBNF of the calls r->tool_choice forces (required or named), in
 * r->toolfmt's format; *fmt_out: the format to read the answer with. */
sl_status sl__srv_tools_grammar(const sl_srv_request *r, sl_sbuf *g,
                                sl_srv_toolfmt *fmt_out, char *err,
                                size_t errcap);

/* ---- toolcall.c: tool calls read out of a model's text ------------------- */

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

/* ---- schema.c: JSON Schema -> GBNF (constrained decoding) ---------------- */

/* Appends to *out a GBNF grammar (start rule "root") of the JSON texts that
 * `schema` (borrowed) describes. SL_ERR_FORMAT with a message in err for
 * what a grammar here cannot say (pattern, numeric bounds, ...) or a
 * malformed schema; SL_ERR_NOMEM. */
sl_status sl__srv_schema_gbnf(json_t *schema, sl_sbuf *out, char *err,
                              size_t errcap);
/* Rules for several schemas (tool arguments) in one numbering (no root, no
 * base rules): names[i] gets the rule that starts schemas[i]. An object
 * that lists properties and says nothing of additionalProperties takes no
 * others here. Errors as above. */
sl_status sl__srv_schema_rules(json_t *const *schemas, int n, char (*names)[24],
                               sl_sbuf *out, char *err, size_t errcap);
/* The base rules (ws, json-value, json-string, ...) the rules above use. */
void sl__srv_json_base_gbnf(sl_sbuf *out);
/* Appends the grammar of any JSON object (response_format json_object). */
void sl__srv_json_object_gbnf(sl_sbuf *out);

/* ---- embed.c: /v1/embeddings -------------------------------------------- */

sl_status sl__srv_parse_embeddings(json_t *root, const sl_srv_limits *lim,
                                   sl_srv_request *r, sl_srv_error *err);
void sl__srv_embed_free(sl_srv_request *r);
/* Tokenizes the text inputs (special tokens parsed, BOS as the model adds
 * it) and checks every input's ids: in the vocabulary, fewer than n_ctx. */
sl_status sl__srv_embed_ids(sl_srv_request *r, const sl_tokenizer_t *tok,
                            int n_ctx, sl_srv_error *err);

/* ---- prompt.c: the prompt's token ids ------------------------------------ */

/* Renders the chat template (chat / messages) or takes the prompt text or
 * ids (completions), and tokenizes. `chat_template` may be NULL (no template
 * in the model: chat requests then fail with 400). Special tokens (e.g.
 * "<|im_end|>") are parsed in the template's own text but not in the text of
 * the messages, unless `parse_special_in_content` (llama.cpp's behaviour);
 * a completion's prompt text is the client's whole prompt and always has
 * them parsed. On SL_OK stores a new array (free with sl_free) in *ids and
 * its length in *n; on failure fills *err. */
sl_status sl__srv_prompt_ids(const sl_srv_request *r, const sl_tokenizer_t *tok,
                             const char *chat_template,
                             bool parse_special_in_content, int32_t **ids,
                             int *n, sl_srv_error *err);

/* The chat template's text for a chat / messages request, as the prompt
 * is made of it (llama.cpp's /apply-template): *text (free with sl_free),
 * *len. Errors as above. */
sl_status sl__srv_prompt_text(const sl_srv_request *r,
                              const sl_tokenizer_t *tok,
                              const char *chat_template, char **text,
                              size_t *len, sl_srv_error *err);

/* ---- the running request (http.c owns its lifecycle) ----------------------
 */

typedef struct sl_srv_tok {
  int32_t id;
  float logprob;
  size_t text_off, text_len; /* the event's text in job->text */
  int n_top;
  sl_token_logprob top[SL_MAX_TOP_LOGPROBS];
} sl_srv_tok;

typedef struct sl_srv_job sl_srv_job;

/* One input of an embeddings job: the engine callback's user pointer. */
typedef struct sl_srv_emb_part {
  sl_srv_job *job;
  int index;
  uint64_t engine_id; /* 0: not submitted */
} sl_srv_emb_part;

/* A model as one request uses it: its pool lease (engine, model, tokenizer,
 * chat template, context) while the request lives (routes.c). */
typedef struct sl_srv_model {
  sl_server_t *srv;
  sl_pool_lease lease; /* index -1: none */
} sl_srv_model;

struct sl_srv_job {
  atomic_int refs;
  sl_server_t *srv;
  sl_srv_model mdl; /* the parent's (children use their parent's) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  sl_srv_job *prev, *next; /* the server's list of live jobs */

  sl_srv_request req;
  int32_t *ids;
  int n_ids;
  uint64_t engine_id;
  bool submitted;
  char id[48]; /* "chatcmpl-...", "cmpl-...", "msg_..." */
  long long created;
  int fd; /* the client's socket, to notice a hang-up */
  /* the connection while it waits on the engine (under mu; NULL once MHD
   * completed it): parked = suspended by the handler until the engine's
   * next event resumes it (resumed); http.c */
  struct MHD_Connection *conn;
  bool parked, resumed;
  bool watched; /* fd registered with sl__srv_watch_hangup */

  /* filled by the engine callback, under mu */
  char *text;
  size_t text_len, text_cap;
  sl_srv_tok *toks;
  int n_toks, toks_cap;
  bool started, done, oom;
  int prompt_tokens, cached_tokens, completion_tokens;
  sl_finish finish;
  sl_status error;
  sl_reason reason; /* sluice/reason.h */
  char error_msg[256];
  uint64_t est_bytes, limit_bytes;
  uint64_t t_submit, t_first, t_done;

  /* n > 1: one child job per choice (its text, tokens, finish), which the
   * engine's events fill; the parent holds the connection and answers for
   * all. A child's req is a shallow copy of the parent's (never freed). */
  sl_srv_job *kids, *parent;
  int index; /* the choice's index (0 for a lone job) */
  /* embeddings: one part per input; the vectors (n_inputs, n_embd);
   * children: their engine ids */
  sl_srv_emb_part *parts;
  int n_parts, parts_done;
  float *emb;
  int n_embd;

  /* tools: the answer's calls, read once it is done (sl__srv_job_calls) */
  sl_srv_toolcalls calls;
  bool calls_read;

  /* the consumer's (HTTP thread's) state */
  int phase;        /* streaming state machine, per API */
  size_t sent_text; /* with tools: text bytes streamed as content (or
                       skipped as leading blanks) */
  int ant_blocks;   /* Anthropic: content blocks started */
  bool ant_open;    /* Anthropic: a text block is open */
  int sent_toks;    /* token records already streamed */
  bool aborted;     /* we asked the engine to abort */
  bool cut;         /* ... because the server is shutting down (under mu): the
                       abort ends it as an error (503), not as complete */
  bool accounted;   /* metrics recorded */
  sl_sbuf out;      /* bytes produced and not yet handed to MHD */
  size_t out_off;
};

/* The finish reason strings. */
const char *sl__srv_finish_openai(sl_finish f);
/* Anthropic stop_reason; *stop_seq gets the matched stop string or NULL. */
const char *sl__srv_finish_anthropic(const sl_srv_job *j,
                                     const sl_tokenizer_t *tok,
                                     const char **stop_seq);

/* The calls in a finished job's answer (toolcall.c): NULL when the request
 * reads none (no tools, tool_choice none, completions) or the answer holds
 * none. */
const sl_srv_toolcalls *sl__srv_job_calls(sl_srv_job *j);
/* With tools, the content to stream now (*p, the byte count; 0: none):
 * the text up to where a call may start while the job runs; once it is
 * done, the rest of the text, or of the calls' content when it holds
 * calls. Advances j->sent_text. */
size_t sl__srv_tool_stream_text(sl_srv_job *j, const char **p);
/* The id of the job's call i: prefix + the job id's own part + i. */
void sl__srv_tool_id(const sl_srv_job *j, int i, const char *prefix, char *buf,
                     size_t cap);

/* Builds a job's error when the engine finished it with SL_FINISH_ERROR. */
void sl__srv_job_error(const sl_srv_job *j, sl_srv_error *e);

/* openai.c / anthropic.c. All are called with j->mu held.
 * *_body: the whole non-streaming body (new reference or NULL on OOM).
 * *_stream: appends every SSE byte that the job's new events allow to
 * j->out and returns true once the stream is complete. */
json_t *sl__oai_body(sl_srv_job *j, const char *model,
                     const sl_tokenizer_t *tok);
bool sl__oai_stream(sl_srv_job *j, const char *model,
                    const sl_tokenizer_t *tok);
json_t *sl__ant_body(sl_srv_job *j, const char *model,
                     const sl_tokenizer_t *tok);
/* embed.c: the /v1/embeddings answer of a done job. */
json_t *sl__srv_embed_body(const sl_srv_job *j, const char *model);
bool sl__ant_stream(sl_srv_job *j, const char *model,
                    const sl_tokenizer_t *tok);

/* ---- server state ----------------------------------------------------------
 */

#define SL_SRV_TTFT_BUCKETS 12
#define SL_SRV_TPOT_BUCKETS 11

/* One answered request, for the dashboard's list (admin.c). */
typedef struct sl_srv_recent {
  double t;        /* when it ended, Unix seconds */
  char model[64];  /* as the request named it */
  char api[16];    /* "chat", "completions", "messages", "embeddings", "" */
  int http;        /* the status it was answered with */
  char finish[16]; /* stop, length, abort, error, "" */
  int prompt_tokens, cached_tokens, completion_tokens;
  double ttft_ms, tpot_ms; /* 0: none */
} sl_srv_recent;

#define SL_SRV_RECENT 64

typedef struct sl_srv_metrics {
  pthread_mutex_t mu;
  sl_srv_recent recent[SL_SRV_RECENT]; /* a ring, newest at recent_n - 1 */
  uint64_t recent_n;
  uint64_t http_requests;   /* every HTTP request */
  uint64_t requests;        /* generation requests */
  uint64_t requests_failed; /* answered with an error */
  uint64_t prompt_tokens, cached_tokens, generated_tokens;
  uint64_t ttft_counts[SL_SRV_TTFT_BUCKETS]; /* cumulative at output */
  double ttft_sum;
  uint64_t ttft_n;
  uint64_t tpot_counts[SL_SRV_TPOT_BUCKETS];
  double tpot_sum;
  uint64_t tpot_n;
  sl_unreleased_est unreleased; /* guarded by mu */
} sl_srv_metrics;

extern const double sl__srv_ttft_bounds[SL_SRV_TTFT_BUCKETS];
extern const double sl__srv_tpot_bounds[SL_SRV_TPOT_BUCKETS];

/* ---- head.c: the request head check --------------------------------------
 */

#define SL_SRV_HEAD_MAX   16384 /* request head bytes (431 past this) */
#define SL_SRV_TARGET_MAX 8192  /* request-target bytes (414 past this) */
#define SL_SRV_METHOD_MAX 32

enum { SL_SRV_HEAD_BAD = -1, SL_SRV_HEAD_MORE = 0, SL_SRV_HEAD_OK = 1 };

typedef struct sl_srv_head_info {
  size_t len;     /* SL_SRV_HEAD_OK: the head's bytes, its empty line too */
  bool anthropic; /* the target is /v1/messages or below */
  bool line_done; /* the request line was seen whole */
} sl_srv_head_info;

/* Checks the start p[0..n) of a connection's bytes: SL_SRV_HEAD_OK when a
 * whole, valid head is there; SL_SRV_HEAD_MORE when what came so far can
 * still start one; SL_SRV_HEAD_BAD with *err (400, 414, 431 or 505)
 * otherwise. Pure: no allocation. */
int sl__srv_head_check(const char *p, size_t n, sl_srv_head_info *info,
                       sl_srv_error *err);

/* Whether errors on target t[0..n) take Anthropic's shape: /v1/messages
 * and the paths under it (a query string aside), not /v1/messagesXYZ.
 * Every other path, known or not, answers in OpenAI's shape. */
bool sl__srv_anthropic_target(const char *t, size_t n);

/* Appends a whole HTTP/1.1 response for `e` (JSON in `fam`'s shape,
 * Connection: close) to out. */
void sl__srv_raw_error(sl_srv_family fam, const sl_srv_error *e, sl_sbuf *out);

/* ---- door.c: the front door ------------------------------------------------
 */

typedef struct sl_srv_door sl_srv_door;

typedef struct sl_srv_door_cfg {
  const struct sockaddr *addr; /* where to listen */
  unsigned addrlen;
  unsigned max_conns;  /* open connections, all clients */
  unsigned max_per_ip; /* open connections per client address (0: any) */
  unsigned idle_ms;    /* a new connection that sends nothing: closed */
  unsigned line_ms;    /* bytes with no line end: 400 */
  unsigned head_ms;    /* first byte to whole head: 408 */
  /* hands a connection whose first head is whole (and valid) on; false
   * when it was not taken (the socket is closed then) */
  bool (*hand)(void *arg, int fd, const struct sockaddr *a, unsigned alen);
  void *arg;
} sl_srv_door_cfg;

typedef struct sl_srv_door_stats {
  uint64_t refused_total;  /* over max_conns (or out of fds) */
  uint64_t refused_per_ip; /* over max_per_ip */
  uint64_t head_errors;    /* answered 400/414/431/505 at the door */
  uint64_t head_timeouts;  /* answered 408 at the door */
  uint64_t handed;         /* passed on to libmicrohttpd */
  unsigned live;           /* connections open now */
} sl_srv_door_stats;

/* Binds, listens and starts the door's thread; *port gets the bound port.
 * NULL with a message in err on failure. */
sl_srv_door *sl__srv_door_start(const sl_srv_door_cfg *cfg, int *port,
                                char *err, size_t errcap);
/* Stops accepting: closes the listening socket and every connection not
 * yet handed on, and joins the thread. Handed connections stay counted
 * until released. */
void sl__srv_door_close(sl_srv_door *d);
/* Frees the door (closing it first); after libmicrohttpd stopped. */
void sl__srv_door_free(sl_srv_door *d);
/* A handed connection's socket is about to be closed. */
void sl__srv_door_release(sl_srv_door *d, int fd);
/* When the first byte of a handed connection came (sl_now_ns; 0: unknown). */
uint64_t sl__srv_door_first_byte(sl_srv_door *d, int fd);
void sl__srv_door_stats_get(sl_srv_door *d, sl_srv_door_stats *out);

/* ---- sockwatch.c: the request watch ---------------------------------------
 */

/* A connection whose bytes make no request line within this long of their
 * arrival gets a 400 and is closed. */
#define SL_SRV_LINE_DEADLINE_MS 1000

typedef struct sl_srv_watch sl_srv_watch;
typedef struct sl_srv_sock sl_srv_sock;

/* Starts the watch and its thread. Every SL_SRV_WATCH_TICK_MS it cuts the
 * connections past their deadlines (line_ms: bytes but no request line,
 * 400; request_ms: a request's first byte to its last, 408), then calls
 * tick(arg) with no lock held. Returns NULL when out of memory or
 * threads. Stop it with sl__srv_watch_stop once every connection it
 * watches was removed (after MHD_stop_daemon). */
sl_srv_watch *sl__srv_watch_start(unsigned line_ms, unsigned request_ms,
                                  void (*tick)(void *arg), void *arg);
void sl__srv_watch_stop(sl_srv_watch *w);
/* Starts watching a connection's socket; t_first: when its first request's
 * first byte came (0: not yet). Returns its entry, or NULL (not watched)
 * when out of memory; every entry must be removed before its fd closes. */
sl_srv_sock *sl__srv_watch_add(sl_srv_watch *w, int fd, uint64_t t_first);
/* Stops watching and frees k. */
void sl__srv_watch_remove(sl_srv_watch *w, sl_srv_sock *k);
/* A request line was parsed. */
void sl__srv_watch_request(sl_srv_watch *w, sl_srv_sock *k);
/* The request in progress was read whole: no deadline until the next. */
void sl__srv_watch_read(sl_srv_watch *w, sl_srv_sock *k);
/* The request completed (the connection is idle, or closes). */
void sl__srv_watch_idle(sl_srv_watch *w, sl_srv_sock *k);
/* on: wake the tick as soon as fd's client hangs up (a parked job's
 * connection, which libmicrohttpd does not poll); off: before fd closes.
 * Without it the tick still runs every SL_SRV_WATCH_TICK_MS. */
void sl__srv_watch_hangup(sl_srv_watch *w, int fd, bool on);

struct sl_server {
  sl_pool_t *pool;      /* the models (borrowed); "default" is entry 0 */
  sl_server_config cfg; /* strings below are owned copies */
  char *host, *api_key, *cors;
  sl_srv_toolfmt toolfmt; /* --tool-call-format (NONE: the template's) */
  struct MHD_Daemon *mhd;
  sl_srv_door *door;   /* NULL: not started */
  sl_srv_watch *watch; /* NULL: not started */
  atomic_int n_parked; /* connections suspended, not yet back in a handler */
  /* generation requests parked while the model they name loads (http.c:
   * one helper thread per model loading, which resumes them) */
  pthread_mutex_t load_mu;
  struct sl_srv_loading *loading;
  atomic_int n_load_parked;
  int port;
  uint64_t t_start_ns;
  long long started_at; /* wall clock, seconds (the models' "created") */

  pthread_mutex_t jobs_mu;
  pthread_cond_t jobs_cv;
  sl_srv_job *jobs; /* live jobs (submitted, not yet released) */
  int n_jobs;
  int n_open; /* generation requests whose response MHD has
               * not yet reported complete (delivered/failed) */
  bool stopping;
  atomic_bool closing; /* MHD is about to stop: a handler parks nothing */

  sl_srv_metrics m;
};

/* admin.c */
void sl__srv_metrics_init(sl_srv_metrics *m);
void sl__srv_metrics_destroy(sl_srv_metrics *m);
/* Records a finished generation request (ttft/tpot from the job's times). */
void sl__srv_metrics_job(sl_server_t *s, const sl_srv_job *j, bool failed);
/* A request answered with an error before it reached an engine (`http`:
 * the status; the request may be NULL). */
void sl__srv_metrics_failed(sl_server_t *s, const sl_srv_request *r, int http);
/* Prometheus text (new sl_sbuf contents) / stats JSON / models JSON. */
void sl__srv_metrics_text(sl_server_t *s, sl_sbuf *out);
json_t *sl__srv_stats_json(sl_server_t *s);

/* routes.c: what the parser checks a request of this server against: the
 * model it names is leased into *m (released by sl__srv_model_release). */
sl_srv_limits sl__srv_limits_of(sl_server_t *s, sl_srv_model *m);
/* Leases the model `name` ("default": the first) into *m, loading it if
 * needed; on failure *err holds the answer (404: no such model; 503: it
 * cannot be loaded now). */
sl_status sl__srv_model_acquire(sl_server_t *s, const char *name,
                                sl_srv_model *m, sl_srv_error *err);
void sl__srv_model_release(sl_srv_model *m);
/* The pool entry a request's "model" names ("default": the first), or -1. */
int sl__srv_model_index(sl_server_t *s, const char *id);
/* The answer to a pool load that failed with `st` (why: the pool's words):
 * 404, 503 insufficient_memory, or 500 model_load_failed. */
void sl__srv_load_error(sl_status st, const char *name, const char *why,
                        sl_srv_error *err);
/* routes.c: the routes that generate nothing. On failure each fills *err
 * (the status and body to answer with) and returns NULL / not SL_OK. */
json_t *sl__srv_models_json(sl_server_t *s);
/* POST /admin/api/models/{id}/{load|unload|pin|unpin} (`rest` is
 * "{id}/{action}"): the model's entry after the action, or NULL with *err
 * set (404: no such model or action; 409: an unload of a model pinned or
 * serving requests; 503: a load that cannot fit). */
json_t *sl__srv_admin_model(sl_server_t *s, const char *rest,
                            sl_srv_error *err);
/* POST /admin/api/clear-cache: every loaded engine clears on its executor;
 * with none loaded, the drain-all clear of the devices. */
json_t *sl__srv_admin_clear(sl_server_t *s, sl_srv_error *err);
/* One model by id (any accepted name), or NULL with a 404 in *err. */
json_t *sl__srv_model_json(sl_server_t *s, const char *id, sl_srv_error *err);
sl_status sl__srv_count_tokens(sl_server_t *s, const char *body, size_t len,
                               json_t **out, sl_srv_error *err);
sl_status sl__srv_tokenize(sl_server_t *s, const char *body, size_t len,
                           json_t **out, sl_srv_error *err);
sl_status sl__srv_detokenize(sl_server_t *s, const char *body, size_t len,
                             json_t **out, sl_srv_error *err);
/* POST /apply-template: an OpenAI chat body -> {"prompt": the template's
 * text} (llama.cpp's server has it). */
sl_status sl__srv_apply_template(sl_server_t *s, const char *body, size_t len,
                                 json_t **out, sl_srv_error *err);

#endif
