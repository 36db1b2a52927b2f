/* sluice — server: tool calls read back out of a model's text, one parser
 * per format family, the family picked from the chat template
 * (toolcall.h). Each parser finds the calls, checks that
 * each is a name and a JSON object of arguments, and keeps the text around
 * them as the message's content. Text that only looks like a call (bad
 * JSON, no name) stays content: nothing is dropped. */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <string.h>

#include "server/json.h"
#include "server/reasoning.h"
#include "server/toolcall.h"
#include "sluice/util.h"

sl_srv_toolfmt sl__srv_toolfmt_of_template(const char *tmpl) {
  if (!tmpl)
    return SL_TOOLFMT_GENERIC;
  if (strstr(tmpl, "<tool_call>"))
    return SL_TOOLFMT_HERMES; /* Hermes 2 Pro, Qwen 2.5 / 3, SmolLM3 */
  if (strstr(tmpl, "[TOOL_CALLS]"))
    return SL_TOOLFMT_MISTRAL;
  if (strstr(tmpl, "<|python_tag|>") || strstr(tmpl, "ipython"))
    return SL_TOOLFMT_LLAMA3;
  return SL_TOOLFMT_GENERIC;
}

const char *sl__srv_toolfmt_name(sl_srv_toolfmt f) {
  static const char *const names[] = {"hermes", "llama3", "mistral", "generic"};
  return f >= SL_TOOLFMT_HERMES && f <= SL_TOOLFMT_GENERIC
             ? names[f - SL_TOOLFMT_HERMES]
             : "none";
}

bool sl__srv_toolfmt_parse(const char *s, sl_srv_toolfmt *out) {
  for (int f = SL_TOOLFMT_HERMES; f <= SL_TOOLFMT_GENERIC; f++)
    if (!strcmp(s, sl__srv_toolfmt_name((sl_srv_toolfmt)f))) {
      *out = (sl_srv_toolfmt)f;
      return true;
    }
  return false;
}

void sl__srv_toolcalls_free(sl_srv_toolcalls *t) {
  for (int i = 0; i < t->n; i++) {
    sl_free(t->v[i].name);
    sl_free(t->v[i].arguments);
  }
  sl_free(t->v);
  sl_free(t->content);
  memset(t, 0, sizeof *t);
}

/* Drops the calls after the first `keep`. */
static void drop_calls(sl_srv_toolcalls *t, int keep) {
  while (t->n > keep) {
    t->n--;
    sl_free(t->v[t->n].name);
    sl_free(t->v[t->n].arguments);
  }
}

/* Appends one call: `name` and the arguments (an object, serialized
 * compactly). False when out of memory. */
static bool add_call(sl_srv_toolcalls *t, const char *name, json_t *args) {
  if (t->n == t->cap) {
    int cap = t->cap ? t->cap * 2 : 4;
    sl_srv_toolcall *v = sl_realloc(t->v, sizeof *v * (size_t)cap);
    if (!v)
      return false;
    t->v = v;
    t->cap = cap;
  }
  char *a = json_dumps(args, JSON_COMPACT);
  char *n = sl_strdup(name);
  char *ac = a ? sl_strdup(a) : NULL;
  free(a);
  if (!n || !ac) {
    sl_free(n);
    sl_free(ac);
    return false;
  }
  t->v[t->n++] = (sl_srv_toolcall){n, ac};
  return true;
}

/* A call as a JSON value: {"name": "...", "arguments"|"parameters": {...}}
 * (arguments may also be a string holding the object, as some models write
 * it). Adds it and returns true; false (and nothing added) when v is not
 * one; *oom when out of memory. */
static bool take_call(sl_srv_toolcalls *t, json_t *v, bool *oom) {
  if (!json_is_object(v))
    return false;
  json_t *name = json_object_get(v, "name");
  json_t *args = json_object_get(v, "arguments");
  if (!args)
    args = json_object_get(v, "parameters");
  if (!json_is_string(name) || !json_string_length(name))
    return false;
  json_t *parsed = NULL;
  if (json_is_string(args)) {
    parsed = json_loads(json_string_value(args), 0, NULL);
    args = parsed;
  }
  if (!args) { /* a call with no arguments at all */
    parsed = json_object();
    args = parsed;
  }
  bool ok = json_is_object(args);
  if (ok && !add_call(t, json_string_value(name), args))
    *oom = true, ok = false;
  json_decref(parsed);
  return ok;
}

/* The JSON value that starts at s[0] (after blanks), or NULL; *used: the
 * bytes it took, blanks before it included. */
static json_t *json_at(const char *s, size_t n, size_t *used) {
  size_t i = 0;
  while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r'))
    i++;
  if (i == n || (s[i] != '{' && s[i] != '['))
    return NULL;
  json_error_t je;
  json_t *v = json_loadb(s + i, n - i, JSON_DISABLE_EOF_CHECK, &je);
  if (v)
    *used = i + (size_t)je.position;
  return v;
}

static bool blank(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] != ' ' && s[i] != '\n' && s[i] != '\t' && s[i] != '\r')
      return false;
  return true;
}

/* Hermes / Qwen: <tool_call>{json}</tool_call>, any number, with text
 * around them. */
static sl_status parse_hermes(const char *s, size_t n, sl_srv_toolcalls *t,
                              sl_sbuf *content) {
  static const char open[] = "<tool_call>", close[] = "</tool_call>";
  size_t i = 0;
  bool oom = false;
  while (i < n) {
    const char *o = memmem(s + i, n - i, open, sizeof open - 1);
    if (!o)
      break;
    size_t at = (size_t)(o - s), body = at + sizeof open - 1, used = 0;
    json_t *v = json_at(s + body, n - body, &used);
    size_t end = body + used;
    while (end < n && (s[end] == ' ' || s[end] == '\n' || s[end] == '\r'))
      end++;
    bool closed = n - end >= sizeof close - 1 &&
                  !memcmp(s + end, close, sizeof close - 1);
    /* a call cut off by max_tokens (no closing tag) still counts when its
     * JSON is whole */
    if (v && (closed || end == n) && take_call(t, v, &oom)) {
      sl__sbuf_add(content, s + i, at - i);
      i = closed ? end + sizeof close - 1 : end;
    } else {
      sl__sbuf_add(content, s + i, body - i); /* not a call: text */
      i = body;
    }
    json_decref(v);
    if (oom)
      return SL_ERR_NOMEM;
  }
  sl__sbuf_add(content, s + i, n - i);
  return SL_OK;
}

/* A list of calls, or one call, as a JSON value: all taken or none. */
static bool take_calls(sl_srv_toolcalls *t, json_t *v, bool *oom) {
  int before = t->n;
  if (json_is_array(v)) {
    size_t k;
    json_t *x;
    if (!json_array_size(v))
      return false;
    json_array_foreach(v, k, x) {
      if (!take_call(t, x, oom))
        goto undo;
    }
    return true;
  }
  if (take_call(t, v, oom))
    return true;
undo:
  drop_calls(t, before);
  return false;
}

/* A function name as a model writes it after [TOOL_CALLS]: letters,
 * digits, '_', '-', '.'. */
bool sl__srv_name_chars(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
      return false;
  }
  return true;
}

/* Mistral: [TOOL_CALLS][{...}, ...] (v3), or [TOOL_CALLS]name[ARGS]{...}
 * repeated (v11); the text before the first marker is content. */
static sl_status parse_mistral(const char *s, size_t n, sl_srv_toolcalls *t,
                               sl_sbuf *content) {
  static const char mark[] = "[TOOL_CALLS]", args[] = "[ARGS]";
  const char *m = memmem(s, n, mark, sizeof mark - 1);
  if (!m) {
    sl__sbuf_add(content, s, n);
    return SL_OK;
  }
  size_t at = (size_t)(m - s), i = at;
  bool oom = false, any = false;
  while (i < n && n - i >= sizeof mark - 1 &&
         !memcmp(s + i, mark, sizeof mark - 1)) {
    i += sizeof mark - 1;
    size_t used = 0;
    json_t *v = json_at(s + i, n - i, &used);
    if (v) { /* v3: a list of calls */
      bool ok = take_calls(t, v, &oom);
      json_decref(v);
      if (!ok)
        break;
      i += used;
      any = true;
      continue;
    }
    /* v11: name[ARGS]{...} */
    const char *a = memmem(s + i, n - i, args, sizeof args - 1);
    if (!a)
      break;
    size_t nl = (size_t)(a - (s + i));
    char name[128];
    if (!nl || nl >= sizeof name || !sl__srv_name_chars(s + i, nl))
      break;
    memcpy(name, s + i, nl);
    name[nl] = 0;
    size_t ab = (size_t)(a - s) + sizeof args - 1;
    json_t *o = json_at(s + ab, n - ab, &used);
    bool ok = json_is_object(o) && add_call(t, name, o);
    if (json_is_object(o) && !ok)
      oom = true;
    json_decref(o);
    if (!ok)
      break;
    i = ab + used;
    any = true;
  }
  if (oom)
    return SL_ERR_NOMEM;
  if (!any || !blank(s + i, n - i)) { /* not all calls: the whole is text */
    drop_calls(t, 0);
    sl__sbuf_add(content, s, n);
    return SL_OK;
  }
  sl__sbuf_add(content, s, at);
  return SL_OK;
}

/* The whole answer (after an optional marker) is one JSON value of calls:
 * Llama 3.x ({"name", "parameters"}, maybe after <|python_tag|>, calls
 * separated by ';'), and the generic form ({"tool_calls": [...]},
 * {"tool_call": {...}}, or a list of calls). Otherwise it is all text. */
static sl_status parse_whole(const char *s, size_t n, sl_srv_toolcalls *t,
                             sl_sbuf *content, bool llama3) {
  static const char tag[] = "<|python_tag|>";
  size_t i = 0;
  while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r'))
    i++;
  if (llama3 && n - i >= sizeof tag - 1 && !memcmp(s + i, tag, sizeof tag - 1))
    i += sizeof tag - 1;
  bool oom = false, ok = true, any = false;
  while (ok && i < n) {
    size_t used = 0;
    json_t *v = json_at(s + i, n - i, &used);
    if (!v) {
      ok = false;
      break;
    }
    json_t *inner = json_object_get(v, "tool_calls");
    if (!inner)
      inner = json_object_get(v, "tool_call");
    ok = take_calls(t, inner ? inner : v, &oom);
    json_decref(v);
    i += used;
    any = any || ok;
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' ||
                     (llama3 && s[i] == ';')))
      i++;
  }
  if (oom)
    return SL_ERR_NOMEM;
  if (!ok || !any) {
    drop_calls(t, 0);
    sl__sbuf_add(content, s, n);
  }
  return SL_OK;
}

sl_status sl__srv_toolcalls_parse(sl_srv_toolfmt f, const char *text,
                                  size_t len, sl_srv_toolcalls *out) {
  memset(out, 0, sizeof *out);
  sl_sbuf content = {0};
  sl_status st;
  switch (f) {
  case SL_TOOLFMT_HERMES:
    st = parse_hermes(text, len, out, &content);
    break;
  case SL_TOOLFMT_MISTRAL:
    st = parse_mistral(text, len, out, &content);
    break;
  case SL_TOOLFMT_LLAMA3:
  case SL_TOOLFMT_GENERIC:
    st = parse_whole(text, len, out, &content, f == SL_TOOLFMT_LLAMA3);
    break;
  default:
    sl__sbuf_add(&content, text, len);
    st = SL_OK;
  }
  if (st == SL_OK && content.oom)
    st = SL_ERR_NOMEM;
  if (st != SL_OK) {
    sl__sbuf_free(&content);
    sl__srv_toolcalls_free(out);
    return st;
  }
  /* the content without the blanks a call left around it */
  size_t a = 0, b = content.len;
  while (a < b && (content.p[a] == ' ' || content.p[a] == '\n' ||
                   content.p[a] == '\r' || content.p[a] == '\t'))
    a++;
  while (b > a && (content.p[b - 1] == ' ' || content.p[b - 1] == '\n' ||
                   content.p[b - 1] == '\r' || content.p[b - 1] == '\t'))
    b--;
  if (out->n == 0) /* no call: the text as it was */
    a = 0, b = content.len;
  out->content = sl_malloc(b - a + 1);
  if (!out->content) {
    sl__sbuf_free(&content);
    sl__srv_toolcalls_free(out);
    return SL_ERR_NOMEM;
  }
  if (b > a)
    memcpy(out->content, content.p + a, b - a);
  out->content[b - a] = 0;
  out->content_len = b - a;
  sl__sbuf_free(&content);
  return SL_OK;
}

static bool is_blank(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

size_t sl__srv_toolcall_safe(sl_srv_toolfmt f, const char *s, size_t n) {
  const char *mark = f == SL_TOOLFMT_HERMES    ? "<tool_call>"
                     : f == SL_TOOLFMT_MISTRAL ? "[TOOL_CALLS]"
                                               : NULL;
  size_t end = n;
  if (f == SL_TOOLFMT_NONE)
    return n;
  if (mark) {
    size_t ml = strlen(mark);
    const char *m = memmem(s, n, mark, ml);
    if (m) {
      end = (size_t)(m - s);
    } else { /* the start of the mark, cut off at the end */
      for (size_t k = ml - 1; k > 0; k--)
        if (k <= n && !memcmp(s + n - k, mark, k)) {
          end = n - k;
          break;
        }
    }
  } else { /* Llama 3, generic: the whole answer may be the calls */
    static const char tag[] = "<|python_tag|>";
    size_t i = 0;
    while (i < n && is_blank(s[i]))
      i++;
    if (i == n || s[i] == '{' || s[i] == '[')
      return 0;
    size_t k = n - i < sizeof tag - 1 ? n - i : sizeof tag - 1;
    if (f == SL_TOOLFMT_LLAMA3 && !memcmp(s + i, tag, k))
      return 0;
  }
  while (end > 0 && is_blank(s[end - 1]))
    end--;
  return end;
}
