/* libFuzzer harness: sl_tokenizer_encode (and _marked) over arbitrary bytes
 * (invalid UTF-8 included), both special modes, then decode of the ids.
 *
 * The vocabulary is the GGUF named by SLUICE_FUZZ_MODEL (or SLUICE_MODEL),
 * if set and loadable; otherwise a small synthetic byte-level BPE vocabulary
 * built in memory. The first input byte picks the pre-tokenizer of the
 * synthetic vocabulary, so every pre-tokenizer gets fuzzed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice/gguf.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

typedef struct wbuf {
  unsigned char *p;
  size_t n, cap;
  uint64_t n_kv;
} wbuf;

static void put(wbuf *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 256;
    b->p = realloc(b->p, b->cap);
    if (!b->p)
      abort();
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}
static void put_u32(wbuf *b, uint32_t v) {
  put(b, &v, 4);
}
static void put_u64(wbuf *b, uint64_t v) {
  put(b, &v, 8);
}
static void put_s(wbuf *b, const char *s) {
  put_u64(b, strlen(s));
  put(b, s, strlen(s));
}
static void kv_str(wbuf *b, const char *k, const char *v) {
  put_s(b, k);
  put_u32(b, SL_GGUF_STRING);
  put_s(b, v);
  b->n_kv++;
}
static void kv_strs(wbuf *b, const char *k, const char *const *v, size_t n) {
  put_s(b, k);
  put_u32(b, SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_STRING);
  put_u64(b, n);
  for (size_t i = 0; i < n; i++)
    put_s(b, v[i]);
  b->n_kv++;
}
static void kv_i32s(wbuf *b, const char *k, const int32_t *v, size_t n) {
  put_s(b, k);
  put_u32(b, SL_GGUF_ARRAY);
  put_u32(b, SL_GGUF_INT32);
  put_u64(b, n);
  put(b, v, 4 * n);
  b->n_kv++;
}

static const char *const k_pres[] = {"smollm", "llama-bpe", "qwen2",
                                     "gpt-2",  "default",   "deepseek-llm"};
#define N_PRES (sizeof k_pres / sizeof k_pres[0])

static sl_tokenizer_t *g_tok[N_PRES];
static sl_tokenizer_t *g_real;
static unsigned char *g_files[N_PRES];

static sl_tokenizer_t *synthetic(const char *pre, unsigned char **file) {
  static char texts[256][4];
  const char *toks[2 + 256 + 4];
  int32_t types[2 + 256 + 4];
  size_t n = 0;
  toks[n] = "<|endoftext|>";
  types[n++] = 3;
  toks[n] = "<|im_start|>";
  types[n++] = 3;
  for (unsigned c = 0; c < 256; c++) {
    unsigned cp = c <= 0x20                  ? 256 + c
                  : (c >= 0x7f && c <= 0xa0) ? 256 + 33 + (c - 0x7f)
                  : c == 0xad                ? 256 + 67
                                             : c;
    if (cp < 0x80) {
      texts[c][0] = (char)cp;
      texts[c][1] = 0;
    } else {
      texts[c][0] = (char)(0xc0 | (cp >> 6));
      texts[c][1] = (char)(0x80 | (cp & 0x3f));
      texts[c][2] = 0;
    }
    toks[n] = texts[c];
    types[n++] = 1;
  }
  static const char *const merges[] = {"h e", "l l", "he ll", "\xC4\xA0 t"};
  static const char *const extra[] = {"he", "ll", "hell", "\xC4\xA0t"};
  for (size_t i = 0; i < 4; i++) {
    toks[n] = extra[i];
    types[n++] = 1;
  }
  wbuf b = {0};
  kv_str(&b, "tokenizer.ggml.model", "gpt2");
  kv_str(&b, "tokenizer.ggml.pre", pre);
  kv_strs(&b, "tokenizer.ggml.tokens", toks, n);
  kv_i32s(&b, "tokenizer.ggml.token_type", types, n);
  kv_strs(&b, "tokenizer.ggml.merges", merges, 4);
  wbuf h = {0};
  put(&h, "GGUF", 4);
  put_u32(&h, 3);
  put_u64(&h, 0);
  put_u64(&h, b.n_kv);
  put(&h, b.p, b.n);
  free(b.p);
  *file = h.p;
  sl_status st;
  char err[256];
  sl_gguf_t *g = sl_gguf_open_mem(h.p, h.n, &st, err, sizeof err);
  if (!g)
    abort();
  sl_tokenizer_t *t = NULL;
  if (sl_tokenizer_load(g, &t, err, sizeof err) != SL_OK)
    abort();
  sl_gguf_close(g);
  return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *m = getenv("SLUICE_FUZZ_MODEL");
  if (!m)
    m = getenv("SLUICE_MODEL");
  if (m) {
    sl_status st;
    char err[256];
    sl_gguf_t *g = sl_gguf_open(m, &st, err, sizeof err);
    if (g) {
      if (sl_tokenizer_load(g, &g_real, err, sizeof err) != SL_OK)
        g_real = NULL;
      sl_gguf_close(g);
    }
  }
  for (size_t i = 0; i < N_PRES; i++)
    g_tok[i] = synthetic(k_pres[i], &g_files[i]);
  return 0;
}

static void run(const sl_tokenizer_t *t, const char *s, size_t n,
                bool special) {
  int32_t *ids = NULL;
  size_t nid = 0;
  sl_status st = sl_tokenizer_encode(t, s, n, special, special, &ids, &nid);
  if (st != SL_OK)
    abort();
  size_t vs = sl_tokenizer_vocab_size(t);
  for (size_t i = 0; i < nid; i++)
    if (ids[i] < 0 || (size_t)ids[i] >= vs)
      abort();
  char *out = NULL;
  size_t ol = 0;
  if (sl_tokenizer_decode(t, ids, nid, false, special, &out, &ol) != SL_OK)
    abort();
  sl_free(out);
  sl_free(ids);
}

/* sl_tokenizer_encode_marked: a mask of all plain bytes reads as
 * parse_special = false, and any mask gives in-vocabulary ids. */
static void run_marked(const sl_tokenizer_t *t, const char *s, size_t n,
                       uint8_t seed) {
  static uint8_t plain[4096];
  int32_t *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  memset(plain, 1, n);
  if (sl_tokenizer_encode_marked(t, s, n, false, plain, &a, &na) != SL_OK ||
      sl_tokenizer_encode(t, s, n, false, false, &b, &nb) != SL_OK)
    abort();
  if (na != nb || (na && memcmp(a, b, na * sizeof *a) != 0))
    abort();
  sl_free(a);
  sl_free(b);
  for (size_t i = 0; i < n; i++) /* runs of 7 bytes, plain or not */
    plain[i] = (uint8_t)((i / 7 + seed) & 1);
  if (sl_tokenizer_encode_marked(t, s, n, true, plain, &a, &na) != SL_OK)
    abort();
  size_t vs = sl_tokenizer_vocab_size(t);
  for (size_t i = 0; i < na; i++)
    if (a[i] < 0 || (size_t)a[i] >= vs)
      abort();
  sl_free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0 || size > 4096)
    return 0;
  const sl_tokenizer_t *t =
      g_real && (data[0] & 0x80) ? g_real : g_tok[data[0] % N_PRES];
  const char *s = (const char *)data + 1;
  run(t, s, size - 1, false);
  run(t, s, size - 1, true);
  run_marked(t, s, size - 1, data[0]);
  return 0;
}
