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

#include "server/json.h"
#include "server/parse.h"
#include "server/prompt.h"
#include "server/routes.h"
#include "server/state.h"
#include "sluice/util.h"

/* ---- models -------------------------------------------------------------- */

/* Entry i of the pool as the models routes show it, under the id asked
 * for (its name or its alias). */
static json_t *model_obj(const sl_server_t *s, int i, const char *id) {
  sl_pool_info in;
  if (!sl_pool_info_at(s->pool, i, &in))
    return NULL;
  char at[32];
  time_t t = (time_t)s->started_at;
  struct tm tmv;
  strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tmv));
  json_t *o = json_pack(
      "{s:s,s:s,s:I,s:s,s:s,s:s,s:s,s:s,s:b,s:I,s:I}", "id", id ? id : in.name,
      "object", "model", "created", (json_int_t)s->started_at, "owned_by",
      "sluice", "type", "model", "display_name", id ? id : in.name,
      "created_at", at, "state", sl_pool_state_name(in.state), "pinned",
      in.pinned, "file_bytes", (json_int_t)in.file_bytes, "memory_bytes",
      (json_int_t)in.bytes);
  if (o && in.n_ctx > 0)
    json_object_set_new(o, "context_length", json_integer(in.n_ctx));
  json_t *al = o ? json_array() : NULL;
  for (int k = 0; al && k < in.n_aliases; k++)
    json_array_append_new(al, json_string(in.aliases[k]));
  if (al)
    json_object_set_new(o, "aliases", al);
  return o;
}

json_t *sl__srv_models_json(sl_server_t *s) {
  json_t *data = json_array();
  int n = sl_pool_count(s->pool);
  for (int i = 0; data && i < n; i++) {
    json_t *m = model_obj(s, i, NULL);
    if (!m || json_array_append_new(data, m) != 0) {
      json_decref(data);
      return NULL;
    }
  }
  if (!data)
    return NULL;
  sl_pool_info first, last;
  sl_pool_info_at(s->pool, 0, &first);
  sl_pool_info_at(s->pool, n - 1, &last);
  return json_pack("{s:s,s:o,s:b,s:s?,s:s?}", "object", "list", "data", data,
                   "has_more", 0, "first_id", first.name, "last_id", last.name);
}

/* The entry a request's "model" names: a name, an alias, or "default"
 * (the first entry). */
int sl__srv_model_index(sl_server_t *s, const char *id) {
  if (id && !strcmp(id, "default"))
    return sl_pool_count(s->pool) > 0 ? 0 : -1;
  return sl_pool_find(s->pool, id);
}

json_t *sl__srv_model_json(sl_server_t *s, const char *id, sl_srv_error *err) {
  int i = sl__srv_model_index(s, id);
  if (i >= 0)
    return model_obj(s, i, id);
  sl__srv_error_set(err, 404, "model_not_found", "model",
                    "the model '%.200s' does not exist", id);
  return NULL;
}

json_t *sl__srv_admin_clear(sl_server_t *s, sl_srv_error *err) {
  int n = sl_pool_count(s->pool), cleared = 0;
  sl_status st = SL_OK;
  for (int i = 0; i < n; i++) {
    sl_pool_lease l;
    if (!sl_pool_acquire_loaded(s->pool, i, &l))
      continue;
    sl_status e = sl_engine_clear_cache(l.engine);
    sl_pool_release(s->pool, &l);
    if (e == SL_OK)
      cleared++;
    else if (st == SL_OK)
      st = e;
  }
  const char *how = "engines";
  if (!cleared && st == SL_OK) {
    /* no engine runs: the named clear that drains every stream */
    how = "drain_all";
    st = sl_drain_all_and_clear_cache(sl_cpu_device());
    sl_device_t *d = NULL;
    if (st == SL_OK && sl_cuda_available() &&
        sl_device_get(SL_DEVICE_CUDA, 0, &d) == SL_OK)
      st = sl_drain_all_and_clear_cache(d);
  }
  if (st != SL_OK) {
    sl__srv_error_set(err, 500, NULL, NULL, "the clear reported %s",
                      sl_status_str(st));
    return NULL;
  }
  json_t *o = json_pack("{s:s,s:i}", "cleared", how, "engines", cleared);
  if (!o)
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
  return o;
}

json_t *sl__srv_admin_model(sl_server_t *s, const char *rest,
                            sl_srv_error *err) {
  const char *slash = strrchr(rest, '/');
  char id[256];
  if (!slash || slash == rest || (size_t)(slash - rest) >= sizeof id) {
    sl__srv_error_set(err, 404, "not_found", NULL,
                      "use /admin/api/models/{model}/"
                      "{load|unload|pin|unpin|clear}");
    return NULL;
  }
  snprintf(id, sizeof id, "%.*s", (int)(slash - rest), rest);
  const char *action = slash + 1;
  int i = sl__srv_model_index(s, id);
  sl_pool_info in;
  if (i < 0 || !sl_pool_info_at(s->pool, i, &in)) {
    sl__srv_error_set(err, 404, "model_not_found", "model",
                      "the model '%.200s' does not exist", id);
    return NULL;
  }
  char why[320] = "";
  sl_status st = SL_OK;
  if (!strcmp(action, "load")) {
    if ((st = sl_pool_load(s->pool, in.name, why, sizeof why)) != SL_OK) {
      sl__srv_load_error(st, in.name, why, err);
      return NULL;
    }
  } else if (!strcmp(action, "unload")) {
    st = sl_pool_unload(s->pool, in.name, why, sizeof why);
    if (st != SL_OK) {
      sl__srv_error_set(err, st == SL_ERR_STATE ? 409 : 500, "model_busy",
                        "model", "cannot unload: %s", why);
      return NULL;
    }
  } else if (!strcmp(action, "clear")) {
    /* on the engine's executor, with its own stream (DESIGN.md, admin) */
    sl_pool_lease l;
    if (!sl_pool_acquire_loaded(s->pool, i, &l)) {
      sl__srv_error_set(err, 409, "model_not_loaded", "model",
                        "the model '%.200s' is not loaded", in.name);
      return NULL;
    }
    st = sl_engine_clear_cache(l.engine);
    sl_pool_release(s->pool, &l);
    if (st != SL_OK) {
      sl__srv_error_set(err, 503, NULL, NULL, "cannot clear: %s",
                        sl_status_str(st));
      return NULL;
    }
  } else if (!strcmp(action, "pin") || !strcmp(action, "unpin")) {
    (void)sl_pool_set_pinned(s->pool, in.name, !strcmp(action, "pin"));
  } else {
    sl__srv_error_set(err, 404, "not_found", NULL,
                      "unknown action '%.40s' (load, unload, pin, unpin, "
                      "clear)",
                      action);
    return NULL;
  }
  json_t *o = model_obj(s, i, NULL);
  if (!o)
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
  return o;
}

sl_status sl__srv_model_acquire(sl_server_t *s, const char *name,
                                sl_srv_model *m, sl_srv_error *err) {
  m->srv = s;
  sl__srv_model_release(m);
  m->pool = s->pool;
  int i = sl__srv_model_index(s, name);
  sl_pool_info in;
  if (i < 0 || !sl_pool_info_at(s->pool, i, &in)) {
    sl__srv_error_set(err, 404, "model_not_found", "model",
                      "the model '%.200s' does not exist", name ? name : "");
    return SL_ERR_NOT_FOUND;
  }
  char why[320];
  sl_status st = sl_pool_acquire(s->pool, in.name, &m->lease, why, sizeof why);
  if (st != SL_OK)
    sl__srv_load_error(st, in.name, why, err);
  return st;
}

void sl__srv_load_error(sl_status st, const char *name, const char *why,
                        sl_srv_error *err) {
  if (st == SL_ERR_NOT_FOUND)
    sl__srv_error_set(err, 404, "model_not_found", "model", "%s", why);
  else if (st == SL_ERR_MEMORY_LIMIT)
    sl__srv_error_set(err, 503, "insufficient_memory", "model",
                      "cannot load the model now: %s", why);
  else if (st == SL_ERR_CANCELLED)
    sl__srv_error_set(err, 503, NULL, NULL, "%s", why);
  else
    sl__srv_error_set(err, 500, "model_load_failed", "model",
                      "cannot load the model '%.100s': %s", name, why);
}

static sl_status resolve(void *user, const char *model, sl_srv_limits *lim,
                         sl_srv_error *err) {
  sl_srv_model *m = user;
  sl_status st = sl__srv_model_acquire(m->srv, model, m, err);
  if (st != SL_OK)
    return st;
  lim->n_ctx = m->lease.n_ctx;
  lim->chat_template = m->lease.chat_template;
  return SL_OK;
}

sl_srv_limits sl__srv_limits_of(sl_server_t *s, sl_srv_model *m) {
  m->srv = s;
  m->pool = s->pool;
  m->lease.index = -1;
  return (sl_srv_limits){.n_ctx = 0,
                         .toolfmt = s->toolfmt,
                         .rfmt = s->rfmt,
                         .reasoning_budget = s->cfg.reasoning_budget,
                         .resolve = resolve,
                         .resolve_user = m};
}

/* A body's optional "model" (llama.cpp's routes have none): the model to
 * lease, "default" when it is missing. NULL with *err set when it is not a
 * string. */
static const char *body_model(json_t *root, sl_srv_error *err) {
  json_t *m = json_object_get(root, "model");
  if (!m || json_is_null(m))
    return "default";
  if (!json_is_string(m)) {
    sl__srv_error_set(err, 400, "invalid_type", "model",
                      "'model' must be a string");
    return NULL;
  }
  return json_string_value(m);
}

/* ---- count_tokens -------------------------------------------------------- */

sl_status sl__srv_count_tokens(sl_server_t *s, const char *body, size_t len,
                               json_t **out, sl_srv_error *err) {
  *out = NULL;
  sl_srv_model m;
  sl_srv_limits lim = sl__srv_limits_of(s, &m);
  sl_srv_request r;
  sl_status st = sl__srv_parse(SL_SRV_COUNT_TOKENS, body, len, &lim, &r, err);
  if (st != SL_OK) {
    sl__srv_model_release(&m);
    return st;
  }
  int32_t *ids = NULL;
  int n = 0;
  st = sl__srv_prompt_ids(&r, m.lease.tok, m.lease.chat_template,
                          s->cfg.parse_special_in_content, 0, &ids, &n, err);
  sl__srv_request_free(&r);
  sl__srv_model_release(&m);
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
  sl_srv_model m;
  sl_srv_limits lim = sl__srv_limits_of(s, &m);
  /* llama.cpp's route takes a chat body without a model: the default */
  json_t *root = sl__srv_body_object(body, len, err);
  if (!root)
    return SL_ERR_FORMAT;
  if (!json_object_get(root, "model") &&
      json_object_set_new(root, "model", json_string("default"))) {
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
  if (st != SL_OK) {
    sl__srv_model_release(&m);
    return st;
  }
  char *text = NULL;
  size_t n = 0;
  st = sl__srv_prompt_text(&r, m.lease.tok, m.lease.chat_template, &text, &n,
                           err);
  sl__srv_request_free(&r);
  sl__srv_model_release(&m);
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
  sl_srv_model m = {.srv = s, .pool = s->pool, .lease = {.index = -1}};
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
  const char *mn = body_model(root, err);
  if (!mn || (st = sl__srv_model_acquire(s, mn, &m, err)) != SL_OK) {
    st = mn ? st : SL_ERR_FORMAT;
    goto out;
  }
  size_t n = 0;
  st = sl_tokenizer_encode(m.lease.tok, json_string_value(c),
                           json_string_length(c), add_special, parse_special,
                           &ids, &n);
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
      const char *p = sl_tokenizer_piece(m.lease.tok, ids[i], &pl);
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
  sl__srv_model_release(&m);
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
  sl_srv_model m = {.srv = s, .pool = s->pool, .lease = {.index = -1}};
  json_t *t = json_object_get(root, "tokens");
  if (!json_is_array(t)) {
    sl__srv_error_set(err, 400,
                      t ? "invalid_type" : "missing_required_parameter",
                      "tokens", "'tokens' must be a list of token ids");
    goto out;
  }
  const char *mn = body_model(root, err);
  if (!mn || (st = sl__srv_model_acquire(s, mn, &m, err)) != SL_OK) {
    st = mn ? st : SL_ERR_FORMAT;
    goto out;
  }
  st = SL_ERR_FORMAT;
  size_t n = json_array_size(t), nv = sl_tokenizer_vocab_size(m.lease.tok);
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
    st = sl_tokenizer_decode(m.lease.tok, ids, n, false, true, &text, &tl);
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
  sl__srv_model_release(&m);
  return st;
}
