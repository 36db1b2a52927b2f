/* sluice — kern/cpu: the products over repacked weights with VEX vpdpbusd
 * (packed_body.h; AVX-VNNI without AVX-512: Alder Lake and later cores):
 * the avxvnni level's packed entries. Same bits as the AVX2 ones. */
#include "kern_cpu_impl.h"

#if defined(__x86_64__)

#pragma GCC push_options
#pragma GCC target("avxvnni,avx2,fma,f16c")
#include <immintrin.h>

#define SL__PK_VNNI           1
#define SL__DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#define SL__PK_TABLE          sl__kern_cpu_avxvnni_packed
#include "packed_body.h"

#pragma GCC pop_options

#else

const sl__packed_fn sl__kern_cpu_avxvnni_packed[SL__NTYPES] = {0};

#endif
