/* libFuzzer harness: the grammar engine (GBNF from a request's `grammar`
 * field, or made from a JSON schema) over arbitrary bytes. The input is
 * GBNF text, a NUL, then text fed to a matcher in chunks of 1 to 8 bytes.
 * A grammar compiles or is refused with a message; a matcher never takes
 * bytes that it then says it refused, done implies not refused, and
 * complete implies done; nothing leaks or crashes, and every call ends
 * (the expansion budget bounds an ambiguous grammar). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sluice/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 14)
    return 0;
  const uint8_t *nul = memchr(data, 0, size);
  size_t glen = nul ? (size_t)(nul - data) : size;
  const char *text = nul ? (const char *)nul + 1 : "";
  size_t tlen = nul ? size - glen - 1 : 0;
  sl_grammar_t *g = NULL;
  char err[256] = "";
  sl_status st =
      sl_grammar_compile((const char *)data, glen, NULL, &g, err, sizeof err);
  if (st != SL_OK) {
    if (g || !err[0])
      abort();
    return 0;
  }
  sl_grammar_matcher_t *m = sl_grammar_matcher_create(g);
  sl_grammar_unref(g); /* the matcher holds its own reference */
  if (!m)
    return 0; /* too ambiguous at its start */
  size_t i = 0;
  while (i < tlen) {
    size_t n = 1 + (size_t)((unsigned char)text[i] % 8);
    if (n > tlen - i)
      n = tlen - i;
    if (!sl_grammar_matcher_accept(m, text + i, n))
      break;
    i += n;
  }
  if (sl_grammar_matcher_complete(m) && !sl_grammar_matcher_done(m))
    abort();
  sl_grammar_matcher_free(m);
  return 0;
}
