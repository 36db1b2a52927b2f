/* Tokenizer loading: reads tokenizer.ggml.* from GGUF and applies
 * llama.cpp's defaults and fix-ups (per pre-tokenizer flags, special ids,
 * EOT/EOG detection by token text, the special-token list, the rendered
 * piece of every token). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice/util.h"
#include "tokenizer_impl.h"

#define ERR(...)                                                               \
  do {                                                                         \
    if (err && errcap)                                                         \
      snprintf(err, errcap, __VA_ARGS__);                                      \
  } while (0)

/* ---- load ---------------------------------------------------------------- */

typedef struct pre_entry {
  const char *name;
  sl__pre_kind kind;
  int8_t clean_spaces; /* -1 keep the BPE default (true) */
  bool ignore_merges, add_bos, no_bos;
} pre_entry;

/* llama.cpp's pre-tokenizer names, restricted to the patterns sluice has. */
static const pre_entry k_pres[] = {
    {"default", SL__PRE_DEFAULT, -1, false, false, false},
    {"llama3", SL__PRE_LLAMA3, -1, true, true, false},
    {"llama-v3", SL__PRE_LLAMA3, -1, true, true, false},
    {"llama-bpe", SL__PRE_LLAMA3, -1, true, true, false},
    {"falcon3", SL__PRE_LLAMA3, -1, true, true, false},
    {"falcon-h1", SL__PRE_LLAMA3, -1, true, true, false},
    {"pixtral", SL__PRE_LLAMA3, -1, true, true, false},
    {"midm-2.0", SL__PRE_LLAMA3, -1, true, true, false},
    {"lfm2", SL__PRE_LLAMA3, -1, true, true, false},
    {"dbrx", SL__PRE_LLAMA3, -1, false, false, false},
    {"smaug-bpe", SL__PRE_LLAMA3, -1, false, false, false},
    {"chatglm-bpe", SL__PRE_LLAMA3, -1, false, false, true},
    {"glm4", SL__PRE_LLAMA3, -1, true, false, true},
    {"deepseek-llm", SL__PRE_DEEPSEEK_LLM, 0, false, false, false},
    {"starcoder", SL__PRE_STARCODER, -1, false, false, false},
    {"refact", SL__PRE_STARCODER, -1, false, false, false},
    {"command-r", SL__PRE_STARCODER, 0, false, false, false},
    {"smollm", SL__PRE_STARCODER, 0, false, false, false},
    {"codeshell", SL__PRE_STARCODER, -1, false, false, false},
    {"exaone", SL__PRE_STARCODER, -1, false, false, false},
    {"minerva-7b", SL__PRE_STARCODER, -1, false, false, false},
    {"mellum2", SL__PRE_STARCODER, -1, false, false, false},
    {"gpt-2", SL__PRE_GPT2, -1, false, false, false},
    {"phi-2", SL__PRE_GPT2, -1, false, false, false},
    {"jina-es", SL__PRE_GPT2, -1, false, false, false},
    {"jina-de", SL__PRE_GPT2, -1, false, false, false},
    {"gigachat", SL__PRE_GPT2, -1, false, false, false},
    {"jina-v2-es", SL__PRE_GPT2, -1, false, false, false},
    {"jina-v2-de", SL__PRE_GPT2, -1, false, false, false},
    {"a.x-4.0", SL__PRE_GPT2, -1, false, false, false},
    {"mellum", SL__PRE_GPT2, -1, false, false, false},
    {"modern-bert", SL__PRE_GPT2, -1, false, false, false},
    {"mpt", SL__PRE_GPT2, -1, false, false, false},
    {"olmo", SL__PRE_GPT2, -1, false, false, false},
    {"jais", SL__PRE_GPT2, -1, false, false, false},
    {"exaone4", SL__PRE_GPT2, -1, false, false, false},
    {"trillion", SL__PRE_GPT2, 0, false, false, false},
    {"granite-docling", SL__PRE_GPT2, 0, false, false, false},
    {"qwen2", SL__PRE_QWEN2, 0, false, false, false},
    {"deepseek-r1-qwen", SL__PRE_QWEN2, 0, false, false, false},
    {"kormo", SL__PRE_QWEN2, 0, false, false, false},
    {"f2llmv2", SL__PRE_QWEN2, 0, false, false, false},
    {"stablelm2", SL__PRE_QWEN2, -1, false, false, false},
    {"megrez", SL__PRE_QWEN2, -1, false, false, false},
    {"hunyuan", SL__PRE_QWEN2, 0, false, false, false},
    {"solar-open", SL__PRE_QWEN2, 0, false, false, false},
    {"grok-2", SL__PRE_QWEN2, 0, false, false, false},
};

static const char *const k_eot_names[] = {"<|eot_id|>",
                                          "<|im_end|>",
                                          "<|end|>",
                                          "<end_of_turn>",
                                          "<|endoftext|>",
                                          "<|end_of_text|>",
                                          "<EOT>",
                                          "_<EOT>",
                                          "[EOT]",
                                          "<\xEF\xBD\x9C"
                                          "end\xE2\x96\x81"
                                          "of\xE2\x96\x81"
                                          "sentence\xEF\xBD\x9C>",
                                          "<end_of_utterance>",
                                          NULL};
static const char *const k_eom_names[] = {"<|eom_id|>", NULL};
static const char *const k_fim_pre_names[] = {"<|fim_prefix|>",
                                              "<fim-prefix>",
                                              "<fim_prefix>",
                                              "<\xEF\xBD\x9C"
                                              "fim\xE2\x96\x81"
                                              "begin\xEF\xBD\x9C>",
                                              "<PRE>",
                                              "\xE2\x96\x81<PRE>",
                                              "<|code_prefix|>",
                                              "<|prefix|>",
                                              NULL};
static const char *const k_fim_suf_names[] = {"<|fim_suffix|>",
                                              "<fim-suffix>",
                                              "<fim_suffix>",
                                              "<\xEF\xBD\x9C"
                                              "fim\xE2\x96\x81"
                                              "hole\xEF\xBD\x9C>",
                                              "<SUF>",
                                              "\xE2\x96\x81<SUF>",
                                              "<|code_suffix|>",
                                              "<|suffix|>",
                                              NULL};
static const char *const k_fim_mid_names[] = {"<|fim_middle|>",
                                              "<fim-middle>",
                                              "<fim_middle>",
                                              "<\xEF\xBD\x9C"
                                              "fim\xE2\x96\x81"
                                              "end\xEF\xBD\x9C>",
                                              "<MID>",
                                              "\xE2\x96\x81<MID>",
                                              "<|code_middle|>",
                                              "<|middle|>",
                                              NULL};
static const char *const k_fim_pad_names[] = {
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const k_fim_rep_names[] = {"<|fim_repo|>", "<|repo_name|>",
                                              "<fim-repo>",   "<REPO>",
                                              "<reponame>",   NULL};
static const char *const k_fim_sep_names[] = {"<|file_sep|>", NULL};
static const char *const k_eog_names[] = {"<|eot_id|>",
                                          "<|im_end|>",
                                          "<|end|>",
                                          "<|return|>",
                                          "<|call|>",
                                          "<|flush|>",
                                          "<|calls|>",
                                          "<end_of_turn>",
                                          "<|endoftext|>",
                                          "</s>",
                                          "<|eom_id|>",
                                          "<EOT>",
                                          "_<EOT>",
                                          "[EOT]",
                                          "[EOS]",
                                          "<|end_of_text|>",
                                          "<end_of_utterance>",
                                          "<eos>",
                                          "<turn|>",
                                          "<|tool_response>",
                                          "<\xEF\xBD\x9C"
                                          "end\xE2\x96\x81"
                                          "of\xE2\x96\x81"
                                          "sentence\xEF\xBD\x9C>",
                                          "[e~[",
                                          NULL};

static bool tok_is(const sl_tokenizer_t *t, int32_t id, const char *s) {
  size_t n = strlen(s);
  return t->text_len[id] == n && memcmp(sl__tok_text(t, id), s, n) == 0;
}

static bool in_list(const sl_tokenizer_t *t, int32_t id,
                    const char *const *names) {
  for (size_t i = 0; names[i]; i++)
    if (tok_is(t, id, names[i]))
      return true;
  return false;
}

/* A token llama.cpp finds by its text is made a control token. */
static void detect_by_name(sl_tokenizer_t *t, int32_t *slot,
                           const char *const *names) {
  if (*slot != SL_TOKEN_NULL)
    return;
  for (size_t id = 0; id < t->n_vocab; id++) {
    if (in_list(t, (int32_t)id, names)) {
      *slot = (int32_t)id;
      t->attr[id] |= SL__TA_CONTROL;
      return;
    }
  }
}

int sl__cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

static bool eog_has(const sl_tokenizer_t *t, int32_t id) {
  for (size_t i = 0; i < t->n_eog; i++)
    if (t->eog[i] == id)
      return true;
  return false;
}

static void eog_add(sl_tokenizer_t *t, int32_t id) {
  if (id == SL_TOKEN_NULL || eog_has(t, id))
    return;
  t->eog[t->n_eog++] = id;
}

static void eog_remove(sl_tokenizer_t *t, int32_t id) {
  for (size_t i = 0; i < t->n_eog; i++)
    if (t->eog[i] == id) {
      t->eog[i] = t->eog[--t->n_eog];
      return;
    }
}

/* Renders token id as llama.cpp's token_to_piece (lstrip 0) into out, which
 * has room for at least render_bound(t, id) bytes; returns the length. */
static size_t render(const sl_tokenizer_t *t, int32_t id, bool special,
                     char *out) {
  uint32_t a = t->attr[id];
  const char *txt = sl__tok_text(t, id);
  size_t n = t->text_len[id];
  if (!special && (a & (SL__TA_UNKNOWN | SL__TA_CONTROL)))
    return 0;
  if (a & (SL__TA_UNKNOWN | SL__TA_CONTROL | SL__TA_USER_DEFINED)) {
    memcpy(out, txt, n);
    return n;
  }
  if (a & SL__TA_NORMAL) {
    size_t o = 0;
    if (t->kind == SL_VOCAB_SPM) {
      for (size_t i = 0; i < n;) {
        if (i + 3 <= n && memcmp(txt + i, "\xE2\x96\x81", 3) == 0) {
          out[o++] = ' ';
          i += 3;
        } else {
          out[o++] = txt[i++];
        }
      }
      return o;
    }
    uint32_t *cpts;
    size_t nc;
    if (sl__utf8_decode(txt, n, &cpts, &nc) != SL_OK)
      return 0;
    for (size_t i = 0; i < nc; i++) {
      int b = sl__unicode_to_byte(cpts[i]);
      if (b >= 0) {
        out[o++] = (char)b;
      } else {
        char u[4];
        size_t ul = sl_utf8_encode(cpts[i], u);
        o += (size_t)sprintf(out + o, "[UNK_BYTE_0x");
        for (size_t j = 0; j < ul; j++)
          o += (size_t)sprintf(out + o, "%02x", (unsigned char)u[j]);
        memcpy(out + o, txt, n);
        o += n;
        out[o++] = ']';
      }
    }
    sl_free(cpts);
    return o;
  }
  if (a & SL__TA_BYTE) {
    char hex[3] = {n > 3 ? txt[3] : 0, n > 4 ? txt[4] : 0, 0};
    out[0] = (char)strtol(hex, NULL, 16);
    return 1;
  }
  return 0;
}

/* Upper bound on render()'s output for id. */
static size_t render_bound(const sl_tokenizer_t *t, int32_t id) {
  size_t n = t->text_len[id];
  /* worst case per code point: "[UNK_BYTE_0x" + 8 hex + text + "]" */
  return n * (12 + 8 + n + 1) + 8;
}

static sl_status build_pieces(sl_tokenizer_t *t) {
  char *scratch = NULL, *arena = NULL;
  size_t scap = 0, alen = 0, acap = 0;
  sl_status st = SL_OK;
  t->piece_off = sl_calloc(t->n_vocab, sizeof *t->piece_off);
  t->piece_len = sl_calloc(t->n_vocab, sizeof *t->piece_len);
  if (!t->piece_off || !t->piece_len)
    return SL_ERR_NOMEM;
  for (size_t i = 0; i < t->n_vocab; i++) {
    size_t need = render_bound(t, (int32_t)i);
    if (need > scap) {
      char *ns = sl_realloc(scratch, need);
      if (!ns) {
        st = SL_ERR_NOMEM;
        break;
      }
      scratch = ns;
      scap = need;
    }
    size_t n = render(t, (int32_t)i, true, scratch);
    if (alen + n + 1 > acap) {
      size_t nc = acap ? acap : 65536;
      while (nc < alen + n + 1)
        nc *= 2;
      char *na = sl_realloc(arena, nc);
      if (!na) {
        st = SL_ERR_NOMEM;
        break;
      }
      arena = na;
      acap = nc;
    }
    memcpy(arena + alen, scratch, n);
    t->piece_off[i] = alen;
    t->piece_len[i] = (uint32_t)n;
    alen += n;
  }
  sl_free(scratch);
  if (st != SL_OK) {
    sl_free(arena);
    return st;
  }
  t->piece_arena = arena;
  return SL_OK;
}

typedef struct special_key {
  uint32_t len;
  int32_t id;
} special_key;

static int cmp_special(const void *a, const void *b) {
  const special_key *x = a, *y = b;
  if (x->len != y->len)
    return x->len > y->len ? -1 : 1;
  return (x->id > y->id) - (x->id < y->id);
}

/* Orders special ids by text length, longest first, ties by id. A vocabulary
 * padded with unused control tokens has tens of thousands of them (an
 * insertion sort took minutes on 79k, under ASan). */
static sl_status sort_specials(sl_tokenizer_t *t) {
  if (t->n_special < 2)
    return SL_OK;
  special_key *k = sl_malloc(t->n_special * sizeof *k);
  if (!k)
    return SL_ERR_NOMEM;
  for (size_t i = 0; i < t->n_special; i++)
    k[i] = (special_key){t->text_len[t->special[i]], t->special[i]};
  qsort(k, t->n_special, sizeof *k, cmp_special);
  for (size_t i = 0; i < t->n_special; i++)
    t->special[i] = k[i].id;
  sl_free(k);
  return SL_OK;
}

static bool get_id(const sl_gguf_t *g, const char *key, size_t n_vocab,
                   int32_t *slot) {
  uint64_t v;
  if (!sl_gguf_get_u64(g, key, &v))
    return false;
  if (v < n_vocab)
    *slot = (int32_t)v;
  return true;
}

static sl_status load_vocab(sl_tokenizer_t *t, const sl_gguf_t *g, char *err,
                            size_t errcap) {
  const sl_gguf_value *tv = sl_gguf_get(g, "tokenizer.ggml.tokens");
  if (!tv || tv->type != SL_GGUF_ARRAY || tv->arr_type != SL_GGUF_STRING) {
    ERR("tokenizer.ggml.tokens missing or not a string array");
    return tv ? SL_ERR_FORMAT : SL_ERR_NOT_FOUND;
  }
  if (tv->arr_len == 0 || tv->arr_len > INT32_MAX) {
    ERR("tokenizer.ggml.tokens: bad length %llu",
        (unsigned long long)tv->arr_len);
    return SL_ERR_FORMAT;
  }
  size_t n = (size_t)tv->arr_len;
  t->n_vocab = n;
  const sl_gguf_value *sv = sl_gguf_get(g, "tokenizer.ggml.scores");
  if (sv &&
      (sv->type != SL_GGUF_ARRAY ||
       (sv->arr_type != SL_GGUF_FLOAT32 && sv->arr_type != SL_GGUF_INT32) ||
       sv->arr_len < n)) {
    ERR("tokenizer.ggml.scores: wrong type or length");
    return SL_ERR_FORMAT;
  }
  const sl_gguf_value *yv = sl_gguf_get(g, "tokenizer.ggml.token_type");
  if (yv && (yv->type != SL_GGUF_ARRAY || yv->arr_type != SL_GGUF_INT32 ||
             yv->arr_len < n)) {
    ERR("tokenizer.ggml.token_type: wrong type or length");
    return SL_ERR_FORMAT;
  }
  t->text_off = sl_calloc(n, sizeof *t->text_off);
  t->text_len = sl_calloc(n, sizeof *t->text_len);
  t->score = sl_calloc(n, sizeof *t->score);
  t->attr = sl_calloc(n, sizeof *t->attr);
  if (!t->text_off || !t->text_len || !t->score || !t->attr)
    return SL_ERR_NOMEM;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    sl_str s = sl_gguf_arr_str(tv, i);
    size_t len = strnlen(s.ptr, s.len);
    total += (len ? len : 32) + 1;
  }
  t->text_arena = sl_malloc(total);
  if (!t->text_arena)
    return SL_ERR_NOMEM;
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    sl_str s = sl_gguf_arr_str(tv, i);
    /* llama.cpp reads vocabulary strings as C strings: a NUL ends them */
    size_t len = strnlen(s.ptr, s.len);
    if (len == 0) {
      len = (size_t)snprintf(t->text_arena + o, 32, "[EMPTY_%zu]", i);
    } else {
      memcpy(t->text_arena + o, s.ptr, len);
    }
    if (len > UINT32_MAX)
      return SL_ERR_FORMAT;
    t->text_arena[o + len] = 0;
    t->text_off[i] = o;
    t->text_len[i] = (uint32_t)len;
    o += len + 1;
    sl_status st = sl__strmap_put(&t->tok_map, t->text_arena + t->text_off[i],
                                  len, (int64_t)i, true);
    if (st != SL_OK)
      return st;
    if (sv) {
      const unsigned char *p = (const unsigned char *)sv->arr_data + 4 * i;
      if (sv->arr_type == SL_GGUF_FLOAT32) {
        memcpy(&t->score[i], p, 4);
      } else {
        int32_t v;
        memcpy(&v, p, 4);
        t->score[i] = (float)v;
      }
    }
    uint32_t a = SL__TA_NORMAL;
    if (yv) {
      int32_t ty;
      memcpy(&ty, (const unsigned char *)yv->arr_data + 4 * i, 4);
      switch (ty) {
      case SL_TOKEN_TYPE_UNKNOWN:
        a = SL__TA_UNKNOWN;
        break;
      case SL_TOKEN_TYPE_UNUSED:
        a = SL__TA_UNUSED;
        break;
      case SL_TOKEN_TYPE_NORMAL:
        a = SL__TA_NORMAL;
        break;
      case SL_TOKEN_TYPE_CONTROL:
        a = SL__TA_CONTROL;
        break;
      case SL_TOKEN_TYPE_USER_DEFINED:
        a = SL__TA_USER_DEFINED;
        break;
      case SL_TOKEN_TYPE_BYTE:
        a = SL__TA_BYTE;
        break;
      default:
        a = 0;
        break;
      }
    }
    t->attr[i] = a;
  }
  return SL_OK;
}

static sl_status load_merges(sl_tokenizer_t *t, const sl_gguf_t *g, char *err,
                             size_t errcap) {
  const sl_gguf_value *mv = sl_gguf_get(g, "tokenizer.ggml.merges");
  if (!mv) {
    ERR("tokenizer.ggml.merges missing");
    return SL_ERR_FORMAT;
  }
  if (mv->type != SL_GGUF_ARRAY || mv->arr_type != SL_GGUF_STRING ||
      mv->arr_len > INT32_MAX) {
    ERR("tokenizer.ggml.merges: not a string array");
    return SL_ERR_FORMAT;
  }
  char *key = NULL;
  size_t cap = 0;
  sl_status st = SL_OK;
  for (uint64_t i = 0; i < mv->arr_len && st == SL_OK; i++) {
    sl_str m = sl_gguf_arr_str(mv, i);
    m.len = strnlen(m.ptr, m.len); /* a C string for llama.cpp too */
    /* split at the first space after position 0 (as llama.cpp); none: the
     * pair ("", "") */
    size_t sp = 0;
    for (size_t k = 1; k < m.len; k++)
      if (m.ptr[k] == ' ') {
        sp = k;
        break;
      }
    size_t la = sp ? sp : 0, lb = sp ? m.len - sp - 1 : 0;
    if (4 + m.len > cap) {
      size_t nc = 4 + m.len + 64;
      char *nk = sl_realloc(key, nc);
      if (!nk) {
        st = SL_ERR_NOMEM;
        break;
      }
      key = nk;
      cap = nc;
    }
    uint32_t l32 = (uint32_t)la;
    memcpy(key, &l32, 4);
    if (la)
      memcpy(key + 4, m.ptr, la);
    if (lb)
      memcpy(key + 4 + la, m.ptr + sp + 1, lb);
    st = sl__strmap_put(&t->merge_map, key, 4 + la + lb, (int64_t)i, false);
  }
  sl_free(key);
  return st;
}

static void setup_specials(sl_tokenizer_t *t, const sl_gguf_t *g) {
  size_t n = t->n_vocab;
  int32_t *defaults[] = {&t->bos, &t->eos, &t->eot, &t->eom,
                         &t->unk, &t->sep, &t->pad, &t->mask};
  for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
    if (*defaults[i] >= 0 && (size_t)*defaults[i] >= n)
      *defaults[i] = SL_TOKEN_NULL;
  static const struct {
    const char *key;
    size_t off;
  } keys[] = {
      {"tokenizer.ggml.bos_token_id", offsetof(sl_tokenizer_t, bos)},
      {"tokenizer.ggml.eos_token_id", offsetof(sl_tokenizer_t, eos)},
      {"tokenizer.ggml.eot_token_id", offsetof(sl_tokenizer_t, eot)},
      {"tokenizer.ggml.eom_token_id", offsetof(sl_tokenizer_t, eom)},
      {"tokenizer.ggml.unknown_token_id", offsetof(sl_tokenizer_t, unk)},
      {"tokenizer.ggml.seperator_token_id", offsetof(sl_tokenizer_t, sep)},
      {"tokenizer.ggml.padding_token_id", offsetof(sl_tokenizer_t, pad)},
      {"tokenizer.ggml.mask_token_id", offsetof(sl_tokenizer_t, mask)},
      {"tokenizer.ggml.fim_pre_token_id", offsetof(sl_tokenizer_t, fim_pre)},
      {"tokenizer.ggml.fim_suf_token_id", offsetof(sl_tokenizer_t, fim_suf)},
      {"tokenizer.ggml.fim_mid_token_id", offsetof(sl_tokenizer_t, fim_mid)},
      {"tokenizer.ggml.fim_pad_token_id", offsetof(sl_tokenizer_t, fim_pad)},
      {"tokenizer.ggml.fim_rep_token_id", offsetof(sl_tokenizer_t, fim_rep)},
      {"tokenizer.ggml.fim_sep_token_id", offsetof(sl_tokenizer_t, fim_sep)},
      {"tokenizer.ggml.prefix_token_id", offsetof(sl_tokenizer_t, fim_pre)},
      {"tokenizer.ggml.suffix_token_id", offsetof(sl_tokenizer_t, fim_suf)},
      {"tokenizer.ggml.middle_token_id", offsetof(sl_tokenizer_t, fim_mid)},
  };
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    get_id(g, keys[i].key, n, (int32_t *)((char *)t + keys[i].off));

  bool b;
  if (sl_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b))
    t->add_bos = b;
  if (sl_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b))
    t->add_eos = b;

  detect_by_name(t, &t->eot, k_eot_names);
  detect_by_name(t, &t->eom, k_eom_names);
  detect_by_name(t, &t->fim_pre, k_fim_pre_names);
  detect_by_name(t, &t->fim_suf, k_fim_suf_names);
  detect_by_name(t, &t->fim_mid, k_fim_mid_names);
  detect_by_name(t, &t->fim_pad, k_fim_pad_names);
  detect_by_name(t, &t->fim_rep, k_fim_rep_names);
  detect_by_name(t, &t->fim_sep, k_fim_sep_names);

  for (size_t id = 0; id < n; id++)
    if ((t->attr[id] & SL__TA_CONTROL) &&
        strstr(sl__tok_text(t, (int32_t)id), "unused"))
      t->attr[id] |= SL__TA_UNUSED;

  t->n_eog = 0;
  eog_add(t, t->fim_pad);
  eog_add(t, t->fim_rep);
  eog_add(t, t->fim_sep);
  for (size_t id = 0; id < n; id++) {
    if (in_list(t, (int32_t)id, k_eog_names)) {
      eog_add(t, (int32_t)id);
      t->attr[id] |= SL__TA_CONTROL;
    }
  }
  for (size_t id = 0; id < n; id++) {
    if (tok_is(t, (int32_t)id, "<|channel|>") ||
        tok_is(t, (int32_t)id, "<|message|>") ||
        tok_is(t, (int32_t)id, "<|start|>") ||
        tok_is(t, (int32_t)id, "<|constrain|>"))
      t->attr[id] = SL__TA_USER_DEFINED;
  }
  eog_add(t, t->eos);
  eog_add(t, t->eot);
  eog_add(t, t->eom);

  /* o200k_harmony / solar-open: <|end|> is not EOG there */
  bool has_return = false, has_call = false, has_end = false, has_flush = false,
       has_marker = false, has_s = false;
  int32_t end_id = SL_TOKEN_NULL, s_id = SL_TOKEN_NULL;
  for (size_t i = 0; i < t->n_eog; i++) {
    int32_t id = t->eog[i];
    if (tok_is(t, id, "<|return|>"))
      has_return = true;
    else if (tok_is(t, id, "<|call|>") || tok_is(t, id, "<|calls|>"))
      has_call = true;
    else if (tok_is(t, id, "<|flush|>"))
      has_flush = true;
    else if (tok_is(t, id, "<|end|>")) {
      has_end = true;
      end_id = id;
    }
  }
  if ((has_return && has_call && has_end) ||
      (has_call && has_flush && has_end)) {
    eog_remove(t, end_id);
    t->attr[end_id] = SL__TA_USER_DEFINED;
  }
  for (size_t i = 0; i < t->n_eog; i++) {
    int32_t id = t->eog[i];
    if (tok_is(t, id, "<|tool_response>") || tok_is(t, id, "<|plamo:eos|>"))
      has_marker = true;
    else if (tok_is(t, id, "</s>")) {
      has_s = true;
      s_id = id;
    }
  }
  if (has_marker && has_s) {
    eog_remove(t, s_id);
    t->attr[s_id] = SL__TA_NORMAL;
  }
  qsort(t->eog, t->n_eog, sizeof *t->eog, sl__cmp_i32);
}

/* The most input bytes one token can stand for, so that no text of B bytes
 * makes fewer than B / that many tokens: a token covers the bytes its piece
 * renders (BPE byte-decodes its pieces, and an invalid input byte is read
 * as a 3-byte U+FFFD; SPM renders its U+2581 as the 1-byte space it
 * stands for, and byte tokens as 1 byte), a special token matched in the
 * text covers its text, an unknown code point at most 4 bytes. Nothing is
 * normalized away. A special token that strips the blanks beside it
 * (lstrip, rstrip) covers any number of them: then there is no bound (0). */
static size_t max_token_bytes(const sl_tokenizer_t *t) {
  size_t m = 4;
  for (size_t id = 0; id < t->n_vocab; id++) {
    if (t->piece_len[id] > m)
      m = t->piece_len[id];
    if (t->attr[id] & (SL__TA_CONTROL | SL__TA_USER_DEFINED | SL__TA_UNKNOWN)) {
      if (t->attr[id] & (SL__TA_LSTRIP | SL__TA_RSTRIP))
        return 0;
      if (t->text_len[id] > m)
        m = t->text_len[id];
    }
  }
  return m;
}

sl_status sl_tokenizer_load(const sl_gguf_t *g, sl_tokenizer_t **out, char *err,
                            size_t errcap) {
  if (!out)
    return SL_ERR_INVALID_ARG;
  *out = NULL;
  if (!g) {
    ERR("no GGUF");
    return SL_ERR_INVALID_ARG;
  }
  if (err && errcap)
    err[0] = 0;
  sl_str model, pre = {"", 0};
  if (!sl_gguf_get_str(g, "tokenizer.ggml.model", &model)) {
    ERR("tokenizer.ggml.model missing");
    return SL_ERR_NOT_FOUND;
  }
  sl_gguf_get_str(g, "tokenizer.ggml.pre", &pre);

  sl_tokenizer_t *t = sl_calloc(1, sizeof *t);
  if (!t)
    return SL_ERR_NOMEM;
  sl__strmap_init(&t->tok_map);
  sl__strmap_init(&t->merge_map);
  t->eot = t->eom = t->sep = t->pad = t->mask = SL_TOKEN_NULL;
  t->fim_pre = t->fim_suf = t->fim_mid = SL_TOKEN_NULL;
  t->fim_pad = t->fim_rep = t->fim_sep = SL_TOKEN_NULL;
  size_t pl =
      pre.len < sizeof t->pre_name - 1 ? pre.len : sizeof t->pre_name - 1;
  memcpy(t->pre_name, pre.ptr, pl);
  t->pre_name[pl] = 0;

  sl_status st;
  if (sl_str_eq(model, "gpt2")) {
    t->kind = SL_VOCAB_BPE;
    t->bos = 11;
    t->eos = 11;
    t->unk = SL_TOKEN_NULL;
    t->add_space_prefix = false;
    t->clean_spaces = true;
    t->add_bos = false;
    const pre_entry *pe = NULL;
    if (pre.len == 0) {
      pe = &k_pres[0];
    } else {
      for (size_t i = 0; i < sizeof k_pres / sizeof k_pres[0]; i++)
        if (sl_str_eq(pre, k_pres[i].name))
          pe = &k_pres[i];
    }
    if (!pe) {
      ERR("unsupported pre-tokenizer '%.*s'", (int)pre.len, pre.ptr);
      st = SL_ERR_UNSUPPORTED;
      goto fail;
    }
    t->pre_kind = pe->kind;
    if (pe->clean_spaces >= 0)
      t->clean_spaces = pe->clean_spaces != 0;
    t->ignore_merges = pe->ignore_merges;
    t->add_bos = pe->add_bos;
    if (pe->no_bos)
      t->bos = SL_TOKEN_NULL;
  } else if (sl_str_eq(model, "llama")) {
    t->kind = SL_VOCAB_SPM;
    t->bos = 1;
    t->eos = 2;
    t->unk = 0;
    t->add_space_prefix = true;
    t->clean_spaces = false;
    t->add_bos = true;
    t->add_eos = false;
  } else {
    ERR("unsupported tokenizer model '%.*s'", (int)model.len, model.ptr);
    st = SL_ERR_UNSUPPORTED;
    goto fail;
  }
  bool b;
  if (sl_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b))
    t->add_space_prefix = b;
  if (sl_gguf_get_bool(g, "tokenizer.ggml.remove_extra_whitespaces", &b))
    t->remove_extra_ws = b;

  st = load_vocab(t, g, err, errcap);
  if (st != SL_OK)
    goto fail;
  if (t->kind == SL_VOCAB_BPE) {
    st = load_merges(t, g, err, errcap);
    if (st != SL_OK)
      goto fail;
    st = sl__pre_create(t->pre_kind, &t->pre, err, errcap);
    if (st != SL_OK)
      goto fail;
  }
  /* room for every EOG candidate: 3 fim + names + eos/eot/eom */
  t->eog = sl_calloc(t->n_vocab + 8, sizeof *t->eog);
  if (!t->eog) {
    st = SL_ERR_NOMEM;
    goto fail;
  }
  setup_specials(t, g);

  for (size_t id = 0; id < t->n_vocab; id++)
    if (t->attr[id] & (SL__TA_CONTROL | SL__TA_USER_DEFINED | SL__TA_UNKNOWN))
      t->n_special++;
  t->special = sl_calloc(t->n_special ? t->n_special : 1, sizeof *t->special);
  if (!t->special) {
    st = SL_ERR_NOMEM;
    goto fail;
  }
  t->n_special = 0;
  for (size_t id = 0; id < t->n_vocab; id++)
    if (t->attr[id] & (SL__TA_CONTROL | SL__TA_USER_DEFINED | SL__TA_UNKNOWN))
      t->special[t->n_special++] = (int32_t)id;
  st = sort_specials(t);
  if (st != SL_OK)
    goto fail;

  st = build_pieces(t);
  if (st != SL_OK)
    goto fail;
  t->max_token_bytes = max_token_bytes(t);
  *out = t;
  return SL_OK;
fail:
  if (st == SL_ERR_NOMEM)
    ERR("out of memory loading the tokenizer");
  sl_tokenizer_free(t);
  return st;
}

void sl_tokenizer_free(sl_tokenizer_t *t) {
  if (!t)
    return;
  sl__pre_free(t->pre);
  sl__strmap_free(&t->tok_map);
  sl__strmap_free(&t->merge_map);
  sl_free(t->text_arena);
  sl_free(t->text_off);
  sl_free(t->text_len);
  sl_free(t->score);
  sl_free(t->attr);
  sl_free(t->piece_arena);
  sl_free(t->piece_off);
  sl_free(t->piece_len);
  sl_free(t->special);
  sl_free(t->eog);
  sl_free(t);
}
