/* Llama-family model internals shared by the single-sequence forward pass
 * (llama.c) and the batched one over the paged KV cache (llama_batch.c). */
#ifndef SLUICE_LLAMA_IMPL_H
#define SLUICE_LLAMA_IMPL_H

#include <pthread.h>
#include <stdbool.h>

#include "sluice/gguf.h"
#include "sluice/kern_cpu.h"
#include "sluice/model.h"

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
} sl__layer_w;

struct sl_model {
  sl_gguf_t *g;
  sl_model_hparams hp;
  const sl_gguf_tensor *tok_embd; /* (n_vocab, d) */
  sl_kern_weight output;          /* (n_vocab, d), tied or not */
  const float *output_norm;       /* (d) */
  sl__layer_w *layers;            /* (n_layer) */
  sl_kern_weight *experts;        /* (n_layer * 3 * n_expert): the layers'
                                     expert views, or NULL (dense) */
  uint64_t expert_bytes;          /* the expert tensors' bytes (of
                                     weight_bytes) */
  uint64_t weight_bytes;          /* the tensors' bytes in the file */
  uint8_t fingerprint[16];        /* sl_gguf_fingerprint of the file */
  /* The matrices' packed copies (sl__model_repack): one allocation, owned;
   * NULL until a CPU batch context asks for them, or when none applies. */
  void *packed;
  uint64_t packed_bytes;   /* its size */
  uint64_t released_bytes; /* mapped bytes given back once copied */
  bool repack_done;        /* sl__model_repack has run */
  pthread_mutex_t repack_mu;
};

/* Repacks every matrix whose type has packed kernels on the ISA in use
 * (sl_kern_repack; SLUICE_REPACK=0 turns it off) into m->packed, sets their
 * `packed`, and releases the mapped pages of the copied tensors
 * (sl_gguf_release_pages), except token_embd's when the output is tied to it
 * (the embedding lookup reads its rows). Once per model: the first CPU batch
 * context calls it, before any CPU forward pass runs; a CUDA one never does,
 * so a GPU run spends no host memory on copies. Without memory for the
 * copies it logs and leaves the weights as they are. Any thread (locked). */
void sl__model_repack(sl_model_t *m);

/* The routed-expert FFN of one MoE layer over n tokens (llama_moe.c):
 * out[t] = sum over token t's top-k experts e, in expert order, of
 * weight(t, e) * down_e(silu(gate_e x[t]) * up_e x[t]). The tokens are
 * grouped by expert, so each expert's matrices are read once per call, and
 * every token's arithmetic (its routing, its rows of each product, its
 * order of sums) is the same whatever else is in the batch. x and out are
 * (n, d) and do not overlap; scratch holds sl__moe_scratch_floats(hp, n)
 * floats, 64-byte aligned. */
sl_status sl__moe_ffn(sl_kern_pool_t *pool, const sl_model_hparams *hp,
                      const sl__layer_w *w, const float *x, float *out, int n,
                      float *scratch);
size_t sl__moe_scratch_floats(const sl_model_hparams *hp, size_t n);
/* The top-k routing of one token from its router logits (n_expert floats,
 * overwritten by their softmax): sel[0..k) the chosen experts in increasing
 * index order, wt[0..k) their weights. */
void sl__moe_route(const sl_model_hparams *hp, float *logits, int32_t *sel,
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
