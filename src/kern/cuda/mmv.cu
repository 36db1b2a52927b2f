/* sluice — kern/cuda: the matrix-vector kernels (n <= SL_KCU_MMV_MAX_TOKENS
 * tokens), the decode path, which must read the weights at HBM speed.
 *
 * A block of 128 threads is split into row groups of TPR threads (32, 64 or
 * 128, by row length); each group computes R adjacent rows for all N tokens.
 * Its threads walk the row's units (dequant.cuh) with stride TPR, so a warp
 * reads a contiguous stretch of each row (coalesced), and they load the
 * units of all R rows before using any (R independent loads in flight per
 * thread). x is read through L1 (__ldg), once per unit for all R rows: R
 * rows per group divide the L1 traffic of x, which for N tokens is 4N bytes
 * per weight element against the 0.56 bytes of a Q4 weight. Partial sums
 * stay in registers (R x N), then a shuffle reduction per warp and one
 * through shared memory across the warps of a group.
 *
 * The arithmetic stays in f32 (more exact than the CPU path, which quantizes
 * x to 8 bits); the integer-to-float conversions use the exponent trick of
 * dequant.cuh and a group's scale is applied once per group when the type
 * has no min. Not done: quantizing x to q8_1 and __dp4a for the integer
 * formats (llama.cpp's mmvq), which cuts the ALU and L1 work per element
 * at large N, at the price of 8-bit activations; worth measuring.
 */
#include <cuda_runtime.h>

#include "dequant.cuh"
#include "mm_impl.cuh"

namespace sl_kcu {
namespace {

constexpr int kThreads = 128;

template <int GS> struct xvec;
template <> struct xvec<4> {
  static __device__ __forceinline__ void load(const float *p, float *v) {
    const float4 a = __ldg((const float4 *)p);
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
  }
};
template <> struct xvec<1> {
  static __device__ __forceinline__ void load(const float *p, float *v) {
    v[0] = __ldg(p);
  }
};

/* y[t][r] = dot(W row r, x[t]) for the R rows of each row group. */
template <class T, int N, int R>
__global__ void __launch_bounds__(kThreads)
    mmv_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t rows,
               int units, const float *__restrict__ x, int64_t cols,
               float *__restrict__ y, int tpr) {
  constexpr int GS = T::GS;
  const int grp = threadIdx.x / tpr, lt = threadIdx.x % tpr;
  const int64_t r0 = ((int64_t)blockIdx.x * (kThreads / tpr) + grp) * R;

  const uint8_t *wr[R];
#pragma unroll
  for (int r = 0; r < R; r++) /* rows past the end read the last row */
    wr[r] = w + (size_t)(r0 + r < rows ? r0 + r : rows - 1) * row_bytes;

  float acc[R][N];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < N; t++)
      acc[r][t] = 0.0f;

  if (r0 < rows) {
    /* two units in flight per thread where the registers allow */
#pragma unroll(N <= 2 ? 2 : 1)
    for (int i = lt; i < units; i += tpr) {
      const int b = i / T::UPB, u = i % T::UPB;
      typename T::raw raw[R];
#pragma unroll
      for (int r = 0; r < R; r++)
        T::load(wr[r] + (size_t)b * T::BYTES, u, raw[r]);
      const float *xb = x + (int64_t)b * T::QK;
#pragma unroll
      for (int g = 0; g < T::GPU; g++) {
        const int o = T::off(u, g);
        float xv[N][GS];
#pragma unroll
        for (int t = 0; t < N; t++)
          xvec<GS>::load(xb + t * cols + o, xv[t]);
#pragma unroll
        for (int r = 0; r < R; r++) {
          float q[GS], s, m;
          T::group(raw[r], u, g, q, s, m);
          if (T::KIND == K_MIN) {
#pragma unroll
            for (int e = 0; e < GS; e++)
              q[e] = fmaf(q[e], s, m);
          }
#pragma unroll
          for (int t = 0; t < N; t++) {
            if (T::KIND == K_SCALED) {
              float p = q[0] * xv[t][0];
#pragma unroll
              for (int e = 1; e < GS; e++)
                p = fmaf(q[e], xv[t][e], p);
              acc[r][t] = fmaf(s, p, acc[r][t]);
            } else {
#pragma unroll
              for (int e = 0; e < GS; e++)
                acc[r][t] = fmaf(q[e], xv[t][e], acc[r][t]);
            }
          }
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < N; t++)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
        acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);

  const int warps = tpr / 32; /* warps per row group */
  if (warps == 1) {
    if (lt == 0 && r0 < rows) {
#pragma unroll
      for (int r = 0; r < R; r++)
        if (r0 + r < rows)
#pragma unroll
          for (int t = 0; t < N; t++)
            y[t * rows + r0 + r] = acc[r][t];
    }
    return;
  }
  __shared__ float part[kThreads / 32][R * N];
  const int warp = threadIdx.x / 32;
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int t = 0; t < N; t++)
        part[warp][r * N + t] = acc[r][t];
  }
  __syncthreads();
  if (lt < R * N) {
    const int r = lt / N, t = lt % N;
    if (r0 + r < rows) {
      float s = 0.0f;
      for (int k = 0; k < warps; k++)
        s += part[grp * warps + k][lt];
      y[t * rows + r0 + r] = s;
    }
  }
}

template <class T, int N>
sl_status launch_n(cudaStream_t stream, const sl_kern_weight *w, const float *x,
                   float *y) {
  /* two rows per group for a single token keep more groups in flight
   * (latency hiding) while x's L1 traffic is still small; more tokens share
   * each x load across 4 rows */
  constexpr int R = N == 1 ? 2 : 4;
  const int64_t nb = w->cols / T::QK;
  const int units = (int)(nb * T::UPB);
  const size_t row_bytes = (size_t)nb * T::BYTES;
  /* at least ~2 units per thread where the row is long enough */
  const int tpr = units >= 256 ? 128 : units >= 128 ? 64 : 32;
  const int64_t groups = (w->rows + R - 1) / R;
  const int64_t per_block = kThreads / tpr;
  const int64_t blocks = (groups + per_block - 1) / per_block;
  if (blocks > 0x7fffffff)
    return SL_ERR_INVALID_ARG;
  mmv_kernel<T, N, R><<<(unsigned)blocks, kThreads, 0, stream>>>(
      (const uint8_t *)w->data, row_bytes, w->rows, units, x, w->cols, y, tpr);
  return launch_status();
}

template <class T>
sl_status launch(cudaStream_t stream, const sl_kern_weight *w, const float *x,
                 float *y, int n) {
  return for_tokens(n, [&](auto N) {
    return launch_n<T, decltype(N)::value>(stream, w, x, y);
  });
}

/* The 16-byte float path: rows of a multiple of 8 elements, data and x
 * 16-byte aligned. */
bool vec8_ok(const sl_kern_weight *w, const float *x) {
  return w->cols % 8 == 0 && (uintptr_t)w->data % 16 == 0 &&
         (uintptr_t)x % 16 == 0;
}

} // namespace

sl_status mmv(cudaStream_t stream, const sl_kern_weight *w, const float *x,
              float *y, int n) {
  switch (w->type) {
  case SL_GGML_F32:
    return vec8_ok(w, x) ? launch<f32w<8>>(stream, w, x, y, n)
                         : launch<f32w<1>>(stream, w, x, y, n);
  case SL_GGML_F16:
    return vec8_ok(w, x) ? launch<h16w<false, 8>>(stream, w, x, y, n)
                         : launch<h16w<false, 1>>(stream, w, x, y, n);
  case SL_GGML_BF16:
    return vec8_ok(w, x) ? launch<h16w<true, 8>>(stream, w, x, y, n)
                         : launch<h16w<true, 1>>(stream, w, x, y, n);
  case SL_GGML_Q4_0:
  case SL_GGML_Q4_1:
  case SL_GGML_Q8_0:
    return mmt_enabled() ? mmt_packed(stream, w, x, y, n)
                         : mmv_packed(stream, w, x, y, n);
  case SL_GGML_Q4_K:
    return launch<q4_k>(stream, w, x, y, n);
  case SL_GGML_Q5_K:
    return launch<q5_k>(stream, w, x, y, n);
  case SL_GGML_Q6_K:
    return launch<q6_k>(stream, w, x, y, n);
  case SL_GGML_Q5_0:
    return launch<q5_0>(stream, w, x, y, n);
  case SL_GGML_Q5_1:
    return launch<q5_1>(stream, w, x, y, n);
  case SL_GGML_IQ4_NL:
    return launch<iq4_nl>(stream, w, x, y, n);
  case SL_GGML_Q2_K:
    return launch<q2_k>(stream, w, x, y, n);
  case SL_GGML_Q3_K:
    return launch<q3_k>(stream, w, x, y, n);
  case SL_GGML_IQ4_XS:
    return launch<iq4_xs>(stream, w, x, y, n);
  default:
    return SL_ERR_UNSUPPORTED;
  }
}

} // namespace sl_kcu
