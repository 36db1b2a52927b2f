/* sluice — grammar: constrained decoding. A context-free grammar in GBNF
 * (llama.cpp's notation), compiled once per request; a matcher per
 * sequence that advances with each token's bytes; and the token mask: which
 * tokens of the vocabulary can come next, computed by walking a byte trie
 * of the vocabulary built once per tokenizer (a subtree is left as soon as
 * no parse survives its prefix).
 *
 * GBNF:
 *   rule   ::= name "::=" alts          (one per line or more; # comments)
 *   alts   ::= seq ("|" seq)*
 *   seq    ::= item*
 *   item   ::= prim ("*" | "+" | "?" | "{" m "}" | "{" m "," "}" |
 *                    "{" m "," n "}")?
 *   prim   ::= name | "\"" literal "\"" | "[" "^"? class "]" | "(" alts ")"
 *            | "."
 * Literals and classes take \n \r \t \\ \" \] \[ \- \xHH \uHHHH
 * \UHHHHHHHH escapes; classes take ranges a-z. Matching is on Unicode code
 * points of the UTF-8 text (a token may end inside a code point; the
 * matcher carries the partial sequence to the next token). A grammar whose
 * rules recurse on the left is refused (SL_ERR_FORMAT). */
#ifndef SLUICE_GRAMMAR_H
#define SLUICE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/status.h"
#include "sluice/tokenizer.h"

typedef struct sl_grammar sl_grammar_t;
typedef struct sl_grammar_matcher sl_grammar_matcher_t;
typedef struct sl_grammar_vocab sl_grammar_vocab_t;

/* Compiles GBNF text src[0..len) whose start rule is `root` ("root" when
 * NULL). SL_ERR_FORMAT with a message in err for a syntax error, an
 * undefined rule, left recursion or a missing root; SL_ERR_NOMEM. The
 * grammar is immutable and reference-counted: sl_grammar_unref frees it
 * when the last holder (its creator, each matcher) lets go. */
sl_status sl_grammar_compile(const char *src, size_t len, const char *root,
                             sl_grammar_t **out, char *err, size_t errcap);
void sl_grammar_unref(sl_grammar_t *g);

/* sl_grammar_compile (start rule "root"), sharing the compiled grammar with
 * earlier calls on the same text (a process-wide LRU of a few grammars):
 * their matchers then share one cache of masks. A new reference in *out;
 * errors as sl_grammar_compile. Thread-safe. */
sl_status sl_grammar_compile_shared(const char *src, size_t len,
                                    sl_grammar_t **out, char *err,
                                    size_t errcap);

/* A matcher at the start of the grammar (it holds a reference). NULL when
 * out of memory. */
sl_grammar_matcher_t *sl_grammar_matcher_create(sl_grammar_t *g);
void sl_grammar_matcher_free(sl_grammar_matcher_t *m);

/* Advances over bytes[0..n) (part of a code point may stay pending).
 * Returns false, and leaves the matcher as it was, when the grammar does
 * not allow them. */
bool sl_grammar_matcher_accept(sl_grammar_matcher_t *m, const char *bytes,
                               size_t n);

/* True when the text so far is a whole sentence of the grammar (the
 * sequence may end here). */
bool sl_grammar_matcher_done(const sl_grammar_matcher_t *m);

/* True when nothing more can follow (done, and no longer text matches). */
bool sl_grammar_matcher_complete(const sl_grammar_matcher_t *m);

/* The vocabulary as a byte trie (each token's bytes as generated, control
 * tokens left out). Built once per tokenizer; immutable, shareable. */
sl_grammar_vocab_t *sl_grammar_vocab_create(const sl_tokenizer_t *tok);
void sl_grammar_vocab_free(sl_grammar_vocab_t *v);

/* allowed[0..n_vocab): 1 for every token the grammar allows next, else 0.
 * End-of-generation tokens are allowed exactly when the matcher is done.
 * Returns the number allowed (0 when out of memory, or when the grammar is
 * too ambiguous to follow in bounded work (sl_grammar_matcher_overrun):
 * the caller should then end the sequence). The matcher keeps the last masks by
 * the state they were made in, so a state that comes back (each character of a
 * long string) costs a copy. */
size_t sl_grammar_matcher_mask(sl_grammar_matcher_t *m,
                               const sl_grammar_vocab_t *v,
                               const sl_tokenizer_t *tok, uint8_t *allowed);

/* True once a mask of this matcher ran out of its work budget: the grammar
 * keeps too many parses open at once (an ambiguous grammar such as
 * x ::= "" | . x x x), so that one token's mask would take seconds or
 * hours; a client error, not the server's. */
bool sl_grammar_matcher_overrun(const sl_grammar_matcher_t *m);

/* The work budget of one mask (a node of the vocabulary's trie costs 1 +
 * the parses it copies, an expansion 1). */
#define SL_GRAMMAR_MASK_WORK (1L << 21)
/* The work this thread did in grammar code so far, counted where it is
 * done (each parse added to a set, each expansion): for tests, which check
 * a mask's real work against its budget. */
uint64_t sl_grammar_work_done(void);

#endif
