/* sluice — kern/cuda: the packed device layout of Q4_0, Q4_1 and Q8_0
 * weights (sl_kcu_pack writes it; mmv_packed.cu, pack.cu read it). Private
 * to src/kern/cuda.
 *
 * GGUF blocks of 18, 20 and 34 bytes leave rows and quants only 2-byte
 * aligned, so the kernels would load them 2 or 4 bytes at a time. The packed
 * layout keeps every byte's meaning (the same quants, the same f16 scales
 * and mins) and only moves them apart:
 *
 *   rows are grouped in tiles of kTileRows = 16 (the last one padded with
 *   zero rows); tile i starts at i * tile_bytes. In a tile of nb blocks per
 *   row, first the quants: 16-byte chunks (a Q4 block's 16 bytes of nibbles,
 *   or half a Q8_0 block's 32 int8), chunk c of row-in-tile rr at
 *   (c * 16 + rr) * 16; then the scales: block b of rr at
 *   16 * nb * QB + (b * 16 + rr) * SB, an f16 d (Q4_0, Q8_0; SB = 2) or the
 *   pair f16 d, f16 m (Q4_1; SB = 4, d first, as in the GGUF block).
 *
 * So the 16 rows of a tile lie side by side: a warp whose lanes take rows
 * rr = lane % 16 of chunks 2j + lane / 16 reads 512 contiguous bytes per
 * 16-byte load, and 64 (128 for Q4_1) contiguous bytes of scales. A row's
 * place depends only on its index and nb, not on the row count: get_rows
 * (which is not told the row count) finds it. Tiles of 16 rather than 32
 * rows halve the work unit of a thread block (better load balance over 132
 * SMs for rows / 32 not a multiple of 132).
 */
#ifndef SLUICE_KERN_CUDA_PACKED_CUH
#define SLUICE_KERN_CUDA_PACKED_CUH

#include <stddef.h>
#include <stdint.h>

#include "sluice/ggml_type.h"

namespace sl_kcu {

constexpr int kTileRows = 16;

/* The packed types: QB quant bytes and SB scale bytes per block of 32. */
struct pk_q4_0 {
  static constexpr int QB = 16, SB = 2, CPB = 1; /* 16-byte chunks a block */
  static constexpr sl_ggml_type TYPE = SL_GGML_Q4_0;
  static constexpr int GGUF_BYTES = 18;
};
struct pk_q4_1 {
  static constexpr int QB = 16, SB = 4, CPB = 1;
  static constexpr sl_ggml_type TYPE = SL_GGML_Q4_1;
  static constexpr int GGUF_BYTES = 20;
};
struct pk_q8_0 {
  static constexpr int QB = 32, SB = 2, CPB = 2;
  static constexpr sl_ggml_type TYPE = SL_GGML_Q8_0;
  static constexpr int GGUF_BYTES = 34;
};

/* QB and SB of a packed type; false for the others. */
inline bool pk_sizes(sl_ggml_type t, int *qb, int *sb) {
  switch (t) {
  case SL_GGML_Q4_0:
    *qb = 16, *sb = 2;
    return true;
  case SL_GGML_Q4_1:
    *qb = 16, *sb = 4;
    return true;
  case SL_GGML_Q8_0:
    *qb = 32, *sb = 2;
    return true;
  default:
    return false;
  }
}

/* Calls f with a value of the packed traits of t; SL_ERR_UNSUPPORTED
 * (through `fail`) for the other types. */
template <class F, class R> R with_packed(sl_ggml_type t, R fail, F &&f) {
  switch (t) {
  case SL_GGML_Q4_0:
    return f(pk_q4_0{});
  case SL_GGML_Q4_1:
    return f(pk_q4_1{});
  case SL_GGML_Q8_0:
    return f(pk_q8_0{});
  default:
    return fail;
  }
}

/* Bytes of one tile of rows of nb blocks. */
__host__ __device__ inline size_t pk_tile_bytes(int qb, int sb, int64_t nb) {
  return (size_t)kTileRows * (size_t)nb * (size_t)(qb + sb);
}

/* 16-byte and scale loads that stream past L1 (ld.global.nc with
 * L1::no_allocate): each weight byte is read once, and keeping it out of L1
 * leaves L1 to x, which every warp rereads. */
__device__ __forceinline__ uint4 ld_stream16(const void *p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_stream_u16(const void *p) {
  unsigned short v;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_stream_u32(const void *p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

/* The float 2^23 + byte e of v, exactly (one PRMT): subtracting 2^23 + bias
 * (one FADD) gives byte - bias as an exact float. */
__device__ __forceinline__ float pk_byte_f(uint32_t v, int e) {
  return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540u | (unsigned)e));
}

} // namespace sl_kcu

#endif
