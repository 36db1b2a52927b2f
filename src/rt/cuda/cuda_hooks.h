/* Plain-C entry points shared by the CUDA backend (backend_cuda.c), the CUDA
 * kernels (src/kern/cuda/) and tests/test_rt_cuda.c. Safe to include from C
 * and from CUDA C++ (it uses no C11 atomics). Only built with CUDA. */
#ifndef SLUICE_RT_CUDA_HOOKS_H
#define SLUICE_RT_CUDA_HOOKS_H

#include <stddef.h>

#include "sluice/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A function the backend calls when a native stream of device `device` is
 * about to be destroyed (after it has been drained), so that a layer above rt
 * can drop what it keeps per native stream (kern: its cuBLAS handles). One
 * hook per process; a later call replaces it. Thread-safe. */
typedef void (*sl__cuda_stream_fini_fn)(int device, void *native_stream);
void sl__cuda_set_stream_fini_hook(sl__cuda_stream_fini_fn fn);

/* Test kernels (src/rt/cuda/test_kernels.cu), enqueued on `native_stream`
 * (a cudaStream_t) and not waited for. */

/* Writes through an illegal address: the next sync meets a sticky
 * cudaErrorIllegalAddress (I6). */
sl_status sl__cuda_test_fault_launch(void *native_stream);

/* One block spins for `ms` milliseconds of device time, then the grid fills
 * dst[0..n) with `value`. */
sl_status sl__cuda_test_spin_fill(void *native_stream, float *dst, size_t n,
                                  float value, double ms);

#ifdef __cplusplus
}
#endif

#endif
