/* Llama-family model internals shared by the single-sequence forward pass
 * (llama.c) and the batched one over the paged KV cache (llama_batch.c). */
#ifndef SLUICE_LLAMA_IMPL_H
#define SLUICE_LLAMA_IMPL_H

#include <pthread.h>
#include <stdbool.h>

#include "sluice/gguf.h"
#include "sluice/kern_cpu.h"
#include "sluice/model.h"

/* ---- each layer described as data ------------------------------------------
 *
 * What a layer computes, built once at load from the metadata
 * (sl__model_describe) and read by both forward passes (llama_batch.c on the
 * CPU, llama_cuda.c on CUDA) and by the loader, which binds the tensors a
 * description names. The weights (sl__layer_w) say where, this says what.
 * Each pass names the features it implements (SL__CPU_FEATURES,
 * SL__CUDA_FEATURES); a context on a pass that lacks one a layer uses is
 * refused (sl__model_check), naming the architecture, the layer, the
 * feature and the device, so no layer runs wrong. A new architecture fills
 * in a description; a feature no pass has yet is one bit, refused until a
 * pass implements it. */

typedef enum sl__norm_kind {
  SL__NORM_RMS = 0,   /* x / rms(x) * w */
  SL__NORM_LAYER = 1, /* (x - mean) / std * w (+ b) */
} sl__norm_kind;

typedef struct sl__norm_desc {
  sl__norm_kind kind;
  float eps;
  float offset; /* the weight used is w + offset (gemma: 1), else 0 */
} sl__norm_desc;

typedef struct sl__rope_desc {
  int mode;       /* sl_kern_rope_mode */
  float base;     /* rope.freq_base */
  float scale;    /* multiplier on positions (1 / linear factor) */
  int64_t n_dims; /* rotated dims per head */
} sl__rope_desc;

typedef struct sl__attn_desc {
  int64_t n_head, n_head_kv, head_dim;
  sl__rope_desc rope;
  int64_t window; /* 0: full attention; else the last `window` positions */
  bool sinks;     /* a learned per-head sink logit (gpt-oss) */
  float scale;    /* the scores' factor: 1 / sqrt(head_dim) unless the file
                     says otherwise */
  float softcap;  /* 0: none; else scores = softcap * tanh(s / softcap) */
  bool qkv_bias;  /* q, k and v biases (qwen2) */
  bool o_bias;    /* the output projection's bias (gpt-oss) */
  bool qk_norm;   /* per-head RMSNorm of q and k before rope (qwen3) */
} sl__attn_desc;

typedef enum sl__act { SL__ACT_SILU = 0, SL__ACT_GELU = 1 } sl__act;

typedef enum sl__ffn_kind { SL__FFN_DENSE = 0, SL__FFN_MOE = 1 } sl__ffn_kind;

/* llama.cpp's expert_gating_func values */
typedef enum sl__gating {
  SL__GATING_SOFTMAX = 1,
  SL__GATING_SIGMOID = 2,
} sl__gating;

typedef struct sl__ffn_desc {
  sl__ffn_kind kind;
  sl__act act;
  bool gated;       /* act(gate x) * up x; else act(up x) */
  int64_t n_ff;     /* the hidden width: dense, or each expert's */
  int64_t n_expert; /* MoE: routed experts, n_used of them per token */
  int64_t n_used;
  int64_t n_shared; /* experts every token runs beside the routed ones */
  sl__gating gating;
  bool norm_weights;  /* the chosen experts' weights renormalised to sum 1 */
  float weight_scale; /* then times this */
} sl__ffn_desc;

typedef struct sl__layer_desc {
  sl__norm_desc norm;  /* attn_norm and ffn_norm (and the post norms) */
  bool post_attn_norm; /* a norm of the attention's output before the
                          residual add (gemma2/3) */
  bool post_ffn_norm;  /* the same for the FFN */
  sl__attn_desc attn;
  sl__ffn_desc ffn;
} sl__layer_desc;

typedef struct sl__model_desc {
  char arch[32];          /* the file's general.architecture */
  sl__norm_desc out_norm; /* output_norm */
  float embd_scale;       /* the embedding rows times this (gemma:
                             sqrt(n_embd)); 1 */
  float out_softcap;      /* 0: none; else logits = c * tanh(l / c) */
} sl__model_desc;

/* The features a layer or model may use beyond a llama layer (RMSNorm,
 * full causal attention with rope, a dense SwiGLU FFN); one bit each. */
enum {
  SL__F_QKV_BIAS = 1u << 0,
  SL__F_QK_NORM = 1u << 1,
  SL__F_MOE = 1u << 2,
  SL__F_SHARED_EXPERTS = 1u << 3,
  SL__F_GATING_SIGMOID = 1u << 4,
  SL__F_WINDOW = 1u << 5,
  SL__F_SINKS = 1u << 6,
  SL__F_ATTN_SOFTCAP = 1u << 7,
  SL__F_O_BIAS = 1u << 8,
  SL__F_POST_NORMS = 1u << 9,
  SL__F_LAYER_NORM = 1u << 10,
  SL__F_NORM_OFFSET = 1u << 11,
  SL__F_GELU = 1u << 12,
  SL__F_UNGATED_FFN = 1u << 13,
  SL__F_EMBD_SCALE = 1u << 14,
  SL__F_OUT_SOFTCAP = 1u << 15,
  SL__F_COUNT = 16
};

/* What each forward pass implements. */
#define SL__CPU_FEATURES  (SL__F_QKV_BIAS | SL__F_QK_NORM | SL__F_MOE)
#define SL__CUDA_FEATURES (SL__F_QKV_BIAS | SL__F_QK_NORM)

/* The features a layer uses; those of the model's own parts (embedding,
 * output). */
uint32_t sl__layer_features(const sl__layer_desc *ld);
uint32_t sl__model_desc_features(const sl__model_desc *md);
/* A feature's name for errors ("routed experts (mixture-of-experts)"). */
const char *sl__feature_name(uint32_t bit);

typedef struct sl__layer_w {
  sl_kern_weight wq, wk, wv, wo;       /* (n_head*hd, d) (n_kv*hd, d) ... */
  sl_kern_weight w_gate, w_up, w_down; /* (n_ff, d) (n_ff, d) (d, n_ff) */
  const float *attn_norm, *ffn_norm;   /* (d) */
  const float *bq, *bk, *bv;           /* qwen2: (n_head*hd) (n_kv*hd) ... */
  const float *q_norm, *k_norm;        /* qwen3: (hd) */
  /* MoE (hp.n_expert > 0; w_gate, w_up and w_down are then unused): the
   * router (n_expert, d) and each expert's matrices, views of expert e's
   * slice of the 3-D tensors ffn_{gate,up,down}_exps: (n_ff_exp, d) (n_ff_exp,
   * d) (d, n_ff_exp). Arrays of n_expert, in sl_model.experts. */
  sl_kern_weight router;
  sl_kern_weight *gate_exps, *up_exps, *down_exps;
  /* Each expert's gate stacked on its up (2 * n_ff_exp rows), fused by the
   * load transform (sl__model_repack) where the layout allows: a packed
   * copy only (data NULL), which gate_exps[e] and up_exps[e] view the two
   * halves of; one product per expert where sl_kern_packed_in_use says the
   * ISA in use reads it. NULL otherwise. Arrays of n_expert, in
   * sl_model.fused. */
  const sl_kern_weight *gu_exps;
} sl__layer_w;

struct sl_model {
  sl_gguf_t *g;
  sl_model_hparams hp;
  sl__model_desc md;
  sl__layer_desc *ld;             /* (n_layer): what each layer computes */
  const sl_gguf_tensor *tok_embd; /* (n_vocab, d) */
  sl_kern_weight output;          /* (n_vocab, d), tied or not */
  const float *output_norm;       /* (d) */
  sl__layer_w *layers;            /* (n_layer) */
  sl_kern_weight *experts;        /* (n_layer * 3 * n_expert): the layers'
                                     expert views, or NULL (dense) */
  uint64_t expert_bytes;          /* the expert tensors' bytes (of
                                     weight_bytes) */
  sl_kern_weight *fused;          /* (n_layer * n_expert): the fused gate/up
                                     views (sl__layer_w.gu_exps), or NULL */
  uint64_t weight_bytes;          /* the tensors' bytes in the file */
  uint8_t fingerprint[16];        /* sl_gguf_fingerprint of the file */
  /* The matrices' packed copies (sl__model_repack): one allocation, owned;
   * NULL until a CPU batch context asks for them, or when none applies. */
  void *packed;
  /* atomic: the transform runs as a task on a stream while other threads
   * read sl_model_weight_bytes */
  _Atomic uint64_t packed_bytes;   /* its size */
  _Atomic uint64_t released_bytes; /* mapped bytes given back once copied */
  bool repack_done;                /* sl__model_repack has run */
  pthread_mutex_t repack_mu;
};

/* Fills m->md and m->ld from m->hp (the metadata, read) and the file's
 * architecture; SL_ERR_NOMEM. */
sl_status sl__model_describe(sl_model_t *m);

/* SL_OK when the pass on `device` ("CPU", "CUDA") implements every feature
 * (`implemented`, SL__F_* bits) that m's layers and parts use; else
 * SL_ERR_UNSUPPORTED and err names the architecture, the first layer (or
 * part) and the feature it uses, and the device. */
sl_status sl__model_check(const sl_model_t *m, uint32_t implemented,
                          const char *device, char *err, size_t errcap);

/* Repacks every matrix whose type has packed kernels on the ISA in use
 * (sl_kern_repack; SLUICE_REPACK=0 turns it off) into m->packed, sets their
 * `packed`, and releases the mapped pages of the copied tensors
 * (sl_gguf_release_pages), except token_embd's when the output is tied to it
 * (the embedding lookup reads its rows). Once per model: a load-time
 * transform that every CPU batch context queues as the first task on its
 * stream (sl_batch_ctx_create2), so it runs before any forward pass of that
 * context and is in flight until the stream's owner drains it (an engine's
 * load clear); a CUDA context never does, so a GPU run spends no host memory
 * on copies. Without memory for the copies it logs and leaves the weights as
 * they are. Any thread (locked: a second context's task waits for the
 * first's, so neither runs a pass over half-repacked weights). */
void sl__model_repack(sl_model_t *m);

/* The routed-expert FFN of one MoE layer over n tokens (llama_moe.c):
 * out[t] = sum over token t's top-k experts e, in expert order, of
 * weight(t, e) * down_e(silu(gate_e x[t]) * up_e x[t]). The tokens are
 * grouped by expert, so each expert's matrices are read once per call, and
 * every token's arithmetic (its routing, its rows of each product, its
 * order of sums) is the same whatever else is in the batch. x and out are
 * (n, d) and do not overlap; scratch holds sl__moe_scratch_floats(f, d, n)
 * floats, 64-byte aligned. */
sl_status sl__moe_ffn(sl_kern_pool_t *pool, const sl__ffn_desc *f, int64_t d,
                      const sl__layer_w *w, const float *x, float *out, int n,
                      float *scratch);
/* The scratch of an FFN of f's shape over n tokens of width d; 0 for a dense
 * one. */
size_t sl__moe_scratch_floats(const sl__ffn_desc *f, int64_t d, size_t n);
/* The top-k routing of one token from its router logits (n_expert floats,
 * overwritten by their softmax): sel[0..k) the chosen experts in increasing
 * index order, wt[0..k) their weights. */
void sl__moe_route(const sl__ffn_desc *f, float *logits, int32_t *sel,
                   float *wt);

/* The CUDA forward pass (llama_cuda.c), behind sl_batch_ctx on a CUDA
 * stream. */
typedef struct sl__cu_ctx sl__cu_ctx;
sl_status sl__cu_create(sl_model_t *m, const sl_kv_view *kv,
                        sl_stream_t *stream, sl__cu_ctx **out, char *err,
                        size_t errcap);
void sl__cu_free(sl__cu_ctx *c);
sl_status sl__cu_submit(sl__cu_ctx *c, const sl_batch *b,
                        const sl_batch_out *out);
sl_status sl__cu_wait(sl__cu_ctx *c);
/* sl_batch_ctx_fetch_row on the GPU. */
sl_status sl__cu_fetch_row(sl__cu_ctx *c, int row, float *dst);
/* Device bytes the weights take once uploaded. */
uint64_t sl__cu_weight_bytes(const sl_model_t *m);

#endif
