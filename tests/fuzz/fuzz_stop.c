/* libFuzzer harness: the engine's incremental stop-string matcher (stop.c)
 * against the definition, on arbitrary bytes. Input: one byte n (stop
 * strings, 1..SL_MAX_STOP), then n strings each ended by a 0 byte, then the
 * text; each text byte's low bits also cut the text into pieces. After
 * every piece, the matcher's answer must be the definition's, computed over
 * the whole text so far: the earliest start of any stop string (a match
 * found only once it is complete), else the longest suffix that is a
 * proper prefix of one. With the top bit of the first byte set, every
 * other byte (but the 0s) is mapped into "abc": repeats and overlaps,
 * where the automata fall back, become common. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"

/* The earliest start of a stop string in t[0..n), or SIZE_MAX. */
static size_t first_match(const char *const *st, int ns, const char *t,
                          size_t n) {
  for (size_t at = 0; at < n; at++)
    for (int i = 0; i < ns; i++) {
      size_t l = strlen(st[i]);
      if (at + l <= n && memcmp(t + at, st[i], l) == 0)
        return at;
    }
  return SIZE_MAX;
}

/* The longest suffix of t[0..n) that is a proper prefix of a stop string. */
static size_t longest_open(const char *const *st, int ns, const char *t,
                           size_t n) {
  size_t best = 0;
  for (int i = 0; i < ns; i++)
    for (size_t l = strlen(st[i]) - 1; l > best; l--)
      if (l <= n && memcmp(t + n - l, st[i], l) == 0) {
        best = l;
        break;
      }
  return best;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static uint8_t buf[1 << 14];
  if (size < 2 || size > sizeof buf)
    return 0;
  memcpy(buf, data, size);
  if (data[0] & 0x80)
    for (size_t i = 1; i < size; i++)
      buf[i] = buf[i] ? (uint8_t)('a' + buf[i] % 3) : 0;
  data = buf;
  int ns = 1 + data[0] % SL_MAX_STOP;
  const char *st[SL_MAX_STOP];
  size_t at = 1;
  for (int i = 0; i < ns; i++) {
    const uint8_t *z = memchr(data + at, 0, size - at);
    if (!z || z == data + at || (size_t)(z - (data + at)) > SL_MAX_STOP_BYTES)
      return 0;
    st[i] = (const char *)data + at;
    at = (size_t)(z - data) + 1;
  }
  const char *text = (const char *)data + at;
  size_t n = size - at;
  sl__stops m;
  if (sl__stops_init(&m, st, ns) != SL_OK)
    abort();
  size_t pos = 0;
  while (pos < n) {
    size_t len = 1 + (unsigned char)text[pos] % 7;
    if (len > n - pos)
      len = n - pos;
    size_t tail;
    bool hit = sl__stops_feed(&m, text + pos, len, &tail);
    pos += len;
    size_t want = first_match(st, ns, text, pos);
    if (hit != (want != SIZE_MAX) || (hit && pos - tail != want))
      abort();
    if (hit)
      break;
    if (sl__stops_hold(&m) != longest_open(st, ns, text, pos))
      abort();
  }
  return 0;
}
