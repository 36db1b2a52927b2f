/* sluice — engine: one per loaded model. An executor thread owns the model's
 * compute (its own thread-local stream), runs the scheduler (waiting ->
 * prefilling -> running; continuous batching with chunked prefill over the
 * paged KV cache and its prefix cache), samples, and reports events.
 *
 * Threading: sl_engine_submit / sl_engine_abort / sl_engine_stats may be
 * called from any thread (HTTP threads). Event callbacks run on the executor
 * thread and must not block: copy what you need and signal your own thread.
 */
#ifndef SLUICE_ENGINE_H
#define SLUICE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/grammar.h"
#include "sluice/kv_tier.h"
#include "sluice/memsync.h"
#include "sluice/model.h"
#include "sluice/reason.h"
#include "sluice/sampler.h"
#include "sluice/status.h"
#include "sluice/tokenizer.h"

typedef struct sl_engine sl_engine_t;

typedef enum sl_engine_device {
  SL_ENGINE_DEVICE_AUTO = 0, /* the GPU when one is present, else the CPU */
  SL_ENGINE_DEVICE_CPU = 1,
  SL_ENGINE_DEVICE_CUDA = 2, /* falls back to the CPU, with a warning */
} sl_engine_device;

/* "auto", "cpu", "cuda" -> *out; false for anything else. */
bool sl_engine_device_parse(const char *s, sl_engine_device *out);

/* The device `d` resolves to on this machine: the CUDA device, or the CPU
 * with one log line saying why (a build without CUDA, no GPU). */
sl_device_t *sl_engine_resolve_device(sl_engine_device d);

typedef struct sl_engine_config {
  sl_engine_device device; /* --device */
  int n_threads;           /* compute threads (<= 0: all CPUs) */
  int n_ctx;               /* max tokens per sequence */
  int kv_block_tokens;     /* --kv-block-tokens: a power of two */
  int kv_blocks;           /* 0: sized from max_memory */
  int kv_seq_tokens;       /* kv_blocks 0: the pool holds max_seqs
                              sequences of this many tokens (0: n_ctx),
                              and always one of n_ctx */
  int max_seqs;            /* --max-seqs: sequences running at once */
  int max_batched_tokens;  /* --max-batched-tokens: tokens per step */
  int prefill_chunk;       /* --prefill-chunk: tokens per prefill chunk */
  uint64_t max_memory;    /* --max-memory: the memory guard's limit (0: none) */
  int clear_every_tokens; /* decode clear site: every N generated tokens */
  int hot_loop_steps;     /* decode clear site: every M steps while the  */
  uint64_t hot_loop_cache_bytes; /* cache holds at least this many bytes */
  /* a CPU KV pool's pages are touched at start (serve sets it): RSS is then
   * what serving holds from the first request, not a slope over minutes */
  bool kv_prefault;
  /* the SSD tier (--ssd-cache-dir, --ssd-cache-bytes): prefix blocks
   * written by the store worker, restored at admission, kept across
   * restarts. NULL: none. A directory that is missing or not writable
   * fails sl_engine_create (SL_ERR_IO), or with ssd_cache_optional logs a
   * warning and runs without the tier. On CUDA the store and restore copies
   * are asynchronous, through page-locked host buffers. */
  const char *ssd_cache_dir;
  uint64_t ssd_cache_bytes;
  bool ssd_cache_optional;
  /* the hot RAM tier (--hot-cache-bytes; 0: none): copies of published
   * prefix blocks in host memory, an LRU within this budget, looked up
   * after the pool and before the SSD tier; lz4-compressed where that saves
   * an eighth (hot_cache_lz4). Its bytes come on top of max_memory. On
   * CUDA too (ordinary host memory; restores stage through page-locked
   * buffers). */
  uint64_t hot_cache_bytes;
  bool hot_cache_lz4;
  int queue_timeout_ms; /* --queue-timeout-ms: a request that was never
                           admitted fails after waiting this long (with
                           SL_REASON_QUEUE_TIMEOUT); <= 0: waits forever */
  /* --speculative ngram (1; 0: off): a request with no grammar, greedy or
   * sampled, on a CPU engine, drafts up to draft_max tokens a step by
   * prompt lookup (include/sluice/spec.h, draft_min at least) and the step
   * verifies them with its decode token; the output is the same, bit for
   * bit (a sampled one for the same seed). --speculative draft (2): the
   * drafts are draft_model's, a smaller model sharing the vocabulary, run
   * on the drafter's own stream (which every clear drains too). */
  int speculative;
  const char *draft_model; /* --draft-model FILE (borrowed: outlives the
                              engine); speculative 2 needs it */
  /* --draft-fixed: every step verifies as many drafts as each request may
   * take (--draft-max), instead of the adaptive rule (spec.h
   * sl_spec_allocate: each request's acceptance against the step's cost,
   * so that drafts stop when they no longer pay) */
  bool draft_fixed;
  int draft_max;   /* --draft-max, 1..64 */
  int draft_min;   /* --draft-min, 1..draft_max */
  int draft_ngram; /* --draft-ngram: the longest n-gram looked up, 1..64
                      (down to 2, or 1 when it is 1); 0: 4 */
} sl_engine_config;

sl_engine_config sl_engine_config_defaults(void);

/* Stop strings per request, and the bytes of each: the engine refuses more
 * (SL_ERR_INVALID_ARG). The OpenAI route allows 4 (the API's own limit). */
#define SL_MAX_STOP         8
#define SL_MAX_STOP_BYTES   256
#define SL_MAX_TOP_LOGPROBS 20
#define SL_MAX_LOGIT_BIAS   1024 /* logit_bias entries per request */

/* Embeddings: how a prompt's hidden states become one vector. */
typedef enum sl_pooling {
  SL_POOL_NONE = 0, /* generate (the default) */
  SL_POOL_MEAN = 1, /* the mean of every token's final-normed hidden state */
  SL_POOL_LAST = 2, /* the last token's */
} sl_pooling;

typedef struct sl_gen_params {
  int max_tokens; /* ignored when embedding */
  sl_sampler_params sampling;
  const char *stop[SL_MAX_STOP]; /* copied at submit; each at most
                                    SL_MAX_STOP_BYTES long */
  int n_stop;
  int top_logprobs; /* 0..SL_MAX_TOP_LOGPROBS; < 0: no logprobs */
  bool ignore_eos;
  /* added to the logits before sampling (copied at submit; ids in the
   * vocabulary, at most SL_MAX_LOGIT_BIAS) */
  const sl_logit_bias *logit_bias;
  int n_logit_bias;
  /* constrained decoding: every token is one the grammar allows, and the
   * end of generation only where its text is whole (the engine takes a
   * reference at submit). NULL: none. */
  sl_grammar_t *grammar;
  /* SL_POOL_NONE: generate. Else the prompt is embedded and nothing is
   * generated: its pooled hidden state, L2-normalized, comes in the DONE
   * event (as llama.cpp's --embedding gives it). The whole prompt is
   * computed (no prefix reuse). CPU engines only: SL_ERR_UNSUPPORTED on a
   * GPU. */
  sl_pooling pooling;
  /* no speculative drafts for this request (its output is the same either
   * way, for the same seed; the API's "speculative": false) */
  bool no_speculation;
  /* tokens the output is expected to resemble (OpenAI's predicted output):
   * the drafter proposes from them too (copied at submission; unused
   * without speculative decoding); n_prediction <= n_ctx */
  const int32_t *prediction;
  int n_prediction;
} sl_gen_params;

typedef enum sl_finish {
  SL_FINISH_NONE = 0,
  SL_FINISH_STOP = 1,   /* end of generation token or a stop string */
  SL_FINISH_LENGTH = 2, /* max_tokens or the context */
  SL_FINISH_ABORT = 3,  /* sl_engine_abort, or shutdown */
  SL_FINISH_ERROR = 4,
} sl_finish;

typedef enum sl_event_kind {
  SL_EV_STARTED = 0, /* prefill done; cached_tokens known */
  SL_EV_TOKEN = 1,   /* one generated token, with its text (may be empty
                        while a UTF-8 sequence or a stop string is pending) */
  SL_EV_DONE = 2,    /* final: finish reason and usage; no more events */
} sl_event_kind;

typedef struct sl_token_logprob {
  int32_t id;
  float logprob;
} sl_token_logprob;

typedef struct sl_engine_event {
  sl_event_kind kind;
  uint64_t request_id;
  /* SL_EV_TOKEN */
  int32_t token;
  const char *text; /* valid during the callback */
  size_t text_len;
  float logprob; /* of `token`, when logprobs were asked for */
  int n_top;
  const sl_token_logprob *top;
  /* SL_EV_STARTED and SL_EV_DONE */
  int prompt_tokens;
  int cached_tokens; /* prompt tokens served from the prefix cache */
  int completion_tokens;
  /* SL_EV_DONE: speculative drafts verified that were the target's token
   * (kept) and that were not (OpenAI's accepted_ / rejected_prediction_
   * tokens) */
  int draft_accepted, draft_rejected;
  sl_finish finish;
  sl_status error;       /* SL_EV_DONE with SL_FINISH_ERROR: the cause */
  sl_reason reason;      /* ... and what the client is told (sluice/reason.h) */
  const char *error_msg; /* detail; NULL: the reason's own message */
  /* SL_EV_DONE of an embedding (params.pooling): n_embd floats, valid
   * during the callback */
  const float *embedding;
  int n_embd;
  uint64_t est_bytes, limit_bytes; /* memory-guard refusals */
} sl_engine_event;

typedef void (*sl_engine_cb)(void *user, const sl_engine_event *ev);

/* Starts an engine for `model` and `tok` (both borrowed; they must outlive
 * the engine) with its executor thread. */
sl_status sl_engine_create(sl_model_t *model, const sl_tokenizer_t *tok,
                           const sl_engine_config *cfg, sl_engine_t **out);
/* The same; on failure `err` (when not NULL) says why in words, naming
 * what failed (a path and the system's reason for the SSD cache, the
 * memory for a model that does not fit); "" when there are no words. */
sl_status sl_engine_create2(sl_model_t *model, const sl_tokenizer_t *tok,
                            const sl_engine_config *cfg, sl_engine_t **out,
                            char *err, size_t errcap);

/* The admin's "clear cache": the engine's executor runs a clear on its own
 * stream (the admin.clear_cache site) between steps; waits for it.
 * SL_ERR_CANCELLED when the engine stops first. */
sl_status sl_engine_clear_cache(sl_engine_t *e);

/* The memory an engine for `model` with `cfg` plans to hold: the weights
 * as they are now (sl_model_weight_bytes), its KV pool and its hot tier's
 * budget. The engine pool admits loads against its budget with it. */
uint64_t sl_engine_plan_bytes(const sl_model_t *model,
                              const sl_engine_config *cfg);
/* The tokens the KV pool of such an engine holds. */
int64_t sl_engine_plan_kv_tokens(const sl_model_t *model,
                                 const sl_engine_config *cfg);

/* Ends every request (SL_FINISH_ABORT), stops the executor thread, drains
 * and frees its streams (I5), and frees the engine. */
void sl_engine_free(sl_engine_t *e);

/* Queues a request: takes a copy of prompt[0..n) and params. `cb` receives
 * the events, the last one SL_EV_DONE. Fails (without calling cb) with
 * SL_ERR_RANGE when the prompt does not fit the context, SL_ERR_INVALID_ARG
 * for bad parameters. Stores the request id in *id.
 *
 * Admission (on the executor thread): a request whose prompt does not fit
 * the KV cache or the memory limit even when it runs alone ends with
 * SL_FINISH_ERROR (PREFILL_MEMORY_EXCEEDED or CONTEXT_LENGTH_EXCEEDED, 4xx
 * reasons); its max_tokens is clamped to what fits alone (it then ends with
 * SL_FINISH_LENGTH there). One that fits alone waits for blocks, memory and
 * a slot, up to queue_timeout_ms (then QUEUE_TIMEOUT, a 503). KV blocks are
 * reserved for the prompt at admission and one at a time as tokens are
 * generated; when none can be had, the youngest running request goes back
 * to the head of the queue and is later recomputed from its prompt and its
 * tokens so far (mostly from the prefix cache): its events only pause. */
sl_status sl_engine_submit(sl_engine_t *e, const int32_t *prompt, int n,
                           const sl_gen_params *params, sl_engine_cb cb,
                           void *user, uint64_t *id);

/* The one clamp of max_tokens to the context: what a request of n_prompt
 * tokens asking for max_tokens may generate in this engine (the room left,
 * n_ctx - n_prompt, at most; never below 0). sl_engine_submit applies it; a
 * caller that plans around the answer's length (a thinking budget) asks it
 * rather than clamping on its own. */
int sl_engine_max_new(const sl_engine_t *e, int n_prompt, int max_tokens);

/* Asks the engine to end request `id` within one step; its blocks are freed.
 * The request still gets SL_EV_DONE (SL_FINISH_ABORT). Unknown ids are
 * ignored. Every abort is kept, however many are queued; SL_ERR_NOMEM only
 * when the list cannot grow (then the abort was not recorded). */
sl_status sl_engine_abort(sl_engine_t *e, uint64_t id);

typedef struct sl_engine_stats {
  int waiting, running;
  uint64_t requests_total, requests_failed;
  uint64_t prompt_tokens_total, cached_tokens_total, generated_tokens_total;
  int kv_blocks_total, kv_blocks_used, kv_blocks_cached;
  uint64_t steps;
  /* time in steps (submit to results) and in the clears, in ns; a clear
   * reached while the step's work was still running also waits for it
   * (work the step would have waited for anyway), so clear_idle_ns, the
   * clears that found the engine stream idle, is their own cost */
  uint64_t step_ns, clears, clear_ns, clear_idle_ns;
  /* generated tokens by where they were picked: the device's argmax (a
   * plain greedy request), the device sampler, the host sampler (from a
   * logits row copied back); fallbacks: the device sampler could not decide
   * and the host sampled the row (counted in sampled_host too) */
  uint64_t argmax_device, sampled_device, sampled_host, sample_fallbacks;
  /* tokens of grammar requests: picked after a mask was made, or greedy
   * picks the grammar took with no mask (both within sampled_host) */
  uint64_t grammar_masks, grammar_unmasked;
  /* running requests sent back to the queue to free KV blocks (they are
   * recomputed, mostly from the prefix cache), and queued requests failed
   * by the queue timeout */
  uint64_t preemptions, queue_timeouts;
  /* blocks restored from the tiers (hot, SSD) at admission, and the time
   * spent reading and queueing them */
  uint64_t restored_blocks, restore_ns;
  /* of those, the blocks read by a copy (from SSD: the reader threads
   * read a group's files in parallel), their bytes and the wall time the
   * reads took */
  uint64_t restore_read_blocks, restore_read_bytes, restore_read_ns;
  /* admissions put off because another request was prefilling the next
   * block of the same prefix (in-flight prefix sharing) */
  uint64_t prefix_waits;
  /* speculative decoding: tokens drafted, and of them kept */
  uint64_t drafted, accepted;
  /* the adaptive rule's cost model: one more token's share of a one-token
   * step (include/sluice/spec.h), as fitted from the steps so far */
  double spec_token_cost;
} sl_engine_stats;

/* The store worker (it copies finished prefix blocks into the tiers). */
#define SL_STORE_HOLD_BUCKETS SL_LOCK_HIST_BUCKETS
typedef struct sl_engine_store_stats {
  uint64_t queued;  /* blocks handed to the worker */
  uint64_t written; /* blocks the tier took */
  uint64_t failed;  /* blocks whose copy or write failed (tier off, I/O) */
  uint64_t dropped; /* oldest unwritten blocks dropped: the disk was behind */
  uint64_t pending; /* blocks waiting now */
  /* the buffer-access lock, per copy batch (at most 8 blocks): holds,
   * their total and longest time, and a histogram of hold times with
   * upper bounds sl_engine_store_hold_bucket_ns(0..SL_STORE_HOLD_BUCKETS-1)
   * (the last is +Inf) */
  uint64_t lock_holds, lock_ns_total, lock_ns_max;
  uint64_t lock_hold_hist[SL_STORE_HOLD_BUCKETS];
  /* the worker's own checks, 0 when the protocol holds: clears that found
   * one of its copies still in flight (the lock keeps them out: the clear
   * evidence of its stream, rt.h); copies that were not recorded as a use
   * of the pool on its stream (I1) */
  uint64_t copies_at_clear, copies_unrecorded;
} sl_engine_store_stats;

uint64_t sl_engine_store_hold_bucket_ns(int bucket);

/* How long the clears of the engine's device waited for the buffer-access
 * lock and held it (memsync.h): a clear waits at most one store batch. */
sl_access_lock_stats sl_engine_clear_lock_stats(sl_engine_t *e);

/* The counters of tier i (in lookup order: hot, then SSD, each when
 * configured) and of the store worker; false (and nothing written) when
 * the engine has no tier i. Any thread. */
bool sl_engine_tier_stats(sl_engine_t *e, int i, sl_kv_tier_stats *tier,
                          sl_engine_store_stats *store);

sl_engine_stats sl_engine_get_stats(sl_engine_t *e);

/* The device the model runs on ("cpu", "cuda:0"), known once the engine is
 * created. */
const char *sl_engine_device_name(const sl_engine_t *e);
sl_device_t *sl_engine_device_of(const sl_engine_t *e);

#endif
