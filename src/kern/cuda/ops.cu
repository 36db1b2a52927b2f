/* The small CUDA ops of the forward pass (sluice/kern_cuda.h): rmsnorm, add,
 * add_bias, swiglu, rope, kv_store and argmax.
 *
 * Each is one launch on the caller's stream; nothing here waits, allocates or
 * touches the legacy default stream. The arithmetic follows the CPU kernels
 * (src/kern/cpu/kern_cpu_scalar.c) operation for operation where that is
 * cheap (swiglu, rope's angles and rotation), so that the results differ by
 * a few ulps at most; rmsnorm sums its squares in float (the CPU: double).
 * The build has no --use_fast_math: expf, sinf, cosf and division are the
 * accurate ones.
 */
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>

#include "cuda_status.h"
#include "pdl.cuh"
#include "sluice/kern_cuda.h"

namespace {

bool aligned16(const void *p) {
  return ((uintptr_t)p & 15) == 0;
}

/* Grid size for a grid-stride loop over n items of `threads` each. */
unsigned grid_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

/* ---- rmsnorm ----------------------------------------------------------- */

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* The block's sum of v: each warp's tree, then the warps in order (part:
 * blockDim.x / 32 floats of shared memory); every thread gets it. */
__device__ float block_sum(float v, float *part) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0)
    part[threadIdx.x / 32] = v;
  __syncthreads();
  float tot = 0.0f;
  for (int i = 0; i < (int)blockDim.x / 32; i++)
    tot += part[i];
  return tot;
}

/* Rows up to 1024 wide (q/k norm: head_dim): one warp per row, 4 rows per
 * block. Each lane reads and writes the same elements in both passes, so y
 * may equal x. */
__global__ void rmsnorm_warp_kernel(float *y, const float *x, const float *w,
                                    int64_t rows, int width, float eps) {
  sl_kcu::pdl_wait(); /* pdl.cuh: nothing read or written before */
  sl_kcu::pdl_launch_dependents();
  int64_t r = (int64_t)blockIdx.x * 4 + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (r >= rows)
    return;
  const float *xr = x + r * width;
  float ss = 0.0f;
  for (int i = lane; i < width; i += 32)
    ss += xr[i] * xr[i];
  ss = warp_sum(ss);
  float scale = 1.0f / sqrtf(ss / (float)width + eps);
  float *yr = y + r * width;
  for (int i = lane; i < width; i += 32)
    yr[i] = xr[i] * scale * (w ? w[i] : 1.0f);
}

/* Wider rows: one block of 256 threads per row, float4 when aligned. */
__global__ void rmsnorm_block_kernel(float *y, const float *x, const float *w,
                                     int64_t width, float eps, bool vec) {
  sl_kcu::pdl_wait(); /* pdl.cuh: nothing read or written before */
  sl_kcu::pdl_launch_dependents();
  __shared__ float part[8];
  const float *xr = x + (int64_t)blockIdx.x * width;
  float *yr = y + (int64_t)blockIdx.x * width;
  float ss = 0.0f;
  if (vec) {
    const float4 *x4 = (const float4 *)xr;
    for (int64_t i = threadIdx.x; i < width / 4; i += blockDim.x) {
      float4 v = x4[i];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
      ss += xr[i] * xr[i];
  }
  const float tot = block_sum(ss, part);
  float scale = 1.0f / sqrtf(tot / (float)width + eps);
  if (vec) {
    const float4 *x4 = (const float4 *)xr;
    const float4 *w4 = (const float4 *)w;
    float4 *y4 = (float4 *)yr;
    for (int64_t i = threadIdx.x; i < width / 4; i += blockDim.x) {
      float4 v = x4[i];
      float4 g = w ? w4[i] : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
      y4[i] = make_float4(v.x * scale * g.x, v.y * scale * g.y,
                          v.z * scale * g.z, v.w * scale * g.w);
    }
  } else {
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
      yr[i] = xr[i] * scale * (w ? w[i] : 1.0f);
  }
}

/* ---- elementwise ------------------------------------------------------- */

__global__ void add_kernel(float *y, const float *a, const float *b, int64_t n,
                           bool vec) {
  sl_kcu::pdl_wait(); /* pdl.cuh: nothing read or written before */
  sl_kcu::pdl_launch_dependents();
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (vec) {
    for (int64_t i = i0; i < n / 4; i += stride) {
      float4 u = ((const float4 *)a)[i], v = ((const float4 *)b)[i];
      ((float4 *)y)[i] =
          make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
    }
    for (int64_t i = n / 4 * 4 + i0; i < n; i += stride)
      y[i] = a[i] + b[i];
  } else {
    for (int64_t i = i0; i < n; i += stride)
      y[i] = a[i] + b[i];
  }
}

/* One block row per grid row; columns strided by the block. */
__global__ void add_bias_kernel(float *y, const float *bias, int64_t rows,
                                int64_t width) {
  sl_kcu::pdl_wait(); /* pdl.cuh: nothing read or written before */
  sl_kcu::pdl_launch_dependents();
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float *yr = y + r * width;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x)
      yr[c] += bias[c];
  }
}

/* silu(g) * u as the CPU writes it: g / (1 + expf(-g)) * u. */
__device__ float swiglu1(float g, float u) {
  return g / (1.0f + expf(-g)) * u;
}

__global__ void swiglu_kernel(float *y, const float *g, const float *u,
                              int64_t n, bool vec) {
  sl_kcu::pdl_wait(); /* pdl.cuh: nothing read or written before */
  sl_kcu::pdl_launch_dependents();
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (vec) {
    for (int64_t i = i0; i < n / 4; i += stride) {
      float4 a = ((const float4 *)g)[i], b = ((const float4 *)u)[i];
      ((float4 *)y)[i] = make_float4(swiglu1(a.x, b.x), swiglu1(a.y, b.y),
                                     swiglu1(a.z, b.z), swiglu1(a.w, b.w));
    }
    for (int64_t i = n / 4 * 4 + i0; i < n; i += stride)
      y[i] = swiglu1(g[i], u[i]);
  } else {
    for (int64_t i = i0; i < n; i += stride)
      y[i] = swiglu1(g[i], u[i]);
  }
}

/* ---- rope -------------------------------------------------------------- */

/* The angles of one token into cs (cos) and sn (sin), half each. */
__device__ void rope_angles(float *cs, float *sn, float p, int half,
                            float theta_scale, float freq_scale) {
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float theta = p;
    for (int j = 0; j < i; j++)
      theta *= theta_scale;
    float th = freq_scale * theta;
    cs[i] = cosf(th);
    sn[i] = sinf(th);
  }
}

/* One block per token. The angles as sl_kern_rope computes them: theta_0 =
 * pos, theta_{i+1} = theta_i * theta_scale (theta_scale = powf(base,
 * -2/n_rot), computed on the host by the same libm call as the CPU), angle
 * freq_scale * theta_i; the product is repeated rather than replaced by a
 * power so that the angle is the CPU's bit for bit; only sinf/cosf may
 * differ (CUDA: 2 ulp). The rotation is the CPU's two fmaf. */
__global__ void rope_kernel(float *x, const int32_t *pos, int n_head,
                            int head_dim, int n_rot, float theta_scale,
                            float freq_scale, bool neox) {
  sl_kcu::pdl_wait(); /* pdl.cuh: nothing read or written before */
  sl_kcu::pdl_launch_dependents();
  extern __shared__ float cs_sn[]; /* cos [half], sin [half] */
  const int half = n_rot / 2;
  const int t = blockIdx.x;
  float *cs = cs_sn, *sn = cs_sn + half;
  rope_angles(cs, sn, (float)pos[t], half, theta_scale, freq_scale);
  __syncthreads();
  float *xt = x + (int64_t)t * n_head * head_dim;
  for (int k = threadIdx.x; k < n_head * half; k += blockDim.x) {
    int h = k / half, i = k % half;
    float *v = xt + (int64_t)h * head_dim;
    int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    float x0 = v[a], x1 = v[b];
    v[a] = fmaf(x0, cs[i], -(x1 * sn[i]));
    v[b] = fmaf(x0, sn[i], x1 * cs[i]);
  }
}

/* ---- kv_store ---------------------------------------------------------- */

/* One block per token: its K and V rows, f32 -> f16 round to nearest even,
 * 4 at a time when kv_dim % 4 == 0 (then rows are 8-byte aligned). A negative
 * slot is skipped (a padding token). */
__global__ void kv_store_kernel(uint16_t *kc, uint16_t *vc, const float *k,
                                const float *v, const int32_t *slot, int kv_dim,
                                bool vec) {
  sl_kcu::pdl_wait(); /* pdl.cuh: nothing read or written before */
  sl_kcu::pdl_launch_dependents();
  const int t = blockIdx.x;
  const int32_t s = slot[t];
  if (s < 0)
    return;
  const float *kr = k + (int64_t)t * kv_dim, *vr = v + (int64_t)t * kv_dim;
  uint16_t *kd = kc + (int64_t)s * kv_dim, *vd = vc + (int64_t)s * kv_dim;
  if (vec) {
    for (int i = threadIdx.x; i < kv_dim / 4; i += blockDim.x) {
      float4 a = ((const float4 *)kr)[i], b = ((const float4 *)vr)[i];
      __half2 a0 = __floats2half2_rn(a.x, a.y),
              a1 = __floats2half2_rn(a.z, a.w);
      __half2 b0 = __floats2half2_rn(b.x, b.y),
              b1 = __floats2half2_rn(b.z, b.w);
      uint2 ka, va;
      ka.x = *(const uint32_t *)&a0;
      ka.y = *(const uint32_t *)&a1;
      va.x = *(const uint32_t *)&b0;
      va.y = *(const uint32_t *)&b1;
      ((uint2 *)kd)[i] = ka;
      ((uint2 *)vd)[i] = va;
    }
  } else {
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
      kd[i] = __half_as_ushort(__float2half_rn(kr[i]));
      vd[i] = __half_as_ushort(__float2half_rn(vr[i]));
    }
  }
}

/* ---- fused: add + rmsnorm, rope + kv_store ------------------------------ */

/* x[r] += d[r], then y[r] = rmsnorm(x[r]) * w: the residual add of one
 * sublayer and the norm of the next in one launch, x read once. One block a
 * row, each thread keeping up to K float4 of it in registers (width <=
 * 4 K blockDim.x); the sum of squares: each thread's in order, then the warp
 * tree, then the warps in order (a row's result does not depend on the rows
 * beside it). */
template <int K>
__global__ void add_rmsnorm_kernel(float *x, float *y, const float *d,
                                   const float *w, int width, float eps) {
  sl_kcu::pdl_wait(); /* pdl.cuh: nothing read or written before */
  sl_kcu::pdl_launch_dependents();
  __shared__ float part[32];
  const int64_t r = blockIdx.x;
  float4 *x4 = (float4 *)(x + r * width);
  const float4 *d4 = (const float4 *)(d + r * width);
  float4 *y4 = (float4 *)(y + r * width);
  const float4 *w4 = (const float4 *)w;
  const int n4 = width / 4;
  float4 v[K];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < K; j++) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < n4) {
      const float4 a = x4[i], b = d4[i];
      v[j] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
      x4[i] = v[j];
      ss +=
          v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
  }
  const float tot = block_sum(ss, part);
  const float scale = 1.0f / sqrtf(tot / (float)width + eps);
#pragma unroll
  for (int j = 0; j < K; j++) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < n4) {
      const float4 g = w ? w4[i] : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
      y4[i] = make_float4(v[j].x * scale * g.x, v[j].y * scale * g.y,
                          v[j].z * scale * g.z, v[j].w * scale * g.w);
    }
  }
}

/* rope_kernel on q and k of one token, then kv_store_kernel's f16 rows of
 * the rotated k and of v: the same arithmetic, one launch instead of three
 * (q and k keep their rotated f32 values, as after sl_kcu_rope). */
__global__ void rope_kv_kernel(float *q, float *k, const float *v,
                               const int32_t *pos, const int32_t *slot,
                               int n_head, int n_head_kv, int head_dim,
                               int n_rot, float theta_scale, float freq_scale,
                               bool neox, uint16_t *kc, uint16_t *vc) {
  sl_kcu::pdl_wait(); /* pdl.cuh: nothing read or written before */
  sl_kcu::pdl_launch_dependents();
  extern __shared__ float cs_sn[];
  const int half = n_rot / 2, t = blockIdx.x;
  float *cs = cs_sn, *sn = cs_sn + half;
  rope_angles(cs, sn, (float)pos[t], half, theta_scale, freq_scale);
  __syncthreads();
  const int nq = n_head * half, nk = n_head_kv * half;
  float *qt = q + (int64_t)t * n_head * head_dim;
  float *kt = k + (int64_t)t * n_head_kv * head_dim;
  for (int e = threadIdx.x; e < nq + nk; e += blockDim.x) {
    const bool isk = e >= nq;
    const int kk = isk ? e - nq : e, h = kk / half, i = kk % half;
    float *vv = (isk ? kt : qt) + (int64_t)h * head_dim;
    int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    float x0 = vv[a], x1 = vv[b];
    vv[a] = fmaf(x0, cs[i], -(x1 * sn[i]));
    vv[b] = fmaf(x0, sn[i], x1 * cs[i]);
  }
  __syncthreads(); /* the rotated k is whole */
  const int32_t s = slot[t];
  if (s < 0)
    return;
  const int kv_dim = n_head_kv * head_dim;
  const float *vt = v + (int64_t)t * kv_dim;
  uint16_t *kd = kc + (int64_t)s * kv_dim, *vd = vc + (int64_t)s * kv_dim;
  for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
    kd[i] = __half_as_ushort(__float2half_rn(kt[i]));
    vd[i] = __half_as_ushort(__float2half_rn(vt[i]));
  }
}

/* ---- argmax ------------------------------------------------------------ */

/* A running (max, index, sum of exp(x - max)) over a part of a row. */
struct amax {
  float m;
  int64_t i;
  float s;
};

/* Adds element x at index i, indices arriving in increasing order: a strict
 * > keeps the lowest index of a tie; -inf adds nothing to the sum (and NaN
 * never wins, as in the CPU's `>` scan). */
__device__ void amax_add(amax &a, float x, int64_t i) {
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.0f; /* a.m = -inf: 0 * 0 + 1 */
    a.m = x;
    a.i = i;
  } else if (x > -INFINITY) {
    a.s += expf(x - a.m);
  }
}

/* Combines two parts: the larger max wins, the lower index on a tie. */
__device__ amax amax_merge(amax a, amax b) {
  if (b.m > a.m || (b.m == a.m && b.i < a.i)) {
    amax t = a;
    a = b;
    b = t;
  }
  if (b.m > -INFINITY)
    a.s += b.s * expf(b.m - a.m);
  return a;
}

__device__ amax amax_shfl(amax a, int o) {
  amax b;
  b.m = __shfl_xor_sync(0xffffffffu, a.m, o);
  b.i = __shfl_xor_sync(0xffffffffu, a.i, o);
  b.s = __shfl_xor_sync(0xffffffffu, a.s, o);
  return b;
}

/* One block of 1024 threads per row, one pass over the row. The index is
 * n_vocab until some element beats -inf; a row of -inf (or NaN) gives 0, as
 * the CPU scan starting at index 0 does. logprob = x[max] - logsumexp(x) =
 * -log(sum exp(x - max)). */
__global__ void argmax_kernel(const float *logits, int64_t n_vocab,
                              int32_t *ids, float *logprob, bool vec) {
  sl_kcu::pdl_wait(); /* pdl.cuh: nothing read or written before */
  sl_kcu::pdl_launch_dependents();
  __shared__ amax part[32];
  const float *x = logits + (int64_t)blockIdx.x * n_vocab;
  amax a = {-INFINITY, n_vocab, 0.0f};
  if (vec) {
    const float4 *x4 = (const float4 *)x;
    for (int64_t j = threadIdx.x; j < n_vocab / 4; j += blockDim.x) {
      float4 v = x4[j];
      amax_add(a, v.x, 4 * j);
      amax_add(a, v.y, 4 * j + 1);
      amax_add(a, v.z, 4 * j + 2);
      amax_add(a, v.w, 4 * j + 3);
    }
    for (int64_t j = n_vocab / 4 * 4 + threadIdx.x; j < n_vocab;
         j += blockDim.x)
      amax_add(a, x[j], j);
  } else {
    for (int64_t j = threadIdx.x; j < n_vocab; j += blockDim.x)
      amax_add(a, x[j], j);
  }
  for (int o = 16; o > 0; o >>= 1)
    a = amax_merge(a, amax_shfl(a, o));
  if (threadIdx.x % 32 == 0)
    part[threadIdx.x / 32] = a;
  __syncthreads();
  if (threadIdx.x >= 32)
    return;
  const int nw = blockDim.x / 32;
  a = threadIdx.x < nw ? part[threadIdx.x] : amax{-INFINITY, n_vocab, 0.0f};
  for (int o = 16; o > 0; o >>= 1)
    a = amax_merge(a, amax_shfl(a, o));
  if (threadIdx.x == 0) {
    ids[blockIdx.x] = (int32_t)(a.i < n_vocab ? a.i : 0);
    if (logprob)
      logprob[blockIdx.x] = a.m > -INFINITY ? -logf(a.s) : -INFINITY;
  }
}

/* ---- tests only: sl__kcu_test_slow_copy ---------------------------------- */

__global__ void slow_copy_kernel(float *dst, const float *src, int64_t n,
                                 uint64_t ns) {
  sl_kcu::pdl_wait();
  sl_kcu::pdl_launch_dependents(); /* the next kernel starts now */
  if (threadIdx.x == 0) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < ns);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    dst[i] = src[i];
}

} // namespace

extern "C" sl_status sl_kcu_rmsnorm(void *stream, float *y, const float *x,
                                    const float *w, int64_t rows, int64_t width,
                                    float eps) {
  if (rows < 0 || width < 1 || rows > INT32_MAX || !y || !x)
    return SL_ERR_INVALID_ARG;
  if (rows == 0)
    return SL_OK;
  cudaStream_t s = (cudaStream_t)stream;
  if (width <= 1024) {
    if (sl_status ls_ =
            sl_kcu::launch(rmsnorm_warp_kernel, (unsigned)((rows + 3) / 4), 128,
                           0, s, y, x, w, rows, (int)width, eps);
        ls_ != SL_OK)
      return ls_;
  } else {
    bool vec =
        width % 4 == 0 && aligned16(x) && aligned16(y) && (!w || aligned16(w));
    if (sl_status ls_ = sl_kcu::launch(rmsnorm_block_kernel, (unsigned)rows,
                                       256, 0, s, y, x, w, width, eps, vec);
        ls_ != SL_OK)
      return ls_;
  }
  return sl__kcu_launch_status();
}

extern "C" sl_status sl_kcu_add(void *stream, float *y, const float *a,
                                const float *b, int64_t n) {
  if (n < 0 || !y || !a || !b)
    return SL_ERR_INVALID_ARG;
  if (n == 0)
    return SL_OK;
  bool vec = aligned16(y) && aligned16(a) && aligned16(b);
  if (sl_status ls_ =
          sl_kcu::launch(add_kernel, grid_for(vec ? n / 4 + 1 : n, 256), 256, 0,
                         (cudaStream_t)stream, y, a, b, n, vec);
      ls_ != SL_OK)
    return ls_;
  return sl__kcu_launch_status();
}

extern "C" sl_status sl_kcu_add_bias(void *stream, float *y, const float *bias,
                                     int64_t rows, int64_t width) {
  if (rows < 0 || width < 0 || !y || !bias)
    return SL_ERR_INVALID_ARG;
  if (rows == 0 || width == 0)
    return SL_OK;
  int threads = width >= 256 ? 256 : (int)((width + 31) / 32 * 32);
  if (sl_status ls_ = sl_kcu::launch(
          add_bias_kernel, (unsigned)(rows < 65536 ? rows : 65536), threads, 0,
          (cudaStream_t)stream, y, bias, rows, width);
      ls_ != SL_OK)
    return ls_;
  return sl__kcu_launch_status();
}

extern "C" sl_status sl_kcu_swiglu(void *stream, float *y, const float *g,
                                   const float *u, int64_t n) {
  if (n < 0 || !y || !g || !u)
    return SL_ERR_INVALID_ARG;
  if (n == 0)
    return SL_OK;
  bool vec = aligned16(y) && aligned16(g) && aligned16(u);
  if (sl_status ls_ =
          sl_kcu::launch(swiglu_kernel, grid_for(vec ? n / 4 + 1 : n, 256), 256,
                         0, (cudaStream_t)stream, y, g, u, n, vec);
      ls_ != SL_OK)
    return ls_;
  return sl__kcu_launch_status();
}

extern "C" sl_status sl_kcu_rope(void *stream, float *x, const int32_t *pos,
                                 int n_tok, int n_head, int head_dim, int n_rot,
                                 float base, float scale, int mode) {
  if (n_tok < 0 || n_head < 0 || head_dim < 0 || n_rot < 0 || n_rot % 2 ||
      n_rot > head_dim || n_rot > 4096 ||
      (mode != SL_KERN_ROPE_NORM && mode != SL_KERN_ROPE_NEOX))
    return SL_ERR_INVALID_ARG;
  if (n_tok == 0 || n_head == 0 || n_rot == 0)
    return SL_OK;
  if (!x || !pos)
    return SL_ERR_INVALID_ARG;
  /* the CPU's expression, evaluated by the same host libm */
  const float theta_scale = powf(base, -2.0f / (float)n_rot);
  size_t shm = (size_t)n_rot * sizeof(float); /* cos and sin, half each */
  if (sl_status ls_ =
          sl_kcu::launch(rope_kernel, (unsigned)n_tok, 256, shm,
                         (cudaStream_t)stream, x, pos, n_head, head_dim, n_rot,
                         theta_scale, scale, mode == SL_KERN_ROPE_NEOX);
      ls_ != SL_OK)
    return ls_;
  return sl__kcu_launch_status();
}

extern "C" sl_status sl_kcu_kv_store(void *stream, uint16_t *k_layer,
                                     uint16_t *v_layer, const float *k,
                                     const float *v, const int32_t *slot,
                                     int n_tok, int kv_dim) {
  if (n_tok < 0 || kv_dim < 1 || !k_layer || !v_layer || !k || !v || !slot)
    return SL_ERR_INVALID_ARG;
  if (n_tok == 0)
    return SL_OK;
  bool vec = kv_dim % 4 == 0 && aligned16(k) && aligned16(v) &&
             ((uintptr_t)k_layer & 7) == 0 && ((uintptr_t)v_layer & 7) == 0;
  int threads = kv_dim >= 1024 ? 256 : 128;
  if (sl_status ls_ = sl_kcu::launch(kv_store_kernel, (unsigned)n_tok, threads,
                                     0, (cudaStream_t)stream, k_layer, v_layer,
                                     k, v, slot, kv_dim, vec);
      ls_ != SL_OK)
    return ls_;
  return sl__kcu_launch_status();
}

extern "C" sl_status sl_kcu_argmax(void *stream, const float *logits,
                                   int n_rows, int64_t n_vocab, int32_t *ids,
                                   float *logprob) {
  if (n_rows < 0 || n_vocab < 1 || n_vocab > INT32_MAX || !logits || !ids)
    return SL_ERR_INVALID_ARG;
  if (n_rows == 0)
    return SL_OK;
  bool vec = n_vocab % 4 == 0 && aligned16(logits);
  if (sl_status ls_ = sl_kcu::launch(argmax_kernel, (unsigned)n_rows, 1024, 0,
                                     (cudaStream_t)stream, logits, n_vocab, ids,
                                     logprob, vec);
      ls_ != SL_OK)
    return ls_;
  return sl__kcu_launch_status();
}

extern "C" sl_status sl_kcu_add_rmsnorm(void *stream, float *x, float *y,
                                        const float *d, const float *w,
                                        int64_t rows, int64_t width,
                                        float eps) {
  if (rows < 0 || width < 1 || rows > INT32_MAX || !x || !y || !d)
    return SL_ERR_INVALID_ARG;
  if (rows == 0)
    return SL_OK;
  const int64_t n4 = width / 4;
  const bool vec = width % 4 == 0 && aligned16(x) && aligned16(y) &&
                   aligned16(d) && (!w || aligned16(w)) && n4 <= 4 * 1024;
  if (!vec) { /* the two launches */
    sl_status st = sl_kcu_add(stream, x, x, d, rows * width);
    return st == SL_OK ? sl_kcu_rmsnorm(stream, y, x, w, rows, width, eps) : st;
  }
  cudaStream_t s = (cudaStream_t)stream;
  int threads = (int)((n4 + 31) / 32 * 32);
  if (threads <= 1024) {
    if (sl_status ls_ =
            sl_kcu::launch(add_rmsnorm_kernel<1>, (unsigned)rows, threads, 0, s,
                           x, y, d, w, (int)width, eps);
        ls_ != SL_OK)
      return ls_;
  } else {
    threads = (int)((n4 + 4 * 32 - 1) / (4 * 32) * 32);
    if (sl_status ls_ =
            sl_kcu::launch(add_rmsnorm_kernel<4>, (unsigned)rows, threads, 0, s,
                           x, y, d, w, (int)width, eps);
        ls_ != SL_OK)
      return ls_;
  }
  return sl__kcu_launch_status();
}

extern "C" sl_status
sl_kcu_rope_kv_store(void *stream, float *q, float *k, const float *v,
                     const int32_t *pos, const int32_t *slot, int n_tok,
                     int n_head, int n_head_kv, int head_dim, int n_rot,
                     float base, float scale, int mode, uint16_t *k_layer,
                     uint16_t *v_layer) {
  if (n_tok < 0 || n_head < 1 || n_head_kv < 1 || head_dim < 1 || n_rot < 0 ||
      n_rot % 2 || n_rot > head_dim || n_rot > 4096 || !q || !k || !v || !pos ||
      !slot || !k_layer || !v_layer ||
      (mode != SL_KERN_ROPE_NORM && mode != SL_KERN_ROPE_NEOX))
    return SL_ERR_INVALID_ARG;
  if (n_tok == 0)
    return SL_OK;
  if (n_rot == 0) /* nothing to rotate: the store alone */
    return sl_kcu_kv_store(stream, k_layer, v_layer, k, v, slot, n_tok,
                           n_head_kv * head_dim);
  const float theta_scale = powf(base, -2.0f / (float)n_rot);
  const size_t shm = (size_t)n_rot * sizeof(float);
  if (sl_status ls_ = sl_kcu::launch(
          rope_kv_kernel, (unsigned)n_tok, 256, shm, (cudaStream_t)stream, q, k,
          v, pos, slot, n_head, n_head_kv, head_dim, n_rot, theta_scale, scale,
          mode == SL_KERN_ROPE_NEOX, k_layer, v_layer);
      ls_ != SL_OK)
    return ls_;
  return sl__kcu_launch_status();
}

extern "C" sl_status sl__kcu_test_slow_copy(void *stream, float *dst,
                                            const float *src, int64_t n,
                                            double ms) {
  if (n < 0 || ms < 0 || (n && (!dst || !src)))
    return SL_ERR_INVALID_ARG;
  return sl_kcu::launch(slow_copy_kernel, 1, 256, 0, (cudaStream_t)stream, dst,
                        src, n, (uint64_t)(ms * 1e6));
}
