/* The batched forward pass on a CUDA device: the engine's path on the GPU.
 *
 * Weights are uploaded once into one buffer from the runtime's caching
 * allocator (owned by the engine stream, so they count in the device's
 * active bytes and in the memory guard): in their GGUF formats, except
 * Q4_0, Q4_1 and Q8_0, which go through a staging buffer and sl_kcu_pack
 * into the packed layout the CUDA kernels read. A step is one task on
 * the engine stream: the task copies the step's indices from page-locked
 * memory (with the sampled sequences' sl_kcu_sample_params after them),
 * enqueues every kernel of every layer on the stream's native cudaStream_t,
 * the argmax of each logits row, the device sampler over every row when a
 * sequence samples (rows of the others with row -1: nothing to do), and the
 * copies of the ids, of the sampler's results and of the logits rows the
 * host asked for (not the sampled ones) back into page-locked memory. It
 * does not wait: sl__cu_wait waits for that one task's event, then copies
 * the results out. When the sampler could not decide a row (id -1) the
 * step's activations are kept until the next submit, so that
 * sl__cu_fetch_row can read that row. Nothing here synchronizes the device
 * or the legacy default stream.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llama_impl.h"
#include "sluice/alloc.h"
#include "sluice/kern_cuda.h"
#include "sluice/util.h"

#define ALIGN 256

static size_t up(size_t n) {
  return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

#define SL__CU_GRAPHS           32 /* (tokens, splits) graphs kept */
#define SL__CU_GRAPH_MAX_TOKENS 64 /* decode steps up to this many tokens */

typedef struct graph_ent {
  int n, ns;
  bool samp; /* the device sampler is in the graph */
  void *exec;
  uint64_t last_use;
} graph_ent;

/* Matrices that lie back to back in the packed layout, so the decode path
 * reads them in one pass (sl_kcu_matmul_vec_split): q, k, v and gate, up of
 * a layer, where their type has the tensor-core kernel. */
typedef struct sl__cu_stack {
  sl_kern_weight qkv, gu; /* data NULL: not stacked */
} sl__cu_stack;

struct sl__cu_ctx {
  sl_model_t *m;
  sl_kv_view kv;
  sl_stream_t *stream;
  sl_buf_t *wbuf;        /* every tensor of the file */
  sl__layer_w *layers;   /* device pointers */
  sl__cu_stack *stacks;  /* per layer: q/k/v and gate/up stacked, or not */
  sl_kern_weight output; /* device */
  const float *out_norm; /* device */
  const void *embd;      /* device */
  /* page-locked staging: the step's indices in, the results out */
  int32_t *h_in;
  size_t h_in_cap;
  char *h_out;
  size_t h_out_cap;
  /* the step in flight */
  bool pending;
  uint64_t seq;
  sl_buf_t *act;
  sl_batch_out out;
  int n_rows; /* logits rows */
  const sl_batch *b;
  bool samp;          /* the step runs the device sampler */
  size_t logits_off;  /* its logits in the activations (bytes) */
  size_t out_ids_off; /* in h_out: ids (n_rows int32), logprobs, the
                         sampler's results (n_rows, when samp), logits */
  size_t out_lp_off;
  size_t out_samp_off;
  size_t out_logits_off;
  /* the last step's activations, kept after its wait while a sampled row
   * waits for the host (sl__cu_fetch_row); released at the next submit */
  sl_buf_t *held;
  bool fetch_ok;
  uint8_t *row_copied; /* (rows) whose logits came back */
  size_t row_copied_cap;
  /* CUDA graphs of decode steps */
  bool graphs_on;
  sl_buf_t *gact; /* their activations, at a fixed address */
  graph_ent graphs[SL__CU_GRAPHS];
  uint64_t graph_tick, graph_captures, graph_launches;
};

/* ---- weights ---- */

static const void *dev_ptr(const sl_gguf_t *g, const size_t *offs, char *base,
                           const void *host) {
  if (!host)
    return NULL;
  int64_t nt = sl_gguf_n_tensors(g);
  for (int64_t i = 0; i < nt; i++) {
    const sl_gguf_tensor *t = sl_gguf_tensor_at(g, i);
    const char *d = t->data;
    if ((const char *)host >= d && (const char *)host < d + t->nbytes)
      return base + offs[i] + ((const char *)host - d);
  }
  return NULL;
}

static sl_kern_weight dev_weight(const sl_gguf_t *g, const size_t *offs,
                                 char *base, sl_kern_weight w) {
  w.data = dev_ptr(g, offs, base, w.data);
  w.packed = NULL; /* a host copy: never on the device */
  return w;
}

/* Rows and columns of tensor t as a matrix (ne[0] contiguous). */
static void mat_shape(const sl_gguf_tensor *t, int64_t *rows, int64_t *cols) {
  *cols = (int64_t)t->ne[0];
  *rows = (int64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
}

/* The device bytes of tensor t: the packed layout's for Q4_0, Q4_1, Q8_0
 * (at least the GGUF bytes: a tile of rows may be padded), else the file's.
 * SIZE_MAX when the packed size overflows. */
static size_t dev_bytes(const sl_gguf_tensor *t) {
  if (!sl_kcu_type_packed(t->type))
    return t->nbytes;
  int64_t rows, cols;
  mat_shape(t, &rows, &cols);
  size_t n = sl_kcu_packed_bytes(t->type, rows, cols);
  return n == 0 ? t->nbytes : n;
}

/* The weights' device bytes at the peak of the upload: every tensor in its
 * device layout, plus the staging buffer that holds the largest packed
 * tensor's GGUF bytes while it is packed. */
uint64_t sl__cu_weight_bytes(const sl_model_t *m) {
  const sl_gguf_t *g = m->g;
  uint64_t total = 0, stage = 0;
  for (int64_t i = 0; i < sl_gguf_n_tensors(g); i++) {
    const sl_gguf_tensor *t = sl_gguf_tensor_at(g, i);
    total += up(dev_bytes(t));
    if (sl_kcu_type_packed(t->type) && t->nbytes > stage)
      stage = t->nbytes;
  }
  return total + up(stage);
}

typedef struct pack_arg {
  sl_buf_t *src, *dst;
  size_t dst_off;
  sl_ggml_type type;
  int64_t rows, cols;
} pack_arg;

static sl_status pack_task(const sl_task_ctx *ctx, void *arg) {
  const pack_arg *a = arg;
  return sl_kcu_pack(ctx->native, a->type, sl_buf_ptr(a->src),
                     (char *)sl_buf_ptr(a->dst) + a->dst_off, a->rows, a->cols);
}

static const char *type_name(sl_ggml_type t) {
  const sl_ggml_type_traits *tr = sl_ggml_type_traits_of(t);
  return tr ? tr->name : "unknown";
}

static bool weight_ok(const sl_kern_weight *w, char *err, size_t cap) {
  if (sl_kcu_type_supported(w->type))
    return true;
  snprintf(err, cap, "weight type %s has no CUDA kernel", type_name(w->type));
  return false;
}

/* The index of the tensor whose data starts at p, or -1. */
static int64_t tensor_at(const sl_gguf_t *g, const void *p) {
  for (int64_t i = 0; p && i < sl_gguf_n_tensors(g); i++)
    if (sl_gguf_tensor_at(g, i)->data == p)
      return i;
  return -1;
}

/* The tensors of ws[0..nw) in ids when they can be stacked: each a whole
 * tensor of one type with the tensor-core kernel, the same columns, rows a
 * multiple of the packed tile (so the stack is itself a packed matrix). */
static bool stackable(const sl_gguf_t *g, const sl_kern_weight *const *ws,
                      int nw, int64_t *ids) {
  for (int i = 0; i < nw; i++) {
    const sl_kern_weight *w = ws[i];
    if (!w->data || !sl_kcu_split_ok(w->type) || w->type != ws[0]->type ||
        w->cols != ws[0]->cols || w->rows % 16)
      return false;
    if ((ids[i] = tensor_at(g, w->data)) < 0)
      return false;
    int64_t rows, cols;
    mat_shape(sl_gguf_tensor_at(g, ids[i]), &rows, &cols);
    if (rows != w->rows || cols != w->cols)
      return false;
    for (int j = 0; j < i; j++)
      if (ids[j] == ids[i])
        return false;
  }
  return true;
}

/* Device offsets of every tensor: the stackable groups of each layer first,
 * back to back, then the rest. Returns the total bytes, SIZE_MAX on
 * overflow. */
static size_t place(const sl_model_t *m, size_t *offs, uint8_t *placed) {
  const sl_gguf_t *g = m->g;
  int64_t nt = sl_gguf_n_tensors(g);
  size_t total = 0;
  memset(placed, 0, (size_t)(nt > 0 ? nt : 1));
  for (int64_t l = 0; l < m->hp.n_layer; l++) {
    const sl__layer_w *h = &m->layers[l];
    const sl_kern_weight *qkv[] = {&h->wq, &h->wk, &h->wv},
                         *gu[] = {&h->w_gate, &h->w_up};
    const sl_kern_weight *const *grp[] = {qkv, gu};
    const int nw[] = {3, 2};
    for (int k = 0; k < 2; k++) {
      int64_t ids[3];
      if (!stackable(g, grp[k], nw[k], ids))
        continue;
      bool free_ = true;
      for (int i = 0; i < nw[k]; i++)
        free_ &= !placed[ids[i]];
      if (!free_)
        continue;
      for (int i = 0; i < nw[k]; i++) {
        size_t n = dev_bytes(sl_gguf_tensor_at(g, ids[i]));
        if (n == SIZE_MAX || n > SIZE_MAX - ALIGN - total)
          return SIZE_MAX;
        offs[ids[i]] = total; /* packed tiles: 16-byte multiples */
        total += n;
        placed[ids[i]] = 1;
      }
      total = up(total);
    }
  }
  for (int64_t i = 0; i < nt; i++) {
    if (placed[i])
      continue;
    size_t n = dev_bytes(sl_gguf_tensor_at(g, i));
    if (n == SIZE_MAX || n > SIZE_MAX - ALIGN - total)
      return SIZE_MAX;
    offs[i] = total;
    total += up(n);
  }
  return total;
}

/* The stacked views of layer l, where place() stacked them. */
static void stack_views(sl__cu_ctx *c, int64_t l) {
  const sl__layer_w *d = &c->layers[l];
  sl__cu_stack *st = &c->stacks[l];
  memset(st, 0, sizeof *st);
  const sl_kern_weight *q[] = {&d->wq, &d->wk, &d->wv},
                       *gu[] = {&d->w_gate, &d->w_up};
  sl_kern_weight *out[] = {&st->qkv, &st->gu};
  const sl_kern_weight *const *grp[] = {q, gu};
  const int nw[] = {3, 2};
  for (int k = 0; k < 2; k++) {
    const sl_kern_weight *const *ws = grp[k];
    bool ok = sl_kcu_split_ok(ws[0]->type) && ws[0]->data;
    int64_t rows = 0;
    for (int i = 0; ok && i < nw[k]; i++) {
      /* member i starts where the members before it end */
      const char *at = (const char *)ws[0]->data +
                       sl_kcu_packed_bytes(ws[0]->type, rows, ws[0]->cols);
      ok = ws[i]->type == ws[0]->type && ws[i]->cols == ws[0]->cols &&
           ws[i]->rows % 16 == 0 && (const char *)ws[i]->data == at;
      rows += ws[i]->rows;
    }
    if (ok)
      *out[k] =
          (sl_kern_weight){ws[0]->type, rows, ws[0]->cols, ws[0]->data, NULL};
  }
}

static sl_status upload(sl__cu_ctx *c, bool progress) {
  const sl_gguf_t *g = c->m->g;
  int64_t nt = sl_gguf_n_tensors(g);
  size_t *offs = sl_malloc(sizeof(size_t) * (size_t)(nt > 0 ? nt : 1));
  uint8_t *placed = sl_malloc((size_t)(nt > 0 ? nt : 1));
  if (!offs || !placed) {
    sl_free(offs);
    sl_free(placed);
    return SL_ERR_NOMEM;
  }
  size_t total = place(c->m, offs, placed), stage = 0;
  sl_free(placed);
  if (total == SIZE_MAX) {
    sl_free(offs);
    return SL_ERR_OVERFLOW;
  }
  for (int64_t i = 0; i < nt; i++) {
    const sl_gguf_tensor *t = sl_gguf_tensor_at(g, i);
    if (sl_kcu_type_packed(t->type) && t->nbytes > stage)
      stage = t->nbytes;
  }
  sl_status st = sl_buf_alloc(c->stream, total ? total : ALIGN, &c->wbuf);
  if (st != SL_OK) {
    sl_free(offs);
    return st;
  }
  /* the GGUF bytes of a packed tensor land here, then sl_kcu_pack moves
   * them into wbuf; writes and packs are ordered on the engine stream */
  sl_buf_t *staging = NULL;
  if (stage && (st = sl_buf_alloc(c->stream, stage, &staging)) != SL_OK) {
    sl_free(offs);
    return st;
  }
  bool tty = progress && isatty(STDERR_FILENO);
  uint64_t done = 0;
  int last = -1;
  const size_t chunk = 64u << 20;
  for (int64_t i = 0; i < nt && st == SL_OK; i++) {
    const sl_gguf_tensor *t = sl_gguf_tensor_at(g, i);
    const bool packed = sl_kcu_type_packed(t->type);
    for (size_t o = 0; o < t->nbytes && st == SL_OK; o += chunk) {
      size_t n = t->nbytes - o < chunk ? t->nbytes - o : chunk;
      st = packed ? sl_buf_write(staging, o, (const char *)t->data + o, n)
                  : sl_buf_write(c->wbuf, offs[i] + o,
                                 (const char *)t->data + o, n);
      done += n;
      int pct = total ? (int)(100 * done / total) : 100;
      if (tty && pct != last) {
        int bar = pct / 4;
        fprintf(stderr, "\ruploading to %s [%.*s%*s] %3d%%",
                sl_device_name(sl_stream_device(c->stream)), bar,
                "#########################", 25 - bar, "", pct);
        last = pct;
      }
    }
    if (packed && st == SL_OK) {
      pack_arg a = {staging, c->wbuf, offs[i], t->type, 0, 0};
      mat_shape(t, &a.rows, &a.cols);
      sl_buf_t *bufs[2] = {staging, c->wbuf};
      st = sl_stream_submit(c->stream, pack_task, &a, sizeof a, bufs, 2, NULL);
    }
  }
  if (tty)
    fputc('\n', stderr);
  if (staging) {
    sl_status s2 = sl_stream_sync(c->stream); /* the last pack's error */
    if (st == SL_OK)
      st = s2;
    sl_buf_release(staging);
  }
  if (st != SL_OK) {
    sl_free(offs);
    return st;
  }
  char *base = sl_buf_ptr(c->wbuf);
  const sl_model_t *m = c->m;
  int64_t L = m->hp.n_layer;
  c->layers = sl_calloc((size_t)L, sizeof *c->layers);
  c->stacks = sl_calloc((size_t)L, sizeof *c->stacks);
  if (!c->layers || !c->stacks) {
    sl_free(offs);
    return SL_ERR_NOMEM;
  }
  for (int64_t l = 0; l < L; l++) {
    const sl__layer_w *h = &m->layers[l];
    sl__layer_w *d = &c->layers[l];
    d->wq = dev_weight(g, offs, base, h->wq);
    d->wk = dev_weight(g, offs, base, h->wk);
    d->wv = dev_weight(g, offs, base, h->wv);
    d->wo = dev_weight(g, offs, base, h->wo);
    d->w_gate = dev_weight(g, offs, base, h->w_gate);
    d->w_up = dev_weight(g, offs, base, h->w_up);
    d->w_down = dev_weight(g, offs, base, h->w_down);
    d->attn_norm = dev_ptr(g, offs, base, h->attn_norm);
    d->ffn_norm = dev_ptr(g, offs, base, h->ffn_norm);
    d->bq = dev_ptr(g, offs, base, h->bq);
    d->bk = dev_ptr(g, offs, base, h->bk);
    d->bv = dev_ptr(g, offs, base, h->bv);
    d->q_norm = dev_ptr(g, offs, base, h->q_norm);
    d->k_norm = dev_ptr(g, offs, base, h->k_norm);
    stack_views(c, l);
  }
  c->output = dev_weight(g, offs, base, m->output);
  c->out_norm = dev_ptr(g, offs, base, m->output_norm);
  c->embd = dev_ptr(g, offs, base, m->tok_embd->data);
  sl_free(offs);
  return SL_OK;
}

sl_status sl__cu_create(sl_model_t *m, const sl_kv_view *kv,
                        sl_stream_t *stream, sl__cu_ctx **out, char *err,
                        size_t errcap) {
  char tmp[160];
  if (!err) {
    err = tmp;
    errcap = sizeof tmp;
  }
  err[0] = 0;
  if (sl__model_check(m, SL__CUDA_FEATURES, "CUDA", err, errcap) != SL_OK) {
    size_t len = strlen(err);
    if (sl__model_check(m, SL__CPU_FEATURES, "CPU", NULL, 0) == SL_OK &&
        len < errcap)
      snprintf(err + len, errcap - len, " (run it on the CPU)");
    return SL_ERR_UNSUPPORTED;
  }
  for (int64_t l = 0; l < m->hp.n_layer; l++) {
    const sl__layer_w *w = &m->layers[l];
    const sl_kern_weight *ws[] = {&w->wq,     &w->wk,   &w->wv,    &w->wo,
                                  &w->w_gate, &w->w_up, &w->w_down};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
      if (!weight_ok(ws[i], err, errcap))
        return SL_ERR_UNSUPPORTED;
  }
  if (!weight_ok(&m->output, err, errcap))
    return SL_ERR_UNSUPPORTED;
  if (!sl_kcu_type_supported(m->tok_embd->type)) {
    snprintf(err, errcap, "embedding type %s has no CUDA kernel",
             type_name(m->tok_embd->type));
    return SL_ERR_UNSUPPORTED;
  }
  if (m->hp.head_dim % 32 != 0 || m->hp.head_dim > 256) {
    snprintf(err, errcap, "head size %lld has no CUDA attention kernel",
             (long long)m->hp.head_dim);
    return SL_ERR_UNSUPPORTED;
  }
  sl__cu_ctx *c = sl_calloc(1, sizeof *c);
  if (!c)
    return SL_ERR_NOMEM;
  c->m = m;
  c->kv = *kv;
  c->stream = stream;
  const char *gv = getenv("SLUICE_CUDA_GRAPHS");
  c->graphs_on = !(gv && !strcmp(gv, "0")); /* measured: docs/PERF.md */
  sl_status st = upload(c, true);
  if (st != SL_OK) {
    snprintf(err, errcap, "uploading the weights: %s", sl_status_str(st));
    sl__cu_free(c);
    return st;
  }
  *out = c;
  return SL_OK;
}

void sl__cu_free(sl__cu_ctx *c) {
  if (!c)
    return;
  sl_stream_sync(c->stream); /* nothing may still read the staging */
  sl_buf_release(c->act);
  sl_buf_release(c->held);
  for (int i = 0; i < SL__CU_GRAPHS; i++)
    sl_kcu_graph_free(c->graphs[i].exec);
  sl_buf_release(c->gact);
  sl_buf_release(c->wbuf);
  sl_kcu_host_free(c->h_in);
  sl_kcu_host_free(c->h_out);
  sl_free(c->layers);
  sl_free(c->stacks);
  sl_free(c->row_copied);
  sl_free(c);
}

/* ---- a step ---- */

/* Offsets in the activation buffer (bytes) and in the index array (int32). */
typedef struct step_layout {
  size_t x, xn, q, k, v, att, g, u, logits, ids, lp, idx, sp, so, sw, mm, attn,
      total;
  size_t mm_bytes, attn_bytes, sw_bytes;
  /* index array: */
  size_t i_tok, i_pos, i_seq, i_slot, i_boff, i_btab, i_rows, i_total;
} step_layout;

/* Scratch of one product on both paths: n_dec tokens on VEC, the rest on
 * GEMM (each path's scratch is used by one call at a time). */
static size_t mm_scratch(const sl_kern_weight *w, int n, int n_dec) {
  size_t a =
      n_dec > 0 ? sl_kcu_matmul_path_scratch_bytes(w, n_dec, SL_KCU_MM_VEC) : 0;
  size_t b = n - n_dec > 0 ? sl_kcu_matmul_path_scratch_bytes(w, n - n_dec,
                                                              SL_KCU_MM_GEMM)
                           : 0;
  return a > b ? a : b;
}

static size_t max_mm(const sl_model_t *m, const sl__layer_w *l0, int n,
                     int n_dec, int rows, int rows_dec) {
  size_t s = 0, t;
  const sl_kern_weight *ws[] = {&l0->wq,     &l0->wk,   &l0->wv,    &l0->wo,
                                &l0->w_gate, &l0->w_up, &l0->w_down};
  for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
    if ((t = mm_scratch(ws[i], n, n_dec)) > s)
      s = t;
  if (rows > 0 && (t = mm_scratch(&m->output, rows, rows_dec)) > s)
    s = t;
  return s;
}

static step_layout layout(const sl__cu_ctx *c, const sl_batch *b, int rows,
                          int total_blocks, int max_len, int n_dec,
                          int rows_dec) {
  const sl_model_hparams *hp = &c->m->hp;
  size_t n = (size_t)b->n_tokens, d = (size_t)hp->n_embd,
         qd = (size_t)(hp->n_head * hp->head_dim),
         kvd = (size_t)(hp->n_head_kv * hp->head_dim), ff = (size_t)hp->n_ff,
         nv = (size_t)hp->n_vocab;
  step_layout L;
  size_t o = 0;
  L.x = o, o += up(n * d * 4);
  L.xn = o, o += up(n * d * 4);
  L.q = o, o += up(n * qd * 4);
  L.k = o, o += up(n * kvd * 4);
  L.v = o, o += up(n * kvd * 4);
  L.att = o, o += up(n * qd * 4);
  L.g = o, o += up(n * ff * 4);
  L.u = o, o += up(n * ff * 4);
  L.logits = o, o += up((size_t)rows * nv * 4);
  L.ids = o, o += up((size_t)rows * 4);
  L.lp = o, o += up((size_t)rows * 4);
  size_t i = 0;
  L.i_tok = i, i += n;
  L.i_pos = i, i += n;
  L.i_seq = i, i += n;
  L.i_slot = i, i += n;
  L.i_boff = i, i += (size_t)b->n_seqs;
  L.i_btab = i, i += (size_t)total_blocks;
  L.i_rows = i, i += (size_t)rows;
  L.i_total = i;
  L.idx = o, o += up(i * 4);
  /* the sampler's params (right after the indices: one copy up), results
   * and work, for every row, whether it runs or not (so a graph's layout
   * does not depend on it) */
  L.sp = o, o += up((size_t)rows * sizeof(sl_kcu_sample_params));
  L.so = o, o += up((size_t)rows * sizeof(sl_kcu_sample_out));
  L.sw_bytes = sl_kcu_sample_work_bytes(rows, hp->n_vocab);
  L.sw = o, o += up(L.sw_bytes);
  /* the matmul scratch is sized from the first layer's weights (every layer
   * has the same shapes and, in the files we load, the same types per role;
   * a mixed file sizes from each layer below) */
  L.mm_bytes = 0;
  for (int64_t l = 0; l < hp->n_layer; l++) {
    size_t s = max_mm(c->m, &c->layers[l], b->n_tokens, n_dec, rows, rows_dec);
    if (s > L.mm_bytes)
      L.mm_bytes = s;
  }
  L.mm = o, o += up(L.mm_bytes);
  L.attn_bytes = n_dec > 0 ? sl_kcu_attn_work_bytes(n_dec, (int)hp->n_head,
                                                    (int)hp->head_dim, max_len)
                           : 0;
  L.attn = o, o += up(L.attn_bytes);
  L.total = o;
  return L;
}

typedef struct cu_arg {
  sl__cu_ctx *c;
  step_layout L;
  int n; /* tokens */
  int rows, max_len;
  bool graph;   /* a decode step replayed from a CUDA graph */
  int graph_ns; /* its attention's split count (the graph's key, with n) */
  int n_dec, rows_dec; /* leading decode tokens and their logits rows */
  bool any_logits;     /* some row's logits go back to the host */
  bool samp;           /* the device sampler runs over every row */
  size_t in_bytes;     /* the h2d copy: indices, then params when samp */
} cu_arg;

#define TRY(x)                                                                 \
  do {                                                                         \
    sl_status st_ = (x);                                                       \
    if (st_ != SL_OK)                                                          \
      return st_;                                                              \
  } while (0)

/* y = x W^T for n tokens: the first n_dec (decode) on the matrix-vector
 * kernels, the rest (prompt tokens) on the batched ones. */
static sl_status mm(void *s, const sl_kern_weight *w, const float *x, float *y,
                    int n, int n_dec, void *scratch, size_t bytes);

/* The products of x with np matrices (ws[i] into ys[i]): the decode tokens'
 * in one pass over the stack where there is one (stack.data), the others
 * (and all of them without a stack) one matrix at a time. */
static sl_status mm_parts(void *s, const sl_kern_weight *stack,
                          const sl_kern_weight *const *ws, float *const *ys,
                          int np, const float *x, int n, int n_dec,
                          void *scratch, size_t bytes) {
  int from = 0;
  if (stack->data && n_dec > 0) {
    sl_kcu_split sp = {np, {0}, {NULL}};
    for (int i = 0; i < np; i++)
      sp.rows[i] = ws[i]->rows, sp.y[i] = ys[i];
    sl_status st = sl_kcu_matmul_vec_split(s, stack, x, n_dec, &sp);
    if (st != SL_OK)
      return st;
    from = n_dec;
  }
  for (int i = 0; i < np; i++) {
    const sl_kern_weight *w = ws[i];
    sl_status st = mm(s, w, x + (size_t)from * (size_t)w->cols,
                      ys[i] + (size_t)from * (size_t)w->rows, n - from,
                      n_dec - from, scratch, bytes);
    if (st != SL_OK)
      return st;
  }
  return SL_OK;
}

static sl_status mm(void *s, const sl_kern_weight *w, const float *x, float *y,
                    int n, int n_dec, void *scratch, size_t bytes) {
  sl_status st = SL_OK;
  if (n_dec > 0)
    st = sl_kcu_matmul_path(s, w, x, y, n_dec, SL_KCU_MM_VEC, scratch, bytes);
  if (st == SL_OK && n > n_dec)
    st = sl_kcu_matmul_path(s, w, x + (size_t)n_dec * (size_t)w->cols,
                            y + (size_t)n_dec * (size_t)w->rows, n - n_dec,
                            SL_KCU_MM_GEMM, scratch, bytes);
  return st;
}

/* Every kernel of the step, from the embedding gather to the argmax and the
 * sampler, on stream s (recorded into a graph when s is capturing). */
static sl_status forward(sl__cu_ctx *c, const cu_arg *a, void *s, char *base) {
  const sl_model_hparams *hp = &c->m->hp;
  const step_layout *L = &a->L;
  int n = a->n;
  /* the KV cache's rows are one width for every layer */
  int64_t d = hp->n_embd, kvd = c->kv.kv_dim, nv = hp->n_vocab;
  float *x = (float *)(base + L->x), *xn = (float *)(base + L->xn),
        *q = (float *)(base + L->q), *k = (float *)(base + L->k),
        *v = (float *)(base + L->v), *att = (float *)(base + L->att),
        *g = (float *)(base + L->g), *u = (float *)(base + L->u),
        *logits = (float *)(base + L->logits), *lp = (float *)(base + L->lp);
  int32_t *ids = (int32_t *)(base + L->ids), *idx = (int32_t *)(base + L->idx);
  void *mmw = L->mm_bytes ? base + L->mm : NULL;
  uint16_t *kvmem = sl_buf_ptr(c->kv.buf);
  size_t vhalf = sl_kv_view_half_elems(&c->kv);

  TRY(sl_kcu_get_rows(s, c->m->tok_embd->type, c->embd, d, idx + L->i_tok, n,
                      x));
  /* the first layer's norm; the others' come fused with the residual add
   * that ends the layer before (sl_kcu_add_rmsnorm) */
  TRY(sl_kcu_rmsnorm(s, xn, x, c->layers[0].attn_norm, n, d,
                     c->m->ld[0].norm.eps));
  for (int64_t l = 0; l < hp->n_layer; l++) {
    const sl__layer_w *w = &c->layers[l];
    const sl__layer_desc *ld = &c->m->ld[l];
    const sl__attn_desc *ad = &ld->attn;
    const int64_t hd = ad->head_dim, qd = ad->n_head * hd;
    const float eps = ld->norm.eps;
    const sl__cu_stack *stk = &c->stacks[l];
    const sl_kern_weight *wqkv[] = {&w->wq, &w->wk, &w->wv},
                         *wgu[] = {&w->w_gate, &w->w_up};
    float *const yqkv[] = {q, k, v}, *const ygu[] = {g, u};
    TRY(mm_parts(s, &stk->qkv, wqkv, yqkv, 3, xn, n, a->n_dec, mmw,
                 L->mm_bytes));
    if (ad->qkv_bias) {
      TRY(sl_kcu_add_bias(s, q, w->bq, n, qd));
      TRY(sl_kcu_add_bias(s, k, w->bk, n, kvd));
      TRY(sl_kcu_add_bias(s, v, w->bv, n, kvd));
    }
    if (ad->qk_norm) {
      TRY(sl_kcu_rmsnorm(s, q, q, w->q_norm, (int64_t)n * ad->n_head, hd, eps));
      TRY(sl_kcu_rmsnorm(s, k, k, w->k_norm, (int64_t)n * ad->n_head_kv, hd,
                         eps));
    }
    uint16_t *kl = kvmem + sl_kv_view_k_offset(&c->kv, (int)l, 0);
    TRY(sl_kcu_rope_kv_store(s, q, k, v, idx + L->i_pos, idx + L->i_slot, n,
                             (int)ad->n_head, (int)ad->n_head_kv, (int)hd,
                             (int)ad->rope.n_dims, ad->rope.base,
                             ad->rope.scale, ad->rope.mode, kl, kl + vhalf));
    sl_kcu_attn aa = {.q = q,
                      .out = att,
                      .k_layer = kl,
                      .v_layer = kl + vhalf,
                      .block_table = idx + L->i_btab,
                      .seq_blk_off = idx + L->i_boff,
                      .tok_seq = idx + L->i_seq,
                      .tok_pos = idx + L->i_pos,
                      .n_tok = n,
                      .n_head = (int)ad->n_head,
                      .n_head_kv = (int)ad->n_head_kv,
                      .head_dim = (int)hd,
                      .kv_dim = (int)kvd,
                      .block_tokens = c->kv.block_tokens,
                      .max_len = a->max_len,
                      .n_split_tok = a->n_dec,
                      .scale = ad->scale,
                      .work = L->attn_bytes ? base + L->attn : NULL,
                      .work_bytes = L->attn_bytes};
    TRY(sl_kcu_attention(s, &aa));
    TRY(mm(s, &w->wo, att, xn, n, a->n_dec, mmw, L->mm_bytes));
    TRY(sl_kcu_add_rmsnorm(s, x, xn, xn, w->ffn_norm, n, d, eps));
    TRY(mm_parts(s, &stk->gu, wgu, ygu, 2, xn, n, a->n_dec, mmw, L->mm_bytes));
    TRY(sl_kcu_swiglu(s, g, g, u, (int64_t)n * ld->ffn.n_ff));
    TRY(mm(s, &w->w_down, g, xn, n, a->n_dec, mmw, L->mm_bytes));
    if (l + 1 < hp->n_layer)
      TRY(sl_kcu_add_rmsnorm(s, x, xn, xn, c->layers[l + 1].attn_norm, n, d,
                             c->m->ld[l + 1].norm.eps));
    else
      TRY(sl_kcu_add(s, x, x, xn, (int64_t)n * d));
  }
  int rows = a->rows;
  if (rows == 0)
    return SL_OK;
  /* the rows whose logits are wanted, normed, through the output matrix */
  TRY(sl_kcu_get_rows(s, SL_GGML_F32, x, d, idx + L->i_rows, rows, xn));
  TRY(sl_kcu_rmsnorm(s, xn, xn, c->out_norm, rows, d, c->m->md.out_norm.eps));
  TRY(mm(s, &c->output, xn, logits, rows, a->rows_dec, mmw, L->mm_bytes));
  TRY(sl_kcu_argmax(s, logits, rows, nv, ids, lp));
  if (a->samp)
    TRY(sl_kcu_sample(s, logits, nv, rows,
                      (const sl_kcu_sample_params *)(base + L->sp),
                      (sl_kcu_sample_out *)(base + L->so),
                      L->sw_bytes ? base + L->sw : NULL, L->sw_bytes));
  return SL_OK;
}

/* The cached graph for a decode step of n tokens whose attention has ns
 * splits, with or without the sampler, or a free slot (exec NULL) to record
 * it in. */
static graph_ent *graph_slot(sl__cu_ctx *c, int n, int ns, bool samp) {
  graph_ent *lru = &c->graphs[0];
  for (int i = 0; i < SL__CU_GRAPHS; i++) {
    graph_ent *g = &c->graphs[i];
    if (g->exec && g->n == n && g->ns == ns && g->samp == samp)
      return g;
    if (!g->exec || (lru->exec && g->last_use < lru->last_use))
      lru = g;
  }
  sl_kcu_graph_free(lru->exec); /* nothing is in flight between steps */
  lru->exec = NULL;
  lru->n = n;
  lru->ns = ns;
  lru->samp = samp;
  return lru;
}

static sl_status step_task(const sl_task_ctx *tctx, void *p) {
  cu_arg *a = p;
  sl__cu_ctx *c = a->c;
  const sl_model_hparams *hp = &c->m->hp;
  const step_layout *L = &a->L;
  void *s = tctx->native;
  int64_t nv = hp->n_vocab;
  char *base = sl_buf_ptr(a->graph ? c->gact : c->act);
  float *logits = (float *)(base + L->logits), *lp = (float *)(base + L->lp);
  int32_t *ids = (int32_t *)(base + L->ids), *idx = (int32_t *)(base + L->idx);
  TRY(sl_kcu_copy_h2d(s, idx, c->h_in, a->in_bytes));
  if (a->graph) {
    /* a decode step: replayed from its graph (recorded on first use) */
    graph_ent *g = graph_slot(c, a->n, a->graph_ns, a->samp);
    if (!g->exec) {
      TRY(sl_kcu_capture_begin(s));
      sl_status st = forward(c, a, s, base);
      void *exec = NULL;
      sl_status se = sl_kcu_capture_end(s, &exec);
      if (st != SL_OK || se != SL_OK) {
        sl_kcu_graph_free(exec);
        return st != SL_OK ? st : se;
      }
      g->exec = exec;
      c->graph_captures++;
    }
    g->last_use = ++c->graph_tick;
    TRY(sl_kcu_graph_launch(g->exec, s));
    c->graph_launches++;
  } else {
    TRY(forward(c, a, s, base));
  }
  int rows = a->rows;
  if (rows == 0)
    return SL_OK;
  TRY(sl_kcu_copy_d2h(s, c->h_out + c->out_ids_off, ids, (size_t)rows * 4));
  TRY(sl_kcu_copy_d2h(s, c->h_out + c->out_lp_off, lp, (size_t)rows * 4));
  if (a->samp)
    TRY(sl_kcu_copy_d2h(s, c->h_out + c->out_samp_off, base + L->so,
                        (size_t)rows * sizeof(sl_kcu_sample_out)));
  if (a->any_logits) {
    /* one copy per run of consecutive rows that the host wants */
    for (int r = 0; r < rows;) {
      if (!c->row_copied[r]) {
        r++;
        continue;
      }
      int e = r;
      while (e < rows && c->row_copied[e])
        e++;
      TRY(sl_kcu_copy_d2h(
          s, c->h_out + c->out_logits_off + (size_t)r * (size_t)nv * 4,
          logits + (size_t)r * (size_t)nv, (size_t)(e - r) * (size_t)nv * 4));
      r = e;
    }
  }
  return SL_OK;
}

static sl_status grow_host(void **p, size_t *cap, size_t need) {
  if (*cap >= need)
    return SL_OK;
  size_t n = *cap ? *cap : 4096;
  while (n < need)
    n *= 2;
  void *q = sl_kcu_host_alloc(n);
  if (!q)
    return SL_ERR_NOMEM;
  sl_kcu_host_free(*p);
  *p = q;
  *cap = n;
  return SL_OK;
}

sl_status sl__cu_submit(sl__cu_ctx *c, const sl_batch *b,
                        const sl_batch_out *out) {
  if (c->pending)
    return SL_ERR_STATE;
  /* the last step's rows are no longer asked for */
  sl_buf_release(c->held);
  c->held = NULL;
  c->fetch_ok = false;
  const sl_model_hparams *hp = &c->m->hp;
  int T = c->kv.block_tokens;
  int rows = 0, total_blocks = 0, max_len = 0;
  bool samp = false; /* sl_batch_ctx_submit checked want_logits, sampled */
  for (int s = 0; s < b->n_seqs; s++) {
    const sl_batch_seq *q = &b->seqs[s];
    rows += q->all_logits ? q->n : q->want_logits ? 1 : 0;
    total_blocks += (q->pos0 + q->n + T - 1) / T;
    if (q->pos0 + q->n > max_len)
      max_len = q->pos0 + q->n;
    samp |= q->sample != NULL;
  }
  if (!out->logits && !out->argmax && !samp)
    rows = 0;
  /* the leading decode sequences: their tokens and logits rows */
  int n_dec = 0, rows_dec = 0;
  for (int s = 0; s < b->n_seqs && b->seqs[s].decode; s++) {
    n_dec += b->seqs[s].n;
    rows_dec += b->seqs[s].want_logits || b->seqs[s].all_logits
                    ? (b->seqs[s].all_logits ? b->seqs[s].n : 1)
                    : 0;
  }
  if (rows_dec > rows)
    rows_dec = rows;
  /* A decode-only step replays a CUDA graph keyed by (tokens, attention
   * splits, sampler or not): its kernels read the step's indices (and the
   * sampler's params) from a buffer of fixed address (the graph's
   * persistent activations), and the split count is
   * rounded up to a power of two so that a few graphs serve every length
   * (a decode token is cut by its own length, so the extra splits are
   * empty and its result is the same). */
  bool graph = c->graphs_on && n_dec == b->n_tokens && rows == n_dec &&
               n_dec <= SL__CU_GRAPH_MAX_TOKENS;
  int ns_b = 1;
  if (graph) {
    int ns = (max_len + SL_KCU_ATTN_CHUNK - 1) / SL_KCU_ATTN_CHUNK;
    while (ns_b < ns)
      ns_b *= 2;
    max_len = ns_b * SL_KCU_ATTN_CHUNK;
    /* the layout must not move under the graph: room for every sequence's
     * blocks up to that length */
    total_blocks = n_dec * ((max_len + T - 1) / T);
  }
  step_layout L = layout(c, b, rows, total_blocks, max_len, n_dec, rows_dec);
  size_t nv = (size_t)hp->n_vocab;
  /* which rows' logits go back: all of them unless the caller takes only
   * the argmax of a sequence's row */
  if ((size_t)rows > c->row_copied_cap) {
    uint8_t *rc = sl_realloc(c->row_copied, (size_t)rows);
    if (!rc)
      return SL_ERR_NOMEM;
    c->row_copied = rc;
    c->row_copied_cap = (size_t)rows;
  }
  bool any_logits = false;
  for (int s = 0, r = 0; s < b->n_seqs; s++) {
    const sl_batch_seq *q = &b->seqs[s];
    int nr = q->all_logits ? q->n : q->want_logits ? 1 : 0;
    for (int i = 0; i < nr && r < rows; i++, r++) {
      c->row_copied[r] = out->logits && !q->argmax_only && !q->sample;
      any_logits |= c->row_copied[r];
    }
  }
  /* h_in mirrors the device's idx region: the indices, then (at the same
   * offset as on the device) the sampler's params */
  size_t sp_off = L.sp - L.idx;
  size_t in_bytes = samp ? sp_off + (size_t)rows * sizeof(sl_kcu_sample_params)
                         : L.i_total * 4;
  sl_status st;
  c->out_ids_off = 0;
  c->out_lp_off = (size_t)rows * 4;
  c->out_samp_off = up((size_t)rows * 8);
  c->out_logits_off = c->out_samp_off +
                      (samp ? up((size_t)rows * sizeof(sl_kcu_sample_out)) : 0);
  if ((st = grow_host((void **)&c->h_in, &c->h_in_cap, in_bytes)) != SL_OK ||
      (st = grow_host((void **)&c->h_out, &c->h_out_cap,
                      c->out_logits_off +
                          (any_logits ? (size_t)rows * nv * 4 : 0) + 64)) !=
          SL_OK)
    return st;
  /* the indices */
  int32_t *in = c->h_in;
  memcpy(in + L.i_tok, b->tokens, sizeof(int32_t) * (size_t)b->n_tokens);
  for (int s = 0, o = 0, r = 0; s < b->n_seqs; s++) {
    const sl_batch_seq *q = &b->seqs[s];
    int nblk = (q->pos0 + q->n + T - 1) / T;
    in[L.i_boff + (size_t)s] = o;
    for (int bi = 0; bi < nblk; bi++)
      in[L.i_btab + (size_t)o++] = q->block_table[bi];
    for (int i = 0; i < q->n; i++) {
      int t = q->first + i, pos = q->pos0 + i;
      in[L.i_pos + (size_t)t] = pos;
      in[L.i_seq + (size_t)t] = s;
      in[L.i_slot + (size_t)t] = q->block_table[pos / T] * T + pos % T;
    }
    int from = q->all_logits ? 0 : q->want_logits ? q->n - 1 : q->n;
    for (int i = from; i < q->n && r < rows; i++) {
      if (samp) {
        /* this row's sampler: the sequence's params, or nothing to do */
        sl_kcu_sample_params *sp =
            (sl_kcu_sample_params *)((char *)c->h_in + sp_off) + r;
        if (q->sample) {
          *sp = *q->sample;
        } else {
          memset(sp, 0, sizeof *sp);
          sp->n_top = -1;
        }
        sp->row = q->sample ? r : -1;
      }
      in[L.i_rows + (size_t)r++] = q->first + i;
    }
  }
  sl_buf_t *act = NULL;
  if (graph) {
    /* the graphs' activations: one buffer for all of them, at a fixed
     * address; a larger step makes a larger one and forgets the graphs */
    if (!c->gact || sl_buf_size(c->gact) < L.total) {
      for (int i = 0; i < SL__CU_GRAPHS; i++) {
        sl_kcu_graph_free(c->graphs[i].exec);
        c->graphs[i].exec = NULL;
      }
      sl_buf_release(c->gact);
      c->gact = NULL;
      size_t want = L.total + L.total / 2;
      if ((st = sl_buf_alloc(c->stream, want, &c->gact)) != SL_OK)
        return st;
    }
  } else if ((st = sl_buf_alloc(c->stream, L.total, &act)) != SL_OK) {
    return st;
  }
  c->act = act;
  c->b = b;
  c->out = *out;
  c->n_rows = rows;
  c->samp = samp;
  c->logits_off = L.logits;
  cu_arg a = {c,    L,     b->n_tokens, rows,       max_len, graph,
              ns_b, n_dec, rows_dec,    any_logits, samp,    in_bytes};
  sl_buf_t *bufs[3] = {graph ? c->gact : act, c->kv.buf, c->wbuf};
  st = sl_stream_submit(c->stream, step_task, &a, sizeof a, bufs, 3, &c->seq);
  if (st != SL_OK) {
    sl_buf_release(act);
    c->act = NULL;
    return st;
  }
  c->pending = true;
  return SL_OK;
}

sl_status sl__cu_wait(sl__cu_ctx *c) {
  if (!c->pending)
    return SL_ERR_STATE;
  sl_status st = sl_stream_wait_seq(c->stream, c->seq);
  c->pending = false;
  if (st != SL_OK) {
    sl_buf_release(c->act); /* RETIRING until its uses are done */
    c->act = NULL;
    return st;
  }
  int rows = c->n_rows;
  /* the sampled sequences' results; a row the device could not decide
   * keeps the activations (its logits) for sl__cu_fetch_row */
  bool fetch = false;
  if (c->samp) {
    const sl_kcu_sample_out *so =
        (const sl_kcu_sample_out *)(c->h_out + c->out_samp_off);
    const sl_batch *b = c->b;
    for (int s = 0, r = 0; s < b->n_seqs && r < rows; s++) {
      const sl_batch_seq *q = &b->seqs[s];
      int nr = q->all_logits ? q->n : q->want_logits ? 1 : 0;
      if (q->sample) {
        c->out.sampled[s] = so[r];
        fetch |= so[r].id < 0;
      }
      r += nr;
    }
  }
  if (fetch) {
    c->held = c->act; /* NULL for a graph's step: its logits are in gact */
    c->fetch_ok = true;
  } else {
    sl_buf_release(c->act); /* RETIRING until its uses are done: they are */
  }
  c->act = NULL;
  size_t nv = (size_t)c->m->hp.n_vocab;
  if (c->out.argmax)
    memcpy(c->out.argmax, c->h_out + c->out_ids_off, (size_t)rows * 4);
  if (c->out.argmax_logprob)
    memcpy(c->out.argmax_logprob, c->h_out + c->out_lp_off, (size_t)rows * 4);
  if (c->out.logits)
    for (int r = 0; r < rows; r++)
      if (c->row_copied[r])
        memcpy(c->out.logits + (size_t)r * nv,
               c->h_out + c->out_logits_off + (size_t)r * nv * 4, nv * 4);
  return SL_OK;
}

sl_status sl__cu_fetch_row(sl__cu_ctx *c, int row, float *dst) {
  if (c->pending || !c->fetch_ok)
    return SL_ERR_STATE;
  if (row < 0 || row >= c->n_rows)
    return SL_ERR_INVALID_ARG;
  size_t nv = (size_t)c->m->hp.n_vocab;
  /* a task on the engine stream, waited for (sl_buf_read) */
  return sl_buf_read(c->held ? c->held : c->gact,
                     c->logits_off + (size_t)row * nv * 4, dst, nv * 4);
}
