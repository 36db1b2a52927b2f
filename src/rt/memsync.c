/* memsync: the owning-stream cache clear (I2, I3, I5), the in-flight probe,
 * footprint and unreleased-bytes accounting (I7). */
#include <stdio.h>

#include "rt/rt_impl.h"

void sl_buffer_access_lock(sl_device_t *dev) {
  pthread_mutex_lock(&dev->access_mu);
}
void sl_buffer_access_unlock(sl_device_t *dev) {
  pthread_mutex_unlock(&dev->access_mu);
}

uint64_t sl_lock_hist_bound_ns(int b) {
  static const uint64_t us[SL_LOCK_HIST_BUCKETS] = {
      100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 0};
  return b < 0 || b >= SL_LOCK_HIST_BUCKETS - 1 ? UINT64_MAX : us[b] * 1000u;
}

/* A clear took the lock at `locked` after asking at `asked`, and gives it
 * back now. Called holding the lock: the updates are serialized. */
static void note_clear_hold(sl_device_t *dev, uint64_t asked, uint64_t locked) {
  uint64_t wait = locked - asked, hold = sl_now_ns() - locked;
  atomic_fetch_add(&dev->lk_clears, 1);
  atomic_fetch_add(&dev->lk_wait_total, wait);
  atomic_fetch_add(&dev->lk_hold_total, hold);
  if (wait > atomic_load(&dev->lk_wait_max))
    atomic_store(&dev->lk_wait_max, wait);
  if (hold > atomic_load(&dev->lk_hold_max))
    atomic_store(&dev->lk_hold_max, hold);
  int b = 0;
  while (wait > sl_lock_hist_bound_ns(b))
    b++;
  atomic_fetch_add(&dev->lk_wait_hist[b], 1);
}

sl_access_lock_stats sl_buffer_access_stats(sl_device_t *dev) {
  sl_access_lock_stats s = {.clears = atomic_load(&dev->lk_clears),
                            .wait_ns_total = atomic_load(&dev->lk_wait_total),
                            .wait_ns_max = atomic_load(&dev->lk_wait_max),
                            .hold_ns_total = atomic_load(&dev->lk_hold_total),
                            .hold_ns_max = atomic_load(&dev->lk_hold_max)};
  for (int b = 0; b < SL_LOCK_HIST_BUCKETS; b++)
    s.wait_hist[b] = atomic_load(&dev->lk_wait_hist[b]);
  return s;
}

/* ---- the evidence of work in flight (I2)
 * --------------------------------------
 *
 * A clear measures, per stream, the work still pending as it frees: tasks
 * (submitted - completed) and the bytes of buffers with a use pending on that
 * stream. The numbers are attributed to the stream whose work it is, never
 * to the clearing caller: ev[0] ("own") when the clear drained that stream
 * (so any count is a broken drain), ev[1] ("others") when it did not. For each
 * stream found with pending work a completion watch is set (no task is
 * submitted to anyone's stream); the stream stamps how long after the clear
 * that work ended when it publishes completion (stream.c). */

#define MAX_WATCHED 64

typedef struct clear_scan {
  sl__inflight f[MAX_WATCHED];
  uint64_t tasks[MAX_WATCHED];
  size_t n, n_own;
} clear_scan;

/* Adds s with its pending tasks, once; each stream is queried once. */
static void scan_add(clear_scan *c, sl_stream_t *s, bool only_pending) {
  for (size_t i = 0; i < c->n; i++)
    if (c->f[i].stream == s)
      return;
  uint64_t tasks = sl_stream_query(s).tasks;
  if (c->n < MAX_WATCHED && (tasks || !only_pending)) {
    c->tasks[c->n] = tasks;
    c->f[c->n++] = (sl__inflight){s, 0};
  }
}

/* Sets s's completion watch at its current submitted seq (if none is set). */
static void watch_set(sl_stream_t *s, int side, uint64_t t0) {
  uint64_t zero = 0;
  if (!atomic_compare_exchange_strong(&s->watch_seq, &zero, UINT64_MAX))
    return; /* an earlier clear is still measuring this stream */
  atomic_store(&s->watch_t0, t0);
  atomic_store(&s->watch_side, side);
  atomic_store(&s->watch_seq, atomic_load(&s->submitted));
  sl__stream_watch_check(s); /* it may have completed meanwhile */
}

static void record(sl_stream_t *s, int side, uint64_t bytes, uint64_t tasks,
                   uint64_t t0) {
  atomic_fetch_add(&s->ev[side].clears, 1);
  atomic_store(&s->ev[side].bytes_last, bytes);
  atomic_store(&s->ev[side].tasks_last, tasks);
  atomic_store(&s->ev[side].ns_last, 0);
  if (tasks)
    watch_set(s, side, t0);
}

/* ---- clears ---------------------------------------------------------------
 */

/* Frees under the caller's buffer-access lock. own[0..n_own) are the streams
 * the clear drained (all_own: every registered stream); `owner` is the
 * caller's stream (NULL: none). The registry lock is held throughout, so no
 * stream scanned can be destroyed meanwhile (lock order: access -> streams ->
 * allocator). */
static void clear_locked(sl_device_t *dev, const char *who, sl_stream_t *owner,
                         sl_stream_t *const *own, size_t n_own, bool all_own) {
  uint64_t t = sl_now_ns();
  clear_scan c;
  c.n = 0;
  pthread_mutex_lock(&dev->streams_mu);
  for (size_t i = 0; i < n_own; i++)
    scan_add(&c, own[i], false);
  if (all_own)
    for (sl_stream_t *s = dev->streams; s; s = s->reg_next)
      scan_add(&c, s, false);
  c.n_own = c.n;
  for (sl_stream_t *s = dev->streams; s; s = s->reg_next)
    scan_add(&c, s, true); /* others' streams: only those with work */
  char site[96];
  snprintf(site, sizeof site, "the clearing side: %s(%s)", who,
           owner ? owner->name : dev->name);
  sl__alloc_clear(dev, c.f, c.n, c.n_own, site);
  bool own_pending = false;
  for (size_t i = 0; i < c.n_own; i++)
    own_pending |= c.tasks[i] != 0;
  if (!own_pending) /* the device's inflight_ms_last is this clear's: 0 */
    atomic_store(&dev->inflight_ns_last, 0);
  for (size_t i = 0; i < c.n; i++) {
    sl_stream_t *s = c.f[i].stream;
    if (!c.tasks[i] && !c.f[i].bytes)
      continue;
    /* side 0: a clear that drained this stream found its work (a broken
     * drain); side 1: a clear that did not drain it (not this stream's) */
    record(s, i < c.n_own ? 0 : 1, c.f[i].bytes, c.tasks[i], t);
  }
  pthread_mutex_unlock(&dev->streams_mu);
  sl__alloc_flush_frees(dev);
}

/* Drains s for a clear; its error stays on the stream for its owner. */
static sl_status drain_for_clear(sl_stream_t *s) {
  return sl__stream_drain_keep_error(s);
}

sl_status sl_sync_and_clear_cache(sl_stream_t *stream) {
  if (!stream)
    return SL_ERR_INVALID_ARG;
  sl_device_t *dev = stream->dev;
  /* The drains come before the buffer-access lock: only the release needs
   * it, and a clear that held it while its own stream drained would make
   * every other stream's clear (another engine's) and the store worker
   * wait for this stream's work. Nothing new reaches the caller's stream
   * meanwhile (its owner is here); the default stream, which any thread
   * may use, is drained again under the lock. */
  sl_status st = drain_for_clear(stream);
  sl_status st2 = drain_for_clear(dev->default_stream);
  uint64_t asked = sl_now_ns();
  sl_buffer_access_lock(dev);
  uint64_t locked = sl_now_ns();
  if (st2 == SL_OK)
    st2 = drain_for_clear(dev->default_stream);
  sl_stream_t *own[2] = {stream, dev->default_stream};
  clear_locked(dev, "sl_sync_and_clear_cache", stream, own, 2, false);
  note_clear_hold(dev, asked, locked);
  sl_buffer_access_unlock(dev);
  /* the caller's own error first; a default-stream error is reported too
   * (and stays there for its owner) */
  return st != SL_OK ? st : st2;
}

sl_status sl_drain_all_and_clear_cache(sl_device_t *dev) {
  if (!dev)
    return SL_ERR_INVALID_ARG;
  uint64_t asked = sl_now_ns();
  sl_buffer_access_lock(dev);
  uint64_t locked = sl_now_ns();
  sl_status st = SL_OK;
  /* Drain under the registry lock: a stream made meanwhile is new and owns
   * no work older than this call. */
  pthread_mutex_lock(&dev->streams_mu);
  for (sl_stream_t *s = dev->streams; s; s = s->reg_next) {
    sl_status e = drain_for_clear(s);
    if (st == SL_OK)
      st = e;
  }
  pthread_mutex_unlock(&dev->streams_mu);
  clear_locked(dev, "sl_drain_all_and_clear_cache", NULL, NULL, 0, true);
  note_clear_hold(dev, asked, locked);
  sl_buffer_access_unlock(dev);
  return st;
}

/* ---- accounting (I7)
 * --------------------------------------------------------- */

uint64_t sl_footprint_bytes(sl_device_t *dev) {
  return dev->ops->footprint(dev);
}

void sl_unreleased_init(sl_unreleased_est *e, uint64_t window_ns) {
  e->window_ns = window_ns ? window_ns : 10ull * 1000000000ull;
  e->s = NULL;
  e->head = e->count = e->cap = 0;
}

void sl_unreleased_fini(sl_unreleased_est *e) {
  sl_free(e->s);
  e->s = NULL;
  e->head = e->count = e->cap = 0;
}

/* The samples form a monotonic deque: residuals strictly increase from the
 * front (the window's minimum) to the back, so a sample that can never again
 * be the minimum is dropped at once, and the window's minimum is exact. */
#define AT(e, i) ((e)->s[((e)->head + (i)) % (e)->cap])

static bool deque_grow(sl_unreleased_est *e) {
  size_t cap = e->cap ? e->cap * 2 : 64;
  sl_unreleased_sample *n = sl_malloc(cap * sizeof *n);
  if (!n)
    return false;
  for (size_t i = 0; i < e->count; i++)
    n[i] = AT(e, i);
  sl_free(e->s);
  e->s = n;
  e->cap = cap;
  e->head = 0;
  return true;
}

uint64_t sl_unreleased_update(sl_unreleased_est *e, uint64_t t_ns,
                              uint64_t footprint, uint64_t allocator_bytes) {
  int64_t residual = (int64_t)footprint - (int64_t)allocator_bytes;
  /* expire from the front */
  while (e->count > 0 && t_ns - AT(e, 0).t_ns > e->window_ns) {
    e->head = (e->head + 1) % e->cap;
    e->count--;
  }
  /* newer and no larger beats older: pop from the back */
  while (e->count > 0 && AT(e, e->count - 1).residual >= residual)
    e->count--;
  if (e->count == e->cap && !deque_grow(e)) {
    if (e->cap == 0)
      return 0; /* nothing to compare with */
    /* out of memory: drop the entry after the minimum */
    for (size_t i = 1; i + 1 < e->count; i++)
      AT(e, i) = AT(e, i + 1);
    e->count--;
  }
  AT(e, e->count).t_ns = t_ns;
  AT(e, e->count).residual = residual;
  e->count++;
  int64_t min = AT(e, 0).residual;
  return residual > min ? (uint64_t)(residual - min) : 0;
}

uint64_t sl_mem_guard_bytes(uint64_t active, uint64_t footprint,
                            uint64_t hot_tier_bytes) {
  uint64_t fp = footprint > hot_tier_bytes ? footprint - hot_tier_bytes : 0;
  return active > fp ? active : fp;
}

/* ---- the seed's wrong clear (experiment.h) ---------------------------------
 */

#include "rt/experiment.h"

sl_status sl__rt_experiment_bare_clear(sl_device_t *dev) {
  sl_buffer_access_lock(dev);
  sl_status st = drain_for_clear(dev->default_stream);
  sl_stream_t *own[1] = {dev->default_stream};
  clear_locked(dev, "bare clear (experiment)", dev->default_stream, own, 1,
               false);
  sl_buffer_access_unlock(dev);
  return st;
}
