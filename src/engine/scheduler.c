/* The scheduler, on the executor thread: one batch per step (a decode
 * token for every running sequence, prefill chunks in the rest of the
 * budget), aborts, preemption, the runtime-error ladders, and every clear
 * site (I3, I4: all on the engine stream, through clear.c's primitive).
 * Admission is admit.c's; picking and reporting tokens, and a request's
 * end, emit.c's. A step is
 * planned (plan_step), run (run_step) and its results applied
 * (update_step), as vLLM's scheduler does. */
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

#define AFTER_FINISH_STEPS 4 /* K: the decode clear after a finish */

/* Removes active[i] (finished or requeued), keeping the order. */
void sl__active_remove(sl_engine_t *e, sl__req *r) {
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
  sl__active_remove(e, r);
  sl__release_blocks(e, r);
  r->state = SL__REQ_WAITING;
  sl__clear_at_site(e, admission ? SL__SITE_ADMIT_RUNTIME_ERR
                                 : SL__SITE_CHUNK_RUNTIME_ERR);
  if (++r->retries > 2) {
    sl__finish(e, r, SL_FINISH_ERROR, st, SL_REASON_OUT_OF_MEMORY,
               "the prefill ran out of memory 3 times");
    return;
  }
  pthread_mutex_lock(&e->mu);
  e->stats.waiting++; /* counted in the totals once, at its first admission */
  pthread_mutex_unlock(&e->mu);
  r->n_computed = 0;
  r->first_chunk_done = false;
  r->next = e->waiting;
  e->waiting = r;
  if (!e->waiting_tail)
    e->waiting_tail = r;
}

/* Sends active request r back to the head of the queue to give its KV
 * blocks back: its full blocks go to the prefix cache first, so that its
 * recomputation (the prompt and every token so far, then the next sample)
 * mostly finds them. Its client sees a pause, nothing else. */
static void preempt(sl_engine_t *e, sl__req *r) {
  sl__active_remove(e, r);
  sl__publish_blocks(e, r);
  sl__release_blocks(e, r);
  r->state = SL__REQ_WAITING;
  r->n_target = r->n_tokens; /* the last sampled token is not computed yet */
  r->n_computed = 0;
  r->first_chunk_done = false;
  pthread_mutex_lock(&e->mu);
  e->stats.waiting++;
  e->stats.preemptions++;
  pthread_mutex_unlock(&e->mu);
  r->next = e->waiting;
  e->waiting = r;
  if (!e->waiting_tail)
    e->waiting_tail = r;
}

/* Gives running request r the block of the token it decodes next (KV is
 * reserved as it is used, not for max_tokens up front). When no block can
 * be had (the pool, or the memory limit), the youngest active request is
 * preempted, until one can; returns false when r itself was. A request
 * alone always gets its blocks: max_tokens was clamped to fit alone. */
/* Gives r free blocks until it has `need`, while the pool has them and the
 * memory guard allows; true when it has them all. Preempts no one. */
static bool take_free_blocks(sl_engine_t *e, sl__req *r, int need) {
  while (r->n_blocks < need) {
    if (sl_kv_available(e->kv) <= 0 ||
        (e->cfg.max_memory && sl__guard_estimate(e, 1, 1) > e->cfg.max_memory))
      return false;
    int b = sl_kv_block_alloc(e->kv);
    SL_ASSERT(b >= 0); /* sl_kv_available said so */
    r->blocks[r->n_blocks++] = b;
  }
  return true;
}

static bool grow_blocks(sl_engine_t *e, sl__req *r) {
  int need = sl__blocks_for(e, r->n_computed + 1);
  while (!take_free_blocks(e, r, need)) {
    SL_ASSERT(e->n_active > 1 || !r->fits_alone ||
              !"a request alone always fits");
    sl__req *v = e->active[e->n_active - 1];
    preempt(e, v);
    if (v == r)
      return false;
  }
  return true;
}

static bool is_oom(sl_status st) {
  return st == SL_ERR_MEMORY_LIMIT || st == SL_ERR_DEVICE_OOM ||
         st == SL_ERR_NOMEM;
}

/* Fails every active request with `st` (a clear reported an error of the
 * engine stream: their work may not have happened). */
void sl__fail_active(sl_engine_t *e, sl_status st) {
  while (e->n_active > 0) {
    sl__req *r = e->active[e->n_active - 1];
    sl__active_remove(e, r);
    sl__finish(e, r, SL_FINISH_ERROR, st, SL_REASON_NONE,
               "the compute device reported an error for this request's work");
  }
}

void sl__apply_aborts(sl_engine_t *e) {
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
        sl__active_remove(e, r);
        sl__finish(e, r, SL_FINISH_ABORT, SL_OK, SL_REASON_NONE, NULL);
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
        sl__finish(e, r, SL_FINISH_ABORT, SL_OK, SL_REASON_NONE, NULL);
        break;
      }
  }
  sl_free(ids);
}

void sl__take_inbox(sl_engine_t *e) {
  pthread_mutex_lock(&e->mu);
  sl__req *in = e->inbox;
  e->inbox = e->inbox_tail = NULL;
  pthread_mutex_unlock(&e->mu);
  while (in) {
    sl__req *r = in;
    in = r->next;
    sl__list_push(&e->waiting, &e->waiting_tail, r);
  }
}

void sl__prepare_next(sl_engine_t *e) {
  sl__take_inbox(e);
  sl__admit_waiting(e);
}

/* The decode clear sites, reached once per step (with the step in flight:
 * each drains the engine stream before it frees anything). */
static void decode_clear_sites(sl_engine_t *e) {
  if (e->cfg.clear_every_tokens > 0 &&
      e->tokens_since_clear >= (uint64_t)e->cfg.clear_every_tokens) {
    e->tokens_since_clear = 0;
    sl__clear_at_site(e, SL__SITE_DECODE_EVERY_N);
  }
  if (e->cfg.hot_loop_steps > 0 &&
      e->steps % (uint64_t)e->cfg.hot_loop_steps == 0 &&
      sl_alloc_get_stats(sl_stream_device(e->stream)).cache >=
          e->cfg.hot_loop_cache_bytes)
    sl__clear_at_site(e, SL__SITE_DECODE_HOT_LOOP);
  if (e->finished_since_clear &&
      ++e->finished_since_clear > AFTER_FINISH_STEPS) {
    e->finished_since_clear = 0;
    sl__clear_at_site(e, SL__SITE_DECODE_AFTER_FINISH);
  }
}

/* Whether the device's argmax of r's row is r's next token: no logprobs
 * asked, no grammar to mask the row, and a sampler that picks the argmax
 * (greedy, no penalty, no bias). */
static bool argmax_only(const sl__req *r) {
  return r->params.top_logprobs < 0 && !r->matcher && r->sampler &&
         sl_sampler_is_argmax(r->sampler);
}

/* Batch sequence s (r's) is sampled on the device when the engine samples
 * there, it wants a token this step and is not a plain argmax: its
 * sampler's params, penalty window and draw (one per token, made here and
 * kept until a token is picked) go with the batch. A window wider than the
 * device takes, or more top logprobs, leave it to the host. */
static void plan_device_sample(sl_engine_t *e, sl__req *r, int s) {
  sl_batch_seq *q = &e->batch_seqs[s];
  q->sample = NULL;
  if (!e->dev_sampling || !q->want_logits || q->all_logits || q->argmax_only ||
      r->params.top_logprobs > SL_KCU_SAMPLE_MAX_TOP ||
      sl_sampler_has_bias(r->sampler) || /* the device sampler has no bias */
      r->matcher)                        /* nor a grammar's mask */
    return;
  sl_kcu_sample_params *p = &e->batch_samp[s];
  int n_pen = 0;
  if (!sl_sampler_penalties(r->sampler, SL_KCU_SAMPLE_MAX_PEN, p->pen_id,
                            p->pen_count, &n_pen))
    return;
  const sl_sampler_params *sp = sl_sampler_params_of(r->sampler);
  p->temperature = sp->temperature;
  p->top_k = sp->top_k;
  p->top_p = sp->top_p;
  p->min_p = sp->min_p;
  p->repeat_penalty = sp->repeat_penalty;
  p->presence_penalty = sp->presence_penalty;
  p->frequency_penalty = sp->frequency_penalty;
  p->n_pen = n_pen;
  if (!r->has_draw) {
    r->draw = sl_sampler_draw(r->sampler);
    r->has_draw = true;
  }
  p->r = r->draw;
  p->n_top = r->params.top_logprobs < 0 ? -1 : r->params.top_logprobs;
  p->row = -1; /* the batch context sets it */
  q->sample = p;
}

/* Embeddings: adds n hidden-state rows of r's chunk to its pool (the sum,
 * or the last row for SL_POOL_LAST). */
static void pool_rows(sl_engine_t *e, sl__req *r, const float *rows, int n) {
  int d = e->n_embd;
  if (r->params.pooling == SL_POOL_LAST) {
    memcpy(r->emb, rows + (size_t)(n - 1) * (size_t)d,
           sizeof(float) * (size_t)d);
    return;
  }
  for (int t = 0; t < n; t++)
    for (int k = 0; k < d; k++)
      r->emb[k] += rows[(size_t)t * (size_t)d + k];
}

/* The pooled vector, L2-normalized (llama.cpp's default for embeddings). */
static void embed_finish(sl_engine_t *e, sl__req *r) {
  int d = e->n_embd;
  double norm = 0;
  float scale =
      r->params.pooling == SL_POOL_MEAN ? 1.0f / (float)r->n_prompt : 1.0f;
  for (int k = 0; k < d; k++) {
    r->emb[k] *= scale;
    norm += (double)r->emb[k] * (double)r->emb[k];
  }
  float inv = norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.0f;
  for (int k = 0; k < d; k++)
    r->emb[k] *= inv;
}

/* One step as the scheduler planned it (vLLM's SchedulerOutput): the batch,
 * over the engine's batch arrays, and the prefill clear sites it reaches.
 * Filled by plan_step, run by run_step, applied by update_step; it lives
 * for one sl__step. */
typedef struct step_plan {
  uint64_t t_start; /* sl_now_ns() when the step began (stats.step_ns) */
  sl_batch batch;   /* borrows e->batch_tokens and e->batch_seqs */
  sl__req **reqs;   /* (batch.n_seqs) each sequence's request: e->batch_reqs */
  bool prefill_mid; /* a prompt's chunk that is not its last: prefill.chunk */
  bool prefill_end; /* a prompt's last chunk: prefill.end */
} step_plan;

/* Adds r's sequence q to the plan (its q.n tokens already written to
 * e->batch_tokens from batch.n_tokens on), with the device sampler's
 * params where it samples there. */
static void plan_add(sl_engine_t *e, step_plan *p, sl__req *r, sl_batch_seq q) {
  int s = p->batch.n_seqs++;
  e->batch_seqs[s] = q;
  plan_device_sample(e, r, s);
  p->reqs[s] = r;
  p->batch.n_tokens += q.n;
}

/* The most tokens r's sequence holds: its prompt, its output and the
 * drafts verified after the last of it. */
static int draft_len(const sl_engine_t *e, const sl__req *r) {
  long n = (long)r->n_prompt + r->params.max_tokens + e->draft.n_max + 1;
  return n < e->cfg.n_ctx ? (int)n : e->cfg.n_ctx;
}

/* The most drafts r may take this step: for a request with no grammar,
 * greedy or sampled (the target's token is drawn as without drafts and a
 * draft is kept while it is that token: spec.h), what --draft-max and its
 * max_tokens leave after the step's own token; 0 when that is under
 * --draft-min. */
static int draft_cap(const sl_engine_t *e, const sl__req *r) {
  if (r->params.no_speculation || r->matcher || !r->sampler)
    return 0;
  int left = r->params.max_tokens - r->n_generated - 1;
  int k = e->draft.n_max < left ? e->draft.n_max : left;
  return k >= e->draft.n_min ? k : 0;
}

/* Speculative decoding: how many drafts each running request may take this
 * step (r->n_draft), by the adaptive rule (sl_spec_allocate: each
 * request's acceptance against the step's cost model) or, with
 * cfg.draft_fixed, all it may. n_run: the step's decoding requests. */
static void plan_spec(sl_engine_t *e, int n_run) {
  int n = 0;
  for (int i = 0; i < e->n_active; i++) {
    sl__req *r = e->active[i];
    r->n_draft = 0;
    if (r->state != SL__REQ_RUNNING)
      continue;
    e->spec_req[n] = r;
    e->spec_prop[n] = draft_cap(e, r);
    e->spec_alpha[n] = sl_spec_alpha(&r->acc);
    n++;
  }
  if (!e->cfg.draft_fixed)
    sl_spec_allocate(e->spec_prop, e->spec_alpha, n, n_run, e->spec_cost,
                     e->spec_take);
  for (int s = 0; s < n; s++) {
    int k = e->cfg.draft_fixed ? e->spec_prop[s] : e->spec_take[s];
    if (k < e->draft.n_min)
      k = 0;
    if (k == 0 && e->spec_prop[s] > 0) /* held back: it will try again */
      sl_spec_accept_age(&e->spec_req[s]->acc);
    e->spec_req[s]->n_draft = k;
  }
}

/* r's drafts for this step (into r->draft): up to r->n_draft (plan_spec)
 * and `room` tokens, from the engine's drafter, cut to the KV blocks r has
 * or can get without preempting anyone (drafts never take memory from
 * other requests). */
static int plan_drafts(sl_engine_t *e, sl__req *r, int room) {
  int k = r->n_draft < room ? r->n_draft : room;
  r->n_draft = 0;
  if (k < e->draft.n_min || k < 1 ||
      (!r->dseq && !(r->dseq = sl_drafter_seq_begin(
                         e->drafter, r->pred, r->n_pred, draft_len(e, r)))))
    return 0;
  int d = sl_drafter_propose(r->dseq, r->tokens, r->n_tokens, k, r->draft);
  if (d < e->draft.n_min)
    return 0;
  /* positions n_computed .. n_computed + d */
  (void)take_free_blocks(e, r, sl__blocks_for(e, r->n_computed + 1 + d));
  int fit = r->n_blocks * e->cfg.kv_block_tokens - r->n_computed - 1;
  d = d < fit ? d : fit;
  if (d < e->draft.n_min)
    return 0;
  r->n_draft = d;
  return d;
}

/* The KV blocks of this step's decode tokens, oldest request first (a
 * preemption takes the youngest), then one token for every running
 * sequence (and its drafts, speculative decoding). */
static void plan_decode(sl_engine_t *e, step_plan *p) {
  int budget = e->cfg.max_batched_tokens;
  for (int i = 0; i < e->n_active; i++) {
    sl__req *r = e->active[i];
    if (r->state == SL__REQ_RUNNING && !grow_blocks(e, r))
      break; /* r and every younger request went back to the queue */
  }
  int running = 0; /* each keeps a token of the budget from the drafts */
  for (int i = 0; i < e->n_active; i++)
    running += e->active[i]->state == SL__REQ_RUNNING;
  if (e->spec)
    plan_spec(e, running);
  for (int i = 0; i < e->n_active && p->batch.n_tokens < budget; i++) {
    sl__req *r = e->active[i];
    if (r->state != SL__REQ_RUNNING)
      continue;
    int nt = p->batch.n_tokens;
    e->batch_tokens[nt] = r->tokens[r->n_tokens - 1];
    int d = e->spec ? plan_drafts(e, r, budget - nt - running--) : 0;
    memcpy(e->batch_tokens + nt + 1, r->draft, sizeof(int32_t) * (size_t)d);
    plan_add(e, p, r,
             (sl_batch_seq){r->blocks, r->n_blocks, r->n_computed, nt, 1 + d,
                            true, d > 0, argmax_only(r), d == 0, NULL, false});
  }
}

/* The memory guard again, for a later chunk of `chunk` tokens of active
 * request r. Returns true when r is over it and left the batch: preempted
 * while others hold the memory in its way (it fits alone), else failed;
 * either way after the chunk.memory_exceeded clear. */
static bool later_chunk_refused(sl_engine_t *e, sl__req *r, int chunk) {
  e->later_chunks++;
  bool fault = e->hooks.fail_guard_chunk &&
               (int)e->later_chunks == e->hooks.fail_guard_chunk;
  uint64_t est = sl__guard_estimate(e, 0, chunk);
  if (!(e->cfg.max_memory && est > e->cfg.max_memory) && !fault)
    return false;
  r->est_bytes = est;
  if (!fault && e->n_active > 1) {
    /* it fits alone (checked at admission): the others' memory is in the
     * way, so it waits at the head of the queue */
    preempt(e, r);
    sl__clear_at_site(e, SL__SITE_CHUNK_MEM_EXCEEDED);
    return true;
  }
  sl__active_remove(e, r);
  sl__clear_at_site(e, SL__SITE_CHUNK_MEM_EXCEEDED);
  char msg[256];
  snprintf(msg, sizeof msg,
           "a prefill chunk would need an estimated %llu bytes, over the "
           "memory limit of %llu bytes",
           (unsigned long long)est, (unsigned long long)e->cfg.max_memory);
  sl__finish(e, r, SL_FINISH_ERROR, SL_ERR_MEMORY_LIMIT,
             SL_REASON_PREFILL_MEMORY_EXCEEDED, msg);
  return true;
}

/* Prefill chunks of the prefilling requests, in order, in the rest of the
 * step's token budget. A request that leaves the active list here (the
 * guard, or no memory for an embedding's hidden states) is not planned. */
static void plan_prefill(sl_engine_t *e, step_plan *p) {
  int budget = e->cfg.max_batched_tokens;
  for (int i = 0; i < e->n_active && p->batch.n_tokens < budget; i++) {
    sl__req *r = e->active[i];
    if (r->state != SL__REQ_PREFILLING)
      continue;
    int nt = p->batch.n_tokens;
    int chunk = r->n_target - r->n_computed;
    if (chunk > e->cfg.prefill_chunk)
      chunk = e->cfg.prefill_chunk;
    if (chunk > budget - nt)
      chunk = budget - nt;
    if (chunk <= 0)
      break;
    if (r->first_chunk_done) {
      if (later_chunk_refused(e, r, chunk)) {
        i--; /* active[i] is the next request now */
        continue;
      }
    } else {
      e->first_chunks++;
    }
    memcpy(e->batch_tokens + nt, r->tokens + r->n_computed,
           sizeof(int32_t) * (size_t)chunk);
    bool last = r->n_computed + chunk == r->n_target;
    bool embed = r->params.pooling != SL_POOL_NONE;
    if (embed && !e->hidden &&
        !(e->hidden =
              sl_malloc(sizeof(float) * (size_t)e->cfg.max_batched_tokens *
                        (size_t)e->n_embd))) {
      sl__active_remove(e, r);
      sl__finish(e, r, SL_FINISH_ERROR, SL_ERR_NOMEM, SL_REASON_OUT_OF_MEMORY,
                 "no memory for the hidden states of an embedding");
      i--;
      continue;
    }
    if (last)
      p->prefill_end = true;
    else
      p->prefill_mid = true;
    plan_add(e, p, r,
             (sl_batch_seq){r->blocks, r->n_blocks, r->n_computed, nt, chunk,
                            last && !r->params.pooling, false, argmax_only(r),
                            false, NULL, embed});
  }
}

/* Plans the next step into *p: KV blocks for the decode tokens (preempting
 * the youngest requests when none can be had), one decode token for every
 * running sequence, then prefill chunks. Returns false when there is
 * nothing to run (no step is counted). */
static bool plan_step(sl_engine_t *e, step_plan *p) {
  memset(p, 0, sizeof *p);
  p->t_start = sl_now_ns();
  p->batch.tokens = e->batch_tokens;
  p->batch.seqs = e->batch_seqs;
  p->reqs = e->batch_reqs;
  plan_decode(e, p);
  plan_prefill(e, p);
  if (p->batch.n_seqs == 0)
    return false;
  e->steps++;
  return true;
}

/* The fault hooks: a runtime memory error in place of the step when it
 * carries the Nth first / later chunk (each hook fires once). */
static sl_status fault_hooks(sl_engine_t *e, const step_plan *p) {
  sl_status st = SL_OK;
  for (int s = 0; s < p->batch.n_seqs; s++) {
    sl__req *r = p->reqs[s];
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
  return st;
}

/* Runs the planned step on the engine stream. It is queued and not waited
 * for: the clear sites it reaches (DESIGN.md) run while its forward pass is
 * in flight on the engine stream, and each drains that stream first; then
 * the next step's admissions (sl__prepare_next); then its results, into
 * e->logits, argmax, sampled and hidden. Returns the step's status: a
 * failed submit or wait, or a fault hook's error (nothing was queued). */
static sl_status run_step(sl_engine_t *e, const step_plan *p) {
  sl_status st = fault_hooks(e, p);
  sl_batch_out out = {e->logits, e->argmax, NULL, e->sampled, e->hidden};
  if (st == SL_OK)
    st = sl_batch_ctx_submit(e->bctx, &p->batch, &out);
  bool submitted = st == SL_OK;
  if (submitted) {
    /* prefill.chunk between a prompt's chunks, prefill.end after its last */
    if (p->prefill_mid)
      sl__clear_at_site(e, SL__SITE_PREFILL_CHUNK);
    if (p->prefill_end)
      sl__clear_at_site(e, SL__SITE_PREFILL_END);
    decode_clear_sites(e);
    sl__prepare_next(e);
    st = sl_batch_ctx_wait(e->bctx);
  }
  return st;
}

/* The runtime error ladders after a step that ran out of memory: its
 * prefilling requests are requeued (requeue_after_oom); a decode-only
 * batch clears and is retried, each third failure failing the youngest
 * request of the batch alone, giving its memory back. */
static void update_after_oom(sl_engine_t *e, const step_plan *p, sl_status st) {
  bool any = false;
  for (int s = 0; s < p->batch.n_seqs; s++) {
    sl__req *r = p->reqs[s];
    if (r->state == SL__REQ_PREFILLING) {
      requeue_after_oom(e, r, !r->first_chunk_done, st);
      any = true;
    }
  }
  if (any)
    return;
  /* a decode-only batch: clear, and retry at the next step */
  sl__clear_at_site(e, SL__SITE_DECODE_RUNTIME_ERR);
  sl__req *r = p->reqs[p->batch.n_seqs - 1];
  if (++r->retries > 2) {
    sl__active_remove(e, r);
    sl__finish(e, r, SL_FINISH_ERROR, st, SL_REASON_OUT_OF_MEMORY,
               "decode ran out of memory 3 times");
  }
}

/* Applies sequence s's results to its request r: its K/V is computed;
 * `hidden` (its rows, for an embedding) is pooled; a prompt's chunk
 * publishes its full blocks, and its last ends an embedding or starts
 * decoding; `row` (its logits row, or -1) gives its next token. */
static void update_seq(sl_engine_t *e, sl__req *r, int s, int row,
                       const float *hidden) {
  const sl_batch_seq *q = &e->batch_seqs[s];
  /* a decode token and its drafts (prefill chunks never take all rows) */
  const bool verify = r->state == SL__REQ_RUNNING && q->all_logits;
  r->n_computed += q->n;
  if (hidden)
    pool_rows(e, r, hidden, q->n);
  if (r->state == SL__REQ_PREFILLING) {
    r->first_chunk_done = true;
    /* the chunk's full blocks are written: published now, so that a
     * request waiting on this prefix (in_flight_elsewhere) finds them */
    sl__publish_blocks(e, r);
    if (r->n_computed < r->n_target)
      return;
    if (r->params.pooling) { /* an embedding: done */
      embed_finish(e, r);
      sl__active_remove(e, r);
      sl__finish(e, r, SL_FINISH_STOP, SL_OK, SL_REASON_NONE, NULL);
      return;
    }
    r->state = SL__REQ_RUNNING;
  }
  if (verify) {
    /* rows row.. follow the decode token and each draft: the target's
     * token from each row, while it is the draft (whose K/V then stands),
     * then the first it disagrees on; the rejected drafts' positions are
     * past n_computed, written over by later steps */
    r->n_computed -= q->n - 1; /* the decode token's K/V, so far */
    int d = q->n - 1;
    r->n_draft = 0;
    e->drafted += (uint64_t)d;
    r->n_drafted += d;
    for (int i = 0; i <= d; i++) {
      sl__picked pk;
      if (!sl__pick(e, r, s, row + i, &pk)) {
        sl__active_remove(e, r);
        return;
      }
      /* accounted before the token is emitted, which may end (and free)
       * r; an ended request's drafter state is not told */
      bool kept = i < d && pk.tok == r->draft[i];
      if (kept) {
        r->n_kept++;
        e->accepted++;
      } else {
        sl_drafter_accepted(r->dseq, d, i);
        sl_spec_accept_observe(&r->acc, d, i);
      }
      if (sl__emit(e, r, &pk)) {
        sl__active_remove(e, r);
        return;
      }
      if (!kept)
        break;
      r->n_computed++;
    }
    return;
  }
  if (row >= 0 && sl__sample_and_emit(e, r, s, row))
    sl__active_remove(e, r); /* finished and freed: only the pointer is used */
}

/* Applies the step's outcome st: the OOM ladders, or any other error
 * failing the batch's requests, or its results (tokens sampled and
 * reported, requests finished) and the step's stats. */
static void update_step(sl_engine_t *e, const step_plan *p, sl_status st) {
  if (is_oom(st)) {
    update_after_oom(e, p, st);
    return;
  }
  if (st != SL_OK) {
    for (int s = 0; s < p->batch.n_seqs; s++) {
      sl__active_remove(e, p->reqs[s]);
      sl__finish(e, p->reqs[s], SL_FINISH_ERROR, st, SL_REASON_NONE,
                 sl_status_str(st));
    }
    return;
  }
  int li = 0, hi = 0; /* the next logits row, the next hidden-state row */
  for (int s = 0; s < p->batch.n_seqs; s++) {
    const sl_batch_seq *q = &p->batch.seqs[s];
    int row = q->want_logits ? li : -1;
    li += q->all_logits ? q->n : q->want_logits ? 1 : 0;
    const float *hidden = NULL;
    if (q->embed) {
      hidden = e->hidden + (size_t)hi * (size_t)e->n_embd;
      hi += q->n;
    }
    update_seq(e, p->reqs[s], s, row, hidden);
  }
  pthread_mutex_lock(&e->mu);
  sl__publish_picks(e);
  e->stats.steps = e->steps;
  e->stats.drafted = e->drafted;
  e->stats.accepted = e->accepted;
  uint64_t step_ns = sl_now_ns() - p->t_start;
  e->stats.step_ns += step_ns;
  /* the cost model of the drafts' rule, from decode steps alone: every
   * token of one has its logits row (a prefill chunk's has one, so its
   * tokens cost less than a draft's) */
  if (e->spec && !p->prefill_mid && !p->prefill_end) {
    sl_spec_cost_observe(&e->cost_model, p->batch.n_tokens, (double)step_ns);
    e->spec_cost = sl_spec_cost_ratio(&e->cost_model, SL__SPEC_COST_DEFAULT);
    e->stats.spec_token_cost = e->spec_cost;
  }
  pthread_mutex_unlock(&e->mu);
}

/* Plans, runs and applies one step; returns false when there was nothing
 * to do. */
bool sl__step(sl_engine_t *e) {
  step_plan p;
  if (!plan_step(e, &p))
    return false;
  update_step(e, &p, run_step(e, &p));
  return true;
}
