/* The engine on a GPU, on the default model (issue 8):
 *
 *  - every prefill and decode clear site is reached with the engine's own
 *    forward pass still in flight on its non-blocking stream (no planted
 *    work: the step is queued, the sites run, then the step's ids are
 *    read), and each clear leaves 0 tasks, 0 bytes and 0 ms in flight;
 *  - greedy output is the same alone and in a batch of 16;
 *  - CPU and GPU agree on greedy text for the held prompt set;
 *  - a weight upload that cannot fit fails with a message, not a crash
 *    (tested through the device memory limit).
 *
 * Skips (77) without CUDA or a GPU, or without the model. */
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_impl.h"
#include "engine_util.h"
#include "harness.h"
#include "rt/experiment.h"
#include "sluice/alloc.h"
#include "sluice/memsync.h"
#include "sluice/model.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

static sl_model_t *g_model;
static sl_tokenizer_t *g_tok;
static sl_device_t *g_dev;

static int tokenize(const char *text, int32_t **ids) {
  size_t n = 0;
  if (sl_tokenizer_encode(g_tok, text, strlen(text), false, true, ids, &n) !=
      SL_OK)
    return -1;
  return (int)n;
}

static sl_engine_t *make_engine(sl_engine_device dev, int max_seqs) {
  sl_engine_config cfg = sl_engine_config_defaults();
  cfg.device = dev;
  cfg.n_ctx = 1024;
  cfg.max_seqs = max_seqs;
  cfg.prefill_chunk = 64;
  cfg.max_batched_tokens = 128;
  cfg.kv_block_tokens = 16;
  cfg.clear_every_tokens = 8;
  cfg.hot_loop_steps = 4;
  cfg.hot_loop_cache_bytes = 0;
  cfg.n_threads = 2;
  sl_engine_t *e = NULL;
  if (sl_engine_create(g_model, g_tok, &cfg, &e) != SL_OK)
    return NULL;
  return e;
}

/* The held prompts (as tests/py/test_model_vs_llamacpp.py's PROMPTS). */
static const char *const PROMPTS[] = {
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "<|im_start|>user\nWhat is 17 times 23?<|im_end|>\n<|im_start|>assistant\n",
    "The three laws of thermodynamics are",
    "#include <stdio.h>\n\nint main(void) {\n",
    "Translate to French: 'The weather is nice today.'\n",
    "1, 1, 2, 3, 5, 8, 13,",
};
#define N_PROMPTS ((int)(sizeof PROMPTS / sizeof PROMPTS[0]))

static void test_device_is_gpu(void) {
  sl_engine_t *e = make_engine(SL_ENGINE_DEVICE_AUTO, 4);
  CHECK(e != NULL);
  if (!e)
    return;
  CHECK(sl_device_kind_of(sl_engine_device_of(e)) == SL_DEVICE_CUDA);
  fprintf(stderr, "  auto runs on %s\n", sl_engine_device_name(e));
  sl_engine_free(e);
}

static void check_site(sl_engine_t *e, sl__clear_site site) {
  sl__site_stats s = sl__engine_site_stats(e, site);
  const char *name = sl__clear_site_name(site);
  CHECK_MSG(s.count > 0, "site %s never reached", name);
  CHECK_MSG(s.reached_busy > 0,
            "site %s: never reached with the forward pass in flight", name);
  CHECK_MSG(s.engine_pending_max == 0, "site %s: %llu engine tasks pending",
            name, (unsigned long long)s.engine_pending_max);
  CHECK_MSG(s.inflight_bytes_max == 0, "site %s: %llu bytes in flight", name,
            (unsigned long long)s.inflight_bytes_max);
  CHECK_MSG(s.inflight_ms_max == 0.0, "site %s: %.3f ms in flight", name,
            s.inflight_ms_max);
  fprintf(stderr,
          "  site %-24s reached %llu time(s), %llu with the forward pass in "
          "flight (up to %.3f ms of it drained); after the clear: %llu tasks "
          "pending, %llu bytes in flight, %.3f ms\n",
          name, (unsigned long long)s.count, (unsigned long long)s.reached_busy,
          s.busy_drain_ms_max, (unsigned long long)s.engine_pending_max,
          (unsigned long long)s.inflight_bytes_max, s.inflight_ms_max);
}

static void test_clear_sites_with_forward_in_flight(void) {
  sl_engine_t *e = make_engine(SL_ENGINE_DEVICE_CUDA, 8);
  CHECK(e != NULL);
  if (!e)
    return;
  /* a long prompt (several chunks) and short ones, all decoding together */
  char text[8192] = "";
  for (int i = 0; i < 30; i++)
    strcat(text, "The quick brown fox jumps over the lazy dog near the "
                 "river bank while the sun sets. ");
  int32_t *ids;
  int n = tokenize(text, &ids);
  CHECK(n > 300);
  result r[4];
  for (int i = 0; i < 4; i++) {
    result_init(&r[i]);
    sl_gen_params p = greedy(24 + 8 * i);
    CHECK_OK(sl_engine_submit(e, ids, i == 0 ? n : 20 + i, &p, on_event, &r[i],
                              NULL));
  }
  for (int i = 0; i < 4; i++) {
    result_wait(&r[i]);
    CHECK_EQ_INT(r[i].n, 24 + 8 * i);
    CHECK_EQ_INT((int)r[i].finish, (int)SL_FINISH_LENGTH);
  }
  check_site(e, SL__SITE_PREFILL_CHUNK);
  check_site(e, SL__SITE_PREFILL_END);
  check_site(e, SL__SITE_DECODE_EVERY_N);
  check_site(e, SL__SITE_DECODE_HOT_LOOP);
  check_site(e, SL__SITE_DECODE_AFTER_FINISH);
  sl_engine_free(e);
  sl_free(ids);
}

/* Greedy ids of every prompt, run alone or all `copies` at once. */
static void run_prompts(sl_engine_t *e, int copies, int n_gen,
                        int32_t out[][64]) {
  int total = N_PROMPTS * copies;
  result *r = sl_calloc((size_t)total, sizeof *r);
  for (int i = 0; i < total; i++) {
    int32_t *ids;
    int n = tokenize(PROMPTS[i % N_PROMPTS], &ids);
    result_init(&r[i]);
    sl_gen_params p = greedy(n_gen);
    CHECK_OK(sl_engine_submit(e, ids, n, &p, on_event, &r[i], NULL));
    sl_free(ids);
    if (copies == 1)
      result_wait(&r[i]); /* alone */
  }
  for (int i = 0; i < total; i++) {
    result_wait(&r[i]);
    CHECK_EQ_INT(r[i].n, n_gen);
    if (i < N_PROMPTS || copies == 1)
      memcpy(out[i % N_PROMPTS], r[i].toks, sizeof(int32_t) * (size_t)n_gen);
    else
      CHECK_MSG(!memcmp(out[i % N_PROMPTS], r[i].toks,
                        sizeof(int32_t) * (size_t)n_gen),
                "prompt %d: copy %d differs from copy 0", i % N_PROMPTS,
                i / N_PROMPTS);
  }
  sl_free(r);
}

static int common_prefix(const int32_t *a, const int32_t *b, int n) {
  int i = 0;
  while (i < n && a[i] == b[i])
    i++;
  return i;
}

static void test_batch_invariance_and_cpu_agreement(void) {
  enum { N_GEN = 32 };
  int32_t alone[N_PROMPTS][64], batch[N_PROMPTS][64], cpu[N_PROMPTS][64];
  sl_engine_t *g = make_engine(SL_ENGINE_DEVICE_CUDA, 16);
  CHECK(g != NULL);
  if (!g)
    return;
  run_prompts(g, 1, N_GEN, alone);
  run_prompts(g, 2, N_GEN, batch); /* 16 sequences at once */
  sl_engine_free(g);
  /* decode steps replay CUDA graphs; without them, the same ids */
  int32_t nograph[N_PROMPTS][64];
  setenv("SLUICE_CUDA_GRAPHS", "0", 1);
  sl_engine_t *ng = make_engine(SL_ENGINE_DEVICE_CUDA, 16);
  unsetenv("SLUICE_CUDA_GRAPHS");
  CHECK(ng != NULL);
  if (ng) {
    run_prompts(ng, 1, N_GEN, nograph);
    sl_engine_free(ng);
    for (int p = 0; p < N_PROMPTS; p++)
      CHECK_MSG(!memcmp(alone[p], nograph[p], sizeof(int32_t) * N_GEN),
                "prompt %d: with and without CUDA graphs differ at token %d", p,
                common_prefix(alone[p], nograph[p], N_GEN));
  }
  for (int p = 0; p < N_PROMPTS; p++)
    CHECK_MSG(!memcmp(alone[p], batch[p], sizeof(int32_t) * N_GEN),
              "prompt %d: alone and in a batch of 16 differ at token %d", p,
              common_prefix(alone[p], batch[p], N_GEN));
  sl_engine_t *c = make_engine(SL_ENGINE_DEVICE_CPU, 16);
  CHECK(c != NULL);
  if (!c)
    return;
  run_prompts(c, 1, N_GEN, cpu);
  sl_engine_free(c);
  /* The CPU quantizes activations to Q8 as ggml does and the GPU does not:
   * measured against float64 on this model's corpus (tools/gpu/
   * vs_llamacpp.py) the GPU's top-1 is 99.8% and the CPU's ~95%, its
   * |error| at the top token 0.6 at p99 (llama.cpp's: 0.62). So the two
   * texts may part where the CPU's noise can flip the choice: at the first
   * difference, the CPU's token must be within NEAR_TIE of the GPU's best
   * logit there (the GPU's logits for that very prefix, from a fresh GPU
   * context). A planted fault (a wrong rope, a dropped scale) parts at once
   * by several logits. */
  const float NEAR_TIE = 1.0f;
  sl_stream_t *gs = sl_thread_stream(g_dev);
  sl_ctx_t *ctx = NULL;
  CHECK_OK(sl_ctx_create(g_model, gs, 1024, 1, &ctx));
  int64_t nv = sl_model_hparams_of(g_model)->n_vocab;
  float *lg = sl_malloc(sizeof(float) * (size_t)nv);
  int same = 0;
  for (int p = 0; p < N_PROMPTS && ctx; p++) {
    int k = common_prefix(alone[p], cpu[p], N_GEN);
    same += k == N_GEN;
    if (k == N_GEN) {
      fprintf(stderr, "  prompt %d: CPU and GPU agree on all %d tokens\n", p,
              N_GEN);
      continue;
    }
    int32_t *ids;
    int n = tokenize(PROMPTS[p], &ids);
    int32_t *seq = sl_malloc(sizeof(int32_t) * (size_t)(n + k));
    memcpy(seq, ids, sizeof(int32_t) * (size_t)n);
    memcpy(seq + n, alone[p], sizeof(int32_t) * (size_t)k);
    sl_ctx_truncate(ctx, 0);
    CHECK_OK(sl_ctx_eval(ctx, seq, n + k, lg, false));
    int32_t g = alone[p][k], c = cpu[p][k];
    float gap = lg[g] - lg[c];
    fprintf(stderr,
            "  prompt %d: CPU and GPU agree on %d of %d tokens; at the first "
            "difference the GPU's logits put the CPU's token %.3f below its "
            "own\n",
            p, k, N_GEN, gap);
    CHECK_MSG(fabsf(gap) <= NEAR_TIE,
              "prompt %d, token %d: not a near-tie (gap %.3f)", p, k, gap);
    sl_free(seq);
    sl_free(ids);
  }
  fprintf(stderr, "  %d of %d prompts identical on CPU and GPU\n", same,
          N_PROMPTS);
  sl_free(lg);
  sl_ctx_free(ctx);
  sl_sync_and_clear_cache(gs);
  sl_clear_thread_streams();
}

/* What the seed's bare clear would have raced: the real forward pass of a
 * 1024-token prompt queued on a non-blocking stream, then
 * sl__rt_experiment_bare_clear (drains the device default stream alone, as
 * oMLX's mx.synchronize(); mx.clear_cache()). It returns with the forward
 * pass still in flight: memory-safe in sluice (I1 keeps the buffers
 * RETIRING), but work the clear did not wait for. The owning clear on the
 * same step leaves nothing in flight. */
static void test_bare_clear_races_the_forward_pass(void) {
  const sl_model_hparams *hp = sl_model_hparams_of(g_model);
  sl_stream_t *gs = sl_thread_stream(g_dev);
  /* 1024 tokens: at 256 the H200 ran the pass about as fast as the host
   * queued its kernels, so it could be over by the time the clear ran */
  enum { T = 16, NB = 64, N = 1024 };
  sl_kv_view kv = {NULL, (int)hp->n_layer, NB, T,
                   (int)(hp->n_head_kv * hp->head_dim)};
  CHECK_OK(sl_buf_alloc(gs, sl_kv_view_bytes(&kv), &kv.buf));
  sl_batch_ctx_t *bc = NULL;
  CHECK_OK(sl_batch_ctx_create(g_model, &kv, gs, 1, &bc));
  if (!bc)
    return;
  int32_t table[NB], toks[N];
  for (int i = 0; i < NB; i++)
    table[i] = i;
  for (int i = 0; i < N; i++)
    toks[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
  sl_batch_seq sq = {table, NB, 0, 0, N, true, false, true, false, NULL, false};
  sl_batch b = {toks, N, &sq, 1};
  int32_t am;
  sl_batch_out out = {NULL, &am, NULL, NULL, NULL};
  /* the bare clear */
  CHECK_OK(sl_batch_ctx_submit(bc, &b, &out));
  uint64_t t0 = sl_now_ns();
  CHECK_OK(sl__rt_experiment_bare_clear(g_dev));
  double bare_ms = sl_ns_to_ms(sl_now_ns() - t0);
  uint64_t pending = sl_stream_query(gs).tasks;
  sl_stream_evidence ev = sl_stream_clear_evidence(gs);
  CHECK_OK(sl_batch_ctx_wait(bc));
  double after_ms = sl_stream_clear_evidence(gs).others.ms_last;
  fprintf(stderr,
          "  bare clear: returned in %.3f ms with %llu engine task(s) and %llu "
          "bytes still in flight; that work ran %.3f ms more\n",
          bare_ms, (unsigned long long)pending,
          (unsigned long long)ev.others.bytes_last, after_ms);
  CHECK_MSG(pending > 0, "the forward pass was not in flight at the clear");
  CHECK(ev.others.bytes_last > 0);
  /* the owning clear */
  CHECK_OK(sl_batch_ctx_submit(bc, &b, &out));
  uint64_t before = sl_stream_query(gs).tasks;
  t0 = sl_now_ns();
  CHECK_OK(sl_sync_and_clear_cache(gs));
  double own_ms = sl_ns_to_ms(sl_now_ns() - t0);
  sl_alloc_stats a = sl_alloc_get_stats(g_dev);
  fprintf(stderr,
          "  owning clear: %llu task(s) pending before, returned in %.3f ms; "
          "after it %llu tasks, %llu bytes in flight, %.3f ms\n",
          (unsigned long long)before, own_ms,
          (unsigned long long)sl_stream_query(gs).tasks,
          (unsigned long long)a.inflight_bytes_last, a.inflight_ms_last);
  CHECK(before > 0);
  CHECK_EQ_INT((int)sl_stream_query(gs).tasks, 0);
  CHECK(a.inflight_bytes_last == 0);
  CHECK(a.inflight_ms_last == 0.0);
  CHECK_OK(sl_batch_ctx_wait(bc));
  sl_batch_ctx_free(bc);
  sl_buf_release(kv.buf);
  sl_sync_and_clear_cache(gs);
  sl_clear_thread_streams();
}

static void test_upload_that_cannot_fit(void) {
  /* a device memory limit below the weights: a clear error, no crash */
  sl_alloc_set_limit(g_dev, 16u << 20);
  sl_engine_t *e = make_engine(SL_ENGINE_DEVICE_CUDA, 4);
  CHECK(e == NULL);
  if (e)
    sl_engine_free(e);
  sl_alloc_set_limit(g_dev, 0);
  sl_engine_t *ok = make_engine(SL_ENGINE_DEVICE_CUDA, 4);
  CHECK(ok != NULL); /* and the device is still usable */
  if (ok)
    sl_engine_free(ok);
}

int main(void) {
  if (sl_device_get(SL_DEVICE_CUDA, 0, &g_dev) != SL_OK) {
    fprintf(stderr, "skipping: no CUDA device\n");
    return 77;
  }
  int rc = load_default_model(&g_model, &g_tok);
  if (rc)
    return rc;
  RUN(test_device_is_gpu);
  RUN(test_clear_sites_with_forward_in_flight);
  RUN(test_batch_invariance_and_cpu_agreement);
  RUN(test_bare_clear_races_the_forward_pass);
  RUN(test_upload_that_cannot_fit);
  sl_tokenizer_free(g_tok);
  sl_model_free(g_model);
  sl_rt_shutdown();
  return sl_test_finish();
}
