/* libFuzzer harness: a model's thinking split out of its text (the text
 * follows the user's lead: outside input). The first byte picks the family
 * and whether the prompt opened the block, the second where the text is
 * cut in two and the seed of arbitrary piece boundaries; the rest is the
 * text. Fed whole, fed in two pieces and fed in pieces of 1 to 16 bytes,
 * the reasoning and the content are the same; the content is a suffix of
 * the text and the reasoning a piece of what comes before it, and what is
 * left of the text without them is the tags and blanks only (the
 * concatenation is the input minus its tags); nothing leaks. */
#define _GNU_SOURCE
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

/* Fed in pieces of 1 to 16 bytes, their lengths drawn from seed. */
static void pieces(sl_srv_rsplit *p, sl_srv_rfmt f, bool opened, const char *s,
                   size_t n, unsigned seed) {
  sl__srv_rsplit_init(p, f, opened);
  for (size_t i = 0; i < n;) {
    seed = seed * 1103515245u + 12345u;
    size_t k = 1 + (seed >> 16) % 16;
    if (k > n - i)
      k = n - i;
    sl__srv_rsplit_feed(p, s + i, k);
    i += k;
  }
  sl__srv_rsplit_finish(p);
}

static bool blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Whether s[0..m) without [r0, r1) holds only blanks, opening tags
 * before r0 and closing tags after r1 (r0 = m, r1 = 0: tags anywhere). */
static bool only_tags(const char *s, size_t m, size_t r0, size_t r1) {
  for (size_t i = 0; i < m;) {
    if (i == r0 && r1 > r0 && r0 < m) {
      i = r1;
    } else if (blank(s[i])) {
      i++;
    } else if (m - i >= 7 && !memcmp(s + i, "<think>", 7) && i + 7 <= r0) {
      i += 7;
    } else if (m - i >= 8 && !memcmp(s + i, "</think>", 8) && i >= r1) {
      i += 8;
    } else {
      return false;
    }
  }
  return true;
}

/* Whether s[0..n), its content (a suffix) and its reasoning (some piece
 * of what precedes the content) taken out, holds only the tags and
 * blanks. */
static bool rest_is_tags(const char *s, size_t n, const sl_sbuf *r,
                         const sl_sbuf *c) {
  if (c->len > n || (c->len && memcmp(s + n - c->len, c->p, c->len)))
    return false;
  size_t m = n - c->len;
  if (!r->len) /* an empty block: the tags, in any order, and blanks */
    return only_tags(s, m, m, 0);
  for (size_t from = 0; from + r->len <= m;) {
    const char *at = memmem(s + from, m - from, r->p, r->len);
    if (!at)
      return false;
    size_t r0 = (size_t)(at - s);
    if (only_tags(s, m, r0, r0 + r->len))
      return true;
    from = r0 + 1;
  }
  return false;
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
  sl_srv_rsplit whole, two, many;
  split(&whole, f, opened, s, n, 0);
  split(&two, f, opened, s, n, cut);
  pieces(&many, f, opened, s, n, data[1]);
  if (sl__srv_rsplit_oom(&whole) || sl__srv_rsplit_oom(&two) ||
      sl__srv_rsplit_oom(&many))
    abort(); /* no allocation fails here */
  if (!same(&whole.reasoning, &two.reasoning) ||
      !same(&whole.content, &two.content) ||
      !same(&whole.reasoning, &many.reasoning) ||
      !same(&whole.content, &many.content))
    abort();
  if (!rest_is_tags(s, n, &whole.reasoning, &whole.content))
    abort();
  if (whole.reasoning.len + whole.content.len > n || whole.hold.len)
    abort();
  if (f == SL_RFMT_NONE &&
      (whole.content.len != n || (n && memcmp(whole.content.p, s, n))))
    abort(); /* none: the text as it is */
  sl__srv_rsplit_free(&whole);
  sl__srv_rsplit_free(&two);
  sl__srv_rsplit_free(&many);
  if (sl_malloc_live_bytes() != live)
    abort();
  return 0;
}
