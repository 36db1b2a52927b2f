/* sluice — jinja: the chat-template engine, a Jinja2 subset interpreter.
 *
 * Renders the `tokenizer.chat_template` strings found in GGUF files the way
 * Hugging Face transformers does: jinja2's ImmutableSandboxedEnvironment with
 * trim_blocks and lstrip_blocks on, keep_trailing_newline off, no autoescape,
 * the loopcontrols extension ({% break %}, {% continue %}), HF's `tojson`
 * (json.dumps, ensure_ascii off) and the globals `raise_exception(msg)` and
 * `strftime_now(fmt)`. Whatever the engine does not support is reported as an
 * error naming the construct and its line; nothing in a template or a context
 * can crash it, and render time and memory are bounded (see sl_jinja_limits).
 *
 * Values: the caller builds the context out of sl_jv values, a JSON-like tree
 * (null, bool, int, float, string, list, dict with insertion order). A
 * container owns what is put in it; sl_jv_free frees a whole tree.
 *
 * Threading: a compiled template is immutable; any number of threads may
 * render it at once, each with its own context. sl_jv trees are not
 * thread-safe while they are being built.
 */
#ifndef SLUICE_JINJA_H
#define SLUICE_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/status.h"

/* ---- context values ------------------------------------------------------ */

typedef struct sl_jv sl_jv;

typedef enum sl_jv_kind {
  SL_JV_UNDEFINED = 0, /* only seen inside the engine */
  SL_JV_NULL = 1,
  SL_JV_BOOL = 2,
  SL_JV_INT = 3,
  SL_JV_FLOAT = 4,
  SL_JV_STRING = 5,
  SL_JV_LIST = 6,
  SL_JV_DICT = 7,
} sl_jv_kind;

/* Constructors. Each returns a new value owned by the caller (free it with
 * sl_jv_free, or hand it to a container), or NULL when out of memory.
 * Strings are copied; they may hold any bytes, UTF-8 is expected. */
sl_jv *sl_jv_null(void);
sl_jv *sl_jv_bool(bool b);
sl_jv *sl_jv_int(int64_t i);
sl_jv *sl_jv_float(double f);
sl_jv *sl_jv_string(const char *s); /* NUL-terminated */
sl_jv *sl_jv_string_n(const char *s, size_t len);
sl_jv *sl_jv_list(void);
sl_jv *sl_jv_dict(void);

/* Appends `item` to `list`, taking ownership of `item` in every case (it is
 * freed on failure). A NULL `item` (a failed constructor) gives SL_ERR_NOMEM,
 * so calls can be nested: sl_jv_list_append(l, sl_jv_string("x")).
 * Returns SL_ERR_INVALID_ARG if `list` is not a list. */
sl_status sl_jv_list_append(sl_jv *list, sl_jv *item);

/* Sets dict[key] = val, replacing an existing key in place (insertion order
 * kept) or appending a new one. Takes ownership of `val` in every case; the
 * key is copied. NULL `val` gives SL_ERR_NOMEM; a non-dict SL_ERR_INVALID_ARG.
 */
sl_status sl_jv_dict_set(sl_jv *dict, const char *key, sl_jv *val);

/* Inspection of caller-built values. sl_jv_dict_get returns a borrowed view
 * or NULL; sl_jv_list_get NULL when out of range; sl_jv_len counts list
 * items, dict entries or string bytes (0 otherwise). */
sl_jv_kind sl_jv_kind_of(const sl_jv *v);
size_t sl_jv_len(const sl_jv *v);
const sl_jv *sl_jv_list_get(const sl_jv *list, size_t i);
const sl_jv *sl_jv_dict_get(const sl_jv *dict, const char *key);
/* The bytes of a string value (NUL-terminated), or NULL for a non-string. */
const char *sl_jv_str(const sl_jv *v);

/* Frees `v` and everything it holds. NULL is a no-op. */
void sl_jv_free(sl_jv *v);

/* Marks `v` and everything it holds (dict keys too) as untrusted: text that
 * came from outside input, such as a request's messages. A render keeps
 * track of which output bytes come from untrusted values, through
 * concatenation, slicing, filters and methods (a transformed string, e.g.
 * upper or tojson, is untrusted wherever its source was), and reports them
 * (sl_chat_template_render_marked). Marking is not undone. NULL is a
 * no-op. */
void sl_jv_mark_untrusted(sl_jv *v);

/* ---- templates ------------------------------------------------------------
 */

typedef struct sl_jinja_template sl_jinja_template_t;

/* Render limits; zero fields take the defaults shown. */
typedef struct sl_jinja_limits {
  size_t max_output;  /* bytes of output (default 64 MiB) */
  size_t max_memory;  /* bytes of scratch memory per render (default 512 MiB) */
  uint64_t max_steps; /* statements + loop iterations + calls (default 1e7) */
  unsigned max_depth; /* nesting of macro calls and expressions (default 200) */
} sl_jinja_limits;

/* Compiles `src` (`len` bytes; need not be NUL-terminated). Returns the
 * template, owned by the caller and freed with sl_jinja_free, or NULL on a
 * syntax error or out of memory, with a message ("line N: ...") in `err`
 * (always NUL-terminated when errcap > 0; `err` may be NULL). */
sl_jinja_template_t *sl_jinja_compile(const char *src, size_t len, char *err,
                                      size_t errcap);

/* Frees a compiled template. NULL is a no-op. */
void sl_jinja_free(sl_jinja_template_t *t);

/* Renders `t` with the variables of `ctx` (a dict, borrowed; NULL means no
 * variables). On success stores a NUL-terminated string in *out (owned by the
 * caller, free with sl_free) and its length in *out_len (may be NULL).
 * Failures: SL_ERR_FORMAT for a runtime template error (undefined attribute
 * of an undefined value, a type error, raise_exception(msg): `err` then holds
 * the message), SL_ERR_UNSUPPORTED for a construct the engine lacks,
 * SL_ERR_RANGE when a limit was hit, SL_ERR_NOMEM, SL_ERR_INVALID_ARG when
 * ctx is not a dict. *out is NULL on failure. */
sl_status sl_jinja_render(const sl_jinja_template_t *t, const sl_jv *ctx,
                          char **out, size_t *out_len, char *err,
                          size_t errcap);

/* sl_jinja_render with explicit limits (NULL = defaults). */
sl_status sl_jinja_render_ex(const sl_jinja_template_t *t, const sl_jv *ctx,
                             const sl_jinja_limits *lim, char **out,
                             size_t *out_len, char *err, size_t errcap);

/* ---- chat templates --------------------------------------------------------
 */

/* Compiles `template_src` and renders it with the variables HF sets up:
 * `messages` (borrowed list of dicts with at least role and content; other
 * keys such as tool_calls or reasoning_content are passed through),
 * `add_generation_prompt`, `bos_token`, `eos_token` (NULL means ""), plus
 * the global functions raise_exception and strftime_now. `extra` (borrowed
 * dict or NULL) adds more variables (tools, enable_thinking, ...). Output and
 * errors as for sl_jinja_render; a syntax error gives SL_ERR_FORMAT. */
sl_status sl_chat_template_render(const char *template_src,
                                  const sl_jv *messages,
                                  bool add_generation_prompt,
                                  const char *bos_token, const char *eos_token,
                                  const sl_jv *extra, char **out,
                                  size_t *out_len, char *err, size_t errcap);

/* sl_chat_template_render that also reports which output bytes came from
 * untrusted values (sl_jv_mark_untrusted): on SL_OK *untrusted is NULL when
 * none did, else an array of *out_len bytes (free with sl_free), 1 where
 * the output byte came from an untrusted value and 0 where the template (or
 * bos_token / eos_token) wrote it. The caller can then tokenize the
 * template's own text with special tokens parsed and the rest as plain text
 * (sl_tokenizer_encode_marked). *untrusted is NULL on failure. */
sl_status sl_chat_template_render_marked(
    const char *template_src, const sl_jv *messages, bool add_generation_prompt,
    const char *bos_token, const char *eos_token, const sl_jv *extra,
    char **out, size_t *out_len, uint8_t **untrusted, char *err, size_t errcap);

#endif
