/* sluice — kern: backend-neutral entry points for tensor ops enqueued on a
 * stream. Quantized CPU kernels live in sluice/kern_cpu.h. */
#ifndef SLUICE_KERN_H
#define SLUICE_KERN_H

#include <stdbool.h>
#include <stdint.h>

#include "sluice/alloc.h"
#include "sluice/rt.h"

/* C = alpha * A(m×k) · B(k×n), all row-major f32 in device buffers.
 * Submits one task on `s` that declares A, B and C; does not wait.
 * CPU: OpenBLAS where available (single-threaded inside the task), else a
 * blocked loop. CUDA: cuBLAS on the stream's native handle. */
sl_status sl_kern_sgemm(sl_stream_t *s, sl_buf_t *A, sl_buf_t *B, sl_buf_t *C,
                        int m, int n, int k, float alpha);

/* True when sluice was built with the CUDA kernels. */
bool sl_kern_have_cuda(void);

#endif
