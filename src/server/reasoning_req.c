/* sluice — server: the request fields that steer a model's thinking
 * (reasoning_req.h): Anthropic's `thinking`, OpenAI's `reasoning_effort`,
 * and `chat_template_kwargs` on both routes. Apart from reasoning.c (the
 * splitter) because it reads tools.c's JSON conversion, and tools.c sits
 * above the splitter (toolcall.c reads a job's content through it). */
#include <stdio.h>
#include <string.h>

#include "server/json.h"
#include "server/reasoning_req.h"
#include "server/tools.h"
#include "sluice/util.h"

/* A present, non-null member, or NULL. */
static json_t *member(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return v && !json_is_null(v) ? v : NULL;
}

/* Sets key in r->tmpl_extra (made when missing) to v (taken over). */
static sl_status extra_set(sl_srv_request *r, const char *key, sl_jv *v) {
  if (!v)
    return SL_ERR_NOMEM;
  if (!r->tmpl_extra && !(r->tmpl_extra = sl_jv_dict())) {
    sl_jv_free(v);
    return SL_ERR_NOMEM;
  }
  return sl_jv_dict_set(r->tmpl_extra, key, v); /* frees v when it fails */
}

/* Anthropic's thinking: {type: "enabled", budget_tokens: N} or {type:
 * "disabled"}. budget_tokens follows Anthropic's rule that it be below
 * max_tokens; Anthropic's minimum of 1024 is not kept (a small local model
 * thinks usefully in fewer, and tests need short budgets). */
static sl_status parse_thinking(json_t *th, sl_srv_request *r, bool *enable,
                                sl_srv_error *err) {
  json_t *t = json_is_object(th) ? json_object_get(th, "type") : NULL;
  const char *ts = json_is_string(t) ? json_string_value(t) : "";
  if (!json_is_object(th) ||
      (strcmp(ts, "enabled") != 0 && strcmp(ts, "disabled") != 0)) {
    sl__srv_error_set(err, 400, "invalid_value", "thinking",
                      "thinking: must be {\"type\": \"enabled\", "
                      "\"budget_tokens\": N} or {\"type\": \"disabled\"}");
    return SL_ERR_FORMAT;
  }
  *enable = !strcmp(ts, "enabled");
  json_t *b = json_object_get(th, "budget_tokens");
  if (!*enable)
    return SL_OK;
  if (!b) {
    sl__srv_error_set(err, 400, "missing_required_parameter", "thinking",
                      "thinking.budget_tokens: Field required");
    return SL_ERR_FORMAT;
  }
  if (!json_is_integer(b) || json_integer_value(b) < 1) {
    sl__srv_error_set(err, 400, "invalid_value", "thinking",
                      "thinking.budget_tokens: must be an integer of at "
                      "least 1");
    return SL_ERR_FORMAT;
  }
  json_int_t n = json_integer_value(b);
  if (r->api == SL_SRV_MESSAGES && n >= r->gen.max_tokens) {
    sl__srv_error_set(err, 400, "invalid_value", "thinking",
                      "`max_tokens` must be greater than "
                      "`thinking.budget_tokens` (%d <= %lld)",
                      r->gen.max_tokens, (long long)n);
    return SL_ERR_FORMAT;
  }
  r->think_budget = n > INT32_MAX ? INT32_MAX : (int)n;
  return SL_OK;
}

/* The variables a template sets for itself: never a client's kwarg. */
static bool reserved_var(const char *k) {
  static const char *const names[] = {
      "messages", "tools", "add_generation_prompt", "bos_token", "eos_token"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(k, names[i]))
      return true;
  return false;
}

sl_status sl__srv_reason_request(json_t *root, const sl_srv_limits *lim,
                                 sl_srv_request *r, sl_srv_error *err) {
  sl_status st;
  r->rfmt = sl__srv_rfmt_pick(lim->rfmt, lim->chat_template);
  bool enable = true, set_enable = false;
  json_t *th = member(root, "thinking");
  if (th && r->api != SL_SRV_CHAT) {
    if ((st = parse_thinking(th, r, &enable, err)) != SL_OK)
      return st;
    set_enable = true;
  }
  json_t *eff = member(root, "reasoning_effort");
  if (eff && r->api == SL_SRV_CHAT) {
    static const char *const levels[] = {"none", "minimal", "low", "medium",
                                         "high"};
    const char *es = json_is_string(eff) ? json_string_value(eff) : "";
    bool ok = false;
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
      ok = ok || !strcmp(es, levels[i]);
    if (!ok) {
      sl__srv_error_set(err, 400, "invalid_value", "reasoning_effort",
                        "'reasoning_effort' must be one of none, minimal, "
                        "low, medium, high");
      return SL_ERR_FORMAT;
    }
    if (extra_set(r, "reasoning_effort", sl_jv_string(es)) != SL_OK)
      goto fail_nomem;
  }
  if (set_enable &&
      extra_set(r, "enable_thinking", sl_jv_bool(enable)) != SL_OK)
    goto fail_nomem;
  json_t *kw = member(root, "chat_template_kwargs");
  if (kw) {
    const char *param = "chat_template_kwargs";
    if (!json_is_object(kw)) {
      sl__srv_error_set(err, 400, "invalid_type", param,
                        "'chat_template_kwargs' must be an object");
      return SL_ERR_FORMAT;
    }
    const char *k;
    json_t *v;
    json_object_foreach(kw, k, v) {
      if (reserved_var(k)) {
        sl__srv_error_set(err, 400, "invalid_value", param,
                          "'chat_template_kwargs.%.40s' is set by the server",
                          k);
        return SL_ERR_FORMAT;
      }
      sl_jv *jv = sl__srv_json_to_jv(v);
      sl_jv_mark_untrusted(jv); /* its text is the client's */
      if (extra_set(r, k, jv) != SL_OK)
        goto fail_nomem;
      if (!strcmp(k, "enable_thinking") && json_is_boolean(v))
        enable = json_is_true(v);
    }
  }
  /* the server's default (--reasoning-budget) where the request set none:
   * a cap, or thinking off */
  if (!set_enable && lim->reasoning_budget < 0 &&
      !(kw && json_object_get(kw, "enable_thinking"))) {
    enable = false;
    if (extra_set(r, "enable_thinking", sl_jv_bool(false)) != SL_OK)
      goto fail_nomem;
  } else if (!r->think_budget && lim->reasoning_budget > 0) {
    r->think_budget = lim->reasoning_budget;
  }
  if (!enable) /* nothing to cap: the template turns thinking off */
    r->think_budget = 0;
  return SL_OK;
fail_nomem:
  sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
  return SL_ERR_NOMEM;
}
