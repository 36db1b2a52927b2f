/* sluice — kern/cpu: ISA dispatch and the public entry points that are not
 * matmul or the pool.
 *
 * Process state: the merged op table of each ISA and a pointer to the one in
 * use. They are filled once (pthread_once) and read-only after that, except
 * for sl_kern_cpu_set_isa, which tests and benchmarks call while no kernel
 * runs. */
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cpu_k23.h"
#include "sluice/util.h"

static sl__kern_cpu_ops g_tables[SL_KERN_ISA_COUNT];
static _Atomic(const sl__kern_cpu_ops *) g_ops;
static _Atomic int g_isa;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) || defined(__i386__)
/* A CPUID feature bit (reg: 0 eax, 1 ebx, 2 ecx, 3 edx). For the features
 * that clang's __builtin_cpu_supports does not name (f16c, avxvnni): the
 * fuzz build compiles this file with clang. */
static bool cpuid_bit(unsigned leaf, unsigned sub, int reg, int bit) {
  unsigned r[4];
  if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3]))
    return false;
  return (r[reg] >> bit) & 1u;
}
#endif

bool sl_kern_cpu_isa_supported(sl_kern_isa isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              cpuid_bit(1, 0, 2, 29); /* f16c */
  switch (isa) {
  case SL_KERN_ISA_SCALAR:
    return true;
  case SL_KERN_ISA_AVX2:
    return avx2;
  case SL_KERN_ISA_AVX512:
    return avx2 && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
  case SL_KERN_ISA_AVXVNNI:
    return avx2 && cpuid_bit(7, 1, 0, 4); /* avxvnni */
  case SL_KERN_ISA_AVX512VNNI:
    return sl_kern_cpu_isa_supported(SL_KERN_ISA_AVX512) &&
           __builtin_cpu_supports("avx512vnni");
  }
  return false;
#else
  return isa == SL_KERN_ISA_SCALAR;
#endif
}

const char *sl_kern_isa_name(sl_kern_isa isa) {
  switch (isa) {
  case SL_KERN_ISA_SCALAR:
    return "scalar";
  case SL_KERN_ISA_AVX2:
    return "avx2";
  case SL_KERN_ISA_AVX512:
    return "avx512";
  case SL_KERN_ISA_AVXVNNI:
    return "avxvnni";
  case SL_KERN_ISA_AVX512VNNI:
    return "avx512vnni";
  }
  return "?";
}

/* The level a capped choice falls back to when the CPU lacks `isa`: the
 * same family without its newest part (scalar stays scalar). */
static sl_kern_isa isa_below(sl_kern_isa isa) {
  switch (isa) {
  case SL_KERN_ISA_AVX512VNNI:
    return SL_KERN_ISA_AVX512;
  case SL_KERN_ISA_AVX512:
  case SL_KERN_ISA_AVXVNNI:
    return SL_KERN_ISA_AVX2;
  default:
    return SL_KERN_ISA_SCALAR;
  }
}

/* The best level this CPU has, by preference. */
static sl_kern_isa isa_best(void) {
  static const sl_kern_isa pref[] = {SL_KERN_ISA_AVX512VNNI, SL_KERN_ISA_AVX512,
                                     SL_KERN_ISA_AVXVNNI, SL_KERN_ISA_AVX2};
  for (size_t i = 0; i < sizeof pref / sizeof pref[0]; i++)
    if (sl_kern_cpu_isa_supported(pref[i]))
      return pref[i];
  return SL_KERN_ISA_SCALAR;
}

/* dst = base with every non-NULL entry of over laid on top. */
static void merge(sl__kern_cpu_ops *dst, const sl__kern_cpu_ops *base,
                  const sl__kern_cpu_ops *over) {
  *dst = *base;
  for (int i = 0; i < SL__NTYPES; i++) {
    if (over->dequant[i])
      dst->dequant[i] = over->dequant[i];
    if (over->quant[i])
      dst->quant[i] = over->quant[i];
    if (over->dot[i]) {
      /* a gemm must match its own table's dot: a new dot without a new
       * gemm drops the inherited gemm */
      dst->dot[i] = over->dot[i];
      dst->gemm[i] = over->gemm[i];
      dst->gemm_one[i] = over->gemm_one[i];
    } else if (over->gemm[i]) {
      dst->gemm[i] = over->gemm[i];
      dst->gemm_one[i] = over->gemm_one[i];
    }
    /* a packed kernel keeps its own order: it survives a new dot */
    if (over->packed[i])
      dst->packed[i] = over->packed[i];
  }
#define SL__OVER(f)                                                            \
  if (over->f)                                                                 \
  dst->f = over->f
  SL__OVER(rmsnorm);
  SL__OVER(rope);
  SL__OVER(softmax);
  SL__OVER(swiglu);
  SL__OVER(add);
  SL__OVER(f32_to_f16);
  SL__OVER(attn_f16);
#undef SL__OVER
}

/* SLUICE_ISA, else its old name SLUICE_CPU_ISA; NULL when neither is set. */
static const char *isa_env(const char **name) {
  const char *env = getenv("SLUICE_ISA");
  *name = "SLUICE_ISA";
  if (!env || !*env) {
    env = getenv("SLUICE_CPU_ISA");
    *name = "SLUICE_CPU_ISA";
  }
  return env && *env ? env : NULL;
}

sl_status sl_kern_cpu_isa_requested(sl_kern_isa *isa) {
  const char *name, *env = isa_env(&name);
  if (!env)
    return SL_ERR_NOT_FOUND;
  for (int i = 0; i < SL_KERN_ISA_COUNT; i++)
    if (strcmp(env, sl_kern_isa_name((sl_kern_isa)i)) == 0) {
      *isa = (sl_kern_isa)i;
      return SL_OK;
    }
  return SL_ERR_INVALID_ARG;
}

static void init_once(void) {
  merge(&g_tables[SL_KERN_ISA_SCALAR], &sl__kern_cpu_scalar_ops,
        &sl__kern_cpu_q5_scalar_ops);
  sl__kern_cpu_ops avx2;
  merge(&avx2, &sl__kern_cpu_avx2_ops, &sl__kern_cpu_q5_avx2_ops);
  for (int i = 0; i < SL__NTYPES; i++) {
    if (sl__kern_cpu_avx2_gemm[i])
      avx2.gemm[i] = sl__kern_cpu_avx2_gemm[i];
    avx2.packed[i] = sl__kern_cpu_avx2_packed[i];
  }
  merge(&g_tables[SL_KERN_ISA_AVX2], &g_tables[SL_KERN_ISA_SCALAR], &avx2);
  merge(&g_tables[SL_KERN_ISA_AVX512], &g_tables[SL_KERN_ISA_AVX2],
        &sl__kern_cpu_avx512_ops);
  merge(&g_tables[SL_KERN_ISA_AVXVNNI], &g_tables[SL_KERN_ISA_AVX2],
        &sl__kern_cpu_avxvnni_ops);
  merge(&g_tables[SL_KERN_ISA_AVX512VNNI], &g_tables[SL_KERN_ISA_AVX512],
        &sl__kern_cpu_avx512vnni_ops);
  /* the VNNI levels' packed kernels: packed_body.h with vpdpbusd */
  for (int i = 0; i < SL__NTYPES; i++) {
    g_tables[SL_KERN_ISA_AVXVNNI].packed[i] = sl__kern_cpu_avxvnni_packed[i];
    g_tables[SL_KERN_ISA_AVX512VNNI].packed[i] =
        sl__kern_cpu_avx512vnni_packed[i];
  }
  sl_kern_isa want = SL_KERN_ISA_SCALAR;
  const char *name, *env = isa_env(&name);
  sl_status st = sl_kern_cpu_isa_requested(&want);
  if (st == SL_ERR_INVALID_ARG)
    SL_LOGW("%s=%s not understood (scalar|avx2|avx512|avxvnni|avx512vnni): "
            "using the best level this CPU has",
            name, env);
  sl_kern_isa isa = isa_best();
  if (st == SL_OK) {
    isa = want;
    while (!sl_kern_cpu_isa_supported(isa))
      isa = isa_below(isa);
    if (isa != want)
      SL_LOGW("%s=%s: this CPU cannot run it, using %s", name, env,
              sl_kern_isa_name(isa));
  }
  atomic_store(&g_isa, (int)isa);
  atomic_store(&g_ops, &g_tables[isa]);
}

const sl__kern_cpu_ops *sl__kern_cpu_ops_get(void) {
  const sl__kern_cpu_ops *ops =
      atomic_load_explicit(&g_ops, memory_order_acquire);
  if (__builtin_expect(ops != NULL, 1))
    return ops;
  pthread_once(&g_once, init_once);
  return atomic_load(&g_ops);
}

sl_kern_isa sl_kern_cpu_isa(void) {
  sl__kern_cpu_ops_get();
  return (sl_kern_isa)atomic_load(&g_isa);
}

sl_status sl_kern_cpu_set_isa(sl_kern_isa isa) {
  if ((int)isa < 0 || (int)isa >= SL_KERN_ISA_COUNT)
    return SL_ERR_INVALID_ARG;
  if (!sl_kern_cpu_isa_supported(isa))
    return SL_ERR_UNSUPPORTED;
  sl__kern_cpu_ops_get();
  atomic_store(&g_isa, (int)isa);
  atomic_store(&g_ops, &g_tables[isa]);
  return SL_OK;
}

/* ---- types ----------------------------------------------------------------
 */

/* The types the kernels implement, with the size of their block struct
 * (0: not implemented). The sizes live in one table (util's ggml type
 * traits); this only checks that the kernels' structs match it. */
static size_t kern_block_struct(sl_ggml_type t) {
  int64_t e;
  size_t b;
  switch (t) {
  case SL_GGML_F32:
    e = 1, b = 4;
    break;
  case SL_GGML_F16:
  case SL_GGML_BF16:
    e = 1, b = 2;
    break;
  case SL_GGML_Q4_0:
    e = SL__QK, b = sizeof(sl__block_q4_0);
    break;
  case SL_GGML_Q4_1:
    e = SL__QK, b = sizeof(sl__block_q4_1);
    break;
  case SL_GGML_Q8_0:
    e = SL__QK, b = sizeof(sl__block_q8_0);
    break;
  case SL_GGML_Q8_1:
    e = SL__QK, b = sizeof(sl__block_q8_1);
    break;
  case SL_GGML_Q4_K:
    e = SL__QK_K, b = sizeof(sl__block_q4_K);
    break;
  case SL_GGML_Q5_K:
    e = SL__QK_K, b = sizeof(sl__block_q5_K);
    break;
  case SL_GGML_Q6_K:
    e = SL__QK_K, b = sizeof(sl__block_q6_K);
    break;
  case SL_GGML_Q8_K:
    e = SL__QK_K, b = sizeof(sl__block_q8_K);
    break;
  case SL_GGML_Q5_0:
    e = SL__QK, b = sizeof(sl__block_q5_0);
    break;
  case SL_GGML_Q5_1:
    e = SL__QK, b = sizeof(sl__block_q5_1);
    break;
  case SL_GGML_IQ4_NL:
    e = SL__QK, b = sizeof(sl__block_iq4_nl);
    break;
  case SL_GGML_Q2_K:
    e = SL__QK_K, b = sizeof(sl__block_q2_K);
    break;
  case SL_GGML_Q3_K:
    e = SL__QK_K, b = sizeof(sl__block_q3_K);
    break;
  case SL_GGML_IQ4_XS:
    e = SL__QK_K, b = sizeof(sl__block_iq4_xs);
    break;
  default:
    return 0;
  }
  (void)e;
  return b;
}

bool sl_kern_type_block(sl_ggml_type t, int64_t *block_elems,
                        size_t *block_bytes) {
  const sl_ggml_type_traits *tr = sl_ggml_type_traits_of(t);
  size_t st = kern_block_struct(t);
  if (!tr || !st)
    return false;
  SL_ASSERT_MSG(st == tr->type_size,
                "a kernel block struct disagrees with the ggml type table");
  if (block_elems)
    *block_elems = tr->blck_size;
  if (block_bytes)
    *block_bytes = tr->type_size;
  return true;
}

sl_status sl_kern_row_bytes(sl_ggml_type t, int64_t n, size_t *out) {
  int64_t be;
  size_t bb;
  if (!sl_kern_type_block(t, &be, &bb))
    return SL_ERR_UNSUPPORTED;
  if (n < 0 || n % be != 0)
    return SL_ERR_INVALID_ARG;
  size_t bytes;
  if (!sl_mul_ok((size_t)(n / be), bb, &bytes))
    return SL_ERR_OVERFLOW;
  if (out)
    *out = bytes;
  return SL_OK;
}

sl_status sl_kern_dequant_row(sl_ggml_type t, const void *src, float *dst,
                              int64_t n) {
  sl_status st = sl_kern_row_bytes(t, n, NULL);
  if (st != SL_OK)
    return st;
  sl__dequant_fn fn = sl__kern_cpu_ops_get()->dequant[t];
  if (!fn)
    return SL_ERR_UNSUPPORTED;
  if (n > 0)
    fn(src, dst, n);
  return SL_OK;
}

sl_status sl_kern_act_type(sl_ggml_type wt, sl_ggml_type *act) {
  sl_ggml_type a;
  switch (wt) {
  case SL_GGML_F32:
  case SL_GGML_F16:
  case SL_GGML_BF16:
    a = SL_GGML_F32;
    break;
  case SL_GGML_Q4_0:
  case SL_GGML_Q5_0:
  case SL_GGML_IQ4_NL:
  case SL_GGML_Q8_0:
    a = SL_GGML_Q8_0;
    break;
  case SL_GGML_Q4_1:
  case SL_GGML_Q5_1:
    a = SL_GGML_Q8_1;
    break;
  case SL_GGML_Q4_K:
  case SL_GGML_Q5_K:
  case SL_GGML_Q6_K:
  case SL_GGML_Q2_K:
  case SL_GGML_Q3_K:
  case SL_GGML_IQ4_XS:
    a = SL_GGML_Q8_K;
    break;
  default:
    return SL_ERR_UNSUPPORTED;
  }
  if (act)
    *act = a;
  return SL_OK;
}

sl_status sl_kern_quantize_act(sl_ggml_type act, const float *x, void *dst,
                               int64_t n) {
  if (act != SL_GGML_F32 && act != SL_GGML_Q8_0 && act != SL_GGML_Q8_1 &&
      act != SL_GGML_Q8_K)
    return SL_ERR_UNSUPPORTED;
  sl_status st = sl_kern_row_bytes(act, n, NULL);
  if (st != SL_OK)
    return st;
  if (n > 0)
    sl__kern_cpu_ops_get()->quant[act](x, dst, n);
  return SL_OK;
}

sl_status sl_kern_vec_dot(sl_ggml_type wt, int64_t n, const void *w_row,
                          const void *x_act, float *out) {
  sl_ggml_type act;
  sl_status st = sl_kern_act_type(wt, &act);
  if (st != SL_OK)
    return st;
  if ((st = sl_kern_row_bytes(wt, n, NULL)) != SL_OK)
    return st;
  if ((st = sl_kern_row_bytes(act, n, NULL)) != SL_OK)
    return st;
  if (n == 0) {
    *out = 0;
    return SL_OK;
  }
  sl__kern_cpu_ops_get()->dot[wt](n, w_row, x_act, 0, out, 0, 1);
  return SL_OK;
}

/* ---- small ops ------------------------------------------------------------
 */

void sl_kern_rmsnorm(float *out, const float *x, const float *w, int64_t n,
                     float eps) {
  SL_ASSERT(n >= 1);
  sl__kern_cpu_ops_get()->rmsnorm(out, x, w, n, eps);
}

sl_status sl_kern_rope(float *x, int64_t n_heads, int64_t head_dim,
                       int64_t n_rot, int64_t pos, float freq_base,
                       float freq_scale, sl_kern_rope_mode mode) {
  enum { MAX_ROT = 4096 };
  if (n_heads < 0 || head_dim < 0 || n_rot < 0 || n_rot % 2 != 0 ||
      n_rot > head_dim || n_rot > MAX_ROT ||
      (mode != SL_KERN_ROPE_NORM && mode != SL_KERN_ROPE_NEOX))
    return SL_ERR_INVALID_ARG;
  if (n_rot == 0 || n_heads == 0)
    return SL_OK;
  float cs[MAX_ROT / 2], sn[MAX_ROT / 2];
  /* As ggml computes the angles (its rope cache): in float, the base
   * frequency raised once and the angle multiplied by it pair after pair.
   * Not the most exact, but matching it keeps the f16 K cache and the f16
   * rounding of Q in attention on the same side of each rounding boundary as
   * llama.cpp; the angle error is ~(i + 1) ulp of pos. */
  const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
  float theta = (float)pos;
  for (int64_t i = 0; i < n_rot / 2; i++) {
    float th = freq_scale * theta;
    cs[i] = cosf(th);
    sn[i] = sinf(th);
    theta *= theta_scale;
  }
  sl__kern_cpu_ops_get()->rope(x, n_heads, head_dim, n_rot, cs, sn,
                               mode == SL_KERN_ROPE_NEOX);
  return SL_OK;
}

void sl_kern_softmax(float *x, int64_t n) {
  SL_ASSERT(n >= 1);
  sl__kern_cpu_ops_get()->softmax(x, n);
}

void sl_kern_swiglu(float *out, const float *gate, const float *up, int64_t n) {
  if (n > 0)
    sl__kern_cpu_ops_get()->swiglu(out, gate, up, n);
}

void sl_kern_add(float *out, const float *a, const float *b, int64_t n) {
  if (n > 0)
    sl__kern_cpu_ops_get()->add(out, a, b, n);
}

void sl_kern_f32_to_f16(uint16_t *dst, const float *src, int64_t n) {
  if (n > 0)
    sl__kern_cpu_ops_get()->f32_to_f16(dst, src, n);
}

sl_status sl_kern_attn_f16_paged(float *out, const float *q,
                                 const uint16_t *const *kb,
                                 const uint16_t *const *vb, int block_shift,
                                 int64_t head_dim, int64_t len,
                                 int64_t kv_stride, float scale, bool single,
                                 float *scratch) {
  if (!out || !q || !kb || !vb || !scratch || head_dim < 1 ||
      head_dim > SL_KERN_ATTN_MAX_HEAD_DIM || len < 1 || kv_stride < head_dim ||
      block_shift < 0 || block_shift > 62)
    return SL_ERR_INVALID_ARG;
  int64_t nb = ((len - 1) >> block_shift) + 1;
  for (int64_t i = 0; i < nb; i++)
    if (!kb[i] || !vb[i])
      return SL_ERR_INVALID_ARG;
  sl__kern_cpu_ops_get()->attn_f16(out, q, kb, vb, block_shift, head_dim, len,
                                   kv_stride, scale, single, scratch);
  return SL_OK;
}

sl_status sl_kern_attn_f16(float *out, const float *q, const uint16_t *k,
                           const uint16_t *v, int64_t head_dim, int64_t len,
                           int64_t kv_stride, float scale, bool single,
                           float *scratch) {
  return sl_kern_attn_f16_paged(out, q, &k, &v, 62, head_dim, len, kv_stride,
                                scale, single, scratch);
}
