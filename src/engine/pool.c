/* The engine pool (include/sluice/pool.h): entries, leases, loads that
 * share one attempt, LRU eviction under the budget, pinning and the idle
 * TTL thread.
 *
 * Locking: one mutex guards every entry's state and counters; loads and
 * unloads run with it released (the entry is LOADING or UNLOADING
 * meanwhile, which every other caller waits out on the condition). Memory is
 * reserved under the mutex before a load runs, so two loads cannot both
 * take the same room. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sluice/pool.h"
#include "sluice/util.h"

#define MAX_ALIASES 4

typedef struct entry {
  char *name, *path;
  char *alias[MAX_ALIASES];
  int n_alias;
  uint64_t file_bytes;
  sl_pool_state state;
  bool pinned;
  int refs;
  uint64_t last_used_ns;
  uint64_t requests, loads, unloads, evictions, reclaims, load_failures;
  uint64_t bytes; /* planned, counted in p->planned while not UNLOADED */
  double last_load_ms;
  /* a load's end: waiters of that attempt take its result */
  uint64_t attempt;
  sl_status last_status;
  char last_err[512];
  /* loaded */
  sl_model_t *model;
  sl_tokenizer_t *tok;
  sl_engine_t *engine;
  char *chat_template;
  char *ssd_dir;
  int n_ctx;
} entry;

struct sl_pool {
  sl_pool_config cfg;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* an entry's state changed, or stopping */
  entry *e;
  int n, cap;
  uint64_t planned;
  bool stopping;
  bool reaper_started;
  pthread_t reaper;
};

sl_pool_config sl_pool_config_defaults(void) {
  sl_pool_config c;
  memset(&c, 0, sizeof c);
  c.engine = sl_engine_config_defaults();
  c.reap_tick_ms = 1000;
  return c;
}

const char *sl_pool_state_name(sl_pool_state s) {
  switch (s) {
  case SL_POOL_UNLOADED:
    return "unloaded";
  case SL_POOL_LOADING:
    return "loading";
  case SL_POOL_LOADED:
    return "loaded";
  case SL_POOL_UNLOADING:
    return "unloading";
  }
  return "?";
}

/* An entry's invariants, with p->mu held (pool_entry_sanity checks them
 * at each change of state and at each lease and release; pool_sanity adds
 * the budget's sum):
 *   - name and path are set; alias[0..n_alias) are set, n_alias is at most
 *     MAX_ALIASES;
 *   - refs >= 0, and only a LOADED entry is leased (refs > 0), except for
 *     the leases that sl_pool_free finds still held as it unloads all;
 *   - model, tok and engine are all set while LOADED and all NULL otherwise
 *     (a load sets them at its end, an unload takes them at its start);
 *     chat_template is NULL unless LOADED (a model may have none);
 *   - n_ctx > 0 while LOADED or UNLOADING, 0 while UNLOADED or LOADING;
 *   - bytes is 0 while UNLOADED and > 0 while LOADED or UNLOADING (a load
 *     reserves it before it runs, under the mutex); p->planned is the sum
 *     of bytes over the entries;
 *   - each load ends once, as a success or a failure: attempt == loads +
 *     load_failures (waiters tell their attempt's end by it); loads ==
 *     unloads + 1 while LOADED or UNLOADING, == unloads otherwise;
 *   - evictions and reclaims are counted as their unload starts, so
 *     evictions + reclaims <= unloads, + 1 while UNLOADING;
 *   - last_status is SL_OK exactly when last_err is empty. */
static bool pool_entry_sanity(const sl_pool_t *p, int i) {
  const entry *x = &p->e[i];
  if (!x->name || !x->path || x->n_alias < 0 || x->n_alias > MAX_ALIASES)
    return false;
  for (int k = 0; k < x->n_alias; k++)
    if (!x->alias[k])
      return false;
  bool loaded = x->state == SL_POOL_LOADED;
  bool holds = loaded || x->state == SL_POOL_UNLOADING; /* a load's result */
  if (x->refs < 0 || (x->refs > 0 && !loaded && !p->stopping))
    return false;
  if (loaded != (x->model != NULL) || loaded != (x->tok != NULL) ||
      loaded != (x->engine != NULL) || (!loaded && x->chat_template))
    return false;
  if (holds != (x->n_ctx > 0))
    return false;
  if ((x->state == SL_POOL_UNLOADED && x->bytes) || (holds && !x->bytes))
    return false;
  if (x->attempt != x->loads + x->load_failures ||
      x->loads != x->unloads + (holds ? 1 : 0))
    return false;
  if (x->evictions + x->reclaims >
      x->unloads + (x->state == SL_POOL_UNLOADING ? 1 : 0))
    return false;
  return (x->last_status == SL_OK) == (x->last_err[0] == 0);
}

/* Every entry's invariants, and the budget: planned is their bytes. */
static bool pool_sanity(const sl_pool_t *p) {
  uint64_t sum = 0;
  for (int i = 0; i < p->n; i++) {
    if (!pool_entry_sanity(p, i))
      return false;
    sum += p->e[i].bytes;
  }
  return sum == p->planned;
}

static int find_locked(sl_pool_t *p, const char *name) {
  if (!name)
    return -1;
  for (int i = 0; i < p->n; i++) {
    if (!strcmp(p->e[i].name, name))
      return i;
    for (int k = 0; k < p->e[i].n_alias; k++)
      if (!strcmp(p->e[i].alias[k], name))
        return i;
  }
  return -1;
}

/* A stage of a load or unload, to cfg.on_stage. */
static void stage(sl_pool_t *p, const char *model, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void stage(sl_pool_t *p, const char *model, const char *fmt, ...) {
  if (!p->cfg.on_stage)
    return;
  char buf[320];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  p->cfg.on_stage(p->cfg.stage_ud, model, buf);
}

/* Frees what a loaded (or half-loaded) entry holds. The engine first: its
 * executor drains and clears its own stream (the shutdown site) before the
 * weights it read are unmapped. Called without the mutex. */
static void drop_loaded(sl_model_t *m, sl_tokenizer_t *t, sl_engine_t *eng,
                        char *tmpl) {
  sl_engine_free(eng);
  sl_tokenizer_free(t);
  sl_model_free(m);
  sl_free(tmpl);
}

/* Unloads entry i, which is LOADED with no lease; the mutex is held on
 * entry and on return, released meanwhile. */
static void unload_locked(sl_pool_t *p, int i, const char *why) {
  entry *x = &p->e[i];
  x->state = SL_POOL_UNLOADING;
  sl_model_t *m = x->model;
  sl_tokenizer_t *t = x->tok;
  sl_engine_t *eng = x->engine;
  char *tmpl = x->chat_template;
  x->model = NULL;
  x->tok = NULL;
  x->engine = NULL;
  x->chat_template = NULL;
  SL_ASSERT(pool_sanity(p));
  char name[128];
  snprintf(name, sizeof name, "%s", x->name);
  pthread_mutex_unlock(&p->mu);
  uint64_t t0 = sl_now_ns();
  stage(p, name, "unloading (%s)", why);
  drop_loaded(m, t, eng, tmpl);
  stage(p, name, "unloaded in %.1f ms", (double)(sl_now_ns() - t0) / 1e6);
  pthread_mutex_lock(&p->mu);
  x = &p->e[i];
  p->planned -= x->bytes;
  x->bytes = 0;
  x->state = SL_POOL_UNLOADED;
  x->unloads++;
  x->n_ctx = 0;
  SL_ASSERT(pool_sanity(p));
  pthread_cond_broadcast(&p->cv);
}

/* The least recently used loaded entry that nobody leases and that is not
 * pinned, other than `self`; -1 if none. */
static int lru_victim(sl_pool_t *p, int self) {
  int best = -1;
  for (int i = 0; i < p->n; i++) {
    entry *x = &p->e[i];
    if (i == self || x->state != SL_POOL_LOADED || x->refs > 0 || x->pinned)
      continue;
    if (best < 0 || x->last_used_ns < p->e[best].last_used_ns)
      best = i;
  }
  return best;
}

static bool busy_state(sl_pool_state s) {
  return s == SL_POOL_LOADING || s == SL_POOL_UNLOADING;
}

/* Loads entry i (UNLOADED; the mutex held on entry and on return). On
 * failure the entry is UNLOADED again and last_status / last_err say why. */
static sl_status load_locked(sl_pool_t *p, int i) {
  entry *x = &p->e[i];
  x->state = SL_POOL_LOADING;
  char path[PATH_MAX], name[128], err[512] = "";
  snprintf(path, sizeof path, "%s", x->path);
  snprintf(name, sizeof name, "%s", x->name);
  sl_engine_config ecfg = p->cfg.engine;
  ecfg.max_memory = p->cfg.max_memory;
  ecfg.ssd_cache_dir = x->ssd_dir;
  pthread_mutex_unlock(&p->mu);

  uint64_t t0 = sl_now_ns();
  sl_status st = SL_OK;
  sl_tokenizer_t *tok = NULL;
  sl_engine_t *eng = NULL;
  char *tmpl = NULL;
  uint64_t plan = 0;
  bool reserved = false;
  stage(p, name, "loading %s", path);
  /* SLUICE_POOL_LOAD_DELAY_MS: a load that takes this much longer (tests
   * watch what a running load looks like from outside) */
  const char *dly = getenv("SLUICE_POOL_LOAD_DELAY_MS");
  long delay_ms = 0;
  if (dly && sl_parse_long(dly, 0, 600000, &delay_ms) && delay_ms > 0)
    usleep((useconds_t)delay_ms * 1000u);
  sl_model_t *m = sl_model_load(path, &st, err, sizeof err);
  if (!m)
    goto fail;
  const sl_model_hparams *hp = sl_model_hparams_of(m);
  if (!p->cfg.n_ctx_fixed && hp->n_ctx_train > 0) {
    /* the model's training context, as llama-server; the KV pool still
     * holds max_seqs sequences of the configured context (and always one
     * whole context), and the context is bounded by what the pool holds
     * under the memory budget */
    int64_t train = hp->n_ctx_train < (1 << 20) ? hp->n_ctx_train : 1 << 20;
    if (train > ecfg.n_ctx && ecfg.kv_blocks <= 0)
      ecfg.kv_seq_tokens = ecfg.n_ctx;
    ecfg.n_ctx = (int)train;
    int64_t room = sl_engine_plan_kv_tokens(m, &ecfg);
    if (room < ecfg.n_ctx)
      ecfg.n_ctx = (int)(room > 16 ? room : 16);
  }
  /* the weights and one prefill chunk's activations must fit; a model
   * with others loaded must fit with its KV pool and hot tier too (alone,
   * its requests' KV is held within the budget by the engine's memory
   * guard, as in a one-model server) */
  uint64_t act = sl_batch_activation_bytes(m, ecfg.prefill_chunk);
  uint64_t core = sl_model_weight_bytes(m) + act;
  plan = sl_engine_plan_bytes(m, &ecfg) + act;
  stage(p, name,
        "mapped: %s, %.1f MiB of weights; plans %.1f MiB with its KV cache "
        "and activations, context %d",
        sl_arch_name(hp->arch), (double)sl_model_weight_bytes(m) / (1 << 20),
        (double)plan / (1 << 20), ecfg.n_ctx);

  /* room: unload idle models, least recently used first */
  pthread_mutex_lock(&p->mu);
  for (;;) {
    uint64_t budget = p->cfg.max_memory;
    if (!budget || p->planned + plan <= budget ||
        (p->planned == 0 && core <= budget)) {
      p->planned += plan;
      p->e[i].bytes = plan;
      reserved = true;
      SL_ASSERT(pool_sanity(p));
      break;
    }
    int v = lru_victim(p, i);
    if (v >= 0) {
      p->e[v].evictions++;
      stage(p, name, "making room: unloading %s, the least recently used",
            p->e[v].name);
      unload_locked(p, v, "evicted to make room");
      continue;
    }
    /* a load or unload under way may change the picture: wait it out */
    bool pending = false;
    for (int k = 0; k < p->n; k++)
      if (k != i && busy_state(p->e[k].state))
        pending = true;
    if (pending) {
      pthread_cond_wait(&p->cv, &p->mu);
      continue;
    }
    if (p->planned == 0)
      snprintf(err, sizeof err,
               "model '%s' needs %.1f MiB for its weights and activations, "
               "more than the %.1f MiB memory budget (--max-memory)",
               name, (double)core / (1 << 20), (double)budget / (1 << 20));
    else
      snprintf(err, sizeof err,
               "model '%s' needs %.1f MiB, and %.1f MiB of the %.1f MiB "
               "memory budget (--max-memory) are held by models that are "
               "pinned or serving requests",
               name, (double)plan / (1 << 20), (double)p->planned / (1 << 20),
               (double)budget / (1 << 20));
    st = SL_ERR_MEMORY_LIMIT;
    break;
  }
  pthread_mutex_unlock(&p->mu);
  if (!reserved)
    goto fail;

  if (p->cfg.prefault &&
      (ecfg.device == SL_ENGINE_DEVICE_CPU || !sl_cuda_available())) {
    stage(p, name, "reading the weights");
    sl_model_prefault(m, p->cfg.progress);
  }
  if ((st = sl_tokenizer_load(sl_model_gguf(m), &tok, err, sizeof err)) !=
      SL_OK)
    goto fail;
  sl_str ts;
  if (sl_gguf_get_str(sl_model_gguf(m), "tokenizer.chat_template", &ts)) {
    if (!(tmpl = sl_malloc(ts.len + 1))) {
      st = SL_ERR_NOMEM;
      snprintf(err, sizeof err, "out of memory");
      goto fail;
    }
    memcpy(tmpl, ts.ptr, ts.len);
    tmpl[ts.len] = 0;
  }
  stage(p, name, "starting its engine (KV cache, repacked weights)");
  char why[320];
  if ((st = sl_engine_create2(m, tok, &ecfg, &eng, why, sizeof why)) != SL_OK) {
    snprintf(err, sizeof err, "cannot start the engine: %s",
             why[0] ? why : sl_status_str(st));
    goto fail;
  }
  double ms = (double)(sl_now_ns() - t0) / 1e6;
  stage(p, name, "loaded in %.1f ms on %s", ms, sl_engine_device_name(eng));
  pthread_mutex_lock(&p->mu);
  x = &p->e[i];
  x->model = m;
  x->tok = tok;
  x->engine = eng;
  x->chat_template = tmpl;
  x->n_ctx = ecfg.n_ctx;
  x->state = SL_POOL_LOADED;
  x->loads++;
  x->last_load_ms = ms;
  x->last_used_ns = sl_now_ns();
  x->last_status = SL_OK;
  x->last_err[0] = 0;
  x->attempt++;
  SL_ASSERT(pool_sanity(p));
  pthread_cond_broadcast(&p->cv);
  return SL_OK;

fail:
  drop_loaded(m, tok, eng, tmpl);
  SL_LOGW("pool: cannot load %s: %s", name, err);
  stage(p, name, "load failed: %s", err);
  pthread_mutex_lock(&p->mu);
  x = &p->e[i];
  if (reserved) {
    p->planned -= x->bytes;
    x->bytes = 0;
  }
  x->state = SL_POOL_UNLOADED;
  x->load_failures++;
  x->last_status = st != SL_OK ? st : SL_ERR_STATE;
  snprintf(x->last_err, sizeof x->last_err, "%s",
           err[0] ? err : sl_status_str(x->last_status));
  x->attempt++;
  SL_ASSERT(pool_sanity(p));
  pthread_cond_broadcast(&p->cv);
  return x->last_status;
}

/* A lease of entry i (LOADED; mutex held). A request counts and makes the
 * model recently used; a look (`request` false: a stats snapshot, the
 * pool's own load) does neither, so that an open dashboard keeps no model
 * from the TTL or the LRU. */
static void fill_lease(sl_pool_t *p, int i, sl_pool_lease *out, bool request) {
  entry *x = &p->e[i];
  x->refs++;
  if (request) {
    x->requests++;
    x->last_used_ns = sl_now_ns();
  }
  out->look = !request;
  out->engine = x->engine;
  out->model = x->model;
  out->tok = x->tok;
  out->name = x->name;
  out->chat_template = x->chat_template;
  out->n_ctx = x->n_ctx;
  out->index = i;
  SL_ASSERT(pool_entry_sanity(p, i));
}

/* Locks the pool and finds `name`: its index with the mutex held, or -1
 * with it released and err saying so. */
static int lock_find(sl_pool_t *p, const char *name, char *err, size_t errcap) {
  pthread_mutex_lock(&p->mu);
  int i = find_locked(p, name);
  if (i < 0) {
    pthread_mutex_unlock(&p->mu);
    snprintf(err, errcap, "the model '%s' does not exist", name ? name : "");
  }
  return i;
}

static sl_status acquire(sl_pool_t *p, const char *name, sl_pool_lease *out,
                         char *err, size_t errcap, bool request) {
  memset(out, 0, sizeof *out);
  out->index = -1;
  int i = lock_find(p, name, err, errcap);
  if (i < 0)
    return SL_ERR_NOT_FOUND;
  uint64_t waited_for = 0;
  bool waited = false;
  for (;;) {
    entry *x = &p->e[i];
    if (p->stopping) {
      pthread_mutex_unlock(&p->mu);
      snprintf(err, errcap, "the server is shutting down");
      return SL_ERR_CANCELLED;
    }
    if (x->state == SL_POOL_LOADED) {
      fill_lease(p, i, out, request);
      pthread_mutex_unlock(&p->mu);
      return SL_OK;
    }
    if (waited && x->state == SL_POOL_UNLOADED && x->attempt != waited_for &&
        x->last_status != SL_OK) {
      /* the load this caller waited for failed: share its result */
      sl_status st = x->last_status;
      snprintf(err, errcap, "%s", x->last_err);
      pthread_mutex_unlock(&p->mu);
      return st;
    }
    if (busy_state(x->state)) {
      if (x->state == SL_POOL_LOADING && !waited) {
        waited = true;
        waited_for = x->attempt;
      }
      pthread_cond_wait(&p->cv, &p->mu);
      continue;
    }
    sl_status st = load_locked(p, i);
    if (st != SL_OK) {
      snprintf(err, errcap, "%s", p->e[i].last_err);
      pthread_mutex_unlock(&p->mu);
      return st;
    }
  }
}

sl_status sl_pool_acquire(sl_pool_t *p, const char *name, sl_pool_lease *out,
                          char *err, size_t errcap) {
  return acquire(p, name, out, err, errcap, true);
}

bool sl_pool_acquire_loaded(sl_pool_t *p, int i, sl_pool_lease *out) {
  memset(out, 0, sizeof *out);
  out->index = -1;
  pthread_mutex_lock(&p->mu);
  bool ok = i >= 0 && i < p->n && p->e[i].state == SL_POOL_LOADED;
  if (ok)
    fill_lease(p, i, out, false);
  pthread_mutex_unlock(&p->mu);
  return ok;
}

void sl_pool_release(sl_pool_t *p, sl_pool_lease *l) {
  if (!p || !l || l->index < 0)
    return;
  pthread_mutex_lock(&p->mu);
  entry *x = &p->e[l->index];
  x->refs--;
  if (!l->look)
    x->last_used_ns = sl_now_ns();
  SL_ASSERT(pool_entry_sanity(p, l->index));
  if (x->refs == 0)
    pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  memset(l, 0, sizeof *l);
  l->index = -1;
}

sl_status sl_pool_load(sl_pool_t *p, const char *name, char *err,
                       size_t errcap) {
  sl_pool_lease l;
  sl_status st = acquire(p, name, &l, err, errcap, false);
  if (st == SL_OK)
    sl_pool_release(p, &l);
  return st;
}

sl_status sl_pool_unload(sl_pool_t *p, const char *name, char *err,
                         size_t errcap) {
  int i = lock_find(p, name, err, errcap);
  if (i < 0)
    return SL_ERR_NOT_FOUND;
  while (busy_state(p->e[i].state))
    pthread_cond_wait(&p->cv, &p->mu);
  entry *x = &p->e[i];
  sl_status st = SL_OK;
  if (x->state == SL_POOL_LOADED) {
    if (x->pinned) {
      snprintf(err, errcap, "the model '%s' is pinned; unpin it first",
               x->name);
      st = SL_ERR_STATE;
    } else if (x->refs > 0) {
      snprintf(err, errcap, "the model '%s' is serving %d request(s)", x->name,
               x->refs);
      st = SL_ERR_STATE;
    } else {
      unload_locked(p, i, "asked to");
    }
  }
  pthread_mutex_unlock(&p->mu);
  return st;
}

/* The idle TTL: unloads loaded, unleased, unpinned models idle too long. */
static void *reaper_main(void *arg) {
  sl_pool_t *p = arg;
  pthread_mutex_lock(&p->mu);
  while (!p->stopping) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns =
        (uint64_t)ts.tv_nsec + (uint64_t)p->cfg.reap_tick_ms * 1000000u;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    if (p->stopping)
      break;
    uint64_t now = sl_now_ns(), ttl = (uint64_t)p->cfg.idle_ttl_s * 1000000000u;
    for (int i = 0; i < p->n; i++) {
      entry *x = &p->e[i];
      if (x->state == SL_POOL_LOADED && x->refs == 0 && !x->pinned &&
          now - x->last_used_ns >= ttl) {
        x->reclaims++;
        unload_locked(p, i, "idle past --idle-ttl");
      }
    }
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

sl_status sl_pool_create(const sl_pool_config *cfg, sl_pool_t **out) {
  *out = NULL;
  if (!cfg)
    return SL_ERR_INVALID_ARG;
  sl_pool_t *p = sl_calloc(1, sizeof *p);
  if (!p)
    return SL_ERR_NOMEM;
  p->cfg = *cfg;
  if (!p->cfg.reap_tick_ms)
    p->cfg.reap_tick_ms = 1000;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  if (p->cfg.idle_ttl_s) {
    if (pthread_create(&p->reaper, NULL, reaper_main, p) != 0) {
      pthread_cond_destroy(&p->cv);
      pthread_mutex_destroy(&p->mu);
      sl_free(p);
      return SL_ERR_THREAD;
    }
    p->reaper_started = true;
  }
  *out = p;
  return SL_OK;
}

void sl_pool_free(sl_pool_t *p) {
  if (!p)
    return;
  pthread_mutex_lock(&p->mu);
  p->stopping = true;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (p->reaper_started)
    pthread_join(p->reaper, NULL);
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < p->n; i++) {
    while (busy_state(p->e[i].state))
      pthread_cond_wait(&p->cv, &p->mu);
    if (p->e[i].state == SL_POOL_LOADED) {
      if (p->e[i].refs)
        SL_LOGW("pool: %s freed with %d lease(s) held", p->e[i].name,
                p->e[i].refs);
      unload_locked(p, i, "shutting down");
    }
  }
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n; i++) {
    sl_free(p->e[i].name);
    sl_free(p->e[i].path);
    for (int k = 0; k < p->e[i].n_alias; k++)
      sl_free(p->e[i].alias[k]);
    sl_free(p->e[i].ssd_dir);
  }
  sl_free(p->e);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  sl_free(p);
}

/* The entry's SSD tier folder: the configured one when the pool serves one
 * model (the layout of a single-model server), else a subfolder per model,
 * made on first use. Called as the second entry is added, for both. */
static sl_status ssd_dirs(sl_pool_t *p, char *err, size_t errcap) {
  const char *base = p->cfg.engine.ssd_cache_dir;
  if (!base || !base[0])
    return SL_OK;
  for (int i = 0; i < p->n; i++) {
    entry *x = &p->e[i];
    sl_free(x->ssd_dir);
    x->ssd_dir = NULL;
    size_t n = strlen(base) + strlen(x->name) + 2;
    if (!(x->ssd_dir = sl_malloc(n))) {
      snprintf(err, errcap, "out of memory");
      return SL_ERR_NOMEM;
    }
    if (p->n == 1)
      snprintf(x->ssd_dir, n, "%s", base);
    else {
      snprintf(x->ssd_dir, n, "%s/%s", base, x->name);
      struct stat sb;
      if (stat(base, &sb) == 0 && mkdir(x->ssd_dir, 0755) != 0 &&
          errno != EEXIST && !p->cfg.engine.ssd_cache_optional) {
        snprintf(err, errcap, "cannot make the SSD cache folder %s: %s",
                 x->ssd_dir, strerror(errno));
        return SL_ERR_IO;
      }
    }
  }
  return SL_OK;
}

sl_status sl_pool_add(sl_pool_t *p, const char *name, const char *path,
                      char *err, size_t errcap) {
  if (!name || !name[0] || !path || strchr(name, '/')) {
    snprintf(err, errcap, "a model needs a name (without '/') and a path");
    return SL_ERR_INVALID_ARG;
  }
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    snprintf(err, errcap, "cannot open '%s': %s", path,
             errno ? strerror(errno) : "not a file");
    return SL_ERR_IO;
  }
  pthread_mutex_lock(&p->mu);
  sl_status st = SL_OK;
  if (find_locked(p, name) >= 0) {
    snprintf(err, errcap, "the model name '%s' is taken", name);
    st = SL_ERR_INVALID_ARG;
    goto out;
  }
  if (p->n == p->cap) {
    int cap = p->cap ? p->cap * 2 : 8;
    entry *ne = sl_realloc(p->e, (size_t)cap * sizeof *ne);
    if (!ne) {
      st = SL_ERR_NOMEM;
      snprintf(err, errcap, "out of memory");
      goto out;
    }
    p->e = ne;
    p->cap = cap;
  }
  entry *x = &p->e[p->n];
  memset(x, 0, sizeof *x);
  x->name = sl_strdup(name);
  x->path = sl_strdup(path);
  x->file_bytes = (uint64_t)sb.st_size;
  if (!x->name || !x->path) {
    sl_free(x->name);
    sl_free(x->path);
    st = SL_ERR_NOMEM;
    snprintf(err, errcap, "out of memory");
    goto out;
  }
  p->n++;
  SL_ASSERT(pool_sanity(p));
  st = ssd_dirs(p, err, errcap);
out:
  pthread_mutex_unlock(&p->mu);
  return st;
}

sl_status sl_pool_add_alias(sl_pool_t *p, const char *alias, const char *name,
                            char *err, size_t errcap) {
  pthread_mutex_lock(&p->mu);
  sl_status st = SL_OK;
  int i = find_locked(p, name);
  if (i < 0) {
    snprintf(err, errcap, "no model is named '%s'", name ? name : "");
    st = SL_ERR_NOT_FOUND;
  } else if (!alias || !alias[0] || strchr(alias, '/') ||
             find_locked(p, alias) >= 0 || p->e[i].n_alias == MAX_ALIASES) {
    snprintf(err, errcap,
             "the alias '%s' is taken, empty, has a '/', or is one too many",
             alias ? alias : "");
    st = SL_ERR_INVALID_ARG;
  } else if (!(p->e[i].alias[p->e[i].n_alias] = sl_strdup(alias))) {
    snprintf(err, errcap, "out of memory");
    st = SL_ERR_NOMEM;
  } else {
    p->e[i].n_alias++;
  }
  pthread_mutex_unlock(&p->mu);
  return st;
}

sl_status sl_pool_set_pinned(sl_pool_t *p, const char *name, bool pinned) {
  pthread_mutex_lock(&p->mu);
  int i = find_locked(p, name);
  if (i >= 0)
    p->e[i].pinned = pinned;
  pthread_mutex_unlock(&p->mu);
  return i >= 0 ? SL_OK : SL_ERR_NOT_FOUND;
}

int sl_pool_count(sl_pool_t *p) {
  pthread_mutex_lock(&p->mu);
  int n = p->n;
  pthread_mutex_unlock(&p->mu);
  return n;
}

int sl_pool_loaded_count(sl_pool_t *p) {
  pthread_mutex_lock(&p->mu);
  int n = 0;
  for (int i = 0; i < p->n; i++)
    n += p->e[i].state == SL_POOL_LOADED;
  pthread_mutex_unlock(&p->mu);
  return n;
}

int sl_pool_find(sl_pool_t *p, const char *name) {
  pthread_mutex_lock(&p->mu);
  int i = find_locked(p, name);
  pthread_mutex_unlock(&p->mu);
  return i;
}

bool sl_pool_info_at(sl_pool_t *p, int i, sl_pool_info *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&p->mu);
  bool ok = i >= 0 && i < p->n;
  if (ok) {
    entry *x = &p->e[i];
    out->name = x->name;
    out->path = x->path;
    out->n_aliases = x->n_alias;
    for (int k = 0; k < x->n_alias; k++)
      out->aliases[k] = x->alias[k];
    out->state = x->state;
    out->pinned = x->pinned;
    out->file_bytes = x->file_bytes;
    out->bytes = x->bytes;
    out->in_use = x->refs;
    out->requests = x->requests;
    out->loads = x->loads;
    out->unloads = x->unloads;
    out->evictions = x->evictions;
    out->reclaims = x->reclaims;
    out->load_failures = x->load_failures;
    out->last_load_ms = x->last_load_ms;
    if (x->state == SL_POOL_LOADED) {
      out->idle_s =
          x->refs ? 0.0 : (double)(sl_now_ns() - x->last_used_ns) / 1e9;
      out->n_ctx = x->n_ctx;
      out->arch = sl_arch_name(sl_model_hparams_of(x->model)->arch);
    }
  }
  pthread_mutex_unlock(&p->mu);
  return ok;
}

uint64_t sl_pool_planned_bytes(sl_pool_t *p) {
  pthread_mutex_lock(&p->mu);
  uint64_t b = p->planned;
  pthread_mutex_unlock(&p->mu);
  return b;
}
