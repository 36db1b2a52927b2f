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

/* ---- the in-flight probe ---------------------------------------------------- */

static void probe_resolve(sl__clear_probe *p, bool any) {
  uint64_t end = atomic_load(&p->end_ns);
  double ms = end > p->t_clear_ns ? sl_ns_to_ms(end - p->t_clear_ns) : 0.0;
  sl__alloc_note_inflight(p->dev, any, ms);
  sl_free(p);
}

void sl__probe_stamp(sl__clear_probe *p) {
  uint64_t now = sl_now_ns();
  uint64_t cur = atomic_load(&p->end_ns);
  while (cur < now && !atomic_compare_exchange_weak(&p->end_ns, &cur, now))
    ;
  if (atomic_fetch_sub(&p->outstanding, 1) == 1)
    probe_resolve(p, true);
}

typedef struct probe_walk {
  sl__clear_probe *p;
  int pending_streams;
} probe_walk;

static void probe_stream(sl_stream_t *s, void *ud) {
  probe_walk *w = ud;
  sl_stream_pending q = sl_stream_query(s);
  if (q.tasks == 0)
    return;
  w->pending_streams++;
  atomic_fetch_add(&w->p->outstanding, 1);
  sl__clear_probe *p = w->p;
  if (sl_stream_submit(s, s->dev->ops->probe_fn, &p, sizeof p, NULL, 0,
                       NULL) != SL_OK) {
    /* cannot measure this stream; count it as ending now */
    atomic_fetch_sub(&w->p->outstanding, 1);
  }
}

/* Measures the work still in flight on every stream of dev at this instant
 * (I2): each stream with pending tasks gets a probe task behind them, and the
 * last probe to run records how long after the clear the work ended. */
static void measure_inflight(sl_device_t *dev, uint64_t t_clear) {
  sl__clear_probe *p = sl_calloc(1, sizeof *p);
  if (!p)
    return; /* measurement only; the clear itself does not depend on it */
  p->t_clear_ns = t_clear;
  p->dev = dev;
  atomic_store(&p->end_ns, t_clear);
  atomic_store(&p->outstanding, 1); /* our own reference */
  probe_walk w = {p, 0};
  sl__device_each_stream(dev, probe_stream, &w);
  if (w.pending_streams == 0) {
    atomic_store(&p->outstanding, 0);
    probe_resolve(p, false);
    return;
  }
  if (atomic_fetch_sub(&p->outstanding, 1) == 1)
    probe_resolve(p, true);
}

/* ---- clears --------------------------------------------------------------- */

static sl_status sync_for_clear(sl_stream_t *s) {
  sl_status st = sl_stream_sync(s);
  if (st == SL_ERR_DEVICE_FATAL)
    sl__device_fatal(s->dev, "sl_sync_and_clear_cache", s->name);
  return st;
}

/* `who` names the clear (and its stream) in debug-mode reports. */
static sl_status clear_locked(sl_device_t *dev, const char *who,
                              const sl_stream_t *s) {
  uint64_t t = sl_now_ns();
  uint64_t inflight = 0;
  char site[96];
  snprintf(site, sizeof site, "the clearing side: %s(%s)", who,
           s ? s->name : dev->name);
  sl__alloc_clear(dev, &inflight, site);
  measure_inflight(dev, t);
  return SL_OK;
}

sl_status sl_sync_and_clear_cache(sl_stream_t *stream) {
  if (!stream)
    return SL_ERR_INVALID_ARG;
  sl_device_t *dev = stream->dev;
  sl_buffer_access_lock(dev);
  sl_status st = sync_for_clear(stream);
  sl_status st2 = sync_for_clear(dev->default_stream);
  if (st == SL_OK)
    st = st2;
  sl_status st3 = clear_locked(dev, "sl_sync_and_clear_cache", stream);
  sl_buffer_access_unlock(dev);
  return st != SL_OK ? st : st3;
}

sl_status sl_drain_all_and_clear_cache(sl_device_t *dev) {
  if (!dev)
    return SL_ERR_INVALID_ARG;
  sl_buffer_access_lock(dev);
  sl_status st = SL_OK;
  /* Drain under the registry lock in passes: a stream made meanwhile is new
   * and owns no work older than this call. */
  pthread_mutex_lock(&dev->streams_mu);
  for (sl_stream_t *s = dev->streams; s; s = s->reg_next) {
    sl_status e = sync_for_clear(s);
    if (st == SL_OK)
      st = e;
  }
  pthread_mutex_unlock(&dev->streams_mu);
  sl_status st2 =
      clear_locked(dev, "sl_drain_all_and_clear_cache", NULL);
  sl_buffer_access_unlock(dev);
  return st != SL_OK ? st : st2;
}

/* ---- accounting (I7) --------------------------------------------------------- */

uint64_t sl_footprint_bytes(sl_device_t *dev) {
  return dev->ops->footprint(dev);
}

void sl_unreleased_init(sl_unreleased_est *e, uint64_t window_ns) {
  e->window_ns = window_ns ? window_ns : 10ull * 1000000000ull;
  e->head = 0;
  e->count = 0;
}

/* The samples form a monotonic deque: residuals strictly increase from the
 * front (the window's minimum) to the back, so a sample that can never again
 * be the minimum is dropped at once, and the window's minimum is exact. */
#define RING(e, i) ((e)->s[((e)->head + (i)) % SL_UNRELEASED_SAMPLES])

uint64_t sl_unreleased_update(sl_unreleased_est *e, uint64_t t_ns,
                              uint64_t footprint, uint64_t allocator_bytes) {
  int64_t residual = (int64_t)footprint - (int64_t)allocator_bytes;
  /* expire from the front */
  while (e->count > 0 && t_ns - RING(e, 0).t_ns > e->window_ns) {
    e->head = (e->head + 1) % SL_UNRELEASED_SAMPLES;
    e->count--;
  }
  /* newer and no larger beats older: pop from the back */
  while (e->count > 0 && RING(e, e->count - 1).residual >= residual)
    e->count--;
  if (e->count == SL_UNRELEASED_SAMPLES) {
    /* full: drop the second entry, keeping the minimum at the front */
    for (int i = 1; i < e->count - 1; i++)
      RING(e, i) = RING(e, i + 1);
    e->count--;
  }
  RING(e, e->count).t_ns = t_ns;
  RING(e, e->count).residual = residual;
  e->count++;
  int64_t min = RING(e, 0).residual;
  return residual > min ? (uint64_t)(residual - min) : 0;
}

uint64_t sl_mem_guard_bytes(uint64_t active, uint64_t footprint,
                            uint64_t hot_tier_bytes) {
  uint64_t fp = footprint > hot_tier_bytes ? footprint - hot_tier_bytes : 0;
  return active > fp ? active : fp;
}

/* ---- the seed's wrong clear (experiment.h) --------------------------------- */

#include "rt/experiment.h"

sl_status sl__rt_experiment_bare_clear(sl_device_t *dev) {
  sl_buffer_access_lock(dev);
  sl_status st = sync_for_clear(dev->default_stream);
  clear_locked(dev, "bare clear (experiment)", dev->default_stream);
  sl_buffer_access_unlock(dev);
  return st;
}
