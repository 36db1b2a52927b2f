/* sluice — jinja: rendering a chat template the way HF transformers does. */
#include <string.h>

#include "jinja_impl.h"
#include "sluice/util.h"

sl_status sl_chat_template_render(const char *template_src,
                                  const sl_jv *messages,
                                  bool add_generation_prompt,
                                  const char *bos_token, const char *eos_token,
                                  const sl_jv *extra, char **out,
                                  size_t *out_len, char *err, size_t errcap) {
  return sl_chat_template_render_marked(
      template_src, messages, add_generation_prompt, bos_token, eos_token,
      extra, out, out_len, NULL, err, errcap);
}

sl_status
sl_chat_template_render_marked(const char *template_src, const sl_jv *messages,
                               bool add_generation_prompt,
                               const char *bos_token, const char *eos_token,
                               const sl_jv *extra, char **out, size_t *out_len,
                               uint8_t **untrusted, char *err, size_t errcap) {
  if (err && errcap)
    err[0] = 0;
  if (out)
    *out = NULL;
  if (untrusted)
    *untrusted = NULL;
  if (!template_src || !messages || !out ||
      sl_jv_kind_of(messages) != SL_JV_LIST ||
      (extra && sl_jv_kind_of(extra) != SL_JV_DICT))
    return SL_ERR_INVALID_ARG;
  sl_status st = SL_ERR_NOMEM;
  sl_jinja_template_t *t =
      sl_jinja_compile(template_src, strlen(template_src), err, errcap);
  if (!t)
    return err && !strcmp(err, "out of memory") ? SL_ERR_NOMEM : SL_ERR_FORMAT;
  sl_jv *agp = sl_jv_bool(add_generation_prompt);
  if (!agp)
    goto fail_template;
  sl_jv *bos = sl_jv_string(bos_token ? bos_token : "");
  if (!bos)
    goto fail_agp;
  sl_jv *eos = sl_jv_string(eos_token ? eos_token : "");
  if (!eos)
    goto fail_bos;
  const char *names[] = {"messages", "add_generation_prompt", "bos_token",
                         "eos_token"};
  const sl_jv *vals[] = {messages, agp, bos, eos};
  st = sl__jinja_render_bind(t, extra, NULL, names, vals, 4, out, out_len,
                             untrusted, err, errcap);
  sl_jv_free(eos);
fail_bos:
  sl_jv_free(bos);
fail_agp:
  sl_jv_free(agp);
fail_template:
  sl_jinja_free(t);
  if (st == SL_ERR_NOMEM && err && errcap && !err[0])
    strncpy(err, "out of memory", errcap - 1), err[errcap - 1] = 0;
  return st;
}
