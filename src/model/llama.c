/* Llama-family forward pass on the CPU (llama, qwen2, qwen3).
 *
 * The shortest honest path, llama2.c style: weights are borrowed views into
 * the GGUF mapping; the KV cache and the activations are allocated once per
 * context from the runtime allocator; each sl_ctx_eval chunk is one task on
 * the context's stream, which fans out over the kernel thread pool.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "llama_impl.h"
#include "sluice/alloc.h"
#include "sluice/kern_cpu.h"
#include "sluice/model.h"
#include "sluice/util.h"

#define MAX_CHUNK 512 /* tokens per forward task */

/* A single sequence over the batched path: its own KV buffer laid out as a
 * paged cache whose block table is simply 0, 1, 2, ... */
#define CTX_BLOCK 16
struct sl_ctx {
  sl_model_t *m;
  sl_stream_t *stream;
  sl_batch_ctx_t *bc;
  sl_kv_view kv;
  int32_t *table; /* (n_blocks) 0..n_blocks-1 */
  int n_ctx, n_past;
};

const char *sl_arch_name(sl_arch a) {
  switch (a) {
  case SL_ARCH_LLAMA:
    return "llama";
  case SL_ARCH_QWEN2:
    return "qwen2";
  case SL_ARCH_QWEN3:
    return "qwen3";
  case SL_ARCH_QWEN3MOE:
    return "qwen3moe";
  }
  return "?";
}

/* ---- loading ----------------------------------------------------------------
 */

typedef struct loader {
  sl_model_t *m;
  char *err;
  size_t errcap;
  sl_status st;
} loader;

static bool fail(loader *L, sl_status st, const char *fmt, const char *a,
                 long long b) {
  if (L->st == SL_OK) {
    L->st = st;
    if (L->err)
      snprintf(L->err, L->errcap, fmt, a, b);
  }
  return false;
}

static const sl_gguf_tensor *tensor(loader *L, const char *name, int layer,
                                    bool optional) {
  char full[96];
  if (layer >= 0)
    snprintf(full, sizeof full, "blk.%d.%s", layer, name);
  else
    snprintf(full, sizeof full, "%s", name);
  const sl_gguf_tensor *t = sl_gguf_find_tensor(L->m->g, full);
  if (!t && !optional)
    fail(L, SL_ERR_FORMAT, "missing tensor '%s'%.0lld", full, 0);
  return t;
}

/* The bytes of one row of `cols` elements of t's type; false (an error
 * naming the tensor) for a type the kernels do not take. */
static bool row_bytes(loader *L, const sl_gguf_tensor *t, const char *name,
                      int64_t cols, size_t *rb) {
  if (sl_kern_row_bytes(t->type, cols, rb) == SL_OK)
    return true;
  const sl_ggml_type_traits *tr = sl_ggml_type_traits_of(t->type);
  char what[160];
  snprintf(what, sizeof what, "tensor '%s': unsupported type %s (%d)", name,
           tr ? tr->name : "?", (int)t->type);
  return fail(L, SL_ERR_UNSUPPORTED, "%s%.0lld", what, 0);
}

/* Where a dimension the loader expects comes from: the metadata key (or
 * keys) that a tensor contradicts when its shape differs. */
typedef enum dim_src {
  DIM_EMBD,    /* embedding_length */
  DIM_Q,       /* attention.head_count x the head size */
  DIM_KV,      /* attention.head_count_kv x the head size */
  DIM_FF,      /* feed_forward_length */
  DIM_FF_EXP,  /* expert_feed_forward_length */
  DIM_EXPERTS, /* expert_count */
  DIM_VOCAB,   /* token_embd.weight's rows */
  DIM_HEAD,    /* the head size */
} dim_src;

static void dim_key(const loader *L, dim_src src, char *buf, size_t cap) {
  const char *a = sl_arch_name(L->m->hp.arch);
  char kl[96], hs[200];
  snprintf(kl, sizeof kl, "%s.attention.key_length", a);
  if (sl_gguf_find(L->m->g, kl) >= 0)
    snprintf(hs, sizeof hs, "%s", kl);
  else
    snprintf(hs, sizeof hs, "(%s.embedding_length / %s.attention.head_count)",
             a, a);
  switch (src) {
  case DIM_EMBD:
    snprintf(buf, cap, "%s.embedding_length", a);
    return;
  case DIM_Q:
    snprintf(buf, cap, "%s.attention.head_count x %s", a, hs);
    return;
  case DIM_KV:
    snprintf(buf, cap, "%s.attention.head_count_kv x %s", a, hs);
    return;
  case DIM_FF:
    snprintf(buf, cap, "%s.feed_forward_length", a);
    return;
  case DIM_FF_EXP:
    snprintf(buf, cap, "%s.expert_feed_forward_length", a);
    return;
  case DIM_EXPERTS:
    snprintf(buf, cap, "%s.expert_count", a);
    return;
  case DIM_VOCAB:
    snprintf(buf, cap, "the vocabulary (token_embd.weight's rows)");
    return;
  case DIM_HEAD:
    snprintf(buf, cap, "%s", hs);
    return;
  }
  snprintf(buf, cap, "?");
}

/* A tensor whose shape contradicts the metadata: the error names the
 * tensor, what it holds, and the key whose value it contradicts. */
static bool shape_error(loader *L, const char *name, int layer,
                        const sl_gguf_tensor *t, int dims, int64_t rows,
                        dim_src rsrc, int64_t cols, dim_src csrc) {
  char full[96], key[320], msg[640];
  if (layer >= 0)
    snprintf(full, sizeof full, "blk.%d.%s", layer, name);
  else
    snprintf(full, sizeof full, "%s", name);
  if ((int)t->n_dims != dims) {
    snprintf(msg, sizeof msg, "tensor '%s' has %d dimensions, not %d", full,
             (int)t->n_dims, dims);
  } else if ((int64_t)t->ne[0] != cols) {
    dim_key(L, csrc, key, sizeof key);
    snprintf(msg, sizeof msg,
             "tensor '%s' has %lld %s, but %s says %lld: the metadata "
             "contradicts the tensor",
             full, (long long)t->ne[0], dims == 1 ? "elements" : "columns", key,
             (long long)cols);
  } else {
    dim_key(L, rsrc, key, sizeof key);
    snprintf(msg, sizeof msg,
             "tensor '%s' has %lld rows, but %s says %lld: the metadata "
             "contradicts the tensor",
             full, (long long)t->ne[1], key, (long long)rows);
  }
  return fail(L, SL_ERR_FORMAT, "%s%.0lld", msg, 0);
}

/* Binds a matrix of `rows` × `cols` (their sizes from rsrc and csrc). */
static bool matrix(loader *L, sl_kern_weight *w, const char *name, int layer,
                   int64_t rows, dim_src rsrc, int64_t cols, dim_src csrc) {
  const sl_gguf_tensor *t = tensor(L, name, layer, false);
  if (!t)
    return false;
  if (t->n_dims != 2 || (int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows)
    return shape_error(L, name, layer, t, 2, rows, rsrc, cols, csrc);
  size_t rb;
  if (!row_bytes(L, t, name, cols, &rb))
    return false;
  w->type = t->type;
  w->rows = rows;
  w->cols = cols;
  w->data = t->data;
  L->m->weight_bytes += t->nbytes;
  return true;
}

/* Binds the n_expert matrices of `rows` × `cols` of a 3-D expert tensor
 * (GGUF ne = cols, rows, n_expert): views of its consecutive slices. */
static bool experts(loader *L, sl_kern_weight *ws, const char *name, int layer,
                    int64_t rows, dim_src rsrc, int64_t cols, dim_src csrc) {
  const sl_model_hparams *hp = &L->m->hp;
  const sl_gguf_tensor *t = tensor(L, name, layer, false);
  if (!t) {
    char split[64];
    snprintf(split, sizeof split, "blk.%d.ffn_gate.0.weight", layer);
    if (sl_gguf_find_tensor(L->m->g, split)) {
      L->st = SL_OK; /* say why instead */
      return fail(L, SL_ERR_UNSUPPORTED,
                  "tensor '%s': experts stored one tensor each (an old "
                  "Mixtral conversion); convert again for merged "
                  "ffn_*_exps tensors (layer %lld)",
                  split, layer);
    }
    return false;
  }
  if (t->n_dims != 3 || (int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows)
    return shape_error(L, name, layer, t, 3, rows, rsrc, cols, csrc);
  if ((int64_t)t->ne[2] != hp->n_expert) {
    char msg[240];
    snprintf(msg, sizeof msg,
             "tensor 'blk.%d.%s' holds %llu experts, metadata "
             "'%s.expert_count' says",
             layer, name, (unsigned long long)t->ne[2], sl_arch_name(hp->arch));
    return fail(L, SL_ERR_FORMAT, "%s %lld", msg, hp->n_expert);
  }
  size_t rb;
  if (!row_bytes(L, t, name, cols, &rb))
    return false;
  size_t per = rb * (size_t)rows;
  for (int64_t e = 0; e < hp->n_expert; e++)
    ws[e] = (sl_kern_weight){t->type, rows, cols,
                             (const char *)t->data + (size_t)e * per, NULL};
  L->m->weight_bytes += t->nbytes;
  L->m->expert_bytes += t->nbytes;
  return true;
}

/* Binds an f32 vector of n elements (its size from src); NULL when
 * optional and absent. */
static const float *vector(loader *L, const char *name, int layer, int64_t n,
                           dim_src src, bool optional) {
  const sl_gguf_tensor *t = tensor(L, name, layer, optional);
  if (!t)
    return NULL;
  if (t->type != SL_GGML_F32) {
    fail(L, SL_ERR_UNSUPPORTED,
         "tensor '%s' must be an f32 vector (layer %lld)", name, layer);
    return NULL;
  }
  if (t->n_dims != 1 || (int64_t)t->ne[0] != n) {
    shape_error(L, name, layer, t, 1, 1, src, n, src);
    return NULL;
  }
  L->m->weight_bytes += t->nbytes;
  return t->data;
}

static bool get_i(loader *L, const char *arch, const char *key, int64_t *out,
                  bool optional) {
  char full[128];
  snprintf(full, sizeof full, "%s.%s", arch, key);
  uint64_t v;
  if (!sl_gguf_get_u64(L->m->g, full, &v)) {
    if (sl_gguf_find(L->m->g, full) >= 0)
      return fail(L, SL_ERR_FORMAT,
                  "metadata '%s' must be a non-negative integer%.0lld", full,
                  0);
    if (optional)
      return false;
    return fail(L, SL_ERR_FORMAT, "missing metadata '%s'%.0lld", full, 0);
  }
  if (v > (1ull << 40))
    return fail(L, SL_ERR_FORMAT, "metadata '%s' out of range%.0lld", full, 0);
  *out = (int64_t)v;
  return true;
}

static bool get_f(loader *L, const char *arch, const char *key, float *out) {
  char full[128];
  snprintf(full, sizeof full, "%s.%s", arch, key);
  double v;
  if (!sl_gguf_get_f64(L->m->g, full, &v))
    return false;
  *out = (float)v;
  return true;
}

/* A metadata value out of its range: the error names the key. */
static bool bad_key(loader *L, const char *arch, const char *key, int64_t v,
                    const char *why) {
  char msg[200];
  snprintf(msg, sizeof msg, "metadata '%s.%s' = %lld: %s", arch, key,
           (long long)v, why);
  return fail(L, SL_ERR_FORMAT, "%s%.0lld", msg, 0);
}

/* Largest expert count sluice routes over (qwen3moe: 128, gpt-oss: 32,
 * DeepSeek-V3: 256). */
#define MAX_EXPERTS 1024

/* The MoE keys: expert_count (required by qwen3moe, > 0 makes a llama file
 * Mixtral-class), expert_used_count, expert_feed_forward_length (else
 * feed_forward_length), expert_weights_norm (default true),
 * expert_weights_scale (default 1) and expert_gating_func (softmax only). */
static bool load_experts(loader *L, const char *arch) {
  sl_model_hparams *hp = &L->m->hp;
  bool moe_arch = hp->arch == SL_ARCH_QWEN3MOE;
  if (!get_i(L, arch, "expert_count", &hp->n_expert, !moe_arch))
    hp->n_expert = 0;
  if (L->st != SL_OK)
    return false;
  if (moe_arch && hp->n_expert == 0)
    return bad_key(L, arch, "expert_count", 0, "an MoE model needs experts");
  if (hp->arch != SL_ARCH_LLAMA && !moe_arch && hp->n_expert > 0)
    return bad_key(L, arch, "expert_count", hp->n_expert,
                   "this architecture has no experts in sluice");
  if (hp->n_expert == 0)
    return true;
  if (hp->n_expert > MAX_EXPERTS)
    return bad_key(L, arch, "expert_count", hp->n_expert, "more than 1024");
  if (!get_i(L, arch, "expert_used_count", &hp->n_expert_used, false))
    return false;
  if (hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert)
    return bad_key(L, arch, "expert_used_count", hp->n_expert_used,
                   "must be 1..expert_count");
  if (!get_i(L, arch, "expert_feed_forward_length", &hp->n_ff_exp, true))
    hp->n_ff_exp = 0;
  if (L->st != SL_OK)
    return false;
  char key[128];
  snprintf(key, sizeof key, "%s.expert_shared_count", arch);
  uint64_t shared = 0;
  if (sl_gguf_get_u64(L->m->g, key, &shared) && shared > 0)
    return bad_key(L, arch, "expert_shared_count", (int64_t)shared,
                   "shared experts are not supported");
  snprintf(key, sizeof key, "%s.expert_gating_func", arch);
  uint64_t gating = 1;
  if (sl_gguf_get_u64(L->m->g, key, &gating) && gating != 1)
    return bad_key(L, arch, "expert_gating_func", (int64_t)gating,
                   "only softmax gating (1) is supported");
  snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
  hp->expert_norm = true;
  if (sl_gguf_find(L->m->g, key) >= 0 &&
      !sl_gguf_get_bool(L->m->g, key, &hp->expert_norm))
    return fail(L, SL_ERR_FORMAT, "metadata '%s' must be a bool%.0lld", key, 0);
  hp->expert_scale = 1.0f;
  get_f(L, arch, "expert_weights_scale", &hp->expert_scale);
  if (!(hp->expert_scale > 0) || !isfinite(hp->expert_scale))
    return fail(L, SL_ERR_FORMAT,
                "metadata '%s.expert_weights_scale' must be a finite number "
                "> 0%.0lld",
                arch, 0);
  return true;
}

static bool load_hparams(loader *L) {
  sl_model_t *m = L->m;
  sl_model_hparams *hp = &m->hp;
  sl_str a;
  if (!sl_gguf_get_str(m->g, "general.architecture", &a))
    return fail(L, SL_ERR_FORMAT, "no general.architecture%s%.0lld", "", 0);
  char arch[32];
  snprintf(arch, sizeof arch, "%.*s", (int)(a.len < 31 ? a.len : 31), a.ptr);
  if (strcmp(arch, "llama") == 0)
    hp->arch = SL_ARCH_LLAMA;
  else if (strcmp(arch, "qwen2") == 0)
    hp->arch = SL_ARCH_QWEN2;
  else if (strcmp(arch, "qwen3") == 0)
    hp->arch = SL_ARCH_QWEN3;
  else if (strcmp(arch, "qwen3moe") == 0)
    hp->arch = SL_ARCH_QWEN3MOE;
  else
    return fail(L, SL_ERR_UNSUPPORTED,
                "unsupported architecture '%s' (sluice runs llama, qwen2, "
                "qwen3, qwen3moe)%.0lld",
                arch, 0);
  if (!get_i(L, arch, "embedding_length", &hp->n_embd, false) ||
      !get_i(L, arch, "block_count", &hp->n_layer, false) ||
      !get_i(L, arch, "attention.head_count", &hp->n_head, false))
    return false;
  if (!get_i(L, arch, "attention.head_count_kv", &hp->n_head_kv, true))
    hp->n_head_kv = hp->n_head;
  if (!get_i(L, arch, "context_length", &hp->n_ctx_train, true))
    hp->n_ctx_train = 2048;
  if (hp->n_embd <= 0)
    return bad_key(L, arch, "embedding_length", hp->n_embd, "must be > 0");
  if (hp->n_layer <= 0 || hp->n_layer > 1024)
    return bad_key(L, arch, "block_count", hp->n_layer, "must be 1..1024");
  if (hp->n_head <= 0)
    return bad_key(L, arch, "attention.head_count", hp->n_head, "must be > 0");
  if (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv)
    return bad_key(L, arch, "attention.head_count_kv", hp->n_head_kv,
                   "must divide attention.head_count");
  if (!load_experts(L, arch))
    return false;
  /* the dense FFN's width; an MoE file may carry it unused, Mixtral's
   * gives the experts' width there */
  bool have_ff = get_i(L, arch, "feed_forward_length", &hp->n_ff, true);
  if (hp->n_expert == 0 && !have_ff)
    return get_i(L, arch, "feed_forward_length", &hp->n_ff, false);
  if (hp->n_expert > 0 && hp->n_ff_exp == 0) {
    if (!have_ff)
      return fail(L, SL_ERR_FORMAT,
                  "missing metadata '%s.expert_feed_forward_length' (nor "
                  "feed_forward_length)%.0lld",
                  arch, 0);
    hp->n_ff_exp = hp->n_ff;
  }
  if (!have_ff)
    hp->n_ff = hp->n_ff_exp;
  if (hp->n_ff <= 0 || hp->n_ff > (1 << 20))
    return bad_key(L, arch, "feed_forward_length", hp->n_ff, "must be 1..2^20");
  if (hp->n_expert > 0 && (hp->n_ff_exp <= 0 || hp->n_ff_exp > (1 << 20)))
    return bad_key(L, arch, "expert_feed_forward_length", hp->n_ff_exp,
                   "must be 1..2^20");
  if (!get_i(L, arch, "attention.key_length", &hp->head_dim, true))
    hp->head_dim = hp->n_embd / hp->n_head;
  if (!get_i(L, arch, "rope.dimension_count", &hp->n_rot, true))
    hp->n_rot = hp->head_dim;
  if (hp->head_dim <= 0 || hp->head_dim > 1024 || hp->n_rot > hp->head_dim)
    return fail(L, SL_ERR_FORMAT, "bad head size %s%lld", "", hp->head_dim);
  hp->rope_base = 10000.0f;
  get_f(L, arch, "rope.freq_base", &hp->rope_base);
  hp->rms_eps = 1e-5f;
  get_f(L, arch, "attention.layer_norm_rms_epsilon", &hp->rms_eps);
  hp->rope_scale = 1.0f;
  sl_str stype;
  char key[128];
  snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
  float factor = 0;
  if (get_f(L, arch, "rope.scaling.factor", &factor) && factor > 0) {
    if (sl_gguf_get_str(m->g, key, &stype) && !sl_str_eq(stype, "linear") &&
        !sl_str_eq(stype, "none"))
      return fail(L, SL_ERR_UNSUPPORTED,
                  "rope scaling '%s' is not supported%.0lld", "yarn/longrope",
                  0);
    if (!sl_gguf_get_str(m->g, key, &stype) || sl_str_eq(stype, "linear"))
      hp->rope_scale = 1.0f / factor;
  }
  hp->rope_mode =
      hp->arch == SL_ARCH_LLAMA ? SL_KERN_ROPE_NORM : SL_KERN_ROPE_NEOX;
  return true;
}

static bool load_tensors(loader *L) {
  sl_model_t *m = L->m;
  sl_model_hparams *hp = &m->hp;
  int64_t d = hp->n_embd, hd = hp->head_dim;
  m->tok_embd = tensor(L, "token_embd.weight", -1, false);
  if (!m->tok_embd)
    return false;
  if (m->tok_embd->n_dims != 2 || (int64_t)m->tok_embd->ne[0] != d)
    return shape_error(L, "token_embd.weight", -1, m->tok_embd, 2,
                       (int64_t)m->tok_embd->ne[1], DIM_VOCAB, d, DIM_EMBD);
  hp->n_vocab = (int64_t)m->tok_embd->ne[1];
  m->weight_bytes += m->tok_embd->nbytes;
  m->output_norm = vector(L, "output_norm.weight", -1, d, DIM_EMBD, false);
  if (tensor(L, "output.weight", -1, true)) {
    if (!matrix(L, &m->output, "output.weight", -1, hp->n_vocab, DIM_VOCAB, d,
                DIM_EMBD))
      return false;
  } else {
    hp->tied_embeddings = true;
    m->output = (sl_kern_weight){m->tok_embd->type, hp->n_vocab, d,
                                 m->tok_embd->data, NULL};
  }
  m->layers = sl_calloc((size_t)hp->n_layer, sizeof *m->layers);
  if (!m->layers)
    return fail(L, SL_ERR_NOMEM, "out of memory%s%.0lld", "", 0);
  if (hp->n_expert > 0) {
    m->experts = sl_calloc((size_t)hp->n_layer * 3 * (size_t)hp->n_expert,
                           sizeof *m->experts);
    if (!m->experts)
      return fail(L, SL_ERR_NOMEM, "out of memory%s%.0lld", "", 0);
  }
  for (int i = 0; i < hp->n_layer && L->st == SL_OK; i++) {
    sl__layer_w *w = &m->layers[i];
    const sl__layer_desc *ld = &m->ld[i];
    w->attn_norm = vector(L, "attn_norm.weight", i, d, DIM_EMBD, false);
    w->ffn_norm = vector(L, "ffn_norm.weight", i, d, DIM_EMBD, false);
    matrix(L, &w->wq, "attn_q.weight", i, hp->n_head * hd, DIM_Q, d, DIM_EMBD);
    matrix(L, &w->wk, "attn_k.weight", i, hp->n_head_kv * hd, DIM_KV, d,
           DIM_EMBD);
    matrix(L, &w->wv, "attn_v.weight", i, hp->n_head_kv * hd, DIM_KV, d,
           DIM_EMBD);
    matrix(L, &w->wo, "attn_output.weight", i, d, DIM_EMBD, hp->n_head * hd,
           DIM_Q);
    if (ld->ffn.kind == SL__FFN_MOE) {
      size_t E = (size_t)hp->n_expert;
      sl_kern_weight *ex = m->experts + (size_t)i * 3 * E;
      w->gate_exps = ex, w->up_exps = ex + E, w->down_exps = ex + 2 * E;
      matrix(L, &w->router, "ffn_gate_inp.weight", i, hp->n_expert, DIM_EXPERTS,
             d, DIM_EMBD);
      experts(L, w->gate_exps, "ffn_gate_exps.weight", i, hp->n_ff_exp,
              DIM_FF_EXP, d, DIM_EMBD);
      experts(L, w->up_exps, "ffn_up_exps.weight", i, hp->n_ff_exp, DIM_FF_EXP,
              d, DIM_EMBD);
      experts(L, w->down_exps, "ffn_down_exps.weight", i, d, DIM_EMBD,
              hp->n_ff_exp, DIM_FF_EXP);
    } else {
      matrix(L, &w->w_gate, "ffn_gate.weight", i, hp->n_ff, DIM_FF, d,
             DIM_EMBD);
      matrix(L, &w->w_up, "ffn_up.weight", i, hp->n_ff, DIM_FF, d, DIM_EMBD);
      matrix(L, &w->w_down, "ffn_down.weight", i, d, DIM_EMBD, hp->n_ff,
             DIM_FF);
    }
    if (ld->attn.qkv_bias) {
      w->bq = vector(L, "attn_q.bias", i, hp->n_head * hd, DIM_Q, false);
      w->bk = vector(L, "attn_k.bias", i, hp->n_head_kv * hd, DIM_KV, false);
      w->bv = vector(L, "attn_v.bias", i, hp->n_head_kv * hd, DIM_KV, false);
    }
    if (ld->attn.qk_norm) {
      w->q_norm = vector(L, "attn_q_norm.weight", i, hd, DIM_HEAD, false);
      w->k_norm = vector(L, "attn_k_norm.weight", i, hd, DIM_HEAD, false);
    }
  }
  return L->st == SL_OK;
}

sl_model_t *sl_model_load(const char *path, sl_status *st, char *err,
                          size_t errcap) {
  sl_status dummy;
  if (!st)
    st = &dummy;
  sl_model_t *m = sl_calloc(1, sizeof *m);
  if (!m) {
    *st = SL_ERR_NOMEM;
    return NULL;
  }
  pthread_mutex_init(&m->repack_mu, NULL);
  m->g = sl_gguf_open(path, st, err, errcap);
  if (!m->g)
    goto fail_open;
  loader L = {m, err, errcap, SL_OK};
  if (!load_hparams(&L)) {
    *st = L.st;
    goto fail_bind;
  }
  if ((*st = sl__model_describe(m)) != SL_OK) {
    if (err && errcap)
      snprintf(err, errcap, "out of memory");
    goto fail_bind;
  }
  if (!load_tensors(&L)) {
    *st = L.st;
    goto fail_bind;
  }
  sl_gguf_fingerprint(m->g, m->fingerprint);
  *st = SL_OK;
  return m;
fail_bind:
  sl_free(m->ld);
  sl_free(m->experts);
  sl_free(m->layers);
  sl_gguf_close(m->g);
fail_open:
  pthread_mutex_destroy(&m->repack_mu);
  sl_free(m);
  return NULL;
}

void sl_model_free(sl_model_t *m) {
  if (!m)
    return;
  sl_free(m->packed);
  sl_free(m->fused);
  sl_free(m->ld);
  sl_free(m->experts);
  sl_free(m->layers);
  sl_gguf_close(m->g);
  pthread_mutex_destroy(&m->repack_mu);
  sl_free(m);
}

const sl_model_hparams *sl_model_hparams_of(const sl_model_t *m) {
  return &m->hp;
}
const sl_gguf_t *sl_model_gguf(const sl_model_t *m) {
  return m->g;
}
const uint8_t *sl_model_fingerprint(const sl_model_t *m) {
  return m->fingerprint;
}
uint64_t sl_model_weight_bytes(const sl_model_t *m) {
  /* resident: the file's tensors, less the pages given back for packed
   * copies, plus the copies */
  return m->weight_bytes - atomic_load(&m->released_bytes) +
         atomic_load(&m->packed_bytes);
}

uint64_t sl_model_bytes_per_token(const sl_model_t *m) {
  uint64_t b = m->weight_bytes;
  if (m->hp.n_expert > 0) /* only the routed experts */
    b = b - m->expert_bytes +
        m->expert_bytes / (uint64_t)m->hp.n_expert *
            (uint64_t)m->hp.n_expert_used;
  if (m->hp.tied_embeddings || m->hp.n_vocab <= 0)
    return b;
  uint64_t e = m->tok_embd->nbytes;
  return b - e + e / (uint64_t)m->hp.n_vocab;
}

/* ---- context ----------------------------------------------------------------
 */

sl_status sl_ctx_create(sl_model_t *m, sl_stream_t *stream, int n_ctx,
                        int n_threads, sl_ctx_t **out) {
  return sl_ctx_create2(m, stream, n_ctx, n_threads, out, NULL, 0);
}

sl_status sl_ctx_create2(sl_model_t *m, sl_stream_t *stream, int n_ctx,
                         int n_threads, sl_ctx_t **out, char *err,
                         size_t errcap) {
  if (err && errcap)
    err[0] = 0;
  if (!m || !stream || !out || n_ctx <= 0 || n_ctx > (1 << 22))
    return SL_ERR_INVALID_ARG;
  const sl_model_hparams *hp = &m->hp;
  sl_ctx_t *c = sl_calloc(1, sizeof *c);
  if (!c)
    return SL_ERR_NOMEM;
  c->m = m;
  c->stream = stream;
  c->n_ctx = n_ctx;
  int nb = (n_ctx + CTX_BLOCK - 1) / CTX_BLOCK;
  c->kv = (sl_kv_view){NULL, (int)hp->n_layer, nb, CTX_BLOCK,
                       (int)(hp->n_head_kv * hp->head_dim)};
  size_t bytes = sl_kv_view_bytes(&c->kv);
  sl_status st = SL_ERR_NOMEM;
  c->table = sl_malloc(sizeof(int32_t) * (size_t)nb);
  if (!c->table)
    goto fail_table;
  for (int i = 0; i < nb; i++)
    c->table[i] = i;
  if ((st = sl_buf_alloc(stream, bytes, &c->kv.buf)) != SL_OK)
    goto fail_kv;
  if ((st = sl_batch_ctx_create2(m, &c->kv, stream, n_threads, &c->bc, err,
                                 errcap)) != SL_OK)
    goto fail_bc;
  *out = c;
  return SL_OK;
fail_bc:
  sl_buf_release(c->kv.buf);
fail_kv:
  sl_free(c->table);
fail_table:
  sl_free(c);
  return st;
}

void sl_ctx_free(sl_ctx_t *c) {
  if (!c)
    return;
  sl_batch_ctx_free(c->bc);
  sl_buf_release(c->kv.buf);
  sl_free(c->table);
  sl_free(c);
}

int sl_ctx_n_past(const sl_ctx_t *c) {
  return c->n_past;
}

void sl_ctx_truncate(sl_ctx_t *c, int n) {
  if (n >= 0 && n < c->n_past)
    c->n_past = n;
}

/* ---- the forward pass -------------------------------------------------------
 */

sl_status sl_ctx_eval(sl_ctx_t *c, const int32_t *tokens, int n, float *logits,
                      bool all_logits) {
  if (!c || !tokens || n <= 0)
    return SL_ERR_INVALID_ARG;
  if (n > c->n_ctx - c->n_past)
    return SL_ERR_RANGE;
  int64_t nv = c->m->hp.n_vocab;
  for (int i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= nv)
      return SL_ERR_RANGE;
  sl_status st = SL_OK;
  for (int done = 0; done < n && st == SL_OK;) {
    int chunk = n - done < MAX_CHUNK ? n - done : MAX_CHUNK;
    bool last = done + chunk == n;
    sl_batch_seq seq = {c->table,
                        c->kv.n_blocks,
                        c->n_past,
                        0,
                        chunk,
                        logits && (last || all_logits),
                        logits && all_logits,
                        false,
                        chunk == 1, /* one sequence: no batch to vary */
                        NULL,
                        false};
    sl_batch b = {tokens + done, chunk, &seq, 1};
    float *out = !logits      ? NULL
                 : all_logits ? logits + (size_t)done * (size_t)nv
                 : last       ? logits
                              : NULL;
    st = sl_batch_ctx_run(c->bc, &b, out);
    if (st == SL_OK) {
      c->n_past += chunk;
      done += chunk;
    }
  }
  return st;
}
