/* Host allocation funnel: counts, live bytes and fault injection.
 * Each block carries a 16-byte header holding its size, so that live bytes
 * stay exact across sl_realloc and sl_free. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "sluice/util.h"

#define HDR 16

static _Atomic uint64_t g_count;
static _Atomic uint64_t g_fail_at; /* 0: off; else fail when count hits it */
static _Atomic size_t g_live;

static bool should_fail(void) {
  uint64_t n = atomic_fetch_add(&g_count, 1) + 1;
  uint64_t at = atomic_load(&g_fail_at);
  return at != 0 && n == at;
}

void sl_malloc_fail_after(uint64_t n) {
  atomic_store(&g_fail_at, n ? atomic_load(&g_count) + n : 0);
}

uint64_t sl_malloc_count(void) {
  return atomic_load(&g_count);
}
size_t sl_malloc_live_bytes(void) {
  return atomic_load(&g_live);
}

bool sl_mul_ok(size_t a, size_t b, size_t *out) {
  size_t r;
  if (__builtin_mul_overflow(a, b, &r))
    return false;
  *out = r;
  return true;
}

void *sl_malloc(size_t n) {
  if (n > SIZE_MAX - HDR || should_fail())
    return NULL;
  unsigned char *p = malloc(n + HDR);
  if (!p)
    return NULL;
  memcpy(p, &n, sizeof n);
  atomic_fetch_add(&g_live, n);
  return p + HDR;
}

void *sl_calloc(size_t count, size_t size) {
  size_t n;
  if (!sl_mul_ok(count, size, &n))
    return NULL;
  void *p = sl_malloc(n);
  if (p)
    memset(p, 0, n);
  return p;
}

void *sl_realloc(void *p, size_t n) {
  if (!p)
    return sl_malloc(n);
  if (n > SIZE_MAX - HDR || should_fail())
    return NULL;
  unsigned char *base = (unsigned char *)p - HDR;
  size_t old;
  memcpy(&old, base, sizeof old);
  unsigned char *q = realloc(base, n + HDR);
  if (!q)
    return NULL;
  memcpy(q, &n, sizeof n);
  atomic_fetch_sub(&g_live, old);
  atomic_fetch_add(&g_live, n);
  return q + HDR;
}

char *sl_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = sl_malloc(n);
  if (d)
    memcpy(d, s, n);
  return d;
}

void sl_free(void *p) {
  if (!p)
    return;
  unsigned char *base = (unsigned char *)p - HDR;
  size_t n;
  memcpy(&n, base, sizeof n);
  atomic_fetch_sub(&g_live, n);
  free(base);
}
