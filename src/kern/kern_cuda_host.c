/* The host side of the CUDA kernels (sluice/kern_cuda.h): page-locked
 * memory, asynchronous copies and the device's memory figures, through the
 * CUDA runtime API. Built without CUDA, each reports SL_ERR_UNSUPPORTED. */
#include "sluice/kern_cuda.h"

#ifdef SLUICE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_status.h"

void *sl_kcu_host_alloc(size_t bytes) {
  void *p = NULL;
  if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) !=
      cudaSuccess) {
    (void)cudaGetLastError(); /* not sticky: clear it */
    return NULL;
  }
  return p;
}

void sl_kcu_host_free(void *p) {
  if (p)
    (void)cudaFreeHost(p);
}

sl_status sl_kcu_copy_h2d(void *stream, void *dev, const void *host, size_t n) {
  if (!n)
    return SL_OK;
  return sl__kcu_status(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice,
                                        (cudaStream_t)stream));
}

sl_status sl_kcu_copy_d2h(void *stream, void *host, const void *dev, size_t n) {
  if (!n)
    return SL_OK;
  return sl__kcu_status(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost,
                                        (cudaStream_t)stream));
}

sl_status sl_kcu_capture_begin(void *stream) {
  return sl__kcu_status(cudaStreamBeginCapture(
      (cudaStream_t)stream, cudaStreamCaptureModeThreadLocal));
}

sl_status sl_kcu_capture_end(void *stream, void **exec) {
  cudaGraph_t g = NULL;
  *exec = NULL;
  cudaError_t e = cudaStreamEndCapture((cudaStream_t)stream, &g);
  if (e != cudaSuccess) {
    if (g)
      cudaGraphDestroy(g);
    return sl__kcu_status(e);
  }
  cudaGraphExec_t x = NULL;
  e = cudaGraphInstantiate(&x, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess)
    return sl__kcu_status(e);
  *exec = x;
  return SL_OK;
}

sl_status sl_kcu_graph_launch(void *exec, void *stream) {
  return sl__kcu_status(
      cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream));
}

void sl_kcu_graph_free(void *exec) {
  if (exec)
    (void)cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

sl_status sl_kcu_mem_info(uint64_t *free_bytes, uint64_t *total_bytes) {
  size_t f = 0, t = 0;
  sl_status st = sl__kcu_status(cudaMemGetInfo(&f, &t));
  if (free_bytes)
    *free_bytes = f;
  if (total_bytes)
    *total_bytes = t;
  return st;
}

#else

void *sl_kcu_host_alloc(size_t bytes) {
  (void)bytes;
  return NULL;
}

void sl_kcu_host_free(void *p) {
  (void)p;
}

sl_status sl_kcu_copy_h2d(void *stream, void *dev, const void *host, size_t n) {
  (void)stream, (void)dev, (void)host, (void)n;
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_copy_d2h(void *stream, void *host, const void *dev, size_t n) {
  (void)stream, (void)dev, (void)host, (void)n;
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_read_bench(void *stream, const void *buf, size_t bytes,
                            unsigned *sink) {
  (void)stream, (void)buf, (void)bytes, (void)sink;
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_capture_begin(void *stream) {
  (void)stream;
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_capture_end(void *stream, void **exec) {
  (void)stream;
  *exec = NULL;
  return SL_ERR_UNSUPPORTED;
}

sl_status sl_kcu_graph_launch(void *exec, void *stream) {
  (void)exec, (void)stream;
  return SL_ERR_UNSUPPORTED;
}

void sl_kcu_graph_free(void *exec) {
  (void)exec;
}

sl_status sl_kcu_mem_info(uint64_t *free_bytes, uint64_t *total_bytes) {
  if (free_bytes)
    *free_bytes = 0;
  if (total_bytes)
    *total_bytes = 0;
  return SL_ERR_UNSUPPORTED;
}

#endif
