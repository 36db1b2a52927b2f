/* Moving whole KV blocks between the paged pool and a contiguous staging
 * buffer (sluice/kern_cuda.h: sl_kcu_kv_blocks): the tiers' restores and
 * stores make one copy of a group of blocks across PCIe and one launch
 * here, instead of one small copy per block, layer and half. */
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "cuda_status.h"
#include "sluice/kern_cuda.h"

namespace {

struct kv_blocks_arg {
  int n;
  int blocks[SL_KCU_KV_BLOCKS_MAX];
};

/* One thread block per (block i, layer l, half h): staging span
 * ((i * n_layer + l) * 2 + h) <-> pool span at h * half + (l * n_blocks +
 * blocks[i]) * span. T: uint4 when every span is 16-byte aligned. */
template <typename T>
__global__ void kv_blocks_kernel(T *pool, T *stage, size_t half, size_t lstride,
                                 size_t span, int n_layer, kv_blocks_arg a,
                                 bool out) {
  int s = blockIdx.x;
  int h = s % 2, l = (s / 2) % n_layer, i = s / 2 / n_layer;
  T *p = pool + (size_t)h * half + (size_t)l * lstride +
         (size_t)a.blocks[i] * span;
  T *q = stage + (size_t)s * span;
  for (size_t j = threadIdx.x; j < span; j += blockDim.x) {
    if (out)
      q[j] = p[j];
    else
      p[j] = q[j];
  }
}

} // namespace

extern "C" sl_status sl_kcu_kv_blocks(void *stream, uint16_t *pool,
                                      int n_layer, int n_blocks,
                                      size_t span_elems, const int *blocks,
                                      int n, uint16_t *stage, bool out) {
  if (n < 0 || n > SL_KCU_KV_BLOCKS_MAX || n_layer < 1 || n_blocks < 1 ||
      !span_elems || !pool || !stage || (n && !blocks))
    return SL_ERR_INVALID_ARG;
  if (!n)
    return SL_OK;
  kv_blocks_arg a;
  a.n = n;
  for (int i = 0; i < n; i++) {
    if (blocks[i] < 0 || blocks[i] >= n_blocks)
      return SL_ERR_INVALID_ARG;
    a.blocks[i] = blocks[i];
  }
  size_t lstride = (size_t)n_blocks * span_elems;
  size_t half = (size_t)n_layer * lstride;
  unsigned grid = (unsigned)(n * n_layer * 2);
  size_t span_b = span_elems * sizeof(uint16_t);
  if (span_b % 16 == 0 && ((uintptr_t)pool & 15) == 0 &&
      ((uintptr_t)stage & 15) == 0)
    kv_blocks_kernel<uint4><<<grid, 128, 0, (cudaStream_t)stream>>>(
        (uint4 *)pool, (uint4 *)stage, half * 2 / 16, lstride * 2 / 16,
        span_b / 16, n_layer, a, out);
  else
    kv_blocks_kernel<uint16_t><<<grid, 128, 0, (cudaStream_t)stream>>>(
        pool, stage, half, lstride, span_elems, n_layer, a, out);
  return sl__kcu_launch_status();
}
