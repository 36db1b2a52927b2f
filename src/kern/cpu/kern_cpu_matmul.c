/* sluice — kern/cpu: quantized matmul / matvec over the pool.
 *
 * The activations are quantized once (to the weight type's activation type),
 * then threads take chunks of rows off a shared counter. With two or more
 * tokens, where the ISA has a gemm for the weight type, a chunk goes to it
 * whole (with the activation scales converted to floats once per call,
 * block-major); otherwise, within a chunk, tokens go in tiles of SL__NT_MAX
 * through the dot kernel, which loads and unpacks each weight block once per
 * tile while the chunk's rows stay in L1 across tiles. Either way each
 * output is the one-row dot. */
#include <stdatomic.h>

#include "kern_cpu_impl.h"
#include "sluice/util.h"

typedef struct mm_job {
  const sl_kern_weight *W;
  size_t w_row_bytes;
  const float *X;
  void *xq;
  size_t xq_row_bytes;
  float *Y;
  int64_t n_tokens;
  int64_t chunk; /* rows per work item */
  _Atomic int64_t next;
  sl__quant_fn quant;
  sl__dot_fn dot;
  sl__gemm_fn gemm; /* NULL: the dot, row by row */
  sl_ggml_type act;
  float *xd, *xsum; /* gemm: activation scales, [block][ld] */
  int64_t ld;
} mm_job;

static void quant_task(void *p, int ith, int nth) {
  mm_job *j = p;
  int64_t t0 = j->n_tokens * ith / nth, t1 = j->n_tokens * (ith + 1) / nth;
  const int64_t nb = j->W->cols / SL__QK;
  for (int64_t t = t0; t < t1; t++) {
    char *row = (char *)j->xq + t * j->xq_row_bytes;
    j->quant(j->X + t * j->W->cols, row, j->W->cols);
    if (!j->gemm)
      continue;
    /* exact: every f16 is a float */
    for (int64_t i = 0; i < nb; i++) {
      if (j->act == SL_GGML_Q8_1) {
        const sl__block_q8_1 *b = (const sl__block_q8_1 *)row + i;
        j->xd[i * j->ld + t] = sl__f16_to_f32(b->d);
        j->xsum[i * j->ld + t] = sl__f16_to_f32(b->s);
      } else {
        const sl__block_q8_0 *b = (const sl__block_q8_0 *)row + i;
        j->xd[i * j->ld + t] = sl__f16_to_f32(b->d);
      }
    }
  }
}

static void dot_task(void *p, int ith, int nth) {
  (void)ith;
  (void)nth;
  mm_job *j = p;
  const int64_t rows = j->W->rows, cols = j->W->cols;
  const char *w = j->W->data;
  for (;;) {
    int64_t r0 =
        atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
    if (r0 >= rows)
      return;
    int64_t r1 = r0 + j->chunk < rows ? r0 + j->chunk : rows;
    if (j->gemm) {
      j->gemm(cols, w + r0 * j->w_row_bytes, j->w_row_bytes, r1 - r0, j->xq,
              j->xq_row_bytes, j->xd, j->xsum, j->ld, j->n_tokens, j->Y + r0,
              (size_t)rows);
      continue;
    }
    for (int64_t t = 0; t < j->n_tokens; t += SL__NT_MAX) {
      int nt =
          j->n_tokens - t < SL__NT_MAX ? (int)(j->n_tokens - t) : SL__NT_MAX;
      const char *xq = (const char *)j->xq + t * j->xq_row_bytes;
      float *y = j->Y + t * rows;
      for (int64_t r = r0; r < r1; r++)
        j->dot(cols, w + r * j->w_row_bytes, xq, j->xq_row_bytes, y + r,
               (size_t)rows, nt);
    }
  }
}

sl_status sl_kern_matmul(sl_kern_pool_t *pool, const sl_kern_weight *W,
                         const float *X, float *Y, int64_t n_tokens) {
  if (!W || n_tokens < 0 || W->rows < 0 || W->cols < 0)
    return SL_ERR_INVALID_ARG;
  sl_ggml_type act;
  sl_status st = sl_kern_act_type(W->type, &act);
  if (st != SL_OK)
    return st;
  size_t wrb, xrb, xbytes;
  if ((st = sl_kern_row_bytes(W->type, W->cols, &wrb)) != SL_OK)
    return st;
  if ((st = sl_kern_row_bytes(act, W->cols, &xrb)) != SL_OK)
    return st;
  if (n_tokens == 0 || W->rows == 0)
    return SL_OK;
  if (W->cols == 0) {
    memset(Y, 0, (size_t)(n_tokens * W->rows) * sizeof(float));
    return SL_OK;
  }
  if (!sl_mul_ok(xrb, (size_t)n_tokens, &xbytes))
    return SL_ERR_OVERFLOW;

  const sl__kern_cpu_ops *ops = sl__kern_cpu_ops_get();
  mm_job job = {
      .W = W,
      .w_row_bytes = wrb,
      .X = X,
      .xq_row_bytes = xrb,
      .Y = Y,
      .n_tokens = n_tokens,
      .quant = ops->quant[act],
      .dot = ops->dot[W->type],
      .gemm = ops->gemm[W->type],
      .act = act,
  };
  const int64_t nb = W->cols / SL__QK;
  /* a gemm takes two or more tokens (for one, converting the weight scales
   * first is a second pass over the rows that the dot does not need; a gemm
   * marked gemm_one takes one too), Q8_0
   * or Q8_1 activations, and rows whose weight scales fit its stack buffer */
  if (job.gemm && ((n_tokens < 2 && !ops->gemm_one[W->type]) ||
                   (act != SL_GGML_Q8_0 && act != SL_GGML_Q8_1) ||
                   2 * nb > SL__GEMM_WSC_MAX))
    job.gemm = NULL;
  /* gemm: the scales after the quantized rows, 64-byte aligned */
  size_t xoff = 0, sbytes = 0;
  if (job.gemm) {
    job.ld = (n_tokens + 3) & ~(int64_t)3;
    xoff = (xbytes + 63) & ~(size_t)63;
    sbytes = 2 * sizeof(float) * (size_t)nb * (size_t)job.ld;
  }
  size_t total = job.gemm ? xoff + sbytes : xbytes;
  void *owned = NULL;
  if (act == SL_GGML_F32) {
    job.xq = (void *)X; /* float weights read the activations as they are */
  } else if (pool) {
    if (!(job.xq = sl__kern_pool_scratch(pool, total)))
      return SL_ERR_NOMEM;
  } else {
    if (!(owned = job.xq = sl_malloc(total)))
      return SL_ERR_NOMEM;
  }
  if (job.gemm) {
    job.xd = (float *)((char *)job.xq + xoff);
    job.xsum = job.xd + nb * job.ld;
    /* the padding tokens' scales read as zeros */
    if (job.ld > n_tokens)
      for (int64_t i = 0; i < nb; i++)
        for (int64_t t = n_tokens; t < job.ld; t++)
          job.xd[i * job.ld + t] = job.xsum[i * job.ld + t] = 0.0f;
    if (act != SL_GGML_Q8_1)
      job.xsum = NULL;
  }

  int nth = sl_kern_pool_n_threads(pool);
  /* ~8 chunks per thread for balance, at least 4 rows each; a gemm's chunk
   * also fits its weight scales on the stack */
  int64_t chunk = W->rows / ((int64_t)nth * 8);
  chunk = chunk < 4 ? 4 : chunk;
  if (job.gemm && ops->gemm_one[W->type]) /* tiles of eight rows */
    chunk = (chunk + 7) & ~(int64_t)7;
  if (job.gemm && chunk > SL__GEMM_WSC_MAX / (2 * nb))
    chunk = SL__GEMM_WSC_MAX / (2 * nb);
  job.chunk = chunk;
  atomic_init(&job.next, 0);

  if (act != SL_GGML_F32) {
    if (n_tokens >= 2 * nth && nth > 1)
      sl_kern_pool_run(pool, quant_task, &job);
    else
      quant_task(&job, 0, 1);
  }
  sl_kern_pool_run(pool, dot_task, &job);
  sl_free(owned);
  return SL_OK;
}
