/* sluice — model: the routed-expert FFN of a mixture-of-experts layer on the
 * CPU (qwen3moe, Mixtral-class llama files).
 *
 * One call takes every token of a step. The router's product runs over all
 * of them at once; each token then picks its top-k experts by itself (a
 * fixed order: softmax, then the largest probabilities, the lowest index on
 * a tie). The tokens are grouped by expert (a counting sort, tokens in batch
 * order within an expert), and each expert that some token chose runs its
 * gate and up products, SwiGLU and its down product over just its tokens:
 * its weights are read once per step, however many tokens chose it. All the
 * experts' gate and up products go as one grouped call
 * (sl_kern_matmul_grouped: two pool runs), their down products as another.
 * Each token's output is summed over its experts in expert order, so a
 * token's result does not depend on its company (DESIGN.md I9): the matmul
 * kernels fix each row's order of sums whatever the number of rows.
 */
#include <math.h>
#include <string.h>

#include "llama_impl.h"
#include "sluice/kern_cpu.h"
#include "sluice/util.h"

static size_t up16(size_t n) {
  return (n + 15) & ~(size_t)15;
}

/* Scratch regions, in floats (int32 regions take one float each). */
typedef struct moe_layout {
  size_t logits, sel, wt, off, list, xe, ge, ue, ye, total;
} moe_layout;

static moe_layout layout_for(const sl__ffn_desc *f, int64_t width, size_t n) {
  size_t E = (size_t)f->n_expert, K = (size_t)f->n_used, d = (size_t)width,
         ff = (size_t)f->n_ff;
  moe_layout L;
  size_t o = 0;
  L.logits = o, o += up16(n * E);
  L.sel = o, o += up16(n * K);
  L.wt = o, o += up16(n * K);
  L.off = o, o += up16(E + 1);
  L.list = o, o += up16(n * K);
  L.xe = o, o += up16(n * K * d); /* the pairs' rows, grouped by expert */
  /* ge and ue back to back: a fused product writes (n * K, 2 * ff) over
   * both */
  L.ge = o, o += up16(n * K * ff);
  L.ue = o, o += up16(n * K * ff);
  L.ye = o, o += up16(n * K * d);
  L.total = o;
  return L;
}

size_t sl__moe_scratch_floats(const sl__ffn_desc *f, int64_t d, size_t n) {
  return f->kind == SL__FFN_MOE ? layout_for(f, d, n).total : 0;
}

void sl__moe_route(const sl__ffn_desc *fd, float *lg, int32_t *sel, float *wt) {
  const int E = (int)fd->n_expert, K = (int)fd->n_used;
  sl_kern_softmax(lg, E);
  /* K passes over the experts: the largest probability not yet taken, the
   * lowest index on a tie (a NaN never wins over a number, and the first
   * expert not taken stands in when all are NaN) */
  for (int j = 0; j < K; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      bool taken = false;
      for (int i = 0; i < j && !taken; i++)
        taken = sel[i] == e;
      if (taken)
        continue;
      if (best < 0 || lg[e] > lg[best] || (isnan(lg[best]) && !isnan(lg[e])))
        best = e;
    }
    sel[j] = best;
  }
  for (int j = 1; j < K; j++) { /* into expert order */
    int32_t v = sel[j];
    int i = j;
    for (; i > 0 && sel[i - 1] > v; i--)
      sel[i] = sel[i - 1];
    sel[i] = v;
  }
  float sum = 0;
  for (int j = 0; j < K; j++) {
    wt[j] = lg[sel[j]];
    sum += wt[j];
  }
  float f = fd->weight_scale;
  if (fd->norm_weights && sum > 0)
    for (int j = 0; j < K; j++)
      wt[j] = wt[j] / sum * f;
  else
    for (int j = 0; j < K; j++)
      wt[j] *= f;
}

sl_status sl__moe_ffn(sl_kern_pool_t *pool, const sl__ffn_desc *f, int64_t d,
                      const sl__layer_w *w, const float *x, float *out, int n,
                      float *scratch) {
  const int E = (int)f->n_expert, K = (int)f->n_used;
  const int64_t ff = f->n_ff;
  moe_layout L = layout_for(f, d, (size_t)n);
  float *logits = scratch + L.logits, *wt = scratch + L.wt,
        *xe = scratch + L.xe, *ge = scratch + L.ge, *ue = scratch + L.ue,
        *ye = scratch + L.ye;
  int32_t *sel = (int32_t *)(scratch + L.sel),
          *off = (int32_t *)(scratch + L.off),
          *list = (int32_t *)(scratch + L.list);
  sl_status st = sl_kern_matmul(pool, &w->router, x, logits, n);
  if (st != SL_OK)
    return st;
  for (int t = 0; t < n; t++)
    sl__moe_route(f, logits + (size_t)t * (size_t)E, sel + (size_t)t * K,
                  wt + (size_t)t * K);
  /* counting sort of the (token, choice) pairs by expert; each entry is
   * the pair's index t * K + j, tokens in batch order within an expert */
  memset(off, 0, sizeof(int32_t) * (size_t)(E + 1));
  for (int i = 0; i < n * K; i++)
    off[sel[i] + 1]++;
  for (int e = 0; e < E; e++)
    off[e + 1] += off[e];
  for (int i = 0; i < n * K; i++) {
    int e = sel[i];
    list[off[e]++] = i;
  }
  for (int e = E; e > 0; e--) /* back to the starts */
    off[e] = off[e - 1];
  off[0] = 0;
  /* every pair's row of x, in list order: expert e's rows are
   * [off[e], off[e + 1]) */
  for (int r = 0; r < n * K; r++)
    memcpy(xe + (size_t)r * (size_t)d, x + (size_t)(list[r] / K) * (size_t)d,
           sizeof(float) * (size_t)d);
  sl_kern_matmul_op *op = sl_malloc(sizeof *op * 2 * (size_t)E);
  if (!op)
    return SL_ERR_NOMEM;
  /* gate and up of every chosen expert: one product of the two stacked
   * where the load fused them and the ISA in use reads the fused copy (each
   * pair's row (gate, then up) is then one row of 2 * ff), else two */
  const bool fused = w->gu_exps && sl_kern_packed_in_use(&w->gu_exps[0]);
  int nop = 0;
  for (int e = 0; e < E; e++) {
    int64_t c = off[e + 1] - off[e];
    if (c == 0)
      continue;
    size_t r0 = (size_t)off[e];
    if (fused) {
      op[nop++] = (sl_kern_matmul_op){&w->gu_exps[e], xe + r0 * (size_t)d,
                                      ge + r0 * 2 * (size_t)ff, c};
      continue;
    }
    op[nop++] = (sl_kern_matmul_op){&w->gate_exps[e], xe + r0 * (size_t)d,
                                    ge + r0 * (size_t)ff, c};
    op[nop++] = (sl_kern_matmul_op){&w->up_exps[e], xe + r0 * (size_t)d,
                                    ue + r0 * (size_t)ff, c};
  }
  st = sl_kern_matmul_grouped(pool, op, nop);
  if (st == SL_OK) {
    /* SwiGLU a pair at a time (the same arithmetic for a row whatever the
     * number of rows, I9), into ge's rows of ff; fused, in place: row r's
     * output [r ff, (r + 1) ff) overlaps only rows before it (r >= 1), or
     * its own gate half element for element (r = 0) */
    for (int64_t r = 0; r < (int64_t)n * K; r++) {
      float *h = ge + r * ff;
      if (fused)
        sl_kern_swiglu(h, ge + r * 2 * ff, ge + r * 2 * ff + ff, ff);
      else
        sl_kern_swiglu(h, h, ue + r * ff, ff);
    }
    nop = 0;
    for (int e = 0; e < E; e++) {
      int64_t c = off[e + 1] - off[e];
      if (c == 0)
        continue;
      size_t r0 = (size_t)off[e];
      op[nop++] = (sl_kern_matmul_op){&w->down_exps[e], ge + r0 * (size_t)ff,
                                      ye + r0 * (size_t)d, c};
    }
    st = sl_kern_matmul_grouped(pool, op, nop);
  }
  sl_free(op);
  if (st != SL_OK)
    return st;
  /* each token's sum over its experts, in expert order */
  memset(out, 0, sizeof(float) * (size_t)n * (size_t)d);
  for (int r = 0; r < n * K; r++) {
    float a = wt[list[r]];
    float *o = out + (size_t)(list[r] / K) * (size_t)d;
    const float *y = ye + (size_t)r * (size_t)d;
    for (int64_t i = 0; i < d; i++)
      o[i] += a * y[i];
  }
  return SL_OK;
}
