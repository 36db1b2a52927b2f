/* sluice — kern/cuda: sl_kcu_pack (GGUF bytes to the packed layout of
 * packed.cuh), its size, and the two other readers of packed weights: the
 * dequantization to f16 of the batched path and the row gather.
 *
 * Dequantized values round as the CPU dequantizers do (dequant.cuh's
 * exact()): Q4_0 (q - 8) * d and Q8_0 q * d, one rounding; Q4_1 the fused
 * q * d + m of the AVX2 dequantizer. So sl_kcu_get_rows of a packed matrix
 * equals sl_kern_dequant_row of its GGUF bytes bit for bit.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>

#include "mm_impl.cuh"
#include "packed.cuh"

namespace sl_kcu {
namespace {

__device__ __forceinline__ uint32_t ld16u(const uint8_t *p) {
  return __ldg((const unsigned short *)p);
}
/* A 32-bit word from a 2-byte aligned address. */
__device__ __forceinline__ uint32_t ld32_a2(const uint8_t *p) {
  return ld16u(p) | (ld16u(p + 2) << 16);
}

/* One thread a (tile, block, row-in-tile), row-in-tile fastest: the
 * packed writes of a warp are contiguous; the GGUF reads are one-time. Rows
 * past the end of the matrix (the last tile's padding) become zeros. */
template <class T>
__global__ void __launch_bounds__(256)
    pack_kernel(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst,
                int64_t rows, int64_t nb, int64_t n_items, size_t tile_bytes) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_items;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int rr = (int)(i % kTileRows);
    const int64_t tb = i / kTileRows, tile = tb / nb, b = tb % nb;
    const int64_t r = tile * kTileRows + rr;
    uint32_t q[T::QB / 4], s = 0;
    if (r < rows) {
      const uint8_t *p =
          src + ((size_t)r * (size_t)nb + (size_t)b) * T::GGUF_BYTES;
      s = T::SB == 4 ? ld32_a2(p) : ld16u(p);
#pragma unroll
      for (int k = 0; k < T::QB / 4; k++)
        q[k] = ld32_a2(p + T::SB + 4 * k);
    } else {
#pragma unroll
      for (int k = 0; k < T::QB / 4; k++)
        q[k] = 0;
    }
    uint8_t *base = dst + (size_t)tile * tile_bytes;
#pragma unroll
    for (int h = 0; h < T::CPB; h++)
      *(uint4 *)(base + ((size_t)(b * T::CPB + h) * kTileRows + rr) * 16) =
          make_uint4(q[4 * h], q[4 * h + 1], q[4 * h + 2], q[4 * h + 3]);
    uint8_t *sp = base + (size_t)kTileRows * nb * T::QB +
                  ((size_t)b * kTileRows + rr) * T::SB;
    if (T::SB == 4)
      *(uint32_t *)sp = s;
    else
      *(unsigned short *)sp = (unsigned short)s;
  }
}

template <class O> __device__ __forceinline__ O cvt_out(float v);
template <> __device__ __forceinline__ float cvt_out<float>(float v) {
  return v;
}
template <> __device__ __forceinline__ __half cvt_out<__half>(float v) {
  return __float2half_rn(v);
}

/* Element e (< 4) of byte lane of v as the exact float of q - bias. */
__device__ __forceinline__ float qf(uint32_t v, int e, float bias) {
  return __uint_as_float(0x4B000000u | ((v >> (8 * e)) & 0xFF)) -
         (8388608.0f + bias);
}

/* Dequantizes chunk c of row r (packed, tile at `tile`, row-in-tile rr) into
 * out_row (the row's first element), with the CPU's rounding. */
template <class T, class O>
__device__ __forceinline__ void
dequant_chunk(const uint8_t *tile, int rr, int64_t nb, int64_t c, O *out_row) {
  const uint4 qv =
      __ldg((const uint4 *)(tile + ((size_t)c * kTileRows + rr) * 16));
  const int64_t b = c / T::CPB;
  const uint8_t *sp = tile + (size_t)kTileRows * nb * T::QB +
                      ((size_t)b * kTileRows + rr) * T::SB;
  const uint32_t sw = T::SB == 4 ? __ldg((const unsigned int *)sp)
                                 : __ldg((const unsigned short *)sp);
  const float d = __half2float(__ushort_as_half((unsigned short)(sw & 0xFFFF)));
  const float m = __half2float(__ushort_as_half((unsigned short)(sw >> 16)));
  const uint32_t w[4] = {qv.x, qv.y, qv.z, qv.w};
  /* the chunk's values in registers, then stored: f16 output (the GEMM
   * path's scratch, 16 GB a 512-token step on an 8B model) in 16-byte
   * stores, each thread's 64 (Q4) or 32 (Q8_0) bytes contiguous; the first
   * version stored one half at a time, scattered over 16 rows, and bounded
   * pp512 at ~4,300 t/s on the H200 */
  constexpr int NV = T::QB == 16 ? 32 : 16;
  alignas(16) O v[NV];
  if (T::QB == 16) { /* Q4: elements j and j + 16 in byte j */
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const uint32_t lo = w[k] & 0x0F0F0F0Fu, hi = (w[k] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
      for (int e = 0; e < 4; e++) {
        if (T::SB == 4) {
          v[4 * k + e] = cvt_out<O>(__fmaf_rn(qf(lo, e, 0.0f), d, m));
          v[16 + 4 * k + e] = cvt_out<O>(__fmaf_rn(qf(hi, e, 0.0f), d, m));
        } else {
          v[4 * k + e] = cvt_out<O>(__fmul_rn(qf(lo, e, 8.0f), d));
          v[16 + 4 * k + e] = cvt_out<O>(__fmul_rn(qf(hi, e, 8.0f), d));
        }
      }
    }
  } else { /* Q8_0: half c % 2 of block b */
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const uint32_t x = w[k] ^ 0x80808080u;
#pragma unroll
      for (int e = 0; e < 4; e++)
        v[4 * k + e] = cvt_out<O>(__fmul_rn(qf(x, e, 128.0f), d));
    }
  }
  O *o = T::QB == 16 ? out_row + b * 32 : out_row + c * 16;
  if constexpr (sizeof(O) == 2) {
    /* o is 32 (Q8_0) or 64 (Q4) bytes into a row of cols (a multiple of
     * 32) halves from a 16-byte-aligned base: 16-byte aligned */
    const uint4 *src = (const uint4 *)v;
#pragma unroll
    for (int k = 0; k < NV / 8; k++)
      ((uint4 *)o)[k] = src[k];
  } else {
#pragma unroll
    for (int k = 0; k < NV; k++)
      o[k] = v[k];
  }
}

/* out (rows, cols) f16 = W; one thread a (tile, chunk, row-in-tile), so a
 * warp reads contiguous packed bytes. */
template <class T>
__global__ void __launch_bounds__(256)
    dequant_kernel(const uint8_t *__restrict__ w, size_t tile_bytes,
                   int64_t rows, int64_t nb, int64_t n_items,
                   __half *__restrict__ out) {
  const int64_t C = nb * T::CPB, cols = nb * 32;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_items;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int rr = (int)(i % kTileRows);
    const int64_t tc = i / kTileRows, tile = tc / C, c = tc % C;
    const int64_t r = tile * kTileRows + rr;
    if (r < rows)
      dequant_chunk<T, __half>(w + (size_t)tile * tile_bytes, rr, nb, c,
                               out + r * cols);
  }
}

/* dst[i] = row ids[i], one thread block a row. */
template <class T>
__global__ void __launch_bounds__(256)
    get_rows_kernel(const uint8_t *__restrict__ src, size_t tile_bytes,
                    int64_t nb, const int32_t *__restrict__ ids,
                    float *__restrict__ dst) {
  const int64_t r = ids[blockIdx.x];
  const uint8_t *tile = src + (size_t)(r / kTileRows) * tile_bytes;
  float *d = dst + (int64_t)blockIdx.x * nb * 32;
  for (int64_t c = threadIdx.x; c < nb * T::CPB; c += blockDim.x)
    dequant_chunk<T, float>(tile, (int)(r % kTileRows), nb, c, d);
}

unsigned grid_for(int64_t items) {
  const int64_t b = (items + 255) / 256;
  return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

} // namespace

sl_status dequant_packed_f16(cudaStream_t stream, const sl_kern_weight *w,
                             __half *out) {
  return with_packed(w->type, SL_ERR_UNSUPPORTED, [&](auto tr) {
    using T = decltype(tr);
    const int64_t nb = w->cols / 32;
    const int64_t tiles = (w->rows + kTileRows - 1) / kTileRows;
    const int64_t items = tiles * nb * T::CPB * kTileRows;
    dequant_kernel<T><<<grid_for(items), 256, 0, stream>>>(
        (const uint8_t *)w->data, pk_tile_bytes(T::QB, T::SB, nb), w->rows, nb,
        items, out);
    return launch_status();
  });
}

sl_status get_rows_packed(cudaStream_t stream, sl_ggml_type t, const void *src,
                          int64_t cols, const int32_t *ids, int n, float *dst) {
  return with_packed(t, SL_ERR_UNSUPPORTED, [&](auto tr) {
    using T = decltype(tr);
    const int64_t nb = cols / 32;
    get_rows_kernel<T><<<(unsigned)n, 256, 0, stream>>>(
        (const uint8_t *)src, pk_tile_bytes(T::QB, T::SB, nb), nb, ids, dst);
    return launch_status();
  });
}

} // namespace sl_kcu

using namespace sl_kcu;

extern "C" bool sl_kcu_type_packed(sl_ggml_type t) {
  int qb, sb;
  return pk_sizes(t, &qb, &sb);
}

/* SIZE_MAX when the size overflows or rows, cols are negative; 0 for a type
 * without kernels or cols not a multiple of its block. */
extern "C" size_t sl_kcu_packed_bytes(sl_ggml_type t, int64_t rows,
                                      int64_t cols) {
  if (rows < 0 || cols < 0)
    return SIZE_MAX;
  int qb, sb;
  if (pk_sizes(t, &qb, &sb)) {
    if (cols % 32)
      return 0;
    const uint64_t nb = (uint64_t)cols / 32;
    const uint64_t tiles = ((uint64_t)rows + kTileRows - 1) / kTileRows;
    const uint64_t per_tile = (uint64_t)kTileRows * (uint64_t)(qb + sb);
    if (nb && (tiles > SIZE_MAX / per_tile / nb))
      return SIZE_MAX;
    return (size_t)(tiles * nb * per_tile);
  }
  int64_t be;
  size_t bb;
  if (!blk(t, &be, &bb) || cols % be)
    return 0;
  const uint64_t rb = (uint64_t)(cols / be) * bb;
  if (rb && (uint64_t)rows > SIZE_MAX / rb)
    return SIZE_MAX;
  return (size_t)(rb * (uint64_t)rows);
}

extern "C" sl_status sl_kcu_pack(void *stream, sl_ggml_type t, const void *src,
                                 void *dst, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0)
    return SL_ERR_INVALID_ARG;
  const size_t bytes = sl_kcu_packed_bytes(t, rows, cols);
  if (bytes == SIZE_MAX)
    return SL_ERR_OVERFLOW;
  int qb, sb;
  const bool packed = pk_sizes(t, &qb, &sb);
  int64_t be;
  size_t bb;
  if (!blk(t, &be, &bb))
    return SL_ERR_UNSUPPORTED;
  if (cols % be)
    return SL_ERR_INVALID_ARG;
  if (bytes == 0)
    return SL_OK;
  if (!src || !dst || src == dst)
    return SL_ERR_INVALID_ARG;
  cudaStream_t s = (cudaStream_t)stream;
  if (!packed) {
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
    return launch_status();
  }
  /* GGUF blocks are read 2 bytes at a time; packed chunks written 16 */
  if ((uintptr_t)src % 2 || (uintptr_t)dst % 16)
    return SL_ERR_INVALID_ARG;
  return with_packed(t, SL_ERR_UNSUPPORTED, [&](auto tr) {
    using T = decltype(tr);
    const int64_t nb = cols / 32;
    const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
    const int64_t items = tiles * nb * kTileRows;
    pack_kernel<T><<<grid_for(items), 256, 0, s>>>(
        (const uint8_t *)src, (uint8_t *)dst, rows, nb, items,
        pk_tile_bytes(T::QB, T::SB, nb));
    return launch_status();
  });
}
