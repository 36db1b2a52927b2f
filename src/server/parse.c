/* sluice — server: request bodies of the OpenAI and Anthropic APIs ->
 * validated sl_srv_request. Nothing here touches the engine or a model;
 * the fuzz harness and tests/test_server_parse.c drive it directly. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/constrain.h"
#include "server/embed.h"
#include "server/json.h"
#include "server/json_scan.h"
#include "server/parse.h"
#include "server/reasoning_req.h"
#include "server/schema.h"
#include "server/tools.h"
#include "sluice/util.h"

#define BAD(http, code, param, ...)                                            \
  do {                                                                         \
    sl__srv_error_set(err, (http), (code), (param), __VA_ARGS__);              \
    st = SL_ERR_FORMAT;                                                        \
    goto fail;                                                                 \
  } while (0)
#define UNSUPPORTED(param, ...)                                                \
  do {                                                                         \
    sl__srv_error_set(err, 400, "unsupported_parameter", (param),              \
                      __VA_ARGS__);                                            \
    st = SL_ERR_UNSUPPORTED;                                                   \
    goto fail;                                                                 \
  } while (0)
#define NOMEM()                                                                \
  do {                                                                         \
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");                  \
    st = SL_ERR_NOMEM;                                                         \
    goto fail;                                                                 \
  } while (0)

/* A present, non-null member, or NULL. */
static json_t *member(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return v && !json_is_null(v) ? v : NULL;
}

/* Reads an optional number in [lo, hi]. Returns 1 when set, 0 when absent,
 * -1 (err filled) when invalid. */
static int opt_num(json_t *o, const char *key, double lo, double hi,
                   double *out, sl_srv_error *err) {
  json_t *v = member(o, key);
  if (!v)
    return 0;
  if (!json_is_number(v)) {
    sl__srv_error_set(err, 400, "invalid_type", key, "'%s' must be a number",
                      key);
    return -1;
  }
  double d = json_number_value(v);
  if (!(d >= lo && d <= hi)) {
    sl__srv_error_set(err, 400, "invalid_value", key,
                      "'%s' must be between %g and %g", key, lo, hi);
    return -1;
  }
  *out = d;
  return 1;
}

static int opt_int(json_t *o, const char *key, long long lo, long long hi,
                   long long *out, sl_srv_error *err) {
  json_t *v = member(o, key);
  if (!v)
    return 0;
  if (!json_is_integer(v)) {
    sl__srv_error_set(err, 400, "invalid_type", key, "'%s' must be an integer",
                      key);
    return -1;
  }
  long long x = json_integer_value(v);
  if (x < lo || x > hi) {
    sl__srv_error_set(err, 400, "invalid_value", key,
                      "'%s' must be between %lld and %lld", key, lo, hi);
    return -1;
  }
  *out = x;
  return 1;
}

static int opt_bool(json_t *o, const char *key, bool *out, sl_srv_error *err) {
  json_t *v = member(o, key);
  if (!v)
    return 0;
  if (!json_is_boolean(v)) {
    sl__srv_error_set(err, 400, "invalid_type", key, "'%s' must be a boolean",
                      key);
    return -1;
  }
  *out = json_is_true(v);
  return 1;
}

/* Copies a JSON string's bytes (it may hold NULs only if jansson allowed
 * them, which we do not). */
static char *dup_str(json_t *s) {
  size_t n = json_string_length(s);
  char *p = sl_malloc(n + 1);
  if (p) {
    memcpy(p, json_string_value(s), n);
    p[n] = 0;
  }
  return p;
}

/* Joins a content value into text: a string, or a list of {type:"text",
 * text} parts. Returns 1 on success (*out set, owned), -1 with err set. */
int sl__srv_content_text(json_t *c, const char *param, bool allow_null,
                         sl_sbuf *out, sl_srv_error *err) {
  if (!c || json_is_null(c)) {
    if (allow_null)
      return 1;
    sl__srv_error_set(err, 400, "missing_required_parameter", param,
                      "'%s' is required", param);
    return -1;
  }
  if (json_is_string(c)) {
    sl__sbuf_add(out, json_string_value(c), json_string_length(c));
    return 1;
  }
  if (!json_is_array(c)) {
    sl__srv_error_set(err, 400, "invalid_type", param,
                      "'%s' must be a string or a list of text parts", param);
    return -1;
  }
  size_t i;
  json_t *part;
  json_array_foreach(c, i, part) {
    json_t *type = json_object_get(part, "type");
    json_t *text = json_object_get(part, "text");
    if (!json_is_object(part) || !json_is_string(type)) {
      sl__srv_error_set(err, 400, "invalid_type", param,
                        "'%s[%zu]' must be an object with a 'type'", param, i);
      return -1;
    }
    if (strcmp(json_string_value(type), "text") != 0) {
      sl__srv_error_set(err, 400, "unsupported_parameter", param,
                        "content part type '%s' is not supported (text only)",
                        json_string_value(type));
      return -1;
    }
    if (!json_is_string(text)) {
      sl__srv_error_set(err, 400, "invalid_type", param,
                        "'%s[%zu].text' must be a string", param, i);
      return -1;
    }
    sl__sbuf_add(out, json_string_value(text), json_string_length(text));
  }
  return 1;
}

/* Appends {role, content} to list, marked untrusted: the chat template's
 * rendering then knows this text came from the request, and the prompt
 * parses no special tokens in it (prompt.c). Returns false when out of
 * memory. */
static bool push_msg(sl_jv *list, const char *role, const sl_sbuf *text) {
  sl_jv *m = sl_jv_dict();
  if (!m)
    return false;
  if (sl_jv_dict_set(m, "role", sl_jv_string(role)) != SL_OK ||
      sl_jv_dict_set(m, "content",
                     sl_jv_string_n(text->p ? text->p : "", text->len)) !=
          SL_OK) {
    sl_jv_free(m);
    return false;
  }
  sl_jv_mark_untrusted(m);
  return sl_jv_list_append(list, m) == SL_OK;
}

/* `stop` (OpenAI: string or list) / `stop_sequences` (Anthropic: list):
 * at most max_n strings (OpenAI's API allows 4), each at most
 * SL_MAX_STOP_BYTES long, so that a request cannot make stop matching on
 * the shared engine thread expensive. */
static int parse_stop(json_t *v, const char *param, bool list_only, int max_n,
                      sl_srv_request *r, sl_srv_error *err) {
  if (!v)
    return 1;
  json_t *one[1];
  size_t n;
  json_t **items;
  if (json_is_string(v) && !list_only) {
    one[0] = v;
    items = one;
    n = 1;
  } else if (json_is_array(v)) {
    n = json_array_size(v);
    items = NULL;
  } else {
    sl__srv_error_set(err, 400, "invalid_type", param,
                      list_only ? "'%s' must be a list of strings"
                                : "'%s' must be a string or a list of strings",
                      param);
    return -1;
  }
  SL_ASSERT(max_n <= SL_MAX_STOP);
  if (n > (size_t)max_n) {
    sl__srv_error_set(err, 400, "invalid_value", param,
                      "'%s' may hold at most %d strings", param, max_n);
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    json_t *s = items ? items[i] : json_array_get(v, i);
    if (!json_is_string(s)) {
      sl__srv_error_set(err, 400, "invalid_type", param,
                        "'%s[%zu]' must be a string", param, i);
      return -1;
    }
    if (json_string_length(s) > SL_MAX_STOP_BYTES) {
      sl__srv_error_set(err, 400, "invalid_value", param,
                        "'%s[%zu]' is %zu bytes long; the limit is %d bytes",
                        param, i, json_string_length(s), SL_MAX_STOP_BYTES);
      return -1;
    }
    if (json_string_length(s) == 0)
      continue; /* an empty stop string would end every request at once */
    char *c = dup_str(s);
    if (!c) {
      sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
      return -2;
    }
    r->stops[r->gen.n_stop] = c;
    r->gen.stop[r->gen.n_stop] = c;
    r->gen.n_stop++;
  }
  return 1;
}

static bool model_known(const char *m, const sl_srv_limits *lim) {
  for (int i = 0; i < lim->n_model_names; i++)
    if (lim->model_names[i] && strcmp(m, lim->model_names[i]) == 0)
      return true;
  return false;
}

/* Default sampling: OpenAI semantics (temperature 1, no top-k / min-p). */
static void gen_defaults(sl_gen_params *g) {
  memset(g, 0, sizeof *g);
  g->sampling = sl_sampler_defaults();
  g->sampling.temperature = 1.0f;
  g->sampling.top_k = 0;
  g->sampling.top_p = 1.0f;
  g->sampling.min_p = 0.0f;
  g->sampling.seed = (uint64_t)sl_now_ns() ^ ((uint64_t)time(NULL) << 20);
  g->top_logprobs = -1;
  g->max_tokens = 0;
}

/* Rejects a non-empty list / object under `key`. */
static bool reject_nonempty(json_t *root, const char *key, sl_srv_error *err) {
  json_t *v = member(root, key);
  if (!v)
    return true;
  if ((json_is_array(v) && json_array_size(v) == 0) ||
      (json_is_object(v) && json_object_size(v) == 0))
    return true;
  sl__srv_error_set(err, 400, "unsupported_parameter", key,
                    "'%s' is not supported by this server", key);
  return false;
}

/* OpenAI's predicted output, {"type": "content", "content": a string or
 * a list of {"type": "text", "text": ...} parts}: its text (the parts
 * joined) into r->prediction, which feeds the speculative drafter (and is
 * otherwise unused). 0, or -1 with err filled (-2: out of memory). */
static int parse_prediction(json_t *root, sl_srv_request *r,
                            sl_srv_error *err) {
  json_t *p = member(root, "prediction");
  if (!p)
    return 0;
  json_t *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
  json_t *c = json_is_object(p) ? json_object_get(p, "content") : NULL;
  if (!json_is_string(t) || strcmp(json_string_value(t), "content") != 0 ||
      !(json_is_string(c) || json_is_array(c))) {
    sl__srv_error_set(err, 400, "invalid_value", "prediction",
                      "'prediction' must be {\"type\": \"content\", "
                      "\"content\": a string or a list of text parts}");
    return -1;
  }
  sl_sbuf b = {0};
  if (json_is_string(c))
    sl__sbuf_add(&b, json_string_value(c), json_string_length(c));
  for (size_t i = 0; json_is_array(c) && i < json_array_size(c); i++) {
    json_t *part = json_array_get(c, i);
    json_t *pt = json_is_object(part) ? json_object_get(part, "type") : NULL;
    json_t *tx = json_is_object(part) ? json_object_get(part, "text") : NULL;
    if (!json_is_string(pt) || strcmp(json_string_value(pt), "text") != 0 ||
        !json_is_string(tx)) {
      sl__sbuf_free(&b);
      sl__srv_error_set(err, 400, "invalid_value", "prediction",
                        "'prediction.content[%zu]' must be "
                        "{\"type\": \"text\", \"text\": ...}",
                        i);
      return -1;
    }
    sl__sbuf_add(&b, json_string_value(tx), json_string_length(tx));
  }
  sl__sbuf_add(&b, "", 1); /* NUL-terminated, never NULL */
  if (b.oom) {
    sl__sbuf_free(&b);
    return -2;
  }
  r->prediction = b.p;
  r->prediction_len = b.len - 1;
  return 0;
}

static sl_status parse_openai_common(json_t *root, const sl_srv_limits *lim,
                                     sl_srv_request *r, sl_srv_error *err) {
  sl_status st = SL_OK;
  double d;
  long long ll;
  int k;
  if ((k = opt_num(root, "temperature", 0, 2, &d, err)) < 0)
    goto fail_value;
  if (k)
    r->gen.sampling.temperature = (float)d;
  if ((k = opt_num(root, "top_p", 0, 1, &d, err)) < 0)
    goto fail_value;
  if (k)
    r->gen.sampling.top_p = (float)d;
  if ((k = opt_num(root, "presence_penalty", -2, 2, &d, err)) < 0)
    goto fail_value;
  if (k)
    r->gen.sampling.presence_penalty = (float)d;
  if ((k = opt_num(root, "frequency_penalty", -2, 2, &d, err)) < 0)
    goto fail_value;
  if (k)
    r->gen.sampling.frequency_penalty = (float)d;
  if ((k = opt_int(root, "seed", INT64_MIN, INT64_MAX, &ll, err)) < 0)
    goto fail_value;
  if (k)
    r->gen.sampling.seed = (uint64_t)ll;
  /* sluice's own: opt out of speculative drafts (the output is the same) */
  bool spec = true;
  if ((k = opt_bool(root, "speculative", &spec, err)) < 0)
    goto fail_value;
  r->gen.no_speculation = k && !spec;
  if ((k = parse_prediction(root, r, err)) == -2)
    return SL_ERR_NOMEM;
  if (k < 0)
    goto fail_value;
  /* beyond OpenAI's API, as llama.cpp and vLLM take them */
  if ((k = opt_int(root, "top_k", -1, INT32_MAX, &ll, err)) < 0)
    goto fail_value;
  if (k)
    r->gen.sampling.top_k = (int)ll; /* <= 0: off */
  if ((k = opt_num(root, "min_p", 0, 1, &d, err)) < 0)
    goto fail_value;
  if (k)
    r->gen.sampling.min_p = (float)d;
  if (member(root, "repetition_penalty") && member(root, "repeat_penalty")) {
    sl__srv_error_set(err, 400, "invalid_value", "repetition_penalty",
                      "give one of 'repetition_penalty' (vLLM's name) and "
                      "'repeat_penalty' (llama.cpp's), not both");
    goto fail_value;
  }
  const char *rp_key =
      member(root, "repeat_penalty") ? "repeat_penalty" : "repetition_penalty";
  if ((k = opt_num(root, rp_key, 0, 10, &d, err)) < 0)
    goto fail_value;
  if (k && d <= 0) {
    sl__srv_error_set(err, 400, "invalid_value", rp_key,
                      "'%s' must be above 0 (1: off)", rp_key);
    goto fail_value;
  }
  if (k)
    r->gen.sampling.repeat_penalty = (float)d;
  if ((st = sl__srv_parse_logit_bias(member(root, "logit_bias"), r, err)) !=
      SL_OK)
    return st;
  r->n_choices = 1;
  if ((k = opt_int(root, "n", 1, SL_SRV_MAX_N, &ll, err)) < 0)
    goto fail_value;
  if (k)
    r->n_choices = (int)ll;
  if ((k = opt_bool(root, "stream", &r->stream, err)) < 0)
    goto fail_value;
  json_t *so = member(root, "stream_options");
  if (so) {
    if (!json_is_object(so)) {
      sl__srv_error_set(err, 400, "invalid_type", "stream_options",
                        "'stream_options' must be an object");
      goto fail_value;
    }
    if (!r->stream) {
      sl__srv_error_set(err, 400, "invalid_value", "stream_options",
                        "'stream_options' is only allowed with stream: true");
      goto fail_value;
    }
    if (opt_bool(so, "include_usage", &r->include_usage, err) < 0)
      goto fail_value;
  }
  if (!reject_nonempty(root, "functions", err))
    return SL_ERR_UNSUPPORTED;
  if ((st = sl__srv_parse_structured(root, r, err)) != SL_OK)
    return st;
  int sr = parse_stop(member(root, "stop"), "stop", false,
                      SL_SRV_MAX_STOP_OPENAI, r, err);
  if (sr == -2)
    return SL_ERR_NOMEM;
  if (sr < 0)
    goto fail_value;
  (void)lim;
  return st;
fail_value:
  return SL_ERR_FORMAT;
}

static sl_status parse_max_tokens(json_t *root, const char *key,
                                  const sl_srv_limits *lim, sl_srv_request *r,
                                  sl_srv_error *err) {
  long long ll;
  int k = opt_int(root, key, LLONG_MIN, LLONG_MAX, &ll, err);
  if (k < 0)
    return SL_ERR_FORMAT;
  if (!k)
    return SL_OK;
  if (ll <= 0) {
    sl__srv_error_set(err, 400, "invalid_value", key,
                      "'%s' must be at least 1, got %lld", key, ll);
    return SL_ERR_FORMAT;
  }
  /* above the context it is clamped (to the room the prompt leaves, at
   * submission), not refused: agents send 32000 and more */
  (void)lim;
  r->gen.max_tokens = ll > INT32_MAX ? INT32_MAX : (int)ll;
  r->max_tokens_set = true;
  return SL_OK;
}

/* Tools, before the messages are read: tools and tool_choice, how the
 * template takes them, and the grammar of a forced call. */
static sl_status tools_begin(json_t *root, const sl_srv_limits *lim,
                             sl_srv_request *r, sl_srv_error *err) {
  sl_status st = sl__srv_tools_parse(root, r->api != SL_SRV_CHAT, r, err);
  if (st != SL_OK)
    return st;
  sl__srv_tools_decide(r, lim);
  if (r->toolfmt == SL_TOOLFMT_NONE ||
      (r->tool_choice != SL_SRV_TOOLS_REQUIRED &&
       r->tool_choice != SL_SRV_TOOLS_NAMED))
    return SL_OK;
  if (r->grammar) {
    sl__srv_error_set(err, 400, "invalid_value", "tool_choice",
                      "a forced tool call cannot be combined with a response "
                      "format or grammar");
    return SL_ERR_FORMAT;
  }
  sl_sbuf g = {0};
  char gerr[256] = "";
  sl_srv_toolfmt fmt;
  st = sl__srv_tools_grammar(r, &g, &fmt, gerr, sizeof gerr);
  if (st == SL_OK)
    st = sl__srv_set_grammar(r, g.p, g.len, "tools", err);
  else if (st == SL_ERR_NOMEM)
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
  else
    sl__srv_error_set(err, 400, "invalid_value", "tools",
                      "a tool's parameters cannot be used for a forced call: "
                      "%s",
                      gerr);
  sl__sbuf_free(&g);
  r->toolfmt = fmt;
  return st;
}

/* For a template that does not render tools, the system text that
 * describes them: appended to the conversation's own system message
 * (`text` holds it, `is_system`), or a message of its own. */
static sl_status tools_system(sl_srv_request *r, bool is_system, sl_sbuf *text,
                              sl_srv_error *err) {
  if (!r->tools || r->tools_native || r->toolfmt == SL_TOOLFMT_NONE)
    return SL_OK;
  sl_sbuf own = {0};
  sl_sbuf *t = is_system ? text : &own;
  if (t->len)
    sl__sbuf_adds(t, "\n\n");
  sl__srv_tools_instructions(r, t);
  bool ok = !t->oom && (is_system || push_msg(r->messages, "system", t));
  sl__sbuf_free(&own);
  if (!ok) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return SL_ERR_NOMEM;
  }
  return SL_OK;
}

static sl_status parse_chat(json_t *root, const sl_srv_limits *lim,
                            sl_srv_request *r, sl_srv_error *err) {
  sl_status st;
  sl_sbuf text = {0};
  if ((st = parse_openai_common(root, lim, r, err)) != SL_OK)
    goto fail;
  if ((st = parse_max_tokens(root, "max_tokens", lim, r, err)) != SL_OK)
    goto fail;
  if ((st = parse_max_tokens(root, "max_completion_tokens", lim, r, err)) !=
      SL_OK)
    goto fail;
  bool lp = false;
  long long top = 0;
  int k;
  if (opt_bool(root, "logprobs", &lp, err) < 0 ||
      (k = opt_int(root, "top_logprobs", 0, SL_MAX_TOP_LOGPROBS, &top, err)) <
          0) {
    st = SL_ERR_FORMAT;
    goto fail;
  }
  if (k && !lp)
    BAD(400, "invalid_value", "top_logprobs",
        "'top_logprobs' requires 'logprobs' to be true");
  r->logprobs = lp;
  r->top_logprobs = (int)top;
  r->gen.top_logprobs = lp ? (int)top : -1;
  /* vLLM's: the last (assistant) message is continued, not answered */
  if (opt_bool(root, "continue_final_message", &r->continue_final, err) < 0) {
    st = SL_ERR_FORMAT;
    goto fail;
  }

  json_t *msgs = json_object_get(root, "messages");
  if (!msgs)
    BAD(400, "missing_required_parameter", "messages",
        "'messages' is required");
  if (!json_is_array(msgs))
    BAD(400, "invalid_type", "messages", "'messages' must be a list");
  if (json_array_size(msgs) == 0)
    BAD(400, "invalid_value", "messages", "'messages' must not be empty");
  if (!(r->messages = sl_jv_list()))
    NOMEM();
  if ((st = tools_begin(root, lim, r, err)) != SL_OK)
    goto fail;
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    char param[48];
    snprintf(param, sizeof param, "messages[%zu]", i);
    if (!json_is_object(m))
      BAD(400, "invalid_type", param, "'%s' must be an object", param);
    json_t *role = json_object_get(m, "role");
    if (!json_is_string(role))
      BAD(400, role ? "invalid_type" : "missing_required_parameter", param,
          "'%s.role' must be a string", param);
    const char *rs = json_string_value(role);
    if (!strcmp(rs, "developer"))
      rs = "system";
    if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
        strcmp(rs, "tool"))
      BAD(400, "invalid_value", param,
          "'%s.role' '%s' is not one of system, "
          "developer, user, assistant, tool",
          param, json_string_value(role));
    snprintf(param, sizeof param, "messages[%zu].content", i);
    text.len = 0;
    if (sl__srv_content_text(json_object_get(m, "content"), param,
                             strcmp(rs, "assistant") == 0, &text, err) < 0) {
      st = SL_ERR_FORMAT;
      goto fail;
    }
    if (text.oom)
      NOMEM();
    if (i == 0 && strcmp(rs, "system") &&
        (st = tools_system(r, false, &text, err)) != SL_OK)
      goto fail;
    if (i == 0 && !strcmp(rs, "system") &&
        (st = tools_system(r, true, &text, err)) != SL_OK)
      goto fail;
    snprintf(param, sizeof param, "messages[%zu]", i);
    if ((st = sl__srv_msg_openai(m, rs, &text, r, param, err)) != SL_OK)
      goto fail;
    if (r->continue_final && i + 1 == json_array_size(msgs) &&
        (strcmp(rs, "assistant") || !text.len))
      BAD(400, "invalid_value", "continue_final_message",
          "'continue_final_message' needs a last message from the assistant "
          "with some content");
  }
  if (sl__srv_tools_template(r) != SL_OK)
    NOMEM();
  if ((st = sl__srv_reason_request(root, lim, r, err)) != SL_OK)
    goto fail;
  sl__sbuf_free(&text);
  return SL_OK;
fail:
  sl__sbuf_free(&text);
  return st;
}

static sl_status parse_completions(json_t *root, const sl_srv_limits *lim,
                                   sl_srv_request *r, sl_srv_error *err) {
  sl_status st;
  if ((st = parse_openai_common(root, lim, r, err)) != SL_OK)
    return st;
  if ((st = parse_max_tokens(root, "max_tokens", lim, r, err)) != SL_OK)
    return st;
  long long lp = 0, best = 1;
  int k;
  if ((k = opt_int(root, "logprobs", 0, SL_MAX_TOP_LOGPROBS, &lp, err)) < 0)
    return SL_ERR_FORMAT;
  r->logprobs = k > 0;
  r->top_logprobs = (int)lp;
  r->gen.top_logprobs = k ? (int)lp : -1;
  bool echo = false;
  if (opt_bool(root, "echo", &echo, err) < 0)
    return SL_ERR_FORMAT;
  if (echo) {
    sl__srv_error_set(err, 400, "unsupported_parameter", "echo",
                      "'echo' is not supported");
    return SL_ERR_UNSUPPORTED;
  }
  if (!reject_nonempty(root, "tools", err))
    return SL_ERR_UNSUPPORTED;
  if (member(root, "suffix")) {
    sl__srv_error_set(err, 400, "unsupported_parameter", "suffix",
                      "'suffix' is not supported");
    return SL_ERR_UNSUPPORTED;
  }
  if ((k = opt_int(root, "best_of", 1, 1, &best, err)) < 0) {
    err->http = 400;
    snprintf(err->code, sizeof err->code, "unsupported_parameter");
    return SL_ERR_UNSUPPORTED;
  }

  json_t *p = json_object_get(root, "prompt");
  if (!p || json_is_null(p)) {
    sl__srv_error_set(err, 400, "missing_required_parameter", "prompt",
                      "'prompt' is required");
    return SL_ERR_FORMAT;
  }
  /* a list of one prompt (string or ids) is the prompt itself */
  if (json_is_array(p) && json_array_size(p) == 1 &&
      (json_is_string(json_array_get(p, 0)) ||
       json_is_array(json_array_get(p, 0))))
    p = json_array_get(p, 0);
  if (json_is_string(p)) {
    if (!(r->prompt = dup_str(p))) {
      sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
      return SL_ERR_NOMEM;
    }
    r->prompt_len = json_string_length(p);
    if (r->prompt_len == 0) {
      sl__srv_error_set(err, 400, "invalid_value", "prompt",
                        "'prompt' must not be empty");
      return SL_ERR_FORMAT;
    }
    return SL_OK;
  }
  if (!json_is_array(p)) {
    sl__srv_error_set(err, 400, "invalid_type", "prompt",
                      "'prompt' must be a string or a list of token ids");
    return SL_ERR_FORMAT;
  }
  size_t n = json_array_size(p);
  if (n == 0) {
    sl__srv_error_set(err, 400, "invalid_value", "prompt",
                      "'prompt' must not be empty");
    return SL_ERR_FORMAT;
  }
  if (json_is_string(json_array_get(p, 0)) ||
      json_is_array(json_array_get(p, 0))) {
    sl__srv_error_set(err, 400, "unsupported_parameter", "prompt",
                      "only one prompt per request is supported");
    return SL_ERR_UNSUPPORTED;
  }
  if (n > (size_t)INT32_MAX / 2 ||
      !(r->prompt_ids = sl_calloc(n, sizeof *r->prompt_ids))) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return SL_ERR_NOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    json_t *t = json_array_get(p, i);
    if (!json_is_integer(t) || json_integer_value(t) < 0 ||
        json_integer_value(t) > INT32_MAX) {
      sl__srv_error_set(err, 400, "invalid_type", "prompt",
                        "'prompt[%zu]' must be a token id (a non-negative "
                        "integer)",
                        i);
      return SL_ERR_FORMAT;
    }
    r->prompt_ids[i] = (int32_t)json_integer_value(t);
  }
  r->n_prompt_ids = (int)n;
  return SL_OK;
}

static sl_status parse_messages(json_t *root, const sl_srv_limits *lim,
                                sl_srv_request *r, sl_srv_error *err) {
  sl_status st;
  sl_sbuf text = {0};
  double d;
  long long ll;
  int k;
  if ((k = opt_num(root, "temperature", 0, 1, &d, err)) < 0)
    goto fail_format;
  if (k)
    r->gen.sampling.temperature = (float)d;
  if ((k = opt_num(root, "top_p", 0, 1, &d, err)) < 0)
    goto fail_format;
  if (k)
    r->gen.sampling.top_p = (float)d;
  if ((k = opt_int(root, "top_k", 0, INT32_MAX, &ll, err)) < 0)
    goto fail_format;
  if (k)
    r->gen.sampling.top_k = (int)ll;
  bool spec = true; /* sluice's own, as on the OpenAI routes */
  if ((k = opt_bool(root, "speculative", &spec, err)) < 0)
    goto fail_format;
  r->gen.no_speculation = k && !spec;
  if (opt_bool(root, "stream", &r->stream, err) < 0)
    goto fail_format;
  bool count = r->api == SL_SRV_COUNT_TOKENS; /* no max_tokens there */
  if (!count && !json_object_get(root, "max_tokens"))
    BAD(400, "missing_required_parameter", "max_tokens",
        "max_tokens: Field required");
  if ((st = parse_max_tokens(root, "max_tokens", lim, r, err)) != SL_OK)
    goto fail;
  if (!count && !r->max_tokens_set)
    BAD(400, "invalid_type", "max_tokens", "max_tokens: must be an integer");
  json_t *oc = member(root, "output_config");
  json_t *fmt = oc ? member(oc, "format") : NULL;
  if (fmt) { /* structured output: {"type": "json_schema", "schema": ...} */
    json_t *t = json_object_get(fmt, "type");
    json_t *sc = json_object_get(fmt, "schema");
    if (!json_is_string(t) || strcmp(json_string_value(t), "json_schema") ||
        !sc)
      BAD(400, "invalid_value", "output_config",
          "output_config.format must be {\"type\": \"json_schema\", "
          "\"schema\": {...}}");
    if ((st = sl__srv_set_schema(r, sc, "output_config", err)) != SL_OK)
      goto fail;
  }
  int sr = parse_stop(member(root, "stop_sequences"), "stop_sequences", true,
                      SL_MAX_STOP, r, err);
  if (sr == -2) {
    st = SL_ERR_NOMEM;
    goto fail;
  }
  if (sr < 0)
    goto fail_format;

  if (!(r->messages = sl_jv_list()))
    NOMEM();
  if ((st = tools_begin(root, lim, r, err)) != SL_OK)
    goto fail;
  json_t *sys = member(root, "system");
  if (sys && sl__srv_content_text(sys, "system", false, &text, err) < 0)
    goto fail_format;
  if ((st = tools_system(r, true, &text, err)) != SL_OK)
    goto fail;
  if ((sys || text.len) &&
      (text.oom || !push_msg(r->messages, "system", &text)))
    NOMEM();
  json_t *msgs = json_object_get(root, "messages");
  if (!msgs)
    BAD(400, "missing_required_parameter", "messages",
        "messages: Field required");
  if (!json_is_array(msgs))
    BAD(400, "invalid_type", "messages", "messages: must be a list");
  if (json_array_size(msgs) == 0)
    BAD(400, "invalid_value", "messages",
        "messages: at least one message is required");
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    char param[48];
    snprintf(param, sizeof param, "messages.%zu", i);
    if (!json_is_object(m))
      BAD(400, "invalid_type", param, "%s: must be an object", param);
    json_t *role = json_object_get(m, "role");
    if (!json_is_string(role) || (strcmp(json_string_value(role), "user") &&
                                  strcmp(json_string_value(role), "assistant")))
      BAD(400, "invalid_value", param, "%s.role: must be 'user' or 'assistant'",
          param);
    snprintf(param, sizeof param, "messages.%zu.content", i);
    text.len = 0;
    json_t *content = json_object_get(m, "content");
    if (sl__srv_ant_has_blocks(content)) {
      if ((st = sl__srv_msg_anthropic(content, json_string_value(role), r,
                                      param, err)) != SL_OK)
        goto fail;
      continue;
    }
    if (sl__srv_content_text(content, param, false, &text, err) < 0)
      goto fail_format;
    if (text.oom || !push_msg(r->messages, json_string_value(role), &text))
      NOMEM();
    /* a last assistant message is a prefill: the answer continues it */
    if (i + 1 == json_array_size(msgs) &&
        !strcmp(json_string_value(role), "assistant") && text.len) {
      char last = text.p[text.len - 1];
      if (last == ' ' || last == '\t' || last == '\n' || last == '\r')
        BAD(400, "invalid_value", param,
            "final assistant content cannot end with trailing whitespace");
      r->continue_final = true;
    }
  }
  if (sl__srv_tools_template(r) != SL_OK)
    NOMEM();
  if ((st = sl__srv_reason_request(root, lim, r, err)) != SL_OK)
    goto fail;
  sl__sbuf_free(&text);
  return SL_OK;
fail_format:
  st = SL_ERR_FORMAT;
fail:
  sl__sbuf_free(&text);
  return st;
}

json_t *sl__srv_body_object(const char *body, size_t len, sl_srv_error *err) {
  if (!sl__utf8_valid(body, len)) {
    sl__srv_error_set(err, 400, "invalid_utf8", NULL,
                      "the request body is not valid UTF-8");
    return NULL;
  }
  if (sl__srv_json_scan(body, len, err) != SL_OK)
    return NULL;
  json_error_t je;
  json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
  if (!root && json_error_code(&je) == json_error_out_of_memory) {
    sl__srv_error_set(err, 503, "out_of_memory", NULL,
                      "the server ran out of memory reading the request; "
                      "retry later");
    return NULL;
  }
  if (!root) {
    sl__srv_error_set(err, 400, "invalid_json", NULL,
                      "the request body is not valid JSON: %s (line %d, "
                      "column %d)",
                      je.text, je.line, je.column);
    return NULL;
  }
  if (!json_is_object(root)) {
    json_decref(root);
    sl__srv_error_set(err, 400, "invalid_json", NULL,
                      "the request body must be a JSON object");
    return NULL;
  }
  return root;
}

sl_status sl__srv_parse(sl_srv_api api, const char *body, size_t len,
                        const sl_srv_limits *lim_in, sl_srv_request *out,
                        sl_srv_error *err) {
  sl_srv_limits lim_own = *lim_in, *lim = &lim_own;
  sl__srv_json_init();
  memset(out, 0, sizeof *out);
  memset(err, 0, sizeof *err);
  out->api = api;
  gen_defaults(&out->gen);
  sl_status st;
  json_t *root = NULL;
  if (!(root = sl__srv_body_object(body, len, err))) {
    st = SL_ERR_FORMAT;
    goto fail;
  }
  json_t *model = json_object_get(root, "model");
  if (!model)
    BAD(400, "missing_required_parameter", "model", "'model' is required");
  if (!json_is_string(model))
    BAD(400, "invalid_type", "model", "'model' must be a string");
  if (lim->resolve) {
    if ((st = lim->resolve(lim->resolve_user, json_string_value(model), lim,
                           err)) != SL_OK)
      goto fail;
  } else if (!model_known(json_string_value(model), lim)) {
    sl__srv_error_set(err, 404, "model_not_found", "model",
                      "the model '%s' does not exist",
                      json_string_value(model));
    st = SL_ERR_NOT_FOUND;
    goto fail;
  }
  if (!(out->model = dup_str(model)))
    NOMEM();
  switch (api) {
  case SL_SRV_CHAT:
    st = parse_chat(root, lim, out, err);
    break;
  case SL_SRV_COMPLETIONS:
    st = parse_completions(root, lim, out, err);
    if (st == SL_OK && !out->max_tokens_set)
      out->gen.max_tokens = 16; /* the API's documented default */
    break;
  case SL_SRV_MESSAGES:
  case SL_SRV_COUNT_TOKENS:
    st = parse_messages(root, lim, out, err);
    break;
  case SL_SRV_EMBEDDINGS:
    st = sl__srv_parse_embeddings(root, lim, out, err);
    break;
  default:
    BAD(404, NULL, NULL, "unknown API");
  }
  if (st != SL_OK) {
    if (err->http == 0)
      sl__srv_error_set(err, st == SL_ERR_NOMEM ? 500 : 400, NULL, NULL,
                        "invalid request");
    goto fail;
  }
  json_decref(root);
  return SL_OK;
fail:
  json_decref(root);
  sl__srv_request_free(out);
  return st;
}

void sl__srv_request_free(sl_srv_request *r) {
  sl_free(r->model);
  sl_jv_free(r->messages);
  sl_free(r->prompt);
  sl_free(r->prompt_ids);
  sl_free(r->prediction);
  sl_free(r->prediction_ids);
  sl_free(r->bias);
  sl_grammar_unref(r->grammar);
  sl__srv_embed_free(r);
  json_decref(r->tools);
  sl_free(r->tool_name);
  sl_jv_free(r->tmpl_extra);
  for (int i = 0; i < SL_MAX_STOP; i++)
    sl_free(r->stops[i]);
  sl_srv_api api = r->api;
  memset(r, 0, sizeof *r);
  r->api = api;
}
