#include <string.h>

#include "sluice/heap.h"
#include "sluice/util.h"

#define AT(h, i) ((h)->data + (i) * (h)->elem)

void sl_heap_init(sl_heap *h, size_t elem, sl_heap_less less) {
  h->data = NULL;
  h->n = h->cap = 0;
  h->elem = elem;
  h->less = less;
}

sl_status sl_heap_push(sl_heap *h, const void *e) {
  if (h->n == h->cap) {
    size_t nc = h->cap ? h->cap * 2 : 64, bytes;
    if (!sl_mul_ok(nc, h->elem, &bytes))
      return SL_ERR_NOMEM;
    unsigned char *nd = sl_realloc(h->data, bytes);
    if (!nd)
      return SL_ERR_NOMEM;
    h->data = nd;
    h->cap = nc;
  }
  size_t i = h->n++;
  while (i > 0) { /* sift up: move parents down until e fits */
    size_t p = (i - 1) / 2;
    if (!h->less(e, AT(h, p)))
      break;
    memcpy(AT(h, i), AT(h, p), h->elem);
    i = p;
  }
  memcpy(AT(h, i), e, h->elem);
  return SL_OK;
}

bool sl_heap_pop(sl_heap *h, void *out) {
  if (h->n == 0)
    return false;
  memcpy(out, AT(h, 0), h->elem);
  size_t n = --h->n, i = 0;
  if (n == 0)
    return true;
  const unsigned char *last = AT(h, n);
  for (;;) { /* sift the last element down from the root */
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const unsigned char *mb = last;
    if (l < n && h->less(AT(h, l), mb)) {
      m = l;
      mb = AT(h, l);
    }
    if (r < n && h->less(AT(h, r), mb))
      m = r;
    if (m == i)
      break;
    memcpy(AT(h, i), AT(h, m), h->elem);
    i = m;
  }
  memmove(AT(h, i), last, h->elem);
  return true;
}

void sl_heap_free(sl_heap *h) {
  sl_free(h->data);
  h->data = NULL;
  h->n = h->cap = 0;
}
