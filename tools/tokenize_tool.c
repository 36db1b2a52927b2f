/* sl_tokenize_tool — tokenizes JSON lines with sluice's tokenizer (for tests
 * that compare against llama.cpp).
 *
 *   sl_tokenize_tool MODEL.gguf < in.jsonl > out.jsonl
 *   sl_tokenize_tool --info MODEL.gguf
 *
 * Each input line is an object: {"text": "..."} or {"hex": "<bytes as hex>"}
 * (for byte strings that are not valid UTF-8), with optional booleans
 * "add_bos" (llama.cpp's add_special), "special" (parse_special) and
 * "decode_special" (render control tokens when detokenizing). Each output
 * line is {"ids": [...], "detok_hex": "<detokenized bytes as hex>"} or
 * {"error": "..."}. --info prints one object describing the vocabulary.
 * Exit status: 0 on success, 1 on a usage or load error.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice/gguf.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

static int hexval(int c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Decodes hex into a new buffer (free()); NULL on bad input. */
static char *unhex(const char *h, size_t *n) {
  size_t l = strlen(h);
  if (l % 2)
    return NULL;
  char *out = malloc(l / 2 + 1);
  if (!out)
    return NULL;
  for (size_t i = 0; i < l / 2; i++) {
    int a = hexval(h[2 * i]), b = hexval(h[2 * i + 1]);
    if (a < 0 || b < 0) {
      free(out);
      return NULL;
    }
    out[i] = (char)(a * 16 + b);
  }
  *n = l / 2;
  return out;
}

static char *tohex(const char *s, size_t n) {
  char *out = malloc(2 * n + 1);
  if (!out)
    return NULL;
  for (size_t i = 0; i < n; i++)
    sprintf(out + 2 * i, "%02x", (unsigned char)s[i]);
  out[2 * n] = 0;
  return out;
}

static void emit(json_t *o) {
  char *s = json_dumps(o, JSON_COMPACT);
  if (s) {
    fputs(s, stdout);
    fputc('\n', stdout);
    free(s);
  }
  json_decref(o);
}

static void emit_error(const char *msg) {
  json_t *o = json_object();
  json_object_set_new(o, "error", json_string(msg));
  emit(o);
}

static void print_info(const sl_tokenizer_t *t) {
  json_t *o = json_object();
  size_t n = sl_tokenizer_vocab_size(t);
  json_object_set_new(o, "n_vocab", json_integer((json_int_t)n));
  json_object_set_new(o, "bos", json_integer(sl_tokenizer_bos(t)));
  json_object_set_new(o, "eos", json_integer(sl_tokenizer_eos(t)));
  json_object_set_new(o, "eot", json_integer(sl_tokenizer_eot(t)));
  json_object_set_new(o, "add_bos", json_boolean(sl_tokenizer_add_bos(t)));
  json_object_set_new(o, "add_eos", json_boolean(sl_tokenizer_add_eos(t)));
  json_object_set_new(o, "pre", json_string(sl_tokenizer_pre_name(t)));
  json_t *eog = json_array(), *types = json_array();
  for (size_t i = 0; i < n; i++) {
    if (sl_tokenizer_is_eog(t, (int32_t)i))
      json_array_append_new(eog, json_integer((json_int_t)i));
    json_array_append_new(types,
                          json_integer(sl_tokenizer_token_type(t, (int32_t)i)));
  }
  json_object_set_new(o, "eog", eog);
  json_object_set_new(o, "types", types);
  emit(o);
}

static void process_line(const sl_tokenizer_t *t, const char *line) {
  json_error_t je;
  json_t *in = json_loads(line, JSON_ALLOW_NUL, &je);
  if (!in || !json_is_object(in)) {
    emit_error("bad JSON line");
    json_decref(in);
    return;
  }
  const char *text = NULL;
  char *owned = NULL;
  size_t len = 0;
  json_t *jt = json_object_get(in, "text");
  json_t *jh = json_object_get(in, "hex");
  if (json_is_string(jt)) {
    text = json_string_value(jt);
    len = json_string_length(jt);
  } else if (json_is_string(jh)) {
    owned = unhex(json_string_value(jh), &len);
    text = owned;
  }
  if (!text) {
    emit_error("need \"text\" or valid \"hex\"");
    json_decref(in);
    return;
  }
  bool add_bos = json_is_true(json_object_get(in, "add_bos"));
  bool special = json_is_true(json_object_get(in, "special"));
  bool dspecial = json_is_true(json_object_get(in, "decode_special"));
  int32_t *ids = NULL;
  size_t n = 0;
  sl_status st = sl_tokenizer_encode(t, text, len, add_bos, special, &ids, &n);
  if (st != SL_OK) {
    emit_error(sl_status_str(st));
  } else {
    char *det = NULL;
    size_t dl = 0;
    json_t *o = json_object();
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
      json_array_append_new(arr, json_integer(ids[i]));
    json_object_set_new(o, "ids", arr);
    st = sl_tokenizer_decode(t, ids, n, false, dspecial, &det, &dl);
    if (st == SL_OK) {
      char *hx = tohex(det, dl);
      json_object_set_new(o, "detok_hex", json_string(hx ? hx : ""));
      free(hx);
      sl_free(det);
    } else {
      json_object_set_new(o, "error", json_string(sl_status_str(st)));
    }
    emit(o);
  }
  sl_free(ids);
  free(owned);
  json_decref(in);
}

int main(int argc, char **argv) {
  bool info = argc == 3 && strcmp(argv[1], "--info") == 0;
  if (argc != 2 && !info) {
    fprintf(stderr, "usage: %s [--info] MODEL.gguf < in.jsonl\n", argv[0]);
    return 1;
  }
  const char *path = argv[argc - 1];
  char err[256];
  sl_status st;
  sl_gguf_t *g = sl_gguf_open(path, &st, err, sizeof err);
  if (!g) {
    fprintf(stderr, "%s: %s\n", path, err);
    return 1;
  }
  sl_tokenizer_t *t = NULL;
  st = sl_tokenizer_load(g, &t, err, sizeof err);
  sl_gguf_close(g);
  if (st != SL_OK) {
    fprintf(stderr, "%s: tokenizer: %s (%s)\n", path, err, sl_status_str(st));
    return 1;
  }
  if (info) {
    print_info(t);
  } else {
    char *line = NULL;
    size_t cap = 0;
    ssize_t r;
    while ((r = getline(&line, &cap, stdin)) > 0) {
      if (r == 1 && line[0] == '\n')
        continue;
      process_line(t, line);
    }
    free(line);
  }
  sl_tokenizer_free(t);
  return 0;
}
