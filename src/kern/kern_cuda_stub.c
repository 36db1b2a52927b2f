/* sluice — kern: sluice/kern_cuda.h in a build without CUDA.
 *
 * Every function fails with SL_ERR_UNSUPPORTED (sizes are 0, no type is
 * supported), so that callers link and learn at run time that there is no
 * CUDA backend. With CUDA, src/kern/cuda/ defines them and this file is
 * empty. */
#include "sluice/kern_cuda.h"

#ifndef SLUICE_HAVE_CUDA

bool sl_kcu_type_supported(sl_ggml_type t) {
  (void)t;
  return false;
}

size_t sl_kcu_packed_bytes(sl_ggml_type t, int64_t rows, int64_t cols) {
  return 0;
}

bool sl_kcu_type_packed(sl_ggml_type t) {
  (void)t;
  return false;
}

sl_status sl_kcu_pack(void *stream, sl_ggml_type t, const void *src, void *dst,
                      int64_t rows, int64_t cols) {
  return SL_ERR_UNSUPPORTED;
}

size_t sl_kcu_matmul_scratch_bytes(const sl_kern_weight *w, int n) {
  return 0;
}

sl_status sl_kcu_matmul(void *stream, const sl_kern_weight *w, const float *x,
                        float *y, int n, void *scratch, size_t scratch_bytes) {
  return SL_ERR_UNSUPPORTED;
}

size_t sl_kcu_matmul_path_scratch_bytes(const sl_kern_weight *w, int n,
                                        sl_kcu_mm_path path) {
  return 0;
}

sl_status sl_kcu_matmul_path(void *stream, const sl_kern_weight *w,
                             const float *x, float *y, int n,
                             sl_kcu_mm_path path, void *scratch,
                             size_t scratch_bytes) {
  return SL_ERR_UNSUPPORTED;
}

bool sl_kcu_split_ok(sl_ggml_type t) {
  return false;
}

sl_status sl_kcu_matmul_vec_split(void *stream, const sl_kern_weight *w,
                                  const float *x, int n,
                                  const sl_kcu_split *sp) {
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_get_rows(void *stream, sl_ggml_type t, const void *src,
                          int64_t cols, const int32_t *ids, int n, float *dst) {
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_rmsnorm(void *stream, float *y, const float *x, const float *w,
                         int64_t rows, int64_t width, float eps) {
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_add(void *stream, float *y, const float *a, const float *b,
                     int64_t n) {
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_add_bias(void *stream, float *y, const float *bias,
                          int64_t rows, int64_t width) {
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_swiglu(void *stream, float *y, const float *g, const float *u,
                        int64_t n) {
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_rope(void *stream, float *x, const int32_t *pos, int n_tok,
                      int n_head, int head_dim, int n_rot, float base,
                      float scale, int mode) {
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_kv_store(void *stream, uint16_t *k_layer, uint16_t *v_layer,
                          const float *k, const float *v, const int32_t *slot,
                          int n_tok, int kv_dim) {
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_kv_blocks(void *stream, uint16_t *pool, int n_layer,
                           int n_blocks, size_t span_elems, const int *blocks,
                           int n, uint16_t *stage, bool out) {
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_add_rmsnorm(void *stream, float *x, float *y, const float *d,
                             const float *w, int64_t rows, int64_t width,
                             float eps) {
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_rope_kv_store(void *stream, float *q, float *k, const float *v,
                               const int32_t *pos, const int32_t *slot,
                               int n_tok, int n_head, int n_head_kv,
                               int head_dim, int n_rot, float base, float scale,
                               int mode, uint16_t *k_layer, uint16_t *v_layer) {
  return SL_ERR_UNSUPPORTED;
}

size_t sl_kcu_attn_work_bytes(int n_tok, int n_head, int head_dim,
                              int max_len) {
  return 0;
}

sl_status sl_kcu_attention(void *stream, const sl_kcu_attn *a) {
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_argmax(void *stream, const float *logits, int n_rows,
                        int64_t n_vocab, int32_t *ids, float *logprob) {
  return SL_ERR_UNSUPPORTED;
}

size_t sl_kcu_sample_work_bytes(int n_seq, int64_t n_vocab) {
  return 0;
}

sl_status sl_kcu_sample(void *stream, const float *logits, int64_t n_vocab,
                        int n_seq, const sl_kcu_sample_params *params,
                        sl_kcu_sample_out *out, void *work, size_t work_bytes) {
  return SL_ERR_UNSUPPORTED;
}

sl_status sl__kcu_test_slow_copy(void *stream, float *dst, const float *src,
                                 int64_t n, double ms) {
  return SL_ERR_UNSUPPORTED;
}

#endif
