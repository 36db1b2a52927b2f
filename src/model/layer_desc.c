/* sluice — model: each layer described as data (llama_impl.h, "each layer
 * described as data"): the description built at load from the metadata,
 * the features a description uses, and the check that refuses a pass
 * lacking one. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "llama_impl.h"
#include "sluice/kern_cpu.h"
#include "sluice/util.h"

sl_status sl__model_describe(sl_model_t *m) {
  const sl_model_hparams *hp = &m->hp;
  sl__model_desc *md = &m->md;
  sl_str a = {0};
  memset(md, 0, sizeof *md);
  /* (the loader has read it already: the file names its architecture) */
  if (sl_gguf_get_str(m->g, "general.architecture", &a))
    snprintf(md->arch, sizeof md->arch, "%.*s",
             (int)(a.len < sizeof md->arch - 1 ? a.len : sizeof md->arch - 1),
             a.ptr);
  else
    snprintf(md->arch, sizeof md->arch, "?");
  const sl__norm_desc rms = {SL__NORM_RMS, hp->rms_eps, 0.0f};
  md->out_norm = rms;
  md->embd_scale = 1.0f;
  md->out_softcap = 0.0f;
  m->ld = sl_calloc((size_t)hp->n_layer, sizeof *m->ld);
  if (!m->ld)
    return SL_ERR_NOMEM;
  bool moe = hp->n_expert > 0;
  for (int64_t l = 0; l < hp->n_layer; l++) {
    sl__layer_desc *ld = &m->ld[l];
    ld->norm = rms;
    ld->attn = (sl__attn_desc){
        .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .rope = {hp->rope_mode, hp->rope_base, hp->rope_scale, hp->n_rot},
        .window = 0,
        .scale = 1.0f / sqrtf((float)hp->head_dim),
        .qkv_bias = hp->arch == SL_ARCH_QWEN2,
        .qk_norm = hp->arch == SL_ARCH_QWEN3 || hp->arch == SL_ARCH_QWEN3MOE,
    };
    ld->ffn = (sl__ffn_desc){
        .kind = moe ? SL__FFN_MOE : SL__FFN_DENSE,
        .act = SL__ACT_SILU,
        .gated = true,
        .n_ff = moe ? hp->n_ff_exp : hp->n_ff,
        .n_expert = hp->n_expert,
        .n_used = hp->n_expert_used,
        .gating = SL__GATING_SOFTMAX,
        .norm_weights = hp->expert_norm,
        .weight_scale = hp->expert_scale,
    };
  }
  return SL_OK;
}

uint32_t sl__layer_features(const sl__layer_desc *ld) {
  uint32_t f = 0;
  const sl__attn_desc *at = &ld->attn;
  const sl__ffn_desc *ff = &ld->ffn;
  if (at->qkv_bias)
    f |= SL__F_QKV_BIAS;
  if (at->qk_norm)
    f |= SL__F_QK_NORM;
  if (at->window > 0)
    f |= SL__F_WINDOW;
  if (at->sinks)
    f |= SL__F_SINKS;
  if (at->softcap > 0)
    f |= SL__F_ATTN_SOFTCAP;
  if (at->o_bias)
    f |= SL__F_O_BIAS;
  if (ld->post_attn_norm || ld->post_ffn_norm)
    f |= SL__F_POST_NORMS;
  if (ld->norm.kind != SL__NORM_RMS)
    f |= SL__F_LAYER_NORM;
  if (ld->norm.offset != 0)
    f |= SL__F_NORM_OFFSET;
  if (ff->act != SL__ACT_SILU)
    f |= SL__F_GELU;
  if (!ff->gated)
    f |= SL__F_UNGATED_FFN;
  if (ff->kind == SL__FFN_MOE) {
    f |= SL__F_MOE;
    if (ff->n_shared > 0)
      f |= SL__F_SHARED_EXPERTS;
    if (ff->gating != SL__GATING_SOFTMAX)
      f |= SL__F_GATING_SIGMOID;
  }
  return f;
}

uint32_t sl__model_desc_features(const sl__model_desc *md) {
  uint32_t f = 0;
  if (md->embd_scale != 1.0f)
    f |= SL__F_EMBD_SCALE;
  if (md->out_softcap > 0)
    f |= SL__F_OUT_SOFTCAP;
  if (md->out_norm.kind != SL__NORM_RMS)
    f |= SL__F_LAYER_NORM;
  if (md->out_norm.offset != 0)
    f |= SL__F_NORM_OFFSET;
  return f;
}

const char *sl__feature_name(uint32_t bit) {
  switch (bit) {
  case SL__F_QKV_BIAS:
    return "q/k/v biases";
  case SL__F_QK_NORM:
    return "q/k norms";
  case SL__F_MOE:
    return "routed experts (mixture-of-experts)";
  case SL__F_SHARED_EXPERTS:
    return "shared experts";
  case SL__F_GATING_SIGMOID:
    return "sigmoid expert gating";
  case SL__F_WINDOW:
    return "sliding-window attention";
  case SL__F_SINKS:
    return "attention sinks";
  case SL__F_ATTN_SOFTCAP:
    return "attention logit softcapping";
  case SL__F_O_BIAS:
    return "an attention output bias";
  case SL__F_POST_NORMS:
    return "post-attention and post-FFN norms";
  case SL__F_LAYER_NORM:
    return "LayerNorm";
  case SL__F_NORM_OFFSET:
    return "norm weights with an offset";
  case SL__F_GELU:
    return "a GELU FFN";
  case SL__F_UNGATED_FFN:
    return "an ungated FFN";
  case SL__F_EMBD_SCALE:
    return "scaled embeddings";
  case SL__F_OUT_SOFTCAP:
    return "final logit softcapping";
  }
  return "?";
}

static uint32_t lowest_bit(uint32_t f) {
  return f & (~f + 1u);
}

sl_status sl__model_check(const sl_model_t *m, uint32_t implemented,
                          const char *device, char *err, size_t errcap) {
  uint32_t lack = sl__model_desc_features(&m->md) & ~implemented;
  if (lack) {
    if (err && errcap)
      snprintf(err, errcap,
               "%s uses %s, which the %s forward pass does not implement "
               "yet",
               m->md.arch, sl__feature_name(lowest_bit(lack)), device);
    return SL_ERR_UNSUPPORTED;
  }
  for (int64_t l = 0; l < m->hp.n_layer; l++) {
    lack = sl__layer_features(&m->ld[l]) & ~implemented;
    if (!lack)
      continue;
    if (err && errcap)
      snprintf(err, errcap,
               "%s: layer %lld uses %s, which the %s forward pass does not "
               "implement yet",
               m->md.arch, (long long)l, sl__feature_name(lowest_bit(lack)),
               device);
    return SL_ERR_UNSUPPORTED;
  }
  return SL_OK;
}
