/* sluice — kern: the CUDA kernels of the forward pass.
 *
 * Every function enqueues device work on `stream` (a cudaStream_t: a task's
 * ctx->native) and returns without waiting. Every pointer is a device
 * pointer. Launch errors come back as SL_ERR_DEVICE (SL_ERR_DEVICE_FATAL for
 * a sticky error); bad sizes as SL_ERR_INVALID_ARG; a weight type without a
 * kernel as SL_ERR_UNSUPPORTED. Built without CUDA, every function returns
 * SL_ERR_UNSUPPORTED (src/kern/kern_cuda_stub.c).
 *
 * Layouts are the CPU kernels' (sluice/kern_cpu.h): row-major f32
 * activations, weights in their GGUF bytes (sl_kern_weight, `data` a device
 * pointer), KV in f16 in the paged layout of sluice/kv.h; except that Q4_0,
 * Q4_1 and Q8_0 weights are read in the packed layout that sl_kcu_pack
 * writes (by sl_kcu_matmul, sl_kcu_matmul_path, sl_kcu_get_rows).
 */
#ifndef SLUICE_KERN_CUDA_H
#define SLUICE_KERN_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/ggml_type.h"
#include "sluice/kern_cpu.h"
#include "sluice/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* True when `t` has CUDA matrix kernels: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS. */
bool sl_kcu_type_supported(sl_ggml_type t);

/* Device bytes of a rows x cols matrix of type t in the layout the CUDA
 * kernels read: for Q4_0, Q4_1 and Q8_0 the packed layout (quants apart from
 * scales, 16-byte aligned: src/kern/cuda/packed.cuh), for the other types
 * the GGUF bytes as they are. The packed layout stores rows in tiles of 16
 * (the last one padded), so it may be a little larger than the GGUF bytes.
 * 0 for a type without kernels or cols not a multiple of its block;
 * SIZE_MAX on overflow. */
size_t sl_kcu_packed_bytes(sl_ggml_type t, int64_t rows, int64_t cols);

/* True when t is repacked (then sl_kcu_pack must run before the kernels
 * read it): Q4_0, Q4_1, Q8_0. */
bool sl_kcu_type_packed(sl_ggml_type t);

/* Rewrites rows x cols of GGUF-layout data at src (device, 2-byte aligned)
 * into the packed layout at dst (device, sl_kcu_packed_bytes bytes, 16-byte
 * aligned; 256 from the allocator), on stream; for the other types copies
 * the bytes. src and dst must not overlap. SL_ERR_UNSUPPORTED for a type
 * without kernels, SL_ERR_INVALID_ARG for cols not a multiple of the block
 * or a misaligned pointer. */
sl_status sl_kcu_pack(void *stream, sl_ggml_type t, const void *src, void *dst,
                      int64_t rows, int64_t cols);

/* Token counts up to this many take the matrix-vector kernels (weights are
 * read once for all of them); more take dequantization + cuBLAS. */
#define SL_KCU_MMV_MAX_TOKENS 8

/* Q4_0, Q4_1 and Q8_0 weights (the packed types) take the tensor-core
 * kernel (src/kern/cuda/mmt.cu) on the matrix-vector path instead, for any
 * n: up to this many tokens in one pass over the weights, x rounded to f16.
 * SLUICE_CUDA_MMT=0 in the environment (read once) keeps them on the f32
 * matrix-vector kernel. */
#define SL_KCU_MMT_MAX_TOKENS 64

/* Bytes of device scratch sl_kcu_matmul needs for `n` tokens of `w`
 * (0 on the matrix-vector path). */
size_t sl_kcu_matmul_scratch_bytes(const sl_kern_weight *w, int n);

/* Y[t][r] = sum_k W[r][k] * X[t][k] for t < n, r < w->rows; X (n, cols) f32,
 * Y (n, rows) f32. w->data: Q4_0, Q4_1, Q8_0 packed (sl_kcu_pack), the
 * other types in their GGUF bytes. `scratch` holds
 * sl_kcu_matmul_scratch_bytes(w, n) bytes (may be NULL when that is 0). */
sl_status sl_kcu_matmul(void *stream, const sl_kern_weight *w, const float *x,
                        float *y, int n, void *scratch, size_t scratch_bytes);

/* Which kernels sl_kcu_matmul_path takes. */
/* The matrix-vector path of a weight whose rows stack several matrices
 * (q, k and v; gate and up), each part's outputs in its own array: part i
 * takes the next rows[i] rows (all but the last a multiple of 16) into y[i]
 * (n x rows[i]). One pass over the weights instead of one a matrix; the same
 * sums as SL_KCU_MM_VEC on the stacked weight. Only where sl_kcu_split_ok
 * (the packed types on the tensor-core kernel). */
#define SL_KCU_SPLIT_MAX 3
typedef struct sl_kcu_split {
  int n_parts;
  int64_t rows[SL_KCU_SPLIT_MAX];
  float *y[SL_KCU_SPLIT_MAX];
} sl_kcu_split;

bool sl_kcu_split_ok(sl_ggml_type t);
sl_status sl_kcu_matmul_vec_split(void *stream, const sl_kern_weight *w,
                                  const float *x, int n,
                                  const sl_kcu_split *sp);

typedef enum sl_kcu_mm_path {
  SL_KCU_MM_AUTO = 0, /* as sl_kcu_matmul: by n */
  SL_KCU_MM_VEC = 1,  /* the matrix-vector kernels, on slices of at most
                         SL_KCU_MMV_MAX_TOKENS tokens (packed types: the
                         tensor-core kernel, SL_KCU_MMT_MAX_TOKENS), for
                         any n */
  SL_KCU_MM_GEMM = 2, /* dequantization + cuBLAS, for any n */
} sl_kcu_mm_path;

/* As sl_kcu_matmul, on a given path. A token's result on one path does not
 * depend on n or on the other tokens: what the engine needs for a token's
 * arithmetic not to depend on its batch. */
size_t sl_kcu_matmul_path_scratch_bytes(const sl_kern_weight *w, int n,
                                        sl_kcu_mm_path path);
sl_status sl_kcu_matmul_path(void *stream, const sl_kern_weight *w,
                             const float *x, float *y, int n,
                             sl_kcu_mm_path path, void *scratch,
                             size_t scratch_bytes);

/* dst[i] (cols f32) = the dequantized row ids[i] of a (rows, cols) matrix of
 * type t at src, for i < n (the token embedding gather). ids: device int32.
 * src as w->data of sl_kcu_matmul: packed for Q4_0, Q4_1, Q8_0. */
sl_status sl_kcu_get_rows(void *stream, sl_ggml_type t, const void *src,
                          int64_t cols, const int32_t *ids, int n, float *dst);

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for rows r < rows of `width`
 * floats; y may equal x. (q/k norm: rows = tokens * heads, width = hd.) */
sl_status sl_kcu_rmsnorm(void *stream, float *y, const float *x, const float *w,
                         int64_t rows, int64_t width, float eps);

/* y = a + b over n floats (y may alias either). */
sl_status sl_kcu_add(void *stream, float *y, const float *a, const float *b,
                     int64_t n);

/* y[r][c] += bias[c] for r < rows, c < width. */
sl_status sl_kcu_add_bias(void *stream, float *y, const float *bias,
                          int64_t rows, int64_t width);

/* y = silu(g) * u over n floats (y may alias g). */
sl_status sl_kcu_swiglu(void *stream, float *y, const float *g, const float *u,
                        int64_t n);

/* Rotates x (n_tok, n_head * head_dim) in place, token t at position pos[t]
 * (device int32), the first n_rot dims of each head, as sl_kern_rope does
 * (mode: SL_KERN_ROPE_NORM adjacent pairs, SL_KERN_ROPE_NEOX halves). */
sl_status sl_kcu_rope(void *stream, float *x, const int32_t *pos, int n_tok,
                      int n_head, int head_dim, int n_rot, float base,
                      float scale, int mode);

/* Writes token t's k and v rows (n_tok, kv_dim) f32 as f16 into the paged
 * cache of one layer: slot[t] = block * block_tokens + offset (device
 * int32); K row at k_layer + slot * kv_dim, V likewise at v_layer (the
 * layer's base: sl_kv_view_k_offset(view, layer, 0)). */
sl_status sl_kcu_kv_store(void *stream, uint16_t *k_layer, uint16_t *v_layer,
                          const float *k, const float *v, const int32_t *slot,
                          int n_tok, int kv_dim);

/* Whole KV blocks between the paged pool (the layout of sluice/kv.h:
 * K then V, each (n_layer, n_blocks, span_elems) f16) and a contiguous
 * device staging buffer holding, for each of the n blocks (blocks[i], at
 * most SL_KCU_KV_BLOCKS_MAX), for each layer, its K span then its V span
 * (the tiers' byte order). out: pool -> stage; else stage -> pool. One
 * launch; the block ids travel in its parameters. */
#define SL_KCU_KV_BLOCKS_MAX 64
sl_status sl_kcu_kv_blocks(void *stream, uint16_t *pool, int n_layer,
                           int n_blocks, size_t span_elems, const int *blocks,
                           int n, uint16_t *stage, bool out);

/* The fused steps of the decode path (one launch each, for the launch
 * overhead of small kernels at batch 1):
 * - add_rmsnorm: x += d, then y = rmsnorm(x) * w, rows of `width` (y may
 *   alias d: the residual add and the next sublayer's norm); the results
 *   of sl_kcu_add then sl_kcu_rmsnorm up to the order of the sum of squares;
 * - rope_kv_store: sl_kcu_rope on q (n_head heads) and on k (n_head_kv),
 *   then sl_kcu_kv_store of the rotated k and of v; the same bits as the
 *   three calls. */
sl_status sl_kcu_add_rmsnorm(void *stream, float *x, float *y, const float *d,
                             const float *w, int64_t rows, int64_t width,
                             float eps);
sl_status sl_kcu_rope_kv_store(void *stream, float *q, float *k, const float *v,
                               const int32_t *pos, const int32_t *slot,
                               int n_tok, int n_head, int n_head_kv,
                               int head_dim, int n_rot, float base, float scale,
                               int mode, uint16_t *k_layer, uint16_t *v_layer);

/* Causal attention of every (token, head) over its sequence's paged KV, one
 * layer. Token t belongs to sequence tok_seq[t] and sits at position
 * tok_pos[t]; it attends to positions 0..tok_pos[t] of that sequence, whose
 * blocks are block_table[seq_blk_off[s] ...]. q, out: (n_tok, n_head * hd)
 * f32. K of position p of sequence s: k_layer + (block_table[off + p /
 * block_tokens] * block_tokens + p % block_tokens) * kv_dim + kvh * hd, with
 * kvh = h / (n_head / n_head_kv). All index arrays are device int32.
 * Tokens [0, n_split_tok) (decode tokens) are split along their positions
 * in chunks of SL_KCU_ATTN_CHUNK, the rest (prompt tokens) are not; how a
 * token is cut depends only on its own length, so that its result does not
 * depend on its batch. `work` holds sl_kcu_attn_work_bytes(n_split_tok,
 * n_head, head_dim, max_len) bytes (0 when nothing is split). */
#define SL_KCU_ATTN_CHUNK 256
typedef struct sl_kcu_attn {
  const float *q;
  float *out;
  const uint16_t *k_layer, *v_layer;
  const int32_t *block_table, *seq_blk_off, *tok_seq, *tok_pos;
  int n_tok, n_head, n_head_kv, head_dim, kv_dim, block_tokens;
  int max_len;     /* the longest context in the batch (positions) */
  int n_split_tok; /* the leading tokens that may be split */
  float scale;
  void *work;
  size_t work_bytes;
} sl_kcu_attn;

size_t sl_kcu_attn_work_bytes(int n_tok, int n_head, int head_dim, int max_len);
sl_status sl_kcu_attention(void *stream, const sl_kcu_attn *a);

/* ids[r] = argmax over c < n_vocab of logits[r][c] (the lowest index on a
 * tie, as the CPU sampler), for r < n_rows; when logprob is not NULL,
 * logprob[r] = log softmax of that entry. */
sl_status sl_kcu_argmax(void *stream, const float *logits, int n_rows,
                        int64_t n_vocab, int32_t *ids, float *logprob);

/* ---- sampling on the device (src/kern/cuda/sample.cu) ------------------
 * Each sequence draws its token as the CPU sampler does
 * (sl_sampler_sample_with in src/engine/sampler.c: penalties, then greedy or
 * top-k, temperature softmax, min-p, top-p and the inverse CDF at the given
 * uniform r), and, when asked, the log softmax of its raw row at that token
 * and the top entries (sl__logprobs in src/engine/detok.c). Only these few
 * numbers go back to the host, not the vocabulary-wide row. */
#define SL_KCU_SAMPLE_MAX_PEN  64   /* distinct tokens of a penalty window */
#define SL_KCU_SAMPLE_MAX_TOP  20   /* top logprobs */
#define SL_KCU_SAMPLE_MAX_SORT 1024 /* candidates the device sorts */

typedef struct sl_kcu_sample_params {
  float temperature; /* <= 0: greedy (argmax after the penalties) */
  int32_t top_k;     /* <= 0: off */
  float top_p;       /* >= 1: off */
  float min_p;       /* <= 0: off */
  float repeat_penalty, presence_penalty, frequency_penalty;
  int32_t n_pen; /* the window's distinct tokens and their counts */
  int32_t pen_id[SL_KCU_SAMPLE_MAX_PEN];
  int32_t pen_count[SL_KCU_SAMPLE_MAX_PEN];
  double r;      /* the uniform draw in [0, 1) (sl_sampler_draw) */
  int32_t n_top; /* < 0: no logprobs; else 0..SL_KCU_SAMPLE_MAX_TOP */
  int32_t row;   /* the logits row this sequence samples from */
} sl_kcu_sample_params;

typedef struct sl_kcu_sample_out {
  int32_t id;    /* the token; -1: the kept set reaches past the
                    SL_KCU_SAMPLE_MAX_SORT best, the host samples the row */
  float logprob; /* the raw row's log softmax at id (n_top >= 0) */
  int32_t top_id[SL_KCU_SAMPLE_MAX_TOP]; /* best first, lower id on a tie */
  float top_logprob[SL_KCU_SAMPLE_MAX_TOP];
} sl_kcu_sample_out;

size_t sl_kcu_sample_work_bytes(int n_seq, int64_t n_vocab);

/* params[n_seq] and out[n_seq] in device memory; logits (rows x n_vocab)
 * are not modified. One sequence's result does not depend on the others. */
sl_status sl_kcu_sample(void *stream, const float *logits, int64_t n_vocab,
                        int n_seq, const sl_kcu_sample_params *params,
                        sl_kcu_sample_out *out, void *work, size_t work_bytes);

/* Reads `bytes` (a multiple of 16) at `buf` once, as fast as the device
 * can (the bandwidth probe of `sluice bench model`); `sink` is a device
 * word it may write. (src/kern/cuda/bw.cu) */
sl_status sl_kcu_read_bench(void *stream, const void *buf, size_t bytes,
                            unsigned *sink);

/* ---- host side (src/kern/kern_cuda_host.c) ---- */

/* Page-locked host memory, so that a copy to or from it is asynchronous
 * (a copy into pageable memory blocks the host until the stream reaches
 * it). NULL when it cannot be had (or without CUDA). Free with
 * sl_kcu_host_free, only when no copy into or out of it is pending. */
void *sl_kcu_host_alloc(size_t bytes);
void sl_kcu_host_free(void *p);

/* Asynchronous copies on `stream`; `host` must be page-locked for the copy
 * to be truly asynchronous. */
sl_status sl_kcu_copy_h2d(void *stream, void *dev, const void *host, size_t n);
sl_status sl_kcu_copy_d2h(void *stream, void *host, const void *dev, size_t n);

/* CUDA graphs: the kernels enqueued on `stream` between capture_begin and
 * capture_end (by this thread) are recorded, not run, and become an
 * executable graph (*exec) that graph_launch replays on a stream. */
sl_status sl_kcu_capture_begin(void *stream);
sl_status sl_kcu_capture_end(void *stream, void **exec);
sl_status sl_kcu_graph_launch(void *exec, void *stream);
void sl_kcu_graph_free(void *exec);

/* Free and total memory of the current CUDA device, in bytes. */
sl_status sl_kcu_mem_info(uint64_t *free_bytes, uint64_t *total_bytes);

/* Tests only (the PDL rule of src/kern/cuda/pdl.cuh): one kernel, launched
 * as the forward pass's kernels are, that lets the next kernel start at
 * once, then spins `ms` milliseconds of device time and only then copies
 * src[0..n) to dst. A next kernel that reads dst before its pdl_wait() reads
 * the old values. */
sl_status sl__kcu_test_slow_copy(void *stream, float *dst, const float *src,
                                 int64_t n, double ms);

#ifdef __cplusplus
}
#endif

#endif
