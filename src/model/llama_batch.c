/* The batched forward pass over the paged KV cache: the engine's path.
 *
 * One call runs every token of a step (decode tokens of running sequences
 * and prefill chunks) through each weight matrix once, as one batched matrix
 * product, and attends each sequence over its own KV blocks. It is one task
 * on the engine's stream; its activations come from the runtime allocator
 * for that call (so a memory limit surfaces as SL_ERR_MEMORY_LIMIT before
 * anything is written).
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "llama_impl.h"
#include "sluice/alloc.h"
#include "sluice/kern_cpu.h"
#include "sluice/util.h"

struct sl_batch_ctx {
  sl_model_t *m;
  sl_kv_view kv;
  sl_stream_t *stream;
  sl_kern_pool_t *pool;
  sl__cu_ctx *cu; /* on a CUDA stream: the GPU forward pass, else NULL */
  /* the CPU step in flight */
  bool pending;
  uint64_t seq;
  sl_buf_t *act;
  sl_batch_out out;
  int rows;
};

/* Dequantizes token `tok`'s embedding row into out (n_embd). */
static sl_status llama_embed(const sl_model_t *m, int32_t tok, float *out) {
  size_t erb;
  sl_status st = sl_kern_row_bytes(m->tok_embd->type, m->hp.n_embd, &erb);
  if (st != SL_OK)
    return st;
  const char *row = (const char *)m->tok_embd->data + (size_t)tok * erb;
  return sl_kern_dequant_row(m->tok_embd->type, row, out, m->hp.n_embd);
}

/* One token's q (n_head*hd), k and v (n_kv*hd) after the projections, as
 * the layer's description says: adds the biases (qwen2), applies q/k
 * RMSNorm (qwen3) and rotates q and k at position `pos`, in place. */
static sl_status llama_qk_prep(const sl__layer_desc *ld, const sl__layer_w *w,
                               float *q, float *k, float *v, int64_t pos) {
  const sl__attn_desc *ad = &ld->attn;
  const sl__rope_desc *r = &ad->rope;
  int64_t hd = ad->head_dim, qd = ad->n_head * hd, kvd = ad->n_head_kv * hd;
  if (ad->qkv_bias) {
    sl_kern_add(q, q, w->bq, qd);
    sl_kern_add(k, k, w->bk, kvd);
    sl_kern_add(v, v, w->bv, kvd);
  }
  if (ad->qk_norm) {
    for (int64_t h = 0; h < ad->n_head; h++)
      sl_kern_rmsnorm(q + h * hd, q + h * hd, w->q_norm, hd, ld->norm.eps);
    for (int64_t h = 0; h < ad->n_head_kv; h++)
      sl_kern_rmsnorm(k + h * hd, k + h * hd, w->k_norm, hd, ld->norm.eps);
  }
  sl_status st = sl_kern_rope(q, ad->n_head, hd, r->n_dims, pos, r->base,
                              r->scale, (sl_kern_rope_mode)r->mode);
  if (st == SL_OK)
    st = sl_kern_rope(k, ad->n_head_kv, hd, r->n_dims, pos, r->base, r->scale,
                      (sl_kern_rope_mode)r->mode);
  return st;
}

static sl_status repack_task(const sl_task_ctx *tctx, void *p) {
  sl__model_repack(*(sl_model_t **)p);
  return SL_OK;
}

uint64_t sl_model_device_weight_bytes(const sl_model_t *m) {
  return sl__cu_weight_bytes(m);
}

sl_status sl_batch_ctx_create(sl_model_t *m, const sl_kv_view *kv,
                              sl_stream_t *stream, int n_threads,
                              sl_batch_ctx_t **out) {
  return sl_batch_ctx_create2(m, kv, stream, n_threads, out, NULL, 0);
}

sl_status sl_batch_ctx_create2(sl_model_t *m, const sl_kv_view *kv,
                               sl_stream_t *stream, int n_threads,
                               sl_batch_ctx_t **out, char *err, size_t errcap) {
  if (err && errcap)
    err[0] = 0;
  if (!m || !kv || !stream || !out)
    return SL_ERR_INVALID_ARG;
  const sl_kv_view *kc = kv;
  if (!kv->buf || sl_buf_size(kv->buf) < sl_kv_view_bytes(kv) ||
      kc->n_layer != m->hp.n_layer ||
      kc->kv_dim != m->hp.n_head_kv * m->hp.head_dim ||
      (kc->block_tokens & (kc->block_tokens - 1)) != 0)
    return SL_ERR_INVALID_ARG; /* paged attention wants 2^k-token blocks */
  sl_batch_ctx_t *c = sl_calloc(1, sizeof *c);
  if (!c)
    return SL_ERR_NOMEM;
  c->m = m;
  c->kv = *kv;
  c->stream = stream;
  if (sl_device_kind_of(sl_stream_device(stream)) == SL_DEVICE_CUDA) {
    sl_status st = sl__cu_create(m, kv, stream, &c->cu, err, errcap);
    if (st != SL_OK) {
      sl_free(c);
      return st;
    }
    *out = c;
    return SL_OK;
  }
  sl_status st = sl__model_check(m, SL__CPU_FEATURES, "CPU", err, errcap);
  if (st != SL_OK) {
    sl_free(c);
    return st;
  }
  c->pool = sl_kern_pool_create(n_threads);
  if (!c->pool) {
    sl_free(c);
    return SL_ERR_NOMEM;
  }
  /* the CPU kernels' layouts, once per model: a load-time transform, the
   * stream's first task (DESIGN.md's load clear site drains it) */
  sl_model_t *mm = m;
  if ((st = sl_stream_submit(stream, repack_task, &mm, sizeof mm, NULL, 0,
                             NULL)) != SL_OK) {
    sl_kern_pool_destroy(c->pool);
    sl_free(c);
    return st;
  }
  *out = c;
  return SL_OK;
}

void sl_batch_ctx_free(sl_batch_ctx_t *c) {
  if (!c)
    return;
  if (c->pending)
    (void)sl_batch_ctx_wait(c);
  sl__cu_free(c->cu);
  sl_stream_sync(c->stream);
  sl_kern_pool_destroy(c->pool);
  sl_free(c);
}

/* Activation layout for n tokens, in floats (each region 64-byte aligned). */
typedef struct act_layout {
  size_t x, xn, q, k, v, att, g, u, moe, total;
} act_layout;

static size_t up16(size_t n) {
  return (n + 15) & ~(size_t)15;
}

/* The largest of each region over the model's layers. */
static act_layout layout_for(const sl_model_t *m, size_t n) {
  const sl_model_hparams *hp = &m->hp;
  size_t d = (size_t)hp->n_embd, qd = 0, kvd = 0, ff = 0, gw = 0, moe = 0;
  for (int64_t l = 0; l < hp->n_layer; l++) {
    const sl__layer_desc *ld = &m->ld[l];
    size_t lq = (size_t)(ld->attn.n_head * ld->attn.head_dim),
           lkv = (size_t)(ld->attn.n_head_kv * ld->attn.head_dim);
    qd = lq > qd ? lq : qd;
    kvd = lkv > kvd ? lkv : kvd;
    if (ld->ffn.kind == SL__FFN_MOE) { /* g takes the experts' sum (n, d) */
      size_t s = sl__moe_scratch_floats(&ld->ffn, hp->n_embd, n);
      moe = s > moe ? s : moe;
      gw = d > gw ? d : gw;
    } else {
      size_t f = (size_t)ld->ffn.n_ff;
      ff = f > ff ? f : ff;
      gw = f > gw ? f : gw;
    }
  }
  act_layout L;
  size_t o = 0;
  L.x = o, o += up16(n * d);
  L.xn = o, o += up16(n * d);
  L.q = o, o += up16(n * qd);
  L.k = o, o += up16(n * kvd);
  L.v = o, o += up16(n * kvd);
  L.att = o, o += up16(n * qd);
  L.g = o, o += up16(n * gw);
  L.u = o, o += up16(n * ff);
  L.moe = o, o += up16(moe);
  L.total = o;
  return L;
}

uint64_t sl_batch_activation_bytes(const sl_model_t *m, int n_tokens) {
  act_layout L = layout_for(m, (size_t)(n_tokens > 0 ? n_tokens : 1));
  return (uint64_t)L.total * 4ull;
}

/* The task's argument; the batch it points to belongs to the caller, who
 * waits for the task. */
typedef struct run_arg {
  sl_batch_ctx_t *c;
  const sl_batch *b;
  float *logits;
  float *hidden;    /* embed sequences' rows (sl_batch_seq.embed) */
  sl_buf_t *act;    /* activations */
  size_t max_len;   /* the longest sequence in the batch, in positions */
  int total_blocks; /* block pointers over all sequences */
} run_arg;

typedef struct attn_job {
  const sl__attn_desc *ad;
  const sl_batch *b;
  const float *q;                        /* (n_tokens, qd) */
  float *out;                            /* (n_tokens, qd) */
  const uint16_t *const *kb, *const *vb; /* per sequence: its blocks' K / V
                                            rows for this layer */
  const int *blk_off; /* (n_seqs) index of each sequence's first pointer */
  int bs;             /* log2(block_tokens) */
  float *scratch;     /* (nth, scratch_per) */
  size_t scratch_per;
  const uint16_t **heads; /* (nth, 2, max_blocks): one head's block rows */
  int max_blocks;
  int64_t total_cost; /* sum over items of their context length */
  _Atomic int err;
} attn_job;

/* Causal attention for every (token, head) of the batch, over each
 * sequence's own blocks. The items, in (sequence, token, head) order, are
 * cut into one contiguous run per thread of about equal cost (an item costs
 * its context length): the heads that share a KV head sit next to each other
 * and run on one thread, so its K/V rows are read from memory once, not once
 * per head, and a causal prefill still splits evenly. */
static void attn_worker(void *p, int ith, int nth) {
  attn_job *j = p;
  const sl__attn_desc *ad = j->ad;
  int64_t hd = ad->head_dim, qd = ad->n_head * hd, kvd = ad->n_head_kv * hd;
  int64_t group = ad->n_head / ad->n_head_kv;
  float scale = ad->scale;
  float *sc = j->scratch + (size_t)ith * j->scratch_per;
  const uint16_t **kh = j->heads + (size_t)ith * 2 * (size_t)j->max_blocks;
  const uint16_t **vh = kh + j->max_blocks;
  const int64_t lo = j->total_cost * ith / nth,
                hi = j->total_cost * (ith + 1) / nth;
  int64_t cost = 0;
  for (int s = 0; s < j->b->n_seqs && cost < hi; s++) {
    const sl_batch_seq *q = &j->b->seqs[s];
    const uint16_t *const *kb = j->kb + j->blk_off[s];
    const uint16_t *const *vb = j->vb + j->blk_off[s];
    int64_t built = -1; /* the KV head whose rows kh/vh hold */
    for (int t = 0; t < q->n && cost < hi; t++) {
      int64_t tok = q->first + t, len = q->pos0 + t + 1;
      if (cost + len * ad->n_head <= lo) { /* the whole token is before us */
        cost += len * ad->n_head;
        continue;
      }
      for (int64_t h = 0; h < ad->n_head; h++, cost += len) {
        if (cost < lo || cost >= hi)
          continue;
        int64_t kvh = h / group;
        if (kvh != built) { /* blocks only grow with t: build them all */
          int all = (q->pos0 + q->n + (1 << j->bs) - 1) >> j->bs;
          for (int bi = 0; bi < all; bi++) {
            kh[bi] = kb[bi] + kvh * hd;
            vh[bi] = vb[bi] + kvh * hd;
          }
          built = kvh;
        }
        /* every token sums in the one-token order (llama.cpp's gemv), so a
         * token's result does not depend on how its prompt was cut into
         * chunks or on whether its prefix came from the cache */
        sl_status st = sl_kern_attn_f16_paged(
            j->out + tok * qd + h * hd, j->q + tok * qd + h * hd, kh, vh, j->bs,
            hd, len, kvd, scale, true, sc);
        if (st != SL_OK)
          atomic_store(&j->err, (int)st);
      }
    }
  }
}

static sl_status run_task(const sl_task_ctx *tctx, void *p) {
  run_arg *a = p;
  sl_batch_ctx_t *c = a->c;
  const sl_model_t *m = c->m;
  const sl_model_hparams *hp = &m->hp;
  const sl_batch *b = a->b;
  int n = b->n_tokens;
  /* the KV cache's rows are one width for every layer */
  int64_t d = hp->n_embd, kvd = c->kv.kv_dim;
  int T = c->kv.block_tokens;
  act_layout L = layout_for(m, (size_t)n);
  float *act = sl_buf_ptr(a->act);
  float *x = act + L.x, *xn = act + L.xn, *q = act + L.q, *k = act + L.k,
        *v = act + L.v, *att = act + L.att, *g = act + L.g, *u = act + L.u;
  uint16_t *kvmem = sl_buf_ptr(c->kv.buf);
  size_t vhalf = sl_kv_view_half_elems(&c->kv);
  int nth = sl_kern_pool_n_threads(c->pool);
  size_t scratch_per = (a->max_len + 31) & ~(size_t)31;
  /* scratch: attention rows per thread, then the block pointer tables */
  float *scratch = sl_malloc(sizeof(float) * scratch_per * (size_t)nth);
  const uint16_t **kb = sl_malloc(sizeof(*kb) * (size_t)a->total_blocks);
  const uint16_t **vb = sl_malloc(sizeof(*vb) * (size_t)a->total_blocks);
  int *blk_off = sl_malloc(sizeof(int) * (size_t)b->n_seqs);
  int max_blocks = (int)((a->max_len + (size_t)T - 1) / (size_t)T);
  const uint16_t **heads =
      sl_malloc(sizeof(*heads) * 2 * (size_t)max_blocks * (size_t)nth);
  if (!scratch || !kb || !vb || !blk_off || !heads) {
    sl_free(heads);
    sl_free(scratch);
    sl_free(kb);
    sl_free(vb);
    sl_free(blk_off);
    return SL_ERR_NOMEM;
  }
  int bs = __builtin_ctz((unsigned)T);
  sl_status st = SL_OK;
  int64_t ctx_cost = 0; /* the context lengths of every token, summed */
  for (int s = 0; s < b->n_seqs; s++) {
    int64_t p0 = b->seqs[s].pos0, nq = b->seqs[s].n;
    ctx_cost += nq * p0 + nq * (nq + 1) / 2;
  }

  for (int t = 0; t < n && st == SL_OK; t++)
    st = llama_embed(m, b->tokens[t], x + (size_t)t * (size_t)d);

  for (int64_t l = 0; l < hp->n_layer && st == SL_OK; l++) {
    const sl__layer_w *w = &m->layers[l];
    const sl__layer_desc *ld = &m->ld[l];
    const int64_t qd = ld->attn.n_head * ld->attn.head_dim;
    const float eps = ld->norm.eps;
    for (int t = 0; t < n; t++)
      sl_kern_rmsnorm(xn + t * d, x + t * d, w->attn_norm, d, eps);
    const sl_kern_weight *wqkv[] = {&w->wq, &w->wk, &w->wv},
                         *wgu[] = {&w->w_gate, &w->w_up};
    float *const yqkv[] = {q, k, v}, *const ygu[] = {g, u};
    /* q, k and v as one product: one quantization of xn, one fork/join */
    if ((st = sl_kern_matmul_parts(c->pool, wqkv, 3, xn, yqkv, n)) != SL_OK)
      break;
    for (int s = 0; s < b->n_seqs && st == SL_OK; s++) {
      const sl_batch_seq *sq = &b->seqs[s];
      for (int i = 0; i < sq->n; i++) {
        int t = sq->first + i;
        int64_t pos = sq->pos0 + i;
        st = llama_qk_prep(ld, w, q + t * qd, k + t * kvd, v + t * kvd, pos);
        if (st != SL_OK)
          break;
        int blk = sq->block_table[pos / T], slot = (int)(pos % T);
        uint16_t *kd = kvmem + sl_kv_view_k_offset(&c->kv, (int)l, blk) +
                       (size_t)slot * (size_t)kvd;
        uint16_t *vd = kvmem + vhalf +
                       sl_kv_view_k_offset(&c->kv, (int)l, blk) +
                       (size_t)slot * (size_t)kvd;
        sl_kern_f32_to_f16(kd, k + t * kvd, kvd);
        sl_kern_f32_to_f16(vd, v + t * kvd, kvd);
      }
    }
    if (st != SL_OK)
      break;
    for (int s = 0, o = 0; s < b->n_seqs; s++) {
      const sl_batch_seq *sq = &b->seqs[s];
      int nblk = (sq->pos0 + sq->n + T - 1) / T;
      blk_off[s] = o;
      for (int bi = 0; bi < nblk; bi++, o++) {
        kb[o] =
            kvmem + sl_kv_view_k_offset(&c->kv, (int)l, sq->block_table[bi]);
        vb[o] = kvmem + vhalf +
                sl_kv_view_k_offset(&c->kv, (int)l, sq->block_table[bi]);
      }
    }
    attn_job aj = {&ld->attn,
                   b,
                   q,
                   att,
                   kb,
                   vb,
                   blk_off,
                   bs,
                   scratch,
                   scratch_per,
                   heads,
                   max_blocks,
                   ctx_cost * ld->attn.n_head,
                   0};
    sl_kern_pool_run(c->pool, attn_worker, &aj);
    if ((st = (sl_status)atomic_load(&aj.err)) != SL_OK)
      break;
    if ((st = sl_kern_matmul(c->pool, &w->wo, att, xn, n)) != SL_OK)
      break;
    sl_kern_add(x, x, xn, (int64_t)n * d);
    for (int t = 0; t < n; t++)
      sl_kern_rmsnorm(xn + t * d, x + t * d, w->ffn_norm, d, eps);
    if (ld->ffn.kind == SL__FFN_MOE) {
      if ((st = sl__moe_ffn(c->pool, &ld->ffn, d, w, xn, g, n, act + L.moe)) !=
          SL_OK)
        break;
      sl_kern_add(x, x, g, (int64_t)n * d);
      continue;
    }
    if ((st = sl_kern_matmul_parts(c->pool, wgu, 2, xn, ygu, n)) != SL_OK)
      break;
    /* a token at a time: its arithmetic (vector lanes or the tail) is the
     * same whatever the number of tokens (I9), for any width */
    for (int t = 0; t < n; t++)
      sl_kern_swiglu(g + (size_t)t * (size_t)ld->ffn.n_ff,
                     g + (size_t)t * (size_t)ld->ffn.n_ff,
                     u + (size_t)t * (size_t)ld->ffn.n_ff, ld->ffn.n_ff);
    if ((st = sl_kern_matmul(c->pool, &w->w_down, g, xn, n)) != SL_OK)
      break;
    sl_kern_add(x, x, xn, (int64_t)n * d);
  }
  if (st == SL_OK && a->logits) {
    /* final norm of the rows whose logits are wanted, in batch order: the
     * last token of a want_logits sequence, or all of an all_logits one */
    int cnt = 0;
    for (int s = 0; s < b->n_seqs; s++) {
      const sl_batch_seq *sq = &b->seqs[s];
      int from = sq->all_logits ? 0 : sq->want_logits ? sq->n - 1 : sq->n;
      for (int t = from; t < sq->n; t++, cnt++)
        sl_kern_rmsnorm(xn + (size_t)cnt * (size_t)d,
                        x + (size_t)(sq->first + t) * (size_t)d, m->output_norm,
                        d, m->md.out_norm.eps);
    }
    if (cnt)
      st = sl_kern_matmul(c->pool, &m->output, xn, a->logits, cnt);
  }
  if (st == SL_OK && a->hidden) {
    /* embeddings: every token of an embed sequence, final-normed */
    size_t row = 0;
    for (int s = 0; s < b->n_seqs; s++) {
      const sl_batch_seq *sq = &b->seqs[s];
      for (int t = 0; sq->embed && t < sq->n; t++, row++)
        sl_kern_rmsnorm(a->hidden + row * (size_t)d,
                        x + (size_t)(sq->first + t) * (size_t)d, m->output_norm,
                        d, m->md.out_norm.eps);
    }
  }
  sl_free(scratch);
  sl_free(kb);
  sl_free(vb);
  sl_free(blk_off);
  sl_free(heads);
  return st;
}

/* The rows of logits a batch gives back. */
static int logits_rows(const sl_batch *b) {
  int rows = 0;
  for (int s = 0; s < b->n_seqs; s++)
    rows += b->seqs[s].all_logits    ? b->seqs[s].n
            : b->seqs[s].want_logits ? 1
                                     : 0;
  return rows;
}

sl_status sl_batch_ctx_submit(sl_batch_ctx_t *c, const sl_batch *b,
                              const sl_batch_out *out) {
  if (!c || !b || !out || b->n_tokens <= 0 || b->n_seqs <= 0 || !b->tokens ||
      !b->seqs)
    return SL_ERR_INVALID_ARG;
  if (c->pending)
    return SL_ERR_STATE;
  const sl_model_hparams *hp = &c->m->hp;
  const sl_kv_view *kc = &c->kv;
  size_t max_len = 0;
  for (int s = 0; s < b->n_seqs; s++) {
    const sl_batch_seq *q = &b->seqs[s];
    if (q->n <= 0 || q->first < 0 || q->first + q->n > b->n_tokens ||
        q->pos0 < 0 ||
        (int64_t)(q->pos0 + q->n) > (int64_t)q->n_blocks * kc->block_tokens)
      return SL_ERR_INVALID_ARG;
    /* a sampled sequence has one logits row; only a GPU samples */
    if (q->sample &&
        (!c->cu || !q->want_logits || q->all_logits || !out->sampled))
      return SL_ERR_INVALID_ARG;
    if (q->embed &&
        (q->want_logits || q->all_logits || q->sample || !out->hidden))
      return SL_ERR_INVALID_ARG;
    if (q->embed && c->cu)
      return SL_ERR_UNSUPPORTED; /* not on the GPU yet */
    size_t len = (size_t)(q->pos0 + q->n);
    if (len > max_len)
      max_len = len;
  }
  for (int t = 0; t < b->n_tokens; t++)
    if (b->tokens[t] < 0 || b->tokens[t] >= hp->n_vocab)
      return SL_ERR_INVALID_ARG;
  if (c->cu)
    return sl__cu_submit(c->cu, b, out);
  if ((out->argmax || out->argmax_logprob) && !out->logits)
    return SL_ERR_INVALID_ARG; /* the CPU takes the argmax from the logits */
  int total_blocks = 0;
  for (int s = 0; s < b->n_seqs; s++)
    total_blocks += (b->seqs[s].pos0 + b->seqs[s].n + kc->block_tokens - 1) /
                    kc->block_tokens;
  act_layout L = layout_for(c->m, (size_t)b->n_tokens);
  sl_buf_t *act = NULL;
  sl_status st = sl_buf_alloc(c->stream, L.total * 4, &act);
  if (st != SL_OK)
    return st;
  run_arg a = {c, b, out->logits, out->hidden, act, max_len, total_blocks};
  sl_buf_t *bufs[2] = {act, c->kv.buf};
  st = sl_stream_submit(c->stream, run_task, &a, sizeof a, bufs, 2, &c->seq);
  if (st != SL_OK) {
    sl_buf_release(act);
    return st;
  }
  c->act = act;
  c->out = *out;
  c->rows = logits_rows(b);
  c->pending = true;
  return SL_OK;
}

sl_status sl_batch_ctx_wait(sl_batch_ctx_t *c) {
  if (!c)
    return SL_ERR_INVALID_ARG;
  if (c->cu)
    return sl__cu_wait(c->cu);
  if (!c->pending)
    return SL_ERR_STATE;
  sl_status st = sl_stream_wait_seq(c->stream, c->seq);
  c->pending = false;
  sl_buf_release(c->act);
  c->act = NULL;
  if (st != SL_OK || (!c->out.argmax && !c->out.argmax_logprob))
    return st;
  int64_t nv = c->m->hp.n_vocab;
  for (int r = 0; r < c->rows; r++) {
    const float *lg = c->out.logits + (size_t)r * (size_t)nv;
    int64_t best = 0;
    for (int64_t i = 1; i < nv; i++)
      if (lg[i] > lg[best])
        best = i;
    if (c->out.argmax)
      c->out.argmax[r] = (int32_t)best;
    if (c->out.argmax_logprob) {
      double sum = 0;
      for (int64_t i = 0; i < nv; i++)
        sum += exp((double)lg[i] - (double)lg[best]);
      c->out.argmax_logprob[r] = (float)-log(sum);
    }
  }
  return SL_OK;
}

bool sl_batch_ctx_samples_on_device(const sl_batch_ctx_t *c) {
  return c && c->cu;
}

sl_status sl_batch_ctx_fetch_row(sl_batch_ctx_t *c, int row, float *dst) {
  if (!c || !dst)
    return SL_ERR_INVALID_ARG;
  if (!c->cu)
    return SL_ERR_UNSUPPORTED;
  return sl__cu_fetch_row(c->cu, row, dst);
}

sl_status sl_batch_ctx_run(sl_batch_ctx_t *c, const sl_batch *b,
                           float *logits) {
  sl_batch_out out = {logits, NULL, NULL, NULL, NULL};
  sl_status st = sl_batch_ctx_submit(c, b, &out);
  if (st != SL_OK)
    return st;
  return sl_batch_ctx_wait(c);
}
