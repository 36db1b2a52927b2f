/* sluice — grammar: what the compiler (compile.c) and the matcher
 * (grammar.c) share: a rule's elements and the compiled grammar. */
#ifndef SLUICE_GRAMMAR_IMPL_H
#define SLUICE_GRAMMAR_IMPL_H

#include <stdatomic.h>
#include <stdint.h>

#include "sluice/grammar.h"

enum { E_END = 0, E_ALT, E_REF, E_CHAR, E_NOT, E_UPPER, E_CALT, E_ANY };

typedef struct gel {
  uint32_t type, value;
} gel;

typedef struct sl__mask_cache sl__mask_cache;

struct sl_grammar {
  atomic_int refs;
  int n_rules, root;
  gel **rules;
  /* masks made before, by state: shared by every matcher of this grammar
   * (grammar.c; its own lock) */
  sl__mask_cache *masks;
};

/* grammar.c: a grammar's mask cache (NULL when out of memory), and its
 * end. */
sl__mask_cache *sl__mask_cache_new(void);
void sl__mask_cache_free(sl__mask_cache *c);

/* The start of the alternative after the one p is in, or NULL after the
 * last. */
static inline const gel *next_alt(const gel *p) {
  while (p->type != E_END && p->type != E_ALT)
    p++;
  return p->type == E_END ? NULL : p + 1;
}

#define MAX_STACK    1024      /* elements of one stack (nesting) */
#define MAX_ELEMENTS (1 << 20) /* of a compiled grammar, all rules */
#define MAX_STACKS   4096      /* live parses at once */
/* steps of expansion per code point: past it the grammar is too ambiguous
 * to follow (a matcher fails rather than stall its engine). Four times the
 * live parses: a repetition of MAX_STACKS alternatives restarts within it
 * (~2 per alternative); a JSON schema takes under 50 a byte. (50,000
 * before the parses were a hash set: inputs of a few hundred bytes then
 * took seconds under the fuzzer.) */
#define EXPAND_BUDGET (4 * MAX_STACKS)
/* the work of one mask: each trie node visited costs 1 + the parses it
 * copies, each expansion of its byte 1. The largest mask of a JSON schema
 * seen here took ~1.3e5 (inside a string, 48,773 tokens allowed, ~20 ms);
 * an ambiguous grammar ran for hours before this bound, and stops at it in
 * ~0.3 s (tests/test_grammar.c) */
#define MASK_WORK SL_GRAMMAR_MASK_WORK

#endif
