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
#include <string.h>

#include "model/llama_impl.h"
#include "sluice/alloc.h"
#include "sluice/kern_cpu.h"
#include "sluice/kv.h"
#include "sluice/util.h"

struct sl_batch_ctx {
  sl_model_t *m;
  sl_kv_pool_t *kv;
  sl_stream_t *stream;
  sl_kern_pool_t *pool;
};

sl_status sl_batch_ctx_create(sl_model_t *m, struct sl_kv_pool *kv,
                              sl_stream_t *stream, int n_threads,
                              sl_batch_ctx_t **out) {
  if (!m || !kv || !stream || !out)
    return SL_ERR_INVALID_ARG;
  const sl_kv_config *kc = sl_kv_config_of(kv);
  if (kc->n_layer != m->hp.n_layer ||
      kc->kv_dim != m->hp.n_head_kv * m->hp.head_dim)
    return SL_ERR_INVALID_ARG;
  sl_batch_ctx_t *c = sl_calloc(1, sizeof *c);
  if (!c)
    return SL_ERR_NOMEM;
  c->m = m;
  c->kv = kv;
  c->stream = stream;
  c->pool = sl_kern_pool_create(n_threads);
  if (!c->pool) {
    sl_free(c);
    return SL_ERR_NOMEM;
  }
  *out = c;
  return SL_OK;
}

void sl_batch_ctx_free(sl_batch_ctx_t *c) {
  if (!c)
    return;
  sl_stream_sync(c->stream);
  sl_kern_pool_destroy(c->pool);
  sl_free(c);
}

/* Activation layout for n tokens, in floats (each region 64-byte aligned). */
typedef struct act_layout {
  size_t x, xn, q, k, v, att, g, u, total;
} act_layout;

static size_t up16(size_t n) { return (n + 15) & ~(size_t)15; }

static act_layout layout_for(const sl_model_hparams *hp, size_t n) {
  size_t d = (size_t)hp->n_embd, qd = (size_t)(hp->n_head * hp->head_dim),
         kvd = (size_t)(hp->n_head_kv * hp->head_dim), ff = (size_t)hp->n_ff;
  act_layout L;
  size_t o = 0;
  L.x = o, o += up16(n * d);
  L.xn = o, o += up16(n * d);
  L.q = o, o += up16(n * qd);
  L.k = o, o += up16(n * kvd);
  L.v = o, o += up16(n * kvd);
  L.att = o, o += up16(n * qd);
  L.g = o, o += up16(n * ff);
  L.u = o, o += up16(n * ff);
  L.total = o;
  return L;
}

uint64_t sl_batch_activation_bytes(const sl_model_t *m, int n_tokens) {
  act_layout L = layout_for(&m->hp, (size_t)(n_tokens > 0 ? n_tokens : 1));
  return (uint64_t)L.total * 4ull;
}

/* The task's argument: copies of the batch description live in `scratch`
 * (host memory owned by the caller, who waits for the task). */
typedef struct run_arg {
  sl_batch_ctx_t *c;
  const sl_batch *b;
  float *logits;
  sl_buf_t *act;    /* activations */
  sl_buf_t *gather; /* per-sequence contiguous K/V, f16 */
  size_t gather_elems_per_seq_max;
} run_arg;

typedef struct gather_job {
  const sl_batch *b;
  sl_kv_pool_t *kv;
  const uint16_t *pool;
  uint16_t *gk, *gv; /* (n_seqs, max_len, kvd) */
  size_t max_len;
  int layer;
  int kvd, T;
} gather_job;

/* Copies each sequence's K/V for positions [0, pos0 + n) of one layer into a
 * contiguous region (threads split the sequences' blocks). */
static void gather_worker(void *p, int ith, int nth) {
  gather_job *j = p;
  int w = 0;
  for (int s = 0; s < j->b->n_seqs; s++) {
    const sl_batch_seq *q = &j->b->seqs[s];
    int len = q->pos0 + q->n;
    int nblk = (len + j->T - 1) / j->T;
    for (int bi = 0; bi < nblk; bi++, w++) {
      if (w % nth != ith)
        continue;
      int rows = len - bi * j->T < j->T ? len - bi * j->T : j->T;
      size_t bytes = (size_t)rows * (size_t)j->kvd * 2;
      size_t dst = ((size_t)s * j->max_len + (size_t)bi * (size_t)j->T) *
                   (size_t)j->kvd;
      memcpy(j->gk + dst,
             j->pool + sl_kv_k_offset(j->kv, j->layer, q->block_table[bi]),
             bytes);
      memcpy(j->gv + dst,
             j->pool + sl_kv_v_offset(j->kv, j->layer, q->block_table[bi]),
             bytes);
    }
  }
}

typedef struct attn_job {
  const sl_model_hparams *hp;
  const sl_batch *b;
  const float *q; /* (n_tokens, qd) */
  float *out;     /* (n_tokens, qd) */
  const uint16_t *gk, *gv;
  size_t max_len;
  float *scratch; /* (nth, scratch_per) */
  size_t scratch_per;
} attn_job;

static void attn_worker(void *p, int ith, int nth) {
  attn_job *j = p;
  const sl_model_hparams *hp = j->hp;
  int64_t hd = hp->head_dim, qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
  int64_t group = hp->n_head / hp->n_head_kv;
  float scale = 1.0f / sqrtf((float)hd);
  float *sc = j->scratch + (size_t)ith * j->scratch_per;
  int64_t w = 0;
  for (int s = 0; s < j->b->n_seqs; s++) {
    const sl_batch_seq *q = &j->b->seqs[s];
    const uint16_t *gk = j->gk + (size_t)s * j->max_len * (size_t)kvd;
    const uint16_t *gv = j->gv + (size_t)s * j->max_len * (size_t)kvd;
    for (int t = 0; t < q->n; t++) {
      int64_t tok = q->first + t, len = q->pos0 + t + 1;
      for (int64_t h = 0; h < hp->n_head; h++, w++) {
        if (w % nth != ith)
          continue;
        int64_t kvh = h / group;
        sl_kern_attn_f16(j->out + tok * qd + h * hd, j->q + tok * qd + h * hd,
                         gk + kvh * hd, gv + kvh * hd, hd, len, kvd, scale,
                         q->n == 1, sc);
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
  int64_t d = hp->n_embd, hd = hp->head_dim, qd = hp->n_head * hd,
          kvd = hp->n_head_kv * hd, ff = hp->n_ff;
  int T = sl_kv_config_of(c->kv)->block_tokens;
  act_layout L = layout_for(hp, (size_t)n);
  float *act = sl_buf_ptr(a->act);
  float *x = act + L.x, *xn = act + L.xn, *q = act + L.q, *k = act + L.k,
        *v = act + L.v, *att = act + L.att, *g = act + L.g, *u = act + L.u;
  uint16_t *kvmem = sl_buf_ptr(sl_kv_buffer(c->kv));
  uint16_t *gath = sl_buf_ptr(a->gather);
  size_t per_seq = a->gather_elems_per_seq_max;
  uint16_t *gk = gath, *gv = gath + (size_t)b->n_seqs * per_seq;
  size_t max_len = per_seq / (size_t)kvd;
  int nth = sl_kern_pool_n_threads(c->pool);
  size_t scratch_per = (max_len + 31) & ~(size_t)31;
  float *scratch = sl_malloc(sizeof(float) * scratch_per * (size_t)nth);
  if (!scratch)
    return SL_ERR_NOMEM;
  sl_status st = SL_OK;

  for (int t = 0; t < n && st == SL_OK; t++)
    st = sl__llama_embed(m, b->tokens[t], x + (size_t)t * (size_t)d);

  for (int64_t l = 0; l < hp->n_layer && st == SL_OK; l++) {
    const sl__layer_w *w = &m->layers[l];
    for (int t = 0; t < n; t++)
      sl_kern_rmsnorm(xn + t * d, x + t * d, w->attn_norm, d, hp->rms_eps);
    if ((st = sl_kern_matmul(c->pool, &w->wq, xn, q, n)) != SL_OK ||
        (st = sl_kern_matmul(c->pool, &w->wk, xn, k, n)) != SL_OK ||
        (st = sl_kern_matmul(c->pool, &w->wv, xn, v, n)) != SL_OK)
      break;
    for (int s = 0; s < b->n_seqs && st == SL_OK; s++) {
      const sl_batch_seq *sq = &b->seqs[s];
      for (int i = 0; i < sq->n; i++) {
        int t = sq->first + i;
        int64_t pos = sq->pos0 + i;
        st = sl__llama_qk_prep(m, w, q + t * qd, k + t * kvd, v + t * kvd, pos);
        if (st != SL_OK)
          break;
        int blk = sq->block_table[pos / T], slot = (int)(pos % T);
        uint16_t *kd = kvmem + sl_kv_k_offset(c->kv, (int)l, blk) +
                       (size_t)slot * (size_t)kvd;
        uint16_t *vd = kvmem + sl_kv_v_offset(c->kv, (int)l, blk) +
                       (size_t)slot * (size_t)kvd;
        sl_kern_f32_to_f16(kd, k + t * kvd, kvd);
        sl_kern_f32_to_f16(vd, v + t * kvd, kvd);
      }
    }
    if (st != SL_OK)
      break;
    gather_job gj = {b, c->kv, kvmem, gk, gv, max_len, (int)l, (int)kvd, T};
    sl_kern_pool_run(c->pool, gather_worker, &gj);
    attn_job aj = {hp, b, q, att, gk, gv, max_len, scratch, scratch_per};
    sl_kern_pool_run(c->pool, attn_worker, &aj);
    if ((st = sl_kern_matmul(c->pool, &w->wo, att, xn, n)) != SL_OK)
      break;
    sl_kern_add(x, x, xn, (int64_t)n * d);
    for (int t = 0; t < n; t++)
      sl_kern_rmsnorm(xn + t * d, x + t * d, w->ffn_norm, d, hp->rms_eps);
    if ((st = sl_kern_matmul(c->pool, &w->w_gate, xn, g, n)) != SL_OK ||
        (st = sl_kern_matmul(c->pool, &w->w_up, xn, u, n)) != SL_OK)
      break;
    sl_kern_swiglu(g, g, u, (int64_t)n * ff);
    if ((st = sl_kern_matmul(c->pool, &w->w_down, g, xn, n)) != SL_OK)
      break;
    sl_kern_add(x, x, xn, (int64_t)n * d);
  }
  if (st == SL_OK && a->logits) {
    int cnt = 0;
    for (int s = 0; s < b->n_seqs; s++) {
      const sl_batch_seq *sq = &b->seqs[s];
      if (!sq->want_logits)
        continue;
      int t = sq->first + sq->n - 1;
      sl_kern_rmsnorm(xn + (size_t)cnt * (size_t)d, x + (size_t)t * (size_t)d,
                      m->output_norm, d, hp->rms_eps);
      cnt++;
    }
    if (cnt)
      st = sl_kern_matmul(c->pool, &m->output, xn, a->logits, cnt);
  }
  sl_free(scratch);
  return st;
}

sl_status sl_batch_ctx_run(sl_batch_ctx_t *c, const sl_batch *b,
                           float *logits) {
  if (!c || !b || b->n_tokens <= 0 || b->n_seqs <= 0 || !b->tokens || !b->seqs)
    return SL_ERR_INVALID_ARG;
  const sl_model_hparams *hp = &c->m->hp;
  const sl_kv_config *kc = sl_kv_config_of(c->kv);
  size_t max_len = 0;
  for (int s = 0; s < b->n_seqs; s++) {
    const sl_batch_seq *q = &b->seqs[s];
    if (q->n <= 0 || q->first < 0 || q->first + q->n > b->n_tokens ||
        q->pos0 < 0 ||
        (int64_t)(q->pos0 + q->n) > (int64_t)q->n_blocks * kc->block_tokens)
      return SL_ERR_INVALID_ARG;
    size_t len = (size_t)(q->pos0 + q->n);
    if (len > max_len)
      max_len = len;
  }
  for (int t = 0; t < b->n_tokens; t++)
    if (b->tokens[t] < 0 || b->tokens[t] >= hp->n_vocab)
      return SL_ERR_INVALID_ARG;
  max_len = (max_len + (size_t)kc->block_tokens - 1) /
            (size_t)kc->block_tokens * (size_t)kc->block_tokens;
  size_t per_seq = max_len * (size_t)kc->kv_dim;
  act_layout L = layout_for(hp, (size_t)b->n_tokens);
  sl_buf_t *act = NULL, *gather = NULL;
  sl_status st = sl_buf_alloc(c->stream, L.total * 4, &act);
  if (st != SL_OK)
    return st;
  st = sl_buf_alloc(c->stream, 2 * (size_t)b->n_seqs * per_seq * 2, &gather);
  if (st != SL_OK) {
    sl_buf_release(act);
    return st;
  }
  run_arg a = {c, b, logits, act, gather, per_seq};
  sl_buf_t *bufs[3] = {act, gather, sl_kv_buffer(c->kv)};
  uint64_t seq;
  st = sl_stream_submit(c->stream, run_task, &a, sizeof a, bufs, 3, &seq);
  if (st == SL_OK)
    st = sl_stream_wait_seq(c->stream, seq);
  sl_buf_release(act);
  sl_buf_release(gather);
  return st;
}
