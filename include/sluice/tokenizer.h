/* sluice — tokenizer, read from GGUF metadata (tokenizer.ggml.*).
 *
 * Supports byte-level BPE (tokenizer.ggml.model == "gpt2") with the
 * pre-tokenizers "smollm", "llama-bpe" (Llama 3), "qwen2", "default",
 * "gpt-2", "starcoder", "deepseek-llm" (and the names llama.cpp aliases to
 * them), and SentencePiece-style models (tokenizer.ggml.model == "llama")
 * with scores and <0xXX> byte fallback. The aim is token-for-token agreement
 * with llama.cpp's tokenizer: the same pre-tokenizer splits, merge order,
 * special-token partitioning, BOS/EOS rules, end-of-generation set and
 * detokenization.
 *
 * Threading: after sl_tokenizer_load() returns, a tokenizer is immutable;
 * every function taking a const sl_tokenizer_t * may be called from any
 * number of threads at once. sl_tokenizer_free() must not race with them.
 */
#ifndef SLUICE_TOKENIZER_H
#define SLUICE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/gguf.h"
#include "sluice/status.h"

typedef struct sl_tokenizer sl_tokenizer_t;

/* Token id meaning "none" (a model without an EOT token, say). */
#define SL_TOKEN_NULL (-1)

/* Token types, as stored in tokenizer.ggml.token_type. */
typedef enum sl_token_type {
  SL_TOKEN_TYPE_UNDEFINED = 0,
  SL_TOKEN_TYPE_NORMAL = 1,
  SL_TOKEN_TYPE_UNKNOWN = 2,
  SL_TOKEN_TYPE_CONTROL = 3,
  SL_TOKEN_TYPE_USER_DEFINED = 4,
  SL_TOKEN_TYPE_UNUSED = 5,
  SL_TOKEN_TYPE_BYTE = 6,
} sl_token_type;

/* Vocabulary kinds. */
typedef enum sl_vocab_kind {
  SL_VOCAB_BPE = 1, /* byte-level BPE ("gpt2") */
  SL_VOCAB_SPM = 2, /* SentencePiece ("llama") */
} sl_vocab_kind;

/* Builds a tokenizer from the tokenizer.ggml.* metadata of `g`. Borrows `g`
 * only for the duration of the call: everything needed is copied, so the
 * result outlives sl_gguf_close(g).
 * Returns SL_OK and stores the tokenizer in *out (the caller frees it with
 * sl_tokenizer_free), or: SL_ERR_NOT_FOUND (no tokenizer metadata),
 * SL_ERR_UNSUPPORTED (an unknown tokenizer model or pre-tokenizer),
 * SL_ERR_FORMAT (malformed arrays, e.g. wrong element types or lengths),
 * SL_ERR_NOMEM. On failure *out is NULL and, if `err` is not NULL, a message
 * of at most errcap bytes (NUL-terminated) is written there. */
sl_status sl_tokenizer_load(const sl_gguf_t *g, sl_tokenizer_t **out, char *err,
                            size_t errcap);

/* Frees a tokenizer; NULL is a no-op. */
void sl_tokenizer_free(sl_tokenizer_t *t);

/* Tokenizes `len` bytes of `text` (not necessarily NUL-terminated; any bytes,
 * invalid UTF-8 included: invalid bytes are read as U+FFFD, as llama.cpp
 * does). `add_bos` is llama.cpp's add_special: when true, BOS is prepended
 * if the model asks for it (sl_tokenizer_add_bos()) and EOS appended if it
 * asks for that. `parse_special`: when true, control tokens written in the
 * text (e.g. "<|im_start|>") become their ids; when false they are
 * tokenized as plain text (user-defined tokens are always matched).
 * On SL_OK stores a new array in *ids (free with sl_free; NULL when *n is 0)
 * and its length in *n. Errors: SL_ERR_INVALID_ARG, SL_ERR_NOMEM. */
sl_status sl_tokenizer_encode(const sl_tokenizer_t *t, const char *text,
                              size_t len, bool add_bos, bool parse_special,
                              int32_t **ids, size_t *n);

/* sl_tokenizer_encode with special tokens parsed in part of the text only:
 * `plain` is NULL (parse everywhere) or `len` bytes, and a control token is
 * recognized only where plain[] is 0 over all of its bytes. Where it is 1
 * the text reads as with parse_special = false (user-defined tokens are
 * still matched). The text is split into fragments at the recognized
 * tokens, as sl_tokenizer_encode splits it, so text with no special tokens
 * in it tokenizes the same whatever `plain` says. A chat prompt uses this
 * to parse special tokens in the template's text but not in the request's
 * (sl_chat_template_render_marked). Errors as for sl_tokenizer_encode. */
sl_status sl_tokenizer_encode_marked(const sl_tokenizer_t *t, const char *text,
                                     size_t len, bool add_bos,
                                     const uint8_t *plain, int32_t **ids,
                                     size_t *n);

/* sl_tokenizer_encode_marked that stops as soon as the text is known to
 * make more than `max_tokens` tokens: SL_ERR_RANGE then (nothing stored),
 * having read only a bounded part of the text. A text of more than
 * max_tokens x sl_tokenizer_max_token_bytes() bytes is refused before any
 * tokenizing; after that, before each word (BPE) or fragment, the tokens
 * so far plus the fewest the rest can make decide. Under the limit the ids
 * are sl_tokenizer_encode_marked's. */
sl_status sl_tokenizer_encode_limited(const sl_tokenizer_t *t, const char *text,
                                      size_t len, bool add_bos,
                                      const uint8_t *plain, size_t max_tokens,
                                      int32_t **ids, size_t *n);

/* The most input bytes one token of this vocabulary can stand for: no text
 * of B bytes tokenizes into fewer than ceil(B / this) tokens. 0 when there
 * is no such bound (a special token strips the blanks around it). */
size_t sl_tokenizer_max_token_bytes(const sl_tokenizer_t *t);

/* Whether b's tokens are a's, id for id: the same count and the same bytes
 * for each (special tokens included), as a draft model's must be its
 * target's. The reason (worded for a draft model, b) in err when not. */
bool sl_tokenizer_same_vocab(const sl_tokenizer_t *a, const sl_tokenizer_t *b,
                             char *err, size_t errcap);

/* Writes the bytes of token `id` into buf (no NUL added). With `special`
 * false, control and unknown tokens render as nothing. Stores the piece's
 * length in *len. Returns SL_OK, SL_ERR_RANGE when `id` is not in the
 * vocabulary, or SL_ERR_OVERFLOW when cap < *len (nothing written; *len
 * says how much room is needed). */
sl_status sl_tokenizer_token_to_piece(const sl_tokenizer_t *t, int32_t id,
                                      bool special, char *buf, size_t cap,
                                      size_t *len);

/* Borrowed view of token `id`'s bytes as rendered with special = true
 * (control tokens show their text). Valid until sl_tokenizer_free. Returns
 * NULL (and *len = 0) for an id outside the vocabulary. */
const char *sl_tokenizer_piece(const sl_tokenizer_t *t, int32_t id,
                               size_t *len);

/* Detokenizes `n` ids into a new NUL-terminated buffer stored in *out (free
 * with sl_free) with its length (without the NUL) in *out_len. As llama.cpp's
 * llama_detokenize: `remove_special` drops a leading BOS / trailing EOS that
 * the model adds itself; `unparse_special` renders control tokens as their
 * text. Errors: SL_ERR_RANGE (an id outside the vocabulary),
 * SL_ERR_INVALID_ARG, SL_ERR_NOMEM. */
sl_status sl_tokenizer_decode(const sl_tokenizer_t *t, const int32_t *ids,
                              size_t n, bool remove_special,
                              bool unparse_special, char **out,
                              size_t *out_len);

/* Accessors. Ids are SL_TOKEN_NULL when the model has no such token. */
size_t sl_tokenizer_vocab_size(const sl_tokenizer_t *t);
sl_vocab_kind sl_tokenizer_kind(const sl_tokenizer_t *t);
int32_t sl_tokenizer_bos(const sl_tokenizer_t *t);
int32_t sl_tokenizer_eos(const sl_tokenizer_t *t);
int32_t sl_tokenizer_eot(const sl_tokenizer_t *t);
int32_t sl_tokenizer_unk(const sl_tokenizer_t *t);
int32_t sl_tokenizer_pad(const sl_tokenizer_t *t);
/* Whether encode(add_bos = true) prepends BOS / appends EOS. */
bool sl_tokenizer_add_bos(const sl_tokenizer_t *t);
bool sl_tokenizer_add_eos(const sl_tokenizer_t *t);
/* The pre-tokenizer name from the file ("" when absent). Borrowed. */
const char *sl_tokenizer_pre_name(const sl_tokenizer_t *t);

/* True when `id` ends generation (EOS, EOT, EOM, <|im_end|>, <|eot_id|>,
 * <|endoftext|>, ... exactly as llama.cpp builds its EOG set). False for an
 * id outside the vocabulary. */
bool sl_tokenizer_is_eog(const sl_tokenizer_t *t, int32_t id);

/* The token's type after llama.cpp's fix-ups (a token it promotes to control,
 * like <|im_end|> stored as normal, reads as CONTROL). SL_TOKEN_TYPE_UNDEFINED
 * for an id outside the vocabulary. */
sl_token_type sl_tokenizer_token_type(const sl_tokenizer_t *t, int32_t id);

/* The token's text as stored in the vocabulary (byte-encoded for BPE), or
 * NULL for an id outside it. Borrowed; *len gets its length. */
const char *sl_tokenizer_token_text(const sl_tokenizer_t *t, int32_t id,
                                    size_t *len);

/* Id of the token whose stored text is exactly `text`, or SL_TOKEN_NULL. */
int32_t sl_tokenizer_find(const sl_tokenizer_t *t, const char *text,
                          size_t len);

#endif
