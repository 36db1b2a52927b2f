/* sluice — kern/cuda: what the matrix kernels (mmv.cu, gemm.cu) and the
 * cuBLAS loader (sgemm.cu) share. Private to src/kern/cuda. */
#ifndef SLUICE_KERN_CUDA_MM_IMPL_CUH
#define SLUICE_KERN_CUDA_MM_IMPL_CUH

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <pthread.h>

#include <type_traits>

extern "C" {
#include "cuda_status.h"
#include "sluice/kern_cuda.h"
#include "sluice/status.h"
}

namespace sl_kcu {

/* cuda_status.h's mapping, by the names the matrix files use. */
inline sl_status status_of(cudaError_t e) {
  return sl__kcu_status(e);
}
inline sl_status launch_status() {
  return sl__kcu_launch_status();
}

/* cublasGemmEx, the exported symbol (C++ also sees an inline overload that
 * takes a cudaDataType compute type). */
typedef cublasStatus_t (*gemm_ex_fn)(cublasHandle_t, cublasOperation_t,
                                     cublasOperation_t, int, int, int,
                                     const void *, const void *, cudaDataType,
                                     int, const void *, cudaDataType, int,
                                     const void *, void *, cudaDataType, int,
                                     cublasComputeType_t, cublasGemmAlgo_t);

/* The cuBLAS entry points sluice uses, resolved by dlopen (sgemm.cu). */
struct cublas_api {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSgemm_v2) sgemm;
  gemm_ex_fn gemm_ex;
};

/* A cuBLAS handle held for one call sequence: the handle of (current device,
 * stream), its mutex locked. */
struct cublas_lease {
  const cublas_api *api;
  cublasHandle_t h;
  pthread_mutex_t *mu;
};

/* Takes the handle of (current device, `stream`), made and bound to the
 * stream on first use (sgemm.cu: one handle per native stream, dropped by
 * the backend's stream-fini hook), and locks it. SL_ERR_UNSUPPORTED without
 * libcublas; SL_ERR_DEVICE / SL_ERR_DEVICE_OOM / SL_ERR_NOMEM when the
 * handle cannot be made. Release with cublas_release. Thread-safe. */
sl_status cublas_acquire(cudaStream_t stream, cublas_lease *out);
void cublas_release(cublas_lease *l);

/* The status after cuBLAS returned cs: SL_ERR_DEVICE_FATAL when a sticky
 * CUDA error is pending, SL_ERR_DEVICE for any other failure. */
sl_status cublas_status(cublasStatus_t cs);

/* Elements and bytes of a GGUF block of t; false for a type without
 * kernels. */
inline bool blk(sl_ggml_type t, int64_t *elems, size_t *bytes) {
  switch (t) {
  case SL_GGML_F32:
    *elems = 1, *bytes = 4;
    return true;
  case SL_GGML_F16:
  case SL_GGML_BF16:
    *elems = 1, *bytes = 2;
    return true;
  case SL_GGML_Q4_0:
    *elems = 32, *bytes = 18;
    return true;
  case SL_GGML_Q4_1:
    *elems = 32, *bytes = 20;
    return true;
  case SL_GGML_Q8_0:
    *elems = 32, *bytes = 34;
    return true;
  case SL_GGML_Q4_K:
    *elems = 256, *bytes = 144;
    return true;
  case SL_GGML_Q5_K:
    *elems = 256, *bytes = 176;
    return true;
  case SL_GGML_Q6_K:
    *elems = 256, *bytes = 210;
    return true;
  case SL_GGML_Q5_0:
    *elems = 32, *bytes = 22;
    return true;
  case SL_GGML_Q5_1:
    *elems = 32, *bytes = 24;
    return true;
  case SL_GGML_IQ4_NL:
    *elems = 32, *bytes = 18;
    return true;
  case SL_GGML_Q2_K:
    *elems = 256, *bytes = 84;
    return true;
  case SL_GGML_Q3_K:
    *elems = 256, *bytes = 110;
    return true;
  case SL_GGML_IQ4_XS:
    *elems = 256, *bytes = 136;
    return true;
  default:
    return false;
  }
}

/* f(std::integral_constant<int, n>{}) for n = 1..SL_KCU_MMV_MAX_TOKENS (the
 * matrix-vector kernels are instantiated per token count); else
 * SL_ERR_INVALID_ARG. */
template <class F> sl_status for_tokens(int n, F &&f) {
  static_assert(SL_KCU_MMV_MAX_TOKENS == 8, "instantiates n = 1..8");
  switch (n) {
  case 1:
    return f(std::integral_constant<int, 1>{});
  case 2:
    return f(std::integral_constant<int, 2>{});
  case 3:
    return f(std::integral_constant<int, 3>{});
  case 4:
    return f(std::integral_constant<int, 4>{});
  case 5:
    return f(std::integral_constant<int, 5>{});
  case 6:
    return f(std::integral_constant<int, 6>{});
  case 7:
    return f(std::integral_constant<int, 7>{});
  case 8:
    return f(std::integral_constant<int, 8>{});
  }
  return SL_ERR_INVALID_ARG;
}

/* The matrix-vector path (mmv.cu): Y = X W^T for 1 <= n <=
 * SL_KCU_MMV_MAX_TOKENS, arguments checked by the caller (type supported,
 * cols a multiple of the block, alignments of sl_kcu_matmul). */
sl_status mmv(cudaStream_t stream, const sl_kern_weight *w, const float *x,
              float *y, int n);

/* The same for packed weights (Q4_0, Q4_1, Q8_0; mmv_packed.cu); mmv calls
 * it for them. */
sl_status mmv_packed(cudaStream_t stream, const sl_kern_weight *w,
                     const float *x, float *y, int n);

/* Lets `kern` take `smem` bytes of dynamic shared memory (more than the
 * 48 KiB a launch gets without asking). */
template <class K> sl_status allow_smem(K kern, size_t smem) {
  if (smem <= 48 * 1024)
    return SL_OK;
  cudaError_t e = cudaFuncSetAttribute(
      kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e == cudaSuccess)
    return SL_OK;
  return status_of(e) == SL_ERR_DEVICE_FATAL ? SL_ERR_DEVICE_FATAL
                                             : SL_ERR_UNSUPPORTED;
}

/* The tensor-core kernel for packed weights, any n (mmt.cu), and whether it
 * replaces mmv_packed (SLUICE_CUDA_MMT, read once). */
sl_status mmt_packed(cudaStream_t stream, const sl_kern_weight *w,
                     const float *x, float *y, int n);
bool mmt_enabled(void);

/* out (rows, cols) f16 = the packed weight w (pack.cu). */
sl_status dequant_packed_f16(cudaStream_t stream, const sl_kern_weight *w,
                             __half *out);

/* sl_kcu_get_rows for a packed type, arguments checked (pack.cu). */
sl_status get_rows_packed(cudaStream_t stream, sl_ggml_type t, const void *src,
                          int64_t cols, const int32_t *ids, int n, float *dst);

} // namespace sl_kcu

#endif
