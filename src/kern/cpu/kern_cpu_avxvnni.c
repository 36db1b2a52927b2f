/* sluice — kern/cpu: AVX-VNNI (VEX vpdpbusd on 256 bits, with AVX2 + FMA +
 * F16C) dots and gemm tiles of the 32-element block types: vnni_body.h
 * compiled for that target, an overlay kern_cpu.c merges into the AVX2 table
 * (level "avxvnni": Intel cores from Alder Lake on, without AVX-512). Reached
 * only when sl_kern_cpu_isa_supported(SL_KERN_ISA_AVXVNNI).
 *
 * The same source runs, EVEX-encoded, as the avx512vnni level
 * (kern_cpu_avx512vnni.c): a machine with AVX512_VNNI tests the logic of this
 * file through that one, but only a CPU with AVX-VNNI runs this encoding. */
#include "kern_cpu_impl.h"
#include "sluice/util.h"

#if defined(__x86_64__)

#pragma GCC push_options
#pragma GCC target("avxvnni,avx2,fma,f16c")
#include <immintrin.h>

#define INL    static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")

#include "simd_avx2.h"

#define SL__DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#define SL__VNT               4
#define SL__VNNI_OPS          sl__kern_cpu_avxvnni_ops
#include "vnni_body.h"

#pragma GCC pop_options

#else

const sl__kern_cpu_ops sl__kern_cpu_avxvnni_ops = {0};

#endif
