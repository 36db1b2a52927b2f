/* Sampling on the device (sl_kcu_sample wired into the CUDA step and the
 * engine), on the default model:
 *
 *  - the batch context: a sampled sequence's token and logprobs come back
 *    without its logits row (left unwritten), a greedy one equals the
 *    argmax, and a row the device cannot decide (id -1) is fetched with
 *    sl_batch_ctx_fetch_row and equals the row a plain step copies back;
 *  - the engine: seeded sampled generation (T 1 without cuts; T 0.8, top-k
 *    40, top-p 0.95, min-p 0.05; with penalties; top-p alone; with top
 *    logprobs; greedy with penalties and with logprobs; a forced fallback,
 *    top-k 5000; a penalty window wider than the device takes) gives the
 *    same tokens, and logprobs within 1e-4, with SLUICE_DEVICE_SAMPLING on
 *    and off, all requests in one batch; the stats say where the tokens
 *    were picked.
 *
 * Skips (77) without CUDA or a GPU, or without the model. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "default_model.h"
#include "harness.h"
#include "sluice/alloc.h"
#include "sluice/engine.h"
#include "sluice/kern_cuda.h"
#include "sluice/memsync.h"
#include "sluice/model.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

static sl_model_t *g_model;
static sl_tokenizer_t *g_tok;
static sl_device_t *g_dev;

#define MAX_GEN 256
#define N_TOP   5

/* One request's tokens and logprobs. */
typedef struct run {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  sl_finish finish;
  int n;
  int32_t tok[MAX_GEN];
  float lp[MAX_GEN];
  int n_top[MAX_GEN];
  sl_token_logprob top[MAX_GEN][N_TOP];
} run;

static void run_init(run *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
}

static void on_event(void *ud, const sl_engine_event *ev) {
  run *r = ud;
  pthread_mutex_lock(&r->mu);
  if (ev->kind == SL_EV_TOKEN && ev->token >= 0 && r->n < MAX_GEN) {
    r->tok[r->n] = ev->token;
    r->lp[r->n] = ev->logprob;
    r->n_top[r->n] = ev->n_top < N_TOP ? ev->n_top : N_TOP;
    for (int k = 0; k < r->n_top[r->n]; k++)
      r->top[r->n][k] = ev->top[k];
    r->n++;
  }
  if (ev->kind == SL_EV_DONE) {
    r->done = true;
    r->finish = ev->finish;
    pthread_cond_broadcast(&r->cv);
  }
  pthread_mutex_unlock(&r->mu);
}

static void run_wait(run *r) {
  pthread_mutex_lock(&r->mu);
  while (!r->done)
    pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
}

static int tokenize(const char *text, int32_t **ids) {
  size_t n = 0;
  if (sl_tokenizer_encode(g_tok, text, strlen(text), false, true, ids, &n) !=
      SL_OK)
    return -1;
  return (int)n;
}

/* ---- the batch context ---- */

static void test_batch_ctx_sampling_and_fetch(void) {
  const sl_model_hparams *hp = sl_model_hparams_of(g_model);
  int64_t nv = hp->n_vocab;
  sl_stream_t *gs = sl_thread_stream(g_dev);
  enum { T = 16, NB = 8, N = 40 };
  sl_kv_view kv = {NULL, (int)hp->n_layer, 3 * NB, T,
                   (int)(hp->n_head_kv * hp->head_dim)};
  CHECK_OK(sl_buf_alloc(gs, sl_kv_view_bytes(&kv), &kv.buf));
  sl_batch_ctx_t *bc = NULL;
  CHECK_OK(sl_batch_ctx_create(g_model, &kv, gs, 1, &bc));
  if (!bc)
    return;
  CHECK(sl_batch_ctx_samples_on_device(bc));
  /* three copies of one prompt, each in its own blocks: plain (logits back),
   * greedy on the device with logprobs, and a forced fallback (top-k past
   * SL_KCU_SAMPLE_MAX_SORT, no min-p or top-p cut: id -1) */
  int32_t table[3][NB], toks[3 * N];
  for (int s = 0; s < 3; s++)
    for (int i = 0; i < NB; i++)
      table[s][i] = s * NB + i;
  for (int i = 0; i < N; i++)
    toks[i] = toks[N + i] = toks[2 * N + i] = (int32_t)((i * 7919 + 13) % nv);
  sl_kcu_sample_params greedy, fb;
  memset(&greedy, 0, sizeof greedy);
  greedy.repeat_penalty = 1.0f;
  greedy.top_p = 1.0f;
  greedy.n_top = 3;
  fb = greedy;
  fb.temperature = 1.0f;
  fb.top_k = 5000;
  fb.n_top = -1;
  fb.r = 0.5;
  sl_batch_seq sq[3] = {
      {table[0], NB, 0, 0, N, true, false, false, false, NULL, false},
      {table[1], NB, 0, N, N, true, false, false, false, &greedy, false},
      {table[2], NB, 0, 2 * N, N, true, false, false, false, &fb, false}};
  sl_batch b = {toks, 3 * N, sq, 3};
  float *lg = sl_malloc(sizeof(float) * (size_t)(3 * nv));
  float *row = sl_malloc(sizeof(float) * (size_t)nv);
  for (int64_t i = 0; i < 3 * nv; i++)
    lg[i] = 12345.0f; /* a sampled row must stay as it is */
  int32_t am[3];
  sl_kcu_sample_out so[3];
  memset(so, 0x7f, sizeof so);
  sl_batch_out out = {lg, am, NULL, so, NULL};
  CHECK(sl_batch_ctx_fetch_row(bc, 0, row) == SL_ERR_STATE);
  CHECK_OK(sl_batch_ctx_submit(bc, &b, &out));
  CHECK_OK(sl_batch_ctx_wait(bc));
  /* the plain sequence's row came back; the sampled ones' did not */
  CHECK(lg[0] != 12345.0f);
  CHECK(lg[nv] == 12345.0f && lg[2 * nv - 1] == 12345.0f);
  CHECK(lg[2 * nv] == 12345.0f);
  /* the fallback: id -1, so the step's rows stay on the device; the
   * greedy sequence's token is its row's argmax, its logprob the host's */
  CHECK_EQ_INT(so[2].id, -1);
  CHECK_EQ_INT(so[1].id, am[1]);
  CHECK_EQ_INT(so[1].top_id[0], am[1]);
  CHECK_OK(sl_batch_ctx_fetch_row(bc, 1, row));
  double mx = row[0], sum = 0;
  for (int64_t i = 1; i < nv; i++)
    mx = row[i] > mx ? row[i] : mx;
  for (int64_t i = 0; i < nv; i++)
    sum += exp((double)row[i] - mx);
  double want = (double)row[am[1]] - mx - log(sum);
  CHECK_MSG(fabs(so[1].logprob - want) < 1e-4, "logprob %f, host %f",
            so[1].logprob, want);
  CHECK_MSG(fabs(so[1].top_logprob[0] - want) < 1e-4, "top %f, host %f",
            so[1].top_logprob[0], want);
  CHECK(row[am[1]] == (float)mx);
  CHECK_OK(sl_batch_ctx_fetch_row(bc, 2, row));
  CHECK(sl_batch_ctx_fetch_row(bc, 3, row) == SL_ERR_INVALID_ARG);
  /* a sampled sequence must want its last row only */
  sq[1].all_logits = true;
  CHECK(sl_batch_ctx_submit(bc, &b, &out) == SL_ERR_INVALID_ARG);
  sq[1].all_logits = false;
  sl_batch_out no_sampled = {lg, am, NULL, NULL, NULL};
  CHECK(sl_batch_ctx_submit(bc, &b, &no_sampled) == SL_ERR_INVALID_ARG);
  /* the same step without the fallback: row 2 comes back as it was
   * fetched, and nothing is left to fetch */
  sq[2].sample = NULL;
  CHECK_OK(sl_batch_ctx_submit(bc, &b, &out));
  CHECK_OK(sl_batch_ctx_wait(bc));
  CHECK(!memcmp(row, lg + 2 * nv, sizeof(float) * (size_t)nv));
  CHECK(sl_batch_ctx_fetch_row(bc, 2, row) == SL_ERR_STATE);
  sl_free(row);
  sl_free(lg);
  sl_batch_ctx_free(bc);
  sl_buf_release(kv.buf);
  sl_sync_and_clear_cache(gs);
  sl_clear_thread_streams();
}

/* ---- the engine, device sampling on and off ---- */

typedef struct gen_case {
  const char *name;
  float temperature;
  int top_k;
  float top_p, min_p;
  float repeat, presence, frequency;
  int last_n;
  int top_logprobs;
  int max_tokens;
} gen_case;

static const gen_case CASES[] = {
    {"T1, no cuts", 1.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0, 64, -1, 48},
    {"T0.8 k40 p0.95 minp0.05", 0.8f, 40, 0.95f, 0.05f, 1.0f, 0, 0, 64, -1, 48},
    {"penalties", 0.8f, 40, 0.95f, 0.05f, 1.1f, 0.5f, 0.3f, 64, -1, 48},
    {"top-p alone", 1.0f, 0, 0.9f, 0.0f, 1.0f, 0, 0, 64, -1, 48},
    {"T1, top_logprobs 5", 1.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0, 64, 5, 48},
    {"T0.8 k40, top_logprobs 2", 0.8f, 40, 0.95f, 0.05f, 1.0f, 0, 0, 64, 2, 48},
    {"greedy, penalties", 0.0f, 0, 1.0f, 0.0f, 1.3f, 0.2f, 0.1f, 64, -1, 48},
    {"greedy, top_logprobs 3", 0.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0, 64, 3, 48},
    {"greedy", 0.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0, 64, -1, 48},
    {"fallback: top-k 5000", 1.0f, 5000, 1.0f, 0.0f, 1.0f, 0, 0, 64, 1, 32},
    /* the window outgrows SL_KCU_SAMPLE_MAX_PEN: the host takes over */
    {"wide penalty window", 1.0f, 0, 1.0f, 0.0f, 1.05f, 0, 0, 256, -1, 200},
};
#define N_CASES       ((int)(sizeof CASES / sizeof CASES[0]))
#define FALLBACK_CASE 9

static const char *const PROMPTS[] = {
    "Once upon a time, in a small village by the sea,",
    ("<|im_start|>user\nWrite a short poem about rain.<|im_end|>\n"
     "<|im_start|>assistant\n"),
    "The three laws of thermodynamics are",
};
#define N_PROMPTS ((int)(sizeof PROMPTS / sizeof PROMPTS[0]))

static sl_engine_t *make_engine(bool device_sampling) {
  sl_engine_config cfg = sl_engine_config_defaults();
  cfg.device = SL_ENGINE_DEVICE_CUDA;
  cfg.n_ctx = 512;
  cfg.max_seqs = 48;
  cfg.prefill_chunk = 64;
  cfg.max_batched_tokens = 256;
  cfg.kv_block_tokens = 16;
  cfg.n_threads = 2;
  setenv("SLUICE_DEVICE_SAMPLING", device_sampling ? "1" : "0", 1);
  sl_engine_t *e = NULL;
  sl_status st = sl_engine_create(g_model, g_tok, &cfg, &e);
  unsetenv("SLUICE_DEVICE_SAMPLING");
  return st == SL_OK ? e : NULL;
}

/* Every case on every prompt, all submitted at once (one batch). */
static void run_cases(sl_engine_t *e, run *out, sl_engine_stats *stats) {
  for (int c = 0; c < N_CASES; c++)
    for (int p = 0; p < N_PROMPTS; p++) {
      const gen_case *g = &CASES[c];
      run *r = &out[c * N_PROMPTS + p];
      run_init(r);
      sl_gen_params gp;
      memset(&gp, 0, sizeof gp);
      gp.max_tokens = g->max_tokens;
      gp.sampling = sl_sampler_defaults();
      gp.sampling.temperature = g->temperature;
      gp.sampling.top_k = g->top_k;
      gp.sampling.top_p = g->top_p;
      gp.sampling.min_p = g->min_p;
      gp.sampling.repeat_penalty = g->repeat;
      gp.sampling.presence_penalty = g->presence;
      gp.sampling.frequency_penalty = g->frequency;
      gp.sampling.penalty_last_n = g->last_n;
      gp.sampling.seed = 1000u + (uint64_t)(c * N_PROMPTS + p);
      gp.top_logprobs = g->top_logprobs;
      gp.ignore_eos = true;
      int32_t *ids;
      int n = tokenize(PROMPTS[p], &ids);
      CHECK(n > 0);
      CHECK_OK(sl_engine_submit(e, ids, n, &gp, on_event, r, NULL));
      sl_free(ids);
    }
  for (int i = 0; i < N_CASES * N_PROMPTS; i++)
    run_wait(&out[i]);
  *stats = sl_engine_get_stats(e);
}

static void test_engine_device_vs_host(void) {
  int total = N_CASES * N_PROMPTS;
  run *dev = sl_calloc((size_t)total, sizeof *dev);
  run *host = sl_calloc((size_t)total, sizeof *host);
  sl_engine_stats sd, sh;
  sl_engine_t *e = make_engine(true);
  CHECK(e != NULL);
  if (!e)
    goto done;
  run_cases(e, dev, &sd);
  sl_engine_free(e);
  e = make_engine(false);
  CHECK(e != NULL);
  if (!e)
    goto done;
  run_cases(e, host, &sh);
  sl_engine_free(e);
  for (int c = 0; c < N_CASES; c++)
    for (int p = 0; p < N_PROMPTS; p++) {
      const gen_case *g = &CASES[c];
      const run *a = &dev[c * N_PROMPTS + p], *b = &host[c * N_PROMPTS + p];
      CHECK_EQ_INT(a->n, g->max_tokens);
      CHECK_EQ_INT(b->n, g->max_tokens);
      int k = 0;
      while (k < a->n && k < b->n && a->tok[k] == b->tok[k])
        k++;
      CHECK_MSG(k == g->max_tokens,
                "%s, prompt %d: device and host part at token %d (%d vs %d)",
                g->name, p, k, k < a->n ? a->tok[k] : -1,
                k < b->n ? b->tok[k] : -1);
      if (g->top_logprobs < 0)
        continue;
      float worst = 0;
      for (int t = 0; t < k; t++) {
        float d = fabsf(a->lp[t] - b->lp[t]);
        worst = d > worst ? d : worst;
        CHECK_EQ_INT(a->n_top[t], b->n_top[t]);
        for (int j = 0; j < a->n_top[t] && j < b->n_top[t]; j++) {
          const sl_token_logprob *x = &a->top[t][j], *y = &b->top[t][j];
          d = fabsf(x->logprob - y->logprob);
          worst = d > worst ? d : worst;
          /* the same entry, or two whose logprobs round to a tie */
          CHECK_MSG(x->id == y->id || d < 1e-5f,
                    "%s, prompt %d, token %d: top %d is %d vs %d", g->name, p,
                    t, j, x->id, y->id);
        }
      }
      CHECK_MSG(worst < 1e-4f, "%s, prompt %d: logprobs differ by %g", g->name,
                p, worst);
      fprintf(stderr,
              "  %-26s prompt %d: %d tokens equal, logprobs within %g\n",
              g->name, p, k, worst);
    }
  /* where the tokens were picked */
  fprintf(stderr,
          "  device sampling on:  argmax %llu, device %llu, host %llu "
          "(fallbacks %llu)\n"
          "  device sampling off: argmax %llu, device %llu, host %llu "
          "(fallbacks %llu)\n",
          (unsigned long long)sd.argmax_device,
          (unsigned long long)sd.sampled_device,
          (unsigned long long)sd.sampled_host,
          (unsigned long long)sd.sample_fallbacks,
          (unsigned long long)sh.argmax_device,
          (unsigned long long)sh.sampled_device,
          (unsigned long long)sh.sampled_host,
          (unsigned long long)sh.sample_fallbacks);
  uint64_t gen = 0, fb_min = (uint64_t)CASES[FALLBACK_CASE].max_tokens *
                             (uint64_t)N_PROMPTS;
  for (int c = 0; c < N_CASES; c++)
    gen += (uint64_t)CASES[c].max_tokens * (uint64_t)N_PROMPTS;
  /* one pick a token, the end-of-generation token included: at most
   * max_tokens a request (fewer where one ends early), the same count both
   * ways (the same tokens) */
  const uint64_t picks_d =
                     sd.argmax_device + sd.sampled_device + sd.sampled_host,
                 picks_h =
                     sh.argmax_device + sh.sampled_device + sh.sampled_host;
  CHECK(picks_d == picks_h);
  CHECK(picks_d <= gen && picks_d > 0);
  CHECK_EQ_INT((long long)sd.argmax_device, (long long)sh.argmax_device);
  CHECK(sd.sampled_device > picks_d / 2);
  CHECK(sd.sample_fallbacks >= fb_min); /* every token of the top-k 5000 */
  CHECK(sd.sampled_host > sd.sample_fallbacks); /* and the wide window */
  CHECK_EQ_INT((long long)sh.sampled_device, 0);
  CHECK_EQ_INT((long long)sh.sample_fallbacks, 0);
done:
  sl_free(dev);
  sl_free(host);
}

int main(void) {
  if (sl_device_get(SL_DEVICE_CUDA, 0, &g_dev) != SL_OK) {
    fprintf(stderr, "skipping: no CUDA device\n");
    return 77;
  }
  int rc = load_default_model(&g_model, &g_tok);
  if (rc)
    return rc;
  RUN(test_batch_ctx_sampling_and_fetch);
  RUN(test_engine_device_vs_host);
  sl_tokenizer_free(g_tok);
  sl_model_free(g_model);
  sl_rt_shutdown();
  return sl_test_finish();
}
