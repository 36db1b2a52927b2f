/* sluice — kern/cpu: quantized matmul / matvec over the pool.
 *
 * The activations are quantized once (to the weight type's activation type),
 * then threads take chunks of rows off a shared counter. Within a chunk, tokens
 * go in tiles of SL__NT_MAX: the ISA's dot kernel loads and unpacks each weight
 * block once per tile, while the chunk's rows stay in L1 across tiles. */
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
} mm_job;

static void quant_task(void *p, int ith, int nth) {
  mm_job *j = p;
  int64_t t0 = j->n_tokens * ith / nth, t1 = j->n_tokens * (ith + 1) / nth;
  for (int64_t t = t0; t < t1; t++)
    j->quant(j->X + t * j->W->cols, (char *)j->xq + t * j->xq_row_bytes,
             j->W->cols);
}

static void dot_task(void *p, int ith, int nth) {
  (void)ith;
  (void)nth;
  mm_job *j = p;
  const int64_t rows = j->W->rows, cols = j->W->cols;
  const char *w = j->W->data;
  for (;;) {
    int64_t r0 = atomic_fetch_add_explicit(&j->next, j->chunk,
                                           memory_order_relaxed);
    if (r0 >= rows)
      return;
    int64_t r1 = r0 + j->chunk < rows ? r0 + j->chunk : rows;
    for (int64_t t = 0; t < j->n_tokens; t += SL__NT_MAX) {
      int nt = j->n_tokens - t < SL__NT_MAX ? (int)(j->n_tokens - t)
                                            : SL__NT_MAX;
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
  };
  void *owned = NULL;
  if (act == SL_GGML_F32) {
    job.xq = (void *)X; /* float weights read the activations as they are */
  } else if (pool) {
    if (!(job.xq = sl__kern_pool_scratch(pool, xbytes)))
      return SL_ERR_NOMEM;
  } else {
    if (!(owned = job.xq = sl_malloc(xbytes)))
      return SL_ERR_NOMEM;
  }

  int nth = sl_kern_pool_n_threads(pool);
  /* ~8 chunks per thread for balance, at least 4 rows each */
  int64_t chunk = W->rows / ((int64_t)nth * 8);
  job.chunk = chunk < 4 ? 4 : chunk;
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
