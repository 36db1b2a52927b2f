/* Paged causal attention over an f16 KV cache (sl_kcu_attention), flash-
 * decoding style.
 *
 * Grid: (token, kv head x head chunk, split). A block of NW warps takes one
 * token, up to HG query heads of one GQA group (they share the K/V rows, so
 * each row is read once for the group, not once per head) and one split, a
 * range of positions of that token's causal prefix. Each warp walks the
 * split's positions U at a time (U rows of K and V in flight per warp hide
 * the latency of the paged, scattered loads); the lanes split head_dim (E =
 * head_dim / 32 contiguous elements each), so a K row is one coalesced
 * 2 * head_dim-byte read, the dot product a warp shuffle reduction. The
 * softmax is online in float, in base 2 (q is pre-multiplied by scale *
 * log2(e)): a running max and sum per head, per-lane accumulators of V. The
 * warps meet through shared memory at the end. With one split the block
 * writes `out`; with several it writes (unnormalized out, max, sum) per
 * (token, head, split) into `work`, and a second kernel combines the splits.
 *
 * Tokens [0, n_split_tok) (the engine's decode tokens) are split in fixed
 * chunks of SL_KCU_ATTN_CHUNK positions, the others (prompt tokens, many
 * per step) are not: how a token is cut depends on its own length alone,
 * so its result does not depend on the rest of the batch. Splits past a
 * token's own length return at once.
 *
 * Precision: q and the probabilities stay in float (the CPU reference rounds
 * both to f16, as ggml does), products and sums in float.
 */
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>

#include "cuda_status.h"
#include "pdl.cuh"
#include "sluice/kern_cuda.h"

namespace {

constexpr int NW = 4;                    /* warps per block */
constexpr int CHUNK = SL_KCU_ATTN_CHUNK; /* positions per split */
constexpr int MAX_HD = 256; /* head_dim: a multiple of 32 up to this */
constexpr float LOG2E = 1.4426950408889634f;

/* The most splits a token of max_len positions takes (>= 1). */
int n_split_for(int max_len) {
  int64_t n = ((int64_t)max_len + CHUNK - 1) / CHUNK;
  return n < 1 ? 1 : (int)n;
}

struct attn_params {
  const float *q;
  float *out;
  const uint16_t *k, *v;
  const int32_t *block_table, *seq_blk_off, *tok_seq, *tok_pos;
  float *wacc; /* (n_tok * n_head, n_split, hd): unnormalized out */
  float *wm;   /* (n_tok * n_head, n_split): running max, base 2 */
  float *wl;   /* (n_tok * n_head, n_split): sum of exp2(s - max) */
  int n_head, group, n_chunk, hd, kv_dim, block_tokens, chunk, n_split;
  int n_split_tok; /* tokens [0, n_split_tok) may be split */
  float qscale;    /* scale * log2(e) */
};

__device__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* f[0..E) = the E halves at p, in the widest loads that E's alignment allows
 * (p is a row start, 64-byte aligned, plus lane * E halves). */
template <int E> __device__ void load_h(const uint16_t *p, float (&f)[E]) {
  if constexpr (E % 8 == 0) {
#pragma unroll
    for (int j = 0; j < E / 8; j++) {
      uint4 u = ((const uint4 *)p)[j];
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; i++) {
        float2 x = __half22float2(*(const __half2 *)&w[i]);
        f[8 * j + 2 * i] = x.x;
        f[8 * j + 2 * i + 1] = x.y;
      }
    }
  } else if constexpr (E % 4 == 0) {
#pragma unroll
    for (int j = 0; j < E / 4; j++) {
      uint2 u = ((const uint2 *)p)[j];
      float2 a = __half22float2(*(const __half2 *)&u.x);
      float2 b = __half22float2(*(const __half2 *)&u.y);
      f[4 * j] = a.x;
      f[4 * j + 1] = a.y;
      f[4 * j + 2] = b.x;
      f[4 * j + 3] = b.y;
    }
  } else if constexpr (E % 2 == 0) {
#pragma unroll
    for (int j = 0; j < E / 2; j++) {
      uint32_t u = ((const uint32_t *)p)[j];
      float2 a = __half22float2(*(const __half2 *)&u);
      f[2 * j] = a.x;
      f[2 * j + 1] = a.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < E; j++)
      f[j] = __half2float(__ushort_as_half(p[j]));
  }
}

/* E = hd / 32 elements per lane, HG heads per block (those of the group from
 * h0 on; nh <= HG of them are real). */
template <int E, int HG>
__global__ void __launch_bounds__(NW * 32) attn_kernel(const attn_params P) {
  sl_kcu::pdl_wait(); /* pdl.cuh: nothing read or written before */
  sl_kcu::pdl_launch_dependents();
  constexpr int U = HG >= 8 ? 2 : 4; /* rows in flight per warp */
  __shared__ float s_m[NW][HG], s_l[NW][HG];
  __shared__ float s_acc[NW][HG][E * 32];

  const int t = blockIdx.x;
  const int kvh = blockIdx.y / P.n_chunk;
  const int h0 = kvh * P.group + (int)(blockIdx.y % P.n_chunk) * HG;
  const int nh = min(HG, (kvh + 1) * P.group - h0);
  const int split = blockIdx.z;
  const int len = P.tok_pos[t] + 1;
  /* a token's splits depend on its own length alone (fixed chunks), never
   * on the rest of the batch: its result is the same in any batch */
  const int my_ns = t < P.n_split_tok ? (len + P.chunk - 1) / P.chunk : 1;
  if (split >= my_ns)
    return;
  const int beg = my_ns == 1 ? 0 : split * P.chunk;
  const int end = my_ns == 1 ? len : min(len, beg + P.chunk);
  const int64_t row0 = (int64_t)t * P.n_head + h0; /* (token, head) row */

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t *bt = P.block_table + P.seq_blk_off[P.tok_seq[t]];
  const int64_t kv_off = (int64_t)kvh * P.hd + lane * E;

  float q[HG][E], acc[HG][E], m[HG], l[HG];
#pragma unroll
  for (int g = 0; g < HG; g++) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; e++) {
      q[g][e] =
          g < nh ? P.q[(row0 + g) * P.hd + lane * E + e] * P.qscale : 0.0f;
      acc[g][e] = 0.0f;
    }
  }

  for (int p0 = beg + warp * U; p0 < end; p0 += NW * U) {
    float k[U][E], v[U][E];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int p = p0 + u;
      if (p < end) {
        const int64_t slot = (int64_t)bt[p / P.block_tokens] * P.block_tokens +
                             p % P.block_tokens;
        const int64_t off = slot * P.kv_dim + kv_off;
        load_h<E>(P.k + off, k[u]);
        load_h<E>(P.v + off, v[u]);
      } else {
#pragma unroll
        for (int e = 0; e < E; e++)
          k[u][e] = v[u][e] = 0.0f; /* p = 0 must not meet garbage */
      }
    }
#pragma unroll
    for (int g = 0; g < HG; g++) {
      if (g >= nh) /* warp-uniform */
        break;
      float s[U];
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < U; u++) {
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++)
          d = fmaf(q[g][e], k[u][e], d);
        d = warp_sum(d);
        s[u] = p0 + u < end ? d : -INFINITY;
        mx = fmaxf(mx, s[u]);
      }
      /* mx is finite: row p0 < end is real */
      const float corr = exp2f(m[g] - mx); /* m = -inf: 0 */
      m[g] = mx;
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < E; e++)
        acc[g][e] *= corr;
#pragma unroll
      for (int u = 0; u < U; u++) {
        const float pu = exp2f(s[u] - mx);
        l[g] += pu;
#pragma unroll
        for (int e = 0; e < E; e++)
          acc[g][e] = fmaf(pu, v[u][e], acc[g][e]);
      }
    }
  }

  /* the warps' partial softmaxes, combined; a warp that had no position has
   * m = -inf and weight 0 */
#pragma unroll
  for (int g = 0; g < HG; g++) {
    if (lane == 0) {
      s_m[warp][g] = m[g];
      s_l[warp][g] = l[g];
    }
#pragma unroll
    for (int e = 0; e < E; e++)
      s_acc[warp][g][lane * E + e] = acc[g][e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nh * P.hd; i += blockDim.x) {
    const int g = i / P.hd, d = i % P.hd;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; w++)
      M = fmaxf(M, s_m[w][g]);
    float L = 0.0f, A = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; w++) {
      if (s_m[w][g] == -INFINITY)
        continue;
      const float f = exp2f(s_m[w][g] - M);
      L = fmaf(s_l[w][g], f, L);
      A = fmaf(s_acc[w][g][d], f, A);
    }
    if (my_ns == 1) {
      P.out[(row0 + g) * P.hd + d] = A / L;
    } else {
      const int64_t w = (row0 + g) * P.n_split + split;
      P.wacc[w * P.hd + d] = A;
      if (d == 0) {
        P.wm[w] = M;
        P.wl[w] = L;
      }
    }
  }
}

/* out of one (token, head) row from its splits: one block of hd threads. */
__global__ void attn_combine_kernel(const attn_params P) {
  sl_kcu::pdl_wait(); /* pdl.cuh: nothing read or written before */
  sl_kcu::pdl_launch_dependents();
  const int64_t row = blockIdx.x;
  const int d = threadIdx.x;
  const int len = P.tok_pos[row / P.n_head] + 1;
  const int my_ns = (len + P.chunk - 1) / P.chunk;
  if (my_ns == 1)
    return; /* written by attn_kernel */
  const float *wm = P.wm + row * P.n_split, *wl = P.wl + row * P.n_split;
  const float *wa = P.wacc + row * P.n_split * P.hd + d;
  float M = -INFINITY;
  for (int s = 0; s < my_ns; s++)
    M = fmaxf(M, wm[s]);
  float L = 0.0f, A = 0.0f;
  for (int s = 0; s < my_ns; s++) {
    const float ms = wm[s];
    if (ms == -INFINITY)
      continue;
    const float f = exp2f(ms - M);
    L = fmaf(wl[s], f, L);
    A = fmaf(wa[(int64_t)s * P.hd], f, A);
  }
  P.out[row * P.hd + d] = L > 0.0f ? A / L : 0.0f;
}

template <int E>
sl_status launch_e(int hg, dim3 grid, cudaStream_t s, const attn_params &p) {
  switch (hg) {
  case 1:
    return sl_kcu::launch(attn_kernel<E, 1>, grid, NW * 32, 0, s, p);
  case 2:
    return sl_kcu::launch(attn_kernel<E, 2>, grid, NW * 32, 0, s, p);
  case 4:
    return sl_kcu::launch(attn_kernel<E, 4>, grid, NW * 32, 0, s, p);
  default:
    if constexpr (E * 8 <= 32)
      return sl_kcu::launch(attn_kernel<E, 8>, grid, NW * 32, 0, s, p);
    return SL_ERR_INVALID_ARG; /* not reached: hg <= 32 / E (see above) */
  }
}

} // namespace

extern "C" size_t sl_kcu_attn_work_bytes(int n_tok, int n_head, int head_dim,
                                         int max_len) {
  if (n_tok < 1 || n_head < 1 || head_dim < 1 || max_len < 1)
    return 0;
  int ns = n_split_for(max_len);
  if (ns == 1)
    return 0;
  return (size_t)n_tok * (size_t)n_head * (size_t)ns * ((size_t)head_dim + 2) *
         sizeof(float);
}

extern "C" sl_status sl_kcu_attention(void *stream, const sl_kcu_attn *a) {
  if (!a || a->n_tok < 0)
    return SL_ERR_INVALID_ARG;
  if (a->n_tok == 0)
    return SL_OK;
  const int hd = a->head_dim;
  if (!a->q || !a->out || !a->k_layer || !a->v_layer || !a->block_table ||
      !a->seq_blk_off || !a->tok_seq || !a->tok_pos || hd < 32 || hd > MAX_HD ||
      hd % 32 != 0 || a->n_head < 1 || a->n_head_kv < 1 ||
      a->n_head % a->n_head_kv != 0 || a->kv_dim < a->n_head_kv * hd ||
      a->block_tokens < 1 || a->max_len < 1)
    return SL_ERR_INVALID_ARG;
  /* K/V rows are read in up to 16-byte pieces: rows start at multiples of
   * hd (a multiple of 32) halves from the layer's base, so the base and
   * kv_dim must keep that alignment */
  if (((uintptr_t)a->k_layer & 15) || ((uintptr_t)a->v_layer & 15) ||
      a->kv_dim % 8 != 0)
    return SL_ERR_INVALID_ARG;

  if (a->n_split_tok < 0 || a->n_split_tok > a->n_tok)
    return SL_ERR_INVALID_ARG;
  const int ns = n_split_for(a->max_len);
  const bool any_split = ns > 1 && a->n_split_tok > 0;
  const size_t need =
      any_split
          ? sl_kcu_attn_work_bytes(a->n_split_tok, a->n_head, hd, a->max_len)
          : 0;
  if (any_split && (!a->work || a->work_bytes < need))
    return SL_ERR_INVALID_ARG;
  if (ns > 65535)
    return SL_ERR_INVALID_ARG; /* grid z; needs a max_len past 16M */

  const int E = hd / 32;
  const int group = a->n_head / a->n_head_kv;
  const int hg_max = E <= 4 ? 8 : 4; /* q and acc: HG * E <= 32 per lane */
  int hg = 1;
  while (hg < group && hg < hg_max)
    hg *= 2;
  const int n_chunk = (group + hg - 1) / hg;
  if ((int64_t)a->n_head_kv * n_chunk > 65535)
    return SL_ERR_INVALID_ARG;

  attn_params p;
  p.q = a->q;
  p.out = a->out;
  p.k = a->k_layer;
  p.v = a->v_layer;
  p.block_table = a->block_table;
  p.seq_blk_off = a->seq_blk_off;
  p.tok_seq = a->tok_seq;
  p.tok_pos = a->tok_pos;
  const size_t rows = (size_t)a->n_split_tok * (size_t)a->n_head;
  p.wacc = any_split ? (float *)a->work : nullptr;
  p.wm = any_split ? p.wacc + rows * ns * hd : nullptr;
  p.wl = any_split ? p.wm + rows * ns : nullptr;
  p.n_split_tok = any_split ? a->n_split_tok : 0;
  p.n_head = a->n_head;
  p.group = group;
  p.n_chunk = n_chunk;
  p.hd = hd;
  p.kv_dim = a->kv_dim;
  p.block_tokens = a->block_tokens;
  p.chunk = CHUNK;
  p.n_split = any_split ? ns : 1;
  p.qscale = a->scale * LOG2E;

  cudaStream_t s = (cudaStream_t)stream;
  dim3 grid((unsigned)a->n_tok, (unsigned)(a->n_head_kv * n_chunk),
            (unsigned)p.n_split);
  sl_status st;
  switch (E) {
  case 1:
    st = launch_e<1>(hg, grid, s, p);
    break;
  case 2:
    st = launch_e<2>(hg, grid, s, p);
    break;
  case 3:
    st = launch_e<3>(hg, grid, s, p);
    break;
  case 4:
    st = launch_e<4>(hg, grid, s, p);
    break;
  case 5:
    st = launch_e<5>(hg, grid, s, p);
    break;
  case 6:
    st = launch_e<6>(hg, grid, s, p);
    break;
  case 7:
    st = launch_e<7>(hg, grid, s, p);
    break;
  default:
    st = launch_e<8>(hg, grid, s, p);
    break;
  }
  if (st != SL_OK || !any_split)
    return st;
  return sl_kcu::launch(attn_combine_kernel, (unsigned)rows, hd, 0, s, p);
}
