/* The engine: one executor thread per model, running the scheduler.
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
  };
  return c;
}

/* ---- inbox (any thread)
 * ------------------------------------------------------ */

static void req_free(sl__req *r) {
  if (!r)
    return;
  sl_free(r->tokens);
  sl_free(r->blocks);
  sl_free(r->pend);
  for (int i = 0; i < r->params.n_stop; i++)
    sl_free((char *)r->params.stop[i]);
  sl_sampler_free(r->sampler);
  sl_free(r);
}

sl_status sl_engine_submit(sl_engine_t *e, const int32_t *prompt, int n,
                           const sl_gen_params *params, sl_engine_cb cb,
                           void *user, uint64_t *id) {
  if (!e || !prompt || n <= 0 || !params || !cb)
    return SL_ERR_INVALID_ARG;
  if (params->max_tokens <= 0 || params->n_stop < 0 ||
      params->n_stop > SL_MAX_STOP ||
      params->top_logprobs > SL_MAX_TOP_LOGPROBS)
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
  int cap = e->cfg.n_ctx;
  r->tokens = sl_malloc(sizeof(int32_t) * (size_t)cap);
  r->sampler = sl_sampler_create(&params->sampling, (int)hp->n_vocab);
  if (!r->tokens || !r->sampler)
    goto fail;
  memcpy(r->tokens, prompt, sizeof(int32_t) * (size_t)n);
  r->n_prompt = n;
  r->n_tokens = n;
  r->params = *params;
  r->params.n_stop = 0;
  for (int i = 0; i < params->n_stop; i++) {
    if (!params->stop[i] || !params->stop[i][0])
      continue;
    char *s = sl_strdup(params->stop[i]);
    if (!s)
      goto fail;
    r->params.stop[r->params.n_stop++] = s;
  }
  int max_new = cap - n;
  if (r->params.max_tokens > max_new)
    r->params.max_tokens = max_new;
  r->cb = cb;
  r->user = user;
  r->t_submit = sl_now_ns();
  pthread_mutex_lock(&e->mu);
  if (e->stopping) {
    pthread_mutex_unlock(&e->mu);
    req_free(r);
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
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
  if (id)
    *id = r->id;
  return SL_OK;
fail:
  req_free(r);
  return SL_ERR_NOMEM;
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
    st = SL_ERR_NOMEM; /* not recorded: the caller still knows */
  pthread_cond_signal(&e->cv);
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

sl__site_stats sl__engine_site_stats(sl_engine_t *e, sl__clear_site site) {
  pthread_mutex_lock(&e->mu);
  sl__site_stats s = e->sites[site];
  pthread_mutex_unlock(&e->mu);
  return s;
}

const char *sl__clear_site_name(sl__clear_site s) {
  static const char *names[] = {
#define SL__SITE_NAME(id, name) name,
      SL__CLEAR_SITES(SL__SITE_NAME)
#undef SL__SITE_NAME
  };
  return s < SL__SITE_COUNT ? names[s] : "?";
}

/* ---- executor-thread helpers
 * --------------------------------------------------- */

/* The one clear primitive, with the engine's stream (I3, I4), and the
 * evidence that nothing was in flight on it. */
static void clear_at(sl_engine_t *e, sl__clear_site site) {
  sl_stream_evidence before = sl_stream_clear_evidence(e->stream);
  sl_status st = sl_sync_and_clear_cache(e->stream);
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
  sl__site_stats *s = &e->sites[site];
  s->count++;
  if (q.tasks > s->engine_pending_max)
    s->engine_pending_max = q.tasks;
  if (found && after.own.tasks_last > s->engine_pending_max)
    s->engine_pending_max = after.own.tasks_last;
  if (found && after.own.bytes_last > s->inflight_bytes_max)
    s->inflight_bytes_max = after.own.bytes_last;
  if (after.own.ms_max > s->inflight_ms_max)
    s->inflight_ms_max = after.own.ms_max;
  pthread_mutex_unlock(&e->mu);
}

static void list_push(sl__req **head, sl__req **tail, sl__req *r) {
  r->next = NULL;
  if (*tail)
    (*tail)->next = r;
  else
    *head = r;
  *tail = r;
}

static void release_blocks(sl_engine_t *e, sl__req *r) {
  for (int i = 0; i < r->n_blocks; i++)
    sl_kv_block_unref(e->kv, r->blocks[i]);
  r->n_blocks = 0;
}

/* Publishes the request's full blocks (prompt and generated tokens whose KV
 * was computed) in the prefix cache. */
static void publish_blocks(sl_engine_t *e, sl__req *r) {
  int T = e->cfg.kv_block_tokens;
  int full = r->n_computed / T;
  uint64_t h = 0;
  for (int i = 0; i < full && i < r->n_blocks; i++) {
    h = sl_kv_hash_block(e->kv, h, r->tokens + (size_t)i * (size_t)T, T);
    sl_kv_publish(e->kv, r->blocks[i], h, r->tokens + (size_t)i * (size_t)T);
  }
}

static void emit_done(sl_engine_t *e, sl__req *r, sl_finish why, sl_status err,
                      sl_reason reason, const char *msg) {
  sl_engine_event ev;
  memset(&ev, 0, sizeof ev);
  ev.kind = SL_EV_DONE;
  ev.request_id = r->id;
  ev.prompt_tokens = r->n_prompt;
  ev.cached_tokens = r->n_cached;
  ev.completion_tokens = r->n_generated;
  ev.finish = why;
  ev.error = err;
  ev.reason = why == SL_FINISH_ERROR && reason == SL_REASON_NONE
                  ? sl_reason_of_status(err)
                  : reason;
  ev.error_msg = msg;
  ev.est_bytes = r->est_bytes;
  ev.limit_bytes = e->cfg.max_memory;
  r->cb(r->user, &ev);
}

/* Ends a request: reports, publishes and frees its blocks, frees it. */
static void finish(sl_engine_t *e, sl__req *r, sl_finish why, sl_status err,
                   sl_reason reason, const char *msg) {
  if (r->state == SL__REQ_RUNNING || r->state == SL__REQ_PREFILLING) {
    if (why != SL_FINISH_ERROR)
      publish_blocks(e, r);
    release_blocks(e, r);
    e->finished_since_clear = 1; /* decode site: K steps after a finish */
  }
  r->state = SL__REQ_DONE;
  emit_done(e, r, why, err, reason, msg);
  pthread_mutex_lock(&e->mu);
  if (why == SL_FINISH_ERROR)
    e->stats.requests_failed++;
  e->stats.generated_tokens_total += (uint64_t)r->n_generated;
  pthread_mutex_unlock(&e->mu);
  req_free(r);
}

/* ---- detokenization and stop strings
 * ------------------------------------------- */

static size_t utf8_complete_prefix(const char *s, size_t n) {
  /* length of the longest prefix that does not end inside a UTF-8 sequence */
  size_t i = n, back = 0;
  while (i > 0 && back < 4) {
    unsigned char c = (unsigned char)s[i - 1];
    if ((c & 0xC0) != 0x80) {
      size_t need = c < 0x80         ? 1
                    : (c >> 5) == 6  ? 2
                    : (c >> 4) == 14 ? 3
                    : (c >> 3) == 30 ? 4
                                     : 1;
      return back + 1 >= need ? n : i - 1;
    }
    i--;
    back++;
  }
  return n;
}

/* Appends a token's text; emits what is safe; returns true when a stop
 * string ended the request (text before it was emitted). */
static bool text_step(sl_engine_t *e, sl__req *r, int32_t tok, float lp,
                      const sl_token_logprob *top, int n_top) {
  char piece[512];
  size_t plen = 0;
  if (sl_tokenizer_token_to_piece(e->tok, tok, false, piece, sizeof piece,
                                  &plen) != SL_OK)
    plen = 0;
  if (r->pend_len + plen + 1 > r->pend_cap) {
    size_t cap = (r->pend_len + plen + 1) * 2 + 64;
    char *np = sl_realloc(r->pend, cap);
    if (!np)
      return false;
    r->pend = np;
    r->pend_cap = cap;
  }
  memcpy(r->pend + r->pend_len, piece, plen);
  r->pend_len += plen;
  /* a complete stop string? */
  size_t cut = SIZE_MAX;
  for (int i = 0; i < r->params.n_stop; i++) {
    const char *st = r->params.stop[i];
    size_t sl = strlen(st);
    for (size_t k = 0; k + sl <= r->pend_len; k++)
      if (memcmp(r->pend + k, st, sl) == 0) {
        if (k < cut)
          cut = k;
        break;
      }
  }
  size_t emit;
  bool stopped = cut != SIZE_MAX;
  if (stopped) {
    emit = cut;
  } else {
    /* hold back a suffix that could begin a stop string */
    size_t hold = 0;
    for (int i = 0; i < r->params.n_stop; i++) {
      const char *st = r->params.stop[i];
      size_t sl = strlen(st);
      for (size_t k = sl - 1; k > hold; k--)
        if (k <= r->pend_len && memcmp(r->pend + r->pend_len - k, st, k) == 0) {
          hold = k;
          break;
        }
    }
    emit = utf8_complete_prefix(r->pend, r->pend_len - hold);
  }
  sl_engine_event ev;
  memset(&ev, 0, sizeof ev);
  ev.kind = SL_EV_TOKEN;
  ev.request_id = r->id;
  ev.token = tok;
  ev.text = r->pend;
  ev.text_len = emit;
  ev.logprob = lp;
  ev.top = top;
  ev.n_top = n_top;
  ev.completion_tokens = r->n_generated;
  r->cb(r->user, &ev);
  memmove(r->pend, r->pend + emit, r->pend_len - emit);
  r->pend_len -= emit;
  if (stopped)
    r->pend_len = 0;
  return stopped;
}

/* Emits the text held back (a partial stop prefix or UTF-8 sequence is just
 * text once the request ends) as a token event with token -1. */
static void flush_pending(sl__req *r) {
  if (!r->pend_len)
    return;
  sl_engine_event ev;
  memset(&ev, 0, sizeof ev);
  ev.kind = SL_EV_TOKEN;
  ev.request_id = r->id;
  ev.token = -1;
  ev.text = r->pend;
  ev.text_len = r->pend_len;
  r->cb(r->user, &ev);
  r->pend_len = 0;
}

/* log-softmax of one logit vector (the raw distribution) at `tok`, and the
 * top-n entries. */
static float logprobs(const float *lg, int nv, int32_t tok, int n_top,
                      sl_token_logprob *top) {
  float mx = lg[0];
  for (int i = 1; i < nv; i++)
    if (lg[i] > mx)
      mx = lg[i];
  double sum = 0;
  for (int i = 0; i < nv; i++)
    sum += exp((double)(lg[i] - mx));
  float lse = mx + (float)log(sum);
  for (int k = 0; k < n_top; k++) {
    top[k].id = -1;
    top[k].logprob = -INFINITY;
  }
  for (int i = 0; i < nv && n_top > 0; i++) {
    float v = lg[i] - lse;
    if (v <= top[n_top - 1].logprob)
      continue;
    int k = n_top - 1;
    while (k > 0 && top[k - 1].logprob < v) {
      top[k] = top[k - 1];
      k--;
    }
    top[k].id = i;
    top[k].logprob = v;
  }
  return lg[tok] - lse;
}

/* Samples the next token of r from `lg` and reports it. Returns true when the
 * request finished (and was freed). */
static bool sample_and_emit(sl_engine_t *e, sl__req *r, float *lg) {
  int nv = (int)sl_model_hparams_of(e->model)->n_vocab;
  sl_token_logprob top[SL_MAX_TOP_LOGPROBS];
  float lp = 0;
  int n_top = 0;
  int32_t tok;
  if (r->params.top_logprobs >= 0) {
    memcpy(e->logits_tmp, lg, sizeof(float) * (size_t)nv);
    tok = sl_sampler_sample(r->sampler, lg);
    n_top = r->params.top_logprobs;
    lp = logprobs(e->logits_tmp, nv, tok, n_top, top);
  } else {
    tok = sl_sampler_sample(r->sampler, lg);
  }
  if (r->n_generated == 0) {
    r->t_first = sl_now_ns();
  }
  bool eog = !r->params.ignore_eos && sl_tokenizer_is_eog(e->tok, tok);
  if (eog) {
    flush_pending(r);
    finish(e, r, SL_FINISH_STOP, SL_OK, SL_REASON_NONE, NULL);
    return true;
  }
  r->n_generated++;
  sl_sampler_accept(r->sampler, tok);
  r->tokens[r->n_tokens++] = tok;
  e->tokens_since_clear++;
  if (text_step(e, r, tok, lp, n_top ? top : NULL, n_top)) {
    finish(e, r, SL_FINISH_STOP, SL_OK, SL_REASON_NONE, NULL);
    return true;
  }
  if (r->n_generated >= r->params.max_tokens) {
    flush_pending(r);
    finish(e, r, SL_FINISH_LENGTH, SL_OK, SL_REASON_NONE, NULL);
    return true;
  }
  return false;
}

/* ---- admission
 * ------------------------------------------------------------------ */

#define AFTER_FINISH_STEPS 4 /* K: the decode clear after a finish */

static uint64_t block_bytes(const sl_engine_t *e) {
  const sl_kv_config *k = sl_kv_config_of(e->kv);
  return sl_kv_block_bytes(k->n_layer, k->kv_dim, k->block_tokens);
}

/* The memory guard (issue 4): the peak a prefill chunk of `chunk` tokens
 * would reach with `new_blocks` more KV blocks in use. */
static uint64_t guard_estimate(sl_engine_t *e, int new_blocks, int chunk) {
  sl_kv_stats k = sl_kv_stats_of(e->kv);
  return sl_model_weight_bytes(e->model) +
         (uint64_t)(k.used + new_blocks) * block_bytes(e) +
         sl_batch_activation_bytes(e->model, chunk);
}

static void run_hook(sl_engine_t *e, sl__clear_site site) {
  if (e->hooks.before_clear)
    e->hooks.before_clear(e->hooks.ud, e->stream, site);
}

static void clear_site(sl_engine_t *e, sl__clear_site site) {
  run_hook(e, site);
  clear_at(e, site);
}

static void fail_waiting(sl_engine_t *e, sl__req *r, sl_status st,
                         sl_reason reason, const char *msg) {
  pthread_mutex_lock(&e->mu);
  e->stats.waiting--;
  pthread_mutex_unlock(&e->mu);
  finish(e, r, SL_FINISH_ERROR, st, reason, msg);
}

/* Tries to admit the head of the waiting queue. Returns true if it was
 * admitted or failed (so the caller may try the next), false when it must
 * wait for blocks. */
static bool admit_one(sl_engine_t *e) {
  sl__req *r = e->waiting;
  int T = e->cfg.kv_block_tokens;
  /* prefix lookup over full blocks, leaving at least one token to compute */
  int max_cached = (r->n_prompt - 1) / T;
  uint64_t h = 0;
  int got = 0;
  if (!r->blocks) {
    int need_total = (r->n_prompt + r->params.max_tokens + T - 1) / T;
    r->blocks = sl_malloc(sizeof(int32_t) * (size_t)need_total);
    if (!r->blocks) {
      e->waiting = r->next;
      if (!e->waiting)
        e->waiting_tail = NULL;
      fail_waiting(e, r, SL_ERR_NOMEM, SL_REASON_OUT_OF_MEMORY, NULL);
      return true;
    }
  }
  for (; got < max_cached; got++) {
    h = sl_kv_hash_block(e->kv, h, r->tokens + (size_t)got * (size_t)T, T);
    int b = sl_kv_lookup(e->kv, h, r->tokens + (size_t)got * (size_t)T);
    if (b < 0)
      break;
    r->blocks[got] = b;
  }
  r->n_blocks = got;
  int need_total = (r->n_prompt + r->params.max_tokens + T - 1) / T;
  int need_new = need_total - got;
  int remaining = r->n_prompt - got * T;
  int chunk =
      remaining < e->cfg.prefill_chunk ? remaining : e->cfg.prefill_chunk;
  r->est_bytes = guard_estimate(e, need_new, chunk);
  bool guard_fault = e->hooks.fail_guard_admit &&
                     (int)(e->first_chunks + 1) == e->hooks.fail_guard_admit;
  if ((e->cfg.max_memory && r->est_bytes > e->cfg.max_memory) || guard_fault) {
    e->first_chunks++;
    release_blocks(e, r);
    e->waiting = r->next;
    if (!e->waiting)
      e->waiting_tail = NULL;
    r->state = SL__REQ_WAITING;
    clear_site(e, SL__SITE_ADMIT_MEM_EXCEEDED);
    char msg[256];
    snprintf(msg, sizeof msg,
             "the prefill would need an estimated %llu bytes, over the memory "
             "limit of %llu bytes",
             (unsigned long long)r->est_bytes,
             (unsigned long long)e->cfg.max_memory);
    fail_waiting(e, r, SL_ERR_MEMORY_LIMIT, SL_REASON_PREFILL_MEMORY_EXCEEDED,
                 msg);
    return true;
  }
  if (need_new > sl_kv_config_of(e->kv)->n_blocks - got) {
    release_blocks(e, r);
    e->waiting = r->next;
    if (!e->waiting)
      e->waiting_tail = NULL;
    fail_waiting(e, r, SL_ERR_RANGE, SL_REASON_CONTEXT_LENGTH_EXCEEDED, NULL);
    return true;
  }
  if (sl_kv_available(e->kv) < need_new || e->n_active >= e->cfg.max_seqs) {
    release_blocks(e, r); /* give the looked-up blocks back; retry later */
    return false;
  }
  for (int i = 0; i < need_new; i++) {
    int b = sl_kv_block_alloc(e->kv);
    SL_ASSERT(b >= 0); /* sl_kv_available said so */
    r->blocks[r->n_blocks++] = b;
  }
  r->n_cached = got * T;
  r->n_computed = got * T;
  r->state = SL__REQ_PREFILLING;
  e->waiting = r->next;
  if (!e->waiting)
    e->waiting_tail = NULL;
  e->active[e->n_active++] = r;
  pthread_mutex_lock(&e->mu);
  e->stats.waiting--;
  e->stats.running++;
  e->stats.requests_total++;
  e->stats.prompt_tokens_total += (uint64_t)r->n_prompt;
  e->stats.cached_tokens_total += (uint64_t)r->n_cached;
  pthread_mutex_unlock(&e->mu);
  sl_engine_event ev;
  memset(&ev, 0, sizeof ev);
  ev.kind = SL_EV_STARTED;
  ev.request_id = r->id;
  ev.prompt_tokens = r->n_prompt;
  ev.cached_tokens = r->n_cached;
  r->cb(r->user, &ev);
  return true;
}

/* Removes active[i] (finished or requeued), keeping the order. */
static void active_remove(sl_engine_t *e, sl__req *r) {
  for (int i = 0; i < e->n_active; i++)
    if (e->active[i] == r) {
      memmove(&e->active[i], &e->active[i + 1],
              sizeof(sl__req *) * (size_t)(e->n_active - i - 1));
      e->n_active--;
      pthread_mutex_lock(&e->mu);
      e->stats.running--;
      pthread_mutex_unlock(&e->mu);
      return;
    }
}

/* The runtime error ladder (a real device or host OOM, or the allocator's
 * limit): release the request's blocks, clear on the engine stream, and
 * requeue it at the front; the third failure fails that request alone. */
static void requeue_after_oom(sl_engine_t *e, sl__req *r, bool admission,
                              sl_status st) {
  active_remove(e, r);
  release_blocks(e, r);
  r->state = SL__REQ_WAITING;
  clear_site(e, admission ? SL__SITE_ADMIT_RUNTIME_ERR
                          : SL__SITE_CHUNK_RUNTIME_ERR);
  if (++r->retries > 2) {
    finish(e, r, SL_FINISH_ERROR, st, SL_REASON_OUT_OF_MEMORY,
           "the prefill ran out of memory 3 times");
    return;
  }
  pthread_mutex_lock(&e->mu);
  e->stats.waiting++;
  e->stats.requests_total--; /* counted again when re-admitted */
  e->stats.prompt_tokens_total -= (uint64_t)r->n_prompt;
  e->stats.cached_tokens_total -= (uint64_t)r->n_cached;
  pthread_mutex_unlock(&e->mu);
  r->n_computed = 0;
  r->n_cached = 0;
  r->first_chunk_done = false;
  r->next = e->waiting;
  e->waiting = r;
  if (!e->waiting_tail)
    e->waiting_tail = r;
}

static bool is_oom(sl_status st) {
  return st == SL_ERR_MEMORY_LIMIT || st == SL_ERR_DEVICE_OOM ||
         st == SL_ERR_NOMEM;
}

/* Fails every active request with `st` (a clear reported an error of the
 * engine stream: their work may not have happened). */
static void fail_active(sl_engine_t *e, sl_status st) {
  while (e->n_active > 0) {
    sl__req *r = e->active[e->n_active - 1];
    active_remove(e, r);
    finish(e, r, SL_FINISH_ERROR, st, SL_REASON_NONE,
           "the compute device reported an error for this request's work");
  }
}

/* ---- one step
 * ------------------------------------------------------------------ */

static void apply_aborts(sl_engine_t *e) {
  pthread_mutex_lock(&e->mu);
  size_t n = e->n_aborts;
  uint64_t *ids = e->aborts; /* take the whole list; submitters grow anew */
  e->aborts = NULL;
  e->n_aborts = e->cap_aborts = 0;
  pthread_mutex_unlock(&e->mu);
  for (size_t k = 0; k < n; k++) {
    for (int i = 0; i < e->n_active; i++)
      if (e->active[i]->id == ids[k]) {
        sl__req *r = e->active[i];
        active_remove(e, r);
        finish(e, r, SL_FINISH_ABORT, SL_OK, SL_REASON_NONE, NULL);
        break;
      }
    for (sl__req **pp = &e->waiting; *pp; pp = &(*pp)->next)
      if ((*pp)->id == ids[k]) {
        sl__req *r = *pp;
        *pp = r->next;
        if (e->waiting_tail == r) {
          e->waiting_tail = NULL;
          for (sl__req *q = e->waiting; q; q = q->next)
            e->waiting_tail = q;
        }
        pthread_mutex_lock(&e->mu);
        e->stats.waiting--;
        pthread_mutex_unlock(&e->mu);
        finish(e, r, SL_FINISH_ABORT, SL_OK, SL_REASON_NONE, NULL);
        break;
      }
  }
  sl_free(ids);
}

/* Builds and runs one batch; returns false when there was nothing to do. */
static bool step(sl_engine_t *e) {
  const sl_model_hparams *hp = sl_model_hparams_of(e->model);
  int nb = 0, nt = 0, budget = e->cfg.max_batched_tokens;
  bool any_prefill = false;
  /* decode: one token for every running sequence */
  for (int i = 0; i < e->n_active && nt < budget; i++) {
    sl__req *r = e->active[i];
    if (r->state != SL__REQ_RUNNING)
      continue;
    e->batch_tokens[nt] = r->tokens[r->n_tokens - 1];
    e->batch_seqs[nb] = (sl_batch_seq){
        r->blocks, r->n_blocks, r->n_computed, nt, 1, true, false};
    e->batch_reqs[nb++] = r;
    nt++;
  }
  /* prefill chunks in the rest of the budget */
  for (int i = 0; i < e->n_active && nt < budget; i++) {
    sl__req *r = e->active[i];
    if (r->state != SL__REQ_PREFILLING)
      continue;
    int chunk = r->n_prompt - r->n_computed;
    if (chunk > e->cfg.prefill_chunk)
      chunk = e->cfg.prefill_chunk;
    if (chunk > budget - nt)
      chunk = budget - nt;
    if (chunk <= 0)
      break;
    bool admission = !r->first_chunk_done;
    /* the memory guard again for a later chunk */
    if (!admission) {
      e->later_chunks++;
      bool fault = e->hooks.fail_guard_chunk &&
                   (int)e->later_chunks == e->hooks.fail_guard_chunk;
      uint64_t est = guard_estimate(e, 0, chunk);
      if ((e->cfg.max_memory && est > e->cfg.max_memory) || fault) {
        r->est_bytes = est;
        active_remove(e, r);
        clear_site(e, SL__SITE_CHUNK_MEM_EXCEEDED);
        char msg[256];
        snprintf(msg, sizeof msg,
                 "a prefill chunk would need an estimated %llu bytes, over "
                 "the memory limit of %llu bytes",
                 (unsigned long long)est,
                 (unsigned long long)e->cfg.max_memory);
        finish(e, r, SL_FINISH_ERROR, SL_ERR_MEMORY_LIMIT,
               SL_REASON_PREFILL_MEMORY_EXCEEDED, msg);
        i--;
        continue;
      }
    } else {
      e->first_chunks++;
    }
    memcpy(e->batch_tokens + nt, r->tokens + r->n_computed,
           sizeof(int32_t) * (size_t)chunk);
    bool last = r->n_computed + chunk == r->n_prompt;
    e->batch_seqs[nb] = (sl_batch_seq){
        r->blocks, r->n_blocks, r->n_computed, nt, chunk, last, false};
    e->batch_reqs[nb++] = r;
    nt += chunk;
    any_prefill = true;
  }
  if (nb == 0)
    return false;
  e->steps++;
  sl_batch batch = {e->batch_tokens, nt, e->batch_seqs, nb};
  /* fault hooks: a runtime memory error for the Nth first / later chunk */
  sl_status st = SL_OK;
  for (int s = 0; s < nb; s++) {
    sl__req *r = e->batch_reqs[s];
    if (r->state != SL__REQ_PREFILLING)
      continue;
    bool adm = !r->first_chunk_done;
    if ((adm && e->hooks.fail_oom_admit &&
         (int)e->first_chunks == e->hooks.fail_oom_admit) ||
        (!adm && e->hooks.fail_oom_chunk &&
         (int)e->later_chunks == e->hooks.fail_oom_chunk)) {
      st = SL_ERR_MEMORY_LIMIT;
      e->hooks.fail_oom_admit = adm ? 0 : e->hooks.fail_oom_admit;
      e->hooks.fail_oom_chunk = adm ? e->hooks.fail_oom_chunk : 0;
    }
  }
  if (st == SL_OK)
    st = sl_batch_ctx_run(e->bctx, &batch, e->logits);
  if (is_oom(st)) {
    bool any = false;
    for (int s = 0; s < nb; s++) {
      sl__req *r = e->batch_reqs[s];
      if (r->state == SL__REQ_PREFILLING) {
        requeue_after_oom(e, r, !r->first_chunk_done, st);
        any = true;
      }
    }
    if (!any) {
      /* a decode-only batch: clear and retry; each third failure fails the
       * youngest request of the batch alone, giving its memory back */
      clear_site(e, SL__SITE_DECODE_RUNTIME_ERR);
      sl__req *r = e->batch_reqs[nb - 1];
      if (++r->retries > 2) {
        active_remove(e, r);
        finish(e, r, SL_FINISH_ERROR, st, SL_REASON_OUT_OF_MEMORY,
               "decode ran out of memory 3 times");
      }
    }
    return true;
  }
  if (st != SL_OK) {
    for (int s = 0; s < nb; s++) {
      active_remove(e, e->batch_reqs[s]);
      finish(e, e->batch_reqs[s], SL_FINISH_ERROR, st, SL_REASON_NONE,
             sl_status_str(st));
    }
    return true;
  }
  if (any_prefill)
    clear_site(e, SL__SITE_PREFILL_CHUNK);
  int li = 0;
  for (int s = 0; s < nb; s++) {
    sl__req *r = e->batch_reqs[s];
    sl_batch_seq *q = &e->batch_seqs[s];
    r->n_computed += q->n;
    float *lg =
        q->want_logits ? e->logits + (size_t)li++ * (size_t)hp->n_vocab : NULL;
    if (r->state == SL__REQ_PREFILLING) {
      r->first_chunk_done = true;
      if (r->n_computed < r->n_prompt)
        continue;
      r->state = SL__REQ_RUNNING;
      clear_site(e, SL__SITE_PREFILL_END);
    }
    if (lg && sample_and_emit(e, r, lg))
      active_remove(e, r); /* finished and freed: only the pointer is used */
  }
  /* decode clear sites */
  if (e->cfg.clear_every_tokens > 0 &&
      e->tokens_since_clear >= (uint64_t)e->cfg.clear_every_tokens) {
    e->tokens_since_clear = 0;
    clear_site(e, SL__SITE_DECODE_EVERY_N);
  }
  if (e->cfg.hot_loop_steps > 0 &&
      e->steps % (uint64_t)e->cfg.hot_loop_steps == 0 &&
      sl_alloc_get_stats(sl_stream_device(e->stream)).cache >=
          e->cfg.hot_loop_cache_bytes)
    clear_site(e, SL__SITE_DECODE_HOT_LOOP);
  if (e->finished_since_clear &&
      ++e->finished_since_clear > AFTER_FINISH_STEPS) {
    e->finished_since_clear = 0;
    clear_site(e, SL__SITE_DECODE_AFTER_FINISH);
  }
  pthread_mutex_lock(&e->mu);
  e->stats.steps = e->steps;
  pthread_mutex_unlock(&e->mu);
  return true;
}

/* ---- the executor thread
 * --------------------------------------------------------- */

static sl_status executor_init(sl_engine_t *e) {
  const sl_model_hparams *hp = sl_model_hparams_of(e->model);
  e->stream = sl_thread_stream(sl_cpu_device());
  if (!e->stream)
    return SL_ERR_NOMEM;
  int T = e->cfg.kv_block_tokens;
  int n_blocks = e->cfg.kv_blocks;
  uint64_t bb = sl_kv_block_bytes((int)hp->n_layer,
                                  (int)(hp->n_head_kv * hp->head_dim), T);
  if (n_blocks <= 0) {
    /* enough for max_seqs full contexts, within a quarter of the memory
     * limit when there is one */
    uint64_t want =
        (uint64_t)e->cfg.max_seqs * (uint64_t)((e->cfg.n_ctx + T - 1) / T);
    if (e->cfg.max_memory) {
      uint64_t cap = e->cfg.max_memory / 4 / bb;
      if (want > cap)
        want = cap > 16 ? cap : 16;
    }
    n_blocks = (int)(want > (1u << 22) ? (1u << 22) : want);
  }
  sl_kv_config kc = {(int)hp->n_layer, (int)(hp->n_head_kv * hp->head_dim), T,
                     n_blocks,
                     sl_kv_fingerprint(sl_model_fingerprint(e->model), T)};
  sl_status st = sl_kv_pool_create(&kc, e->stream, &e->kv);
  if (st != SL_OK)
    return st;
  sl_kv_view view = sl_kv_view_of(e->kv);
  if ((st = sl_batch_ctx_create(e->model, &view, e->stream, e->cfg.n_threads,
                                &e->bctx)) != SL_OK)
    return st;
  size_t ms = (size_t)e->cfg.max_seqs + 1;
  size_t bt = (size_t)e->cfg.max_batched_tokens;
  e->active = sl_calloc(ms, sizeof *e->active);
  e->logits = sl_malloc(sizeof(float) * (size_t)hp->n_vocab * ms);
  e->logits_tmp = sl_malloc(sizeof(float) * (size_t)hp->n_vocab);
  e->batch_tokens = sl_malloc(sizeof(int32_t) * bt);
  e->batch_seqs = sl_malloc(sizeof(sl_batch_seq) * (ms + bt));
  e->batch_reqs = sl_malloc(sizeof(sl__req *) * (ms + bt));
  if (!e->active || !e->logits || !e->logits_tmp || !e->batch_tokens ||
      !e->batch_seqs || !e->batch_reqs)
    return SL_ERR_NOMEM;
  return SL_OK;
}

static void executor_fini(sl_engine_t *e) {
  /* end everything still here */
  for (int i = e->n_active - 1; i >= 0; i--) {
    sl__req *r = e->active[i];
    e->n_active--;
    finish(e, r, SL_FINISH_ABORT, SL_OK, SL_REASON_NONE, NULL);
  }
  while (e->waiting) {
    sl__req *r = e->waiting;
    e->waiting = r->next;
    finish(e, r, SL_FINISH_ABORT, SL_OK, SL_REASON_NONE, NULL);
  }
  pthread_mutex_lock(&e->mu);
  sl__req *in = e->inbox;
  e->inbox = e->inbox_tail = NULL;
  pthread_mutex_unlock(&e->mu);
  while (in) {
    sl__req *r = in;
    in = r->next;
    finish(e, r, SL_FINISH_ABORT, SL_OK, SL_REASON_NONE, NULL);
  }
  if (e->stream)
    clear_site(e, SL__SITE_SHUTDOWN);
  sl_batch_ctx_free(e->bctx);
  sl_kv_pool_free(e->kv);
  sl_free(e->active);
  sl_free(e->logits);
  sl_free(e->logits_tmp);
  sl_free(e->batch_tokens);
  sl_free(e->batch_seqs);
  sl_free(e->batch_reqs);
  if (e->stream && sl_sync_and_clear_cache(e->stream) != SL_OK)
    SL_LOGW("engine: an error was pending on the engine stream at shutdown");
  sl_clear_thread_streams(); /* I5 */
}

static void *executor_main(void *p) {
  sl_engine_t *e = p;
  sl_status st = executor_init(e);
  pthread_mutex_lock(&e->mu);
  e->start_status = st;
  e->started = true;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  if (st != SL_OK) {
    executor_fini(e);
    return NULL;
  }
  bool idle_cleared = true;
  for (;;) {
    pthread_mutex_lock(&e->mu);
    while (!e->stopping && !e->inbox && !e->n_aborts && !e->waiting &&
           e->n_active == 0) {
      if (!idle_cleared) {
        pthread_mutex_unlock(&e->mu);
        clear_site(e, SL__SITE_IDLE); /* idle reclaim */
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
    sl__req *in = e->inbox;
    e->inbox = e->inbox_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    while (in) {
      sl__req *r = in;
      in = r->next;
      list_push(&e->waiting, &e->waiting_tail, r);
    }
    idle_cleared = false;
    apply_aborts(e);
    while (e->waiting && admit_one(e))
      ;
    step(e);
    if (e->clear_error != SL_OK) { /* errors reach the requests */
      fail_active(e, e->clear_error);
      e->clear_error = SL_OK;
    }
  }
  executor_fini(e);
  return NULL;
}

sl_status sl_engine_create(sl_model_t *model, const sl_tokenizer_t *tok,
                           const sl_engine_config *cfg, sl_engine_t **out) {
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
  e->cfg = *cfg;
  if (e->cfg.prefill_chunk > e->cfg.max_batched_tokens)
    e->cfg.prefill_chunk = e->cfg.max_batched_tokens;
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
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->thread, NULL);
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->mu);
  sl_free(e->aborts);
  sl_free(e);
}

void sl__engine_set_test_hooks(sl_engine_t *e, const sl__engine_test_hooks *h) {
  pthread_mutex_lock(&e->mu);
  e->hooks = *h;
  pthread_mutex_unlock(&e->mu);
}
