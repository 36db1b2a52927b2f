/* sluice — kern/cpu: quantized matmul / matvec over the pool.
 *
 * The activations are quantized once (to the weight type's activation type),
 * then threads take chunks of rows off a shared counter. With two or more
 * tokens, where the ISA has a gemm for the weight type, a chunk goes to it
 * whole (with the activation scales converted to floats once per call,
 * block-major); otherwise, within a chunk, tokens go in tiles of SL__NT_MAX
 * through the dot kernel, which loads and unpacks each weight block once per
 * tile while the chunk's rows stay in L1 across tiles. Either way each
 * output is the one-row dot. A weight with a packed copy (sl_kern_repack)
 * whose type has a packed kernel in the table goes through that kernel
 * instead (Q8_0 activations, or Q8_K for the K-quants), for any token
 * count: chunks of whole 8-row groups, token tiles of SL__NT_MAX outside,
 * groups inside. Several products of one X (q, k, v; gate, up) go as one
 * call: X quantized once per activation type, one fork and join
 * (sl_kern_matmul_parts). */
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
  sl__packed_fn pk; /* non-NULL: W->packed through it (gemm NULL then) */
  bool need_sc;     /* gemm, or pk over Q8_0: the scales below, block-major */
  bool need_si;     /* pk over Q8_0: the quant sums too (over Q8_K the
                     * kernel reads d and bsums from the blocks) */
  sl_ggml_type act;
  float *xd, *xsum; /* activation scales d (and s for Q8_1), [block][ld] */
  int32_t *xsi;     /* sums of the Q8_0 blocks' quants, [block][ld] */
  int64_t ld;
} mm_job;

/* Quantizes tokens [t0, t1) of j's activations (and their scales). */
static void quant_range(mm_job *j, int64_t t0, int64_t t1) {
  const int64_t nb = j->W->cols / SL__QK;
  for (int64_t t = t0; t < t1; t++) {
    char *row = (char *)j->xq + t * j->xq_row_bytes;
    j->quant(j->X + t * j->W->cols, row, j->W->cols);
    if (!j->need_sc)
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
        if (j->need_si) {
          int32_t s = 0;
          for (int k = 0; k < SL__QK; k++)
            s += b->qs[k];
          j->xsi[i * j->ld + t] = s;
        }
      }
    }
  }
}

static void quant_task(void *p, int ith, int nth) {
  mm_job *j = p;
  quant_range(j, j->n_tokens * ith / nth, j->n_tokens * (ith + 1) / nth);
}

/* Runs one product's share: chunks of its rows off its counter until none
 * is left. */
static void dot_run(mm_job *j) {
  const int64_t rows = j->W->rows, cols = j->W->cols;
  const char *w = j->W->data;
  for (;;) {
    int64_t r0 =
        atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
    if (r0 >= rows)
      return;
    int64_t r1 = r0 + j->chunk < rows ? r0 + j->chunk : rows;
    if (j->pk) { /* r0 is a multiple of 8: whole groups */
      const int64_t nb = cols / sl__pack_block_elems(j->W->type);
      const size_t gbytes = (size_t)nb * sl__pack_block_bytes(j->W->type);
      for (int64_t t = 0; t < j->n_tokens; t += SL__NT_MAX) {
        int nt =
            j->n_tokens - t < SL__NT_MAX ? (int)(j->n_tokens - t) : SL__NT_MAX;
        const char *xq = (const char *)j->xq + t * j->xq_row_bytes;
        for (int64_t r = r0; r < r1; r += SL__PACK_ROWS) {
          int nr = rows - r < SL__PACK_ROWS ? (int)(rows - r) : SL__PACK_ROWS;
          j->pk(nb,
                (const char *)j->W->packed +
                    (size_t)(r / SL__PACK_ROWS) * gbytes,
                xq, j->xq_row_bytes, j->xd ? j->xd + t : NULL,
                j->xsi ? j->xsi + t : NULL, j->ld, j->Y + t * rows + r,
                (size_t)rows, nr, nt);
        }
      }
      continue;
    }
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

/* The products of one call, in order: a thread that finds one done moves
 * on to the next, so one fork and join covers them all. */
typedef struct mm_parts_job {
  mm_job *jobs;
  int np;
} mm_parts_job;

static void dot_task(void *p, int ith, int nth) {
  (void)ith;
  (void)nth;
  mm_parts_job *pj = p;
  for (int i = 0; i < pj->np; i++)
    dot_run(&pj->jobs[i]);
}

/* Whether a packed kernel takes W at the ISA in use, and over which
 * activations (*act, from sl_kern_act_type). */
static bool packed_kernel(const sl__kern_cpu_ops *ops, const sl_kern_weight *W,
                          sl_ggml_type *act) {
  if (!W->packed || (int)W->type < 0 || (int)W->type >= SL__NTYPES ||
      !ops->packed[W->type] || sl__pack_block_bytes(W->type) == 0)
    return false;
  /* packed Q4_1 / Q5_1 take Q8_0 activations (the same d and quants as
   * Q8_1): their minimums' term reads the quants' exact sums */
  if (*act == SL_GGML_Q8_1)
    *act = SL_GGML_Q8_0;
  /* the packed kernels take any token count; over Q8_0 activations (not
   * Q8_K) they read the block-major scales and quant sums */
  return *act == SL_GGML_Q8_0 || *act == SL_GGML_Q8_K;
}

bool sl_kern_packed_in_use(const sl_kern_weight *W) {
  sl_ggml_type act;
  return W && sl_kern_act_type(W->type, &act) == SL_OK &&
         packed_kernel(sl__kern_cpu_ops_get(), W, &act);
}

/* One part's job, before its activations have a place: the act type, its
 * row bytes, the dot and whether a gemm takes it. */
static sl_status part_init(const sl__kern_cpu_ops *ops, const sl_kern_weight *W,
                           const float *X, float *Y, int64_t n_tokens,
                           mm_job *j) {
  if (!W || W->rows < 0 || W->cols < 0 || (!Y && W->rows > 0))
    return SL_ERR_INVALID_ARG;
  sl_ggml_type act;
  sl_status st = sl_kern_act_type(W->type, &act);
  if (st != SL_OK)
    return st;
  const bool pk = packed_kernel(ops, W, &act);
  size_t wrb, xrb;
  if ((st = sl_kern_row_bytes(W->type, W->cols, &wrb)) != SL_OK)
    return st;
  if ((st = sl_kern_row_bytes(act, W->cols, &xrb)) != SL_OK)
    return st;
  *j = (mm_job){
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
   * marked gemm_one takes one too), Q8_0 or Q8_1 activations, and rows
   * whose weight scales fit its stack buffer */
  if (j->gemm && ((n_tokens < 2 && !ops->gemm_one[W->type]) ||
                  (act != SL_GGML_Q8_0 && act != SL_GGML_Q8_1) ||
                  2 * nb > SL__GEMM_WSC_MAX))
    j->gemm = NULL;
  if (pk) {
    j->pk = ops->packed[W->type];
    j->gemm = NULL;
    j->need_si = act == SL_GGML_Q8_0;
  }
  j->need_sc = j->gemm || j->need_si;
  return SL_OK;
}

/* Adds to *total the scratch bytes q's quantized activations take (none
 * for F32, whose products read X as it is): the rows, 64-byte aligned,
 * then, where a gemm or packed kernel of the group takes them, the scales
 * block-major (setting q->ld). False on overflow. */
static bool act_bytes(mm_job *q, size_t *total) {
  size_t xbytes;
  if (!sl_mul_ok(q->xq_row_bytes, (size_t)q->n_tokens, &xbytes))
    return false;
  if (q->act == SL_GGML_F32)
    return true;
  *total += (xbytes + 63) & ~(size_t)63;
  if (q->need_sc) {
    q->ld = (q->n_tokens + 3) & ~(int64_t)3;
    *total += 3 * sizeof(float) * (size_t)(q->W->cols / SL__QK) * (size_t)q->ld;
  }
  return true;
}

/* Points q's activation buffers at base (act_bytes' layout), or at X for
 * F32; the padding tokens' scales read as zeros. */
static void act_place(mm_job *q, char *base) {
  if (q->act == SL_GGML_F32) {
    q->xq = (void *)q->X;
    return;
  }
  q->xq = base;
  if (!q->need_sc)
    return;
  const int64_t nb = q->W->cols / SL__QK;
  size_t xbytes = q->xq_row_bytes * (size_t)q->n_tokens;
  q->xd = (float *)((char *)q->xq + ((xbytes + 63) & ~(size_t)63));
  q->xsum = q->xd + nb * q->ld;
  q->xsi = (int32_t *)(q->xsum + nb * q->ld);
  for (int64_t i = 0; i < nb; i++)
    for (int64_t t = q->n_tokens; t < q->ld; t++) {
      q->xd[i * q->ld + t] = q->xsum[i * q->ld + t] = 0.0f;
      q->xsi[i * q->ld + t] = 0;
    }
  if (q->act != SL_GGML_Q8_1)
    q->xsum = NULL;
  if (!q->need_si)
    q->xsi = NULL;
}

/* Gives product j its group's quantized activations and its chunk size:
 * ~8 chunks per thread for balance, at least 4 rows each; a gemm's chunk
 * also fits its weight scales on the stack. */
static void job_ready(const sl__kern_cpu_ops *ops, mm_job *j, const mm_job *q,
                      int nth) {
  const int64_t nb = j->W->cols / SL__QK;
  j->xq = q->xq;
  if (j->need_sc) {
    j->xd = q->xd;
    j->xsum = q->xsum;
    j->xsi = q->xsi;
    j->ld = q->ld;
  }
  int64_t chunk = j->W->rows / ((int64_t)nth * 8);
  chunk = chunk < 4 ? 4 : chunk;
  if ((j->gemm && ops->gemm_one[j->W->type]) || j->pk) /* eight rows */
    chunk = (chunk + 7) & ~(int64_t)7;
  if (j->gemm && chunk > SL__GEMM_WSC_MAX / (2 * nb))
    chunk = SL__GEMM_WSC_MAX / (2 * nb);
  j->chunk = chunk;
  atomic_init(&j->next, 0);
}

sl_status sl_kern_matmul_parts(sl_kern_pool_t *pool,
                               const sl_kern_weight *const *W, int n_parts,
                               const float *X, float *const *Y,
                               int64_t n_tokens) {
  if (!W || !Y || n_parts < 1 || n_parts > SL_KERN_MATMUL_PARTS_MAX ||
      n_tokens < 0)
    return SL_ERR_INVALID_ARG;
  const sl__kern_cpu_ops *ops = sl__kern_cpu_ops_get();
  mm_job jobs[SL_KERN_MATMUL_PARTS_MAX];
  for (int i = 0; i < n_parts; i++) {
    sl_status st = part_init(ops, W[i], X, Y[i], n_tokens, &jobs[i]);
    if (st != SL_OK)
      return st;
    if (W[i]->cols != W[0]->cols)
      return SL_ERR_INVALID_ARG; /* one X for all */
  }
  const int64_t cols = W[0]->cols;
  if (n_tokens == 0)
    return SL_OK;
  if (cols == 0) {
    for (int i = 0; i < n_parts; i++)
      memset(Y[i], 0, (size_t)(n_tokens * W[i]->rows) * sizeof(float));
    return SL_OK;
  }

  /* the activations, quantized once per act type: group g's quantized rows
   * (and, where a gemm of the group takes them, its scales, 64-byte
   * aligned) at off[g] of one scratch buffer */
  mm_job grp[SL_KERN_MATMUL_PARTS_MAX];
  size_t off[SL_KERN_MATMUL_PARTS_MAX];
  int ng = 0, of[SL_KERN_MATMUL_PARTS_MAX];
  size_t total = 0;
  for (int i = 0; i < n_parts; i++) {
    int g = 0;
    while (g < ng && grp[g].act != jobs[i].act)
      g++;
    if (g == ng)
      grp[ng++] = jobs[i];
    grp[g].need_sc |= jobs[i].need_sc; /* the group needs the scales */
    grp[g].need_si |= jobs[i].need_si;
    of[i] = g;
  }
  for (int g = 0; g < ng; g++) {
    off[g] = total;
    if (!act_bytes(&grp[g], &total))
      return SL_ERR_OVERFLOW;
  }
  void *owned = NULL, *buf = NULL;
  if (total > 0) {
    if (pool) {
      if (!(buf = sl__kern_pool_scratch(pool, total)))
        return SL_ERR_NOMEM;
    } else if (!(owned = buf = sl_malloc(total))) {
      return SL_ERR_NOMEM;
    }
  }
  int nth = sl_kern_pool_n_threads(pool);
  for (int g = 0; g < ng; g++) {
    mm_job *q = &grp[g];
    act_place(q, (char *)buf + off[g]);
    if (q->act == SL_GGML_F32)
      continue;
    if (n_tokens >= 2 * nth && nth > 1)
      sl_kern_pool_run(pool, quant_task, q);
    else
      quant_task(q, 0, 1);
  }
  for (int i = 0; i < n_parts; i++)
    job_ready(ops, &jobs[i], &grp[of[i]], nth);
  mm_parts_job pj = {jobs, n_parts};
  sl_kern_pool_run(pool, dot_task, &pj);
  sl_free(owned);
  return SL_OK;
}

sl_status sl_kern_matmul(sl_kern_pool_t *pool, const sl_kern_weight *W,
                         const float *X, float *Y, int64_t n_tokens) {
  const sl_kern_weight *ws[1] = {W};
  float *ys[1] = {Y};
  return sl_kern_matmul_parts(pool, ws, 1, X, ys, n_tokens);
}

/* The grouped call's quantization: the groups' tokens, one list, cut into
 * equal runs, one per thread. */
typedef struct grp_quant_job {
  mm_job *grp;
  int ng;
  int64_t total; /* tokens over the groups */
} grp_quant_job;

static void grp_quant_task(void *p, int ith, int nth) {
  grp_quant_job *gj = p;
  int64_t lo = gj->total * ith / nth, hi = gj->total * (ith + 1) / nth, at = 0;
  for (int g = 0; g < gj->ng && at < hi; g++) {
    mm_job *q = &gj->grp[g];
    int64_t a = lo > at ? lo - at : 0, b = hi - at;
    if (b > q->n_tokens)
      b = q->n_tokens;
    if (q->act != SL_GGML_F32 && a < b)
      quant_range(q, a, b);
    at += q->n_tokens;
  }
}

sl_status sl_kern_matmul_grouped(sl_kern_pool_t *pool,
                                 const sl_kern_matmul_op *op, int n_ops) {
  if (n_ops < 0 || (n_ops > 0 && !op))
    return SL_ERR_INVALID_ARG;
  if (n_ops == 0)
    return SL_OK;
  const sl__kern_cpu_ops *ops = sl__kern_cpu_ops_get();
  mm_job *jobs = sl_malloc(sizeof(mm_job) * 2 * (size_t)n_ops);
  int *of = sl_malloc(sizeof(int) * (size_t)n_ops);
  size_t *off = sl_malloc(sizeof(size_t) * (size_t)n_ops);
  sl_status st = SL_OK;
  void *owned = NULL;
  if (!jobs || !of || !off) {
    st = SL_ERR_NOMEM;
    goto out;
  }
  mm_job *grp = jobs + n_ops; /* one per distinct (X, activation type) */
  int ng = 0, live = 0;
  for (int i = 0; i < n_ops; i++) {
    if (op[i].n_tokens < 0 || (op[i].n_tokens > 0 && !op[i].X)) {
      st = SL_ERR_INVALID_ARG;
      goto out;
    }
    if ((st = part_init(ops, op[i].W, op[i].X, op[i].Y, op[i].n_tokens,
                        &jobs[i])) != SL_OK)
      goto out;
    if (op[i].n_tokens == 0 || op[i].W->rows == 0) {
      of[i] = -1; /* nothing to compute */
      continue;
    }
    if (op[i].W->cols == 0) {
      memset(op[i].Y, 0,
             (size_t)(op[i].n_tokens * op[i].W->rows) * sizeof(float));
      of[i] = -1;
      continue;
    }
    int g = 0;
    while (g < ng && !(grp[g].X == op[i].X && grp[g].act == jobs[i].act &&
                       grp[g].n_tokens == op[i].n_tokens &&
                       grp[g].W->cols == op[i].W->cols))
      g++;
    if (g == ng)
      grp[ng++] = jobs[i];
    grp[g].need_sc |= jobs[i].need_sc;
    grp[g].need_si |= jobs[i].need_si;
    of[i] = g;
    live++;
  }
  size_t total = 0;
  int64_t toks = 0;
  for (int g = 0; g < ng; g++) {
    off[g] = total;
    if (!act_bytes(&grp[g], &total)) {
      st = SL_ERR_OVERFLOW;
      goto out;
    }
    toks += grp[g].n_tokens;
  }
  void *buf = NULL;
  if (total > 0) {
    if (pool)
      buf = sl__kern_pool_scratch(pool, total);
    else
      buf = owned = sl_malloc(total);
    if (!buf) {
      st = SL_ERR_NOMEM;
      goto out;
    }
  }
  int nth = sl_kern_pool_n_threads(pool);
  for (int g = 0; g < ng; g++)
    act_place(&grp[g], (char *)buf + off[g]);
  grp_quant_job gq = {grp, ng, toks};
  if (toks >= 2 * nth && nth > 1)
    sl_kern_pool_run(pool, grp_quant_task, &gq);
  else
    grp_quant_task(&gq, 0, 1);
  /* the products with work, in order, packed to the front */
  int np = 0;
  for (int i = 0; i < n_ops; i++) {
    if (of[i] < 0)
      continue;
    job_ready(ops, &jobs[i], &grp[of[i]], nth);
    jobs[np++] = jobs[i];
  }
  if (live > 0) {
    mm_parts_job pj = {jobs, np};
    sl_kern_pool_run(pool, dot_task, &pj);
  }
out:
  sl_free(owned);
  sl_free(off);
  sl_free(of);
  sl_free(jobs);
  return st;
}
