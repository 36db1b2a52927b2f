/* sluice — server: /v1/models, /metrics (Prometheus text) and
 * /admin/api/stats (JSON), and the request metrics the server measures
 * itself (TTFT, TPOT). */
#include <string.h>
#include <time.h>

#include "server/admin.h"
#include "server/answer.h"
#include "server/door.h"
#include "server/job.h"
#include "server/json.h"
#include "server/parse.h"
#include "server/state.h"
#include "sluice/alloc.h"
#include "sluice/memsync.h"
#include "sluice/rt.h"
#include "sluice/util.h"

/* seconds */
const double sl__srv_ttft_bounds[SL_SRV_TTFT_BUCKETS] = {
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
const double sl__srv_tpot_bounds[SL_SRV_TPOT_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};

void sl__srv_metrics_init(sl_srv_metrics *m) {
  memset(m, 0, sizeof *m);
  pthread_mutex_init(&m->mu, NULL);
  sl_unreleased_init(&m->unreleased, 0);
}

void sl__srv_metrics_destroy(sl_srv_metrics *m) {
  sl_unreleased_fini(&m->unreleased);
  pthread_mutex_destroy(&m->mu);
}

static void observe(uint64_t *counts, const double *bounds, int n, double v) {
  for (int i = 0; i < n; i++)
    if (v <= bounds[i])
      counts[i]++;
}

static const char *api_name(sl_srv_api a) {
  switch (a) {
  case SL_SRV_CHAT:
    return "chat";
  case SL_SRV_COMPLETIONS:
    return "completions";
  case SL_SRV_MESSAGES:
    return "messages";
  case SL_SRV_EMBEDDINGS:
    return "embeddings";
  default:
    return "";
  }
}

/* The next slot of the ring (under m->mu), filled with `r`'s names. */
static sl_srv_recent *recent_slot(sl_srv_metrics *m, const sl_srv_request *r,
                                  int http) {
  sl_srv_recent *e = &m->recent[m->recent_n++ % SL_SRV_RECENT];
  memset(e, 0, sizeof *e);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  e->t = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
  e->http = http;
  if (r) {
    snprintf(e->model, sizeof e->model, "%s", r->model ? r->model : "");
    snprintf(e->api, sizeof e->api, "%s", api_name(r->api));
  }
  return e;
}

void sl__srv_metrics_job(void *metrics, sl_srv_job *j, bool failed) {
  sl_srv_metrics *m = metrics;
  int reasoning_tokens = 0; /* the split is the consumer's state: under mu */
  pthread_mutex_lock(&j->mu);
  if (j->kids)
    for (int i = 0; i < j->n_parts; i++)
      reasoning_tokens += sl__srv_job_reasoning_tokens(&j->kids[i]);
  else if (!j->parts)
    reasoning_tokens = sl__srv_job_reasoning_tokens(j);
  pthread_mutex_unlock(&j->mu);
  pthread_mutex_lock(&m->mu);
  sl_srv_recent *e = recent_slot(
      m, &j->req,
      failed ? (j->reason != SL_REASON_NONE ? sl_reason_http(j->reason) : 500)
             : 200);
  static const char *fin[] = {"", "stop", "length", "abort", "error"};
  snprintf(e->finish, sizeof e->finish, "%s",
           (unsigned)j->finish < sizeof fin / sizeof fin[0] ? fin[j->finish]
                                                            : "");
  e->prompt_tokens = j->prompt_tokens;
  e->cached_tokens = j->cached_tokens;
  e->completion_tokens = j->completion_tokens;
  m->requests++;
  if (failed)
    m->requests_failed++;
  m->prompt_tokens += (uint64_t)j->prompt_tokens;
  m->cached_tokens += (uint64_t)j->cached_tokens;
  m->generated_tokens += (uint64_t)j->completion_tokens;
  m->reasoning_tokens += (uint64_t)reasoning_tokens;
  if (j->t_first && j->t_first >= j->t_submit) {
    double ttft = (double)(j->t_first - j->t_submit) / 1e9;
    observe(m->ttft_counts, sl__srv_ttft_bounds, SL_SRV_TTFT_BUCKETS, ttft);
    m->ttft_sum += ttft;
    m->ttft_n++;
    e->ttft_ms = ttft * 1e3;
    if (j->completion_tokens > 1 && j->t_done > j->t_first) {
      double tpot = (double)(j->t_done - j->t_first) / 1e9 /
                    (double)(j->completion_tokens - 1);
      observe(m->tpot_counts, sl__srv_tpot_bounds, SL_SRV_TPOT_BUCKETS, tpot);
      m->tpot_sum += tpot;
      m->tpot_n++;
      e->tpot_ms = tpot * 1e3;
    }
  }
  pthread_mutex_unlock(&m->mu);
}

void sl__srv_metrics_failed(sl_server_t *s, const sl_srv_request *r, int http) {
  pthread_mutex_lock(&s->m.mu);
  snprintf(recent_slot(&s->m, r, http)->finish, 16, "error");
  s->m.requests++;
  s->m.requests_failed++;
  pthread_mutex_unlock(&s->m.mu);
}

void sl__srv_metrics_refused(sl_server_t *s, int why) {
  pthread_mutex_lock(&s->m.mu);
  if (why == SL_SRV_REFUSED_HOST)
    s->m.refused_host++;
  else if (why == SL_SRV_REFUSED_ORIGIN)
    s->m.refused_origin++;
  else
    s->m.refused_type++;
  pthread_mutex_unlock(&s->m.mu);
}

/* A consistent snapshot of everything both endpoints report. The loaded
 * engines are leased (kept loaded) until release(). */
#define SNAP_MAX_ENGINES 64
typedef struct snapshot {
  sl_srv_metrics m;  /* copied counters (mu and estimator unused) */
  sl_engine_stats e; /* summed over the loaded engines */
  sl_alloc_stats a;
  uint64_t footprint, unreleased, weights;
  int in_flight;
  sl_pool_lease l[SNAP_MAX_ENGINES];
  sl_engine_stats el[SNAP_MAX_ENGINES]; /* each engine's own */
  int n_loaded;
  /* the pool's entries, read before the snapshot's own leases */
  sl_pool_info info[SNAP_MAX_ENGINES];
  int n_info;
} snapshot;

/* a += b, counter by counter */
static void add_stats(sl_engine_stats *a, const sl_engine_stats *b) {
  a->waiting += b->waiting;
  a->running += b->running;
  a->requests_total += b->requests_total;
  a->requests_failed += b->requests_failed;
  a->prompt_tokens_total += b->prompt_tokens_total;
  a->cached_tokens_total += b->cached_tokens_total;
  a->generated_tokens_total += b->generated_tokens_total;
  a->kv_blocks_total += b->kv_blocks_total;
  a->kv_blocks_used += b->kv_blocks_used;
  a->kv_blocks_cached += b->kv_blocks_cached;
  a->steps += b->steps;
  a->step_ns += b->step_ns;
  a->clears += b->clears;
  a->clear_ns += b->clear_ns;
  a->clear_idle_ns += b->clear_idle_ns;
  a->argmax_device += b->argmax_device;
  a->sampled_device += b->sampled_device;
  a->sampled_host += b->sampled_host;
  a->sample_fallbacks += b->sample_fallbacks;
  a->grammar_masks += b->grammar_masks;
  a->grammar_unmasked += b->grammar_unmasked;
  a->preemptions += b->preemptions;
  a->drafted += b->drafted;
  a->accepted += b->accepted;
  if (b->spec_token_cost > a->spec_token_cost) /* a ratio: the largest */
    a->spec_token_cost = b->spec_token_cost;
  a->queue_timeouts += b->queue_timeouts;
  a->restored_blocks += b->restored_blocks;
  a->restore_ns += b->restore_ns;
  a->restore_read_blocks += b->restore_read_blocks;
  a->restore_read_bytes += b->restore_read_bytes;
  a->restore_read_ns += b->restore_read_ns;
  a->prefix_waits += b->prefix_waits;
}

static void release(sl_server_t *s, snapshot *sn) {
  for (int i = 0; i < sn->n_loaded; i++)
    sl_pool_release(s->pool, &sn->l[i]);
  sn->n_loaded = 0;
}

static void take(sl_server_t *s, snapshot *sn) {
  memset(&sn->e, 0, sizeof sn->e);
  sn->n_loaded = 0;
  sn->weights = 0;
  sl_device_t *dev = NULL;
  int n = sl_pool_count(s->pool);
  sn->n_info = 0;
  for (int i = 0; i < n && i < SNAP_MAX_ENGINES; i++)
    if (sl_pool_info_at(s->pool, i, &sn->info[sn->n_info]))
      sn->n_info++;
  for (int i = 0; i < n && sn->n_loaded < SNAP_MAX_ENGINES; i++) {
    sl_pool_lease *l = &sn->l[sn->n_loaded];
    if (!sl_pool_acquire_loaded(s->pool, i, l))
      continue;
    sn->el[sn->n_loaded] = sl_engine_get_stats(l->engine);
    add_stats(&sn->e, &sn->el[sn->n_loaded]);
    sn->weights += sl_model_weight_bytes(l->model);
    if (!dev)
      dev = sl_engine_device_of(l->engine);
    sn->n_loaded++;
  }
  if (!dev)
    dev = sl_cpu_device(); /* nothing loaded: the host's figures */
  sn->a = sl_alloc_get_stats(dev);
  sn->footprint = sl_footprint_bytes(dev);
  pthread_mutex_lock(&s->m.mu);
  sn->unreleased = sl_unreleased_update(&s->m.unreleased, sl_now_ns(),
                                        sn->footprint, sn->a.reserved);
  memcpy(&sn->m, &s->m, sizeof sn->m);
  pthread_mutex_unlock(&s->m.mu);
  pthread_mutex_lock(&s->jobs.mu);
  sn->in_flight = s->jobs.n;
  pthread_mutex_unlock(&s->jobs.mu);
}

static void prom(sl_sbuf *o, const char *name, const char *type,
                 const char *help, double v) {
  sl__sbuf_addf(o, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name,
                type, name, v);
}

static void prom_hist(sl_sbuf *o, const char *name, const char *help,
                      const uint64_t *counts, const double *bounds, int n,
                      double sum, uint64_t count) {
  sl__sbuf_addf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  for (int i = 0; i < n; i++)
    sl__sbuf_addf(o, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i],
                  (unsigned long long)counts[i]);
  sl__sbuf_addf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n",
                name, (unsigned long long)count, name, sum, name,
                (unsigned long long)count);
}

/* A histogram of lock times in seconds from per-bucket counts with the
 * bounds of sl_lock_hist_bound_ns (the last bucket is +Inf). */
static void lock_hist(sl_sbuf *o, const char *name, const char *help,
                      const uint64_t *per_bucket, uint64_t sum_ns,
                      uint64_t count) {
  uint64_t cum[SL_LOCK_HIST_BUCKETS];
  double bounds[SL_LOCK_HIST_BUCKETS];
  uint64_t c = 0;
  for (int i = 0; i < SL_LOCK_HIST_BUCKETS; i++) {
    c += per_bucket[i];
    cum[i] = c;
    bounds[i] = (double)sl_lock_hist_bound_ns(i) / 1e9;
  }
  prom_hist(o, name, help, cum, bounds, SL_LOCK_HIST_BUCKETS - 1,
            (double)sum_ns / 1e9, count);
}

/* A gauge or counter row of a metrics table. */
typedef struct metric_row {
  const char *name;
  char type; /* 'g' gauge, 'c' counter */
  const char *help;
  double v;
} metric_row;

/* The rows; with tier (may be NULL), name and help are a suffix and a
 * sentence, made sluice_kv_<tier>_<suffix> and "KV tier '<tier>': ...". */
static void prom_rows(sl_sbuf *o, const metric_row *rows, size_t n,
                      const char *tier) {
  for (size_t i = 0; i < n; i++) {
    char name[96], help[160];
    const char *nm = rows[i].name, *hp = rows[i].help;
    if (tier) {
      snprintf(name, sizeof name, "sluice_kv_%s_%s", tier, nm);
      snprintf(help, sizeof help, "KV tier '%s': %s", tier, hp);
      nm = name;
      hp = help;
    }
    prom(o, nm, rows[i].type == 'g' ? "gauge" : "counter", hp, rows[i].v);
  }
}

/* The tiers (hot, SSD) and their store worker, when the engine has them:
 * one family of rows per tier, sluice_kv_<tier>_... */
/* Tier i's and the store's counters summed over the loaded engines; false
 * when none has tier i. */
static bool tier_sum(const snapshot *sn, int i, sl_kv_tier_stats *t,
                     sl_engine_store_stats *w) {
  bool any = false;
  memset(t, 0, sizeof *t);
  memset(w, 0, sizeof *w);
  for (int k = 0; k < sn->n_loaded; k++) {
    sl_kv_tier_stats a;
    sl_engine_store_stats b;
    if (!sl_engine_tier_stats(sn->l[k].engine, i, &a, &b))
      continue;
    if (!any) {
      *t = a;
      *w = b;
      any = true;
      continue;
    }
    t->enabled = t->enabled || a.enabled;
    t->entries += a.entries;
    t->bytes += a.bytes;
    t->budget += a.budget;
    t->hits += a.hits;
    t->misses += a.misses;
    t->puts += a.puts;
    t->put_bytes += a.put_bytes;
    t->get_bytes += a.get_bytes;
    t->evictions += a.evictions;
    t->corrupt += a.corrupt;
    t->skipped += a.skipped;
    t->faults += a.faults;
    t->compressed += a.compressed;
    t->get_ms_total += a.get_ms_total;
    t->put_ms_total += a.put_ms_total;
    w->queued += b.queued;
    w->written += b.written;
    w->failed += b.failed;
    w->dropped += b.dropped;
    w->pending += b.pending;
    w->lock_holds += b.lock_holds;
    w->copies_at_clear += b.copies_at_clear;
    w->copies_unrecorded += b.copies_unrecorded;
    w->lock_ns_total += b.lock_ns_total;
    if (b.lock_ns_max > w->lock_ns_max)
      w->lock_ns_max = b.lock_ns_max;
    for (int h = 0; h < SL_STORE_HOLD_BUCKETS; h++)
      w->lock_hold_hist[h] += b.lock_hold_hist[h];
  }
  return any;
}

static void tier_metrics(sl_server_t *s, sl_sbuf *o, const snapshot *sn) {
  (void)s;
  sl_kv_tier_stats t;
  sl_engine_store_stats w;
  int n = 0;
  for (; tier_sum(sn, n, &t, &w); n++) {
    const metric_row rows[] = {
        {"enabled", 'g',
         "1 while it serves; 0 after a write fault it could not recover "
         "from (off for space: on again when space returns).",
         t.enabled ? 1 : 0},
        {"blocks", 'g', "Blocks held.", (double)t.entries},
        {"bytes", 'g', "Bytes held.", (double)t.bytes},
        {"budget_bytes", 'g',
         "The byte budget in effect (the SSD tier's: clamped to what its "
         "filesystem holds).",
         (double)t.budget},
        {"hits_total", 'c', "Blocks restored.", (double)t.hits},
        {"misses_total", 'c', "Lookups that found no block.", (double)t.misses},
        {"restored_bytes_total", 'c', "Payload bytes restored.",
         (double)t.get_bytes},
        {"restore_seconds_total", 'c', "Time spent reading blocks.",
         t.get_ms_total / 1e3},
        {"written_bytes_total", 'c', "Payload bytes written.",
         (double)t.put_bytes},
        {"write_seconds_total", 'c', "Time spent writing blocks.",
         t.put_ms_total / 1e3},
        {"evictions_total", 'c', "Blocks removed for the byte budget.",
         (double)t.evictions},
        {"compressed_blocks_total", 'c', "Blocks stored lz4-compressed.",
         (double)t.compressed},
        {"corrupt_total", 'c',
         "Blocks that failed a check when read: dropped, recomputed.",
         (double)t.corrupt},
        {"skipped_total", 'c', "Files skipped when the index was rebuilt.",
         (double)t.skipped},
        {"faults_total", 'c',
         "Write faults (ENOSPC, EIO, ...), those recovered from by "
         "eviction included.",
         (double)t.faults},
    };
    prom_rows(o, rows, sizeof rows / sizeof rows[0], t.name);
  }
  if (!n)
    return;
  const metric_row rows[] = {
      {"sluice_kv_tier_restored_blocks_total", 'c',
       "Blocks restored from the tiers at admission.",
       (double)sn->e.restored_blocks},
      {"sluice_kv_tier_admission_restore_seconds_total", 'c',
       "Executor time restoring blocks from the tiers at admission (reads "
       "and queueing the copies).",
       (double)sn->e.restore_ns / 1e9},
      {"sluice_kv_tier_read_bytes_total", 'c',
       "Bytes of restored blocks read by a copy (SSD), in parallel.",
       (double)sn->e.restore_read_bytes},
      {"sluice_kv_tier_read_seconds_total", 'c',
       "Wall time of those parallel reads (bytes / seconds: the restore "
       "read bandwidth).",
       (double)sn->e.restore_read_ns / 1e9},
      {"sluice_kv_store_queued_total", 'c',
       "Blocks handed to the store worker.", (double)w.queued},
      {"sluice_kv_store_dropped_total", 'c',
       "Unwritten blocks dropped because the tiers were behind.",
       (double)w.dropped},
      {"sluice_kv_store_failed_total", 'c',
       "Blocks the store worker could not write.", (double)w.failed},
      {"sluice_kv_store_pending", 'g', "Blocks waiting for the store worker.",
       (double)w.pending},
      {"sluice_kv_store_copies_at_clear_total", 'c',
       "Store copies a clear found in flight (0 while the buffer-access "
       "lock keeps clears out).",
       (double)w.copies_at_clear},
      {"sluice_kv_store_copies_unrecorded_total", 'c',
       "Store copies not recorded as a use of the KV pool (I1; 0 unless "
       "broken).",
       (double)w.copies_unrecorded},
  };
  prom_rows(o, rows, sizeof rows / sizeof rows[0], NULL);
  lock_hist(o, "sluice_kv_store_lock_hold_seconds",
            "Buffer-access lock holds of the store worker, one per copy "
            "batch.",
            w.lock_hold_hist, w.lock_ns_total, w.lock_holds);
}

/* Speculative decoding's counts: drafted, kept, and the share kept (0
 * before any draft). */
static double acceptance(const sl_engine_stats *e) {
  return e->drafted ? (double)e->accepted / (double)e->drafted : 0.0;
}

static json_t *spec_json(const sl_engine_stats *e) {
  return json_pack("{s:I,s:I,s:f,s:f}", "drafted", (json_int_t)e->drafted,
                   "accepted", (json_int_t)e->accepted, "acceptance_rate",
                   acceptance(e), "token_cost", e->spec_token_cost);
}

/* The pool's models: one labelled series each (sluice_info names every
 * model the server serves, loaded or not). */
static void model_metrics(const snapshot *sn, sl_sbuf *o) {
  static const struct {
    const char *name, *type, *help;
  } fam[] = {
      {"sluice_info", "gauge", "A served model (1 each, loaded or not)."},
      {"sluice_model_loaded", "gauge", "1 while the model is loaded."},
      {"sluice_model_pinned", "gauge", "1 when the model is pinned."},
      {"sluice_model_memory_bytes", "gauge",
       "Memory the model plans to hold while loaded (weights, KV, hot tier)."},
      {"sluice_model_requests_in_flight", "gauge",
       "Requests holding the model now."},
      {"sluice_model_requests_total", "counter", "Requests for the model."},
      {"sluice_model_loads_total", "counter", "Completed loads."},
      {"sluice_model_unloads_total", "counter",
       "Unloads (asked for, evicted, idle, shutdown)."},
      {"sluice_model_evictions_total", "counter",
       "Unloads to make room for another model."},
      {"sluice_model_reclaims_total", "counter", "Unloads by --idle-ttl."},
      {"sluice_model_load_failures_total", "counter",
       "Loads that did not end loaded."},
      {"sluice_model_load_seconds", "gauge", "The last load's time."},
  };
  for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
    sl__sbuf_addf(o, "# HELP %s %s\n# TYPE %s %s\n", fam[f].name, fam[f].help,
                  fam[f].name, fam[f].type);
    for (int i = 0; i < sn->n_info; i++) {
      sl_pool_info in = sn->info[i];
      double v[] = {1,
                    in.state == SL_POOL_LOADED,
                    in.pinned,
                    (double)in.bytes,
                    in.in_use,
                    (double)in.requests,
                    (double)in.loads,
                    (double)in.unloads,
                    (double)in.evictions,
                    (double)in.reclaims,
                    (double)in.load_failures,
                    in.last_load_ms / 1e3};
      sl__sbuf_addf(o, "%s{model=\"%s\"} %.17g\n", fam[f].name, in.name, v[f]);
    }
  }
}

/* Speculative decoding per loaded model (its engine's counts since its
 * load). */
static void spec_metrics(const snapshot *sn, sl_sbuf *o) {
  static const struct {
    const char *name, *type, *help;
  } fam[] = {
      {"sluice_spec_drafted_tokens_total", "counter",
       "Speculative drafts verified (since the model's load)."},
      {"sluice_spec_accepted_tokens_total", "counter",
       "Speculative drafts kept: the target's own token."},
      {"sluice_spec_acceptance_ratio", "gauge",
       "Drafts kept over drafts verified (0 before any)."},
  };
  for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
    sl__sbuf_addf(o, "# HELP %s %s\n# TYPE %s %s\n", fam[f].name, fam[f].help,
                  fam[f].name, fam[f].type);
    for (int k = 0; k < sn->n_loaded; k++) {
      const sl_engine_stats *e = &sn->el[k];
      double v[] = {(double)e->drafted, (double)e->accepted, acceptance(e)};
      sl__sbuf_addf(o, "%s{model=\"%s\"} %.17g\n", fam[f].name, sn->l[k].name,
                    v[f]);
    }
  }
}

void sl__srv_metrics_text(sl_server_t *s, sl_sbuf *o) {
  snapshot sn;
  take(s, &sn);
  model_metrics(&sn, o);
  spec_metrics(&sn, o);
  prom(o, "sluice_http_requests_total", "counter", "HTTP requests received.",
       (double)sn.m.http_requests);
  sl__sbuf_addf(o,
                "# HELP sluice_http_refused_total Requests refused for who "
                "sent them: a Host not the server's (403), an Origin not "
                "allowed (403), a POST body not application/json (415).\n"
                "# TYPE sluice_http_refused_total counter\n"
                "sluice_http_refused_total{reason=\"host\"} %llu\n"
                "sluice_http_refused_total{reason=\"origin\"} %llu\n"
                "sluice_http_refused_total{reason=\"content_type\"} %llu\n",
                (unsigned long long)sn.m.refused_host,
                (unsigned long long)sn.m.refused_origin,
                (unsigned long long)sn.m.refused_type);
  sl_srv_door_stats ds;
  sl__srv_door_stats_get(s->door, &ds);
  prom(o, "sluice_http_connections_open", "gauge",
       "Client connections open (waiting for a head, or in libmicrohttpd).",
       (double)ds.live);
  sl__sbuf_addf(o,
                "# HELP sluice_http_connections_refused_total Connections "
                "refused: over --max-conns or --max-conns-per-ip (closed at "
                "accept; a client behind a --trusted-proxy gets 429 once "
                "named).\n"
                "# TYPE sluice_http_connections_refused_total counter\n"
                "sluice_http_connections_refused_total{limit=\"total\"} %llu\n"
                "sluice_http_connections_refused_total{limit=\"per_ip\"} "
                "%llu\n",
                (unsigned long long)ds.refused_total,
                (unsigned long long)ds.refused_per_ip);
  pthread_mutex_lock(&s->det_mu);
  uint64_t half_closed = s->n_detached_total;
  pthread_mutex_unlock(&s->det_mu);
  prom(o, "sluice_http_half_closed_answers_total", "counter",
       "Answers written after libmicrohttpd gave up the connection of a "
       "client that had shut its sending side (shutdown(SHUT_WR)).",
       (double)half_closed);
  prom(o, "sluice_http_connections_forwarded_total", "counter",
       "Connections from a --trusted-proxy counted as the client it named "
       "(PROXY header or X-Forwarded-For).",
       (double)ds.forwarded);
  prom(o, "sluice_http_head_rejected_total", "counter",
       "First request heads answered at the door: 400, 414, 431, 505.",
       (double)ds.head_errors);
  prom(o, "sluice_http_head_timeouts_total", "counter",
       "First request heads not whole within --head-timeout-ms (408).",
       (double)ds.head_timeouts);
  prom(o, "sluice_requests_total", "counter", "Generation requests answered.",
       (double)sn.m.requests);
  prom(o, "sluice_requests_failed_total", "counter",
       "Generation requests answered with an error.",
       (double)sn.m.requests_failed);
  prom(o, "sluice_requests_in_flight", "gauge",
       "Requests submitted to the engine and not yet finished.",
       (double)sn.in_flight);
  prom(o, "sluice_requests_running", "gauge", "Sequences the engine runs.",
       sn.e.running);
  prom(o, "sluice_requests_waiting", "gauge", "Requests waiting for admission.",
       sn.e.waiting);
  prom(o, "sluice_prompt_tokens_total", "counter", "Prompt tokens.",
       (double)sn.m.prompt_tokens);
  prom(o, "sluice_cached_prompt_tokens_total", "counter",
       "Prompt tokens served from the prefix cache.",
       (double)sn.m.cached_tokens);
  prom(o, "sluice_generated_tokens_total", "counter", "Generated tokens.",
       (double)sn.m.generated_tokens);
  prom(o, "sluice_reasoning_tokens_total", "counter",
       "Generated tokens that were thinking (inside a think block, its tags "
       "included).",
       (double)sn.m.reasoning_tokens);
  prom(o, "sluice_prefix_waits_total", "counter",
       "Admissions put off while another request prefilled the same prefix "
       "(in-flight prefix sharing).",
       (double)sn.e.prefix_waits);
  prom_hist(o, "sluice_ttft_seconds", "Time to first token.", sn.m.ttft_counts,
            sl__srv_ttft_bounds, SL_SRV_TTFT_BUCKETS, sn.m.ttft_sum,
            sn.m.ttft_n);
  prom_hist(o, "sluice_tpot_seconds", "Time per output token after the first.",
            sn.m.tpot_counts, sl__srv_tpot_bounds, SL_SRV_TPOT_BUCKETS,
            sn.m.tpot_sum, sn.m.tpot_n);
  prom(o, "sluice_kv_blocks_total", "gauge", "KV cache blocks.",
       sn.e.kv_blocks_total);
  prom(o, "sluice_kv_blocks_used", "gauge", "KV blocks held by sequences.",
       sn.e.kv_blocks_used);
  prom(o, "sluice_kv_blocks_cached", "gauge",
       "KV blocks kept for the prefix cache.", sn.e.kv_blocks_cached);
  prom(o, "sluice_engine_steps_total", "counter", "Scheduler steps.",
       (double)sn.e.steps);
  prom(o, "sluice_memory_active_bytes", "gauge", "Allocator bytes in use.",
       (double)sn.a.active);
  prom(o, "sluice_memory_retiring_bytes", "gauge",
       "Released bytes with pending uses.", (double)sn.a.retiring);
  prom(o, "sluice_memory_cache_bytes", "gauge", "Allocator cache bytes.",
       (double)sn.a.cache);
  prom(o, "sluice_memory_peak_bytes", "gauge", "Peak allocator bytes.",
       (double)sn.a.peak);
  prom(o, "sluice_memory_limit_bytes", "gauge", "Allocator limit (0: none).",
       (double)sn.a.limit);
  prom(o, "sluice_memory_footprint_bytes", "gauge", "Process footprint (RSS).",
       (double)sn.footprint);
  prom(o, "sluice_memory_unreleased_bytes", "gauge",
       "Freed bytes the OS still charges.", (double)sn.unreleased);
  prom(o, "sluice_cache_clears_total", "counter", "Allocator cache clears.",
       (double)sn.a.clears);
  prom(o, "sluice_clears_with_inflight_total", "counter",
       "Clears that found work in flight.", (double)sn.a.clears_with_inflight);
  prom(o, "sluice_inflight_at_clear_bytes", "gauge",
       "Bytes with pending uses at the last clear.",
       (double)sn.a.inflight_bytes_last);
  prom(o, "sluice_inflight_at_clear_bytes_max", "gauge",
       "Most bytes with pending uses at a clear.",
       (double)sn.a.inflight_bytes_max);
  sl_access_lock_stats lk = {0};
  if (sn.n_loaded) /* the device's lock: any engine of it answers */
    lk = sl_engine_clear_lock_stats(sn.l[0].engine);
  lock_hist(o, "sluice_clear_lock_wait_seconds",
            "Time each cache clear waited for the buffer-access lock (a store "
            "batch holding it).",
            lk.wait_hist, lk.wait_ns_total, lk.clears);
  prom(o, "sluice_clear_lock_hold_seconds_total", "counter",
       "Time cache clears held the buffer-access lock (drain and clear).",
       (double)lk.hold_ns_total / 1e9);
  prom(o, "sluice_clear_lock_hold_seconds_max", "gauge",
       "The longest buffer-access lock hold of a cache clear.",
       (double)lk.hold_ns_max / 1e9);
  prom(o, "sluice_inflight_at_clear_ms", "gauge",
       "Time until the last clear's in-flight work ended.",
       sn.a.inflight_ms_last);
  prom(o, "sluice_inflight_at_clear_ms_max", "gauge",
       "Longest in-flight time at a clear.", sn.a.inflight_ms_max);
  tier_metrics(s, o, &sn);
  release(s, &sn);
}

/* The answered requests, newest first. */
static json_t *recent_json(const snapshot *sn) {
  json_t *a = json_array();
  uint64_t n = sn->m.recent_n;
  for (uint64_t k = 0; a && k < n && k < SL_SRV_RECENT; k++) {
    const sl_srv_recent *e = &sn->m.recent[(n - 1 - k) % SL_SRV_RECENT];
    json_t *r =
        json_pack("{s:f,s:s,s:s,s:i,s:s,s:i,s:i,s:i,s:f,s:f}", "t", e->t,
                  "model", e->model, "api", e->api, "status", e->http, "finish",
                  e->finish, "prompt_tokens", e->prompt_tokens, "cached_tokens",
                  e->cached_tokens, "completion_tokens", e->completion_tokens,
                  "ttft_ms", e->ttft_ms, "tpot_ms", e->tpot_ms);
    if (!r || json_array_append_new(a, r) != 0) {
      json_decref(a);
      return NULL;
    }
  }
  return a;
}

/* The tiers (hot, SSD), summed over the loaded engines. */
static json_t *tiers_json(const snapshot *sn) {
  json_t *a = json_array();
  sl_kv_tier_stats t;
  sl_engine_store_stats w;
  for (int i = 0; a && tier_sum(sn, i, &t, &w); i++) {
    json_t *r = json_pack(
        "{s:s,s:b,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "name", t.name, "enabled",
        t.enabled, "blocks", (json_int_t)t.entries, "bytes",
        (json_int_t)t.bytes, "budget", (json_int_t)t.budget, "hits",
        (json_int_t)t.hits, "misses", (json_int_t)t.misses, "dropped",
        (json_int_t)w.dropped, "corrupt", (json_int_t)t.corrupt);
    if (!r || json_array_append_new(a, r) != 0) {
      json_decref(a);
      return NULL;
    }
  }
  return a;
}

/* Each model of the pool: its state and counters, and a loaded one's
 * engine figures. */
static json_t *models_json(const snapshot *sn) {
  json_t *a = json_array();
  for (int i = 0; a && i < sn->n_info; i++) {
    sl_pool_info in = sn->info[i];
    json_t *m = json_pack(
        "{s:s,s:s,s:s,s:b,s:I,s:I,s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f}", "name",
        in.name, "path", in.path, "state", sl_pool_state_name(in.state),
        "pinned", in.pinned, "file_bytes", (json_int_t)in.file_bytes,
        "memory_bytes", (json_int_t)in.bytes, "in_use", in.in_use, "requests",
        (json_int_t)in.requests, "loads", (json_int_t)in.loads, "unloads",
        (json_int_t)in.unloads, "evictions", (json_int_t)in.evictions,
        "reclaims", (json_int_t)in.reclaims, "load_failures",
        (json_int_t)in.load_failures, "last_load_ms", in.last_load_ms, "idle_s",
        in.idle_s);
    for (int k = 0; m && k < sn->n_loaded; k++) {
      if (sn->l[k].index != i)
        continue;
      const sl_engine_stats *e = &sn->el[k];
      json_object_set_new(m, "context_length", json_integer(in.n_ctx));
      json_object_set_new(m, "arch", json_string(in.arch ? in.arch : "?"));
      json_object_set_new(
          m, "engine",
          json_pack("{s:s,s:i,s:i,s:I,s:I,s:I,s:i,s:i,s:i,s:I,s:I}", "device",
                    sl_engine_device_name(sn->l[k].engine), "running",
                    e->running, "waiting", e->waiting, "prompt_tokens_total",
                    (json_int_t)e->prompt_tokens_total, "cached_tokens_total",
                    (json_int_t)e->cached_tokens_total,
                    "generated_tokens_total",
                    (json_int_t)e->generated_tokens_total, "kv_blocks_total",
                    e->kv_blocks_total, "kv_blocks_used", e->kv_blocks_used,
                    "kv_blocks_cached", e->kv_blocks_cached, "clears",
                    (json_int_t)e->clears, "step_ns", (json_int_t)e->step_ns));
      json_t *eng = json_object_get(m, "engine");
      if (eng)
        json_object_set_new(eng, "speculative", spec_json(e));
    }
    if (!m || json_array_append_new(a, m) != 0) {
      json_decref(a);
      return NULL;
    }
  }
  return a;
}

json_t *sl__srv_stats_json(sl_server_t *s) {
  snapshot sn;
  take(s, &sn);
  json_t *o = json_object();
  if (!o) {
    release(s, &sn);
    return NULL;
  }
  sl_pool_info first;
  sl_pool_info_at(s->pool, 0, &first);
  json_object_set_new(o, "model", json_string(first.name));
  json_object_set_new(o, "device",
                      sn.n_loaded
                          ? json_string(sl_engine_device_name(sn.l[0].engine))
                          : json_null());
  json_object_set_new(o, "models", models_json(&sn));
  json_object_set_new(o, "recent", recent_json(&sn));
  json_object_set_new(o, "tiers", tiers_json(&sn));
  json_object_set_new(o, "uptime_s",
                      json_real((double)(sl_now_ns() - s->t_start_ns) / 1e9));
  json_object_set_new(
      o, "requests",
      json_pack("{s:I,s:I,s:I,s:i}", "http", (json_int_t)sn.m.http_requests,
                "total", (json_int_t)sn.m.requests, "failed",
                (json_int_t)sn.m.requests_failed, "in_flight", sn.in_flight));
  json_object_set_new(o, "tokens",
                      json_pack("{s:I,s:I,s:I}", "prompt",
                                (json_int_t)sn.m.prompt_tokens, "cached",
                                (json_int_t)sn.m.cached_tokens, "generated",
                                (json_int_t)sn.m.generated_tokens));
  json_object_set_new(
      o, "latency",
      json_pack("{s:I,s:f,s:I,s:f}", "ttft_count", (json_int_t)sn.m.ttft_n,
                "ttft_mean_ms",
                sn.m.ttft_n ? sn.m.ttft_sum / (double)sn.m.ttft_n * 1e3 : 0.0,
                "tpot_count", (json_int_t)sn.m.tpot_n, "tpot_mean_ms",
                sn.m.tpot_n ? sn.m.tpot_sum / (double)sn.m.tpot_n * 1e3 : 0.0));
  json_object_set_new(
      o, "engine",
      json_pack(
          "{s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:i,s:i,s:i,s:I,s:I,s:I,s:I}",
          "running", sn.e.running, "waiting", sn.e.waiting, "requests_total",
          (json_int_t)sn.e.requests_total, "requests_failed",
          (json_int_t)sn.e.requests_failed, "prompt_tokens_total",
          (json_int_t)sn.e.prompt_tokens_total, "cached_tokens_total",
          (json_int_t)sn.e.cached_tokens_total, "generated_tokens_total",
          (json_int_t)sn.e.generated_tokens_total, "kv_blocks_total",
          sn.e.kv_blocks_total, "kv_blocks_used", sn.e.kv_blocks_used,
          "kv_blocks_cached", sn.e.kv_blocks_cached, "steps",
          (json_int_t)sn.e.steps, "preemptions", (json_int_t)sn.e.preemptions,
          "queue_timeouts", (json_int_t)sn.e.queue_timeouts, "prefix_waits",
          (json_int_t)sn.e.prefix_waits));
  /* where the generated tokens were picked: the device's argmax, the device
   * sampler, the host sampler (fallbacks: the device sampler's rows that
   * the host sampled, within sampled_host) */
  json_object_set_new(
      o, "sampling",
      json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "argmax_device",
                (json_int_t)sn.e.argmax_device, "sampled_device",
                (json_int_t)sn.e.sampled_device, "sampled_host",
                (json_int_t)sn.e.sampled_host, "fallbacks",
                (json_int_t)sn.e.sample_fallbacks, "grammar_masks",
                (json_int_t)sn.e.grammar_masks, "grammar_unmasked",
                (json_int_t)sn.e.grammar_unmasked));
  /* speculative decoding: tokens drafted, and of them kept */
  json_object_set_new(o, "speculative", spec_json(&sn.e));
  json_object_set_new(
      o, "memory",
      json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "active",
                (json_int_t)sn.a.active, "retiring", (json_int_t)sn.a.retiring,
                "cache", (json_int_t)sn.a.cache, "peak", (json_int_t)sn.a.peak,
                "reserved", (json_int_t)sn.a.reserved, "limit",
                (json_int_t)sn.a.limit, "footprint", (json_int_t)sn.footprint,
                "unreleased", (json_int_t)sn.unreleased, "weights",
                (json_int_t)sn.weights));
  /* the allocator's clears (what was in flight at each), and the engine's
   * clear sites' share of the steps' time (issue 8's goal: < 1%) */
  json_object_set_new(
      o, "clears",
      json_pack("{s:I,s:I,s:I,s:I,s:f,s:f,s:I,s:f,s:f,s:f}", "total",
                (json_int_t)sn.a.clears, "with_inflight",
                (json_int_t)sn.a.clears_with_inflight, "inflight_bytes_last",
                (json_int_t)sn.a.inflight_bytes_last, "inflight_bytes_max",
                (json_int_t)sn.a.inflight_bytes_max, "inflight_ms_last",
                sn.a.inflight_ms_last, "inflight_ms_max", sn.a.inflight_ms_max,
                "engine_sites", (json_int_t)sn.e.clears, "ms_total",
                (double)sn.e.clear_ns / 1e6, "idle_ms_total",
                (double)sn.e.clear_idle_ns / 1e6, "step_ms_total",
                (double)sn.e.step_ns / 1e6));
  release(s, &sn);
  return o;
}
