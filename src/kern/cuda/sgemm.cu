/* sl__kern_cuda_sgemm: row-major f32 GEMM through cuBLAS on a given stream.
 *
 * cuBLAS handles. One handle per (device, native stream), made on first use
 * and bound to that stream for good, so that no two streams ever share a
 * handle or its workspace (a handle's default workspace used from two streams
 * at once is a race). Handles are looked up in a mutex-guarded list; the
 * backend drops a stream's handle through the stream-fini hook just before it
 * destroys the native stream. Calls on one stream are serialized by that
 * stream's submit lock (tasks run inside sl_stream_submit); a per-handle
 * mutex makes concurrent calls on one stream from outside tasks safe too.
 *
 * The same handles serve the CUDA matrix kernels (gemm.cu: cublasGemmEx)
 * through sl_kcu::cublas_acquire / cublas_release (mm_impl.cuh), which lock
 * the handle's mutex for the caller's call sequence.
 *
 * cuBLAS is loaded with dlopen on first use, not linked: mapping
 * libcublas/libcublasLt at start-up costs every process ~200 MB of resident
 * memory, CPU-only runs included. No cuBLAS: SL_ERR_UNSUPPORTED.
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "mm_impl.cuh"

extern "C" {
#include "rt/cuda/cuda_hooks.h"
#include "sluice/status.h"
}

using sl_kcu::cublas_api;

namespace {

cublas_api g_cb;
bool g_cb_ok;
pthread_once_t g_cb_once = PTHREAD_ONCE_INIT;

void cb_load() {
  char name[64];
  snprintf(name, sizeof name, "libcublas.so.%d", CUBLAS_VER_MAJOR);
  void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    lib = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return;
  g_cb.create = (decltype(g_cb.create))dlsym(lib, "cublasCreate_v2");
  g_cb.destroy = (decltype(g_cb.destroy))dlsym(lib, "cublasDestroy_v2");
  g_cb.set_stream = (decltype(g_cb.set_stream))dlsym(lib, "cublasSetStream_v2");
  g_cb.set_math_mode =
      (decltype(g_cb.set_math_mode))dlsym(lib, "cublasSetMathMode");
  g_cb.sgemm = (decltype(g_cb.sgemm))dlsym(lib, "cublasSgemm_v2");
  g_cb.gemm_ex = (sl_kcu::gemm_ex_fn)dlsym(lib, "cublasGemmEx");
  g_cb_ok = g_cb.create && g_cb.destroy && g_cb.set_stream &&
            g_cb.set_math_mode && g_cb.sgemm && g_cb.gemm_ex;
}

bool cb_ready() {
  pthread_once(&g_cb_once, cb_load);
  return g_cb_ok;
}

struct handle_entry {
  int device;
  cudaStream_t stream;
  cublasHandle_t h;
  pthread_mutex_t mu; /* serializes calls on this handle */
  handle_entry *next;
};

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* guards g_handles */
handle_entry *g_handles;
pthread_once_t g_hook_once = PTHREAD_ONCE_INIT;

/* Backend hook: the stream is drained and about to be destroyed. */
void drop_stream(int device, void *native) {
  pthread_mutex_lock(&g_mu);
  handle_entry **pp = &g_handles;
  handle_entry *found = nullptr;
  for (; *pp; pp = &(*pp)->next)
    if ((*pp)->device == device && (*pp)->stream == (cudaStream_t)native) {
      found = *pp;
      *pp = found->next;
      break;
    }
  pthread_mutex_unlock(&g_mu);
  if (found) {
    g_cb.destroy(found->h);
    pthread_mutex_destroy(&found->mu);
    free(found);
  }
}

void install_hook() {
  sl__cuda_set_stream_fini_hook(drop_stream);
}

bool sticky_pending() {
  return sl_kcu::status_of(cudaPeekAtLastError()) == SL_ERR_DEVICE_FATAL;
}

/* The handle for (current device, stream), made on first use. Returns NULL
 * and sets *st when it cannot be made. */
handle_entry *handle_for(cudaStream_t stream, sl_status *st) {
  pthread_once(&g_hook_once, install_hook);
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    *st = SL_ERR_DEVICE;
    return nullptr;
  }
  pthread_mutex_lock(&g_mu);
  for (handle_entry *e = g_handles; e; e = e->next)
    if (e->device == device && e->stream == stream) {
      pthread_mutex_unlock(&g_mu);
      return e;
    }
  pthread_mutex_unlock(&g_mu);

  /* made outside g_mu: cublasCreate allocates device memory. Plain calloc:
   * sluice/util.h (sl_calloc) uses C11 _Noreturn, which CUDA C++ rejects. */
  handle_entry *e = (handle_entry *)calloc(1, sizeof *e);
  if (!e) {
    *st = SL_ERR_NOMEM;
    return nullptr;
  }
  cublasStatus_t cs = g_cb.create(&e->h);
  if (cs != CUBLAS_STATUS_SUCCESS) {
    free(e);
    *st = cs == CUBLAS_STATUS_ALLOC_FAILED ? SL_ERR_DEVICE_OOM : SL_ERR_DEVICE;
    return nullptr;
  }
  if (g_cb.set_stream(e->h, stream) != CUBLAS_STATUS_SUCCESS ||
      g_cb.set_math_mode(e->h, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
    g_cb.destroy(e->h);
    free(e);
    *st = SL_ERR_DEVICE;
    return nullptr;
  }
  e->device = device;
  e->stream = stream;
  pthread_mutex_init(&e->mu, nullptr);
  pthread_mutex_lock(&g_mu);
  /* one stream's tasks are serialized, so no one else made it meanwhile */
  e->next = g_handles;
  g_handles = e;
  pthread_mutex_unlock(&g_mu);
  return e;
}

} // namespace

sl_status sl_kcu::cublas_acquire(cudaStream_t stream, cublas_lease *out) {
  if (!cb_ready())
    return SL_ERR_UNSUPPORTED; /* no libcublas on this machine */
  sl_status st = SL_OK;
  handle_entry *e = handle_for(stream, &st);
  if (!e)
    return st;
  pthread_mutex_lock(&e->mu);
  out->api = &g_cb;
  out->h = e->h;
  out->mu = &e->mu;
  return SL_OK;
}

void sl_kcu::cublas_release(cublas_lease *l) {
  pthread_mutex_unlock(l->mu);
  l->mu = nullptr;
  l->h = nullptr;
}

sl_status sl_kcu::cublas_status(cublasStatus_t cs) {
  if (cs == CUBLAS_STATUS_SUCCESS)
    return SL_OK;
  return sticky_pending() ? SL_ERR_DEVICE_FATAL : SL_ERR_DEVICE;
}

/* C(m×n) = alpha · A(m×k) · B(k×n), all row-major, enqueued on
 * `native_stream` (a cudaStream_t) on the current device; does not wait.
 * Row-major C is column-major Cᵀ = Bᵀ·Aᵀ, so cuBLAS gets (B, A) swapped.
 * Returns SL_ERR_DEVICE (SL_ERR_DEVICE_FATAL after a sticky CUDA error) when
 * cuBLAS refuses. Thread-safe. */
extern "C" sl_status sl__kern_cuda_sgemm(void *native_stream, const float *A,
                                         const float *B, float *C, int m, int n,
                                         int k, float alpha) {
  if (!A || !B || !C || m <= 0 || n <= 0 || k <= 0)
    return SL_ERR_INVALID_ARG;
  if (!cb_ready())
    return SL_ERR_UNSUPPORTED; /* no libcublas on this machine */
  sl_status st = SL_OK;
  handle_entry *e = handle_for((cudaStream_t)native_stream, &st);
  if (!e)
    return st;
  const float beta = 0.0f;
  pthread_mutex_lock(&e->mu);
  cublasStatus_t cs = g_cb.sgemm(e->h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k,
                                 &alpha, B, n, A, k, &beta, C, n);
  pthread_mutex_unlock(&e->mu);
  if (cs != CUBLAS_STATUS_SUCCESS)
    return sticky_pending() ? SL_ERR_DEVICE_FATAL : SL_ERR_DEVICE;
  return SL_OK;
}
