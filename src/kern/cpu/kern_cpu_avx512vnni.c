/* sluice — kern/cpu: AVX512_VNNI (EVEX vpdpbusd on 256 bits, with AVX-512 F,
 * BW, VL, DQ and the AVX2 set) dots and gemm tiles of the 32-element block
 * types: vnni_body.h compiled for that target, an overlay kern_cpu.c merges
 * into the AVX-512 table (level "avx512vnni": Ice Lake, Sapphire Rapids,
 * Zen 4 and later). Reached only when
 * sl_kern_cpu_isa_supported(SL_KERN_ISA_AVX512VNNI). */
#include "kern_cpu_impl.h"
#include "sluice/util.h"

#if defined(__x86_64__)

#pragma GCC push_options
#pragma GCC target(                                                            \
    "avx512vnni,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>

#define INL    static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")

#include "simd_avx2.h"

#define SL__DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#define SL__VNT               8
#define SL__VNNI_OPS          sl__kern_cpu_avx512vnni_ops
#include "vnni_body.h"

#pragma GCC pop_options

#else

const sl__kern_cpu_ops sl__kern_cpu_avx512vnni_ops = {0};

#endif
