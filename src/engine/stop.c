/* Stop strings matched incrementally: one KMP automaton per string. The
 * cost of feeding n bytes is O(n) per stop string, amortized over the
 * request, however long the text before them; what must be held back (a
 * suffix that could begin a stop string) is read off the states. */
#include <string.h>

#include "engine/engine_impl.h"

sl_status sl__stops_init(sl__stops *m, const char *const *stops, int n) {
  if (n < 0 || n > SL_MAX_STOP)
    return SL_ERR_INVALID_ARG;
  for (int i = 0; i < n; i++) {
    size_t len = stops[i] ? strlen(stops[i]) : 0;
    if (len == 0 || len > SL_MAX_STOP_BYTES)
      return SL_ERR_INVALID_ARG;
  }
  memset(m, 0, sizeof *m);
  m->n = n;
  for (int i = 0; i < n; i++) {
    const char *s = stops[i];
    uint16_t len = (uint16_t)strlen(s);
    uint16_t *f = m->fail[i];
    m->str[i] = s;
    m->len[i] = len;
    /* f[q] = the longest proper prefix of s[0..q] that is also its suffix */
    f[0] = 0;
    for (uint16_t q = 1, k = 0; q < len; q++) {
      while (k > 0 && s[q] != s[k])
        k = f[k - 1];
      if (s[q] == s[k])
        k++;
      f[q] = k;
    }
  }
  return SL_OK;
}

bool sl__stops_feed(sl__stops *m, const char *p, size_t n, size_t *tail) {
  bool hit = false;
  size_t best = 0; /* the earliest match start, as bytes back from p + n */
  for (int i = 0; i < m->n; i++) {
    const char *s = m->str[i];
    const uint16_t *f = m->fail[i];
    uint16_t len = m->len[i], q = m->state[i];
    for (size_t j = 0; j < n; j++) {
      while (q > 0 && p[j] != s[q])
        q = f[q - 1];
      if (p[j] == s[q])
        q++;
      if (q == len) {
        /* this string's first match; it starts len - 1 bytes before j */
        size_t back = n - j + len - 1u;
        if (!hit || back > best)
          best = back;
        hit = true;
        q = f[len - 1];
        break;
      }
    }
    m->state[i] = q;
  }
  if (hit)
    *tail = best;
  return hit;
}

size_t sl__stops_hold(const sl__stops *m) {
  size_t hold = 0;
  for (int i = 0; i < m->n; i++)
    if (m->state[i] > hold)
      hold = m->state[i];
  return hold;
}
