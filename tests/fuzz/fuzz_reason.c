/* libFuzzer harness: a model's thinking split out of its text (the text
 * follows the user's lead: outside input). The first byte picks the family
 * and whether the prompt opened the block, the second where the text is
 * cut in two; the rest is the text. Fed whole and fed in two pieces, the
 * reasoning and the content are the same; neither is longer than the text,
 * together they never hold more bytes than it; nothing leaks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_impl.h"
#include "sluice/util.h"

static void split(sl_srv_rsplit *p, sl_srv_rfmt f, bool opened, const char *s,
                  size_t n, size_t cut) {
  sl__srv_rsplit_init(p, f, opened);
  sl__srv_rsplit_feed(p, s, cut);
  sl__srv_rsplit_feed(p, s + cut, n - cut);
  sl__srv_rsplit_finish(p);
}

static bool same(const sl_sbuf *a, const sl_sbuf *b) {
  return a->len == b->len && (!a->len || !memcmp(a->p, b->p, a->len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2 || size > 1 << 16)
    return 0;
  sl_srv_rfmt f = data[0] & 1 ? SL_RFMT_DEEPSEEK : SL_RFMT_NONE;
  bool opened = data[0] & 2;
  const char *s = (const char *)data + 2;
  size_t n = size - 2, cut = n ? data[1] % (n + 1) : 0;
  size_t live = sl_malloc_live_bytes();
  sl_srv_rsplit whole, two;
  split(&whole, f, opened, s, n, 0);
  split(&two, f, opened, s, n, cut);
  if (sl__srv_rsplit_oom(&whole) || sl__srv_rsplit_oom(&two))
    abort(); /* no allocation fails here */
  if (!same(&whole.reasoning, &two.reasoning) ||
      !same(&whole.content, &two.content))
    abort();
  if (whole.reasoning.len + whole.content.len > n || whole.hold.len)
    abort();
  if (f == SL_RFMT_NONE &&
      (whole.content.len != n || (n && memcmp(whole.content.p, s, n))))
    abort(); /* none: the text as it is */
  sl__srv_rsplit_free(&whole);
  sl__srv_rsplit_free(&two);
  if (sl_malloc_live_bytes() != live)
    abort();
  return 0;
}
