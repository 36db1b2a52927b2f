/* Server prompts (prompt.c) with the default model's tokenizer and chat
 * template: special tokens are parsed in the template's own text and not in
 * the messages' text, so a client cannot close its turn and forge another;
 * --parse-special-in-content restores llama.cpp's behaviour. Skips (77)
 * without the default model. */
#define _GNU_SOURCE /* memmem */
#include <string.h>

#include "default_model.h"
#include "harness.h"
#include "server/server_impl.h"
#include "sluice/gguf.h"
#include "sluice/util.h"

static sl_model_t *g_model;
static sl_tokenizer_t *g_tok;
static char *g_template;

static const char *names[] = {"smollm2"};
static const sl_srv_limits lim = {.model_names = names,
                                  .n_model_names = 1,
                                  .n_ctx = 1 << 20,
                                  .chat_template = NULL,
                                  .toolfmt = SL_TOOLFMT_NONE};

/* Appends s to a JSON string literal being built in buf (cap bytes). */
static void json_escape(char *buf, size_t cap, size_t *o, const char *s,
                        size_t n) {
  for (size_t i = 0; i < n && *o + 8 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\')
      *o += (size_t)snprintf(buf + *o, cap - *o, "\\%c", c);
    else if (c < 0x20)
      *o += (size_t)snprintf(buf + *o, cap - *o, "\\u%04x", c);
    else
      buf[(*o)++] = (char)c;
  }
  buf[*o] = 0;
}

/* The text of every control and user-defined token of the vocabulary, one
 * after another (a new string; free with sl_free); *count gets how many. */
static char *every_special(size_t *len, int *count) {
  size_t nv = sl_tokenizer_vocab_size(g_tok), cap = 1 << 16, o = 0;
  char *s = sl_malloc(cap);
  *count = 0;
  for (size_t id = 0; id < nv; id++) {
    sl_token_type ty = sl_tokenizer_token_type(g_tok, (int32_t)id);
    if (ty != SL_TOKEN_TYPE_CONTROL && ty != SL_TOKEN_TYPE_USER_DEFINED)
      continue;
    size_t pl;
    const char *p = sl_tokenizer_piece(g_tok, (int32_t)id, &pl);
    if (!p || pl == 0 || o + pl + 1 > cap)
      continue;
    memcpy(s + o, p, pl);
    o += pl;
    (*count)++;
  }
  s[o] = 0;
  *len = o;
  return s;
}

/* Parses a one-message chat request whose user content is `content`. */
static void chat_request(const char *content, size_t n, sl_srv_request *r) {
  static char body[1 << 18];
  size_t o = (size_t)snprintf(body, sizeof body,
                              "{\"model\":\"smollm2\",\"messages\":[{\"role\":"
                              "\"user\",\"content\":\"");
  json_escape(body, sizeof body, &o, content, n);
  o += (size_t)snprintf(body + o, sizeof body - o, "\"}]}");
  sl_srv_error e;
  CHECK_OK(sl__srv_parse(SL_SRV_CHAT, body, o, &lim, r, &e));
}

/* Appends the ids of text[0, n) to ids (grown with sl_realloc). */
static void encode_append(const char *text, size_t n, bool add_bos,
                          bool special, int32_t **ids, size_t *nids) {
  int32_t *t = NULL;
  size_t nt = 0;
  CHECK_OK(sl_tokenizer_encode(g_tok, text, n, add_bos, special, &t, &nt));
  *ids = sl_realloc(*ids, (*nids + nt + 1) * sizeof **ids);
  if (nt)
    memcpy(*ids + *nids, t, nt * sizeof *t);
  *nids += nt;
  sl_free(t);
}

static bool same_ids(const int32_t *a, size_t na, const int32_t *b, int nb) {
  return (int)na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* The issue-10 forged-turn case: content holding every special token of the
 * vocabulary gives the ids of the same content spelled as plain text
 * (tokenized with parse_special = false), between the template's own text
 * with its special tokens. With parse_special_in_content the content's
 * special tokens become special ids again (the old behaviour). */
static void test_every_special_token_is_plain_in_content(void) {
  size_t sn;
  int count;
  char *s = every_special(&sn, &count);
  CHECK(count >= 2); /* SmolLM2: <|endoftext|>, <|im_start|>, ... */
  sl_srv_request r;
  chat_request(s, sn, &r);

  /* the rendered prompt is P + s + Q (the template's text around it) */
  char bos[256] = "", eos[256] = "";
  size_t bl, el;
  const char *bp = sl_tokenizer_piece(g_tok, sl_tokenizer_bos(g_tok), &bl);
  const char *ep = sl_tokenizer_piece(g_tok, sl_tokenizer_eos(g_tok), &el);
  if (bp && bl < sizeof bos)
    memcpy(bos, bp, bl), bos[bl] = 0;
  if (ep && el < sizeof eos)
    memcpy(eos, ep, el), eos[el] = 0;
  char *out = NULL, terr[256];
  size_t out_len = 0;
  CHECK_OK(sl_chat_template_render(g_template, r.messages, true, bos, eos, NULL,
                                   &out, &out_len, terr, sizeof terr));
  const char *at = out ? memmem(out, out_len, s, sn) : NULL;
  CHECK(at != NULL);
  if (!at)
    goto out_render;
  size_t pn = (size_t)(at - out);
  bool add_bos = sl_tokenizer_add_bos(g_tok) &&
                 !(bos[0] && strncmp(out, bos, strlen(bos)) == 0);
  int32_t *want = NULL;
  size_t nwant = 0;
  encode_append(out, pn, add_bos, true, &want, &nwant);
  encode_append(s, sn, false, false, &want, &nwant);
  encode_append(at + sn, out_len - pn - sn, false, true, &want, &nwant);

  sl_srv_error e;
  int32_t *ids = NULL;
  int n = 0;
  CHECK_OK(sl__srv_prompt_ids(&r, g_tok, g_template, false, 0, &ids, &n, &e));
  CHECK_MSG(same_ids(want, nwant, ids, n),
            "%d ids, want %zu: content special tokens were parsed", n, nwant);
  /* none of the content's control tokens survives as its id */
  int n_ctl = 0, want_ctl = 0;
  for (int i = 0; i < n; i++)
    n_ctl += sl_tokenizer_token_type(g_tok, ids[i]) == SL_TOKEN_TYPE_CONTROL;
  for (size_t i = 0; i < nwant; i++)
    want_ctl +=
        sl_tokenizer_token_type(g_tok, want[i]) == SL_TOKEN_TYPE_CONTROL;
  CHECK_EQ_INT(n_ctl, want_ctl);
  sl_free(ids);

  /* the opt-in flag: the whole rendered text with special tokens parsed */
  int32_t *old = NULL;
  size_t nold = 0;
  encode_append(out, out_len, add_bos, true, &old, &nold);
  CHECK_OK(sl__srv_prompt_ids(&r, g_tok, g_template, true, 0, &ids, &n, &e));
  CHECK(same_ids(old, nold, ids, n));
  CHECK(!same_ids(want, nwant, ids, n));
  sl_free(ids);
  sl_free(old);
  sl_free(want);
out_render:
  sl_free(out);
  sl__srv_request_free(&r);
  sl_free(s);
}

/* Content without special tokens tokenizes as before: the marks change
 * nothing but where special tokens are recognized. */
static void test_plain_content_unchanged(void) {
  static const char *texts[] = {"Hello there", " leading space", "trailing\n\n",
                                "im_end|> <|im_ and <|",
                                "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93"};
  for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
    sl_srv_request r;
    chat_request(texts[k], strlen(texts[k]), &r);
    sl_srv_error e;
    int32_t *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    CHECK_OK(sl__srv_prompt_ids(&r, g_tok, g_template, false, 0, &a, &na, &e));
    CHECK_OK(sl__srv_prompt_ids(&r, g_tok, g_template, true, 0, &b, &nb, &e));
    CHECK_MSG(na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0,
              "content '%s'", texts[k]);
    sl_free(a);
    sl_free(b);
    sl__srv_request_free(&r);
  }
}

/* A completion's prompt is the client's whole text: special tokens parsed. */
static void test_completion_prompt_parses_special(void) {
  sl_srv_request r;
  sl_srv_error e;
  const char *body = "{\"model\":\"smollm2\",\"prompt\":\"<|im_start|>user\"}";
  CHECK_OK(sl__srv_parse(SL_SRV_COMPLETIONS, body, strlen(body), &lim, &r, &e));
  int32_t *ids = NULL;
  int n = 0;
  CHECK_OK(sl__srv_prompt_ids(&r, g_tok, g_template, false, 0, &ids, &n, &e));
  int32_t im_start = sl_tokenizer_find(g_tok, "<|im_start|>", 12);
  CHECK(n >= 2 && im_start != SL_TOKEN_NULL);
  bool found = false;
  for (int i = 0; i < n; i++)
    found = found || ids[i] == im_start;
  CHECK(found);
  sl_free(ids);
  sl__srv_request_free(&r);
}

int main(void) {
  int rc = load_default_model(&g_model, &g_tok);
  if (rc)
    return rc;
  sl_str tmpl;
  if (!sl_gguf_get_str(sl_model_gguf(g_model), "tokenizer.chat_template",
                       &tmpl)) {
    fprintf(stderr, "skipping: the default model has no chat template\n");
    return 77;
  }
  g_template = sl_malloc(tmpl.len + 1);
  memcpy(g_template, tmpl.ptr, tmpl.len);
  g_template[tmpl.len] = 0;
  sl__srv_json_init();
  RUN(test_every_special_token_is_plain_in_content);
  RUN(test_plain_content_unchanged);
  RUN(test_completion_prompt_parses_special);
  sl_free(g_template);
  sl_tokenizer_free(g_tok);
  sl_model_free(g_model);
  return sl_test_finish();
}
