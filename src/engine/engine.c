/* The engine: its API (any thread) and its executor thread, which runs the
 * scheduler (scheduler.c) step after step. Text and stop strings are
 * detok.c's.
 *
 * Threads: HTTP threads call sl_engine_submit / abort / get_stats, which only
 * touch the inbox (under `mu`). Everything else — the scheduler state, the
 * KV pool, the batch context, sampling — belongs to the executor thread, and
 * all of the model's compute is submitted on that thread's own stream.
 *
 * A step (DESIGN.md, "Request flow"): apply aborts; admit waiting requests
 * (prefix lookup, memory guard, block reservation); build one batch with a
 * decode token for every running sequence and prefill chunks in the rest of
 * the token budget; run it; sample and report; finish and publish blocks.
 * Clear sites (I3, I4) all call sl_sync_and_clear_cache(engine stream).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "sluice/alloc.h"
#include "sluice/kv.h"
#include "sluice/memsync.h"
#include "sluice/util.h"

/* sl__engine_default_test_hooks: what a new engine starts with */
static sl__engine_test_hooks g_default_hooks;

sl_engine_config sl_engine_config_defaults(void) {
  sl_engine_config c = {
      .n_threads = 0,
      .n_ctx = 2048,
      .kv_block_tokens = 16,
      .kv_blocks = 0,
      .max_seqs = 16,
      .max_batched_tokens = 512,
      .prefill_chunk = 256,
      .max_memory = 0,
      .clear_every_tokens = 256,
      .hot_loop_steps = 64,
      .hot_loop_cache_bytes = 256ull << 20,
      .queue_timeout_ms = 30000,
      .draft_max = 8,
      .draft_min = 1,
  };
  return c;
}

/* ---- invariants (engine_impl.h), for SL_ASSERT
 * ------------------------------------------------------ */

static int blocks_of(const sl_engine_t *e, int n_tokens) {
  int T = e->cfg.kv_block_tokens;
  return (n_tokens + T - 1) / T;
}

bool sl__req_sanity(const sl_engine_t *e, const sl__req *r) {
  int T = e->cfg.kv_block_tokens;
  const sl_gen_params *p = &r->params;
  bool embed = p->pooling != SL_POOL_NONE;
  if (!r->tokens || embed == (r->sampler != NULL) || !r->cb ||
      r->n_prompt <= 0 || r->n_tokens < r->n_prompt ||
      r->n_tokens > e->cfg.n_ctx ||
      r->n_tokens != r->n_prompt + r->n_generated ||
      r->n_generated > p->max_tokens)
    return false;
  if (embed != (r->emb != NULL) ||
      (embed && (p->max_tokens != 0 || r->n_generated != 0)))
    return false;
  if (r->n_cached < 0 || r->n_cached > r->n_prompt || r->n_cached % T ||
      r->retries < 0 || r->retries > 2 || (r->grammar_taken && !r->matcher))
    return false;
  if (r->pend_len > r->pend_cap || (r->pend_cap && !r->pend) ||
      r->stops.n != p->n_stop)
    return false;
  if (r->t_first && r->t_first < r->t_submit)
    return false;
  switch (r->state) {
  case SL__REQ_WAITING:
    return r->n_computed == 0 && r->n_blocks == 0 && !r->first_chunk_done &&
           r->n_target == r->n_tokens;
  case SL__REQ_PREFILLING:
    if (r->n_computed < 0 || r->n_computed > r->n_target ||
        r->n_target != r->n_tokens || r->n_blocks < blocks_of(e, r->n_target))
      return false;
    break;
  case SL__REQ_RUNNING:
    if (r->n_computed != r->n_tokens - 1)
      return false;
    break;
  default: /* DONE: freed by sl__finish, never seen */
    return false;
  }
  if (!r->admitted || !r->fits_alone || !r->blocks ||
      r->n_blocks > blocks_of(e, r->n_prompt + p->max_tokens) ||
      (int64_t)r->n_blocks * T < r->n_computed)
    return false;
  int nb = sl_kv_config_of(e->kv)->n_blocks;
  for (int i = 0; i < r->n_blocks; i++)
    if (r->blocks[i] < 0 || r->blocks[i] >= nb ||
        sl_kv_block_refcount(e->kv, r->blocks[i]) < 1)
      return false;
  return true;
}

/* The executor's queues between steps: at most max_seqs active, each
 * PREFILLING or RUNNING; the waiting list WAITING, its tail its last; every
 * request sane. O(requests + their blocks). Executor thread. */
static bool sched_sanity(const sl_engine_t *e) {
  if (e->n_active < 0 || e->n_active > e->cfg.max_seqs)
    return false;
  for (int i = 0; i < e->n_active; i++) {
    const sl__req *r = e->active[i];
    if ((r->state != SL__REQ_PREFILLING && r->state != SL__REQ_RUNNING) ||
        !sl__req_sanity(e, r))
      return false;
  }
  const sl__req *last = NULL;
  for (const sl__req *r = e->waiting; r; r = r->next) {
    if (r->state != SL__REQ_WAITING || !sl__req_sanity(e, r))
      return false;
    last = r;
  }
  return e->waiting_tail == last;
}

/* ---- inbox (any thread)
 * ------------------------------------------------------ */

int sl_engine_max_new(const sl_engine_t *e, int n_prompt, int max_tokens) {
  int room = e->cfg.n_ctx - n_prompt;
  if (room < 0)
    room = 0;
  return max_tokens < room ? max_tokens : room;
}

sl_status sl_engine_submit(sl_engine_t *e, const int32_t *prompt, int n,
                           const sl_gen_params *params, sl_engine_cb cb,
                           void *user, uint64_t *id) {
  if (!e || !prompt || n <= 0 || !params || !cb)
    return SL_ERR_INVALID_ARG;
  bool embed = params->pooling != SL_POOL_NONE;
  if (embed &&
      (params->pooling != SL_POOL_MEAN && params->pooling != SL_POOL_LAST))
    return SL_ERR_INVALID_ARG;
  if (embed && sl_batch_ctx_samples_on_device(e->bctx))
    return SL_ERR_UNSUPPORTED; /* a GPU context has no hidden-state rows */
  if ((params->max_tokens <= 0 && !embed) || params->n_stop < 0 ||
      params->n_prediction < 0 || params->n_prediction > e->cfg.n_ctx ||
      (params->n_prediction && !params->prediction) ||
      params->n_stop > SL_MAX_STOP ||
      params->top_logprobs > SL_MAX_TOP_LOGPROBS)
    return SL_ERR_INVALID_ARG;
  for (int i = 0; i < params->n_stop; i++)
    if (params->stop[i] &&
        strnlen(params->stop[i], SL_MAX_STOP_BYTES + 1) > SL_MAX_STOP_BYTES)
      return SL_ERR_INVALID_ARG;
  if (params->n_logit_bias < 0 || params->n_logit_bias > SL_MAX_LOGIT_BIAS ||
      (params->n_logit_bias && !params->logit_bias))
    return SL_ERR_INVALID_ARG;
  if (n >= e->cfg.n_ctx)
    return SL_ERR_RANGE;
  const sl_model_hparams *hp = sl_model_hparams_of(e->model);
  for (int i = 0; i < n; i++)
    if (prompt[i] < 0 || prompt[i] >= hp->n_vocab)
      return SL_ERR_INVALID_ARG;
  sl__req *r = sl_calloc(1, sizeof *r);
  if (!r)
    return SL_ERR_NOMEM;
  /* an embedding generates nothing: its tokens are its prompt, and it has
   * no sampler (three vocabulary-sized arrays, ~0.8 MB at 49k: a burst of
   * 1,000 queued embedding inputs held ~620 MB resident for them) */
  int cap = embed ? n : e->cfg.n_ctx;
  r->tokens = sl_malloc(sizeof(int32_t) * (size_t)cap);
  if (!embed)
    r->sampler = sl_sampler_create(&params->sampling, (int)hp->n_vocab);
  if (!r->tokens || (!embed && !r->sampler))
    goto fail;
  if (embed && !(r->emb = sl_calloc((size_t)hp->n_embd, sizeof(float))))
    goto fail;
  if (params->grammar &&
      !(r->matcher = sl_grammar_matcher_create(params->grammar)))
    goto fail;
  if (params->n_logit_bias && !embed) { /* ids checked against the
                                            vocabulary */
    sl_status bs = sl_sampler_set_bias(r->sampler, params->logit_bias,
                                       params->n_logit_bias);
    if (bs != SL_OK) {
      sl__req_free(r);
      return bs;
    }
  }
  memcpy(r->tokens, prompt, sizeof(int32_t) * (size_t)n);
  r->n_prompt = n;
  r->n_tokens = n;
  r->n_target = n;
  r->params = *params;
  r->params.grammar = NULL;    /* the matcher holds a reference */
  r->params.logit_bias = NULL; /* the sampler holds its copy */
  r->params.n_logit_bias = 0;
  r->params.n_stop = 0;
  r->params.prediction = NULL;
  r->params.n_prediction = 0;
  if (e->spec && params->n_prediction && !embed) {
    for (int i = 0; i < params->n_prediction; i++)
      if (params->prediction[i] < 0 || params->prediction[i] >= hp->n_vocab)
        goto invalid;
    if (!(r->pred = sl_malloc(sizeof(int32_t) * (size_t)params->n_prediction)))
      goto fail;
    memcpy(r->pred, params->prediction,
           sizeof(int32_t) * (size_t)params->n_prediction);
    r->n_pred = params->n_prediction;
  }
  for (int i = 0; i < params->n_stop; i++) {
    if (!params->stop[i] || !params->stop[i][0])
      continue;
    char *s = sl_strdup(params->stop[i]);
    if (!s)
      goto fail;
    r->params.stop[r->params.n_stop++] = s;
  }
  sl_status sst = sl__stops_init(&r->stops, r->params.stop, r->params.n_stop);
  SL_ASSERT(sst == SL_OK); /* the count and the lengths were checked above */
  r->params.max_tokens = sl_engine_max_new(e, n, r->params.max_tokens);
  if (embed)
    r->params.max_tokens = 0; /* nothing is generated */
  r->cb = cb;
  r->user = user;
  r->t_submit = sl_now_ns();
  SL_ASSERT(sl__req_sanity(e, r)); /* WAITING: reads no reference count */
  pthread_mutex_lock(&e->mu);
  if (e->stopping) {
    pthread_mutex_unlock(&e->mu);
    sl__req_free(r);
    return SL_ERR_CANCELLED;
  }
  r->id = ++e->next_id;
  r->next = NULL;
  if (e->inbox_tail)
    e->inbox_tail->next = r;
  else
    e->inbox = r;
  e->inbox_tail = r;
  e->stats.waiting++;
  pthread_cond_broadcast(&e->cv); /* the admin clear waits on it too */
  pthread_mutex_unlock(&e->mu);
  if (id)
    *id = r->id;
  return SL_OK;
fail:
  sl__req_free(r);
  return SL_ERR_NOMEM;
invalid:
  sl__req_free(r);
  return SL_ERR_INVALID_ARG;
}

sl_status sl_engine_abort(sl_engine_t *e, uint64_t id) {
  sl_status st = SL_OK;
  pthread_mutex_lock(&e->mu);
  if (e->n_aborts == e->cap_aborts) {
    size_t cap = e->cap_aborts ? e->cap_aborts * 2 : SL__ABORTS_INITIAL;
    uint64_t *n = sl_realloc(e->aborts, cap * sizeof *n);
    if (n) {
      e->aborts = n;
      e->cap_aborts = cap;
    }
  }
  if (e->n_aborts < e->cap_aborts)
    e->aborts[e->n_aborts++] = id;
  else
    st = SL_ERR_NOMEM;            /* not recorded: the caller still knows */
  pthread_cond_broadcast(&e->cv); /* the admin clear waits on it too */
  pthread_mutex_unlock(&e->mu);
  return st;
}

sl_engine_stats sl_engine_get_stats(sl_engine_t *e) {
  pthread_mutex_lock(&e->mu);
  sl_engine_stats s = e->stats;
  pthread_mutex_unlock(&e->mu);
  if (e->kv) {
    sl_kv_stats k = sl_kv_stats_of(e->kv);
    s.kv_blocks_total = k.n_blocks;
    s.kv_blocks_used = k.used;
    s.kv_blocks_cached = k.cached;
  }
  return s;
}

sl_stream_t *sl__engine_draft_stream(sl_engine_t *e) {
  return e->draft_stream;
}

/* --speculative draft: the draft model (checked against the target's
 * vocabulary), its stream and its drafter. */
static sl_status draft_model_init(sl_engine_t *e) {
  char err[256] = "";
  const char *path = e->cfg.draft_model;
  if (!path || !path[0]) {
    snprintf(e->start_err, sizeof e->start_err,
             "speculative decoding with a draft model needs --draft-model");
    return SL_ERR_INVALID_ARG;
  }
  sl_draft_side ds;
  sl_status st =
      sl_draft_side_open(path, e->tok, e->cfg.n_threads, &ds, err, sizeof err);
  if (st != SL_OK) {
    snprintf(e->start_err, sizeof e->start_err, "draft model %s: %s", path,
             err);
    return st;
  }
  e->draft_model = ds.model;
  e->draft_stream = ds.stream;
  e->drafter = ds.drafter;
  return SL_OK;
}

sl__site_stats sl__engine_site_stats(sl_engine_t *e, sl__clear_site site) {
  pthread_mutex_lock(&e->mu);
  sl__site_stats s = e->sites[site];
  pthread_mutex_unlock(&e->mu);
  return s;
}

/* ---- the executor thread
 * --------------------------------------------------------- */

bool sl_engine_device_parse(const char *s, sl_engine_device *out) {
  if (!s)
    return false;
  if (!strcmp(s, "auto"))
    *out = SL_ENGINE_DEVICE_AUTO;
  else if (!strcmp(s, "cpu"))
    *out = SL_ENGINE_DEVICE_CPU;
  else if (!strcmp(s, "cuda"))
    *out = SL_ENGINE_DEVICE_CUDA;
  else
    return false;
  return true;
}

const char *sl_engine_device_name(const sl_engine_t *e) {
  return e->dev ? sl_device_name(e->dev) : "none";
}

sl_device_t *sl_engine_device_of(const sl_engine_t *e) {
  return e->dev;
}

/* The device the config asks for, or the CPU with one log line saying why
 * not. */
sl_device_t *sl_engine_resolve_device(sl_engine_device d) {
  if (d == SL_ENGINE_DEVICE_CPU)
    return sl_cpu_device();
  sl_device_t *dev = NULL;
  sl_status st = sl_device_get(SL_DEVICE_CUDA, 0, &dev);
  if (st == SL_OK)
    return dev;
  const char *why = st == SL_ERR_UNSUPPORTED ? "this build has no CUDA backend"
                                             : "no CUDA device could be opened";
  if (d == SL_ENGINE_DEVICE_CUDA)
    SL_LOGW("--device cuda: %s; running on the CPU", why);
  else
    SL_LOGI("device auto: %s; running on the CPU", why);
  return sl_cpu_device();
}

/* The KV pool's blocks: cfg->kv_blocks, or enough for max_seqs full
 * contexts, within a quarter of the memory limit when there is one. */
static int kv_block_count(const sl_model_t *m, const sl_engine_config *cfg) {
  if (cfg->kv_blocks > 0)
    return cfg->kv_blocks;
  const sl_model_hparams *hp = sl_model_hparams_of(m);
  int T = cfg->kv_block_tokens;
  uint64_t bb = sl_kv_block_bytes((int)hp->n_layer,
                                  (int)(hp->n_head_kv * hp->head_dim), T);
  int per = cfg->kv_seq_tokens > 0 && cfg->kv_seq_tokens < cfg->n_ctx
                ? cfg->kv_seq_tokens
                : cfg->n_ctx;
  uint64_t one = (uint64_t)((cfg->n_ctx + T - 1) / T);
  uint64_t want = (uint64_t)cfg->max_seqs * (uint64_t)((per + T - 1) / T);
  if (want < one)
    want = one;
  if (cfg->max_memory) {
    uint64_t cap = cfg->max_memory / 4 / bb;
    if (want > cap)
      want = cap > 16 ? cap : 16;
  }
  return (int)(want > (1u << 22) ? (1u << 22) : want);
}

int64_t sl_engine_plan_kv_tokens(const sl_model_t *m,
                                 const sl_engine_config *cfg) {
  return (int64_t)kv_block_count(m, cfg) * cfg->kv_block_tokens;
}

uint64_t sl_engine_plan_bytes(const sl_model_t *m,
                              const sl_engine_config *cfg) {
  const sl_model_hparams *hp = sl_model_hparams_of(m);
  uint64_t bb =
      sl_kv_block_bytes((int)hp->n_layer, (int)(hp->n_head_kv * hp->head_dim),
                        cfg->kv_block_tokens);
  return sl_model_weight_bytes(m) + (uint64_t)kv_block_count(m, cfg) * bb +
         cfg->hot_cache_bytes;
}

static sl_status executor_init(sl_engine_t *e) {
  const sl_model_hparams *hp = sl_model_hparams_of(e->model);
  e->dev = sl_engine_resolve_device(e->cfg.device);
  bool gpu = sl_device_kind_of(e->dev) == SL_DEVICE_CUDA;
  e->stream = sl_thread_stream(e->dev);
  if (!e->stream)
    return SL_ERR_NOMEM;
  int T = e->cfg.kv_block_tokens;
  uint64_t bb = sl_kv_block_bytes((int)hp->n_layer,
                                  (int)(hp->n_head_kv * hp->head_dim), T);
  int n_blocks = kv_block_count(e->model, &e->cfg);
  sl_kv_config kc = {(int)hp->n_layer, (int)(hp->n_head_kv * hp->head_dim), T,
                     n_blocks,
                     sl_kv_fingerprint(sl_model_fingerprint(e->model), T)};
  if (gpu) {
    /* does it fit? weights, the KV pool and a step's activations */
    uint64_t need =
        sl_model_device_weight_bytes(e->model) + (uint64_t)n_blocks * bb +
        sl_batch_activation_bytes(e->model, e->cfg.max_batched_tokens);
    uint64_t total_b = 0, free_b = sl_device_mem_available(e->dev, &total_b);
    if (total_b && need > free_b) {
      snprintf(e->start_err, sizeof e->start_err,
               "the model does not fit on %s: it needs %llu bytes (weights "
               "%llu, KV cache %llu), and %llu bytes of %llu are free",
               sl_device_name(e->dev), (unsigned long long)need,
               (unsigned long long)sl_model_device_weight_bytes(e->model),
               (unsigned long long)((uint64_t)n_blocks * bb),
               (unsigned long long)free_b, (unsigned long long)total_b);
      SL_LOGE("%s", e->start_err);
      return SL_ERR_DEVICE_OOM;
    }
  }
  sl_status st = sl_kv_pool_create(&kc, e->stream, &e->kv);
  if (st != SL_OK)
    return st;
  if (!gpu && e->cfg.kv_prefault) { /* host memory, no work queued yet */
    sl_buf_t *kb = sl_kv_buffer(e->kv);
    memset(sl_buf_ptr(kb), 0, sl_buf_size(kb));
  }
  char err[256];
  if (e->cfg.hot_cache_bytes) {
    sl_kv_ram_config rc = {.budget = e->cfg.hot_cache_bytes,
                           .fingerprint = kc.fingerprint,
                           .n_layer = kc.n_layer,
                           .kv_dim = kc.kv_dim,
                           .block_tokens = kc.block_tokens,
                           .lz4 = e->cfg.hot_cache_lz4};
    if (gpu) { /* page-locked slots: a restore copies from them directly */
      if (!(e->pinned = sl__pinned_create((size_t)bb)))
        return SL_ERR_NOMEM;
      rc.pay_alloc = sl__pinned_alloc;
      rc.pay_free = sl__pinned_free;
      rc.pay_ctx = e->pinned;
      if (rc.lz4)
        SL_LOGW("hot cache: lz4 is not used on %s (page-locked slots hold "
                "raw blocks)",
                sl_device_name(e->dev));
      rc.lz4 = false;
    }
    if ((st = sl_kv_ram_open(&rc, &e->tiers[e->n_tiers])) != SL_OK) {
      snprintf(e->start_err, sizeof e->start_err, "hot cache: %s",
               sl_status_str(st));
      SL_LOGE("%s", e->start_err);
      return st;
    }
    e->n_tiers++;
    SL_LOGI("hot cache: %.1f MiB of %shost memory%s",
            (double)e->cfg.hot_cache_bytes / (1 << 20),
            gpu ? "page-locked " : "", rc.lz4 ? ", lz4" : "");
  }
  if (e->cfg.ssd_cache_dir) {
    sl_kv_ssd_config sc = {.dir = e->cfg.ssd_cache_dir,
                           .budget = e->cfg.ssd_cache_bytes,
                           .fingerprint = kc.fingerprint,
                           .n_layer = kc.n_layer,
                           .kv_dim = kc.kv_dim,
                           .block_tokens = kc.block_tokens};
    st = sl_kv_ssd_open(&sc, &e->tiers[e->n_tiers], err, sizeof err);
    if (st != SL_OK && !e->cfg.ssd_cache_optional) {
      snprintf(e->start_err, sizeof e->start_err, "%s", err);
      SL_LOGE("%s", err);
      return st;
    }
    if (st != SL_OK) {
      SL_LOGW("%s; serving without the SSD cache", err);
    } else {
      sl_kv_tier_stats ts = sl_kv_tier_stats_of(e->tiers[e->n_tiers++]);
      SL_LOGI("SSD cache %s: %llu blocks (%llu bytes) indexed, %llu files "
              "skipped",
              e->cfg.ssd_cache_dir, (unsigned long long)ts.entries,
              (unsigned long long)ts.bytes, (unsigned long long)ts.skipped);
    }
  }
  if (e->n_tiers && (st = sl__store_start(e)) != SL_OK)
    return st;
  sl_kv_view view = sl_kv_view_of(e->kv);
  if ((st = sl_batch_ctx_create2(e->model, &view, e->stream, e->cfg.n_threads,
                                 &e->bctx, err, sizeof err)) != SL_OK) {
    snprintf(e->start_err, sizeof e->start_err, "engine on %s: %s",
             sl_device_name(e->dev), err[0] ? err : sl_status_str(st));
    SL_LOGE("%s", e->start_err);
    return st;
  }
  size_t ms = (size_t)e->cfg.max_seqs + 1;
  size_t bt = (size_t)e->cfg.max_batched_tokens;
  /* speculative decoding: on a CPU engine (its rows are on the host) */
  int ng = e->cfg.draft_ngram > 0 ? e->cfg.draft_ngram : 4;
  e->draft = (sl_draft_params){e->cfg.draft_max, e->cfg.draft_min, ng,
                               ng < 2 ? ng : 2};
  if (e->cfg.speculative && !sl_draft_params_ok(&e->draft, err, sizeof err)) {
    snprintf(e->start_err, sizeof e->start_err, "speculative decoding: %s",
             err);
    return SL_ERR_INVALID_ARG;
  }
  e->spec = e->cfg.speculative && !sl_batch_ctx_samples_on_device(e->bctx);
  if (e->spec && e->cfg.speculative == 2) {
    if ((st = draft_model_init(e)) != SL_OK)
      return st;
  } else if (e->spec && !(e->drafter = sl_drafter_ngram_create(&e->draft))) {
    return SL_ERR_NOMEM;
  }
  if (e->spec) {
    e->spec_cost = SL__SPEC_COST_DEFAULT;
    e->spec_req = sl_calloc(ms, sizeof *e->spec_req);
    e->spec_prop = sl_calloc(ms, sizeof *e->spec_prop);
    e->spec_take = sl_calloc(ms, sizeof *e->spec_take);
    e->spec_alpha = sl_calloc(ms, sizeof *e->spec_alpha);
    if (!e->spec_req || !e->spec_prop || !e->spec_take || !e->spec_alpha)
      return SL_ERR_NOMEM;
  }
  /* logits rows: one a sequence, and every draft's (within the step's
   * token budget) */
  size_t rows = ms + (e->spec ? (ms * (size_t)e->cfg.draft_max < bt
                                     ? ms * (size_t)e->cfg.draft_max
                                     : bt)
                              : 0);
  e->active = sl_calloc(ms, sizeof *e->active);
  e->logits = sl_malloc(sizeof(float) * (size_t)hp->n_vocab * rows);
  e->logits_tmp = sl_malloc(sizeof(float) * (size_t)hp->n_vocab);
  e->argmax = sl_malloc(sizeof(int32_t) * rows);
  /* SLUICE_DEVICE_SAMPLING=0: the host samples every row (as before the
   * device sampler; for tests and comparisons) */
  const char *ds = getenv("SLUICE_DEVICE_SAMPLING");
  e->dev_sampling =
      sl_batch_ctx_samples_on_device(e->bctx) && !(ds && !strcmp(ds, "0"));
  if (e->dev_sampling) {
    e->batch_samp = sl_malloc(sizeof(sl_kcu_sample_params) * (ms + bt));
    e->sampled = sl_malloc(sizeof(sl_kcu_sample_out) * (ms + bt));
    if (!e->batch_samp || !e->sampled)
      return SL_ERR_NOMEM;
  }
  e->batch_tokens = sl_malloc(sizeof(int32_t) * bt);
  e->batch_seqs = sl_malloc(sizeof(sl_batch_seq) * (ms + bt));
  e->batch_reqs = sl_malloc(sizeof(sl__req *) * (ms + bt));
  if (!e->active || !e->logits || !e->logits_tmp || !e->argmax ||
      !e->batch_tokens || !e->batch_seqs || !e->batch_reqs)
    return SL_ERR_NOMEM;
  return SL_OK;
}

static void executor_fini(sl_engine_t *e) {
  /* end everything still here */
  for (int i = e->n_active - 1; i >= 0; i--) {
    sl__req *r = e->active[i];
    e->n_active--;
    sl__finish(e, r, SL_FINISH_ABORT, SL_OK, SL_REASON_NONE, NULL);
  }
  sl__take_inbox(e); /* what was just submitted ends with the waiting */
  while (e->waiting) {
    sl__req *r = e->waiting;
    e->waiting = r->next;
    sl__finish(e, r, SL_FINISH_ABORT, SL_OK, SL_REASON_NONE, NULL);
  }
  e->waiting_tail = NULL;
  sl__store_stop(e); /* writes what is queued; needs the pool */
  for (int i = 0; i < e->n_tiers; i++)
    sl_kv_tier_close(e->tiers[i]);
  e->n_tiers = 0;
  sl__pinned_destroy(e->pinned); /* the hot tier's slots, after it */
  e->pinned = NULL;
  if (e->stream)
    sl__clear_at_site(e, SL__SITE_SHUTDOWN);
  sl_batch_ctx_free(e->bctx);
  sl_kv_pool_free(e->kv);
  sl_free(e->active);
  sl_free(e->logits);
  sl_free(e->logits_tmp);
  sl_grammar_vocab_free(e->gvocab);
  sl_free(e->gmask);
  sl_free(e->hidden);
  sl_free(e->argmax);
  sl_free(e->batch_samp);
  sl_free(e->sampled);
  sl_free(e->batch_tokens);
  sl_free(e->batch_seqs);
  sl_free(e->batch_reqs);
  sl_free(e->spec_req);
  sl_free(e->spec_prop);
  sl_free(e->spec_take);
  sl_free(e->spec_alpha);
  sl_drafter_free(e->drafter); /* after every request's sequence state */
  e->drafter = NULL;
  sl_stream_destroy(e->draft_stream); /* drained: its contexts' buffers are
                                         cached, returned by the clear */
  e->draft_stream = NULL;
  if (e->stream && sl_sync_and_clear_cache(e->stream) != SL_OK)
    SL_LOGW("engine: an error was pending on the engine stream at shutdown");
  sl_model_free(e->draft_model); /* its packed weights: after the clear */
  e->draft_model = NULL;
  sl_clear_thread_streams(); /* I5 */
}

static void *executor_main(void *p) {
  sl_engine_t *e = p;
  sl_status st = executor_init(e);
  /* the load's transforms (repacked weights, the device upload) ran on the
   * engine stream: their temporaries go at the engine's own clear, before
   * sl_engine_create returns (so a test's later hooks do not race it) */
  if (st == SL_OK)
    sl__clear_at_site(e, SL__SITE_LOAD);
  pthread_mutex_lock(&e->mu);
  e->start_status = st;
  e->started = true;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  if (st != SL_OK) {
    executor_fini(e);
    return NULL;
  }
  uint64_t evictions_seen = sl_kv_stats_of(e->kv).evictions;
  bool idle_cleared = true;
  for (;;) {
    pthread_mutex_lock(&e->mu);
    while (!e->stopping && !e->inbox && !e->n_aborts && !e->waiting &&
           e->n_active == 0 && e->clears_asked == e->clears_done) {
      if (!idle_cleared) {
        pthread_mutex_unlock(&e->mu);
        sl__clear_at_site(e, SL__SITE_IDLE); /* idle reclaim */
        idle_cleared = true;
        pthread_mutex_lock(&e->mu);
        continue;
      }
      pthread_cond_wait(&e->cv, &e->mu);
    }
    if (e->stopping) {
      pthread_mutex_unlock(&e->mu);
      break;
    }
    uint64_t asked = e->clears_asked;
    pthread_mutex_unlock(&e->mu);
    if (asked != e->clears_done) { /* the admin's clear, on our stream */
      sl__clear_at_site(e, SL__SITE_ADMIN);
      pthread_mutex_lock(&e->mu);
      e->clears_done = asked;
      pthread_cond_broadcast(&e->cv);
      pthread_mutex_unlock(&e->mu);
    }
    sl__take_inbox(e);
    sl__store_collect(e);
    idle_cleared = false;
    sl__apply_aborts(e);
    sl__admit_waiting(e);
    sl__step(e);
    /* prefix blocks evicted for this step's room: clear on our stream */
    uint64_t ev = sl_kv_stats_of(e->kv).evictions;
    if (ev != evictions_seen) {
      evictions_seen = ev;
      sl__clear_at_site(e, SL__SITE_KV_EVICT);
    }
    if (e->clear_error != SL_OK) { /* errors reach the requests */
      sl__fail_active(e, e->clear_error);
      e->clear_error = SL_OK;
    }
    /* between steps, every request's state: O(requests + their blocks)
     * each step, so in debug mode only (I8's switch), off the hot path */
    SL_ASSERT(!sl_rt_debug() || sched_sanity(e));
  }
  executor_fini(e);
  return NULL;
}

sl_status sl_engine_create(sl_model_t *model, const sl_tokenizer_t *tok,
                           const sl_engine_config *cfg, sl_engine_t **out) {
  return sl_engine_create2(model, tok, cfg, out, NULL, 0);
}

sl_status sl_engine_create2(sl_model_t *model, const sl_tokenizer_t *tok,
                            const sl_engine_config *cfg, sl_engine_t **out,
                            char *err, size_t errcap) {
  if (err && errcap)
    err[0] = 0;
  if (!model || !tok || !cfg || !out)
    return SL_ERR_INVALID_ARG;
  if (cfg->n_ctx < 16 || cfg->kv_block_tokens < 1 ||
      cfg->kv_block_tokens > 4096 ||
      (cfg->kv_block_tokens & (cfg->kv_block_tokens - 1)) != 0 ||
      cfg->max_seqs < 1 || cfg->max_seqs > 4096 ||
      cfg->max_batched_tokens < cfg->max_seqs || cfg->prefill_chunk < 1)
    return SL_ERR_INVALID_ARG;
  sl_engine_t *e = sl_calloc(1, sizeof *e);
  if (!e)
    return SL_ERR_NOMEM;
  e->model = model;
  e->tok = tok;
  e->n_embd = (int)sl_model_hparams_of(model)->n_embd;
  e->cfg = *cfg;
  if (e->cfg.prefill_chunk > e->cfg.max_batched_tokens)
    e->cfg.prefill_chunk = e->cfg.max_batched_tokens;
  e->hooks = g_default_hooks;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  if (pthread_create(&e->thread, NULL, executor_main, e) != 0) {
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    sl_free(e);
    return SL_ERR_THREAD;
  }
  pthread_mutex_lock(&e->mu);
  while (!e->started)
    pthread_cond_wait(&e->cv, &e->mu);
  sl_status st = e->start_status;
  pthread_mutex_unlock(&e->mu);
  if (st != SL_OK) {
    pthread_join(e->thread, NULL);
    if (err && errcap)
      snprintf(err, errcap, "%s", e->start_err);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    sl_free(e);
    return st;
  }
  *out = e;
  return SL_OK;
}

void sl_engine_free(sl_engine_t *e) {
  if (!e)
    return;
  pthread_mutex_lock(&e->mu);
  e->stopping = true;
  pthread_cond_broadcast(&e->cv); /* the admin clear waits on it too */
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->thread, NULL);
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->mu);
  sl_free(e->aborts);
  sl_free(e);
}

sl_status sl_engine_clear_cache(sl_engine_t *e) {
  if (!e)
    return SL_ERR_INVALID_ARG;
  pthread_mutex_lock(&e->mu);
  uint64_t want = ++e->clears_asked;
  pthread_cond_broadcast(&e->cv);
  while (e->clears_done < want && !e->stopping)
    pthread_cond_wait(&e->cv, &e->mu);
  bool done = e->clears_done >= want;
  pthread_mutex_unlock(&e->mu);
  return done ? SL_OK : SL_ERR_CANCELLED;
}

void sl__engine_default_test_hooks(const sl__engine_test_hooks *h) {
  if (h)
    g_default_hooks = *h;
  else
    memset(&g_default_hooks, 0, sizeof g_default_hooks);
}

void sl__engine_set_test_hooks(sl_engine_t *e, const sl__engine_test_hooks *h) {
  pthread_mutex_lock(&e->mu);
  e->hooks = *h;
  pthread_mutex_unlock(&e->mu);
}
