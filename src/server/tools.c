/* sluice — server: tool calling on the way in. A request's `tools` and
 * `tool_choice` (OpenAI and Anthropic shapes) are checked and kept in one
 * shape; the conversation's tool calls and tool results become the
 * messages HF chat templates expect ({role: "assistant", tool_calls:
 * [{id, type, function: {name, arguments}}]}, {role: "tool", content,
 * tool_call_id}); the template gets `tools` when it renders them itself,
 * and otherwise the tools are described in a system message and earlier
 * calls written as the JSON the model is asked to answer with; and
 * `required` or a named tool become a grammar (constrained decoding), so
 * that the call is well-formed whatever the model. toolcall.c reads the
 * calls back out of the model's text. */
#include <stdio.h>
#include <string.h>

#include "server/json.h"
#include "server/schema.h"
#include "server/toolcall.h"
#include "server/tools.h"
#include "sluice/util.h"

#define MAX_TOOLS 256

/* A present, non-null member, or NULL. */
static json_t *member(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return v && !json_is_null(v) ? v : NULL;
}

/* Letters, digits, '_', '-', '.', 1 to 64 of them (OpenAI's rule for
 * function names, with '.'; Anthropic's is the same without it). */
static bool valid_name(const char *s) {
  size_t n = strlen(s);
  return n >= 1 && n <= 64 && sl__srv_name_chars(s, n);
}

sl_jv *sl__srv_json_to_jv(json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: {
    sl_jv *d = sl_jv_dict();
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
      if (d && sl_jv_dict_set(d, k, sl__srv_json_to_jv(x)) != SL_OK) {
        sl_jv_free(d);
        return NULL;
      }
    }
    return d;
  }
  case JSON_ARRAY: {
    sl_jv *l = sl_jv_list();
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
      if (l && sl_jv_list_append(l, sl__srv_json_to_jv(x)) != SL_OK) {
        sl_jv_free(l);
        return NULL;
      }
    }
    return l;
  }
  case JSON_STRING:
    return sl_jv_string_n(json_string_value(v), json_string_length(v));
  case JSON_INTEGER:
    return sl_jv_int(json_integer_value(v));
  case JSON_REAL:
    return sl_jv_float(json_real_value(v));
  case JSON_TRUE:
    return sl_jv_bool(true);
  case JSON_FALSE:
    return sl_jv_bool(false);
  default:
    return sl_jv_null();
  }
}

/* ---- tools and tool_choice ----------------------------------------------- */

/* One tool, kept as {name, description?, parameters}. */
static sl_status add_tool(sl_srv_request *r, json_t *name, json_t *desc,
                          json_t *params, const char *param,
                          sl_srv_error *err) {
  if (!json_is_string(name) || !valid_name(json_string_value(name))) {
    sl__srv_error_set(err, 400, "invalid_value", param,
                      "'%s' needs a name of 1 to 64 letters, digits, '_', "
                      "'-' or '.'",
                      param);
    return SL_ERR_FORMAT;
  }
  if (desc && !json_is_string(desc)) {
    sl__srv_error_set(err, 400, "invalid_type", param,
                      "'%s' description must be a string", param);
    return SL_ERR_FORMAT;
  }
  if (params && !json_is_object(params)) {
    sl__srv_error_set(err, 400, "invalid_type", param,
                      "'%s' parameters must be a JSON Schema object", param);
    return SL_ERR_FORMAT;
  }
  size_t i;
  json_t *t;
  json_array_foreach(r->tools, i, t) {
    if (!strcmp(json_string_value(json_object_get(t, "name")),
                json_string_value(name))) {
      sl__srv_error_set(err, 400, "invalid_value", param,
                        "two tools are named '%s'", json_string_value(name));
      return SL_ERR_FORMAT;
    }
  }
  json_t *o = json_object();
  if (!o || json_object_set(o, "name", name) ||
      (desc && json_object_set(o, "description", desc)) ||
      json_object_set_new(
          o, "parameters",
          params ? json_incref(params)
                 : json_pack("{s:s,s:{}}", "type", "object", "properties")) ||
      json_array_append_new(r->tools, o)) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return SL_ERR_NOMEM;
  }
  return SL_OK;
}

static bool tool_known(const sl_srv_request *r, const char *name) {
  size_t i;
  json_t *t;
  json_array_foreach(r->tools, i, t) {
    if (!strcmp(json_string_value(json_object_get(t, "name")), name))
      return true;
  }
  return false;
}

static sl_status parse_tools_list(json_t *tools, bool anthropic,
                                  sl_srv_request *r, sl_srv_error *err) {
  if (!json_is_array(tools)) {
    sl__srv_error_set(err, 400, "invalid_type", "tools",
                      "'tools' must be a list");
    return SL_ERR_FORMAT;
  }
  if (json_array_size(tools) > MAX_TOOLS) {
    sl__srv_error_set(err, 400, "invalid_value", "tools",
                      "'tools' may hold at most %d tools", MAX_TOOLS);
    return SL_ERR_FORMAT;
  }
  if (!json_array_size(tools))
    return SL_OK;
  if (!(r->tools = json_array())) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return SL_ERR_NOMEM;
  }
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    char param[32];
    snprintf(param, sizeof param, anthropic ? "tools.%zu" : "tools[%zu]", i);
    if (!json_is_object(t)) {
      sl__srv_error_set(err, 400, "invalid_type", param,
                        "'%s' must be an object", param);
      return SL_ERR_FORMAT;
    }
    json_t *type = member(t, "type");
    sl_status st;
    if (anthropic) {
      if (type && (!json_is_string(type) ||
                   strcmp(json_string_value(type), "custom"))) {
        sl__srv_error_set(err, 400, "unsupported_parameter", param,
                          "'%s': only custom tools are supported (not "
                          "server tools such as '%s')",
                          param,
                          json_is_string(type) ? json_string_value(type) : "?");
        return SL_ERR_UNSUPPORTED;
      }
      json_t *schema = member(t, "input_schema");
      if (!schema) {
        sl__srv_error_set(err, 400, "missing_required_parameter", param,
                          "%s.input_schema: Field required", param);
        return SL_ERR_FORMAT;
      }
      st = add_tool(r, json_object_get(t, "name"), member(t, "description"),
                    schema, param, err);
    } else {
      json_t *fn = member(t, "function");
      if (!json_is_string(type) ||
          strcmp(json_string_value(type), "function")) {
        sl__srv_error_set(err, 400, "unsupported_parameter", param,
                          "'%s.type' must be 'function'", param);
        return SL_ERR_UNSUPPORTED;
      }
      if (!json_is_object(fn)) {
        sl__srv_error_set(err, 400, "missing_required_parameter", param,
                          "'%s.function' must be an object", param);
        return SL_ERR_FORMAT;
      }
      st = add_tool(r, json_object_get(fn, "name"), member(fn, "description"),
                    member(fn, "parameters"), param, err);
    }
    if (st != SL_OK)
      return st;
  }
  return SL_OK;
}

static sl_status set_named(sl_srv_request *r, json_t *name, sl_srv_error *err) {
  if (!json_is_string(name) || !r->tools ||
      !tool_known(r, json_string_value(name))) {
    sl__srv_error_set(err, 400, "invalid_value", "tool_choice",
                      "'tool_choice' names a tool that is not in 'tools'");
    return SL_ERR_FORMAT;
  }
  if (!(r->tool_name = sl_strdup(json_string_value(name)))) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return SL_ERR_NOMEM;
  }
  r->tool_choice = SL_SRV_TOOLS_NAMED;
  return SL_OK;
}

sl_status sl__srv_tools_parse(json_t *root, bool anthropic, sl_srv_request *r,
                              sl_srv_error *err) {
  r->tool_choice = SL_SRV_TOOLS_AUTO;
  r->tools_parallel = true;
  json_t *tools = member(root, "tools");
  sl_status st;
  if (tools && (st = parse_tools_list(tools, anthropic, r, err)) != SL_OK)
    return st;
  json_t *tc = member(root, "tool_choice");
  if (anthropic && tc) {
    json_t *type = json_object_get(tc, "type");
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    if (!json_is_object(tc) || (strcmp(t, "auto") && strcmp(t, "any") &&
                                strcmp(t, "tool") && strcmp(t, "none"))) {
      sl__srv_error_set(err, 400, "invalid_value", "tool_choice",
                        "tool_choice.type must be one of auto, any, tool, "
                        "none");
      return SL_ERR_FORMAT;
    }
    json_t *dp = member(tc, "disable_parallel_tool_use");
    if (dp && !json_is_boolean(dp)) {
      sl__srv_error_set(err, 400, "invalid_type", "tool_choice",
                        "tool_choice.disable_parallel_tool_use must be a "
                        "boolean");
      return SL_ERR_FORMAT;
    }
    r->tools_parallel = !json_is_true(dp);
    if (!strcmp(t, "none"))
      r->tool_choice = SL_SRV_TOOLS_NONE;
    else if (!strcmp(t, "any"))
      r->tool_choice = SL_SRV_TOOLS_REQUIRED;
    else if (!strcmp(t, "tool") &&
             (st = set_named(r, json_object_get(tc, "name"), err)) != SL_OK)
      return st;
  } else if (tc) {
    const char *t = json_is_string(tc) ? json_string_value(tc) : NULL;
    if (t && !strcmp(t, "none"))
      r->tool_choice = SL_SRV_TOOLS_NONE;
    else if (t && !strcmp(t, "required"))
      r->tool_choice = SL_SRV_TOOLS_REQUIRED;
    else if (t && !strcmp(t, "auto"))
      r->tool_choice = SL_SRV_TOOLS_AUTO;
    else if (json_is_object(tc) &&
             json_is_string(json_object_get(tc, "type")) &&
             !strcmp(json_string_value(json_object_get(tc, "type")),
                     "function") &&
             json_is_object(json_object_get(tc, "function"))) {
      if ((st = set_named(
               r, json_object_get(json_object_get(tc, "function"), "name"),
               err)) != SL_OK)
        return st;
    } else {
      sl__srv_error_set(err, 400, "invalid_value", "tool_choice",
                        "'tool_choice' must be 'none', 'auto', 'required' or "
                        "{\"type\": \"function\", \"function\": {\"name\"}}");
      return SL_ERR_FORMAT;
    }
  }
  json_t *ptc = anthropic ? NULL : member(root, "parallel_tool_calls");
  if (ptc && !json_is_boolean(ptc)) {
    sl__srv_error_set(err, 400, "invalid_type", "parallel_tool_calls",
                      "'parallel_tool_calls' must be a boolean");
    return SL_ERR_FORMAT;
  }
  if (ptc)
    r->tools_parallel = json_is_true(ptc);
  if (r->tool_choice == SL_SRV_TOOLS_REQUIRED && !r->tools) {
    sl__srv_error_set(err, 400, "invalid_value", "tool_choice",
                      "'tool_choice' requires a call, but 'tools' is empty");
    return SL_ERR_FORMAT;
  }
  return SL_OK;
}

/* ---- the template's side ------------------------------------------------- */

/* Whether the template renders `tools` itself. */
static bool template_native(const char *tmpl) {
  return tmpl && strstr(tmpl, "tools");
}

void sl__srv_tools_decide(sl_srv_request *r, const sl_srv_limits *lim) {
  r->toolfmt = SL_TOOLFMT_NONE;
  r->tools_native = template_native(lim->chat_template);
  if (!r->tools || r->tool_choice == SL_SRV_TOOLS_NONE)
    return;
  r->toolfmt = !r->tools_native ? SL_TOOLFMT_GENERIC
               : lim->toolfmt != SL_TOOLFMT_NONE
                   ? lim->toolfmt
                   : sl__srv_toolfmt_of_template(lim->chat_template);
}

void sl__srv_tools_instructions(const sl_srv_request *r, sl_sbuf *out) {
  sl__sbuf_adds(out, "You can call these tools (JSON Schema of each one's "
                     "arguments):\n");
  size_t i;
  json_t *t;
  json_array_foreach(r->tools, i, t) {
    sl__sbuf_add_json(out, t);
    sl__sbuf_adds(out, "\n");
  }
  sl__sbuf_adds(out, "To call tools, answer with this JSON and nothing else:\n"
                     "{\"tool_calls\": [{\"name\": \"<tool name>\", "
                     "\"arguments\": {<the arguments>}}]}\n");
  if (r->tool_choice == SL_SRV_TOOLS_AUTO)
    sl__sbuf_adds(out, "Otherwise answer in plain text.");
}

sl_status sl__srv_tools_template(sl_srv_request *r) {
  if (!r->tools || !r->tools_native)
    return SL_OK;
  sl_jv *list = sl_jv_list();
  size_t i;
  json_t *t;
  json_array_foreach(r->tools, i, t) {
    /* HF's shape: {"type": "function", "function": {name, description,
     * parameters}} */
    sl_jv *f = sl_jv_dict();
    if (f && sl_jv_dict_set(f, "type", sl_jv_string("function")) == SL_OK &&
        sl_jv_dict_set(f, "function", sl__srv_json_to_jv(t)) == SL_OK) {
      if (sl_jv_list_append(list, f) != SL_OK)
        goto nomem;
    } else {
      sl_jv_free(f);
      goto nomem;
    }
  }
  if (!(r->tmpl_extra = sl_jv_dict()))
    goto nomem;
  if (sl_jv_dict_set(r->tmpl_extra, "tools", list) != SL_OK) {
    list = NULL; /* freed by the failed set */
    goto nomem;
  }
  sl_jv_mark_untrusted(r->tmpl_extra);
  return SL_OK;
nomem:
  sl_jv_free(list);
  return SL_ERR_NOMEM;
}

/* ---- messages ------------------------------------------------------------ */

/* A call as HF templates take it: {id, type: "function", function: {name,
 * arguments}}, arguments an object (a string that is not one stays a
 * string). */
static sl_jv *call_jv(const char *id, const char *name, json_t *args) {
  sl_jv *fn = sl_jv_dict(), *c = sl_jv_dict();
  json_t *parsed = NULL;
  if (json_is_string(args))
    parsed = json_loads(json_string_value(args), 0, NULL);
  json_t *a = json_is_object(parsed) ? parsed : args;
  bool ok = fn && c &&
            sl_jv_dict_set(fn, "name", sl_jv_string(name)) == SL_OK &&
            sl_jv_dict_set(fn, "arguments",
                           a ? sl__srv_json_to_jv(a) : sl_jv_dict()) == SL_OK &&
            sl_jv_dict_set(c, "id", sl_jv_string(id ? id : "")) == SL_OK &&
            sl_jv_dict_set(c, "type", sl_jv_string("function")) == SL_OK;
  if (ok) { /* fn is c's now, or was freed by the failed set */
    ok = sl_jv_dict_set(c, "function", fn) == SL_OK;
    fn = NULL;
  }
  json_decref(parsed);
  if (!ok) {
    sl_jv_free(fn);
    sl_jv_free(c);
    return NULL;
  }
  return c;
}

/* The generic JSON of calls, for templates that do not render tool_calls:
 * {"tool_calls": [{"name", "arguments"}]} appended to text. */
static void calls_text(json_t *calls, sl_sbuf *text) {
  if (!calls)
    return;
  if (text->len)
    sl__sbuf_adds(text, "\n");
  json_t *o = json_pack("{s:O}", "tool_calls", calls);
  if (!o) {
    text->oom = true;
    return;
  }
  sl__sbuf_add_json(text, o);
  json_decref(o);
}

/* Adds role/content (+ tool_calls / tool_call_id) to the list, marked
 * untrusted. Takes tool_calls in every case. */
static sl_status push(sl_jv *list, const char *role, const sl_sbuf *text,
                      sl_jv *tool_calls, const char *tool_call_id,
                      const sl_sbuf *reasoning) {
  sl_jv *m = sl_jv_dict();
  bool ok = m && sl_jv_dict_set(m, "role", sl_jv_string(role)) == SL_OK &&
            sl_jv_dict_set(m, "content",
                           sl_jv_string_n(text->p ? text->p : "", text->len)) ==
                SL_OK;
  /* an earlier turn's thinking, where a template wants it (Qwen3's keeps
   * it for the turns after the last user message) */
  if (ok && reasoning && reasoning->len)
    ok = sl_jv_dict_set(m, "reasoning_content",
                        sl_jv_string_n(reasoning->p, reasoning->len)) == SL_OK;
  if (tool_calls && ok) /* m's now, or freed by the failed set */
    ok = sl_jv_dict_set(m, "tool_calls", tool_calls) == SL_OK;
  else if (tool_calls)
    sl_jv_free(tool_calls);
  if (ok && tool_call_id)
    ok = sl_jv_dict_set(m, "tool_call_id", sl_jv_string(tool_call_id)) == SL_OK;
  if (!ok) {
    sl_jv_free(m);
    return SL_ERR_NOMEM;
  }
  sl_jv_mark_untrusted(m);
  return sl_jv_list_append(list, m) == SL_OK ? SL_OK : SL_ERR_NOMEM;
}

sl_status sl__srv_msg_openai(json_t *m, const char *role, sl_sbuf *text,
                             const sl_srv_request *r, const char *param,
                             sl_srv_error *err) {
  json_t *tcs = member(m, "tool_calls");
  sl_jv *calls = NULL;
  json_t *plain = NULL; /* [{name, arguments}] for a template without tools */
  if (tcs && !strcmp(role, "assistant") && json_array_size(tcs)) {
    if (!json_is_array(tcs)) {
      sl__srv_error_set(err, 400, "invalid_type", param,
                        "'%s.tool_calls' must be a list", param);
      return SL_ERR_FORMAT;
    }
    calls = sl_jv_list();
    plain = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(tcs, i, c) {
      json_t *fn = json_object_get(c, "function");
      json_t *name = json_object_get(fn, "name");
      json_t *args = json_object_get(fn, "arguments");
      json_t *id = json_object_get(c, "id");
      if (!json_is_object(c) || !json_is_object(fn) || !json_is_string(name) ||
          (args && !json_is_string(args) && !json_is_object(args)) ||
          (id && !json_is_string(id))) {
        sl_jv_free(calls);
        json_decref(plain);
        sl__srv_error_set(err, 400, "invalid_value", param,
                          "'%s.tool_calls[%zu]' must be {id, type: "
                          "'function', function: {name, arguments}}",
                          param, i);
        return SL_ERR_FORMAT;
      }
      json_t *parsed = json_is_string(args)
                           ? json_loads(json_string_value(args), 0, NULL)
                           : NULL;
      if (sl_jv_list_append(calls, call_jv(json_string_value(id),
                                           json_string_value(name), args)) !=
              SL_OK ||
          json_array_append_new(
              plain, json_pack("{s:O,s:o}", "name", name, "arguments",
                               parsed ? json_incref(parsed)
                               : args ? json_incref(args)
                                      : json_object())) != 0) {
        json_decref(parsed);
        sl_jv_free(calls);
        json_decref(plain);
        goto nomem;
      }
      json_decref(parsed);
    }
  }
  json_t *tcid = member(m, "tool_call_id");
  json_t *rc = member(m, "reasoning_content"); /* llama.cpp's, vLLM's */
  if ((tcid && !json_is_string(tcid)) || (rc && !json_is_string(rc))) {
    sl_jv_free(calls);
    json_decref(plain);
    sl__srv_error_set(
        err, 400, "invalid_type", param, "'%s.%s' must be a string", param,
        tcid && !json_is_string(tcid) ? "tool_call_id" : "reasoning_content");
    return SL_ERR_FORMAT;
  }
  if (calls && !r->tools_native) { /* the calls as the text they were */
    calls_text(plain, text);
    sl_jv_free(calls);
    calls = NULL;
  }
  json_decref(plain);
  if (text->oom) {
    sl_jv_free(calls);
    goto nomem;
  }
  sl_sbuf reasoning = {0};
  if (rc && !strcmp(role, "assistant"))
    sl__sbuf_add(&reasoning, json_string_value(rc), json_string_length(rc));
  sl_status pst =
      reasoning.oom
          ? SL_ERR_NOMEM
          : push(r->messages, role, text, calls,
                 tcid && r->tools_native ? json_string_value(tcid) : NULL,
                 &reasoning);
  sl__sbuf_free(&reasoning);
  if (pst != SL_OK)
    goto nomem;
  return SL_OK;
nomem:
  sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
  return SL_ERR_NOMEM;
}

bool sl__srv_ant_has_blocks(json_t *content) {
  size_t i;
  json_t *b;
  if (!json_is_array(content))
    return false;
  json_array_foreach(content, i, b) {
    json_t *t = json_object_get(b, "type");
    const char *ts = json_is_string(t) ? json_string_value(t) : "";
    if (!strcmp(ts, "tool_use") || !strcmp(ts, "tool_result") ||
        !strcmp(ts, "thinking") || !strcmp(ts, "redacted_thinking"))
      return true;
  }
  return false;
}

/* A tool_result's content: a string, or a list of text blocks. */
static bool result_text(json_t *c, sl_sbuf *out) {
  if (!c || json_is_string(c)) {
    if (c)
      sl__sbuf_add(out, json_string_value(c), json_string_length(c));
    return true;
  }
  if (!json_is_array(c))
    return false;
  size_t i;
  json_t *b;
  json_array_foreach(c, i, b) {
    json_t *t = json_object_get(b, "type"), *x = json_object_get(b, "text");
    if (!json_is_string(t) || strcmp(json_string_value(t), "text") ||
        !json_is_string(x))
      return false;
    if (i)
      sl__sbuf_adds(out, "\n");
    sl__sbuf_add(out, json_string_value(x), json_string_length(x));
  }
  return true;
}

sl_status sl__srv_msg_anthropic(json_t *content, const char *role,
                                const sl_srv_request *r, const char *param,
                                sl_srv_error *err) {
  bool assistant = !strcmp(role, "assistant");
  sl_sbuf text = {0}, res = {0}, thinking = {0};
  sl_jv *calls = NULL;
  json_t *plain = NULL;
  sl_status st = SL_OK;
  size_t i;
  json_t *b;
  json_array_foreach(content, i, b) {
    json_t *type = json_object_get(b, "type");
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    if (!strcmp(t, "text")) {
      json_t *x = json_object_get(b, "text");
      if (!json_is_string(x)) {
        sl__srv_error_set(err, 400, "invalid_type", param,
                          "%s.%zu.text: must be a string", param, i);
        st = SL_ERR_FORMAT;
        goto out;
      }
      sl__sbuf_add(&text, json_string_value(x), json_string_length(x));
    } else if (!strcmp(t, "tool_use") && assistant) {
      json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"),
             *input = json_object_get(b, "input");
      if (!json_is_string(id) || !json_is_string(name) ||
          !json_is_object(input)) {
        sl__srv_error_set(err, 400, "invalid_value", param,
                          "%s.%zu: a tool_use block needs id, name and an "
                          "object of input",
                          param, i);
        st = SL_ERR_FORMAT;
        goto out;
      }
      if ((!calls && !(calls = sl_jv_list())) ||
          (!plain && !(plain = json_array())) ||
          sl_jv_list_append(calls, call_jv(json_string_value(id),
                                           json_string_value(name), input)) !=
              SL_OK ||
          json_array_append_new(plain, json_pack("{s:O,s:O}", "name", name,
                                                 "arguments", input)) != 0) {
        st = SL_ERR_NOMEM;
        goto out;
      }
    } else if (!strcmp(t, "thinking") && assistant) {
      json_t *x = json_object_get(b, "thinking");
      if (!json_is_string(x)) {
        sl__srv_error_set(err, 400, "invalid_type", param,
                          "%s.%zu.thinking: must be a string", param, i);
        st = SL_ERR_FORMAT;
        goto out;
      }
      sl__sbuf_add(&thinking, json_string_value(x), json_string_length(x));
    } else if (!strcmp(t, "redacted_thinking") && assistant) {
      /* opaque (encrypted by Anthropic): nothing a template can show */
    } else if (!strcmp(t, "tool_result") && !assistant) {
      json_t *id = json_object_get(b, "tool_use_id");
      json_t *err_flag = member(b, "is_error");
      res.len = 0;
      if (!json_is_string(id) || !result_text(member(b, "content"), &res) ||
          (err_flag && !json_is_boolean(err_flag))) {
        sl__srv_error_set(err, 400, "invalid_value", param,
                          "%s.%zu: a tool_result block needs a tool_use_id "
                          "and content of text",
                          param, i);
        st = SL_ERR_FORMAT;
        goto out;
      }
      if (json_is_true(err_flag)) { /* the template has no field for it */
        sl_sbuf e = {0};
        sl__sbuf_adds(&e, "Error: ");
        sl__sbuf_add(&e, res.p, res.len);
        sl__sbuf_free(&res);
        res = e;
      }
      if (res.oom ||
          push(r->messages, "tool", &res, NULL,
               r->tools_native ? json_string_value(id) : NULL, NULL) != SL_OK) {
        st = SL_ERR_NOMEM;
        goto out;
      }
    } else {
      sl__srv_error_set(err, 400, "unsupported_parameter", param,
                        "content part type '%s' is not supported here", t);
      st = SL_ERR_UNSUPPORTED;
      goto out;
    }
  }
  if (assistant || text.len) {
    if (calls && !r->tools_native) {
      calls_text(plain, &text);
      sl_jv_free(calls);
      calls = NULL;
    }
    if (text.oom || thinking.oom) {
      st = SL_ERR_NOMEM;
      goto out;
    }
    st = push(r->messages, role, &text, calls, NULL, &thinking);
    calls = NULL;
  }
out:
  if (st == SL_ERR_NOMEM)
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
  sl_jv_free(calls);
  json_decref(plain);
  sl__sbuf_free(&text);
  sl__sbuf_free(&res);
  sl__sbuf_free(&thinking);
  return st;
}

/* ---- the grammar of a forced call ---------------------------------------- */

sl_status sl__srv_tools_grammar(const sl_srv_request *r, sl_sbuf *g,
                                sl_srv_toolfmt *fmt_out, char *err,
                                size_t errcap) {
  sl_srv_toolfmt f = r->toolfmt;
  size_t n = json_array_size(r->tools);
  json_t **schemas = sl_calloc(n ? n : 1, sizeof *schemas);
  char(*names)[24] = sl_calloc(n ? n : 1, sizeof *names);
  sl_sbuf rules = {0};
  sl_status st = SL_ERR_NOMEM;
  if (!schemas || !names)
    goto out;
  size_t k = 0, i;
  json_t *t;
  int only = -1;
  json_array_foreach(r->tools, i, t) {
    schemas[i] = json_object_get(t, "parameters");
    if (r->tool_choice == SL_SRV_TOOLS_NAMED &&
        !strcmp(json_string_value(json_object_get(t, "name")), r->tool_name))
      only = (int)i;
  }
  /* a named tool: only its schema is compiled */
  st = only >= 0
           ? sl__srv_schema_rules(&schemas[only], 1, &names[only], &rules, err,
                                  errcap)
           : sl__srv_schema_rules(schemas, (int)n, names, &rules, err, errcap);
  if (st != SL_OK)
    goto out;
  const char *argkey = f == SL_TOOLFMT_LLAMA3 ? "parameters" : "arguments";
  /* a named tool is called once; `required` makes at most MAX_CALLS calls
   * when parallel calls are allowed (a small model would not stop) */
  bool many = r->tools_parallel && f != SL_TOOLFMT_LLAMA3 &&
              r->tool_choice == SL_SRV_TOOLS_REQUIRED;
  switch (f) {
  case SL_TOOLFMT_HERMES:
    sl__sbuf_adds(g,
                  many ? "root ::= tc ( \"\\n\" tc ){0,3}\n" : "root ::= tc\n");
    sl__sbuf_adds(g, "tc ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\n");
    break;
  case SL_TOOLFMT_MISTRAL: /* [TOOL_CALLS] is a control token: the list
                              alone, read back as the generic form */
    sl__sbuf_adds(g, many ? "root ::= \"[\" call ( \", \" call ){0,3} \"]\"\n"
                          : "root ::= \"[\" call \"]\"\n");
    f = SL_TOOLFMT_GENERIC;
    break;
  case SL_TOOLFMT_LLAMA3:
    sl__sbuf_adds(g, "root ::= call\n");
    break;
  default:
    sl__sbuf_adds(g, many
                         ? "root ::= \"{\\\"tool_calls\\\": [\" call ( \", "
                           "\" call ){0,3} \"]}\"\n"
                         : "root ::= \"{\\\"tool_calls\\\": [\" call \"]}\"\n");
    f = SL_TOOLFMT_GENERIC;
  }
  sl__sbuf_adds(g, "call ::= ");
  json_array_foreach(r->tools, i, t) {
    if (only >= 0 && (int)i != only)
      continue;
    sl__sbuf_addf(g, "%sc%zu", k++ ? " | " : "", i);
  }
  sl__sbuf_adds(g, "\n");
  json_array_foreach(r->tools, i, t) {
    if (only >= 0 && (int)i != only)
      continue;
    /* names are [A-Za-z0-9_.-]: nothing to escape */
    sl__sbuf_addf(g,
                  "c%zu ::= \"{\\\"name\\\": \\\"%s\\\", \\\"%s\\\": \" %s "
                  "\"}\"\n",
                  i, json_string_value(json_object_get(t, "name")), argkey,
                  names[i]);
  }
  sl__sbuf_add(g, rules.p, rules.len);
  sl__srv_json_base_gbnf(g);
  *fmt_out = f;
  st = g->oom || rules.oom ? SL_ERR_NOMEM : SL_OK;
out:
  sl__sbuf_free(&rules);
  sl_free(schemas);
  sl_free(names);
  if (st == SL_ERR_NOMEM)
    snprintf(err, errcap, "out of memory");
  return st;
}
