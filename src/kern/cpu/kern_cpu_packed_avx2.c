/* sluice — kern/cpu: the AVX2 products over repacked weights (packed_body.h
 * with vpmaddubsw pairs): the avx2 and avx512 levels' packed entries. */
#include "kern_cpu_impl.h"

#if defined(__x86_64__)

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#define SL__PK_VNNI  0
#define SL__PK_TABLE sl__kern_cpu_avx2_packed
#include "packed_body.h"

#pragma GCC pop_options

#else

const sl__packed_fn sl__kern_cpu_avx2_packed[SL__NTYPES] = {0};

#endif
