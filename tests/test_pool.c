/* The engine pool's clear sites and its engines' isolation (issue 13):
 *   - load (engine.load), unload and TTL reclaim (engine.shutdown), idle
 *     reclaim (engine.idle_reclaim), KV eviction (kv.eviction) and the
 *     admin's clear (admin.clear_cache): each is
 *     reached with real work queued on the engine's stream just before the
 *     clear, and each clear left nothing of that stream in flight;
 *   - an engine whose stream is held busy (a task that blocks until the
 *     test lets it go, inside that engine's own clear) does not hold up
 *     another engine's load, requests, clears or unload, and nothing is
 *     submitted to the busy stream meanwhile;
 *   - load on demand, LRU eviction under a budget, pinning, one shared load
 *     for concurrent first leases, and a load that cannot fit. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_impl.h"
#include "engine_util.h"
#include "harness.h"
#include "sluice/kern.h"
#include "sluice/memsync.h"
#include "sluice/pool.h"
#include "sluice/util.h"

static char g_path[4096];

/* ---- hooks: real work before each clear, and the evidence after it ---- */

typedef struct site_rec {
  _Atomic int reached, with_work;
  _Atomic uint64_t pending_max, inflight_max; /* at the clear */
} site_rec;

static site_rec g_sites[SL__SITE_COUNT];
static _Atomic int g_work_failures;

/* the gate: one stream's next clear site queues a task that blocks there */
static pthread_mutex_t g_gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_cv = PTHREAD_COND_INITIALIZER;
static sl_stream_t *_Atomic g_gate_stream; /* armed for this stream */
static bool g_gate_entered, g_gate_open;

static sl_status gate_task(const sl_task_ctx *ctx, void *p) {
  (void)ctx;
  (void)p;
  pthread_mutex_lock(&g_gate_mu);
  g_gate_entered = true;
  pthread_cond_broadcast(&g_gate_cv);
  while (!g_gate_open)
    pthread_cond_wait(&g_gate_cv, &g_gate_mu);
  pthread_mutex_unlock(&g_gate_mu);
  return SL_OK;
}

typedef struct hold_arg {
  sl_buf_t *b;
  double ms;
} hold_arg;

static sl_status hold_task(const sl_task_ctx *ctx, void *p) {
  (void)ctx;
  hold_arg *a = p;
  ((volatile float *)sl_buf_ptr(a->b))[0] = 1.0f;
  usleep((useconds_t)(a->ms * 1000));
  return SL_OK;
}

static void before_clear(void *ud, sl_stream_t *s, sl__clear_site site) {
  (void)ud;
  sl_stream_t *armed = s;
  if (atomic_compare_exchange_strong(&g_gate_stream, &armed, NULL)) {
    if (sl_stream_submit(s, gate_task, NULL, 0, NULL, 0, NULL) != SL_OK)
      atomic_fetch_add(&g_work_failures, 1);
    return;
  }
  int n = 96;
  size_t bytes = (size_t)n * (size_t)n * 4;
  sl_buf_t *a = NULL, *b = NULL, *c = NULL;
  if (sl_buf_alloc(s, bytes, &a) != SL_OK ||
      sl_buf_alloc(s, bytes, &b) != SL_OK ||
      sl_buf_alloc(s, bytes, &c) != SL_OK) {
    atomic_fetch_add(&g_work_failures, 1);
    sl_buf_release(a);
    sl_buf_release(b);
    return;
  }
  hold_arg h = {a, 2.0};
  if (sl_stream_submit(s, hold_task, &h, sizeof h, &a, 1, NULL) != SL_OK)
    atomic_fetch_add(&g_work_failures, 1);
  for (int i = 0; i < 8; i++)
    if (sl_kern_sgemm(s, a, i % 2 ? c : b, i % 2 ? b : c, n, n, n, 1.0f) !=
        SL_OK)
      atomic_fetch_add(&g_work_failures, 1);
  if (sl_stream_query(s).tasks > 0)
    atomic_fetch_add(&g_sites[site].with_work, 1);
  sl_buf_release(a); /* RETIRING until the products are done */
  sl_buf_release(b);
  sl_buf_release(c);
}

static void after_clear(void *ud, sl_stream_t *s, sl__clear_site site,
                        const sl__site_stats *now) {
  (void)ud;
  (void)s;
  site_rec *r = &g_sites[site];
  atomic_fetch_add(&r->reached, 1);
  if (now->engine_pending_max > atomic_load(&r->pending_max))
    atomic_store(&r->pending_max, now->engine_pending_max);
  if (now->inflight_bytes_max > atomic_load(&r->inflight_max))
    atomic_store(&r->inflight_max, now->inflight_bytes_max);
}

static void check_site(sl__clear_site site) {
  site_rec *r = &g_sites[site];
  const char *name = sl__clear_site_name(site);
  CHECK_MSG(atomic_load(&r->reached) > 0, "site %s never reached", name);
  CHECK_MSG(atomic_load(&r->with_work) > 0,
            "site %s never reached with work queued", name);
  CHECK_MSG(atomic_load(&r->pending_max) == 0,
            "site %s: %llu engine tasks pending at the clear", name,
            (unsigned long long)atomic_load(&r->pending_max));
  CHECK_MSG(atomic_load(&r->inflight_max) == 0,
            "site %s: %llu bytes in flight at the clear", name,
            (unsigned long long)atomic_load(&r->inflight_max));
  fprintf(stderr,
          "  site %-22s reached %d time(s), %d with work queued; at the "
          "clear: %llu tasks pending, %llu bytes in flight\n",
          name, atomic_load(&r->reached), atomic_load(&r->with_work),
          (unsigned long long)atomic_load(&r->pending_max),
          (unsigned long long)atomic_load(&r->inflight_max));
}

/* ---- helpers ------------------------------------------------------------ */

static sl_pool_config small_config(void) {
  sl_pool_config pc = sl_pool_config_defaults();
  pc.engine.n_ctx = 512;
  pc.n_ctx_fixed = true;
  pc.engine.max_seqs = 2;
  pc.engine.max_batched_tokens = 64;
  pc.engine.prefill_chunk = 32;
  pc.engine.kv_block_tokens = 16;
  pc.engine.clear_every_tokens = 8;
  pc.engine.n_threads = 1;
  return pc;
}

static sl_pool_t *make_pool(const sl_pool_config *pc, int n) {
  sl_pool_t *p = NULL;
  CHECK_OK(sl_pool_create(pc, &p));
  char err[256], name[16];
  for (int i = 0; p && i < n; i++) {
    snprintf(name, sizeof name, "m%d", i);
    CHECK_OK(sl_pool_add(p, name, g_path, err, sizeof err));
  }
  return p;
}

static sl_pool_info info(sl_pool_t *p, const char *name) {
  sl_pool_info in;
  sl_pool_info_at(p, sl_pool_find(p, name), &in);
  return in;
}

/* Runs `max` greedy tokens of `text` on the leased model; returns the count
 * (its tokens in out[0..)). */
static int generate(const sl_pool_lease *l, const char *text, int max,
                    int32_t *out) {
  int32_t *ids;
  int n = engine_tokenize(l->tok, text, &ids);
  result r;
  result_init(&r);
  sl_gen_params gp = greedy(max);
  CHECK_OK(sl_engine_submit(l->engine, ids, n, &gp, on_event, &r, NULL));
  result_wait(&r);
  CHECK(r.finish == SL_FINISH_LENGTH);
  if (out)
    memcpy(out, r.toks, sizeof *out * (size_t)r.n);
  sl_free(ids);
  return r.n;
}

static const char *TEXTS[] = {
    "The quick brown fox jumps over the lazy dog near the river bank while "
    "the sun sets behind the hills, and the birds fly home.",
    "In the beginning the universe was created. This has made a lot of "
    "people very angry and been widely regarded as a bad move.",
    "It was the best of times, it was the worst of times, it was the age of "
    "wisdom, it was the age of foolishness, it was the epoch of belief.",
    "Call me Ishmael. Some years ago, never mind how long precisely, having "
    "little or no money in my purse, and nothing particular to interest me.",
};

/* ---- the tests ---------------------------------------------------------- */

static void test_pool_clear_sites(void) {
  sl_pool_config pc = small_config();
  pc.engine.kv_blocks = 24; /* room for a few prompts: later ones evict */
  pc.idle_ttl_s = 1;
  pc.reap_tick_ms = 50;
  sl_pool_t *p = make_pool(&pc, 2);
  sl_pool_lease l;
  char err[256];
  CHECK_OK(sl_pool_acquire(p, "m0", &l, err, sizeof err));
  /* different prompts, each published into the prefix cache, until the
   * pool must evict cached blocks */
  int rounds = SL_TEST_SANITIZED ? 6 : 10;
  for (int i = 0; i < rounds; i++) {
    char text[512];
    snprintf(text, sizeof text, "%d. %s %s", i, TEXTS[i % 4],
             TEXTS[(i + 1) % 4]);
    CHECK_EQ_INT(generate(&l, text, 20, NULL), 20);
  }
  CHECK_OK(sl_engine_clear_cache(l.engine)); /* the admin's clear */
  sl_pool_release(p, &l);
  usleep(200000); /* the engine's idle clear */
  /* the idle TTL unloads it (its executor's shutdown clear) */
  uint64_t t0 = sl_now_ns();
  while (info(p, "m0").state != SL_POOL_UNLOADED &&
         sl_now_ns() - t0 < 30000000000ull)
    usleep(20000);
  CHECK(info(p, "m0").state == SL_POOL_UNLOADED);
  CHECK_EQ_INT((int)info(p, "m0").reclaims, 1);
  /* and an unload asked for */
  CHECK_OK(sl_pool_load(p, "m1", err, sizeof err));
  CHECK_OK(sl_pool_unload(p, "m1", err, sizeof err));
  CHECK(info(p, "m1").state == SL_POOL_UNLOADED);
  CHECK_EQ_INT(atomic_load(&g_work_failures), 0);
  check_site(SL__SITE_LOAD);
  check_site(SL__SITE_SHUTDOWN);
  check_site(SL__SITE_IDLE);
  check_site(SL__SITE_KV_EVICT);
  check_site(SL__SITE_PREFILL_END);
  check_site(SL__SITE_DECODE_EVERY_N);
  check_site(SL__SITE_ADMIN);
  sl_pool_free(p);
}

typedef struct other_args {
  sl_pool_t *p;
  _Atomic bool done;
  int ok;
  int32_t toks[2][24];
} other_args;

/* Another engine's whole life: load, two requests, unload; then a third
 * engine loads and is unloaded. */
static void *other_engines(void *arg) {
  other_args *a = arg;
  char err[256];
  sl_pool_lease l;
  for (int k = 0; k < 2; k++) {
    const char *name = k ? "m2" : "m1";
    if (sl_pool_acquire(a->p, name, &l, err, sizeof err) != SL_OK)
      break;
    int n = generate(&l, TEXTS[1], 24, a->toks[k]);
    sl_pool_release(a->p, &l);
    if (n != 24 || sl_pool_unload(a->p, name, err, sizeof err) != SL_OK)
      break;
    a->ok++;
  }
  atomic_store(&a->done, true);
  return NULL;
}

static void test_busy_engine_holds_up_no_other(void) {
  sl_pool_config pc = small_config();
  sl_pool_t *p = make_pool(&pc, 3);
  char err[256];
  sl_pool_lease a;
  CHECK_OK(sl_pool_acquire(p, "m0", &a, err, sizeof err));
  /* m0's reference text, before the gate */
  int32_t ref[24];
  CHECK_EQ_INT(generate(&a, TEXTS[1], 24, ref), 24);
  /* m0's next clear finds a task on its stream that blocks until opened:
   * m0's executor waits in its own clear, its stream busy */
  sl_stream_t *s0 = a.engine ? a.engine->stream : NULL;
  CHECK(s0 != NULL);
  pthread_mutex_lock(&g_gate_mu);
  g_gate_entered = g_gate_open = false;
  pthread_mutex_unlock(&g_gate_mu);
  atomic_store(&g_gate_stream, s0);
  int32_t *ids;
  int n = engine_tokenize(a.tok, TEXTS[0], &ids);
  result r;
  result_init(&r);
  sl_gen_params gp = greedy(24);
  CHECK_OK(sl_engine_submit(a.engine, ids, n, &gp, on_event, &r, NULL));
  pthread_mutex_lock(&g_gate_mu);
  while (!g_gate_entered)
    pthread_cond_wait(&g_gate_cv, &g_gate_mu);
  pthread_mutex_unlock(&g_gate_mu);
  uint64_t busy_tasks = sl_stream_query(s0).tasks;
  CHECK(busy_tasks >= 1);
  /* meanwhile two other engines live their whole lives */
  other_args oa = {.p = p};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, other_engines, &oa) == 0);
  uint64_t t0 = sl_now_ns();
  uint64_t limit = (SL_TEST_TSAN ? 300ull : 25ull) * 1000000000ull;
  while (!atomic_load(&oa.done) && sl_now_ns() - t0 < limit)
    usleep(10000);
  bool finished = atomic_load(&oa.done);
  CHECK_MSG(finished,
            "another engine's load, requests or unload waited for the busy "
            "engine's stream");
  CHECK_EQ_INT(oa.ok, 2);
  /* nothing was submitted to the busy stream by them */
  CHECK_EQ_INT((int)sl_stream_query(s0).tasks, (int)busy_tasks);
  for (int k = 0; k < 2; k++)
    CHECK(memcmp(oa.toks[k], ref, sizeof ref) == 0);
  pthread_mutex_lock(&g_gate_mu);
  g_gate_open = true;
  pthread_cond_broadcast(&g_gate_cv);
  pthread_mutex_unlock(&g_gate_mu);
  pthread_join(th, NULL);
  result_wait(&r);
  CHECK_EQ_INT(r.n, 24);
  sl_free(ids);
  sl_pool_release(p, &a);
  sl_pool_free(p);
}

typedef struct racer {
  sl_pool_t *p;
  sl_status st;
} racer;

static void *first_lease(void *arg) {
  racer *r = arg;
  sl_pool_lease l;
  char err[256];
  r->st = sl_pool_acquire(r->p, "m1", &l, err, sizeof err);
  if (r->st == SL_OK)
    sl_pool_release(r->p, &l);
  return NULL;
}

static void test_pool_policy(void) {
  sl_pool_config pc = small_config();
  pc.engine.kv_blocks = 32;
  sl_pool_t *probe = make_pool(&pc, 1);
  char err[512];
  CHECK_OK(sl_pool_load(probe, "m0", err, sizeof err));
  uint64_t plan = info(probe, "m0").bytes;
  CHECK(plan > 0);
  sl_pool_free(probe);

  pc.max_memory = plan * 5 / 2; /* two models, not three */
  sl_pool_t *p = make_pool(&pc, 3);
  CHECK(info(p, "m0").state == SL_POOL_UNLOADED);
  CHECK(sl_pool_acquire(p, "nope", &(sl_pool_lease){0}, err, sizeof err) ==
        SL_ERR_NOT_FOUND);
  /* concurrent first leases share one load */
  racer rs[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    rs[i] = (racer){.p = p};
    CHECK(pthread_create(&th[i], NULL, first_lease, &rs[i]) == 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK_OK(rs[i].st);
  }
  CHECK_EQ_INT((int)info(p, "m1").loads, 1);
  CHECK_EQ_INT((int)info(p, "m1").requests, 4);
  /* LRU: m1 (older), m0; m2 evicts m1 */
  CHECK_OK(sl_pool_load(p, "m0", err, sizeof err));
  CHECK_OK(sl_pool_load(p, "m2", err, sizeof err));
  CHECK(info(p, "m1").state == SL_POOL_UNLOADED);
  CHECK_EQ_INT((int)info(p, "m1").evictions, 1);
  CHECK(info(p, "m0").state == SL_POOL_LOADED);
  CHECK(sl_pool_planned_bytes(p) <= pc.max_memory);
  /* a pinned model stays; a leased one stays */
  CHECK_OK(sl_pool_set_pinned(p, "m0", true));
  sl_pool_lease held;
  CHECK_OK(sl_pool_acquire(p, "m2", &held, err, sizeof err));
  CHECK(sl_pool_acquire(p, "m1", &(sl_pool_lease){0}, err, sizeof err) ==
        SL_ERR_MEMORY_LIMIT);
  CHECK_MSG(strstr(err, "pinned or serving") != NULL, "err: %s", err);
  CHECK(sl_pool_unload(p, "m2", err, sizeof err) == SL_ERR_STATE);
  CHECK(sl_pool_unload(p, "m0", err, sizeof err) == SL_ERR_STATE);
  sl_pool_release(p, &held);
  CHECK_OK(sl_pool_load(p, "m1", err, sizeof err)); /* m2 goes now */
  CHECK(info(p, "m2").state == SL_POOL_UNLOADED);
  CHECK(info(p, "m0").state == SL_POOL_LOADED);
  CHECK_EQ_INT((int)info(p, "m1").load_failures, 1);
  sl_pool_free(p);
  /* below one model's weights: the load fails, clearly */
  pc.max_memory = 16u << 20;
  p = make_pool(&pc, 1);
  CHECK(sl_pool_load(p, "m0", err, sizeof err) == SL_ERR_MEMORY_LIMIT);
  CHECK_MSG(strstr(err, "memory budget") != NULL, "err: %s", err);
  CHECK(info(p, "m0").state == SL_POOL_UNLOADED);
  sl_pool_free(p);
}

int main(void) {
  sl_model_t *m;
  sl_tokenizer_t *t;
  int rc = load_default_model(&m, &t);
  if (rc)
    return rc;
  sl_tokenizer_free(t);
  sl_model_free(m);
  default_model_path(g_path, sizeof g_path);
  sl__engine_test_hooks h = {.before_clear = before_clear,
                             .after_clear = after_clear};
  sl__engine_default_test_hooks(&h);
  RUN(test_pool_clear_sites);
  RUN(test_busy_engine_holds_up_no_other);
  sl__engine_default_test_hooks(NULL);
  RUN(test_pool_policy);
  sl_rt_shutdown();
  return sl_test_finish();
}
