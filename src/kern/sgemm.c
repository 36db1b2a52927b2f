/* sl_kern_sgemm: dispatch by the stream's device. */
#include <string.h>

#include "sluice/kern.h"
#include "sluice/util.h"

#ifdef SLUICE_HAVE_OPENBLAS
#include <cblas.h>
#endif

typedef struct sgemm_arg {
  sl_buf_t *A, *B, *C;
  int m, n, k;
  float alpha;
} sgemm_arg;

static void sgemm_blocked(const float *A, const float *B, float *C, int m,
                          int n, int k, float alpha) {
  memset(C, 0, (size_t)m * (size_t)n * sizeof(float));
  enum { BK = 64 };
  for (int k0 = 0; k0 < k; k0 += BK) {
    int k1 = k0 + BK < k ? k0 + BK : k;
    for (int i = 0; i < m; i++) {
      float *c = C + (size_t)i * (size_t)n;
      for (int kk = k0; kk < k1; kk++) {
        float a = alpha * A[(size_t)i * (size_t)k + (size_t)kk];
        const float *b = B + (size_t)kk * (size_t)n;
        for (int j = 0; j < n; j++)
          c[j] += a * b[j];
      }
    }
  }
}

static sl_status sgemm_cpu_task(const sl_task_ctx *ctx, void *p) {
  sgemm_arg *a = p;
  const float *A = sl_buf_ptr(a->A), *B = sl_buf_ptr(a->B);
  float *C = sl_buf_ptr(a->C);
#ifdef SLUICE_HAVE_OPENBLAS
  openblas_set_num_threads(1);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, a->m, a->n, a->k,
              a->alpha, A, a->k, B, a->n, 0.0f, C, a->n);
#else
  sgemm_blocked(A, B, C, a->m, a->n, a->k, a->alpha);
#endif
  (void)sgemm_blocked;
  return SL_OK;
}

#ifdef SLUICE_HAVE_CUDA
/* src/kern/cuda/sgemm.cu */
sl_status sl__kern_cuda_sgemm(void *native_stream, const float *A,
                              const float *B, float *C, int m, int n, int k,
                              float alpha);
bool sl_kern_have_cuda(void) {
  return true;
}
#else
bool sl_kern_have_cuda(void) {
  return false;
}
#endif

static sl_status sgemm_cuda_task(const sl_task_ctx *ctx, void *p) {
#ifdef SLUICE_HAVE_CUDA
  sgemm_arg *a = p;
  return sl__kern_cuda_sgemm(ctx->native, sl_buf_ptr(a->A), sl_buf_ptr(a->B),
                             sl_buf_ptr(a->C), a->m, a->n, a->k, a->alpha);
#else
  return SL_ERR_UNSUPPORTED;
#endif
}

sl_status sl_kern_sgemm(sl_stream_t *s, sl_buf_t *A, sl_buf_t *B, sl_buf_t *C,
                        int m, int n, int k, float alpha) {
  if (!s || !A || !B || !C || m <= 0 || n <= 0 || k <= 0)
    return SL_ERR_INVALID_ARG;
  if (sl_buf_size(A) < (size_t)m * (size_t)k * sizeof(float) ||
      sl_buf_size(B) < (size_t)k * (size_t)n * sizeof(float) ||
      sl_buf_size(C) < (size_t)m * (size_t)n * sizeof(float))
    return SL_ERR_RANGE;
  sgemm_arg a = {A, B, C, m, n, k, alpha};
  sl_buf_t *bufs[3] = {A, B, C};
  bool cuda = sl_device_kind_of(sl_stream_device(s)) == SL_DEVICE_CUDA;
  return sl_stream_submit(s, cuda ? sgemm_cuda_task : sgemm_cpu_task, &a,
                          sizeof a, bufs, 3, NULL);
}
