/* Engine internals: requests, the scheduler's state, clear-site counters.
 * Only src/engine and the engine's tests include this. */
#ifndef SLUICE_ENGINE_IMPL_H
#define SLUICE_ENGINE_IMPL_H

#include <pthread.h>

#include "sluice/engine.h"
#include "sluice/grammar.h"
#include "sluice/kv.h"
#include "sluice/model.h"
#include "sluice/rt.h"
#include "sluice/spec.h"

/* Every clear site of the engine (DESIGN.md, "Clear sites"). */
#define SL__CLEAR_SITES(X)                                                     \
  X(SL__SITE_PREFILL_CHUNK, "prefill.chunk")                                   \
  X(SL__SITE_PREFILL_END, "prefill.end")                                       \
  X(SL__SITE_ADMIT_MEM_EXCEEDED, "admit.memory_exceeded")                      \
  X(SL__SITE_ADMIT_RUNTIME_ERR, "admit.runtime_error")                         \
  X(SL__SITE_CHUNK_MEM_EXCEEDED, "chunk.memory_exceeded")                      \
  X(SL__SITE_CHUNK_RUNTIME_ERR, "chunk.runtime_error")                         \
  X(SL__SITE_DECODE_EVERY_N, "decode.every_n_tokens")                          \
  X(SL__SITE_DECODE_HOT_LOOP, "decode.hot_loop")                               \
  X(SL__SITE_DECODE_AFTER_FINISH, "decode.after_finish")                       \
  X(SL__SITE_DECODE_RUNTIME_ERR, "decode.runtime_error")                       \
  X(SL__SITE_IDLE, "engine.idle_reclaim")                                      \
  X(SL__SITE_SHUTDOWN, "engine.shutdown")                                      \
  X(SL__SITE_LOAD, "engine.load")                                              \
  X(SL__SITE_KV_EVICT, "kv.eviction")                                          \
  X(SL__SITE_ADMIN, "admin.clear_cache")

/* One more token's share of a one-token step until the engine's own steps
 * fit the cost model (spec.h): measured on the CPU (docs/PERF.md). */
#define SL__SPEC_COST_DEFAULT 0.1

typedef enum sl__clear_site {
#define SL__SITE_ENUM(id, name) id,
  SL__CLEAR_SITES(SL__SITE_ENUM)
#undef SL__SITE_ENUM
      SL__SITE_COUNT
} sl__clear_site;

const char *sl__clear_site_name(sl__clear_site s);

typedef struct sl__site_stats {
  uint64_t count;
  uint64_t engine_pending_max; /* engine-stream tasks pending after a clear */
  uint64_t inflight_bytes_max; /* bytes with pending uses at the clear */
  double inflight_ms_max;
  uint64_t reached_busy; /* reached with engine-stream work still pending */
  uint64_t draft_pending_max; /* drafter-stream tasks pending after a clear */
  double busy_drain_ms_max;   /* the longest such drain: work in flight then */
} sl__site_stats;

sl__site_stats sl__engine_site_stats(sl_engine_t *e, sl__clear_site site);
/* The drafter's stream (a draft model's), or NULL (tests). */
sl_stream_t *sl__engine_draft_stream(sl_engine_t *e);

/* Test hooks (tests/test_engine.c). `before_clear` runs on the executor
 * thread just before each clear site, with the engine stream, so a test can
 * queue real work there. `fail_*` inject faults: the Nth first chunk / later
 * chunk (1-based; 0: never) gets a memory-guard refusal or a runtime
 * SL_ERR_MEMORY_LIMIT. */
typedef struct sl__engine_test_hooks {
  void (*before_clear)(void *ud, sl_stream_t *engine_stream,
                       sl__clear_site site);
  /* after each clear, with the site's counters as they are now */
  void (*after_clear)(void *ud, sl_stream_t *engine_stream, sl__clear_site site,
                      const sl__site_stats *now);
  void *ud;
  /* each store copy task sleeps this long first: a long read, so that a
   * clear meets one in flight unless the lock keeps it out */
  int store_copy_delay_ms;
  int fail_guard_admit, fail_guard_chunk;
  int fail_oom_admit, fail_oom_chunk;
} sl__engine_test_hooks;

/* Must be called before any request is submitted. */
void sl__engine_set_test_hooks(sl_engine_t *e, const sl__engine_test_hooks *h);
/* The hooks every engine created from now on starts with (NULL: none), so
 * that the load site is reached with them (tests/test_pool.c). Call it
 * while no engine is being created. */
void sl__engine_default_test_hooks(const sl__engine_test_hooks *h);

typedef enum sl__req_state {
  SL__REQ_WAITING = 0,
  SL__REQ_PREFILLING = 1,
  SL__REQ_RUNNING = 2,
  SL__REQ_DONE = 3,
} sl__req_state;

/* The stop strings of one request, matched incrementally (stop.c): one KMP
 * automaton per string. Executor thread only (after its init at submit). */
typedef struct sl__stops {
  int n;
  const char *str[SL_MAX_STOP]; /* borrowed: the request's own copies */
  uint16_t len[SL_MAX_STOP];    /* 1..SL_MAX_STOP_BYTES */
  /* the longest suffix of the text fed so far that is a proper prefix of
   * str[i]: the bytes that could begin a match */
  uint16_t state[SL_MAX_STOP];
  uint16_t fail[SL_MAX_STOP][SL_MAX_STOP_BYTES]; /* (n, len[i]) KMP prefix
                                                    function of str[i] */
} sl__stops;

/* Sets up `m` for the n strings in stops (borrowed; they must outlive m).
 * Returns SL_ERR_INVALID_ARG, with m untouched, when n is out of
 * 0..SL_MAX_STOP or a string is empty or longer than SL_MAX_STOP_BYTES. */
sl_status sl__stops_init(sl__stops *m, const char *const *stops, int n);
/* Feeds the next n bytes of text. Returns true when a stop string now
 * occurs in the text; *tail is then the number of bytes from the start of
 * the earliest-starting occurrence to the end of p[0..n) (it may exceed n:
 * the occurrence began in earlier text). Only a match that ends in p can
 * be found, so call it until the first true. Costs O(n) per string,
 * amortized over the calls. */
bool sl__stops_feed(sl__stops *m, const char *p, size_t n, size_t *tail);
/* The length of the longest suffix of the text fed so far that could
 * begin a stop string: the bytes to hold back. At most SL_MAX_STOP_BYTES
 * - 1. */
size_t sl__stops_hold(const sl__stops *m);

/* A request's invariants, between the executor's steps and at submit
 * (sl__req_sanity checks them; T is cfg.kv_block_tokens):
 *   - tokens (capacity cfg.n_ctx; an embedding's: n_prompt) and cb are
 *     set, and a sampler exactly when it generates; 0 < n_prompt <=
 *     n_tokens <= cfg.n_ctx, and n_tokens == n_prompt + n_generated;
 *   - n_generated <= params.max_tokens; an embedding (params.pooling) has
 *     emb, generates nothing and has max_tokens 0; only an embedding has
 *     emb;
 *   - WAITING: nothing computed and no blocks held (n_computed == 0,
 *     n_blocks == 0, first_chunk_done false), n_target == n_tokens (the
 *     prompt, or after a preemption the prompt and the tokens so far);
 *   - PREFILLING and RUNNING: admitted, which implies fits_alone; blocks
 *     holds n_blocks ids of the pool, each referenced, at most the table's
 *     capacity ceil((n_prompt + max_tokens) / T), and they cover the
 *     computed tokens (n_blocks * T >= n_computed);
 *   - PREFILLING: n_computed <= n_target == n_tokens, and every block of
 *     the target is reserved (n_blocks >= ceil(n_target / T));
 *   - RUNNING: every token but the last sampled one is computed
 *     (n_computed == n_tokens - 1);
 *   - n_cached is whole blocks of the prompt (a multiple of T, <= n_prompt),
 *     counted at the first admission; retries is 0..2 (a third failure
 *     ends the request); grammar_taken only with a matcher;
 *   - pend_len <= pend_cap, and pend is set when pend_cap is not 0;
 *     stops covers params.stop (stops.n == params.n_stop);
 *   - t_first is 0 until the first token, then not before t_submit.
 * DONE is never seen: sl__finish frees the request. */
typedef struct sl__req {
  uint64_t id;
  sl__req_state state;
  int32_t *tokens; /* (n_ctx) prompt then generated; an embedding's
                      (n_prompt) */
  int n_prompt, n_tokens;
  int n_target;   /* tokens to compute before the next sample: the prompt;
                     after a preemption, the prompt and the tokens so far */
  int n_computed; /* tokens whose K/V is in the cache */
  int n_cached;   /* prompt tokens served from the prefix cache */
  int n_generated;
  int32_t draft[64]; /* this step's drafts (speculative decoding) */
  int n_draft;
  sl_draft_seq *dseq;     /* its state in the engine's drafter, from its first
                             draft */
  int n_drafted, n_kept;  /* drafts verified, and of them kept */
  sl_spec_accept_est acc; /* its drafts' acceptance (the adaptive rule) */
  int32_t *pred;          /* its predicted output (params.prediction's copy) */
  int n_pred;
  int32_t *blocks; /* block table */
  int n_blocks;
  int retries; /* runtime memory errors so far (the OOM ladder) */
  bool first_chunk_done;
  bool fits_alone; /* checked at the first admission; max_tokens clamped */
  bool admitted;   /* admitted once: STARTED reported, counted in stats */
  uint64_t est_bytes;
  sl_gen_params params;
  sl__stops stops;               /* over params.stop */
  sl_sampler_t *sampler;         /* NULL for an embedding */
  sl_grammar_matcher_t *matcher; /* constrained decoding, or NULL */
  float *emb;         /* embeddings (params.pooling): the pooled sum (n_embd) */
  bool grammar_taken; /* the matcher already took the picked token */
  /* the uniform draw of the next token, made when its step was built for
   * the device sampler; kept (not drawn again) if that step fails, so the
   * seeded stream of tokens is the host's */
  bool has_draw;
  double draw;
  sl_engine_cb cb;
  void *user;
  char *pend; /* generated text not yet emitted */
  size_t pend_len, pend_cap;
  uint64_t t_submit, t_first;
  struct sl__req *next;
} sl__req;

#define SL__ABORTS_INITIAL 1024

struct sl_engine {
  sl_model_t *model;
  const sl_tokenizer_t *tok;
  sl_engine_config cfg;
  pthread_t thread;
  /* inbox: guarded by mu */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  sl__req *inbox, *inbox_tail;
  uint64_t *aborts; /* growable: no abort is ever dropped */
  size_t n_aborts, cap_aborts;
  bool stopping;
  /* admin "clear cache": asked (under mu) and done, counted */
  uint64_t clears_asked, clears_done;
  sl_status admin_clear_status;
  uint64_t next_id;
  sl_engine_stats stats;
  sl__site_stats sites[SL__SITE_COUNT];
  sl_status start_status; /* set by the executor before `started` */
  char start_err[320];    /* why it failed, in words ("" when it did not) */
  bool started;
  /* executor-thread state */
  sl_stream_t *stream; /* the executor thread's own stream */
  sl_kv_pool_t *kv;
  sl_batch_ctx_t *bctx;
  sl__req *waiting, *waiting_tail; /* FCFS */
  sl__req **active;                /* prefilling and running, in order */
  int n_active;
  float *logits;     /* (max_seqs, n_vocab) */
  float *logits_tmp; /* (n_vocab) */
  /* constrained decoding: the vocabulary's trie (made at the first request
   * with a grammar) and the mask of the token being picked */
  sl_grammar_vocab_t *gvocab;
  uint8_t *gmask; /* (n_vocab) */
  /* embeddings: hidden-state rows of a step (max_batched_tokens, n_embd),
   * made at the first embedding request */
  float *hidden;
  int n_embd;
  int32_t *argmax; /* (max_seqs) the device's argmax per logits row */
  /* sampling on the device (sl_batch_ctx_samples_on_device, and not turned
   * off by SLUICE_DEVICE_SAMPLING=0): per batch sequence, its params and
   * the device's result */
  bool dev_sampling;
  /* speculative decoding (cfg.speculative on a CPU engine): the drafter's
   * parameters, and what it drafted and kept */
  bool spec;
  sl_draft_params draft;
  sl_drafter *drafter;     /* prompt lookup made from draft, or a draft model */
  sl_model_t *draft_model; /* cfg.draft_model, loaded at start */
  sl_stream_t *draft_stream; /* its drafter's stream (the engine's own) */
  /* the adaptive rule (plan_spec): the step cost model and its ratio, and
   * per running request its cap, acceptance and share (max_seqs + 1) */
  sl_spec_cost cost_model;
  double spec_cost;
  sl__req **spec_req;
  int *spec_prop, *spec_take;
  double *spec_alpha;
  uint64_t drafted, accepted;
  sl_kcu_sample_params *batch_samp; /* (max_seqs + max_batched_tokens) */
  sl_kcu_sample_out *sampled;       /* (max_seqs + max_batched_tokens) */
  /* tokens by where they were picked, for stats (executor thread; copied
   * into `stats` at the end of each step) */
  uint64_t n_argmax, n_sampled_device, n_sampled_host, n_fallbacks;
  uint64_t n_grammar_masks, n_grammar_unmasked;
  sl_device_t *dev; /* where the model runs */
  int32_t *batch_tokens;
  sl_batch_seq *batch_seqs;
  sl__req **batch_reqs;
  uint64_t tokens_since_clear;
  uint64_t steps;
  int finished_since_clear; /* 1 after a finish, counts steps to the clear */
  uint64_t first_chunks, later_chunks; /* for the fault hooks */
  sl_status clear_error; /* a clear reported an error: fail active requests */
  sl__engine_test_hooks hooks;
  /* the tiers below the pool, in lookup order (hot RAM, then SSD), each
   * optional */
  sl_kv_tier_t *tiers[2];
  int n_tiers;
  struct sl__store *store;   /* their store worker (store.c), or NULL */
  struct sl__pinned *pinned; /* the hot tier's page-locked slots (CUDA) */
};

/* ---- shared by engine.c, scheduler.c, admit.c, emit.c and detok.c
 * (executor thread) ---- */

void sl__req_free(sl__req *r);
/* The invariants above (engine.c); for SL_ASSERT only. Reads the pool's
 * reference counts of an admitted request's blocks: executor thread, or
 * any thread for a request not yet admitted. */
bool sl__req_sanity(const sl_engine_t *e, const sl__req *r);
void sl__list_push(sl__req **head, sl__req **tail, sl__req *r);
/* Ends a request: reports, publishes and frees its blocks, frees it. */
void sl__finish(sl_engine_t *e, sl__req *r, sl_finish why, sl_status err,
                sl_reason reason, const char *msg);
/* The hook, then the one clear primitive on the engine stream. */
void sl__clear_at_site(sl_engine_t *e, sl__clear_site site);
/* emit.c: releases r's blocks (their references) / publishes its full,
 * computed blocks in the prefix cache (and queues them for the tiers). */
void sl__release_blocks(sl_engine_t *e, sl__req *r);
void sl__publish_blocks(sl_engine_t *e, sl__req *r);
/* A token picked for r, with its logprobs when r asks for them. */
typedef struct sl__picked {
  int32_t tok;
  float lp;
  int n_top;
  sl_token_logprob top[SL_MAX_TOP_LOGPROBS];
} sl__picked;
/* Picks the next token of r (batch sequence s, logits row `row`); false
 * when it could not (r then finished with the error, and was freed). */
bool sl__pick(sl_engine_t *e, sl__req *r, int s, int row, sl__picked *pk);
/* Reports a picked token: r's stop conditions, its text. Returns true when
 * r finished (and was freed). */
bool sl__emit(sl_engine_t *e, sl__req *r, const sl__picked *pk);
/* sl__pick then sl__emit: true when r finished. */
bool sl__sample_and_emit(sl_engine_t *e, sl__req *r, int s, int row);
/* The pick counts into the stats (e->mu held). */
void sl__publish_picks(sl_engine_t *e);
/* admit.c: the KV blocks that n_tokens tokens take. */
int sl__blocks_for(const sl_engine_t *e, int n_tokens);
/* The memory guard (issue 4): the peak a prefill chunk of `chunk` tokens
 * would reach with `new_blocks` more KV blocks in use. */
uint64_t sl__guard_estimate(sl_engine_t *e, int new_blocks, int chunk);
/* Admits the head of the waiting queue: true if it was admitted or failed. */
bool sl__admit_one(sl_engine_t *e);
/* Fails the requests that waited past the queue timeout, then admits from
 * the head of the queue while requests fit. */
void sl__admit_waiting(sl_engine_t *e);
void sl__apply_aborts(sl_engine_t *e);
/* Builds and runs one batch; false when there was nothing to do. */
bool sl__step(sl_engine_t *e);
/* Moves the inbox (filled by sl_engine_submit) to the waiting queue. */
void sl__take_inbox(sl_engine_t *e);
/* The host's share of the next step, done while this one runs on the
 * device: new requests join the waiting queue and are admitted (prefix
 * lookup, memory guard, blocks), so that the next batch is ready when this
 * one's results arrive. Aborts wait for the step's end (they free blocks
 * the running step may be writing). */
void sl__prepare_next(sl_engine_t *e);
/* store.c: the store worker and restores from the tiers. */
sl_status sl__store_start(sl_engine_t *e);
/* Queues a just-published block (taking a reference) for the tiers; ev: the
 * engine stream's point after which its K/V is written. */
void sl__store_enqueue(sl_engine_t *e, int block, uint64_t hash,
                       const int32_t *tokens, sl_event ev);
/* Drops the references of blocks the worker is done with (executor). */
void sl__store_collect(sl_engine_t *e);
/* Writes what is queued, ends the worker, drops its references. */
void sl__store_stop(sl_engine_t *e);
/* Fills pool blocks blocks[0..n) with the chain that follows `parent` over
 * tokens (n full blocks) from the tiers, each block from the first tier
 * that holds it, as far as the chain goes; publishes them; returns how
 * many. */
int sl__store_restore(sl_engine_t *e, const int32_t *tokens, uint64_t parent,
                      const int32_t *blocks, int n);
/* The hot tier's page-locked payload slots on CUDA (sl_kv_ram_config's
 * pay_alloc / pay_free with the sl__pinned as ctx); destroyed after the
 * tier is closed. */
struct sl__pinned *sl__pinned_create(size_t slot);
void *sl__pinned_alloc(void *ctx, size_t n);
void sl__pinned_free(void *ctx, void *p);
void sl__pinned_destroy(struct sl__pinned *p);
/* Whether some tier holds the block (key): an admission's lookup, each
 * tier asked counting a miss; or whether every tier does (all): the
 * store's check, counted nowhere. */
bool sl__tiers_hold(sl_engine_t *e, const sl_kv_block_key *key, bool all);

/* Fails every active request with st (a clear reported an error). */
void sl__fail_active(sl_engine_t *e, sl_status st);
void sl__active_remove(sl_engine_t *e, sl__req *r);

/* detok.c: appends `piece` (plen bytes, borrowed) to r->pend and matches
 * the stop strings on it. On SL_OK, *emit is how many bytes of r->pend can
 * be emitted now, and *stopped says whether a stop string starts right
 * there (the request ends). SL_ERR_NOMEM when pend cannot grow: nothing
 * changed. Pass the result to sl__detok_consume once emitted. */
sl_status sl__detok_append(sl__req *r, const char *piece, size_t plen,
                           size_t *emit, bool *stopped);
/* Drops the emitted bytes (and, after a stop, the rest) from r->pend. */
void sl__detok_consume(sl__req *r, size_t emit, bool stopped);
/* Appends a token's text and emits what is safe; true when a stop
 * string ended the request. */
bool sl__detok_step(sl_engine_t *e, sl__req *r, int32_t tok, float lp,
                    const sl_token_logprob *top, int n_top);
/* Emits the text held back, as a token event with token -1. */
void sl__detok_flush(sl__req *r);
/* log-softmax of `lg` at `tok`, and the top-n entries. */
float sl__logprobs(const float *lg, int nv, int32_t tok, int n_top,
                   sl_token_logprob *top);

#endif
