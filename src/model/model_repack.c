/* sluice — model: the matrices' packed copies for the CPU kernels
 * (sl__model_repack, llama_impl.h says what it does). Its own file: the CPU
 * batch context (llama_batch.c) calls it, and llama.c calls into that file,
 * so here it keeps the file-level call graph acyclic. */
#include "llama_impl.h"
#include "sluice/alloc.h"
#include "sluice/util.h"

void sl__model_repack(sl_model_t *m) {
  pthread_mutex_lock(&m->repack_mu);
  if (m->repack_done)
    goto out;
  m->repack_done = true;
  const int64_t nl = m->hp.n_layer, ne = m->hp.n_expert;
  const size_t nw = (size_t)nl * (7 + 1 + 3 * (size_t)ne) + 1;
  sl_kern_weight **ws = sl_malloc(nw * sizeof *ws);
  if (!ws)
    goto out;
  size_t n = 0;
  for (int64_t i = 0; i < nl; i++) {
    sl__layer_w *w = &m->layers[i];
    sl_kern_weight *lw[] = {&w->wq,     &w->wk,   &w->wv,    &w->wo,
                            &w->w_gate, &w->w_up, &w->w_down};
    if (ne > 0) { /* the experts and the router instead of a dense FFN */
      for (size_t k = 0; k < 4; k++)
        ws[n++] = lw[k];
      ws[n++] = &w->router;
      for (int64_t e = 0; e < 3 * ne; e++) /* gate, up, down: adjacent */
        ws[n++] = &w->gate_exps[e];
      continue;
    }
    for (size_t k = 0; k < sizeof lw / sizeof lw[0]; k++)
      ws[n++] = lw[k];
  }
  ws[n++] = &m->output;
  uint64_t total = 0;
  for (size_t k = 0; k < n; k++)
    total += (sl_kern_repack_bytes(ws[k]) + 63) & ~(size_t)63;
  if (total == 0)
    goto out_ws;
  char *buf = total <= SIZE_MAX ? sl_malloc((size_t)total) : NULL;
  if (!buf) {
    SL_LOGW("no memory for the repacked weights (%llu bytes): the kernels "
            "read the GGUF layout",
            (unsigned long long)total);
    goto out_ws;
  }
  size_t off = 0, np = 0;
  for (size_t k = 0; k < n; k++) {
    sl_kern_weight *w = ws[k];
    size_t pb = sl_kern_repack_bytes(w), rb;
    if (pb == 0 || sl_kern_repack(w, buf + off, pb) != SL_OK)
      continue;
    w->packed = buf + off;
    off += (pb + 63) & ~(size_t)63;
    np++;
    bool tied = w == &m->output && m->hp.tied_embeddings;
    if (!tied && sl_kern_row_bytes(w->type, w->cols, &rb) == SL_OK)
      m->released_bytes +=
          sl_gguf_release_pages(m->g, w->data, rb * (size_t)w->rows);
  }
  m->packed = buf;
  m->packed_bytes = total;
  SL_LOGI("repacked %zu of %zu matrices for the CPU kernels: %llu bytes, "
          "%llu mapped bytes released",
          np, n, (unsigned long long)total,
          (unsigned long long)m->released_bytes);
out_ws:
  sl_free(ws);
out:
  pthread_mutex_unlock(&m->repack_mu);
}
