/* The engine's one clear primitive (I3, I4): every clear site of the
 * scheduler and of admission reaches the engine stream's sync-and-clear
 * through sl__clear_at_site, which runs the test hook, drains the stream
 * that owns the work, clears, and records the evidence that nothing of
 * ours was in flight. The bottom of the engine's executor files:
 * clear.c < emit.c < admit.c < scheduler.c (each calls only the files
 * before it; tools/check_layers.py --objects finds no cycle). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "sluice/alloc.h"
#include "sluice/kv.h"
#include "sluice/memsync.h"
#include "sluice/util.h"

const char *sl__clear_site_name(sl__clear_site s) {
  static const char *names[] = {
#define SL__SITE_NAME(id, name) name,
      SL__CLEAR_SITES(SL__SITE_NAME)
#undef SL__SITE_NAME
  };
  return s < SL__SITE_COUNT ? names[s] : "?";
}

/* The one clear primitive, with the engine's stream (I3, I4), and the
 * evidence that nothing was in flight on it. A drafter with a stream of
 * its own (a draft model's passes) has that stream drained first: its work
 * is the engine's too (the ancestor's second fix, its MTP loop's verify
 * stream). */
static void clear_at(sl_engine_t *e, sl__clear_site site) {
  sl_stream_evidence before = sl_stream_clear_evidence(e->stream);
  sl_stream_t *ds = e->draft_stream;
  bool busy = sl_stream_query(e->stream).tasks > 0 ||
              (ds && sl_stream_query(ds).tasks > 0);
  uint64_t t0 = sl_now_ns();
  sl_status dst = ds ? sl_stream_sync(ds) : SL_OK;
  sl_status st = sl_sync_and_clear_cache(e->stream);
  if (st == SL_OK)
    st = dst; /* a draft pass's error: failed like the engine's own */
  double drain_ms = sl_ns_to_ms(sl_now_ns() - t0);
  if (drain_ms >= 1.0)
    SL_LOGD("clear at %s: %.2f ms%s", sl__clear_site_name(site), drain_ms,
            busy ? " (the stream was busy)" : "");
  if (st != SL_OK) {
    /* a task of ours failed: take the error off the stream (the clear left
     * it there) and fail the requests whose work it was, after this step */
    (void)sl_stream_sync(e->stream);
    SL_LOGW("engine: the clear at %s reported %s", sl__clear_site_name(site),
            sl_status_str(st));
    if (e->n_active > 0 && e->clear_error == SL_OK)
      e->clear_error = st; /* else no request's: taken and logged */
  }
  /* the evidence, on our own stream only: work of ours that the clear
   * found still pending (none after a correct drain) */
  sl_stream_evidence after = sl_stream_clear_evidence(e->stream);
  sl_stream_pending q = sl_stream_query(e->stream);
  bool found = after.own.clears != before.own.clears;
  pthread_mutex_lock(&e->mu);
  e->stats.clears++;
  e->stats.clear_ns += (uint64_t)(drain_ms * 1e6);
  if (!busy)
    e->stats.clear_idle_ns += (uint64_t)(drain_ms * 1e6);
  sl__site_stats *s = &e->sites[site];
  s->count++;
  if (busy) {
    s->reached_busy++;
    if (drain_ms > s->busy_drain_ms_max)
      s->busy_drain_ms_max = drain_ms;
  }
  if (q.tasks > s->engine_pending_max)
    s->engine_pending_max = q.tasks;
  uint64_t dq = ds ? sl_stream_query(ds).tasks : 0;
  if (dq > s->draft_pending_max)
    s->draft_pending_max = dq;
  if (found && after.own.tasks_last > s->engine_pending_max)
    s->engine_pending_max = after.own.tasks_last;
  if (found && after.own.bytes_last > s->inflight_bytes_max)
    s->inflight_bytes_max = after.own.bytes_last;
  if (after.own.ms_max > s->inflight_ms_max)
    s->inflight_ms_max = after.own.ms_max;
  sl__site_stats now = *s;
  pthread_mutex_unlock(&e->mu);
  if (e->hooks.after_clear)
    e->hooks.after_clear(e->hooks.ud, e->stream, site, &now);
}

static void run_hook(sl_engine_t *e, sl__clear_site site) {
  if (e->hooks.before_clear)
    e->hooks.before_clear(e->hooks.ud, e->stream, site);
}

void sl__clear_at_site(sl_engine_t *e, sl__clear_site site) {
  run_hook(e, site);
  clear_at(e, site);
}
