/* The one mapping from a CUDA error to an sl_status for kern's CUDA code
 * (the .cu kernels and kern_cuda_host.c): a sticky error, after which the
 * context is unusable, is SL_ERR_DEVICE_FATAL (I6); an allocation failure
 * SL_ERR_DEVICE_OOM; any other SL_ERR_DEVICE. Private to src/kern; safe to
 * include from C and CUDA C++. */
#ifndef SLUICE_KERN_CUDA_STATUS_H
#define SLUICE_KERN_CUDA_STATUS_H

#include <cuda_runtime_api.h>

#include "sluice/status.h"

static inline sl_status sl__kcu_status(cudaError_t e) {
  switch (e) {
  case cudaSuccess:
    return SL_OK;
  case cudaErrorMemoryAllocation:
    return SL_ERR_DEVICE_OOM;
  case cudaErrorIllegalAddress:
  case cudaErrorLaunchFailure:
  case cudaErrorIllegalInstruction:
  case cudaErrorMisalignedAddress:
  case cudaErrorInvalidPc:
  case cudaErrorHardwareStackError:
  case cudaErrorECCUncorrectable:
  case cudaErrorAssert:
  case cudaErrorLaunchTimeout:
  case cudaErrorUnknown:
    return SL_ERR_DEVICE_FATAL;
  default:
    return SL_ERR_DEVICE;
  }
}

/* The status of the launches just made (clears a non-sticky error). */
static inline sl_status sl__kcu_launch_status(void) {
  return sl__kcu_status(cudaGetLastError());
}

#endif
