/* Admission, on the executor thread: a waiting request checked once against
 * what fits alone (else failed with a 4xx reason, or its max_tokens clamped
 * to fit), its prefix looked up in the pool and the tiers, the memory
 * guard's estimate, its blocks reserved; requests that waited past the
 * queue timeout failed. Split from scheduler.c (issue 44). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "sluice/alloc.h"
#include "sluice/kv.h"
#include "sluice/memsync.h"
#include "sluice/util.h"

void sl__list_push(sl__req **head, sl__req **tail, sl__req *r) {
  r->next = NULL;
  if (*tail)
    (*tail)->next = r;
  else
    *head = r;
  *tail = r;
}

static uint64_t block_bytes(const sl_engine_t *e) {
  const sl_kv_config *k = sl_kv_config_of(e->kv);
  return sl_kv_block_bytes(k->n_layer, k->kv_dim, k->block_tokens);
}

uint64_t sl__guard_estimate(sl_engine_t *e, int new_blocks, int chunk) {
  sl_kv_stats k = sl_kv_stats_of(e->kv);
  return sl_model_weight_bytes(e->model) +
         (uint64_t)(k.used + new_blocks) * block_bytes(e) +
         sl_batch_activation_bytes(e->model, chunk);
}

static void fail_waiting(sl_engine_t *e, sl__req *r, sl_status st,
                         sl_reason reason, const char *msg) {
  pthread_mutex_lock(&e->mu);
  e->stats.waiting--;
  pthread_mutex_unlock(&e->mu);
  sl__finish(e, r, SL_FINISH_ERROR, st, reason, msg);
}

int sl__blocks_for(const sl_engine_t *e, int n_tokens) {
  int T = e->cfg.kv_block_tokens;
  return (n_tokens + T - 1) / T;
}

/* The most KV blocks one request can hold when it runs alone: the pool's,
 * and under --max-memory what the limit leaves after the weights and the
 * activations of a full prefill chunk (the largest a chunk can be, so that
 * whatever fits here is admitted once the engine is idle). */
static int alone_blocks(sl_engine_t *e, bool *by_memory) {
  int n = sl_kv_config_of(e->kv)->n_blocks;
  *by_memory = false;
  if (e->cfg.max_memory) {
    uint64_t fixed = sl_model_weight_bytes(e->model) +
                     sl_batch_activation_bytes(e->model, e->cfg.prefill_chunk);
    uint64_t room = e->cfg.max_memory > fixed
                        ? (e->cfg.max_memory - fixed) / block_bytes(e)
                        : 0;
    if (room < (uint64_t)n) {
      n = (int)room;
      *by_memory = true;
    }
  }
  return n;
}

static void waiting_pop_head(sl_engine_t *e) {
  e->waiting = e->waiting->next;
  if (!e->waiting)
    e->waiting_tail = NULL;
}

/* At the first admission: a request whose prompt (and the slot of its
 * first generated token) cannot fit even alone fails with a 4xx reason;
 * otherwise its max_tokens is clamped to what fits alone. Returns false
 * when the request failed (it was taken off the queue and freed). */
static bool check_fits_alone(sl_engine_t *e, sl__req *r) {
  int T = e->cfg.kv_block_tokens;
  bool by_memory;
  int cap = alone_blocks(e, &by_memory);
  int need = sl__blocks_for(e, r->n_prompt + 1);
  bool guard_fault = e->hooks.fail_guard_admit &&
                     (int)(e->first_chunks + 1) == e->hooks.fail_guard_admit;
  if (need <= cap && !guard_fault) {
    int max_new = cap * T - r->n_prompt;
    if (r->params.max_tokens > max_new)
      r->params.max_tokens = max_new;
    r->fits_alone = true;
    return true;
  }
  waiting_pop_head(e);
  char msg[320];
  /* counted as alone_blocks does: over the limit when the memory is what
   * binds (the smaller of the two caps) */
  r->est_bytes = sl_model_weight_bytes(e->model) +
                 (uint64_t)need * block_bytes(e) +
                 sl_batch_activation_bytes(e->model, e->cfg.prefill_chunk);
  if (guard_fault || by_memory) {
    e->first_chunks++;
    sl__clear_at_site(e, SL__SITE_ADMIT_MEM_EXCEEDED);
    snprintf(msg, sizeof msg,
             "the prompt (%d tokens) would need an estimated %llu bytes even "
             "with no other request running, over the memory limit of %llu "
             "bytes",
             r->n_prompt, (unsigned long long)r->est_bytes,
             (unsigned long long)e->cfg.max_memory);
    fail_waiting(e, r, SL_ERR_MEMORY_LIMIT, SL_REASON_PREFILL_MEMORY_EXCEEDED,
                 msg);
  } else {
    r->est_bytes = 0;
    snprintf(msg, sizeof msg,
             "the prompt (%d tokens) needs more KV cache than the server has "
             "for one request (%d tokens)",
             r->n_prompt, sl_kv_config_of(e->kv)->n_blocks * T);
    fail_waiting(e, r, SL_ERR_RANGE, SL_REASON_CONTEXT_LENGTH_EXCEEDED, msg);
  }
  return false;
}

/* In-flight prefix sharing: whether an active request is prefilling block
 * `blk` of r's tokens (the same tokens up to that block's end) and has not
 * computed it yet. A request never admitted waits for it, unless it has
 * already waited half its queue timeout (the other prefill may be long). */
static bool in_flight_elsewhere(sl_engine_t *e, const sl__req *r, int blk) {
  int T = e->cfg.kv_block_tokens;
  int end = (blk + 1) * T;
  if (e->cfg.queue_timeout_ms > 0 &&
      sl_now_ns() - r->t_submit > (uint64_t)e->cfg.queue_timeout_ms * 500000ull)
    return false;
  for (int i = 0; i < e->n_active; i++) {
    const sl__req *x = e->active[i];
    if (x->state == SL__REQ_PREFILLING && x->n_target >= end &&
        x->n_computed < end &&
        !memcmp(x->tokens, r->tokens, sizeof(int32_t) * (size_t)end)) {
      pthread_mutex_lock(&e->mu);
      e->stats.prefix_waits++;
      pthread_mutex_unlock(&e->mu);
      return true;
    }
  }
  return false;
}

/* Tries to admit the head of the waiting queue. Returns true if it was
 * admitted or failed (so the caller may try the next), false when it must
 * wait for blocks, memory or a slot. KV blocks are reserved for the tokens
 * to compute (the prompt) only; decoding takes more one at a time
 * (grow_blocks). */
bool sl__admit_one(sl_engine_t *e) {
  sl__req *r = e->waiting;
  int T = e->cfg.kv_block_tokens;
  if (!r->fits_alone && !check_fits_alone(e, r))
    return true;
  if (!r->blocks) {
    /* the table's capacity: every token this request can ever hold */
    r->blocks =
        sl_malloc(sizeof(int32_t) * (size_t)sl__blocks_for(
                                        e, r->n_prompt + r->params.max_tokens));
    if (!r->blocks) {
      waiting_pop_head(e);
      fail_waiting(e, r, SL_ERR_NOMEM, SL_REASON_OUT_OF_MEMORY, NULL);
      return true;
    }
  }
  /* prefix lookup over full blocks, leaving at least one token to compute;
   * an embedding computes every token (their hidden states are pooled) */
  int max_cached = r->params.pooling ? 0 : (r->n_target - 1) / T;
  uint64_t h = 0;
  int got = 0;
  for (; got < max_cached; got++) { /* h: the chain up to block got */
    uint64_t nh =
        sl_kv_hash_block(e->kv, h, r->tokens + (size_t)got * (size_t)T, T);
    int b = sl_kv_lookup(e->kv, nh, r->tokens + (size_t)got * (size_t)T);
    if (b < 0)
      break;
    h = nh;
    r->blocks[got] = b;
  }
  r->n_blocks = got;
  if (got < max_cached && !r->admitted && in_flight_elsewhere(e, r, got)) {
    /* another request is computing this very block: wait for it (it is
     * published when its chunk ends) rather than compute it again */
    sl__release_blocks(e, r);
    return false;
  }
  /* how far the tiers continue the chain (no I/O yet: their indexes) */
  int on_tier = 0;
  if (e->n_tiers) {
    uint64_t th = h;
    uint64_t fp = sl_kv_config_of(e->kv)->fingerprint;
    for (int j = got; j < max_cached; j++) {
      const int32_t *bt = r->tokens + (size_t)j * (size_t)T;
      th = sl_kv_hash_block(e->kv, th, bt, T);
      sl_kv_block_key k = {fp, th, bt};
      if (!sl__tiers_hold(e, &k, false))
        break;
      on_tier++;
    }
  }
  int need_new = sl__blocks_for(e, r->n_target) - got;
  int remaining = r->n_target - got * T;
  int chunk =
      remaining < e->cfg.prefill_chunk ? remaining : e->cfg.prefill_chunk;
  uint64_t est = sl__guard_estimate(e, need_new, chunk);
  if ((e->cfg.max_memory && est > e->cfg.max_memory) ||
      sl_kv_available(e->kv) < need_new || e->n_active >= e->cfg.max_seqs) {
    /* it fits alone: wait for the others to give memory back (the queue
     * timeout bounds the wait); the looked-up blocks go back meanwhile */
    sl__release_blocks(e, r);
    return false;
  }
  r->est_bytes = est;
  for (int i = 0; i < need_new; i++) {
    int b = sl_kv_block_alloc(e->kv);
    SL_ASSERT(b >= 0); /* sl_kv_available said so */
    r->blocks[r->n_blocks++] = b;
  }
  /* the first new blocks are filled from the tiers, as far as they read
   * back whole (a bad one ends the chain: computed instead) */
  if (on_tier)
    got += sl__store_restore(e, r->tokens + (size_t)got * (size_t)T, h,
                             r->blocks + got, on_tier);
  r->n_computed = got * T;
  r->state = SL__REQ_PREFILLING;
  if (r->emb) /* (again, after a preemption) */
    memset(r->emb, 0,
           sizeof(float) * (size_t)sl_model_hparams_of(e->model)->n_embd);
  waiting_pop_head(e);
  e->active[e->n_active++] = r;
  bool first = !r->admitted;
  if (first)
    r->n_cached = got * T;
  r->admitted = true;
  pthread_mutex_lock(&e->mu);
  e->stats.waiting--;
  e->stats.running++;
  if (first) {
    e->stats.requests_total++;
    e->stats.prompt_tokens_total += (uint64_t)r->n_prompt;
    e->stats.cached_tokens_total += (uint64_t)r->n_cached;
  }
  pthread_mutex_unlock(&e->mu);
  if (!first)
    return true; /* a preempted or requeued request: already started */
  sl_engine_event ev;
  memset(&ev, 0, sizeof ev);
  ev.kind = SL_EV_STARTED;
  ev.request_id = r->id;
  ev.prompt_tokens = r->n_prompt;
  ev.cached_tokens = r->n_cached;
  r->cb(r->user, &ev);
  return true;
}

/* Whether the client already aborted request id (its abort not yet
 * applied: sl__prepare_next admits inside a step, before the executor's
 * next sl__apply_aborts). */
static bool abort_pending(sl_engine_t *e, uint64_t id) {
  bool found = false;
  pthread_mutex_lock(&e->mu);
  for (size_t k = 0; k < e->n_aborts && !found; k++)
    found = e->aborts[k] == id;
  pthread_mutex_unlock(&e->mu);
  return found;
}

/* Fails the never-admitted requests that waited past the queue timeout
 * (a preempted or requeued one keeps its place at the head; one whose
 * client aborted it ends as aborted, by sl__apply_aborts). */
static void expire_waiting(sl_engine_t *e) {
  if (e->cfg.queue_timeout_ms <= 0 || !e->waiting)
    return;
  uint64_t now = sl_now_ns();
  uint64_t limit = (uint64_t)e->cfg.queue_timeout_ms * 1000000ull;
  sl__req *keep = NULL, *keep_tail = NULL, *r = e->waiting;
  e->waiting = e->waiting_tail = NULL;
  while (r) {
    sl__req *next = r->next;
    if (r->admitted || now - r->t_submit < limit || abort_pending(e, r->id)) {
      sl__list_push(&keep, &keep_tail, r);
    } else {
      char msg[160];
      snprintf(msg, sizeof msg,
               "the request waited %.1f s in the queue for memory or a free "
               "slot (--queue-timeout-ms %d); retry later",
               (double)(now - r->t_submit) / 1e9, e->cfg.queue_timeout_ms);
      pthread_mutex_lock(&e->mu);
      e->stats.queue_timeouts++;
      pthread_mutex_unlock(&e->mu);
      fail_waiting(e, r, SL_ERR_TIMEOUT, SL_REASON_QUEUE_TIMEOUT, msg);
    }
    r = next;
  }
  e->waiting = keep;
  e->waiting_tail = keep_tail;
}

void sl__admit_waiting(sl_engine_t *e) {
  expire_waiting(e);
  while (e->waiting && sl__admit_one(e))
    ;
}
