/* The engine on the default model: every clear site is reached with real work
 * queued on the engine stream just before it, and the runtime's counters show
 * that nothing was in flight when the clear ran; the memory guard and the
 * runtime error ladders in both the admission and the chunked-prefill paths;
 * batching does not change greedy output; aborts free blocks. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_impl.h"
#include "engine_util.h"
#include "harness.h"
#include "sluice/kern.h"
#include "sluice/memsync.h"
#include "sluice/model.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

static sl_model_t *g_model;
static sl_tokenizer_t *g_tok;

static int tokenize(const char *text, int32_t **ids) {
  size_t n = 0;
  if (sl_tokenizer_encode(g_tok, text, strlen(text), false, true, ids, &n) !=
      SL_OK)
    return -1;
  return (int)n;
}

/* A long prompt: enough tokens for several prefill chunks. */
static char *long_text(int reps) {
  const char *unit = "The quick brown fox jumps over the lazy dog near the "
                     "river bank while the sun sets. ";
  size_t ul = strlen(unit);
  char *s = sl_malloc(ul * (size_t)reps + 1);
  for (int i = 0; i < reps; i++)
    memcpy(s + ul * (size_t)i, unit, ul);
  s[ul * (size_t)reps] = 0;
  return s;
}

/* ---- the hook: real work on the engine stream just before each clear ---- */

static _Atomic int g_hook_calls;
static _Atomic int g_hook_failures; /* work that was not queued */
static _Atomic int g_hook_pending[SL__SITE_COUNT]; /* queued, still pending */

typedef struct hold_arg {
  sl_buf_t *b;
  double ms;
} hold_arg;

static sl_status hold_task(const sl_task_ctx *ctx, void *p) {
  hold_arg *a = p;
  ((volatile float *)sl_buf_ptr(a->b))[0] = 1.0f;
  usleep((useconds_t)(a->ms * 1000));
  return SL_OK;
}

static void queue_work_ms(sl_stream_t *s, sl__clear_site site, double ms) {
  int n = 128;
  size_t bytes = (size_t)n * (size_t)n * 4;
  sl_buf_t *a = NULL, *b = NULL, *c = NULL;
  if (sl_buf_alloc(s, bytes, &a) != SL_OK ||
      sl_buf_alloc(s, bytes, &b) != SL_OK ||
      sl_buf_alloc(s, bytes, &c) != SL_OK) {
    atomic_fetch_add(&g_hook_failures, 1); /* the site would go unchecked */
    sl_buf_release(a);
    sl_buf_release(b);
    return;
  }
  /* a few ms that the clear must wait for, then dependent products */
  hold_arg h = {a, ms};
  if (sl_stream_submit(s, hold_task, &h, sizeof h, &a, 1, NULL) != SL_OK)
    atomic_fetch_add(&g_hook_failures, 1);
  for (int i = 0; i < 16; i++) /* not waited */
    if (sl_kern_sgemm(s, a, i % 2 ? c : b, i % 2 ? b : c, n, n, n, 1.0f) !=
        SL_OK)
      atomic_fetch_add(&g_hook_failures, 1);
  if (sl_stream_query(s).tasks > 0) /* real work is in flight now */
    atomic_fetch_add(&g_hook_pending[site], 1);
  sl_buf_release(a); /* RETIRING until the products are done */
  sl_buf_release(b);
  sl_buf_release(c);
  atomic_fetch_add(&g_hook_calls, 1);
}

static void queue_work(void *ud, sl_stream_t *s, sl__clear_site site) {
  (void)ud;
  queue_work_ms(s, site, 3.0);
}

/* `with_work`: the engine ran with queue_work as its hook, so the site must
 * have been reached with real work pending on the engine stream. */
static void check_site_work(sl_engine_t *e, sl__clear_site site,
                            bool with_work) {
  sl__site_stats s = sl__engine_site_stats(e, site);
  const char *name = sl__clear_site_name(site);
  CHECK_MSG(s.count > 0, "site %s never reached", name);
  if (with_work) {
    CHECK_MSG(atomic_load(&g_hook_pending[site]) > 0,
              "site %s: never reached with work pending", name);
    CHECK_EQ_INT(atomic_load(&g_hook_failures), 0);
  }
  CHECK_MSG(s.engine_pending_max == 0, "site %s: %llu engine tasks pending",
            name, (unsigned long long)s.engine_pending_max);
  CHECK_MSG(s.inflight_bytes_max == 0, "site %s: %llu bytes in flight", name,
            (unsigned long long)s.inflight_bytes_max);
  CHECK_MSG(s.inflight_ms_max == 0.0, "site %s: %.3f ms in flight", name,
            s.inflight_ms_max);
  fprintf(stderr,
          "  site %-24s reached %llu time(s) (%d with work queued); at the "
          "clear: %llu tasks pending, %llu bytes in flight, %.3f ms\n",
          name, (unsigned long long)s.count, atomic_load(&g_hook_pending[site]),
          (unsigned long long)s.engine_pending_max,
          (unsigned long long)s.inflight_bytes_max, s.inflight_ms_max);
}

static void check_site(sl_engine_t *e, sl__clear_site site) {
  check_site_work(e, site, true);
}

static sl_engine_t *make_engine_blocks(int max_memory_mb, int kv_blocks,
                                       const sl__engine_test_hooks *h) {
  sl_engine_config cfg = sl_engine_config_defaults();
  cfg.kv_blocks = kv_blocks;
  cfg.n_ctx = 1024;
  cfg.max_seqs = 8;
  cfg.prefill_chunk = SL_TEST_SANITIZED ? 16 : 64;
  cfg.max_batched_tokens = SL_TEST_SANITIZED ? 32 : 128;
  cfg.kv_block_tokens = 16;
  cfg.clear_every_tokens = 8;
  cfg.hot_loop_steps = 4;
  cfg.hot_loop_cache_bytes = 0;
  cfg.n_threads = 2;
  cfg.max_memory = (uint64_t)max_memory_mb << 20;
  sl_engine_t *e;
  if (sl_engine_create(g_model, g_tok, &cfg, &e) != SL_OK)
    return NULL;
  if (h)
    sl__engine_set_test_hooks(e, h);
  return e;
}

static sl_engine_t *make_engine(int max_memory_mb,
                                const sl__engine_test_hooks *h) {
  return make_engine_blocks(max_memory_mb, 0, h);
}

static void test_clear_sites_normal_path(void) {
  sl__engine_test_hooks h = {.before_clear = queue_work};
  sl_engine_t *e = make_engine(0, &h);
  CHECK(e != NULL);
  if (!e)
    return;
  char *text =
      long_text(SL_TEST_SANITIZED ? 3 : 12); /* several prefill chunks */
  int32_t *ids;
  int n = tokenize(text, &ids);
  CHECK(n > (SL_TEST_SANITIZED ? 40 : 130));
  result a, b;
  result_init(&a);
  result_init(&b);
  sl_gen_params pa = greedy(24), pb = greedy(40);
  CHECK_OK(sl_engine_submit(e, ids, n, &pa, on_event, &a, NULL));
  CHECK_OK(sl_engine_submit(e, ids, 20, &pb, on_event, &b, NULL));
  result_wait(&a);
  result_wait(&b);
  CHECK_EQ_INT(a.n, 24);
  CHECK_EQ_INT(b.n, 40);
  usleep(200000); /* idle reclaim */
  check_site(e, SL__SITE_PREFILL_CHUNK);
  check_site(e, SL__SITE_PREFILL_END);
  check_site(e, SL__SITE_DECODE_EVERY_N);
  check_site(e, SL__SITE_DECODE_HOT_LOOP);
  check_site(e, SL__SITE_DECODE_AFTER_FINISH);
  check_site(e, SL__SITE_IDLE);
  CHECK(atomic_load(&g_hook_calls) > 0);
  /* the clears' time against the steps' (what /admin/api/stats reports) */
  sl_engine_stats es = sl_engine_get_stats(e);
  CHECK(es.clears > 0);
  CHECK(es.clear_ns > 0 && es.step_ns > 0);
  CHECK(es.clear_idle_ns <= es.clear_ns);
  fprintf(stderr,
          "  %llu clears, %.3f ms (%.3f ms of it idle); steps %.3f ms\n",
          (unsigned long long)es.clears, (double)es.clear_ns / 1e6,
          (double)es.clear_idle_ns / 1e6, (double)es.step_ns / 1e6);
  sl_engine_free(e);
  sl_free(ids);
  sl_free(text);
}

/* The load's transform, the CPU kernels' packed copies of the weights (for a
 * model no context has used yet), is work on the new engine's own stream:
 * it is still running when the executor's first clear (engine.load) is
 * reached, and that clear drains it: nothing pending, nothing in flight
 * after it. No hook queues anything here: what the clear finds in flight
 * is the transform. (Where the ISA has no packed kernels there is nothing
 * to transform, and only the evidence after the clear is checked.) */
static void test_load_transform_in_flight(void) {
  char buf[4096], err[256];
  sl_status st;
  sl_model_t *m =
      sl_model_load(default_model_path(buf, sizeof buf), &st, err, sizeof err);
  CHECK_MSG(m != NULL, "%s", err);
  if (!m)
    return;
  uint64_t mapped = sl_model_weight_bytes(m);
  sl_engine_config cfg = sl_engine_config_defaults();
  cfg.n_ctx = 512;
  cfg.max_seqs = 2;
  cfg.n_threads = 2;
  sl_engine_t *e = NULL;
  CHECK_OK(sl_engine_create(m, g_tok, &cfg, &e));
  if (e) {
    sl__site_stats s = sl__engine_site_stats(e, SL__SITE_LOAD);
    bool transformed = sl_model_weight_bytes(m) != mapped;
    CHECK_EQ_INT(s.count, 1);
    if (transformed)
      CHECK_MSG(s.reached_busy == 1,
                "engine.load: the weights' transform was not in flight at "
                "the load clear (reached busy %llu times)",
                (unsigned long long)s.reached_busy);
    else
      fprintf(stderr, "  no packed kernels at this ISA: nothing to "
                      "transform\n");
    CHECK_MSG(s.engine_pending_max == 0, "engine.load: %llu tasks pending",
              (unsigned long long)s.engine_pending_max);
    CHECK(s.inflight_bytes_max == 0 && s.inflight_ms_max == 0.0);
    fprintf(stderr,
            "  engine.load: the transform %s in flight, %.3f ms of it "
            "drained by the clear; after it %llu tasks pending\n",
            s.reached_busy ? "was" : "was not", s.busy_drain_ms_max,
            (unsigned long long)s.engine_pending_max);
    /* and the engine runs on the transformed weights */
    int32_t *ids;
    int n = tokenize("The capital of France is", &ids);
    result r;
    result_init(&r);
    sl_gen_params gp = greedy(4);
    CHECK_OK(sl_engine_submit(e, ids, n, &gp, on_event, &r, NULL));
    result_wait(&r);
    CHECK_EQ_INT(r.n, 4);
    sl_free(ids);
    sl_engine_free(e);
  }
  sl_model_free(m);
}

/* ---- speculative decoding (issue 47): the same output, bit for bit ---- */

typedef struct spec_rec {
  result r;
  float lp[512];
  sl_token_logprob top[512][2];
  int accepted, rejected; /* the DONE event's draft counts */
} spec_rec;

static void on_spec_event(void *ud, const sl_engine_event *ev) {
  spec_rec *sr = ud;
  if (ev->kind == SL_EV_DONE) { /* before on_event reports the end */
    sr->accepted = ev->draft_accepted;
    sr->rejected = ev->draft_rejected;
  }
  if (ev->kind == SL_EV_TOKEN && ev->token >= 0 && sr->r.n < 512) {
    sr->lp[sr->r.n] = ev->logprob;
    for (int k = 0; k < 2 && k < ev->n_top; k++)
      sr->top[sr->r.n][k] = ev->top[k];
  }
  on_event(&sr->r, ev);
}

static const char *SPEC_PROMPTS[] = {
    "Rename total to sum and print the code again:\n"
    "def mean(values):\n    total = 0\n    for v in values:\n"
    "        total += v\n    return total / len(values)\n\n"
    "def mean(values):\n    sum = 0\n",
    "Copy the list exactly: apple, banana, cherry, date, elderberry, fig, "
    "grape. The list: apple, banana,",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps "
    "over the lazy dog. The quick brown",
    "Once upon a time, in a small village by the sea,",
};
enum { SPEC_N = 16, SPEC_TOKENS = 40 };

/* Runs SPEC_N requests (the prompts in turn, each a little different), all
 * at once or one at a time, with 2 top logprobs (even ones: no logprobs,
 * the argmax-only path when greedy), on an engine with speculation on or
 * off; their tokens and logprobs in out. Requests i % 4 < 2 are greedy;
 * the others sampled with a seed of their own (i % 4 == 3 with penalties
 * too, which read the tokens kept so far). */
static const char *g_spec_draft; /* spec_run's draft model, or NULL */

static void spec_run(bool spec, bool together, spec_rec *out, uint64_t *drafted,
                     uint64_t *accepted) {
  sl_engine_config cfg = sl_engine_config_defaults();
  cfg.n_ctx = 512;
  cfg.max_seqs = SPEC_N;
  cfg.n_threads = 2;
  cfg.kv_block_tokens = 16;
  cfg.speculative = !spec ? 0 : g_spec_draft ? 2 : 1;
  cfg.draft_model = spec ? g_spec_draft : NULL;
  cfg.draft_max = 6;
  /* in a batch every draft is verified (the adaptive rule would hold most
   * back there: the point is many sequences' drafts in one step); alone,
   * the rule decides */
  cfg.draft_fixed = together;
  sl_engine_t *e = NULL;
  CHECK_OK(sl_engine_create(g_model, g_tok, &cfg, &e));
  if (!e)
    return;
  int32_t *ids[SPEC_N];
  int n[SPEC_N];
  for (int i = 0; i < SPEC_N; i++) {
    char text[1024];
    snprintf(text, sizeof text, "%s%s", i >= 4 ? "Again. " : "",
             SPEC_PROMPTS[i % 4]);
    n[i] = tokenize(text, &ids[i]);
    result_init(&out[i].r);
  }
  for (int i = 0; i < SPEC_N; i++) {
    sl_gen_params gp = greedy(SPEC_TOKENS);
    gp.top_logprobs = i % 2 ? 2 : -1;
    if (i % 4 >= 2) {
      gp.sampling.temperature = 0.6f;
      gp.sampling.seed = 1000 + (uint64_t)i;
    }
    if (i % 4 == 3) {
      gp.sampling.repeat_penalty = 1.05f;
      gp.sampling.presence_penalty = 0.2f;
    }
    CHECK_OK(
        sl_engine_submit(e, ids[i], n[i], &gp, on_spec_event, &out[i], NULL));
    if (!together)
      result_wait(&out[i].r);
  }
  for (int i = 0; i < SPEC_N; i++) {
    result_wait(&out[i].r);
    CHECK_EQ_INT(out[i].r.n, SPEC_TOKENS);
    sl_free(ids[i]);
  }
  sl_engine_stats st = sl_engine_get_stats(e);
  *drafted = st.drafted;
  *accepted = st.accepted;
  /* each request's counts add up to the engine's */
  uint64_t sa = 0, sr = 0;
  for (int i = 0; i < SPEC_N; i++) {
    sa += (uint64_t)out[i].accepted;
    sr += (uint64_t)out[i].rejected;
  }
  CHECK(sa == st.accepted && sa + sr == st.drafted);
  sl_engine_free(e);
}

/* Greedy tokens and logprobs with speculative decoding equal those
 * without, bit for bit, alone and in a batch of 16: the drafts of several
 * sequences verified in one step with the others' decode tokens. Sampled
 * requests too, for the same seed: the target's token is drawn from the
 * same row with the same draw, and a draft kept while it is that token. */
static void test_speculative_is_greedy(void) {
  static spec_rec ref[SPEC_N], alone[SPEC_N], batch[SPEC_N];
  uint64_t d0, a0, d1, a1, d2, a2;
  spec_run(false, false, ref, &d0, &a0);
  spec_run(true, false, alone, &d1, &a1);
  spec_run(true, true, batch, &d2, &a2);
  CHECK(d0 == 0 && a0 == 0);
  fprintf(stderr,
          "  drafted / accepted: alone %llu / %llu, in a batch of %d %llu / "
          "%llu\n",
          (unsigned long long)d1, (unsigned long long)a1, SPEC_N,
          (unsigned long long)d2, (unsigned long long)a2);
  CHECK(a1 > 0 && d1 > a1); /* drafts kept and cut */
  CHECK(a2 > 0 && d2 > a2);
  int sampled_kept = 0; /* drafts of the sampled requests were kept too */
  for (int i = 0; i < SPEC_N; i++)
    if (i % 4 >= 2)
      sampled_kept += alone[i].accepted + batch[i].accepted;
  CHECK(sampled_kept > 0);
  /* a draft model (the default model drafting for itself: its drafts are
   * a greedy request's own tokens, and often not the token a sampled one
   * draws) on the drafter's own stream, in a batch of 16 (the sanitizer
   * builds run it in test_clear_sites_draft_stream only) */
  static spec_rec viadraft[SPEC_N];
  char path[4096];
  uint64_t d3 = 0, a3 = 0;
  if (!SL_TEST_SANITIZED) {
    g_spec_draft = default_model_path(path, sizeof path);
    spec_run(true, true, viadraft, &d3, &a3);
    g_spec_draft = NULL;
    fprintf(stderr, "  draft model, in a batch of %d: %llu / %llu\n", SPEC_N,
            (unsigned long long)d3, (unsigned long long)a3);
    CHECK(a3 > 0 && d3 > a3); /* kept and cut (the sampled requests') */
  }
  for (int i = 0; i < SPEC_N; i++) {
    for (int k = 0; k < (SL_TEST_SANITIZED ? 2 : 3); k++) {
      const spec_rec *x = k == 2 ? &viadraft[i] : k ? &batch[i] : &alone[i];
      CHECK_MSG(
          memcmp(x->r.toks, ref[i].r.toks, sizeof(int32_t) * SPEC_TOKENS) ==
                  0 &&
              memcmp(x->lp, ref[i].lp, sizeof(float) * SPEC_TOKENS) == 0 &&
              memcmp(x->top, ref[i].top, sizeof(x->top[0]) * SPEC_TOKENS) == 0,
          "request %d, speculative %s: tokens or logprobs differ", i,
          k == 2 ? "with a draft model"
          : k    ? "in a batch"
                 : "alone");
    }
  }
}

/* A predicted output (OpenAI's prediction) feeds the drafter: a request
 * whose prediction is its own answer keeps most of its drafts; one with an
 * unrelated prediction keeps the same answer. Without speculation the
 * prediction is unused. Bad predictions are refused at submission. */
static void test_speculative_prediction(void) {
  enum { NT = 32 };
  int32_t *ids;
  int n = tokenize("Once upon a time, in a small village by the sea,", &ids);
  result ref;
  spec_rec with, other, off, fixed;
  /* 0: no speculation (the reference); 1: its own answer as the
   * prediction; 2: an unrelated one; 3: speculation off, a prediction; 4:
   * the unrelated one with --draft-fixed */
  for (int mode = 0; mode < 5; mode++) {
    sl_engine_config cfg = sl_engine_config_defaults();
    cfg.n_ctx = 256;
    cfg.n_threads = 2;
    cfg.speculative = mode == 1 || mode == 2 || mode == 4;
    cfg.draft_fixed = mode == 4;
    sl_engine_t *e = NULL;
    CHECK_OK(sl_engine_create(g_model, g_tok, &cfg, &e));
    if (!e)
      break;
    sl_gen_params gp = greedy(NT);
    spec_rec *out = mode == 1   ? &with
                    : mode == 2 ? &other
                    : mode == 4 ? &fixed
                                : &off;
    int32_t junk[NT];
    for (int i = 0; i < NT; i++)
      junk[i] = 100 + 7 * i;
    if (mode == 0) {
      result_init(&ref);
      CHECK_OK(sl_engine_submit(e, ids, n, &gp, on_event, &ref, NULL));
      result_wait(&ref);
    } else {
      memset(out, 0, sizeof *out);
      result_init(&out->r);
      gp.prediction = mode == 2 || mode == 4 ? junk : ref.toks;
      gp.n_prediction = NT;
      CHECK_OK(sl_engine_submit(e, ids, n, &gp, on_spec_event, out, NULL));
      result_wait(&out->r);
      CHECK_MSG(out->r.n == NT && !memcmp(out->r.toks, ref.toks, sizeof junk),
                "prediction mode %d: the answer differs", mode);
    }
    if (mode == 1) { /* bad predictions: refused */
      gp.prediction = NULL;
      CHECK(sl_engine_submit(e, ids, n, &gp, on_event, &ref, NULL) ==
            SL_ERR_INVALID_ARG);
      junk[3] = -1;
      gp.prediction = junk;
      CHECK(sl_engine_submit(e, ids, n, &gp, on_event, &ref, NULL) ==
            SL_ERR_INVALID_ARG);
      gp.n_prediction = cfg.n_ctx + 1;
      CHECK(sl_engine_submit(e, ids, n, &gp, on_event, &ref, NULL) ==
            SL_ERR_INVALID_ARG);
    }
    sl_engine_free(e);
  }
  fprintf(stderr,
          "  kept / rejected: its own answer %d / %d, an unrelated text %d / "
          "%d\n",
          with.accepted, with.rejected, other.accepted, other.rejected);
  /* the first two tokens have no n-gram in the prediction yet; after them
   * each step's drafts are all kept (26 of 32 tokens: 4 steps of 8, 8, 8
   * and the 2 max_tokens leaves, each with the target's own token) */
  CHECK(with.accepted >= NT * 3 / 4 && with.rejected <= 2);
  CHECK(off.accepted == 0 && off.rejected == 0);
  /* the adaptive rule: drafts that keep being rejected are held back */
  fprintf(stderr, "  an unrelated text, --draft-fixed: %d / %d\n",
          fixed.accepted, fixed.rejected);
  CHECK_MSG(other.rejected < fixed.rejected,
            "rejected drafts: %d with the adaptive rule, %d fixed",
            other.rejected, fixed.rejected);
  sl_free(ids);
}

/* A draft model that is not there, or --speculative draft without one, is
 * refused at start with its reason. */
static void test_draft_model_refused(void) {
  sl_engine_config cfg = sl_engine_config_defaults();
  cfg.n_ctx = 256;
  cfg.speculative = 2;
  cfg.draft_model = "/nonexistent/draft.gguf";
  sl_engine_t *e = NULL;
  char err[512];
  CHECK(sl_engine_create2(g_model, g_tok, &cfg, &e, err, sizeof err) != SL_OK);
  CHECK_MSG(strstr(err, "draft model") && strstr(err, "nonexistent"), "%s",
            err);
  cfg.draft_model = NULL; /* draft without a model */
  CHECK(sl_engine_create2(g_model, g_tok, &cfg, &e, err, sizeof err) != SL_OK);
  CHECK_MSG(strstr(err, "--draft-model") != NULL, "%s", err);
}

/* The clear sites with a draft model: real work is queued on the drafter's
 * stream (and on the engine's) just before each clear, and every clear
 * drains it: no clear finds the drafter's work in flight (its stream's
 * evidence: 0 clears, 0 bytes, 0 ms), nothing is pending on it after. */
static sl_stream_t *_Atomic g_draft_stream;

static void queue_work_both(void *ud, sl_stream_t *s, sl__clear_site site) {
  queue_work(ud, s, site);
  sl_stream_t *ds = atomic_load(&g_draft_stream);
  if (ds) /* longer than the engine stream's: its drain alone would not
             outlast it */
    queue_work_ms(ds, site, 20.0);
}

static void test_clear_sites_draft_stream(void) {
  char path[4096];
  sl__engine_test_hooks h = {.before_clear = queue_work_both};
  sl_engine_config cfg = sl_engine_config_defaults();
  cfg.n_ctx = 512;
  cfg.max_seqs = 4;
  cfg.kv_block_tokens = 16;
  cfg.clear_every_tokens = 8;
  cfg.hot_loop_steps = 2;
  cfg.hot_loop_cache_bytes = 0;
  cfg.n_threads = 2;
  cfg.speculative = 2;
  cfg.draft_max = 4;
  cfg.draft_model = default_model_path(path, sizeof path);
  sl_engine_t *e = NULL;
  CHECK_OK(sl_engine_create(g_model, g_tok, &cfg, &e));
  if (!e)
    return;
  sl_stream_t *ds = sl__engine_draft_stream(e);
  CHECK(ds != NULL);
  atomic_store(&g_draft_stream, ds);
  sl__engine_set_test_hooks(e, &h);
  static result r[4];
  int32_t *ids[4];
  int n[4];
  for (int i = 0; i < 4; i++) {
    n[i] = tokenize(SPEC_PROMPTS[i], &ids[i]);
    result_init(&r[i]);
    sl_gen_params gp = greedy(16 + 8 * i);
    if (i % 2) {
      gp.sampling.temperature = 0.7f;
      gp.sampling.seed = 7 + (uint64_t)i;
    }
    CHECK_OK(sl_engine_submit(e, ids[i], n[i], &gp, on_event, &r[i], NULL));
  }
  for (int i = 0; i < 4; i++) {
    result_wait(&r[i]);
    CHECK_EQ_INT(r[i].n, 16 + 8 * i);
    sl_free(ids[i]);
  }
  usleep(200000); /* idle reclaim */
  sl_engine_stats es = sl_engine_get_stats(e);
  CHECK(es.drafted > 0);
  const sl__clear_site sites[] = {SL__SITE_PREFILL_END, SL__SITE_DECODE_EVERY_N,
                                  SL__SITE_DECODE_HOT_LOOP,
                                  SL__SITE_DECODE_AFTER_FINISH, SL__SITE_IDLE};
  for (size_t i = 0; i < sizeof sites / sizeof sites[0]; i++) {
    check_site(e, sites[i]);
    sl__site_stats st = sl__engine_site_stats(e, sites[i]);
    CHECK_MSG(st.draft_pending_max == 0,
              "site %s: %llu drafter-stream tasks pending after the clear",
              sl__clear_site_name(sites[i]),
              (unsigned long long)st.draft_pending_max);
  }
  (void)sl_stream_sync(ds); /* every queued task done: its times stamped */
  sl_stream_evidence ev = sl_stream_clear_evidence(ds);
  fprintf(stderr,
          "  drafter stream: %llu clears found its work in flight (%llu "
          "bytes, %.3f ms at most); %llu drafted, %llu kept\n",
          (unsigned long long)ev.others.clears,
          (unsigned long long)ev.others.bytes_last, ev.others.ms_max,
          (unsigned long long)es.drafted, (unsigned long long)es.accepted);
  CHECK(ev.others.clears == 0 && ev.others.bytes_last == 0 &&
        ev.others.ms_max == 0.0);
  sl__engine_test_hooks none = {0};
  sl__engine_set_test_hooks(e, &none);
  atomic_store(&g_draft_stream, NULL);
  sl_engine_free(e);
}

/* 200 generated edit-style prompts (a small function with random names
 * and numbers, and an instruction to rename one name and print it again),
 * 24 greedy tokens each: with speculation in batches of 16 against
 * without, in the same batches, the same tokens bit for bit. Slow (~2 minutes):
 * only when named (SL_TEST_ONLY), its own ctest entry labelled slow. */
static void test_speculative_200(void) {
  const char *only = getenv("SL_TEST_ONLY");
  if (!only || !strstr(only, "test_speculative_200"))
    return;
  enum { NP = 200, NT = 24, GROUP = 16 };
  static const char *names[] = {"total",  "count",  "value", "index", "result",
                                "buffer", "offset", "limit", "item",  "score"};
  uint64_t rng = 12345;
  static int32_t *ids[NP];
  static int n[NP];
  for (int i = 0; i < NP; i++) {
    const char *a = names[(rng = rng * 6364136223846793005ull + 1) >> 60],
               *b = names[(rng = rng * 6364136223846793005ull + 1) >> 60 ^ 5];
    unsigned k = (unsigned)((rng = rng * 6364136223846793005ull + 1) >> 40);
    char text[1024];
    snprintf(text, sizeof text,
             "Rename %s to %s and print the code again:\n"
             "def f%u(%s, n):\n    %s = %s * %u\n    for i in range(n):\n"
             "        %s += i %% %u\n    return %s\n\ndef f%u(%s, n):\n",
             a, b, k % 97, a, a, a, k % 13 + 2, a, k % 7 + 3, a, k % 97, b);
    n[i] = tokenize(text, &ids[i]);
  }
  static result ref[NP], spec[NP];
  for (int mode = 0; mode < 2; mode++) {
    sl_engine_config cfg = sl_engine_config_defaults();
    cfg.n_ctx = 512;
    cfg.max_seqs = GROUP;
    cfg.n_threads = 2;
    cfg.speculative = mode;
    cfg.draft_fixed = true; /* every draft verified, in batches of 16 */
    sl_engine_t *e = NULL;
    CHECK_OK(sl_engine_create(g_model, g_tok, &cfg, &e));
    if (!e)
      return;
    result *out = mode ? spec : ref;
    for (int g = 0; g < NP; g += GROUP) {
      int m = GROUP; /* both in batches (batch invariance, alone against a
                        batch, is test_speculative_is_greedy's) */
      for (int j = g; j < g + GROUP && j < NP; j += m) {
        for (int i = j; i < j + m && i < NP; i++) {
          result_init(&out[i]);
          sl_gen_params gp = greedy(NT);
          CHECK_OK(
              sl_engine_submit(e, ids[i], n[i], &gp, on_event, &out[i], NULL));
        }
        for (int i = j; i < j + m && i < NP; i++)
          result_wait(&out[i]);
      }
    }
    if (mode) {
      sl_engine_stats st = sl_engine_get_stats(e);
      fprintf(stderr, "  %d prompts: %llu tokens drafted, %llu accepted\n", NP,
              (unsigned long long)st.drafted, (unsigned long long)st.accepted);
      CHECK(st.accepted > 0 && st.drafted > st.accepted);
    }
    sl_engine_free(e);
  }
  int bad = 0;
  for (int i = 0; i < NP; i++) {
    CHECK_EQ_INT(spec[i].n, NT);
    if (memcmp(spec[i].toks, ref[i].toks, sizeof(int32_t) * NT) != 0 &&
        bad++ < 3)
      CHECK_MSG(0, "prompt %d: tokens differ with speculation", i);
    sl_free(ids[i]);
  }
  CHECK_EQ_INT(bad, 0);
}

static void test_error_ladders(void) {
  char *text = long_text(SL_TEST_SANITIZED ? 3 : 12);
  int32_t *ids;
  int n = tokenize(text, &ids);
  struct {
    sl__engine_test_hooks h;
    sl__clear_site site;
    bool fails;
    const char *code;
  } cases[] = {
      {{.before_clear = queue_work, .fail_guard_admit = 1},
       SL__SITE_ADMIT_MEM_EXCEEDED,
       true,
       "prefill_memory_exceeded"},
      {{.before_clear = queue_work, .fail_guard_chunk = 1},
       SL__SITE_CHUNK_MEM_EXCEEDED,
       true,
       "prefill_memory_exceeded"},
      {{.before_clear = queue_work, .fail_oom_admit = 1},
       SL__SITE_ADMIT_RUNTIME_ERR,
       false,
       ""},
      {{.before_clear = queue_work, .fail_oom_chunk = 2},
       SL__SITE_CHUNK_RUNTIME_ERR,
       false,
       ""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    sl_engine_t *e = make_engine(0, &cases[i].h);
    result r;
    result_init(&r);
    sl_gen_params p = greedy(8);
    CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &r, NULL));
    result_wait(&r);
    if (cases[i].fails) {
      CHECK(r.finish == SL_FINISH_ERROR);
      CHECK_MSG(strcmp(r.code, cases[i].code) == 0, "code '%s'", r.code);
    } else { /* requeued after the clear, then served */
      CHECK(r.finish == SL_FINISH_LENGTH);
      CHECK_EQ_INT(r.n, 8);
    }
    check_site(e, cases[i].site);
    /* blocks all back */
    sl_engine_stats st = sl_engine_get_stats(e);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    sl_engine_free(e);
  }
  sl_free(ids);
  sl_free(text);
}

static void test_memory_guard_real_limit(void) {
  /* a limit just over the weights: a long prompt cannot fit */
  int mb = (int)(sl_model_weight_bytes(g_model) >> 20) + 2;
  sl_engine_t *e = make_engine(mb, NULL);
  char *text = long_text(12);
  int32_t *ids;
  int n = tokenize(text, &ids);
  result r;
  result_init(&r);
  sl_gen_params p = greedy(4);
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &r, NULL));
  result_wait(&r);
  CHECK(r.finish == SL_FINISH_ERROR);
  CHECK_MSG(strcmp(r.code, "prefill_memory_exceeded") == 0, "code '%s'",
            r.code);
  sl_engine_free(e);
  sl_free(ids);
  sl_free(text);
}

static void test_batching_invariance_and_prefix_cache(void) {
  const char *prompts[] = {"The capital of France is",
                           "def add(a, b):\n    return",
                           "Once upon a time",
                           "1, 2, 3, 4,",
                           "The best way to learn C is",
                           "In 1492, Columbus",
                           "Water boils at",
                           "My favourite colour is"};
  int np = SL_TEST_SANITIZED ? 3 : 8;
  int32_t *ids[8];
  int n[8];
  for (int i = 0; i < np; i++)
    n[i] = tokenize(prompts[i], &ids[i]);
  sl_engine_t *e = make_engine(0, NULL);
  result alone[8], together[8];
  sl_gen_params p = greedy(16);
  for (int i = 0; i < np; i++) {
    result_init(&alone[i]);
    CHECK_OK(sl_engine_submit(e, ids[i], n[i], &p, on_event, &alone[i], NULL));
    result_wait(&alone[i]);
  }
  for (int i = 0; i < np; i++) {
    result_init(&together[i]);
    CHECK_OK(
        sl_engine_submit(e, ids[i], n[i], &p, on_event, &together[i], NULL));
  }
  for (int i = 0; i < np; i++) {
    result_wait(&together[i]);
    CHECK_EQ_INT(together[i].n, 16);
    CHECK_MSG(memcmp(alone[i].toks, together[i].toks, 16 * sizeof(int32_t)) ==
                  0,
              "prompt %d differs when batched", i);
  }
  /* prefix cache: a long prompt twice; the second reuses full blocks */
  char *text = long_text(SL_TEST_SANITIZED ? 2 : 6);
  int32_t *lids;
  int ln = tokenize(text, &lids);
  result r1, r2;
  result_init(&r1);
  result_init(&r2);
  CHECK_OK(sl_engine_submit(e, lids, ln, &p, on_event, &r1, NULL));
  result_wait(&r1);
  CHECK_OK(sl_engine_submit(e, lids, ln, &p, on_event, &r2, NULL));
  result_wait(&r2);
  CHECK_EQ_INT(r1.cached, 0);
  CHECK_MSG(r2.cached >= ln - 16 && r2.cached < ln && r2.cached > 0,
            "cached %d of %d", r2.cached, ln);
  CHECK(memcmp(r1.toks, r2.toks, 16 * sizeof(int32_t)) == 0);
  sl_engine_free(e);
  for (int i = 0; i < np; i++)
    sl_free(ids[i]);
  sl_free(lids);
  sl_free(text);
}

static void test_abort_frees_blocks(void) {
  sl_engine_t *e = make_engine(0, NULL);
  int32_t *ids;
  int n = tokenize("Tell me a very long story about", &ids);
  result r;
  result_init(&r);
  sl_gen_params p = greedy(400);
  uint64_t id;
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &r, &id));
  while (1) {
    pthread_mutex_lock(&r.mu);
    int got = r.n;
    pthread_mutex_unlock(&r.mu);
    if (got >= 3)
      break;
    usleep(1000);
  }
  sl_engine_abort(e, id);
  result_wait(&r);
  CHECK(r.finish == SL_FINISH_ABORT);
  CHECK(r.n < 400);
  usleep(50000);
  sl_engine_stats st = sl_engine_get_stats(e);
  CHECK_EQ_INT(st.kv_blocks_used, 0);
  CHECK_EQ_INT(st.running, 0);
  sl_engine_free(e);
  sl_free(ids);
}

/* A real allocation failure (the allocator's device-OOM path, injected at the
 * allocator) goes through the ladder: clear on the engine stream, requeue,
 * then served; three in a row fail that request alone, with a 5xx reason. */
static void test_real_oom_ladder(void) {
  int32_t *ids;
  int n = tokenize("The capital of France is", &ids);
  sl_gen_params p = greedy(8);
  sl_device_t *dev = sl_cpu_device();
  /* no work-queueing hook here: its own allocations would take the
   * injected failures */
  sl_engine_t *e = make_engine(0, NULL);
  result base, once, thrice, after;
  result_init(&base);
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &base, NULL));
  result_wait(&base);
  usleep(100000); /* idle: the next allocation is the next request's */
  sl_alloc_inject_oom(dev, 1);
  result_init(&once);
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &once, NULL));
  result_wait(&once);
  CHECK(once.finish == SL_FINISH_LENGTH);
  CHECK_EQ_INT(once.n, 8);
  CHECK(memcmp(once.toks, base.toks, 8 * sizeof(int32_t)) == 0);
  check_site_work(e, SL__SITE_ADMIT_RUNTIME_ERR, false);
  usleep(100000);
  sl_alloc_inject_oom(dev, 3);
  result_init(&thrice);
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &thrice, NULL));
  result_wait(&thrice);
  CHECK(thrice.finish == SL_FINISH_ERROR);
  CHECK_EQ_INT(thrice.error, SL_ERR_DEVICE_OOM);
  CHECK_MSG(thrice.reason == SL_REASON_OUT_OF_MEMORY, "reason %s",
            sl_reason_code(thrice.reason));
  CHECK(sl_reason_http(thrice.reason) >=
        500); /* the server's, not the client's */
  sl_alloc_inject_oom(dev, 0);
  /* everyone else keeps being served */
  result_init(&after);
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &after, NULL));
  result_wait(&after);
  CHECK(after.finish == SL_FINISH_LENGTH);
  CHECK(memcmp(after.toks, base.toks, 8 * sizeof(int32_t)) == 0);
  CHECK_EQ_INT(sl_engine_get_stats(e).kv_blocks_used, 0);
  sl_engine_free(e);
  sl_free(ids);
}

static sl_status device_error_task(const sl_task_ctx *ctx, void *p) {
  return SL_ERR_DEVICE;
}

/* A task of the engine stream fails just before a clear: the clear reports
 * it, and the error reaches the request whose work it was (not dropped, and
 * not left for the next request to take). */
typedef struct plant {
  _Atomic int planted;
  sl__clear_site at;
} plant;

static void fail_before_clear(void *ud, sl_stream_t *s, sl__clear_site site) {
  plant *p = ud;
  if (site == p->at && !atomic_exchange(&p->planted, 1))
    sl_stream_submit(s, device_error_task, NULL, 0, NULL, 0, NULL);
}

static void test_clear_error_reaches_request(void) {
  static plant pl;
  atomic_store(&pl.planted, 0);
  pl.at = SL__SITE_PREFILL_END; /* a one-chunk prompt: prefill.end only */
  sl__engine_test_hooks h = {.before_clear = fail_before_clear, .ud = &pl};
  sl_engine_t *e = make_engine(0, &h);
  int32_t *ids;
  int n = tokenize("Once upon a time", &ids);
  result r, next;
  result_init(&r);
  sl_gen_params p = greedy(8);
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &r, NULL));
  result_wait(&r);
  CHECK(atomic_load(&pl.planted));
  CHECK(r.finish == SL_FINISH_ERROR);
  CHECK_EQ_INT(r.error, SL_ERR_DEVICE);
  CHECK_MSG(r.reason == SL_REASON_DEVICE_ERROR, "reason %s",
            sl_reason_code(r.reason));
  /* the error was taken once: the next request is served */
  result_init(&next);
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &next, NULL));
  result_wait(&next);
  CHECK(next.finish == SL_FINISH_LENGTH);
  CHECK_EQ_INT(sl_engine_get_stats(e).kv_blocks_used, 0);
  sl_engine_free(e);
  /* an error met by the idle clear belongs to no
   * request: the clear takes it, and the next request is not blamed */
  atomic_store(&pl.planted, 0);
  pl.at = SL__SITE_IDLE;
  e = make_engine(0, &h);
  result first, second;
  result_init(&first);
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &first, NULL));
  result_wait(&first);
  CHECK(first.finish == SL_FINISH_LENGTH);
  for (int i = 0; i < 200 && !atomic_load(&pl.planted); i++)
    usleep(5000); /* the idle clear, once the engine has nothing to do */
  result_init(&second);
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &second, NULL));
  result_wait(&second);
  CHECK_MSG(second.finish == SL_FINISH_LENGTH,
            "the next request took the earlier error (finish %d, %s)",
            (int)second.finish, sl_status_str(second.error));
  sl_engine_free(e);
  sl_free(ids);
}

/* Failure reasons come from one table: a request larger than the KV cache is
 * the client's (400, context_length_exceeded), not a memory-limit 500. */
static void test_reason_table(void) {
  sl_engine_t *e = make_engine_blocks(0, 4, NULL); /* 64 tokens of KV */
  char *text = long_text(4);
  int32_t *ids;
  int n = tokenize(text, &ids);
  CHECK(n > 64);
  result r;
  result_init(&r);
  sl_gen_params p = greedy(4);
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &r, NULL));
  result_wait(&r);
  CHECK(r.finish == SL_FINISH_ERROR);
  CHECK_EQ_INT(r.error, SL_ERR_RANGE);
  CHECK_MSG(strcmp(r.code, "context_length_exceeded") == 0, "code '%s'",
            r.code);
  CHECK_EQ_INT(sl_reason_http(r.reason), 400);
  CHECK_EQ_INT(sl_reason_http(SL_REASON_PREFILL_MEMORY_EXCEEDED), 400);
  CHECK_EQ_INT(sl_reason_http(sl_reason_of_status(SL_ERR_NOMEM)), 503);
  CHECK_EQ_INT(sl_reason_http(sl_reason_of_status(SL_ERR_STATE)), 500);
  sl_engine_free(e);
  sl_free(ids);
  sl_free(text);
}

/* Every abort is kept, however many arrive within one step. */
typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool entered, open;
} gate;

static void gate_hook(void *ud, sl_stream_t *s, sl__clear_site site) {
  gate *g = ud;
  pthread_mutex_lock(&g->mu);
  g->entered = true;
  pthread_cond_broadcast(&g->cv);
  while (!g->open)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static void test_abort_beyond_1024(void) {
  enum { N = 1100 }; /* past the 1,024 that once fit */
  gate g = {.entered = false, .open = false};
  pthread_mutex_init(&g.mu, NULL);
  pthread_cond_init(&g.cv, NULL);
  sl__engine_test_hooks h = {.before_clear = gate_hook, .ud = &g};
  sl_engine_t *e = make_engine(0, &h);
  int32_t *ids;
  int n = tokenize("Count to ten:", &ids);
  result *rs = sl_calloc(N, sizeof *rs);
  uint64_t *rid = sl_calloc(N, sizeof *rid);
  sl_gen_params p = greedy(6);
  result_init(&rs[0]);
  CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &rs[0], &rid[0]));
  pthread_mutex_lock(&g.mu); /* the executor is held inside a step */
  while (!g.entered)
    pthread_cond_wait(&g.cv, &g.mu);
  pthread_mutex_unlock(&g.mu);
  for (int i = 1; i < N; i++) {
    result_init(&rs[i]);
    CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &rs[i], &rid[i]));
  }
  int not_recorded = 0;
  for (int i = 0; i < N; i++)
    not_recorded += sl_engine_abort(e, rid[i]) != SL_OK;
  CHECK_EQ_INT(not_recorded, 0);
  pthread_mutex_lock(&g.mu);
  g.open = true;
  pthread_cond_broadcast(&g.cv);
  pthread_mutex_unlock(&g.mu);
  int aborted = 0;
  for (int i = 0; i < N; i++) {
    result_wait(&rs[i]);
    aborted += rs[i].finish == SL_FINISH_ABORT;
  }
  CHECK_EQ_INT(aborted, N);
  sl_engine_free(e);
  for (int i = 0; i < N; i++) {
    pthread_cond_destroy(&rs[i].cv);
    pthread_mutex_destroy(&rs[i].mu);
  }
  sl_free(rs);
  sl_free(rid);
  sl_free(ids);
  pthread_cond_destroy(&g.cv);
  pthread_mutex_destroy(&g.mu);
}

static void test_bad_submissions(void) {
  sl_engine_t *e = make_engine(0, NULL);
  int32_t bad[2] = {1, 1 << 30};
  result r;
  result_init(&r);
  sl_gen_params p = greedy(4);
  CHECK(sl_engine_submit(e, bad, 2, &p, on_event, &r, NULL) ==
        SL_ERR_INVALID_ARG);
  p.max_tokens = 0;
  CHECK(sl_engine_submit(e, bad, 1, &p, on_event, &r, NULL) ==
        SL_ERR_INVALID_ARG);
  int32_t *big = sl_calloc(2000, sizeof *big);
  p.max_tokens = 4;
  CHECK(sl_engine_submit(e, big, 2000, &p, on_event, &r, NULL) == SL_ERR_RANGE);
  sl_free(big);
  /* a stop string longer than SL_MAX_STOP_BYTES: its matching is bounded */
  char *stop = sl_malloc(SL_MAX_STOP_BYTES + 2);
  memset(stop, 's', SL_MAX_STOP_BYTES + 1);
  stop[SL_MAX_STOP_BYTES + 1] = 0;
  p.stop[0] = stop;
  p.n_stop = 1;
  int32_t one[1] = {1};
  CHECK(sl_engine_submit(e, one, 1, &p, on_event, &r, NULL) ==
        SL_ERR_INVALID_ARG);
  sl_free(stop);
  sl_engine_free(e);
}

/* The one clamp of max_tokens to the context (sl_engine_max_new, which
 * sl_engine_submit applies; issue 44): the room left, never below 0; an
 * answer asked for far past it ends at the context's last slot. */
static void test_max_tokens_clamp(void) {
  sl_engine_t *e = make_engine(0, NULL); /* n_ctx 1024 */
  CHECK_EQ_INT(sl_engine_max_new(e, 1000, 1 << 30), 24);
  CHECK_EQ_INT(sl_engine_max_new(e, 1000, 5), 5);
  CHECK_EQ_INT(sl_engine_max_new(e, 1024, 5), 0);
  CHECK_EQ_INT(sl_engine_max_new(e, 1, INT_MAX), 1023);
  if (sl_engine_max_new(e, 1000, 1 << 30) == 24) { /* (else: runs long) */
    int32_t *ids = sl_calloc(1016, sizeof *ids);
    for (int i = 0; ids && i < 1016; i++)
      ids[i] = 100 + i % 50;
    result r;
    result_init(&r);
    sl_gen_params p = greedy(1 << 20); /* (ignore_eos) */
    CHECK_OK(sl_engine_submit(e, ids, 1016, &p, on_event, &r, NULL));
    result_wait(&r);
    CHECK_EQ_INT(r.n, 8);
    CHECK(r.finish == SL_FINISH_LENGTH);
    sl_free(ids);
  }
  sl_engine_free(e);
}

/* On the CPU every token is picked on the host: the argmax of a plain greedy
 * request, the sampler for the others (the stats say so); a CPU batch
 * context does not sample on the device and refuses a sampled sequence. */
static void test_sampling_on_the_cpu(void) {
  sl_engine_config cfg = sl_engine_config_defaults();
  cfg.device = SL_ENGINE_DEVICE_CPU;
  cfg.n_ctx = 256;
  cfg.max_seqs = 4;
  cfg.n_threads = 2;
  sl_engine_t *e = NULL;
  CHECK_OK(sl_engine_create(g_model, g_tok, &cfg, &e));
  if (!e)
    return;
  CHECK(!e->dev_sampling);
  CHECK(!sl_batch_ctx_samples_on_device(e->bctx));
  int32_t *ids;
  int n = tokenize("The capital of France is", &ids);
  result a, b;
  result_init(&a);
  result_init(&b);
  sl_gen_params pa = greedy(6), pb = greedy(5);
  pb.sampling.temperature = 1.0f;
  pb.sampling.seed = 7;
  CHECK_OK(sl_engine_submit(e, ids, n, &pa, on_event, &a, NULL));
  CHECK_OK(sl_engine_submit(e, ids, n, &pb, on_event, &b, NULL));
  result_wait(&a);
  result_wait(&b);
  sl_engine_stats es = sl_engine_get_stats(e);
  CHECK_EQ_INT((long long)es.argmax_device, 6);
  CHECK_EQ_INT((long long)es.sampled_host, 5);
  CHECK_EQ_INT((long long)es.sampled_device, 0);
  CHECK_EQ_INT((long long)es.sample_fallbacks, 0);
  sl_engine_free(e);
  /* a CPU batch context refuses `sample` */
  const sl_model_hparams *hp = sl_model_hparams_of(g_model);
  sl_stream_t *cs = sl_thread_stream(sl_cpu_device());
  sl_kv_view kv = {NULL, (int)hp->n_layer, 4, 16,
                   (int)(hp->n_head_kv * hp->head_dim)};
  CHECK_OK(sl_buf_alloc(cs, sl_kv_view_bytes(&kv), &kv.buf));
  sl_batch_ctx_t *bc = NULL;
  CHECK_OK(sl_batch_ctx_create(g_model, &kv, cs, 1, &bc));
  if (bc) {
    int32_t table[4] = {0, 1, 2, 3};
    sl_kcu_sample_params sp;
    memset(&sp, 0, sizeof sp);
    sl_kcu_sample_out so;
    float *lg = sl_malloc(sizeof(float) * (size_t)hp->n_vocab);
    sl_batch_seq sq = {table, 4,     0,     0,   n,    true,
                       false, false, false, &sp, false};
    sl_batch bt = {ids, n, &sq, 1};
    sl_batch_out out = {lg, NULL, NULL, &so, NULL};
    CHECK(!sl_batch_ctx_samples_on_device(bc));
    CHECK(sl_batch_ctx_submit(bc, &bt, &out) == SL_ERR_INVALID_ARG);
    CHECK(sl_batch_ctx_fetch_row(bc, 0, lg) == SL_ERR_UNSUPPORTED);
    sl_free(lg);
    sl_batch_ctx_free(bc);
  }
  sl_buf_release(kv.buf);
  sl_sync_and_clear_cache(cs);
  sl_clear_thread_streams();
  sl_free(ids);
}

/* A token's logits do not depend on how its prompt was cut into chunks: the
 * prompt at once, in chunks of 16 or 7, as n - 1 tokens and then 1 (what a
 * prefix-cache hit that leaves one token to compute runs), and one token at a
 * time (decode steps) give the same bits at every position. */
static int eval_in_chunks(sl_ctx_t *c, const int32_t *ids, int n, int chunk,
                          float *out, size_t nv) {
  sl_ctx_truncate(c, 0);
  for (int p = 0; p < n;) {
    int k = chunk > 0 ? (n - p < chunk ? n - p : chunk) : (p == 0 ? n - 1 : 1);
    if (sl_ctx_eval(c, ids + p, k, out + (size_t)p * nv, true) != SL_OK)
      return -1;
    p += k;
  }
  return 0;
}

static void test_chunking_invariance(void) {
  int32_t *ids;
  int n = tokenize("<|im_start|>system\nYou are a helpful AI assistant named "
                   "SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>"
                   "user\nSay hello.<|im_end|>\n<|im_start|>assistant\n",
                   &ids);
  CHECK(n > 20);
  if (n <= 20)
    return;
  const size_t nv = (size_t)sl_model_hparams_of(g_model)->n_vocab;
  sl_stream_t *cs = sl_thread_stream(sl_cpu_device());
  sl_ctx_t *c = NULL;
  CHECK_OK(sl_ctx_create(g_model, cs, 256, 2, &c));
  float *ref = sl_malloc(sizeof(float) * nv * (size_t)n),
        *got = sl_malloc(sizeof(float) * nv * (size_t)n);
  if (c && ref && got && eval_in_chunks(c, ids, n, n, ref, nv) == 0) {
    const int chunks[] = {16, 7, 0 /* n - 1, then 1 */, 1};
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
      CHECK(eval_in_chunks(c, ids, n, chunks[i], got, nv) == 0);
      int bad = -1;
      for (int p = 0; p < n && bad < 0; p++)
        if (memcmp(ref + (size_t)p * nv, got + (size_t)p * nv,
                   sizeof(float) * nv) != 0)
          bad = p;
      CHECK_MSG(bad < 0,
                "chunks of %d (0: n - 1, then 1): position %d of %d differs "
                "from the prompt at once",
                chunks[i], bad, n);
    }
  } else {
    CHECK(0);
  }
  sl_free(ref);
  sl_free(got);
  sl_ctx_free(c);
  sl_sync_and_clear_cache(cs);
  sl_clear_thread_streams();
  sl_free(ids);
}

int main(void) {
  int rc = load_default_model(&g_model, &g_tok);
  if (rc)
    return rc;
  RUN(test_clear_sites_normal_path);
  RUN(test_load_transform_in_flight);
  RUN(test_speculative_is_greedy);
  RUN(test_speculative_prediction);
  RUN(test_draft_model_refused);
  RUN(test_clear_sites_draft_stream);
  RUN(test_speculative_200);
  RUN(test_error_ladders);
  RUN(test_memory_guard_real_limit);
  RUN(test_batching_invariance_and_prefix_cache);
  RUN(test_abort_frees_blocks);
  RUN(test_max_tokens_clamp);
  RUN(test_abort_beyond_1024);
  RUN(test_real_oom_ladder);
  RUN(test_clear_error_reaches_request);
  RUN(test_reason_table);
  RUN(test_bad_submissions);
  RUN(test_sampling_on_the_cpu);
  RUN(test_chunking_invariance);
  sl_tokenizer_free(g_tok);
  sl_model_free(g_model);
  sl_rt_shutdown();
  return sl_test_finish();
}
