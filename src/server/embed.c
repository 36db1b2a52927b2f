/* sluice — server: POST /v1/embeddings (OpenAI's shape). The request's
 * inputs (a string, a list of strings, a list of token ids, or a list of
 * those) are checked and tokenized here; job.c submits each as one
 * embedding request to the engine (sl_gen_params.pooling); openai.c builds
 * the answer from the pooled, normalized vectors (sl__srv_embed_body). */
#include <stdio.h>
#include <string.h>

#include "server/embed.h"
#include "server/json.h"
#include "sluice/util.h"

static void emb_input_free(sl_srv_request *r) {
  for (int i = 0; i < r->n_inputs; i++) {
    sl_free(r->inputs[i].text);
    sl_free(r->inputs[i].ids);
  }
  sl_free(r->inputs);
  r->inputs = NULL;
  r->n_inputs = 0;
}

void sl__srv_embed_free(sl_srv_request *r) {
  emb_input_free(r);
}

/* One input: a non-empty string, or a non-empty list of token ids. */
static sl_status take_input(json_t *v, size_t i, sl_srv_request *r,
                            sl_srv_error *err) {
  sl_srv_input *in = &r->inputs[r->n_inputs];
  memset(in, 0, sizeof *in);
  if (json_is_string(v)) {
    if (!json_string_length(v)) {
      sl__srv_error_set(err, 400, "invalid_value", "input",
                        "'input[%zu]' must not be empty", i);
      return SL_ERR_FORMAT;
    }
    if (!(in->text = sl_malloc(json_string_length(v) + 1)))
      goto nomem;
    memcpy(in->text, json_string_value(v), json_string_length(v) + 1);
    in->len = json_string_length(v);
    r->n_inputs++;
    return SL_OK;
  }
  size_t n = json_array_size(v);
  if (!json_is_array(v) || !n) {
    sl__srv_error_set(err, 400, "invalid_type", "input",
                      "'input[%zu]' must be a non-empty string or a "
                      "non-empty list of token ids",
                      i);
    return SL_ERR_FORMAT;
  }
  if (n > (size_t)INT32_MAX / 2 || !(in->ids = sl_calloc(n, sizeof *in->ids)))
    goto nomem;
  r->n_inputs++; /* owned from here */
  for (size_t k = 0; k < n; k++) {
    json_t *t = json_array_get(v, k);
    if (!json_is_integer(t) || json_integer_value(t) < 0 ||
        json_integer_value(t) > INT32_MAX) {
      sl__srv_error_set(err, 400, "invalid_type", "input",
                        "'input[%zu][%zu]' must be a token id (a "
                        "non-negative integer)",
                        i, k);
      return SL_ERR_FORMAT;
    }
    in->ids[k] = (int32_t)json_integer_value(t);
  }
  in->n_ids = (int)n;
  return SL_OK;
nomem:
  sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
  return SL_ERR_NOMEM;
}

sl_status sl__srv_parse_embeddings(json_t *root, const sl_srv_limits *lim,
                                   sl_srv_request *r, sl_srv_error *err) {
  (void)lim;
  json_t *in = json_object_get(root, "input");
  if (!in || json_is_null(in)) {
    sl__srv_error_set(err, 400, "missing_required_parameter", "input",
                      "'input' is required");
    return SL_ERR_FORMAT;
  }
  json_t *fmt = json_object_get(root, "encoding_format");
  if (fmt && !json_is_null(fmt)) {
    const char *f = json_is_string(fmt) ? json_string_value(fmt) : "";
    if (strcmp(f, "float") && strcmp(f, "base64")) {
      sl__srv_error_set(err, 400, "invalid_value", "encoding_format",
                        "'encoding_format' must be 'float' or 'base64'");
      return SL_ERR_FORMAT;
    }
    r->emb_base64 = !strcmp(f, "base64");
  }
  json_t *dim = json_object_get(root, "dimensions");
  if (dim && !json_is_null(dim)) {
    if (!json_is_integer(dim) || json_integer_value(dim) < 1) {
      sl__srv_error_set(err, 400, "invalid_value", "dimensions",
                        "'dimensions' must be a positive integer");
      return SL_ERR_FORMAT;
    }
    r->emb_dimensions = json_integer_value(dim) > INT32_MAX
                            ? INT32_MAX
                            : (int)json_integer_value(dim);
  }
  /* one input: a string, or a list of ids; else a list of those */
  bool one = json_is_string(in) || (json_is_array(in) && json_array_size(in) &&
                                    json_is_integer(json_array_get(in, 0)));
  size_t n = one ? 1 : json_array_size(in);
  if (!one && !json_is_array(in)) {
    sl__srv_error_set(err, 400, "invalid_type", "input",
                      "'input' must be a string, a list of strings, a list "
                      "of token ids, or a list of such lists");
    return SL_ERR_FORMAT;
  }
  if (!n) {
    sl__srv_error_set(err, 400, "invalid_value", "input",
                      "'input' must not be empty");
    return SL_ERR_FORMAT;
  }
  if (n > SL_SRV_MAX_EMBED_INPUTS) {
    sl__srv_error_set(err, 400, "invalid_value", "input",
                      "'input' may hold at most %d inputs",
                      SL_SRV_MAX_EMBED_INPUTS);
    return SL_ERR_FORMAT;
  }
  if (!(r->inputs = sl_calloc(n, sizeof *r->inputs))) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return SL_ERR_NOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    sl_status st = take_input(one ? in : json_array_get(in, i), i, r, err);
    if (st != SL_OK)
      return st;
  }
  return SL_OK;
}

sl_status sl__srv_embed_ids(sl_srv_request *r, const sl_tokenizer_t *tok,
                            int n_ctx, sl_srv_error *err) {
  size_t nv = sl_tokenizer_vocab_size(tok);
  for (int i = 0; i < r->n_inputs; i++) {
    sl_srv_input *in = &r->inputs[i];
    if (in->text) { /* the whole text, special tokens parsed, BOS as the
                       model adds it (as llama.cpp's server embeds) */
      size_t nn = 0;
      int32_t *ids = NULL;
      sl_status st = sl_tokenizer_encode_limited(
          tok, in->text, in->len, sl_tokenizer_add_bos(tok), NULL,
          n_ctx > 0 ? (size_t)n_ctx - 1 : SIZE_MAX, &ids, &nn);
      if (st == SL_ERR_NOMEM) {
        sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
        return st;
      }
      if (st == SL_ERR_RANGE) { /* known before it was tokenized whole */
        sl__srv_error_set(err, 400, "context_length_exceeded", "input",
                          "'input[%d]' has more tokens than this model's "
                          "maximum context length, %d tokens",
                          i, n_ctx);
        return st;
      }
      if (st != SL_OK || !nn || nn > INT32_MAX) {
        sl_free(ids);
        sl__srv_error_set(err, 400, "invalid_value", "input",
                          "cannot tokenize 'input[%d]'", i);
        return SL_ERR_FORMAT;
      }
      in->ids = ids;
      in->n_ids = (int)nn;
    }
    for (int k = 0; k < in->n_ids; k++)
      if ((size_t)in->ids[k] >= nv) {
        sl__srv_error_set(err, 400, "invalid_value", "input",
                          "token id %d at input[%d][%d] is outside the "
                          "vocabulary (%zu)",
                          in->ids[k], i, k, nv);
        return SL_ERR_RANGE;
      }
    if (in->n_ids >= n_ctx) {
      sl__srv_error_set(err, 400, "context_length_exceeded", "input",
                        "'input[%d]' has %d tokens; this model's maximum "
                        "context length is %d tokens",
                        i, in->n_ids, n_ctx);
      return SL_ERR_RANGE;
    }
  }
  return SL_OK;
}
