/* sluice — kern/cpu: vnni_body.h with the avxvnni level's tiling (four
 * tokens per tile, SL__VNT 4) but EVEX-encoded, for test_kern_cpu only: no
 * level uses it. On a machine with AVX512_VNNI and no AVX-VNNI it runs the
 * logic the VEX build (kern_cpu_avxvnni.c) compiles, so that logic is tested
 * here (its results must equal the avx512vnni level's bit for bit: the order
 * of the sums does not depend on the tile); only the VEX encoding itself
 * goes untested. */
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
#define SL__VNT               4
#define SL__VNNI_OPS          sl__kern_cpu_avx512vnni4_ops
#include "vnni_body.h"

#pragma GCC pop_options

#else

const sl__kern_cpu_ops sl__kern_cpu_avx512vnni4_ops = {0};

#endif
