/* Llama-family model internals shared by the single-sequence forward pass
 * (llama.c) and the batched one over the paged KV cache (llama_batch.c). */
#ifndef SLUICE_LLAMA_IMPL_H
#define SLUICE_LLAMA_IMPL_H

#include "sluice/gguf.h"
#include "sluice/kern_cpu.h"
#include "sluice/model.h"

typedef struct sl__layer_w {
  sl_kern_weight wq, wk, wv, wo;       /* (n_head*hd, d) (n_kv*hd, d) ... */
  sl_kern_weight w_gate, w_up, w_down; /* (n_ff, d) (n_ff, d) (d, n_ff) */
  const float *attn_norm, *ffn_norm;   /* (d) */
  const float *bq, *bk, *bv;           /* qwen2: (n_head*hd) (n_kv*hd) ... */
  const float *q_norm, *k_norm;        /* qwen3: (hd) */
} sl__layer_w;

struct sl_model {
  sl_gguf_t *g;
  sl_model_hparams hp;
  const sl_gguf_tensor *tok_embd; /* (n_vocab, d) */
  sl_kern_weight output;          /* (n_vocab, d), tied or not */
  const float *output_norm;       /* (d) */
  sl__layer_w *layers;            /* (n_layer) */
  uint64_t weight_bytes;
  uint8_t fingerprint[16]; /* sl_gguf_fingerprint of the file */
};

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
