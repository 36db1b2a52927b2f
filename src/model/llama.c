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

#include "model/llama_impl.h"
#include "sluice/alloc.h"
#include "sluice/kern_cpu.h"
#include "sluice/model.h"
#include "sluice/util.h"

#define MAX_CHUNK 512 /* tokens per forward task */

struct sl_ctx {
  sl_model_t *m;
  sl_stream_t *stream;
  sl_kern_pool_t *pool;
  int n_ctx, n_past;
  sl_buf_t *kv;  /* k then v: (n_layer, n_ctx, n_kv*hd) f16 each */
  sl_buf_t *act; /* the activations below, carved from one buffer */
  size_t off_x, off_xn, off_q, off_k, off_v, off_att, off_g, off_u, off_sc;
};

const char *sl_arch_name(sl_arch a) {
  switch (a) {
  case SL_ARCH_LLAMA:
    return "llama";
  case SL_ARCH_QWEN2:
    return "qwen2";
  case SL_ARCH_QWEN3:
    return "qwen3";
  }
  return "?";
}

/* ---- loading ---------------------------------------------------------------- */

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

/* Binds a matrix of `rows` × `cols`. */
static bool matrix(loader *L, sl_kern_weight *w, const char *name, int layer,
                   int64_t rows, int64_t cols) {
  const sl_gguf_tensor *t = tensor(L, name, layer, false);
  if (!t)
    return false;
  if (t->n_dims != 2 || (int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows)
    return fail(L, SL_ERR_FORMAT, "tensor '%s' has the wrong shape (layer %lld)",
                name, layer);
  size_t rb;
  if (sl_kern_row_bytes(t->type, cols, &rb) != SL_OK)
    return fail(L, SL_ERR_UNSUPPORTED,
                "tensor '%s': unsupported type %lld", name, (long long)t->type);
  w->type = t->type;
  w->rows = rows;
  w->cols = cols;
  w->data = t->data;
  L->m->weight_bytes += t->nbytes;
  return true;
}

/* Binds an f32 vector of n elements; NULL when optional and absent. */
static const float *vector(loader *L, const char *name, int layer, int64_t n,
                           bool optional) {
  const sl_gguf_tensor *t = tensor(L, name, layer, optional);
  if (!t)
    return NULL;
  if (t->type != SL_GGML_F32 || t->n_dims != 1 || (int64_t)t->ne[0] != n) {
    fail(L, SL_ERR_UNSUPPORTED, "tensor '%s' must be an f32 vector (layer %lld)",
         name, layer);
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
  else
    return fail(L, SL_ERR_UNSUPPORTED,
                "unsupported architecture '%s' (sluice runs llama, qwen2, "
                "qwen3)%.0lld",
                arch, 0);
  if (!get_i(L, arch, "embedding_length", &hp->n_embd, false) ||
      !get_i(L, arch, "block_count", &hp->n_layer, false) ||
      !get_i(L, arch, "feed_forward_length", &hp->n_ff, false) ||
      !get_i(L, arch, "attention.head_count", &hp->n_head, false))
    return false;
  if (!get_i(L, arch, "attention.head_count_kv", &hp->n_head_kv, true))
    hp->n_head_kv = hp->n_head;
  if (!get_i(L, arch, "context_length", &hp->n_ctx_train, true))
    hp->n_ctx_train = 2048;
  if (hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv ||
      hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_layer > 1024 ||
      hp->n_ff <= 0)
    return fail(L, SL_ERR_FORMAT, "inconsistent hyperparameters%s%.0lld", "",
                0);
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
      return fail(L, SL_ERR_UNSUPPORTED, "rope scaling '%s' is not supported%.0lld",
                  "yarn/longrope", 0);
    if (!sl_gguf_get_str(m->g, key, &stype) || sl_str_eq(stype, "linear"))
      hp->rope_scale = 1.0f / factor;
  }
  hp->rope_mode = hp->arch == SL_ARCH_LLAMA ? SL_KERN_ROPE_NORM
                                            : SL_KERN_ROPE_NEOX;
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
    return fail(L, SL_ERR_FORMAT, "token_embd.weight has the wrong shape%s%.0lld",
                "", 0);
  hp->n_vocab = (int64_t)m->tok_embd->ne[1];
  m->weight_bytes += m->tok_embd->nbytes;
  m->output_norm = vector(L, "output_norm.weight", -1, d, false);
  if (tensor(L, "output.weight", -1, true)) {
    if (!matrix(L, &m->output, "output.weight", -1, hp->n_vocab, d))
      return false;
  } else {
    hp->tied_embeddings = true;
    m->output = (sl_kern_weight){m->tok_embd->type, hp->n_vocab, d,
                                 m->tok_embd->data};
  }
  m->layers = sl_calloc((size_t)hp->n_layer, sizeof *m->layers);
  if (!m->layers)
    return fail(L, SL_ERR_NOMEM, "out of memory%s%.0lld", "", 0);
  for (int i = 0; i < hp->n_layer && L->st == SL_OK; i++) {
    sl__layer_w *w = &m->layers[i];
    w->attn_norm = vector(L, "attn_norm.weight", i, d, false);
    w->ffn_norm = vector(L, "ffn_norm.weight", i, d, false);
    matrix(L, &w->wq, "attn_q.weight", i, hp->n_head * hd, d);
    matrix(L, &w->wk, "attn_k.weight", i, hp->n_head_kv * hd, d);
    matrix(L, &w->wv, "attn_v.weight", i, hp->n_head_kv * hd, d);
    matrix(L, &w->wo, "attn_output.weight", i, d, hp->n_head * hd);
    matrix(L, &w->w_gate, "ffn_gate.weight", i, hp->n_ff, d);
    matrix(L, &w->w_up, "ffn_up.weight", i, hp->n_ff, d);
    matrix(L, &w->w_down, "ffn_down.weight", i, d, hp->n_ff);
    if (hp->arch == SL_ARCH_QWEN2) {
      w->bq = vector(L, "attn_q.bias", i, hp->n_head * hd, false);
      w->bk = vector(L, "attn_k.bias", i, hp->n_head_kv * hd, false);
      w->bv = vector(L, "attn_v.bias", i, hp->n_head_kv * hd, false);
    }
    if (hp->arch == SL_ARCH_QWEN3) {
      w->q_norm = vector(L, "attn_q_norm.weight", i, hd, false);
      w->k_norm = vector(L, "attn_k_norm.weight", i, hd, false);
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
  m->g = sl_gguf_open(path, st, err, errcap);
  if (!m->g)
    goto fail_open;
  loader L = {m, err, errcap, SL_OK};
  if (!load_hparams(&L) || !load_tensors(&L)) {
    *st = L.st;
    goto fail_bind;
  }
  *st = SL_OK;
  return m;
fail_bind:
  sl_free(m->layers);
  sl_gguf_close(m->g);
fail_open:
  sl_free(m);
  return NULL;
}

void sl_model_free(sl_model_t *m) {
  if (!m)
    return;
  sl_free(m->layers);
  sl_gguf_close(m->g);
  sl_free(m);
}

const sl_model_hparams *sl_model_hparams_of(const sl_model_t *m) {
  return &m->hp;
}
const sl_gguf_t *sl_model_gguf(const sl_model_t *m) { return m->g; }
uint64_t sl_model_weight_bytes(const sl_model_t *m) { return m->weight_bytes; }

/* ---- context ---------------------------------------------------------------- */

sl_status sl_ctx_create(sl_model_t *m, sl_stream_t *stream, int n_ctx,
                        int n_threads, sl_ctx_t **out) {
  if (!m || !stream || !out || n_ctx <= 0 || n_ctx > (1 << 22))
    return SL_ERR_INVALID_ARG;
  if (sl_device_kind_of(sl_stream_device(stream)) != SL_DEVICE_CPU)
    return SL_ERR_UNSUPPORTED;
  const sl_model_hparams *hp = &m->hp;
  sl_ctx_t *c = sl_calloc(1, sizeof *c);
  if (!c)
    return SL_ERR_NOMEM;
  c->m = m;
  c->stream = stream;
  c->n_ctx = n_ctx;
  sl_status st = SL_ERR_NOMEM;
  c->pool = sl_kern_pool_create(n_threads);
  if (!c->pool)
    goto fail_pool;
  size_t kvd = (size_t)(hp->n_head_kv * hp->head_dim);
  size_t kv_bytes = 2 * (size_t)hp->n_layer * (size_t)n_ctx * kvd * 2;
  if ((st = sl_buf_alloc(stream, kv_bytes, &c->kv)) != SL_OK)
    goto fail_kv;
  size_t T = MAX_CHUNK, d = (size_t)hp->n_embd,
         qd = (size_t)(hp->n_head * hp->head_dim), ff = (size_t)hp->n_ff;
  size_t nth = (size_t)sl_kern_pool_n_threads(c->pool);
  size_t off = 0;
#define CARVE(field, floats)                                                   \
  c->field = off;                                                              \
  off += ((floats) * 4 + 63) & ~(size_t)63;
  CARVE(off_x, T * d);
  CARVE(off_xn, T * d);
  CARVE(off_q, T * qd);
  CARVE(off_k, T * kvd);
  CARVE(off_v, T * kvd);
  CARVE(off_att, T * qd);
  CARVE(off_g, T * ff);
  CARVE(off_u, T * ff);
  CARVE(off_sc, nth * ((size_t)n_ctx + 32));
#undef CARVE
  if ((st = sl_buf_alloc(stream, off, &c->act)) != SL_OK)
    goto fail_act;
  *out = c;
  return SL_OK;
fail_act:
  sl_buf_release(c->kv);
fail_kv:
  sl_kern_pool_destroy(c->pool);
fail_pool:
  sl_free(c);
  return st;
}

void sl_ctx_free(sl_ctx_t *c) {
  if (!c)
    return;
  sl_stream_sync(c->stream);
  sl_buf_release(c->act);
  sl_buf_release(c->kv);
  sl_kern_pool_destroy(c->pool);
  sl_free(c);
}

int sl_ctx_n_past(const sl_ctx_t *c) { return c->n_past; }

void sl_ctx_truncate(sl_ctx_t *c, int n) {
  if (n >= 0 && n < c->n_past)
    c->n_past = n;
}

/* ---- the forward pass ------------------------------------------------------- */

sl_status sl__llama_embed(const sl_model_t *m, int32_t tok, float *out) {
  size_t erb;
  sl_status st = sl_kern_row_bytes(m->tok_embd->type, m->hp.n_embd, &erb);
  if (st != SL_OK)
    return st;
  const char *row = (const char *)m->tok_embd->data + (size_t)tok * erb;
  return sl_kern_dequant_row(m->tok_embd->type, row, out, m->hp.n_embd);
}

sl_status sl__llama_qk_prep(const sl_model_t *m, const sl__layer_w *w,
                            float *q, float *k, float *v, int64_t pos) {
  const sl_model_hparams *hp = &m->hp;
  int64_t hd = hp->head_dim, qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
  if (w->bq) {
    sl_kern_add(q, q, w->bq, qd);
    sl_kern_add(k, k, w->bk, kvd);
    sl_kern_add(v, v, w->bv, kvd);
  }
  if (w->q_norm) {
    for (int64_t h = 0; h < hp->n_head; h++)
      sl_kern_rmsnorm(q + h * hd, q + h * hd, w->q_norm, hd, hp->rms_eps);
    for (int64_t h = 0; h < hp->n_head_kv; h++)
      sl_kern_rmsnorm(k + h * hd, k + h * hd, w->k_norm, hd, hp->rms_eps);
  }
  sl_status st = sl_kern_rope(q, hp->n_head, hd, hp->n_rot, pos, hp->rope_base,
                              hp->rope_scale, hp->rope_mode);
  if (st == SL_OK)
    st = sl_kern_rope(k, hp->n_head_kv, hd, hp->n_rot, pos, hp->rope_base,
                      hp->rope_scale, hp->rope_mode);
  return st;
}

typedef struct fwd {
  sl_ctx_t *c;
  int32_t tokens[MAX_CHUNK];
  int n, pos0;
  float *logits; /* caller's; NULL for none */
  bool all;
} fwd;

typedef struct attn_job {
  const sl_model_hparams *hp;
  const float *q;     /* (n, n_head*hd) */
  const uint16_t *kc; /* this layer's K cache (n_ctx, n_kv*hd) f16 */
  const uint16_t *vc;
  float *out;         /* (n, n_head*hd) */
  float *scratch;     /* (nth, n_ctx + 32) */
  int n, pos0, n_ctx;
  _Atomic int err;    /* first failure, as an sl_status */
} attn_job;

/* Causal attention for (token, head) pairs split across threads. */
static void attn_worker(void *p, int ith, int nth) {
  attn_job *j = p;
  const sl_model_hparams *hp = j->hp;
  int64_t hd = hp->head_dim, qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
  int64_t group = hp->n_head / hp->n_head_kv;
  float scale = 1.0f / sqrtf((float)hd);
  float *sc = j->scratch + (size_t)ith * ((size_t)j->n_ctx + 32);
  int64_t total = (int64_t)j->n * hp->n_head;
  for (int64_t w = ith; w < total; w += nth) {
    int64_t t = w / hp->n_head, h = w % hp->n_head, kvh = h / group;
    sl_status st = sl_kern_attn_f16(j->out + t * qd + h * hd,
                                    j->q + t * qd + h * hd, j->kc + kvh * hd,
                                    j->vc + kvh * hd, hd, j->pos0 + t + 1, kvd,
                                    scale, j->n == 1, sc);
    if (st != SL_OK)
      atomic_store(&j->err, (int)st);
  }
}

static sl_status forward_task(const sl_task_ctx *tctx, void *p) {
  fwd *f = p;
  sl_ctx_t *c = f->c;
  const sl_model_t *m = c->m;
  const sl_model_hparams *hp = &m->hp;
  int n = f->n;
  int64_t d = hp->n_embd, hd = hp->head_dim, qd = hp->n_head * hd,
          kvd = hp->n_head_kv * hd, ff = hp->n_ff;
  char *act = sl_buf_ptr(c->act);
  float *x = (float *)(act + c->off_x), *xn = (float *)(act + c->off_xn),
        *q = (float *)(act + c->off_q), *k = (float *)(act + c->off_k),
        *v = (float *)(act + c->off_v), *att = (float *)(act + c->off_att),
        *g = (float *)(act + c->off_g), *u = (float *)(act + c->off_u),
        *sc = (float *)(act + c->off_sc);
  uint16_t *kv = sl_buf_ptr(c->kv);
  size_t layer_stride = (size_t)c->n_ctx * (size_t)kvd;
  uint16_t *kcache = kv, *vcache = kv + (size_t)hp->n_layer * layer_stride;
  sl_status st;

  for (int t = 0; t < n; t++)
    if ((st = sl__llama_embed(m, f->tokens[t], x + t * d)) != SL_OK)
      return st;

  for (int64_t l = 0; l < hp->n_layer; l++) {
    const sl__layer_w *w = &m->layers[l];
    for (int t = 0; t < n; t++)
      sl_kern_rmsnorm(xn + t * d, x + t * d, w->attn_norm, d, hp->rms_eps);
    if ((st = sl_kern_matmul(c->pool, &w->wq, xn, q, n)) != SL_OK ||
        (st = sl_kern_matmul(c->pool, &w->wk, xn, k, n)) != SL_OK ||
        (st = sl_kern_matmul(c->pool, &w->wv, xn, v, n)) != SL_OK)
      return st;
    uint16_t *kc = kcache + (size_t)l * layer_stride;
    uint16_t *vc = vcache + (size_t)l * layer_stride;
    for (int t = 0; t < n; t++) {
      float *kt = k + t * kvd, *vt = v + t * kvd;
      int64_t pos = f->pos0 + t;
      if ((st = sl__llama_qk_prep(m, w, q + t * qd, kt, vt, pos)) != SL_OK)
        return st;
      sl_kern_f32_to_f16(kc + pos * kvd, kt, kvd);
      sl_kern_f32_to_f16(vc + pos * kvd, vt, kvd);
    }
    attn_job aj = {hp, q, kc, vc, att, sc, n, f->pos0, c->n_ctx, 0};
    sl_kern_pool_run(c->pool, attn_worker, &aj);
    if ((st = (sl_status)atomic_load(&aj.err)) != SL_OK)
      return st;
    if ((st = sl_kern_matmul(c->pool, &w->wo, att, xn, n)) != SL_OK)
      return st;
    sl_kern_add(x, x, xn, (int64_t)n * d);

    for (int t = 0; t < n; t++)
      sl_kern_rmsnorm(xn + t * d, x + t * d, w->ffn_norm, d, hp->rms_eps);
    if ((st = sl_kern_matmul(c->pool, &w->w_gate, xn, g, n)) != SL_OK ||
        (st = sl_kern_matmul(c->pool, &w->w_up, xn, u, n)) != SL_OK)
      return st;
    sl_kern_swiglu(g, g, u, (int64_t)n * ff);
    if ((st = sl_kern_matmul(c->pool, &w->w_down, g, xn, n)) != SL_OK)
      return st;
    sl_kern_add(x, x, xn, (int64_t)n * d);
  }

  if (!f->logits)
    return SL_OK;
  int first = f->all ? 0 : n - 1;
  int cnt = n - first;
  for (int t = 0; t < cnt; t++)
    sl_kern_rmsnorm(xn + t * d, x + (first + t) * d, m->output_norm, d,
                    hp->rms_eps);
  return sl_kern_matmul(c->pool, &m->output, xn, f->logits, cnt);
}

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
  fwd *f = sl_malloc(sizeof *f);
  if (!f)
    return SL_ERR_NOMEM;
  sl_buf_t *bufs[2] = {c->kv, c->act};
  sl_status st = SL_OK;
  for (int done = 0; done < n && st == SL_OK;) {
    int chunk = n - done < MAX_CHUNK ? n - done : MAX_CHUNK;
    f->c = c;
    memcpy(f->tokens, tokens + done, (size_t)chunk * sizeof *tokens);
    f->n = chunk;
    f->pos0 = c->n_past;
    bool last = done + chunk == n;
    f->all = all_logits;
    f->logits = !logits ? NULL
                : all_logits ? logits + (size_t)done * (size_t)nv
                : last ? logits
                       : NULL;
    uint64_t seq;
    st = sl_stream_submit(c->stream, forward_task, f, sizeof *f, bufs, 2, &seq);
    if (st == SL_OK)
      st = sl_stream_wait_seq(c->stream, seq);
    if (st == SL_OK) {
      c->n_past += chunk;
      done += chunk;
    }
  }
  sl_free(f);
  return st;
}
