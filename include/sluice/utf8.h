/* sluice — utf8: the one UTF-8 codec: the encoder, the decoders and
 * scanners that every layer shares (tokenizer, jinja, grammar, engine,
 * server), and Unicode simple case mapping (utf8proc).
 *
 * Three decoders, for three contracts:
 *   - sl_utf8_decode is strict in the way llama.cpp's unicode.cpp is: a lead
 *     byte and its continuation bytes or nothing (overlong forms and
 *     surrogates are accepted, as there);
 *   - sl_utf8_feed (and sl_utf8_decode_valid, sl_utf8_valid on top of it)
 *     takes well-formed UTF-8 only, as RFC 3629 and Unicode's Table 3-7
 *     define it: no overlong form, no surrogate, nothing past U+10FFFF;
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

/* The length of the longest prefix of p[0, n) that does not end inside a
 * sequence: a lead byte at the end followed by fewer continuation bytes than
 * sl_utf8_seq_len announces is cut off with them (an output stream holds
 * them back until the rest comes); any other bytes are kept, UTF-8 or not. */
size_t sl_utf8_complete_prefix(const char *p, size_t n);

/* A well-formed sequence read a byte at a time (for input that comes in
 * pieces: a matcher fed token by token). Zeroed, it is between code points;
 * its fields are the decoder's, read only to compare two states. */
typedef struct sl_utf8_state {
  uint32_t cp;    /* the bits of the code point so far */
  uint8_t left;   /* continuation bytes still to come; 0 between code points */
  uint8_t lo, hi; /* the bounds of the next continuation byte */
} sl_utf8_state;

typedef enum sl_utf8_step {
  SL_UTF8_STEP_BAD,  /* b cannot come next; the state is unchanged */
  SL_UTF8_STEP_MORE, /* b begins or goes on with a sequence: more to come */
  SL_UTF8_STEP_DONE, /* b ends a code point, stored in *cp */
} sl_utf8_step;

/* Feeds byte b to *st. A byte is refused as soon as no well-formed sequence
 * can go on with it (E0 80 at its second byte, not its third); after DONE
 * the state is zero again. */
sl_utf8_step sl_utf8_feed(sl_utf8_state *st, unsigned char b, uint32_t *cp);

/* The code points a partial sequence (st->left > 0) can still become: all of
 * [*lo, *hi], each a scalar value. */
void sl_utf8_state_range(const sl_utf8_state *st, uint32_t *lo, uint32_t *hi);

/* Well-formed: decodes the code point at s[*off] (off < len) into *cp and
 * advances *off; false, with *off unchanged, when the bytes there are not a
 * well-formed sequence (or are cut short by len). */
bool sl_utf8_decode_valid(const char *s, size_t len, size_t *off, uint32_t *cp);

/* Whether all of s[0, len) is well-formed UTF-8. */
bool sl_utf8_valid(const char *s, size_t len);

/* The length of the longest prefix of s[0, len) that is well-formed UTF-8:
 * up to the first byte that is not, or a sequence cut short. */
size_t sl_utf8_valid_prefix(const char *s, size_t len);

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
