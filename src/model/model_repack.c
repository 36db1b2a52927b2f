/* sluice — model: the matrices' packed copies for the CPU kernels and the
 * experts' fused gate/up (sl__model_repack, llama_impl.h says what it does).
 * Its own file: the CPU batch context (llama_batch.c) calls it, and llama.c
 * calls into that file, so here it keeps the file-level call graph acyclic.
 */
#include <stdatomic.h>

#include "llama_impl.h"
#include "sluice/alloc.h"
#include "sluice/util.h"

/* One piece of the copy: a matrix, or an expert's gate and up whose packed
 * copies lie back to back, making the packed copy of the two stacked. */
typedef struct unit {
  sl_kern_weight *w[2];
  int n;
  sl_kern_weight *fused; /* n == 2: the stacked view to set */
  size_t bytes[2];
} unit;

/* Whether layer w's gate and up experts can be fused: one type, one shape,
 * packed at the ISA in use, and rows in whole packing groups, so that gate
 * e's copy followed by up e's is the copy of the stacked matrix. */
static bool fusable(const sl__layer_w *w) {
  const sl_kern_weight *g = &w->gate_exps[0], *u = &w->up_exps[0];
  return g->type == u->type && g->rows == u->rows && g->cols == u->cols &&
         g->rows % SL_KERN_PACK_ROWS == 0 && sl_kern_repack_bytes(g) > 0;
}

void sl__model_repack(sl_model_t *m) {
  pthread_mutex_lock(&m->repack_mu);
  if (m->repack_done)
    goto out;
  m->repack_done = true;
  const int64_t nl = m->hp.n_layer, ne = m->hp.n_expert;
  const size_t nu = (size_t)nl * (7 + 1 + 3 * (size_t)ne) + 1;
  unit *us = sl_calloc(nu, sizeof *us);
  if (!us)
    goto out;
  if (ne > 0) /* without room for the views, nothing is fused */
    m->fused = sl_calloc((size_t)(nl * ne), sizeof *m->fused);
  size_t n = 0, nmat = 0, nfused = 0;
  for (int64_t i = 0; i < nl; i++) {
    sl__layer_w *w = &m->layers[i];
    sl_kern_weight *lw[] = {&w->wq,     &w->wk,   &w->wv,    &w->wo,
                            &w->w_gate, &w->w_up, &w->w_down};
    if (m->ld[i].ffn.kind == SL__FFN_MOE) { /* the router and the experts */
      for (size_t k = 0; k < 4; k++)
        us[n++] = (unit){{lw[k]}, 1, NULL, {0}};
      us[n++] = (unit){{&w->router}, 1, NULL, {0}};
      bool fuse = m->fused && fusable(w);
      for (int64_t e = 0; e < ne; e++) {
        if (fuse)
          us[n++] = (unit){{&w->gate_exps[e], &w->up_exps[e]},
                           2,
                           &m->fused[i * ne + e],
                           {0}};
        else {
          us[n++] = (unit){{&w->gate_exps[e]}, 1, NULL, {0}};
          us[n++] = (unit){{&w->up_exps[e]}, 1, NULL, {0}};
        }
        us[n++] = (unit){{&w->down_exps[e]}, 1, NULL, {0}};
      }
      continue;
    }
    for (size_t k = 0; k < sizeof lw / sizeof lw[0]; k++)
      us[n++] = (unit){{lw[k]}, 1, NULL, {0}};
  }
  us[n++] = (unit){{&m->output}, 1, NULL, {0}};
  uint64_t total = 0;
  for (size_t k = 0; k < n; k++) {
    size_t b = 0;
    for (int j = 0; j < us[k].n; j++)
      b += us[k].bytes[j] = sl_kern_repack_bytes(us[k].w[j]);
    total += (b + 63) & ~(size_t)63;
  }
  if (total == 0)
    goto out_us;
  char *buf = total <= SIZE_MAX ? sl_malloc((size_t)total) : NULL;
  if (!buf) {
    SL_LOGW("no memory for the repacked weights (%llu bytes): the kernels "
            "read the GGUF layout",
            (unsigned long long)total);
    goto out_us;
  }
  size_t off = 0, np = 0;
  uint64_t released = 0;
  for (size_t k = 0; k < n; k++) {
    unit *u = &us[k];
    size_t at = off, rb;
    bool ok = true;
    for (int j = 0; j < u->n && ok; j++) {
      ok = u->bytes[j] > 0 &&
           sl_kern_repack(u->w[j], buf + at, u->bytes[j]) == SL_OK;
      at += u->bytes[j];
    }
    if (!ok)
      continue; /* (a fused pair packs whole or not at all) */
    at = off;
    for (int j = 0; j < u->n; j++) {
      sl_kern_weight *w = u->w[j];
      w->packed = buf + at;
      at += u->bytes[j];
      np++;
      bool tied = w == &m->output && m->hp.tied_embeddings;
      if (!tied && sl_kern_row_bytes(w->type, w->cols, &rb) == SL_OK)
        released += sl_gguf_release_pages(m->g, w->data, rb * (size_t)w->rows);
    }
    if (u->n == 2) {
      const sl_kern_weight *g = u->w[0];
      *u->fused =
          (sl_kern_weight){g->type, 2 * g->rows, g->cols, NULL, buf + off};
      nfused++;
    }
    off += (at - off + 63) & ~(size_t)63;
  }
  for (int64_t i = 0; m->fused && i < nl; i++) {
    bool all = true; /* a layer's experts are fused all or none */
    for (int64_t e = 0; e < ne && all; e++)
      all = m->fused[i * ne + e].packed != NULL;
    if (all)
      m->layers[i].gu_exps = &m->fused[i * ne];
  }
  for (size_t k = 0; k < n; k++)
    nmat += (size_t)us[k].n;
  m->packed = buf;
  atomic_store(&m->released_bytes, released);
  atomic_store(&m->packed_bytes, total);
  SL_LOGI("repacked %zu of %zu matrices for the CPU kernels (%zu experts' "
          "gate and up fused): %llu bytes, %llu mapped bytes released",
          np, nmat, nfused, (unsigned long long)total,
          (unsigned long long)released);
out_us:
  sl_free(us);
out:
  pthread_mutex_unlock(&m->repack_mu);
}
