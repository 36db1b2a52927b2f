/* sluice — server: what a request body says to constrain its tokens
 * (constrain.h): response_format, llama.cpp's grammar and json_schema, a
 * JSON Schema as a grammar, logit_bias. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/constrain.h"
#include "server/json.h"
#include "server/schema.h"
#include "sluice/grammar.h"
#include "sluice/util.h"

/* A present, non-null member, or NULL. */
static json_t *member(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return v && !json_is_null(v) ? v : NULL;
}

/* OpenAI's logit_bias: {"<token id>": bias in [-100, 100], ...}. The ids
 * are checked against the vocabulary where the tokenizer is known (the
 * engine refuses one outside it too). */
sl_status sl__srv_parse_logit_bias(json_t *v, sl_srv_request *r,
                                   sl_srv_error *err) {
  if (!v)
    return SL_OK;
  if (!json_is_object(v)) {
    sl__srv_error_set(err, 400, "invalid_type", "logit_bias",
                      "'logit_bias' must be an object of token ids to "
                      "numbers");
    return SL_ERR_FORMAT;
  }
  size_t n = json_object_size(v);
  if (n > SL_MAX_LOGIT_BIAS) {
    sl__srv_error_set(err, 400, "invalid_value", "logit_bias",
                      "'logit_bias' may hold at most %d entries",
                      SL_MAX_LOGIT_BIAS);
    return SL_ERR_FORMAT;
  }
  if (!n)
    return SL_OK;
  if (!(r->bias = sl_malloc(sizeof *r->bias * n))) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return SL_ERR_NOMEM;
  }
  const char *key;
  json_t *b;
  int i = 0;
  json_object_foreach(v, key, b) {
    char *end = NULL;
    errno = 0;
    long id = strtol(key, &end, 10);
    if (!key[0] || *end || errno || id < 0 || id > INT32_MAX ||
        (key[0] < '0' || key[0] > '9')) {
      sl__srv_error_set(err, 400, "invalid_value", "logit_bias",
                        "'logit_bias' keys must be token ids (decimal), got "
                        "'%.32s'",
                        key);
      return SL_ERR_FORMAT;
    }
    double d = json_is_number(b) ? json_number_value(b) : NAN;
    if (!(d >= -100 && d <= 100)) {
      sl__srv_error_set(err, 400, "invalid_value", "logit_bias",
                        "'logit_bias[%ld]' must be a number between -100 and "
                        "100",
                        id);
      return SL_ERR_FORMAT;
    }
    r->bias[i++] = (sl_logit_bias){(int32_t)id, (float)d};
  }
  r->gen.logit_bias = r->bias;
  r->gen.n_logit_bias = i;
  return SL_OK;
}

/* Compiles GBNF text into r->grammar (constrained decoding); a 400 naming
 * `param` when it does not compile. */
sl_status sl__srv_set_grammar(sl_srv_request *r, const char *gbnf, size_t len,
                              const char *param, sl_srv_error *err) {
  char gerr[256] = "";
  sl_grammar_t *g = NULL;
  sl_status st = sl_grammar_compile_shared(gbnf, len, &g, gerr, sizeof gerr);
  if (st == SL_ERR_NOMEM) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return st;
  }
  if (st != SL_OK) {
    sl__srv_error_set(err, 400, "invalid_value", param, "'%s': %s", param,
                      gerr);
    return SL_ERR_FORMAT;
  }
  /* a grammar so ambiguous that its start state alone passes the
   * matcher's budget is refused here, not in the engine */
  sl_grammar_matcher_t *m = sl_grammar_matcher_create(g);
  if (!m) {
    sl_grammar_unref(g);
    sl__srv_error_set(err, 400, "invalid_value", param,
                      "'%s': the grammar is too ambiguous to follow", param);
    return SL_ERR_FORMAT;
  }
  sl_grammar_matcher_free(m);
  r->grammar = g;
  r->gen.grammar = g;
  return SL_OK;
}

/* A JSON Schema (borrowed) as r's grammar; `param` names it in errors. */
sl_status sl__srv_set_schema(sl_srv_request *r, json_t *schema,
                             const char *param, sl_srv_error *err) {
  sl_sbuf g = {0};
  char serr[256] = "";
  sl_status st = sl__srv_schema_gbnf(schema, &g, serr, sizeof serr);
  if (st == SL_OK)
    st = sl__srv_set_grammar(r, g.p, g.len, param, err);
  else if (st == SL_ERR_NOMEM)
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
  else
    sl__srv_error_set(err, 400, "invalid_value", param,
                      "'%s': the JSON schema cannot be used: %s", param, serr);
  sl__sbuf_free(&g);
  return st;
}

/* response_format (OpenAI), and llama.cpp's grammar and json_schema. */
sl_status sl__srv_parse_structured(json_t *root, sl_srv_request *r,
                                   sl_srv_error *err) {
  json_t *rf = member(root, "response_format");
  json_t *gr = member(root, "grammar");
  json_t *js = member(root, "json_schema");
  const char *rft = NULL;
  if (rf) {
    json_t *t = json_object_get(rf, "type");
    if (!json_is_object(rf) || !json_is_string(t)) {
      sl__srv_error_set(err, 400, "invalid_type", "response_format",
                        "'response_format' must be an object with a 'type'");
      return SL_ERR_FORMAT;
    }
    rft = json_string_value(t);
    if (strcmp(rft, "text") && strcmp(rft, "json_object") &&
        strcmp(rft, "json_schema")) {
      sl__srv_error_set(err, 400, "invalid_value", "response_format",
                        "response_format type '%s' is not one of text, "
                        "json_object, json_schema",
                        rft);
      return SL_ERR_FORMAT;
    }
    if (!strcmp(rft, "text"))
      rft = NULL;
  }
  if ((rft != NULL) + (gr != NULL) + (js != NULL) > 1) {
    sl__srv_error_set(err, 400, "invalid_value", "response_format",
                      "give one of response_format (json), grammar and "
                      "json_schema");
    return SL_ERR_FORMAT;
  }
  if (gr) {
    if (!json_is_string(gr)) {
      sl__srv_error_set(err, 400, "invalid_type", "grammar",
                        "'grammar' must be a string (GBNF)");
      return SL_ERR_FORMAT;
    }
    return sl__srv_set_grammar(r, json_string_value(gr), json_string_length(gr),
                               "grammar", err);
  }
  if (js)
    return sl__srv_set_schema(r, js, "json_schema", err);
  if (rft && !strcmp(rft, "json_object")) {
    sl_sbuf g = {0};
    sl__srv_json_object_gbnf(&g);
    sl_status st =
        g.oom ? SL_ERR_NOMEM
              : sl__srv_set_grammar(r, g.p, g.len, "response_format", err);
    sl__sbuf_free(&g);
    if (st == SL_ERR_NOMEM)
      sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return st;
  }
  if (rft) { /* json_schema */
    json_t *o = json_object_get(rf, "json_schema");
    json_t *sc = json_is_object(o) ? json_object_get(o, "schema") : NULL;
    if (!sc) {
      sl__srv_error_set(err, 400, "missing_required_parameter",
                        "response_format",
                        "response_format json_schema needs "
                        "'json_schema': {'name', 'schema'}");
      return SL_ERR_FORMAT;
    }
    return sl__srv_set_schema(r, sc, "response_format", err);
  }
  return SL_OK;
}
