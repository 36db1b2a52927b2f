/* sluice — kern/cuda: sl_kcu_matmul (dispatch between the matrix-vector
 * kernels of mmv.cu and dequantization + cuBLAS), its scratch, and
 * sl_kcu_get_rows.
 *
 * The batched path (n > SL_KCU_MMV_MAX_TOKENS) dequantizes W into f16 and
 * converts X to f16 in the caller's scratch, then runs one cublasGemmEx
 * (f16 inputs, f32 output and accumulation, default tensor-op algorithm).
 * F16 weights are used as they lie; F32 weights go to cublasSgemm (f32
 * throughout, no scratch). BF16 weights are converted to f16 like the
 * quantized ones: exact for |w| in [2^-14, 65504], which holds for model
 * weights; beyond, they would saturate to inf rather than silently clamp.
 * X likewise (as llama.cpp's cuBLAS path): activations above 65504 give inf.
 *
 * Row-major Y (n, rows) is column-major Y^T (rows, n) = W X^T; row-major W
 * (rows, cols) is column-major W^T with ld cols, and X^T likewise, so cuBLAS
 * computes C = op(A) B with A = W^T stored, op = T, B = X^T stored, op = N:
 * m = rows, n = n, k = cols, lda = ldb = cols, ldc = rows (the "TN" layout,
 * the tensor cores' favourite).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "dequant.cuh"
#include "mm_impl.cuh"

namespace sl_kcu {
namespace {

/* The alignment the loads need of the data: 16 for the packed types
 * (packed.cuh), else dequant.cuh ALIGN (the float types' scalar
 * fallback). */
size_t data_align(sl_ggml_type t) {
  switch (t) {
  case SL_GGML_Q4_0:
  case SL_GGML_Q4_1:
  case SL_GGML_Q8_0:
    return 16;
  case SL_GGML_F32:
  case SL_GGML_Q4_K:
  case SL_GGML_Q5_K:
  case SL_GGML_Q5_1:
  case SL_GGML_Q2_K:
  case SL_GGML_IQ4_XS:
    return 4;
  default:
    return 2;
  }
}

bool is_float(sl_ggml_type t) {
  return t == SL_GGML_F32 || t == SL_GGML_F16 || t == SL_GGML_BF16;
}

/* Calls f with a value of the traits type of t (the 16-byte float units
 * when vec8); SL_ERR_UNSUPPORTED for the packed types, which pack.cu
 * reads. */
template <class F> sl_status with_traits(sl_ggml_type t, bool vec8, F &&f) {
  switch (t) {
  case SL_GGML_F32:
    return vec8 ? f(f32w<8>{}) : f(f32w<1>{});
  case SL_GGML_F16:
    return vec8 ? f(h16w<false, 8>{}) : f(h16w<false, 1>{});
  case SL_GGML_BF16:
    return vec8 ? f(h16w<true, 8>{}) : f(h16w<true, 1>{});
  case SL_GGML_Q4_K:
    return f(q4_k{});
  case SL_GGML_Q5_K:
    return f(q5_k{});
  case SL_GGML_Q6_K:
    return f(q6_k{});
  case SL_GGML_Q5_0:
    return f(q5_0{});
  case SL_GGML_Q5_1:
    return f(q5_1{});
  case SL_GGML_IQ4_NL:
    return f(iq4_nl{});
  case SL_GGML_Q2_K:
    return f(q2_k{});
  case SL_GGML_Q3_K:
    return f(q3_k{});
  case SL_GGML_IQ4_XS:
    return f(iq4_xs{});
  default:
    return SL_ERR_UNSUPPORTED;
  }
}

template <class O> __device__ __forceinline__ O cvt_out(float v);
template <> __device__ __forceinline__ float cvt_out<float>(float v) {
  return v;
}
template <> __device__ __forceinline__ __half cvt_out<__half>(float v) {
  return __float2half_rn(v);
}

/* Stores a group's GS values at o: one element at a time, except four f16
 * (the batched path's scratch), which go as one 8-byte store: a group of 4
 * starts at a multiple of 4 elements of a row of a multiple of 4 elements,
 * in scratch that is 16-byte aligned. */
template <int GS, class O> struct group_store {
  static __device__ __forceinline__ void run(O *o, const float *v) {
#pragma unroll
    for (int e = 0; e < GS; e++)
      o[e] = cvt_out<O>(v[e]);
  }
};
template <> struct group_store<4, __half> {
  static __device__ __forceinline__ void run(__half *o, const float *v) {
    const __half2 a = __floats2half2_rn(v[0], v[1]);
    const __half2 b = __floats2half2_rn(v[2], v[3]);
    uint2 p;
    p.x = *reinterpret_cast<const uint32_t *>(&a);
    p.y = *reinterpret_cast<const uint32_t *>(&b);
    *reinterpret_cast<uint2 *>(o) = p;
  }
};

/* Dequantizes unit i of `row` into out_row (exact() rounding: the CPU's). */
template <class T, class O>
__device__ __forceinline__ void dequant_unit(const uint8_t *row, int i,
                                             O *out_row) {
  const int b = i / T::UPB, u = i % T::UPB;
  typename T::raw raw;
  T::load(row + (size_t)b * T::BYTES, u, raw);
  O *ob = out_row + (int64_t)b * T::QK;
#pragma unroll
  for (int g = 0; g < T::GPU; g++) {
    float q[T::GS], s, m, v[T::GS];
    T::group(raw, u, g, q, s, m);
#pragma unroll
    for (int e = 0; e < T::GS; e++)
      v[e] = T::exact(q[e], s, m);
    group_store<T::GS, O>::run(ob + T::off(u, g), v);
  }
}

/* out (rows, cols) f16 = W. A block covers rpb rows: with short rows
 * (units < 256) each thread takes one unit of one of them, else the block's
 * threads stride along one row. */
template <class T>
__global__ void __launch_bounds__(256)
    dequant_f16_kernel(const uint8_t *__restrict__ w, size_t row_bytes,
                       int64_t rows, int units, int64_t cols,
                       __half *__restrict__ out, int rpb) {
  if (rpb > 1) {
    const int rr = threadIdx.x / units, i = threadIdx.x % units;
    const int64_t r = (int64_t)blockIdx.x * rpb + rr;
    if (rr < rpb && r < rows)
      dequant_unit<T>(w + (size_t)r * row_bytes, i, out + r * cols);
    return;
  }
  const int64_t r = blockIdx.x;
  for (int i = threadIdx.x; i < units; i += blockDim.x)
    dequant_unit<T>(w + (size_t)r * row_bytes, i, out + r * cols);
}

/* dst[i] = row ids[i] of src, one block per row. */
template <class T>
__global__ void __launch_bounds__(256)
    get_rows_kernel(const uint8_t *__restrict__ src, size_t row_bytes,
                    int units, int64_t cols, const int32_t *__restrict__ ids,
                    float *__restrict__ dst) {
  const int64_t r = ids[blockIdx.x];
  const uint8_t *row = src + (size_t)r * row_bytes;
  float *d = dst + (int64_t)blockIdx.x * cols;
  for (int i = threadIdx.x; i < units; i += blockDim.x)
    dequant_unit<T>(row, i, d);
}

__global__ void __launch_bounds__(256)
    to_f16_kernel(const float *__restrict__ x, __half *__restrict__ out,
                  int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __float2half_rn(__ldg(x + i));
}

size_t align256(size_t v) {
  return (v + 255) & ~(size_t)255;
}

/* The scratch layout of the batched path: W in f16 at 0 (w16 bytes, 0 for
 * F16 weights), then X in f16 (x16 bytes); false on overflow. */
bool layout(const sl_kern_weight *w, int n, size_t *w16, size_t *x16,
            bool force_gemm = false) {
  *w16 = *x16 = 0;
  if ((n <= SL_KCU_MMV_MAX_TOKENS && !force_gemm) || w->type == SL_GGML_F32 ||
      w->rows <= 0 || w->cols <= 0 || n <= 0)
    return true;
  const uint64_t lim = SIZE_MAX / 4;
  if ((uint64_t)w->cols > lim / (uint64_t)n ||
      (uint64_t)w->rows > lim / (uint64_t)w->cols)
    return false;
  *x16 = align256((size_t)n * (size_t)w->cols * 2);
  if (w->type != SL_GGML_F16)
    *w16 = align256((size_t)w->rows * (size_t)w->cols * 2);
  return *w16 <= SIZE_MAX - *x16;
}

sl_status gemm(cudaStream_t stream, const sl_kern_weight *w, const float *x,
               float *y, int n, void *scratch, size_t scratch_bytes) {
  if (w->rows > INT_MAX || w->cols > INT_MAX)
    return SL_ERR_INVALID_ARG; /* cuBLAS takes int dimensions */
  const int m = (int)w->rows, k = (int)w->cols;
  size_t w16b, x16b;
  if (!layout(w, n, &w16b, &x16b, true))
    return SL_ERR_OVERFLOW;
  if (scratch_bytes < w16b + x16b || (w16b + x16b && !scratch) ||
      (uintptr_t)scratch % 16)
    return SL_ERR_INVALID_ARG;

  const float one = 1.0f, zero = 0.0f;
  if (w->type == SL_GGML_F32) {
    cublas_lease l;
    sl_status st = cublas_acquire(stream, &l);
    if (st != SL_OK)
      return st;
    cublasStatus_t cs =
        l.api->sgemm(l.h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one,
                     (const float *)w->data, k, x, k, &zero, y, m);
    cublas_release(&l);
    return cublas_status(cs);
  }

  __half *w16 = (__half *)scratch;
  __half *x16 = (__half *)((char *)scratch + w16b);
  const void *a = w->data;
  if (sl_kcu_type_packed(w->type)) {
    sl_status st = dequant_packed_f16(stream, w, w16);
    if (st != SL_OK)
      return st;
    a = w16;
  } else if (w->type != SL_GGML_F16) {
    const bool vec8 = w->cols % 8 == 0 && (uintptr_t)w->data % 16 == 0;
    sl_status st = with_traits(w->type, vec8, [&](auto tr) {
      using T = decltype(tr);
      const int64_t nb = w->cols / T::QK;
      const int units = (int)(nb * T::UPB);
      const int rpb = units < 256 ? 256 / units : 1;
      const int64_t blocks = (w->rows + rpb - 1) / rpb;
      dequant_f16_kernel<T><<<(unsigned)blocks, 256, 0, stream>>>(
          (const uint8_t *)w->data, (size_t)nb * T::BYTES, w->rows, units,
          w->cols, w16, rpb);
      return launch_status();
    });
    if (st != SL_OK)
      return st;
    a = w16;
  }
  const int64_t nx = (int64_t)n * w->cols;
  int64_t xb = (nx + 255) / 256;
  to_f16_kernel<<<(unsigned)(xb < 4096 ? xb : 4096), 256, 0, stream>>>(x, x16,
                                                                       nx);
  sl_status st = launch_status();
  if (st != SL_OK)
    return st;

  cublas_lease l;
  if ((st = cublas_acquire(stream, &l)) != SL_OK)
    return st;
  cublasStatus_t cs =
      l.api->gemm_ex(l.h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a,
                     CUDA_R_16F, k, x16, CUDA_R_16F, k, &zero, y, CUDA_R_32F, m,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  cublas_release(&l);
  return cublas_status(cs);
}

} // namespace
} // namespace sl_kcu

using namespace sl_kcu;

extern "C" bool sl_kcu_type_supported(sl_ggml_type t) {
  int64_t e;
  size_t b;
  return blk(t, &e, &b);
}

/* The batched path's scratch (layout()); SIZE_MAX when it overflows. */
extern "C" size_t sl_kcu_matmul_scratch_bytes(const sl_kern_weight *w, int n) {
  if (!w || !sl_kcu_type_supported(w->type))
    return 0;
  size_t w16, x16;
  if (!layout(w, n, &w16, &x16))
    return SIZE_MAX;
  return w16 + x16;
}

/* The checks both matrix entry points make: *done when there is nothing to
 * compute (n or rows 0). */
static sl_status check_args(const sl_kern_weight *w, const float *x,
                            const float *y, int n, bool *done) {
  *done = false;
  if (!w || n < 0 || w->rows < 0 || w->cols < 0)
    return SL_ERR_INVALID_ARG;
  int64_t be;
  size_t bb;
  if (!blk(w->type, &be, &bb))
    return SL_ERR_UNSUPPORTED;
  if (w->cols % be || w->cols > INT_MAX)
    return SL_ERR_INVALID_ARG;
  if (n == 0 || w->rows == 0) {
    *done = true;
    return SL_OK;
  }
  return !x || !y || !w->data ? SL_ERR_INVALID_ARG : SL_OK;
}

/* SLUICE_CUDA_GEMM=0: the batched path (cuBLAS) is not used; every product
 * goes through sluice's own matrix-vector / tensor-core kernels in slices.
 * For compute-sanitizer's racecheck over a whole server: cuBLAS's Hopper
 * kernels (nvjet_*) make the tool's tracking grow without bound (docs/PERF.md,
 * 2026-12-04), and they are not sluice's code. Read once per process. */
static bool gemm_enabled(void) {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("SLUICE_CUDA_GEMM");
    on = !(e && e[0] == '0');
  }
  return on;
}

/* Beyond the header's contract: the weight data must be aligned as its
 * blocks' loads need (16 bytes for the packed Q4_0, Q4_1, Q8_0; 2 for the
 * others, 4 for Q4_K, Q5_K, Q5_1, Q2_K, IQ4_XS, F32), x 16-byte
 * aligned for quantized weights on the matrix-vector path (n <= 8) and
 * scratch 16-byte aligned; SL_ERR_INVALID_ARG otherwise. Device pointers
 * from the allocator, packed matrices at 16-byte aligned offsets and GGUF
 * tensor offsets (32-aligned) meet all three. */
extern "C" sl_status sl_kcu_matmul(void *stream, const sl_kern_weight *w,
                                   const float *x, float *y, int n,
                                   void *scratch, size_t scratch_bytes) {
  bool done;
  sl_status st = check_args(w, x, y, n, &done);
  if (st != SL_OK || done)
    return st;
  cudaStream_t s = (cudaStream_t)stream;
  if (w->cols == 0) { /* empty sums, as the CPU kernel */
    cudaMemsetAsync(y, 0, (size_t)n * (size_t)w->rows * sizeof(float), s);
    return launch_status();
  }
  if ((uintptr_t)w->data % data_align(w->type))
    return SL_ERR_INVALID_ARG;
  if (n <= SL_KCU_MMV_MAX_TOKENS) {
    if (!is_float(w->type) && (uintptr_t)x % 16)
      return SL_ERR_INVALID_ARG;
    return mmv(s, w, x, y, n);
  }
  if (!gemm_enabled())
    return sl_kcu_matmul_path(stream, w, x, y, n, SL_KCU_MM_VEC, scratch,
                              scratch_bytes);
  return gemm(s, w, x, y, n, scratch, scratch_bytes);
}

extern "C" size_t sl_kcu_matmul_path_scratch_bytes(const sl_kern_weight *w,
                                                   int n, sl_kcu_mm_path path) {
  if (path == SL_KCU_MM_AUTO)
    return sl_kcu_matmul_scratch_bytes(w, n);
  if (path == SL_KCU_MM_VEC || !w || !sl_kcu_type_supported(w->type) ||
      w->type == SL_GGML_F32)
    return 0;
  size_t w16, x16;
  if (!layout(w, n, &w16, &x16, true))
    return SIZE_MAX;
  return w16 + x16;
}

/* VEC: slices of at most SL_KCU_MMV_MAX_TOKENS tokens through the
 * matrix-vector kernels (each token's sums do not depend on the others);
 * GEMM: the batched path for any n. */
extern "C" sl_status sl_kcu_matmul_path(void *stream, const sl_kern_weight *w,
                                        const float *x, float *y, int n,
                                        sl_kcu_mm_path path, void *scratch,
                                        size_t scratch_bytes) {
  if (path == SL_KCU_MM_AUTO)
    return sl_kcu_matmul(stream, w, x, y, n, scratch, scratch_bytes);
  if (path != SL_KCU_MM_VEC && path != SL_KCU_MM_GEMM)
    return SL_ERR_INVALID_ARG;
  bool done;
  sl_status st = check_args(w, x, y, n, &done);
  if (st != SL_OK || done)
    return st;
  if (w->cols == 0) /* empty sums: sl_kcu_matmul writes the zeros */
    return sl_kcu_matmul(stream, w, x, y, n, scratch, scratch_bytes);
  if ((uintptr_t)w->data % data_align(w->type))
    return SL_ERR_INVALID_ARG;
  cudaStream_t s = (cudaStream_t)stream;
  /* F32 weights stay on the matrix-vector kernels: cublasSgemm computes an
   * element one way for n = 1 and another for larger n (measured on the
   * H200: 8 of 8 tokens differed alone), GemmEx on f16 does not */
  if (path == SL_KCU_MM_GEMM && w->type != SL_GGML_F32 && gemm_enabled())
    return gemm(s, w, x, y, n, scratch, scratch_bytes);
  if (sl_kcu_type_packed(w->type) && mmt_enabled()) {
    if ((uintptr_t)x % 16)
      return SL_ERR_INVALID_ARG;
    return mmt_packed(s, w, x, y, n);
  }
  for (int t = 0; t < n; t += SL_KCU_MMV_MAX_TOKENS) {
    int k = n - t < SL_KCU_MMV_MAX_TOKENS ? n - t : SL_KCU_MMV_MAX_TOKENS;
    const float *xs = x + (size_t)t * (size_t)w->cols;
    if (!is_float(w->type) && (uintptr_t)xs % 16)
      return SL_ERR_INVALID_ARG;
    sl_status st = mmv(s, w, xs, y + (size_t)t * (size_t)w->rows, k);
    if (st != SL_OK)
      return st;
  }
  return SL_OK;
}

extern "C" sl_status sl_kcu_get_rows(void *stream, sl_ggml_type t,
                                     const void *src, int64_t cols,
                                     const int32_t *ids, int n, float *dst) {
  int64_t be;
  size_t bb;
  if (!blk(t, &be, &bb))
    return SL_ERR_UNSUPPORTED;
  if (cols <= 0 || cols % be || cols > INT_MAX || n < 0)
    return SL_ERR_INVALID_ARG;
  if (n == 0)
    return SL_OK;
  if (!src || !ids || !dst || (uintptr_t)src % data_align(t))
    return SL_ERR_INVALID_ARG;
  if (sl_kcu_type_packed(t))
    return get_rows_packed((cudaStream_t)stream, t, src, cols, ids, n, dst);
  const bool vec8 = cols % 8 == 0 && (uintptr_t)src % 16 == 0;
  return with_traits(t, vec8, [&](auto tr) {
    using T = decltype(tr);
    const int64_t nb = cols / T::QK;
    if (nb * T::UPB > INT_MAX)
      return SL_ERR_INVALID_ARG;
    get_rows_kernel<T><<<(unsigned)n, 256, 0, (cudaStream_t)stream>>>(
        (const uint8_t *)src, (size_t)nb * T::BYTES, (int)(nb * T::UPB), cols,
        ids, dst);
    return launch_status();
  });
}
