/* libFuzzer harness: sl_jinja_compile + sl_jinja_render over arbitrary
 * template bytes, with a fixed chat-like context (messages with tool calls,
 * tools, bos/eos tokens) and tight limits so that no input can hang or
 * exhaust memory. Seed it with tests/fixtures/templates/.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_impl.h"
#include "sluice/jinja.h"
#include "sluice/util.h"

static sl_jv *g_ctx;

static sl_jv *msg(const char *role, const char *content) {
  sl_jv *m = sl_jv_dict();
  if (!m)
    abort();
  sl_jv_dict_set(m, "role", sl_jv_string(role));
  sl_jv_dict_set(m, "content", sl_jv_string(content));
  return m;
}

static sl_jv *build_ctx(void) {
  sl_jv *ctx = sl_jv_dict();
  sl_jv *ms = sl_jv_list();
  sl_jv_list_append(ms, msg("system", "You are helpful."));
  sl_jv_list_append(ms, msg("user", "  héllo 🚀 <think>x</think>\n"));
  sl_jv *a = msg("assistant", "");
  sl_jv *calls = sl_jv_list(), *call = sl_jv_dict(), *fn = sl_jv_dict();
  sl_jv *args = sl_jv_dict();
  sl_jv_dict_set(args, "city", sl_jv_string("Paris"));
  sl_jv_dict_set(args, "n", sl_jv_float(1.5));
  sl_jv_dict_set(fn, "name", sl_jv_string("get_weather"));
  sl_jv_dict_set(fn, "arguments", args);
  sl_jv_dict_set(call, "id", sl_jv_string("abc123XYZ"));
  sl_jv_dict_set(call, "function", fn);
  sl_jv_list_append(calls, call);
  sl_jv_dict_set(a, "tool_calls", calls);
  sl_jv_list_append(ms, a);
  sl_jv_list_append(ms, msg("tool", "{\"temp\": 21}"));
  sl_jv_list_append(ms, msg("user", "thanks"));
  sl_jv *tools = sl_jv_list(), *tool = sl_jv_dict();
  sl_jv_dict_set(tool, "type", sl_jv_string("function"));
  sl_jv_dict_set(tool, "n", sl_jv_int(-7));
  sl_jv_dict_set(tool, "null", sl_jv_null());
  sl_jv_list_append(tools, tool);
  sl_jv_mark_untrusted(ms); /* the request's: exercises the marks */
  sl_jv_mark_untrusted(tools);
  sl_jv_dict_set(ctx, "messages", ms);
  sl_jv_dict_set(ctx, "tools", tools);
  sl_jv_dict_set(ctx, "add_generation_prompt", sl_jv_bool(true));
  sl_jv_dict_set(ctx, "bos_token", sl_jv_string("<s>"));
  sl_jv_dict_set(ctx, "eos_token", sl_jv_string("</s>"));
  return ctx;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_ctx)
    g_ctx = build_ctx();
  if (size > 1 << 16)
    return 0;
  char err[256];
  sl_jinja_template_t *t =
      sl_jinja_compile((const char *)data, size, err, sizeof err);
  if (!t)
    return 0;
  sl_jinja_limits lim = {.max_output = 1 << 20,
                         .max_memory = 32 << 20,
                         .max_steps = 200000,
                         .max_depth = 100};
  char *out = NULL;
  size_t n = 0;
  uint8_t *marks = NULL;
  sl_status st = sl__jinja_render_bind(t, g_ctx, &lim, NULL, NULL, 0, &out, &n,
                                       &marks, err, sizeof err);
  if (st == SL_OK) {
    if (!out || strlen(out) > n)
      abort(); /* the length must cover the string */
    for (size_t i = 0; marks && i < n; i++)
      if (marks[i] > 1)
        abort(); /* one 0/1 mark per output byte */
    sl_free(out);
    sl_free(marks);
  } else if (out || marks) {
    abort(); /* nothing is handed out on failure */
  }
  sl_jinja_free(t);
  return 0;
}
