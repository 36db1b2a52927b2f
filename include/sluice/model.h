/* sluice — model: Llama-family architectures (llama, qwen2, qwen3) from GGUF,
 * and a single-sequence context that runs the forward pass on the CPU.
 *
 * Weights are borrowed views into the GGUF mapping (the model owns the
 * sl_gguf_t). A context owns its KV cache and activations, which come from the
 * runtime's caching allocator on the stream it is given; every forward pass is
 * one task on that stream.
 */
#ifndef SLUICE_MODEL_H
#define SLUICE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/alloc.h"
#include "sluice/gguf.h"
#include "sluice/kern_cuda.h" /* sl_kcu_sample_params, sl_kcu_sample_out */
#include "sluice/kv.h"
#include "sluice/rt.h"
#include "sluice/status.h"

typedef enum sl_arch {
  SL_ARCH_LLAMA = 0,    /* Llama 2/3, SmolLM2, Mistral */
  SL_ARCH_QWEN2 = 1,    /* attention biases, NEOX rope */
  SL_ARCH_QWEN3 = 2,    /* q/k RMSNorm, NEOX rope */
  SL_ARCH_QWEN3MOE = 3, /* qwen3 attention, routed experts (no shared one) */
} sl_arch;

typedef struct sl_model_hparams {
  sl_arch arch;
  int64_t n_vocab;
  int64_t n_embd; /* model width */
  int64_t n_layer;
  int64_t n_head;
  int64_t n_head_kv;
  int64_t head_dim; /* per head, for q and k and v */
  int64_t n_rot;    /* rotated dims per head */
  int64_t n_ff;
  int64_t n_ctx_train;
  float rope_base;
  float rope_scale; /* multiplier on positions (1 / linear factor) */
  float rms_eps;
  int rope_mode; /* sl_kern_rope_mode */
  bool tied_embeddings;
  /* Mixture of experts (qwen3moe; llama with expert_count > 0, Mixtral):
   * each layer's FFN is n_expert experts of hidden width n_ff_exp, of which
   * a router (ffn_gate_inp) picks n_expert_used per token: softmax over all
   * experts, the top k (the lowest index first on a tie), their weights
   * renormalised to sum 1 when expert_norm, times expert_scale. n_expert 0:
   * a dense FFN of width n_ff. */
  int64_t n_expert;
  int64_t n_expert_used;
  int64_t n_ff_exp;
  bool expert_norm;
  float expert_scale;
} sl_model_hparams;

typedef struct sl_model sl_model_t;
typedef struct sl_ctx sl_ctx_t;

/* Opens `path` and binds every tensor the architecture needs. Refuses an
 * unknown architecture with an error naming it. On failure returns NULL, sets
 * *st and writes a message into err. The caller frees with sl_model_free. */
sl_model_t *sl_model_load(const char *path, sl_status *st, char *err,
                          size_t errcap);
void sl_model_free(sl_model_t *m);

const sl_model_hparams *sl_model_hparams_of(const sl_model_t *m);
const sl_gguf_t *sl_model_gguf(const sl_model_t *m);
/* The weights' identity: 16 bytes, sl_gguf_fingerprint of the file (its
 * size, metadata and a stated sample of each tensor), computed at load. Lives
 * as long as `m`. */
const uint8_t *sl_model_fingerprint(const sl_model_t *m);
/* Bytes of the weights the model uses (the memory they take): the tensors'
 * file bytes (every expert of an MoE model), and, once a CPU batch context has
 * repacked the matrices, the packed copies in place of the mapped pages they
 * gave back. */
uint64_t sl_model_weight_bytes(const sl_model_t *m);
/* Bytes of weights one decode token reads: all of them, except that an
 * untied embedding table gives one row (the output matrix is read whole),
 * and of an MoE layer's experts only the n_expert_used it is routed to. */
uint64_t sl_model_bytes_per_token(const sl_model_t *m);
const char *sl_arch_name(sl_arch a);

/* Makes a context for one sequence of up to n_ctx tokens, computing with
 * n_threads threads (<= 0: all CPUs), its buffers owned by `stream` (a CPU
 * stream: the calling engine thread's own). Free with sl_ctx_free. */
sl_status sl_ctx_create(sl_model_t *m, sl_stream_t *stream, int n_ctx,
                        int n_threads, sl_ctx_t **out);
/* The same, writing why into err (when not NULL) on failure: a layer
 * feature the device's forward pass lacks names the architecture, the
 * layer, the feature and the device. */
sl_status sl_ctx_create2(sl_model_t *m, sl_stream_t *stream, int n_ctx,
                         int n_threads, sl_ctx_t **out, char *err,
                         size_t errcap);
void sl_ctx_free(sl_ctx_t *c);

/* Number of tokens in the KV cache. */
int sl_ctx_n_past(const sl_ctx_t *c);
/* Forgets the cache from position `n` on (n <= n_past). */
void sl_ctx_truncate(sl_ctx_t *c, int n);

/* Runs tokens[0..n) at positions n_past.. as one batch (prefill chunks are
 * batched matrix products), appends them to the KV cache and waits for the
 * result. Writes logits of the last token to `logits` (n_vocab floats), or,
 * when `all_logits` is true, of every token (n × n_vocab) — either may be
 * NULL. SL_ERR_RANGE when the cache would overflow. */
sl_status sl_ctx_eval(sl_ctx_t *c, const int32_t *tokens, int n, float *logits,
                      bool all_logits);

/* ---- batched forward over the paged KV cache (the engine's path) ---- */

/* sl_kv_view (where a paged KV cache lives, as the forward pass sees it) and
 * its layout arithmetic: sluice/kv.h. */

/* One sequence's slice of a batch: its tokens are tokens[first, first+n) of
 * the batch, at positions pos0.. of the sequence. Its KV lives in the pool
 * blocks listed in block_table (enough blocks for pos0 + n positions). */
typedef struct sl_batch_seq {
  const int32_t *block_table;
  int n_blocks;
  int pos0;
  int first;
  int n;
  bool want_logits; /* logits of its last token in this batch */
  bool all_logits;  /* logits of every one of its tokens (implies the last) */
  bool argmax_only; /* the caller reads only the argmax of its rows: the
                       device may leave their logits where they are */
  bool decode;      /* one generated token (not a prompt token). On a GPU,
                       decode tokens take the matrix-vector kernels and
                       prompt tokens the batched ones, whatever else is in
                       the batch, so that a token's arithmetic does not
                       depend on its batch. Decode sequences come first. */
  /* NULL: as above. Else (only where sl_batch_ctx_samples_on_device, and
   * only with want_logits and not all_logits) the device samples its last
   * logits row with these parameters (sl_kcu_sample; `row` is ignored, the
   * context sets it) and writes the result to out->sampled[this sequence];
   * the row's logits are then not copied back (out->logits' row is left
   * unwritten). Borrowed: read during sl_batch_ctx_submit only. */
  const sl_kcu_sample_params *sample;
  /* embeddings: the final-normed hidden state of every one of its tokens
   * goes to out->hidden (rows in batch order over such sequences, n_embd
   * floats each) instead of any logits (want_logits and all_logits must be
   * false). CPU only: a CUDA context refuses it (SL_ERR_UNSUPPORTED). */
  bool embed;
} sl_batch_seq;

typedef struct sl_batch {
  const int32_t *tokens;
  int n_tokens;
  const sl_batch_seq *seqs;
  int n_seqs;
} sl_batch;

typedef struct sl_batch_ctx sl_batch_ctx_t;

/* What a step gives back, per logits row in batch order (one for each
 * sequence with want_logits, n for one with all_logits). Each may be NULL,
 * except `sampled` when a sequence has `sample`. */
typedef struct sl_batch_out {
  float *logits;              /* (rows, n_vocab); rows of argmax_only sequences
                                 and of sampled ones may be left unwritten on a
                                 GPU */
  int32_t *argmax;            /* (rows) the argmax (lowest id on a tie) */
  float *argmax_logprob;      /* (rows) its log-probability */
  sl_kcu_sample_out *sampled; /* (n_seqs) per sequence in batch order:
                                 written for those with `sample`, the others'
                                 entries untouched. id -1: the device could
                                 not decide; sl_batch_ctx_fetch_row gives the
                                 row for the host to sample */
  float *hidden; /* (embed tokens, n_embd): see sl_batch_seq.embed */
} sl_batch_out;

/* Makes the scratch state for batched forward passes of `m` over `kv`, run
 * as tasks on `stream` with n_threads compute threads (CPU). On a CUDA
 * stream the weights are uploaded to the device here (a progress bar on a
 * terminal); a weight type without CUDA kernels gives SL_ERR_UNSUPPORTED.
 * `err` (may be NULL) receives a message on failure. */
sl_status sl_batch_ctx_create2(sl_model_t *m, const sl_kv_view *kv,
                               sl_stream_t *stream, int n_threads,
                               sl_batch_ctx_t **out, char *err, size_t errcap);
sl_status sl_batch_ctx_create(sl_model_t *m, const sl_kv_view *kv,
                              sl_stream_t *stream, int n_threads,
                              sl_batch_ctx_t **out);

/* Device bytes a CUDA batch context's weights take at the peak of their
 * upload (the weights in their device layout and the staging buffer of the
 * largest repacked tensor). */
uint64_t sl_model_device_weight_bytes(const sl_model_t *m);

/* Queues one batch on the context's stream and returns without waiting for
 * it; sl_batch_ctx_wait waits and fills `out`. `b`, its arrays and `out`
 * must stay valid until then; one batch at a time. */
sl_status sl_batch_ctx_submit(sl_batch_ctx_t *c, const sl_batch *b,
                              const sl_batch_out *out);
sl_status sl_batch_ctx_wait(sl_batch_ctx_t *c);
void sl_batch_ctx_free(sl_batch_ctx_t *c);

/* True when sequences of a batch may carry `sample` (a CUDA context); a CPU
 * context refuses them (SL_ERR_INVALID_ARG at submit). */
bool sl_batch_ctx_samples_on_device(const sl_batch_ctx_t *c);

/* Copies logits row `row` (batch order) of the last step into dst (n_vocab
 * floats): for the host to sample a sequence whose out->sampled id is -1.
 * Valid after a successful sl_batch_ctx_wait whose step gave some sampled
 * sequence id -1, until the next submit; ordered on the context's stream and
 * waited for. SL_ERR_STATE otherwise, SL_ERR_INVALID_ARG for a row out of
 * range, SL_ERR_UNSUPPORTED on a CPU context. Executor thread only. */
sl_status sl_batch_ctx_fetch_row(sl_batch_ctx_t *c, int row, float *dst);

/* Runs one batch and waits for it: writes the K/V of every token into its
 * sequence's blocks, and the logits rows in batch order: one for each
 * sequence with want_logits (its last token), n for one with all_logits.
 * Blocks must hold a power of two of tokens. Activations
 * come from the runtime allocator per call, so a memory limit surfaces as
 * SL_ERR_MEMORY_LIMIT (nothing is written to the KV cache then). */
sl_status sl_batch_ctx_run(sl_batch_ctx_t *c, const sl_batch *b, float *logits);

/* Bytes of activations a batch of n_tokens needs (the memory guard). */
uint64_t sl_batch_activation_bytes(const sl_model_t *m, int n_tokens);

/* The default model's path: $SLUICE_MODEL, else models/<default> in the
 * working directory, else ../models/<default> next to the running binary.
 * Returns `buf` (or the environment string). */
const char *sl_model_default_path(char *buf, size_t cap);

/* Touches every page of the weights so that the first token does not pay the
 * page faults; with `progress`, shows a bar on stderr when it is a terminal. */
void sl_model_prefault(const sl_model_t *m, bool progress);

#endif
