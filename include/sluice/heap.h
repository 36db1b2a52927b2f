/* sluice — a binary min-heap of fixed-size elements (util).
 *
 * The element type is the caller's: `elem` bytes each, ordered by `less`
 * (the smallest comes out first). Not thread-safe; one owner. */
#ifndef SLUICE_HEAP_H
#define SLUICE_HEAP_H

#include <stdbool.h>
#include <stddef.h>

#include "sluice/status.h"

typedef bool (*sl_heap_less)(const void *a, const void *b);

typedef struct sl_heap {
  unsigned char *data;
  size_t n, cap, elem;
  sl_heap_less less;
} sl_heap;

/* An empty heap of `elem`-byte elements; allocates nothing yet. */
void sl_heap_init(sl_heap *h, size_t elem, sl_heap_less less);

/* Copies *e in. SL_ERR_NOMEM (heap unchanged) when it cannot grow. */
sl_status sl_heap_push(sl_heap *h, const void *e);

/* Copies the smallest element to *out and removes it; false when empty. */
bool sl_heap_pop(sl_heap *h, void *out);

/* Frees the storage; the heap is empty (and reusable) afterwards. */
void sl_heap_free(sl_heap *h);

#endif
