/* sluice — kern/cuda private: programmatic dependent launch (Hopper's PDL)
 * for the kernels of a decode step.
 *
 * A step is ~8 launches a layer, most of them one or a few thread blocks,
 * back to back on one stream: without PDL each begins only after the one
 * before has finished and its memory has been flushed, so every launch
 * pays its ramp-up, and the matrix products their first DRAM latency, on
 * the critical path. With PDL (the launch attribute
 * cudaLaunchAttributeProgrammaticStreamSerialization), a kernel's blocks may
 * start as soon as every block of the kernel before it has called
 * pdl_launch_dependents(), and each waits in pdl_wait() until that kernel
 * has completed and its writes are visible.
 *
 * The rule every kernel launched through launch() keeps: no read of
 * anything an earlier kernel wrote, and no write at all, before pdl_wait().
 * The one exception is mmt_kernel (mmt.cu), which loads its first stages of
 * weights before the wait: the weights are written once, at load, which
 * waits for the packing (llama_cuda.c upload()), so no kernel still in
 * flight writes them. pdl_wait() is a no-op in a kernel launched without
 * the attribute, so each kernel may be launched either way.
 *
 * SLUICE_CUDA_PDL=0 (read once) launches without the attribute, for
 * measurement. Stream capture keeps the attribute as a programmatic edge,
 * so the step's CUDA graphs overlap the same way.
 */
#ifndef SLUICE_KERN_CUDA_PDL_CUH
#define SLUICE_KERN_CUDA_PDL_CUH

#include <cuda_runtime.h>
#include <stdlib.h>

#include <utility>

extern "C" {
#include "cuda_status.h"
#include "sluice/status.h"
}

namespace sl_kcu {

/* Waits until the kernel this one depends on has completed and its writes
 * are visible (immediately when launched without PDL). */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Lets the next kernel's blocks start (they wait in their pdl_wait()). */
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

inline bool pdl_enabled() {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("SLUICE_CUDA_PDL");
    on = !(e && e[0] == '0');
  }
  return on;
}

/* kern<<<grid, block, smem, s>>>(args...), with the PDL attribute unless
 * SLUICE_CUDA_PDL=0; the launch's status as sl__kcu_launch_status gives it. */
template <class... P, class... A>
sl_status launch(void (*kern)(P...), dim3 grid, dim3 block, size_t smem,
                 cudaStream_t s, A &&...args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  if (pdl_enabled()) {
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
  }
  cudaError_t e = cudaLaunchKernelEx(&cfg, kern, std::forward<A>(args)...);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* not sticky: clear it, report it */
    return sl__kcu_status(e);
  }
  return sl__kcu_launch_status();
}

} // namespace sl_kcu

#endif
