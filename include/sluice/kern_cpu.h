/* sluice — kern, CPU backend: kernels over quantized GGUF weights.
 *
 * Everything here works on host memory the caller owns; nothing is allocated
 * except by sl_kern_pool_create (the pool and its scratch space).
 *
 * Weight blocks follow ggml's layouts byte for byte, so rows of a GGUF tensor
 * (ne[0] = cols contiguous elements per row) are passed as they lie in the
 * mapping:
 *   Q4_0  32 elems, 18 B: f16 d, u8 qs[16]          x = (q - 8) * d
 *   Q4_1  32 elems, 20 B: f16 d, f16 m, u8 qs[16]   x = q * d + m
 *   Q8_0  32 elems, 34 B: f16 d, i8 qs[32]           x = q * d
 *   Q4_K 256 elems, 144 B; Q5_K 256 elems, 176 B; Q6_K 256 elems, 210 B
 *   Q2_K 256 elems, 84 B; Q3_K 256 elems, 110 B; IQ4_XS 256 elems, 136 B
 *   F32, F16, BF16: one element per "block".
 *
 * Matmul quantizes the activations first, as ggml does (its vec_dot_type):
 * Q8_0 for Q4_0 and Q8_0 weights, Q8_1 (f16 d, f16 s = d * sum q, i8 qs[32])
 * for Q4_1, Q8_K (f32 d, i8 qs[256], i16 bsums[16]) for the K-quants and
 * IQ4_XS; F32, F16 and BF16 weights take the f32 activations as they are. Q8_0
 * / Q8_1 follow ggml's x86 quantizers (scale 127 / amax, round half to even)
 * and the AVX2 Q4_0 / Q4_1 / Q8_0 dots sum their blocks in ggml's order, so on
 * AVX2 these results equal llama.cpp's bit for bit (rmsnorm and rope likewise).
 *
 * SIMD is chosen at run time, the first level this CPU has of: avx512vnni
 * (AVX-512 F+BW+VL+DQ and AVX512_VNNI: the 32-element block types' dots and
 * gemm tiles on vpdpbusd), avx512, avxvnni (AVX2 and the VEX AVX-VNNI:
 * the same vpdpbusd kernels, VEX-encoded), avx2 (AVX2+FMA+F16C), scalar. The
 * env var SLUICE_ISA=scalar|avx2|avx512|avxvnni|avx512vnni (old name
 * SLUICE_CPU_ISA, read when SLUICE_ISA is unset) caps the level chosen at the
 * first kernel call; a level this CPU lacks, or an unknown name, is logged and
 * the best level the CPU has below it is used (avx512vnni -> avx512 -> avx2,
 * avxvnni -> avx2, then scalar). Test harnesses must not rely on that
 * fallback: they read sl_kern_cpu_isa_requested() and compare it with
 * sl_kern_cpu_isa(). Every ISA gives the same results as the scalar reference
 * up to float summation order; the VNNI levels give their base level's (avx2's
 * quantized dots) bit for bit.
 *
 * Threading: every kernel may run on any thread at once with others; a pool
 * runs one job at a time (see sl_kern_pool_run).
 */
#ifndef SLUICE_KERN_CPU_H
#define SLUICE_KERN_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice/ggml_type.h"
#include "sluice/status.h"

/* ---- ISA selection ---------------------------------------------------------
 */

typedef enum sl_kern_isa {
  SL_KERN_ISA_SCALAR = 0,
  SL_KERN_ISA_AVX2 = 1,       /* AVX2 + FMA + F16C */
  SL_KERN_ISA_AVX512 = 2,     /* the AVX2 set + AVX-512 F, BW, VL, DQ */
  SL_KERN_ISA_AVXVNNI = 3,    /* the AVX2 set + AVX-VNNI (VEX vpdpbusd) */
  SL_KERN_ISA_AVX512VNNI = 4, /* the AVX512 set + AVX512_VNNI */
} sl_kern_isa;
#define SL_KERN_ISA_COUNT 5 /* values 0 .. SL_KERN_ISA_COUNT - 1 */

/* The level the kernels use now (chosen on first use: the best this CPU has,
 * capped by SLUICE_ISA). */
sl_kern_isa sl_kern_cpu_isa(void);

/* The level SLUICE_ISA (else SLUICE_CPU_ISA) names: SL_OK with *isa set,
 * SL_ERR_NOT_FOUND when neither is set (or both are empty),
 * SL_ERR_INVALID_ARG when the value is not one of sl_kern_isa_name's. Says
 * nothing about whether this CPU can run it (sl_kern_cpu_isa_supported). */
sl_status sl_kern_cpu_isa_requested(sl_kern_isa *isa);

/* True when this CPU (and OS) can run `isa`. */
bool sl_kern_cpu_isa_supported(sl_kern_isa isa);

/* Switches every kernel to `isa`. SL_ERR_UNSUPPORTED when the CPU lacks it,
 * SL_ERR_INVALID_ARG for an unknown value. For tests and benchmarks: call it
 * while no kernel runs on any thread. */
sl_status sl_kern_cpu_set_isa(sl_kern_isa isa);

/* "scalar", "avx2", "avx512", "avxvnni", "avx512vnni" ("?" for an unknown
 * value). */
const char *sl_kern_isa_name(sl_kern_isa isa);

/* ---- types ------------------------------------------------------------------
 */

/* Block size in elements and bytes of each type these kernels read or write
 * (F32 F16 BF16 Q4_0 Q4_1 Q8_0 Q8_1 Q4_K Q5_K Q6_K Q8_K, Q2_K Q3_K IQ4_XS).
 * Returns false for other types. */
bool sl_kern_type_block(sl_ggml_type t, int64_t *block_elems,
                        size_t *block_bytes);

/* Bytes of a row of `n` elements of type t: SL_ERR_UNSUPPORTED for a type not
 * listed above, SL_ERR_INVALID_ARG when n < 0 or not a multiple of the block
 * size. */
sl_status sl_kern_row_bytes(sl_ggml_type t, int64_t n, size_t *out);

/* Dequantizes `n` elements (a multiple of the block size) of type t (F32 F16
 * BF16 Q4_0 Q4_1 Q8_0 Q4_K Q5_K Q6_K Q2_K Q3_K IQ4_XS, and Q8_0/Q8_1/Q8_K
 * activations) from `src` into dst[n]. Returns SL_ERR_UNSUPPORTED or
 * SL_ERR_INVALID_ARG as sl_kern_row_bytes does, and writes nothing then. */
sl_status sl_kern_dequant_row(sl_ggml_type t, const void *src, float *dst,
                              int64_t n);

/* The activation type that matmul against weights of type wt quantizes to
 * (SL_GGML_Q8_0, Q8_1, Q8_K, or SL_GGML_F32 for float weights). Returns
 * SL_ERR_UNSUPPORTED for a weight type matmul does not handle. */
sl_status sl_kern_act_type(sl_ggml_type wt, sl_ggml_type *act);

/* Quantizes x[n] into `dst` (sl_kern_row_bytes(act, n) bytes) as activation
 * type `act` (Q8_0, Q8_1 or Q8_K, n a multiple of its block; F32 copies).
 * Errors as sl_kern_row_bytes. */
sl_status sl_kern_quantize_act(sl_ggml_type act, const float *x, void *dst,
                               int64_t n);

/* *out = dot(w_row, x_act) over n elements: w_row of type wt, x_act already
 * quantized to sl_kern_act_type(wt). Errors as sl_kern_row_bytes. */
sl_status sl_kern_vec_dot(sl_ggml_type wt, int64_t n, const void *w_row,
                          const void *x_act, float *out);

/* ---- thread pool ------------------------------------------------------------
 */

typedef struct sl_kern_pool sl_kern_pool_t;

/* Starts n_threads - 1 persistent workers (the caller of sl_kern_pool_run is
 * thread 0). n_threads <= 0 means one per online CPU. Returns NULL when memory
 * or a thread cannot be had. Free with sl_kern_pool_destroy. */
sl_kern_pool_t *sl_kern_pool_create(int n_threads);

/* Stops and joins the workers and frees the pool. NULL is a no-op. No job may
 * be running. */
void sl_kern_pool_destroy(sl_kern_pool_t *pool);

int sl_kern_pool_n_threads(const sl_kern_pool_t *pool);

/* Runs fn(ctx, ith, nth) for ith = 0..nth-1, one per thread, the calling
 * thread taking ith = 0, and returns when all have returned. Workers spin a
 * little between jobs, then sleep. One job at a time per pool: a pool belongs
 * to one calling thread at a time. pool NULL runs fn(ctx, 0, 1). */
void sl_kern_pool_run(sl_kern_pool_t *pool,
                      void (*fn)(void *ctx, int ith, int nth), void *ctx);

/* ---- matmul
 * ------------------------------------------------------------------ */

/* A weight matrix: `rows` rows of `cols` elements of type `type`, each row
 * sl_kern_row_bytes(type, cols) bytes, rows contiguous (GGUF: ne[0] = cols,
 * ne[1] = rows). `data` is borrowed. `packed`: NULL, or the copy
 * sl_kern_repack wrote for this matrix (borrowed too: whoever called
 * sl_kern_repack owns and frees it); matmul uses it where the ISA in use has
 * a packed kernel for the type, `data` otherwise, so `data` must stay valid
 * either way. Positional initializers of the first four members leave it
 * NULL. */
typedef struct sl_kern_weight {
  sl_ggml_type type;
  int64_t rows;
  int64_t cols;
  const void *data;
  const void *packed;
} sl_kern_weight;

/* ---- repacked weights
 * --------------------------------------------------------
 *
 * Where the ISA in use has a kernel for it (the avx2 and avx512 levels:
 * Q4_0, Q8_0, Q5_0, IQ4_NL, Q4_K, Q6_K; not the VNNI levels, which keep
 * their own tiles), a matrix can be copied once, at load, into groups
 * of 8 rows whose blocks interleave: per block position (32 elements, or a
 * 256-element super-block), the 8 rows' f16 scales together (the K-quants'
 * 6-bit / int8 sub-block scales and mins unpacked to bytes), then their
 * quants in 4-byte runs, so that one 256-bit load feeds 8 rows. The last
 * group is padded with zero rows. The copy takes the bytes of the rows
 * rounded up to a multiple of 8, except for the K-quants: 148 bytes per
 * row and super-block for Q4_K (GGUF: 144), 274 for Q6_K (GGUF: 210; its
 * 6-bit quants are stored whole, one signed byte each). Every
 * product (row, token) then sums its blocks in one fixed order, whatever the
 * number of tokens in the call; it is not the unpacked dot's order (the
 * results agree within float rounding, not bit for bit). */

/* The bytes sl_kern_repack needs for W under the ISA in use; 0 when there is
 * no packed kernel for W's type there (the scalar level never has one), W's
 * cols are not a multiple of its block (32, or 256 for the K-quants), or
 * SLUICE_REPACK=0 is set in the environment: then do not repack. */
size_t sl_kern_repack_bytes(const sl_kern_weight *W);

/* Writes the packed copy of W (W->data) into dst[bytes], bytes >=
 * sl_kern_repack_bytes(W) > 0. The caller then sets W->packed = dst and owns
 * dst. SL_ERR_UNSUPPORTED when sl_kern_repack_bytes(W) is 0,
 * SL_ERR_INVALID_ARG when bytes is too small. Thread-safe; reads W->data
 * only. */
sl_status sl_kern_repack(const sl_kern_weight *W, void *dst, size_t bytes);

/* Rows per group of a packed copy: matrices of the same type and cols whose
 * rows are multiples of it pack, one after the other, into exactly the
 * packed copy of the matrix they stack into (their rows concatenated). */
#define SL_KERN_PACK_ROWS 8

/* True when sl_kern_matmul on W, at the ISA in use, reads W->packed and
 * never W->data: a matrix that exists only as a packed copy (data NULL) may
 * be multiplied exactly when this holds. */
bool sl_kern_packed_in_use(const sl_kern_weight *W);

/* Y[t][r] = sum_k W[r][k] * X[t][k] for t < n_tokens, r < W->rows:
 * X is [n_tokens][cols] f32, Y is [n_tokens][rows] f32, both contiguous and
 * not overlapping. Rows are split across the pool's threads (pool may be NULL:
 * the caller alone); tokens are processed in tiles so that each weight block
 * is loaded once per tile. Uses the pool's scratch space, so it must not run
 * on the same pool from two threads.
 * Returns SL_ERR_UNSUPPORTED for a weight type it does not handle,
 * SL_ERR_INVALID_ARG for bad sizes (cols not a multiple of the block size,
 * negative counts), SL_ERR_NOMEM when scratch space cannot grow. */
sl_status sl_kern_matmul(sl_kern_pool_t *pool, const sl_kern_weight *W,
                         const float *X, float *Y, int64_t n_tokens);

/* Up to SL_KERN_MATMUL_PARTS_MAX products of one X (q, k, v; gate, up):
 * Y[i] = W[i] X as sl_kern_matmul computes it, bit for bit, with X
 * quantized once per activation type and one fork and join of the pool for
 * them all (a thread that finds one product's rows taken goes on to the
 * next). Every W[i] has the same cols; the Y[i] do not overlap X or one
 * another. */
#define SL_KERN_MATMUL_PARTS_MAX 4
sl_status sl_kern_matmul_parts(sl_kern_pool_t *pool,
                               const sl_kern_weight *const *W, int n_parts,
                               const float *X, float *const *Y,
                               int64_t n_tokens);

/* One product of a grouped call: Y = W X, X [n_tokens][W->cols], Y
 * [n_tokens][W->rows]. */
typedef struct sl_kern_matmul_op {
  const sl_kern_weight *W;
  const float *X;
  float *Y;
  int64_t n_tokens;
} sl_kern_matmul_op;

/* Independent products Y[i] = W[i] X[i], each as sl_kern_matmul computes
 * it, bit for bit, with one fork and join of the pool for the activations'
 * quantization (ops whose X, activation type and size are the same share
 * one) and one for all the products (a thread that finds one product's rows
 * taken goes on to the next): a mixture-of-experts layer's experts, each
 * over the tokens routed to it, in two pool runs instead of two per
 * expert. Ops with no tokens are skipped; no Y overlaps an X or another
 * Y. SL_ERR_NOMEM when the op list or the scratch space cannot be had. */
sl_status sl_kern_matmul_grouped(sl_kern_pool_t *pool,
                                 const sl_kern_matmul_op *ops, int n_ops);

/* ---- small ops (all vectorized; out may alias an input) --------------------
 */

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * (w ? w[i] : 1). */
void sl_kern_rmsnorm(float *out, const float *x, const float *w, int64_t n,
                     float eps);

typedef enum sl_kern_rope_mode {
  SL_KERN_ROPE_NORM = 0, /* llama.cpp LLAMA_ROPE_TYPE_NORM: pairs (2i, 2i+1) */
  SL_KERN_ROPE_NEOX = 2, /* LLAMA_ROPE_TYPE_NEOX: pairs (i, i + n_rot/2) */
} sl_kern_rope_mode;

/* Rotates, in place, the first n_rot dims of each of n_heads heads of
 * head_dim floats (x is [n_heads][head_dim]) for position `pos`:
 * theta_i = pos * freq_scale * freq_base^(-2i/n_rot), computed in float as
 * ggml does (theta_0 = pos, theta_{i+1} = theta_i * freq_base^(-2/n_rot)), so
 * the angle carries a relative error of about (i + 1) float ulps.
 * SL_ERR_INVALID_ARG when
 * n_rot is odd, > head_dim, > 4096, or a size is negative. */
sl_status sl_kern_rope(float *x, int64_t n_heads, int64_t head_dim,
                       int64_t n_rot, int64_t pos, float freq_base,
                       float freq_scale, sl_kern_rope_mode mode);

/* In-place softmax of x[n] (n >= 1), max-subtracted. */
void sl_kern_softmax(float *x, int64_t n);

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). */
void sl_kern_swiglu(float *out, const float *gate, const float *up, int64_t n);

/* out[i] = a[i] + b[i]. */
void sl_kern_add(float *out, const float *a, const float *b, int64_t n);

/* dst[i] = src[i] as IEEE half, rounded to nearest even (as F16C). */
void sl_kern_f32_to_f16(uint16_t *dst, const float *src, int64_t n);

/* ---- attention
 * --------------------------------------------------------------- */

#define SL_KERN_ATTN_MAX_HEAD_DIM 1024

/* One query head of causal attention over one sequence's f16 KV cache:
 *   s_p = dot(q, k_p) * scale, a = softmax(s), out = sum_p a_p * v_p
 * for p < len, where k_p = k + p * kv_stride and v_p = v + p * kv_stride
 * (head_dim halves each; kv_stride in elements).
 *
 * The arithmetic is that of ggml's CPU attention without flash attention, as
 * llama.cpp runs it by default: q is rounded to f16 (the f16 matmul's
 * activation type), the products are summed in float, the softmax sums in
 * double, and the probabilities are rounded to f16 before the weighted sum
 * of V, which is in float. ggml sums its dot products in one order when a
 * step evaluates several tokens (its gemm) and in another when it evaluates
 * one (its gemv); `single` picks the second. Summing in the same order keeps
 * the result bit-for-bit with llama.cpp on most inputs, which matters because
 * the next activation quantization amplifies last-bit differences.
 *
 * out[head_dim] must not overlap q; scratch holds `len` rounded up to a
 * multiple of 32 floats. Returns SL_ERR_INVALID_ARG for a NULL pointer,
 * head_dim outside 1..SL_KERN_ATTN_MAX_HEAD_DIM, len < 1 or
 * kv_stride < head_dim (and writes nothing then). */
sl_status sl_kern_attn_f16(float *out, const float *q, const uint16_t *k,
                           const uint16_t *v, int64_t head_dim, int64_t len,
                           int64_t kv_stride, float scale, bool single,
                           float *scratch);

/* The same over a paged KV cache: row p of K is
 * kb[p >> block_shift] + (p & ((1 << block_shift) - 1)) * kv_stride, and of V
 * likewise from vb (blocks of 2^block_shift rows; 0 <= block_shift <= 62).
 * kb and vb must hold a pointer for every block that [0, len) touches. The
 * arithmetic, and so the result, is that of sl_kern_attn_f16 on the same
 * rows laid out contiguously. */
sl_status sl_kern_attn_f16_paged(float *out, const float *q,
                                 const uint16_t *const *kb,
                                 const uint16_t *const *vb, int block_shift,
                                 int64_t head_dim, int64_t len,
                                 int64_t kv_stride, float scale, bool single,
                                 float *scratch);

#endif
