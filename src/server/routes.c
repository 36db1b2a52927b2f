/* sluice — server: the routes that generate nothing. Each takes a request
 * body (or a path) and gives a JSON answer or an API error; http.c routes
 * to them and sends what they return.
 *   GET  /v1/models, /v1/models/{id}  the served model, in a shape both the
 *        OpenAI SDK (object, created, owned_by) and the Anthropic SDK (type,
 *        display_name, created_at, has_more, first_id, last_id) read
 *   POST /v1/messages/count_tokens    Anthropic's: the prompt's tokens as
 *        /v1/messages would render them, nothing generated
 *   POST /tokenize, /detokenize       llama.cpp's server's
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "server/server_impl.h"
#include "sluice/util.h"

/* ---- models -------------------------------------------------------------- */

static json_t *model_obj(const sl_server_t *s, const char *id) {
  char at[32];
  time_t t = (time_t)s->started_at;
  struct tm tmv;
  strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tmv));
  return json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:s,s:i}", "id", id, "object",
                   "model", "created", (json_int_t)s->started_at, "owned_by",
                   "sluice", "type", "model", "display_name", id, "created_at",
                   at, "context_length", s->cfg.n_ctx);
}

json_t *sl__srv_models_json(sl_server_t *s) {
  json_t *data = json_array();
  json_t *m = model_obj(s, s->model_name);
  if (!data || !m || json_array_append_new(data, m) != 0) {
    json_decref(data);
    return NULL;
  }
  return json_pack("{s:s,s:o,s:b,s:s,s:s}", "object", "list", "data", data,
                   "has_more", 0, "first_id", s->model_name, "last_id",
                   s->model_name);
}

json_t *sl__srv_model_json(sl_server_t *s, const char *id, sl_srv_error *err) {
  for (int i = 0; i < s->n_names; i++)
    if (s->names[i] && !strcmp(id, s->names[i]))
      return model_obj(s, id);
  sl__srv_error_set(err, 404, "model_not_found", "model",
                    "the model '%.200s' does not exist", id);
  return NULL;
}

sl_srv_limits sl__srv_limits_of(const sl_server_t *s) {
  return (sl_srv_limits){.model_names = s->names,
                         .n_model_names = s->n_names,
                         .n_ctx = s->cfg.n_ctx,
                         .chat_template = s->chat_template,
                         .toolfmt = s->toolfmt};
}

/* ---- count_tokens -------------------------------------------------------- */

sl_status sl__srv_count_tokens(sl_server_t *s, const char *body, size_t len,
                               json_t **out, sl_srv_error *err) {
  *out = NULL;
  sl_srv_limits lim = sl__srv_limits_of(s);
  sl_srv_request r;
  sl_status st = sl__srv_parse(SL_SRV_COUNT_TOKENS, body, len, &lim, &r, err);
  if (st != SL_OK)
    return st;
  int32_t *ids = NULL;
  int n = 0;
  st = sl__srv_prompt_ids(&r, s->tok, s->chat_template,
                          s->cfg.parse_special_in_content, &ids, &n, err);
  sl__srv_request_free(&r);
  if (st != SL_OK)
    return st;
  sl_free(ids);
  if (!(*out = json_pack("{s:i}", "input_tokens", n))) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return SL_ERR_NOMEM;
  }
  return SL_OK;
}

/* ---- apply-template ------------------------------------------------------ */

sl_status sl__srv_apply_template(sl_server_t *s, const char *body, size_t len,
                                 json_t **out, sl_srv_error *err) {
  *out = NULL;
  sl_srv_limits lim = sl__srv_limits_of(s);
  /* llama.cpp's route takes a chat body without a model: this one's */
  json_t *root = sl__srv_body_object(body, len, err);
  if (!root)
    return SL_ERR_FORMAT;
  if (!json_object_get(root, "model") &&
      json_object_set_new(root, "model", json_string(s->model_name))) {
    json_decref(root);
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return SL_ERR_NOMEM;
  }
  char *whole = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (!whole) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return SL_ERR_NOMEM;
  }
  sl_srv_request r;
  sl_status st =
      sl__srv_parse(SL_SRV_CHAT, whole, strlen(whole), &lim, &r, err);
  free(whole);
  if (st != SL_OK)
    return st;
  char *text = NULL;
  size_t n = 0;
  st = sl__srv_prompt_text(&r, s->tok, s->chat_template, &text, &n, err);
  sl__srv_request_free(&r);
  if (st != SL_OK)
    return st;
  *out = json_pack("{s:s%}", "prompt", text, n);
  sl_free(text);
  if (!*out) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return SL_ERR_NOMEM;
  }
  return SL_OK;
}

/* ---- tokenize / detokenize ----------------------------------------------- */

/* An optional boolean member: false with err set when it is not one. */
static bool get_bool(json_t *o, const char *key, bool *v, sl_srv_error *err) {
  json_t *x = json_object_get(o, key);
  if (!x || json_is_null(x))
    return true;
  if (!json_is_boolean(x)) {
    sl__srv_error_set(err, 400, "invalid_type", key, "'%s' must be a boolean",
                      key);
    return false;
  }
  *v = json_is_true(x);
  return true;
}

/* A piece as llama.cpp's /tokenize gives it: a string when its bytes are
 * whole UTF-8, else the list of its bytes. */
static json_t *piece_json(const char *p, size_t n) {
  if (sl__utf8_valid(p, n))
    return json_stringn(p, n);
  json_t *a = json_array();
  for (size_t i = 0; a && i < n; i++)
    if (json_array_append_new(a, json_integer((unsigned char)p[i])) != 0) {
      json_decref(a);
      return NULL;
    }
  return a;
}

sl_status sl__srv_tokenize(sl_server_t *s, const char *body, size_t len,
                           json_t **out, sl_srv_error *err) {
  *out = NULL;
  json_t *root = sl__srv_body_object(body, len, err);
  if (!root)
    return SL_ERR_FORMAT;
  sl_status st = SL_ERR_FORMAT;
  int32_t *ids = NULL;
  json_t *toks = NULL;
  json_t *c = json_object_get(root, "content");
  bool add_special = false, parse_special = true, with_pieces = false;
  if (!json_is_string(c)) {
    sl__srv_error_set(err, 400,
                      c ? "invalid_type" : "missing_required_parameter",
                      "content", "'content' must be a string");
    goto out;
  }
  if (!get_bool(root, "add_special", &add_special, err) ||
      !get_bool(root, "parse_special", &parse_special, err) ||
      !get_bool(root, "with_pieces", &with_pieces, err))
    goto out;
  size_t n = 0;
  st = sl_tokenizer_encode(s->tok, json_string_value(c), json_string_length(c),
                           add_special, parse_special, &ids, &n);
  if (st != SL_OK) {
    sl__srv_error_set(err, st == SL_ERR_NOMEM ? 500 : 400, NULL, "content",
                      "cannot tokenize: %s", sl_status_str(st));
    goto out;
  }
  st = SL_ERR_NOMEM;
  if (!(toks = json_array()))
    goto nomem;
  for (size_t i = 0; i < n; i++) {
    json_t *t;
    if (with_pieces) {
      size_t pl = 0;
      const char *p = sl_tokenizer_piece(s->tok, ids[i], &pl);
      json_t *pj = piece_json(p ? p : "", pl);
      t = pj ? json_pack("{s:i,s:o}", "id", ids[i], "piece", pj) : NULL;
    } else {
      t = json_integer(ids[i]);
    }
    if (!t || json_array_append_new(toks, t) != 0)
      goto nomem;
  }
  if (!(*out = json_pack("{s:o}", "tokens", toks)))
    goto nomem_given;
  toks = NULL;
  st = SL_OK;
  goto out;
nomem:
  json_decref(toks);
nomem_given:
  toks = NULL;
  sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
out:
  json_decref(toks);
  sl_free(ids);
  json_decref(root);
  return st;
}

sl_status sl__srv_detokenize(sl_server_t *s, const char *body, size_t len,
                             json_t **out, sl_srv_error *err) {
  *out = NULL;
  json_t *root = sl__srv_body_object(body, len, err);
  if (!root)
    return SL_ERR_FORMAT;
  sl_status st = SL_ERR_FORMAT;
  int32_t *ids = NULL;
  char *text = NULL;
  json_t *t = json_object_get(root, "tokens");
  if (!json_is_array(t)) {
    sl__srv_error_set(err, 400,
                      t ? "invalid_type" : "missing_required_parameter",
                      "tokens", "'tokens' must be a list of token ids");
    goto out;
  }
  size_t n = json_array_size(t), nv = sl_tokenizer_vocab_size(s->tok);
  if (n && !(ids = sl_malloc(sizeof *ids * n))) {
    st = SL_ERR_NOMEM;
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    json_t *x = json_array_get(t, i);
    if (!json_is_integer(x) || json_integer_value(x) < 0 ||
        (size_t)json_integer_value(x) >= nv) {
      sl__srv_error_set(err, 400, "invalid_value", "tokens",
                        "'tokens[%zu]' must be a token id in 0..%zu", i,
                        nv - 1);
      goto out;
    }
    ids[i] = (int32_t)json_integer_value(x);
  }
  size_t tl = 0;
  /* as llama.cpp's: each token's piece, control tokens as their text */
  if (n) {
    st = sl_tokenizer_decode(s->tok, ids, n, false, true, &text, &tl);
    if (st != SL_OK) {
      sl__srv_error_set(err, st == SL_ERR_NOMEM ? 500 : 400, NULL, "tokens",
                        "cannot detokenize: %s", sl_status_str(st));
      goto out;
    }
  }
  json_t *str = sl__json_str_lossy(text ? text : "", tl);
  if (!str || !(*out = json_pack("{s:o}", "content", str))) {
    st = SL_ERR_NOMEM;
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    goto out;
  }
  st = SL_OK;
out:
  sl_free(text);
  sl_free(ids);
  json_decref(root);
  return st;
}
