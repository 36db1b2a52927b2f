/* sluice — tokenizer internals shared by tokenizer*.c. Not a public API.
 *
 * Layout:
 *   tokenizer_load.c     load from GGUF: defaults, special ids, EOG set
 *   tokenizer.c          special-token partition, encode driver,
 *                        detokenize, accessors
 *   tokenizer_unicode.c  llama.cpp-compatible UTF-8 decoding, code point
 *                        categories, the GPT-2 byte <-> unicode map
 *   tokenizer_pre.c      pre-tokenizers (word splitting)
 *   tokenizer_merge.c    the merge loop BPE and SentencePiece share
 *   tokenizer_bpe.c      byte-level BPE: merges ranked by the merges list
 *   tokenizer_spm.c      SentencePiece: merges ranked by score, byte
 *                        fallback
 *   tokenizer_map.c      the string -> int hash map used by all of them
 */
#ifndef SLUICE_TOKENIZER_IMPL_H
#define SLUICE_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/status.h"
#include "sluice/tokenizer.h"
#include "sluice/utf8.h"

/* ---- token attributes (bit flags, as llama.cpp's llama_token_attr) ------ */
enum {
  SL__TA_UNKNOWN = 1 << 0,
  SL__TA_UNUSED = 1 << 1,
  SL__TA_NORMAL = 1 << 2,
  SL__TA_CONTROL = 1 << 3,
  SL__TA_USER_DEFINED = 1 << 4,
  SL__TA_BYTE = 1 << 5,
  SL__TA_LSTRIP = 1 << 7,
  SL__TA_RSTRIP = 1 << 8,
};

/* ---- a growable int32 vector ------------------------------------------- */
typedef struct sl__ivec {
  int32_t *v;
  size_t n, cap;
} sl__ivec;

/* Appends x; SL_ERR_NOMEM on failure (the vector is unchanged). */
sl_status sl__ivec_push(sl__ivec *a, int32_t x);

/* ---- string -> int64 hash map (open addressing) ------------------------ */
/* Keys are copied into the map's arena. Not thread-safe for writes; lookups
 * on a map nobody writes are safe from any thread. */
typedef struct sl__strmap {
  uint32_t *slots; /* (cap) entry index + 1, 0 = empty */
  size_t cap;      /* power of two */
  size_t count;
  uint64_t *koff; /* (count) offset of each key in arena */
  uint32_t *klen; /* (count) key length */
  int64_t *val;   /* (count) */
  size_t ecap;
  char *arena;
  size_t alen, acap;
} sl__strmap;

void sl__strmap_init(sl__strmap *m);
void sl__strmap_free(sl__strmap *m);
/* Inserts or (if `overwrite`) replaces. With !overwrite an existing key keeps
 * its value. SL_ERR_NOMEM on failure. */
sl_status sl__strmap_put(sl__strmap *m, const char *k, size_t klen, int64_t v,
                         bool overwrite);
/* Stores the value in *v and returns true when `k` is present. */
bool sl__strmap_get(const sl__strmap *m, const char *k, size_t klen,
                    int64_t *v);

/* ---- unicode (tokenizer_unicode.c) -------------------------------------- */
enum {
  SL__CPT_UNDEFINED = 0x0001,
  SL__CPT_NUMBER = 0x0002,
  SL__CPT_LETTER = 0x0004,
  SL__CPT_SEPARATOR = 0x0008,
  SL__CPT_ACCENT_MARK = 0x0010,
  SL__CPT_PUNCTUATION = 0x0020,
  SL__CPT_SYMBOL = 0x0040,
  SL__CPT_CONTROL = 0x0080,
  SL__CPT_CATEGORY_MASK = 0x00FF,
  SL__CPT_WHITESPACE = 0x0100,
};

/* Category flags of a code point (Unicode 15.1, as llama.cpp's tables);
 * cpt >= 0x110000 reads as UNDEFINED. */
uint16_t sl__cpt_flags(uint32_t cpt);

/* Decodes UTF-8 exactly as llama.cpp's unicode_cpts_from_utf8: a byte that
 * does not start a well-formed (by its lax rules) sequence becomes U+FFFD
 * and decoding resumes at the next byte. Stores a new array in *cpts (free
 * with sl_free) and its length in *n. */
sl_status sl__utf8_decode(const char *s, size_t len, uint32_t **cpts,
                          size_t *n);

/* The UTF-8 encoder and sequence lengths: sluice/utf8.h. */

/* GPT-2 byte-level map: writes the UTF-8 text of byte b's stand-in code
 * point into out and returns its length (1 or 2). */
size_t sl__byte_to_unicode(uint8_t b, char out[4]);
/* Inverse: the byte a stand-in code point maps to, or -1. */
int sl__unicode_to_byte(uint32_t cpt);

/* ---- pre-tokenizers (tokenizer_pre.c) ----------------------------------- */
typedef enum sl__pre_kind {
  SL__PRE_DEFAULT = 0,
  SL__PRE_GPT2,
  SL__PRE_LLAMA3,
  SL__PRE_QWEN2,
  SL__PRE_STARCODER, /* smollm, starcoder, refact, codeshell, ... */
  SL__PRE_DEEPSEEK_LLM,
} sl__pre_kind;

typedef struct sl__pre sl__pre;

/* Compiles what pre-tokenizer `kind` needs (PCRE2 patterns). */
sl_status sl__pre_create(sl__pre_kind kind, sl__pre **out, char *err,
                         size_t errcap);
void sl__pre_free(sl__pre *p);

/* Splits cpts[0..n) into words: on SL_OK *lens holds the word lengths in
 * code points (a new sl__ivec the caller frees with sl_free(lens->v)),
 * summing to n. Thread-safe for a shared `p`. */
sl_status sl__pre_split(const sl__pre *p, const uint32_t *cpts, size_t n,
                        sl__ivec *lens);

/* ---- the tokenizer ------------------------------------------------------ */
struct sl_tokenizer {
  sl_vocab_kind kind;
  sl__pre_kind pre_kind;
  char pre_name[64];
  sl__pre *pre;

  size_t n_vocab;
  char *text_arena;     /* all token texts, NUL-separated */
  uint64_t *text_off;   /* (n_vocab) */
  uint32_t *text_len;   /* (n_vocab) */
  float *score;         /* (n_vocab) */
  uint32_t *attr;       /* (n_vocab) SL__TA_* bits */
  sl__strmap tok_map;   /* text -> id (later duplicates win) */
  sl__strmap merge_map; /* (u32 len of left, left, right) -> rank (BPE) */

  char *piece_arena;   /* rendered pieces (special = true) */
  uint64_t *piece_off; /* (n_vocab) */
  uint32_t *piece_len; /* (n_vocab) */

  int32_t *special; /* control/user-defined/unknown ids, longest first */
  size_t n_special;

  int32_t bos, eos, eot, eom, unk, sep, pad, mask;
  int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
  int32_t *eog; /* sorted */
  size_t n_eog;

  bool add_space_prefix;
  bool add_bos, add_eos;
  bool ignore_merges;
  bool clean_spaces;
  bool remove_extra_ws;
  /* the most input bytes one token can stand for (0: no bound, when a
   * special token strips the blanks around it); tokenizer_load.c */
  size_t max_token_bytes;
};

static inline const char *sl__tok_text(const sl_tokenizer_t *t, int32_t id) {
  return t->text_arena + t->text_off[id];
}

/* ---- the merge loop (tokenizer_merge.c) --------------------------------- */
/* How a tokenizer kind merges. rank(t, ctx, p, na, nb, &joins, &rank) ranks
 * joining the adjacent pieces p[0, na) and p[na, na + nb): *joins false
 * where they do not join, else *rank, lower joining first (ties: the
 * leftmost pair); an error ends the merge. byte_id(t, c) is the id of byte c
 * of a piece that is no token, or SL_TOKEN_NULL to drop it. ctx is the
 * rule's own, passed to rank (scratch space); borrowed. */
typedef struct sl__merge_rule {
  sl_status (*rank)(const sl_tokenizer_t *t, void *ctx, const char *p,
                    size_t na, size_t nb, bool *joins, double *rank);
  int32_t (*byte_id)(const sl_tokenizer_t *t, unsigned char c);
  void *ctx;
} sl__merge_rule;

/* Splits s[0, len) into characters (sl_utf8_seq_len; a sequence cut short
 * at the end is one piece), joins adjacent pieces as rule ranks them until
 * no pair joins, and appends each piece's id, or where a piece is no token
 * rule->byte_id of each of its bytes. SL_ERR_INVALID_ARG past UINT32_MAX / 2
 * bytes, SL_ERR_NOMEM, or rank's error (ids appended before it stay).
 * Borrows everything; thread-safe for a shared t (rule->ctx is the
 * caller's). */
sl_status sl__merge_text(const sl_tokenizer_t *t, const char *s, size_t len,
                         const sl__merge_rule *rule, sl__ivec *out);

/* BPE: appends the ids of one pre-tokenized word (already byte-encoded). */
sl_status sl__bpe_word(const sl_tokenizer_t *t, const char *w, size_t wlen,
                       sl__ivec *out);

/* SPM: appends the ids of one fragment (spaces already escaped to U+2581). */
sl_status sl__spm_fragment(const sl_tokenizer_t *t, const char *s, size_t len,
                           sl__ivec *out);

/* qsort/bsearch comparator for int32_t. */
int sl__cmp_i32(const void *a, const void *b);

/* Id for stored text, or SL_TOKEN_NULL. */
int32_t sl__tok_lookup(const sl_tokenizer_t *t, const char *s, size_t len);

#endif
