/* The stream-ordered caching allocator (I1, I2, I8).
 *
 * Locking: one mutex per device allocator (`a->mu`) guards every list, every
 * buffer's state and use records, and the stats. Backend memory calls are
 * made under it. The buffer-access lock (memsync.c) is taken outside it.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "rt/rt_impl.h"

#define DEFAULT_CACHE_LIMIT  (1ull << 30)
#define QUARANTINE_CAP_BYTES (64ull << 20)
#define GRAVEYARD_CAP        65536
#define MAX_BUF_BYTES        (1ull << 46)

/* ---- intrusive lists -------------------------------------------------------
 */

#define CONTAINER(ptr, type, field)                                            \
  ((type *)((char *)(ptr)-offsetof(type, field)))

static void list_init(sl__list *l) {
  l->head.prev = l->head.next = &l->head;
  l->n = 0;
}
static void list_push(sl__list *l, sl__link *e) {
  e->prev = l->head.prev;
  e->next = &l->head;
  l->head.prev->next = e;
  l->head.prev = e;
  l->n++;
}
static void list_del(sl__list *l, sl__link *e) {
  e->prev->next = e->next;
  e->next->prev = e->prev;
  e->prev = e->next = NULL;
  l->n--;
}
static sl__link *list_first(sl__list *l) {
  return l->head.next == &l->head ? NULL : l->head.next;
}
#define LIST_EACH_SAFE(l, it, nx)                                              \
  for (sl__link *it = (l)->head.next, *nx = it->next; it != &(l)->head;        \
       it = nx, nx = it->next)

/* ---- size buckets
 * ------------------------------------------------------------ */

/* Four classes per power of two above 256 bytes. Sets *bytes to the class
 * size and returns its index. */
static int bucket_of(size_t size, size_t *bytes) {
  if (size <= 256) {
    *bytes = 256;
    return 0;
  }
  int p = 63 - __builtin_clzll((unsigned long long)(size - 1)); /* 2^p < size */
  size_t base = (size_t)1 << p, step = base >> 2;
  size_t k = (size - base + step - 1) / step; /* 1..4 */
  *bytes = base + k * step;
  return (p - 8) * 4 + (int)k;
}

/* ---- init / fini -----------------------------------------------------------
 */

void sl__alloc_init(sl_device_t *dev) {
  sl__allocator *a = &dev->alloc;
  pthread_mutex_init(&a->mu, NULL);
  list_init(&a->active);
  list_init(&a->retiring);
  for (int i = 0; i < SL__NBUCKETS; i++)
    list_init(&a->cached[i]);
  list_init(&a->lru);
  list_init(&a->quarantine);
  list_init(&a->graveyard);
  a->st.cache_limit = DEFAULT_CACHE_LIMIT;
}

static void buf_free_struct(sl_buf_t *b) {
  if (b->uses != b->inline_uses)
    sl_free(b->uses);
  sl_free(b);
}

static void free_list(sl_device_t *dev, sl__list *l, bool has_memory) {
  LIST_EACH_SAFE(l, it, nx) {
    sl_buf_t *b = CONTAINER(it, sl_buf_t, link);
    list_del(l, it);
    if (has_memory)
      dev->ops->mem_free(dev, b->ptr, b->bytes);
    buf_free_struct(b);
  }
}

void sl__alloc_fini(sl_device_t *dev) {
  sl__allocator *a = &dev->alloc;
  if (a->active.n || a->retiring.n)
    SL_LOGW("%s: %zu active and %zu retiring buffer(s) at shutdown", dev->name,
            a->active.n, a->retiring.n);
  free_list(dev, &a->active, true);
  free_list(dev, &a->retiring, true);
  for (int i = 0; i < SL__NBUCKETS; i++)
    free_list(dev, &a->cached[i], true);
  free_list(dev, &a->quarantine, true);
  free_list(dev, &a->graveyard, false);
  for (size_t i = 0; i < a->n_to_free; i++)
    dev->ops->mem_free(dev, a->to_free[i].ptr, a->to_free[i].bytes);
  sl_free(a->to_free);
  a->to_free = NULL;
  a->n_to_free = a->cap_to_free = 0;
  pthread_mutex_destroy(&a->mu);
}

/* ---- use records ------------------------------------------------------------
 */

/* True when every recorded use of b has completed; drops completed records. */
static bool uses_done(sl_buf_t *b) {
  uint32_t w = 0;
  for (uint32_t i = 0; i < b->nuses; i++)
    if (!sl_stream_done(b->uses[i].stream, b->uses[i].seq))
      b->uses[w++] = b->uses[i];
  b->nuses = w;
  return w == 0;
}

static void record_use_locked(sl_buf_t *b, sl_stream_t *s, uint64_t seq) {
  for (uint32_t i = 0; i < b->nuses; i++)
    if (b->uses[i].stream == s) {
      if (b->uses[i].seq < seq)
        b->uses[i].seq = seq;
      return;
    }
  if (b->nuses == b->cap_uses) {
    uint32_t cap = b->cap_uses * 2;
    sl__buf_use *u = sl_malloc(cap * sizeof *u);
    SL_ASSERT_MSG(u, "out of host memory recording a buffer use");
    memcpy(u, b->uses, b->nuses * sizeof *u);
    if (b->uses != b->inline_uses)
      sl_free(b->uses);
    b->uses = u;
    b->cap_uses = cap;
  }
  b->uses[b->nuses].stream = s;
  b->uses[b->nuses].seq = seq;
  b->nuses++;
}

static const char *state_name(sl__buf_state s) {
  switch (s) {
  case SL__BUF_ACTIVE:
    return "active";
  case SL__BUF_RETIRING:
    return "retiring";
  case SL__BUF_CACHED:
    return "cached";
  case SL__BUF_QUARANTINE:
    return "quarantined";
  case SL__BUF_FREED:
    return "freed";
  }
  return "?";
}

static _Noreturn void buf_violation(const sl_buf_t *b, const char *what,
                                    const char *other_side) {
  fprintf(stderr,
          "sluice: RUNTIME VIOLATION: %s\n"
          "  buffer #%llu (%zu bytes, %s, owner stream %s)\n"
          "  other side: %s\n",
          what, (unsigned long long)b->id, b->size, state_name(b->state),
          b->owner ? b->owner->name : "(gone)", other_side);
  sl__assert_fail(__FILE__, __LINE__, "runtime invariant (I8)", what);
}

void sl__alloc_check_live(sl_buf_t *const *bufs, size_t n, sl_stream_t *s) {
  if (!n)
    return;
  sl__allocator *a = &s->dev->alloc;
  pthread_mutex_lock(&a->mu);
  for (size_t i = 0; i < n; i++) {
    sl_buf_t *b = bufs[i];
    SL_ASSERT_MSG(b, "NULL buffer in a task's buffer list");
    if (b->state != SL__BUF_ACTIVE) {
      char other[160];
      snprintf(other, sizeof other, "a new task submitted on stream %s",
               s->name);
      buf_violation(b, "a task names a buffer that was already released",
                    other);
    }
    SL_ASSERT_MSG(b->dev == s->dev, "buffer used on another device's stream");
  }
  pthread_mutex_unlock(&a->mu);
}

void sl__alloc_record_uses(sl_device_t *dev, sl_buf_t *const *bufs, size_t n,
                           sl_stream_t *s, uint64_t seq) {
  if (!n)
    return;
  sl__allocator *a = &dev->alloc;
  pthread_mutex_lock(&a->mu);
  for (size_t i = 0; i < n; i++)
    record_use_locked(bufs[i], s, seq);
  pthread_mutex_unlock(&a->mu);
}

void sl__alloc_check_task_bufs(const sl__task *t) {
  sl__allocator *a = &t->ctx.stream->dev->alloc;
  pthread_mutex_lock(&a->mu);
  for (size_t i = 0; i < t->nbufs; i++) {
    sl_buf_t *b = t->bufs[i];
    if (b->state != SL__BUF_ACTIVE && b->state != SL__BUF_RETIRING) {
      char other[160];
      snprintf(other, sizeof other, "task seq %llu on stream %s",
               (unsigned long long)t->ctx.seq, t->ctx.stream->name);
      buf_violation(b,
                    "a task is about to run on a buffer that is no longer live",
                    other);
    }
  }
  pthread_mutex_unlock(&a->mu);
}

sl_status sl_buf_record_use(sl_buf_t *b, sl_stream_t *s, uint64_t seq) {
  if (!b || !s || b->dev != s->dev)
    return SL_ERR_INVALID_ARG;
  sl__allocator *a = &b->dev->alloc;
  pthread_mutex_lock(&a->mu);
  if (b->state != SL__BUF_ACTIVE && b->state != SL__BUF_RETIRING) {
    char other[160];
    snprintf(other, sizeof other, "a use recorded on stream %s at seq %llu",
             s->name, (unsigned long long)seq);
    buf_violation(b, "a use was recorded on a buffer that is no longer live",
                  other);
  }
  record_use_locked(b, s, seq);
  pthread_mutex_unlock(&a->mu);
  return SL_OK;
}

/* ---- state transitions (all under a->mu) --------------------------------- */

static void stats_reserved(sl__allocator *a) {
  a->st.reserved =
      a->st.active + a->st.retiring + a->st.cache + a->quarantine_bytes;
}

/* Queues memory to be returned to the backend once `mu` is dropped. If the
 * queue cannot grow, frees at once (correct, only slower). */
static void defer_free(sl_device_t *dev, void *ptr, size_t bytes) {
  sl__allocator *a = &dev->alloc;
  if (a->n_to_free == a->cap_to_free) {
    size_t cap = a->cap_to_free ? a->cap_to_free * 2 : 64;
    void *n = sl_realloc(a->to_free, cap * sizeof *a->to_free);
    if (!n) {
      dev->ops->mem_free(dev, ptr, bytes);
      return;
    }
    a->to_free = n;
    a->cap_to_free = cap;
  }
  a->to_free[a->n_to_free].ptr = ptr;
  a->to_free[a->n_to_free].bytes = bytes;
  a->n_to_free++;
}

void sl__alloc_flush_frees(sl_device_t *dev) {
  sl__allocator *a = &dev->alloc;
  bool freed = false;
  for (;;) {
    pthread_mutex_lock(&a->mu);
    size_t n = a->n_to_free;
    if (!n) {
      pthread_mutex_unlock(&a->mu);
      if (freed && dev->ops->mem_trim)
        dev->ops->mem_trim(dev);
      return;
    }
    freed = true;
    void *ptr = a->to_free[n - 1].ptr;
    size_t bytes = a->to_free[n - 1].bytes;
    a->n_to_free--;
    pthread_mutex_unlock(&a->mu);
    dev->ops->mem_free(dev, ptr, bytes); /* outside the lock */
  }
}

/* Returns b's memory to the system (after the lock is dropped). */
static void release_memory(sl_device_t *dev, sl_buf_t *b) {
  sl__allocator *a = &dev->alloc;
  defer_free(dev, b->ptr, b->bytes);
  a->st.bytes_released += b->bytes;
  b->ptr = NULL;
  if (sl_rt_debug()) {
    /* keep the struct so that a late use reports instead of reading freed
     * memory */
    b->state = SL__BUF_FREED;
    list_push(&a->graveyard, &b->link);
    if (a->graveyard.n > GRAVEYARD_CAP) {
      sl__link *old = list_first(&a->graveyard);
      list_del(&a->graveyard, old);
      buf_free_struct(CONTAINER(old, sl_buf_t, link));
    }
  } else {
    buf_free_struct(b);
  }
}

static void uncache(sl__allocator *a, sl_buf_t *b) {
  list_del(&a->cached[b->bucket], &b->link);
  list_del(&a->lru, &b->lru);
  a->st.cache -= b->bytes;
}

/* I8, at the moment memory is given back: nothing may still use it. */
static void check_no_pending(sl_buf_t *b, const char *site) {
  for (uint32_t i = 0; i < b->nuses; i++) {
    sl__buf_use *u = &b->uses[i];
    uint64_t done = atomic_load(&u->stream->completed);
    if (done < u->seq) {
      char other[256];
      snprintf(other, sizeof other,
               "%s; pending use on stream %s at seq %llu (completed %llu)",
               site, u->stream->name, (unsigned long long)u->seq,
               (unsigned long long)done);
      buf_violation(b, "a clear would release a buffer with pending uses",
                    other);
    }
  }
}

static void trim_cache_to(sl_device_t *dev, uint64_t target) {
  sl__allocator *a = &dev->alloc;
  sl__link *it;
  while (a->st.cache > target && (it = list_first(&a->lru))) {
    sl_buf_t *b = CONTAINER(it, sl_buf_t, lru);
    uncache(a, b);
    if (sl_rt_debug())
      check_no_pending(b, "cache trim");
    release_memory(dev, b);
  }
  stats_reserved(a);
}

static void quarantine_evict(sl_device_t *dev, sl_buf_t *b) {
  sl__allocator *a = &dev->alloc;
  list_del(&a->quarantine, &b->link);
  a->quarantine_bytes -= b->bytes;
  if (!dev->ops->poison_intact(dev, b->ptr, b->bytes))
    buf_violation(b, "released memory was written after its release",
                  "an unknown writer (a task that did not declare it)");
  check_no_pending(b, "quarantine release");
  release_memory(dev, b);
}

/* RETIRING (or ACTIVE in plants) -> CACHED; in debug mode -> QUARANTINE. */
static void to_cached(sl_device_t *dev, sl_buf_t *b) {
  sl__allocator *a = &dev->alloc;
  if (sl_rt_debug()) {
    dev->ops->poison(dev, b->ptr, b->bytes);
    b->state = SL__BUF_QUARANTINE;
    list_push(&a->quarantine, &b->link);
    a->quarantine_bytes += b->bytes;
    while (a->quarantine_bytes > QUARANTINE_CAP_BYTES)
      quarantine_evict(dev,
                       CONTAINER(list_first(&a->quarantine), sl_buf_t, link));
  } else {
    b->state = SL__BUF_CACHED;
    list_push(&a->cached[b->bucket], &b->link);
    list_push(&a->lru, &b->lru);
    a->st.cache += b->bytes;
    if (a->st.cache > a->st.cache_limit) {
      a->st.trims++;
      trim_cache_to(dev, a->st.cache_limit);
    }
  }
}

static void collect_locked(sl_device_t *dev) {
  sl__allocator *a = &dev->alloc;
  LIST_EACH_SAFE(&a->retiring, it, nx) {
    sl_buf_t *b = CONTAINER(it, sl_buf_t, link);
    if (uses_done(b)) {
      list_del(&a->retiring, it);
      a->st.retiring -= b->bytes;
      to_cached(dev, b);
    }
  }
  stats_reserved(a);
}

void sl_alloc_collect(sl_device_t *dev) {
  pthread_mutex_lock(&dev->alloc.mu);
  collect_locked(dev);
  pthread_mutex_unlock(&dev->alloc.mu);
  sl__alloc_flush_frees(dev);
}

/* ---- public API -------------------------------------------------------------
 */

sl_status sl_buf_alloc(sl_stream_t *owner, size_t size, sl_buf_t **out) {
  if (!owner || !out)
    return SL_ERR_INVALID_ARG;
  if (size == 0 || size > MAX_BUF_BYTES)
    return SL_ERR_RANGE;
  sl_device_t *dev = owner->dev;
  sl__allocator *a = &dev->alloc;
  size_t bytes;
  int bucket = bucket_of(size, &bytes);
  SL_ASSERT(bucket < SL__NBUCKETS);

  pthread_mutex_lock(&a->mu);
  collect_locked(dev);
  a->st.allocs++;
  sl_buf_t *b = NULL;
  /* an injected OOM skips the cache: the cached buffer would be handed out */
  sl__link *it = a->fail_allocs ? NULL : list_first(&a->cached[bucket]);
  if (it) {
    b = CONTAINER(it, sl_buf_t, link);
    uncache(a, b);
    a->st.cache_hits++;
  } else {
    uint64_t used = a->st.active + a->st.retiring;
    if (a->st.limit && used + bytes > a->st.limit) {
      a->st.limit_failures++;
      pthread_mutex_unlock(&a->mu);
      sl__alloc_flush_frees(dev);
      return SL_ERR_MEMORY_LIMIT;
    }
    /* keep reserved memory under the limit: give back quarantined (debug
     * mode) and cached memory first; neither has pending uses */
    if (a->st.limit) {
      sl__link *q;
      while (used + a->quarantine_bytes + a->st.cache + bytes > a->st.limit &&
             (q = list_first(&a->quarantine)))
        quarantine_evict(dev, CONTAINER(q, sl_buf_t, link));
      if (used + a->st.cache + bytes > a->st.limit) {
        a->st.trims++;
        trim_cache_to(dev, a->st.limit - used - bytes);
      }
    }
    b = sl_calloc(1, sizeof *b);
    if (!b) {
      pthread_mutex_unlock(&a->mu);
      sl__alloc_flush_frees(dev);
      return SL_ERR_NOMEM;
    }
    bool injected = a->fail_allocs > 0;
    b->ptr = injected ? NULL : dev->ops->mem_alloc(dev, bytes);
    if (!b->ptr && (a->st.cache || a->n_to_free)) {
      /* give the cache back, outside the lock, and try once more */
      a->st.trims++;
      trim_cache_to(dev, 0);
      pthread_mutex_unlock(&a->mu);
      sl__alloc_flush_frees(dev);
      pthread_mutex_lock(&a->mu);
      b->ptr = injected ? NULL : dev->ops->mem_alloc(dev, bytes);
    }
    if (!b->ptr) {
      if (injected)
        a->fail_allocs--;
      sl_free(b);
      pthread_mutex_unlock(&a->mu);
      return SL_ERR_DEVICE_OOM;
    }
    b->bytes = bytes;
    b->bucket = bucket;
    b->dev = dev;
    b->uses = b->inline_uses;
    b->cap_uses = SL__BUF_INLINE_USES;
  }
  b->id = ++a->next_id;
  b->size = size;
  b->owner = owner;
  b->nuses = 0;
  b->state = SL__BUF_ACTIVE;
  list_push(&a->active, &b->link);
  a->st.active += bytes;
  if (a->st.active + a->st.retiring > a->st.peak)
    a->st.peak = a->st.active + a->st.retiring;
  stats_reserved(a);
  pthread_mutex_unlock(&a->mu);
  sl__alloc_flush_frees(dev);
  *out = b;
  return SL_OK;
}

void sl_alloc_inject_oom(sl_device_t *dev, int n) {
  pthread_mutex_lock(&dev->alloc.mu);
  dev->alloc.fail_allocs = n > 0 ? n : 0;
  pthread_mutex_unlock(&dev->alloc.mu);
}

void sl_buf_release(sl_buf_t *b) {
  if (!b)
    return;
  sl_device_t *dev = b->dev;
  sl__allocator *a = &dev->alloc;
  pthread_mutex_lock(&a->mu);
  if (b->state != SL__BUF_ACTIVE)
    buf_violation(b, "a buffer was released twice", "the second release");
  list_del(&a->active, &b->link);
  a->st.active -= b->bytes;
  b->release_ns = sl_now_ns();
  if (uses_done(b)) {
    to_cached(dev, b);
  } else {
    b->state = SL__BUF_RETIRING;
    list_push(&a->retiring, &b->link);
    a->st.retiring += b->bytes;
  }
  stats_reserved(a);
  pthread_mutex_unlock(&a->mu);
  sl__alloc_flush_frees(dev);
}

void *sl_buf_ptr(sl_buf_t *b) {
  if (sl_rt_debug()) {
    const sl__task *t = sl__task_current();
    sl__allocator *a = &b->dev->alloc;
    pthread_mutex_lock(&a->mu);
    bool live = b->state == SL__BUF_ACTIVE || b->state == SL__BUF_RETIRING;
    bool declared = true;
    if (t) {
      declared = false;
      for (size_t i = 0; i < t->nbufs; i++)
        if (t->bufs[i] == b)
          declared = true;
    }
    pthread_mutex_unlock(&a->mu);
    char other[200];
    if (t)
      snprintf(other, sizeof other, "task seq %llu on stream %s",
               (unsigned long long)t->ctx.seq, t->ctx.stream->name);
    else
      snprintf(other, sizeof other, "host code outside any task");
    if (!live)
      buf_violation(b, "memory of a released buffer was accessed", other);
    if (!declared)
      buf_violation(b,
                    "a task touched a buffer it did not declare, so the "
                    "allocator was not told of this use",
                    other);
  }
  return b->ptr;
}

size_t sl_buf_size(const sl_buf_t *b) {
  return b->size;
}
sl_stream_t *sl_buf_owner(const sl_buf_t *b) {
  return b->owner;
}
uint64_t sl_buf_use_seq(sl_buf_t *b, const sl_stream_t *s) {
  if (!b || !s)
    return 0;
  sl__allocator *a = &b->dev->alloc;
  uint64_t seq = 0;
  pthread_mutex_lock(&a->mu);
  for (uint32_t i = 0; i < b->nuses; i++)
    if (b->uses[i].stream == s)
      seq = b->uses[i].seq;
  pthread_mutex_unlock(&a->mu);
  return seq;
}

uint64_t sl_buf_id(const sl_buf_t *b) {
  return b->id;
}

sl_alloc_stats sl_alloc_get_stats(sl_device_t *dev) {
  pthread_mutex_lock(&dev->alloc.mu);
  sl_alloc_stats st = dev->alloc.st;
  pthread_mutex_unlock(&dev->alloc.mu);
  st.inflight_ms_last = sl_ns_to_ms(atomic_load(&dev->inflight_ns_last));
  st.inflight_ms_max = sl_ns_to_ms(atomic_load(&dev->inflight_ns_max));
  st.inflight_ms_total = sl_ns_to_ms(atomic_load(&dev->inflight_ns_total));
  return st;
}

void sl_alloc_set_limit(sl_device_t *dev, uint64_t bytes) {
  sl__allocator *a = &dev->alloc;
  pthread_mutex_lock(&a->mu);
  a->st.limit = bytes;
  if (!a->limit_set_cache)
    a->st.cache_limit = bytes ? bytes / 4 : DEFAULT_CACHE_LIMIT;
  trim_cache_to(dev, a->st.cache_limit);
  pthread_mutex_unlock(&a->mu);
  sl__alloc_flush_frees(dev);
}

void sl_alloc_set_cache_limit(sl_device_t *dev, uint64_t bytes) {
  sl__allocator *a = &dev->alloc;
  pthread_mutex_lock(&a->mu);
  a->st.cache_limit = bytes;
  a->limit_set_cache = true;
  trim_cache_to(dev, bytes);
  pthread_mutex_unlock(&a->mu);
  sl__alloc_flush_frees(dev);
}

/* ---- clear support (memsync.c) ------------------------------------------- */

/* Adds b's bytes to every stream of f[] that has a use of b pending. */
static void pending_by_stream(sl__list *l, sl__inflight *f, size_t n) {
  LIST_EACH_SAFE(l, it, nx) {
    sl_buf_t *b = CONTAINER(it, sl_buf_t, link);
    for (uint32_t i = 0; i < b->nuses; i++) {
      sl__buf_use *u = &b->uses[i];
      if (atomic_load_explicit(&u->stream->completed, memory_order_acquire) >=
          u->seq)
        continue;
      for (size_t k = 0; k < n; k++)
        if (f[k].stream == u->stream)
          f[k].bytes += b->bytes;
    }
  }
}

uint64_t sl__alloc_clear(sl_device_t *dev, sl__inflight *f, size_t n,
                         size_t n_own, const char *site) {
  sl__allocator *a = &dev->alloc;
  pthread_mutex_lock(&a->mu);
  collect_locked(dev);
  uint64_t before = a->st.bytes_released;
  a->st.clears++;
  for (size_t k = 0; k < n; k++)
    f[k].bytes = 0;
  pending_by_stream(&a->active, f, n);
  pending_by_stream(&a->retiring, f, n);
  uint64_t own = 0;
  for (size_t k = 0; k < n_own && k < n; k++)
    own += f[k].bytes;
  a->st.inflight_bytes_last = own;
  if (own > a->st.inflight_bytes_max)
    a->st.inflight_bytes_max = own;
  if (own)
    a->st.clears_with_inflight++;
  bool debug = sl_rt_debug();
  sl__link *it;
  while ((it = list_first(&a->lru))) {
    sl_buf_t *b = CONTAINER(it, sl_buf_t, lru);
    uncache(a, b);
    if (debug)
      check_no_pending(b, site);
    release_memory(dev, b);
  }
  while ((it = list_first(&a->quarantine)))
    quarantine_evict(dev, CONTAINER(it, sl_buf_t, link));
  stats_reserved(a);
  uint64_t freed = a->st.bytes_released - before;
  pthread_mutex_unlock(&a->mu);
  return freed;
}

static void forget_in(sl__list *l, sl_stream_t *s, sl_device_t *dev) {
  LIST_EACH_SAFE(l, it, nx) {
    sl_buf_t *b = CONTAINER(it, sl_buf_t, link);
    uint32_t w = 0;
    for (uint32_t i = 0; i < b->nuses; i++)
      if (b->uses[i].stream != s)
        b->uses[w++] = b->uses[i];
    b->nuses = w;
    if (b->owner == s)
      b->owner = dev->default_stream;
  }
}

void sl__alloc_forget_stream(sl_device_t *dev, sl_stream_t *s) {
  sl__allocator *a = &dev->alloc;
  pthread_mutex_lock(&a->mu);
  forget_in(&a->active, s, dev);
  forget_in(&a->retiring, s, dev);
  for (int i = 0; i < SL__NBUCKETS; i++)
    forget_in(&a->cached[i], s, dev);
  forget_in(&a->quarantine, s, dev);
  forget_in(&a->graveyard, s, dev);
  pthread_mutex_unlock(&a->mu);
}

void sl__alloc_plant_early_retire(sl_buf_t *b) {
  sl_device_t *dev = b->dev;
  sl__allocator *a = &dev->alloc;
  pthread_mutex_lock(&a->mu);
  SL_ASSERT(b->state == SL__BUF_ACTIVE);
  list_del(&a->active, &b->link);
  a->st.active -= b->bytes;
  /* the planted bug: straight to the cache, pending uses ignored; no poison,
   * so that only the clear's check can catch it */
  b->state = SL__BUF_CACHED;
  list_push(&a->cached[b->bucket], &b->link);
  list_push(&a->lru, &b->lru);
  a->st.cache += b->bytes;
  stats_reserved(a);
  pthread_mutex_unlock(&a->mu);
}
