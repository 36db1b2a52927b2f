/* For the CUDA kernel tests (test_kern_cuda_*.c): the device and a
 * non-blocking stream for the test's own work. */
#ifndef SLUICE_TEST_CUDA_TEST_H
#define SLUICE_TEST_CUDA_TEST_H

#ifdef SLUICE_HAVE_CUDA
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "sluice/rt.h"

/* 0 with *s made, 77 when there is no CUDA device (the test skips), 1 when
 * the stream cannot be made. */
static inline int cuda_test_stream(cudaStream_t *s) {
  sl_device_t *dev = NULL;
  sl_status st = sl_device_get(SL_DEVICE_CUDA, 0, &dev);
  if (st != SL_OK) {
    fprintf(stderr, "skip: no CUDA device (%s)\n", sl_status_str(st));
    return 77;
  }
  if (cudaSetDevice(0) != cudaSuccess ||
      cudaStreamCreateWithFlags(s, cudaStreamNonBlocking) != cudaSuccess) {
    fprintf(stderr, "cannot make a CUDA stream\n");
    return 1;
  }
  return 0;
}
#endif

#endif
