/* Device code used only by tests/test_rt_cuda.c: a kernel that faults (I6)
 * and a slow kernel that fills a buffer (stream ordering tests). */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "rt/cuda/cuda_hooks.h"
}

namespace {

__global__ void fault_kernel(int *bad) {
  /* an address no allocation can own: a sticky cudaErrorIllegalAddress */
  *(volatile int *)bad = 42;
}

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(uint64_t ns) {
  uint64_t t0 = global_ns();
  while (global_ns() - t0 < ns)
    ;
}

__global__ void fill_kernel(float *dst, size_t n, float value) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = value;
}

sl_status launched() {
  return cudaGetLastError() == cudaSuccess ? SL_OK : SL_ERR_DEVICE;
}

} // namespace

extern "C" sl_status sl__cuda_test_fault_launch(void *native_stream) {
  fault_kernel<<<1, 1, 0, (cudaStream_t)native_stream>>>(
      (int *)(uintptr_t)0x10);
  return launched();
}

extern "C" sl_status sl__cuda_test_spin_fill(void *native_stream, float *dst,
                                             size_t n, float value,
                                             double ms) {
  cudaStream_t s = (cudaStream_t)native_stream;
  spin_kernel<<<1, 1, 0, s>>>((uint64_t)(ms * 1e6));
  if (n) {
    size_t blocks = (n + 255) / 256;
    fill_kernel<<<(unsigned)(blocks < 1024 ? blocks : 1024), 256, 0, s>>>(
        dst, n, value);
  }
  return launched();
}
