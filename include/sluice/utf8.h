/* sluice — utf8: the one UTF-8 encoder and the decoders and scanners that
 * the chat-template engine (jinja) and the tokenizer share, and Unicode
 * simple case mapping (utf8proc).
 *
 * Two decoders, for two contracts:
 *   - sl_utf8_decode is strict in the way llama.cpp's unicode.cpp is: a lead
 *     byte and its continuation bytes or nothing (overlong forms and
 *     surrogates are accepted, as there);
 *   - sl_utf8_next is lenient, as the template engine wants: it never fails,
 *     takes the length the lead byte announces when that many bytes remain
 *     and reads bytes it cannot use one at a time.
 *
 * Threading: pure functions; any thread. */
#ifndef SLUICE_UTF8_H
#define SLUICE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Writes the UTF-8 form of `cp` to out (room for 4 bytes) and returns its
 * length, 1 to 4. A value past U+10FFFF is written as U+FFFD; surrogates are
 * encoded like any other value (as llama.cpp does). */
size_t sl_utf8_encode(uint32_t cp, char *out);

/* The sequence length a lead byte announces, as llama.cpp's utf8_len: 1 for
 * ASCII and for continuation bytes, 2, 3 or 4 by the high nibble. */
size_t sl_utf8_seq_len(unsigned char lead);

/* True for a continuation byte (10xxxxxx). */
static inline bool sl_utf8_is_cont(unsigned char c) {
  return (c & 0xC0) == 0x80;
}

/* Strict: decodes the code point at s[*off] (off < len) into *cp and
 * advances *off; false, with *off unchanged, when the bytes there are not a
 * lead byte followed by its continuation bytes. */
bool sl_utf8_decode(const char *s, size_t len, size_t *off, uint32_t *cp);

/* Lenient: the code point at p[i] (i < n), its byte length in *len. The
 * length is the lead byte's (>= 0xF0: 4, >= 0xE0: 3, >= 0xC0: 2, else 1), or
 * 1 when fewer bytes remain; a 1-byte result is the byte's value. */
uint32_t sl_utf8_next(const char *p, size_t n, size_t i, size_t *len);

/* Code points in p[0, n): the bytes that are not continuation bytes, plus
 * a leading continuation byte. */
size_t sl_utf8_count(const char *p, size_t n);

/* Unicode simple case mapping (utf8proc): the one-code-point upper and lower
 * case of `cp`, or `cp` itself. utf8proc maps U+00DF (sharp s) up to U+1E9E;
 * Python's "SS" is the caller's to write. */
uint32_t sl_utf8_upper(uint32_t cp);
uint32_t sl_utf8_lower(uint32_t cp);
/* Python's str predicates per code point: cased (Lu, Ll, Lt), upper and
 * lower (utf8proc_isupper / utf8proc_islower). */
bool sl_utf8_is_cased(uint32_t cp);
bool sl_utf8_is_upper(uint32_t cp);
bool sl_utf8_is_lower(uint32_t cp);

#endif
