/* sluice — kern/cpu: the products over repacked weights with EVEX vpdpbusd
 * on 256 bits (packed_body.h; AVX512_VNNI + VL: Ice Lake, Sapphire Rapids,
 * Zen 4): the avx512vnni level's packed entries. Same bits as the AVX2
 * ones. */
#include "kern_cpu_impl.h"

#if defined(__x86_64__)

#pragma GCC push_options
#pragma GCC target(                                                            \
    "avx512vnni,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>

#define SL__PK_VNNI           1
#define SL__DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#define SL__PK_TABLE          sl__kern_cpu_avx512vnni_packed
#include "packed_body.h"

#pragma GCC pop_options

#else

const sl__packed_fn sl__kern_cpu_avx512vnni_packed[SL__NTYPES] = {0};

#endif
