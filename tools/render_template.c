/* sl_render_template — renders a chat template with sluice's Jinja engine.
 *
 * Reads one JSON request on stdin:
 *   {"template": "...", "messages": [...], "add_generation_prompt": bool,
 *    "bos_token": "...", "eos_token": "...", "extra": {...}}
 * ("extra" holds further variables: tools, enable_thinking, ...) and writes
 * the rendering, byte for byte, to stdout. A bad request or a template error
 * exits 1 (2 for a bad request) with a message on stderr. Used by
 * tests/py/test_chat_templates.py to compare with Python jinja2.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "sluice/jinja.h"
#include "sluice/util.h"

/* Converts JSON to a caller-owned sl_jv tree; NULL on failure. */
static sl_jv *from_json(const json_t *j, int depth) {
  if (depth > 256)
    return NULL;
  switch (json_typeof(j)) {
  case JSON_NULL:
    return sl_jv_null();
  case JSON_TRUE:
    return sl_jv_bool(true);
  case JSON_FALSE:
    return sl_jv_bool(false);
  case JSON_INTEGER:
    return sl_jv_int((int64_t)json_integer_value(j));
  case JSON_REAL:
    return sl_jv_float(json_real_value(j));
  case JSON_STRING:
    return sl_jv_string_n(json_string_value(j), json_string_length(j));
  case JSON_ARRAY: {
    sl_jv *l = sl_jv_list();
    size_t i;
    json_t *it;
    if (!l)
      return NULL;
    json_array_foreach(j, i, it) {
      if (sl_jv_list_append(l, from_json(it, depth + 1)) != SL_OK) {
        sl_jv_free(l);
        return NULL;
      }
    }
    return l;
  }
  case JSON_OBJECT: {
    sl_jv *d = sl_jv_dict();
    const char *k;
    json_t *it;
    if (!d)
      return NULL;
    json_object_foreach((json_t *)j, k, it) {
      if (sl_jv_dict_set(d, k, from_json(it, depth + 1)) != SL_OK) {
        sl_jv_free(d);
        return NULL;
      }
    }
    return d;
  }
  }
  return NULL;
}

int main(void) {
  json_error_t jerr;
  json_t *req = json_loadf(stdin, JSON_ALLOW_NUL, &jerr);
  if (!req || !json_is_object(req)) {
    fprintf(stderr, "sl_render_template: bad JSON request: %s\n",
            req ? "not an object" : jerr.text);
    return 2;
  }
  int rc = 2;
  const json_t *tpl = json_object_get(req, "template");
  const json_t *msgs = json_object_get(req, "messages");
  const json_t *extra_j = json_object_get(req, "extra");
  if (!json_is_string(tpl) || !json_is_array(msgs) ||
      (extra_j && !json_is_object(extra_j))) {
    fprintf(stderr, "sl_render_template: need template (string), messages "
                    "(array), extra (object, optional)\n");
    goto done_req;
  }
  const json_t *bos = json_object_get(req, "bos_token");
  const json_t *eos = json_object_get(req, "eos_token");
  bool agp = json_is_true(json_object_get(req, "add_generation_prompt"));
  sl_jv *messages = from_json(msgs, 0);
  sl_jv *extra = extra_j ? from_json(extra_j, 0) : NULL;
  if (!messages || (extra_j && !extra)) {
    fprintf(stderr, "sl_render_template: out of memory\n");
    goto done_values;
  }
  char err[1024], *out = NULL;
  size_t n = 0;
  sl_status st =
      sl_chat_template_render(json_string_value(tpl), messages, agp,
                              json_is_string(bos) ? json_string_value(bos) : "",
                              json_is_string(eos) ? json_string_value(eos) : "",
                              extra, &out, &n, err, sizeof err);
  if (st != SL_OK) {
    fprintf(stderr, "template error (%s): %s\n", sl_status_name(st), err);
    rc = 1;
    goto done_values;
  }
  fwrite(out, 1, n, stdout);
  sl_free(out);
  rc = 0;

done_values:
  sl_jv_free(extra);
  sl_jv_free(messages);
done_req:
  json_decref(req);
  return rc;
}
