/* bench_kern: matvec / matmul throughput of the CPU kernels per weight type
 * and thread count, next to a plain memory-read bandwidth figure.
 *
 *   bench_kern [--quick]      (SLUICE_CPU_ISA=scalar|avx2|avx512 to force)
 *
 * Weights are repacked (sl_kern_repack) where the ISA has packed kernels for
 * the type, as the model does at load; SLUICE_REPACK=0 measures the GGUF
 * layout instead. BENCH_KERN_TYPES=Q4_0,Q8_0 limits the types run.
 *
 * Decode (n_tokens = 1): GB/s of weight bytes streamed; it should approach the
 * read bandwidth. Prefill (n_tokens = 64, 256): "eff GB/s" = n_tokens x weight
 * bytes / time, i.e. how much faster than re-reading the weights per token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern/cpu/kern_cpu_impl.h"
#include "sluice/kern_cpu.h"
#include "sluice/util.h"

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}

/* Random blocks with small, finite scales (the d fields rewritten). */
static void fill(sl_ggml_type t, uint8_t *p, size_t bytes) {
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    uint64_t r = rnd();
    memcpy(p + i, &r, 8);
  }
  int64_t be;
  size_t bb;
  sl_kern_type_block(t, &be, &bb);
  uint16_t h = sl__f32_to_f16(0.01f);
  for (size_t off = 0; off + bb <= bytes; off += bb) {
    switch (t) {
    case SL_GGML_F32: {
      float f = 0.01f * (float)(int8_t)p[off];
      memcpy(p + off, &f, 4);
      break;
    }
    case SL_GGML_F16: /* |x| in [2^-5, 2^-4): no subnormals */
      p[off + 1] = (uint8_t)((p[off + 1] & 0x83) | 0x28);
      break;
    case SL_GGML_BF16: /* |x| in [2^-7, 2^-6) */
      p[off + 1] = (uint8_t)((p[off + 1] & 0x80) | 0x3c);
      break;
    case SL_GGML_Q4_1:
    case SL_GGML_Q5_1:
    case SL_GGML_Q4_K:
    case SL_GGML_Q5_K:
      memcpy(p + off + 2, &h, 2);
      /* fall through */
    case SL_GGML_Q4_0:
    case SL_GGML_Q5_0:
    case SL_GGML_IQ4_NL:
    case SL_GGML_Q8_0:
      memcpy(p + off, &h, 2);
      break;
    case SL_GGML_Q6_K:
      memcpy(p + off + 208, &h, 2);
      break;
    case SL_GGML_Q2_K: /* d, dmin last */
      memcpy(p + off + 80, &h, 2);
      memcpy(p + off + 82, &h, 2);
      break;
    case SL_GGML_Q3_K: /* d last */
      memcpy(p + off + 108, &h, 2);
      break;
    case SL_GGML_IQ4_XS: /* d first */
      memcpy(p + off, &h, 2);
      break;
    default:
      break;
    }
  }
}

typedef struct {
  const uint64_t *p;
  size_t n;
  uint64_t sums[64];
} read_job;

static void read_task(void *ctx, int ith, int nth) {
  read_job *j = ctx;
  size_t a = j->n * (size_t)ith / (size_t)nth;
  size_t b = j->n * (size_t)(ith + 1) / (size_t)nth;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = a; i + 4 <= b; i += 4) {
    s0 += j->p[i];
    s1 += j->p[i + 1];
    s2 += j->p[i + 2];
    s3 += j->p[i + 3];
  }
  j->sums[ith] = s0 + s1 + s2 + s3;
}

static const char *type_name(sl_ggml_type t) {
  switch (t) {
  case SL_GGML_F32:
    return "F32";
  case SL_GGML_F16:
    return "F16";
  case SL_GGML_BF16:
    return "BF16";
  case SL_GGML_Q8_0:
    return "Q8_0";
  case SL_GGML_Q4_0:
    return "Q4_0";
  case SL_GGML_Q4_1:
    return "Q4_1";
  case SL_GGML_Q4_K:
    return "Q4_K";
  case SL_GGML_Q5_K:
    return "Q5_K";
  case SL_GGML_Q6_K:
    return "Q6_K";
  default: {
    const sl_ggml_type_traits *tr = sl_ggml_type_traits_of(t);
    return tr ? tr->name : "?";
  }
  }
}

static double now_s(void) {
  return (double)sl_now_ns() / 1e9;
}

int main(int argc, char **argv) {
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  const size_t big = (quick ? 64u : 256u) << 20;
  sl_kern_pool_t *pools[2] = {sl_kern_pool_create(1), sl_kern_pool_create(2)};
  if (!pools[0] || !pools[1])
    return 1;
  printf("isa: %s\n", sl_kern_isa_name(sl_kern_cpu_isa()));

  uint64_t *mem = sl_malloc(big);
  if (!mem)
    return 1;
  memset(mem, 1, big);
  for (int p = 0; p < 2; p++) {
    read_job j = {.p = mem, .n = big / 8};
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
      double t0 = now_s();
      sl_kern_pool_run(pools[p], read_task, &j);
      double dt = now_s() - t0;
      best = dt < best ? dt : best;
    }
    printf("memory read (sum loop), %d thread%s: %6.1f GB/s\n", p + 1,
           p ? "s" : " ", (double)big / best / 1e9);
  }
  sl_free(mem);

  static const sl_ggml_type types[] = {
      SL_GGML_F32,  SL_GGML_F16,    SL_GGML_BF16, SL_GGML_Q8_0, SL_GGML_Q4_0,
      SL_GGML_Q4_1, SL_GGML_Q4_K,   SL_GGML_Q5_K, SL_GGML_Q6_K, SL_GGML_Q5_0,
      SL_GGML_Q5_1, SL_GGML_IQ4_NL, SL_GGML_Q2_K, SL_GGML_Q3_K, SL_GGML_IQ4_XS};
  /* the row length (BENCH_KERN_COLS, default 4096): a small model's rows
   * are short (576 in SmolLM2-135M), which changes what a kernel pays for */
  const char *cols_env = getenv("BENCH_KERN_COLS");
  const int64_t cols =
      cols_env && atoll(cols_env) >= 256 ? atoll(cols_env) / 256 * 256 : 4096;
  const char *only = getenv("BENCH_KERN_TYPES");
  printf("\n%-6s %3s %8s | %-18s | %-32s\n", "type", "pk", "MB",
         "decode GB/s 1t 2t", "prefill eff GB/s 64 1t, 64 2t, 256 2t");
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    sl_ggml_type t = types[ti];
    if (only && *only) {
      const char *n = type_name(t), *hit = strstr(only, n);
      size_t len = strlen(n);
      if (!hit || (hit != only && hit[-1] != ',') ||
          (hit[len] != 0 && hit[len] != ','))
        continue;
    }
    size_t rb;
    sl_kern_row_bytes(t, cols, &rb);
    int64_t rows = (int64_t)((quick ? 32u << 20 : 128u << 20) / rb);
    size_t wbytes = rb * (size_t)rows;
    uint8_t *w = sl_malloc(wbytes);
    float *X = sl_malloc(256 * cols * sizeof(float));
    float *Y = sl_malloc(256 * (size_t)rows * sizeof(float));
    if (!w || !X || !Y)
      return 1;
    fill(t, w, wbytes);
    for (int64_t i = 0; i < 256 * cols; i++)
      X[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    sl_kern_weight W = {t, rows, cols, w, NULL};
    size_t pbytes = sl_kern_repack_bytes(&W);
    void *packed = pbytes ? sl_malloc(pbytes) : NULL;
    if (packed && sl_kern_repack(&W, packed, pbytes) == SL_OK)
      W.packed = packed;
    double dec[2];
    for (int p = 0; p < 2; p++) {
      double best = 1e9;
      for (int r = 0; r < (quick ? 3 : 8); r++) {
        double t0 = now_s();
        sl_kern_matmul(pools[p], &W, X, Y, 1);
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
      }
      dec[p] = (double)wbytes / best / 1e9;
    }
    /* prefill on the first 8 MB worth of rows */
    int64_t prow = (int64_t)((8u << 20) / rb);
    if (prow > rows)
      prow = rows;
    /* the packed copy's first groups are those rows' */
    sl_kern_weight PW = {t, prow, cols, w, W.packed};
    double pre[3];
    static const int64_t ntoks[3] = {64, 64, 256};
    for (int k = 0; k < 3; k++) {
      double best = 1e9;
      for (int r = 0; r < 2; r++) {
        double t0 = now_s();
        sl_kern_matmul(pools[k > 0], &PW, X, Y, ntoks[k]);
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
      }
      pre[k] = (double)ntoks[k] * (double)(rb * (size_t)prow) / best / 1e9;
    }
    printf("%-6s %3s %8.1f | %8.1f %8.1f  | %10.1f %10.1f %10.1f\n",
           type_name(t), W.packed ? "yes" : "no", (double)wbytes / 1e6, dec[0],
           dec[1], pre[0], pre[1], pre[2]);
    sl_free(packed);
    sl_free(w);
    sl_free(X);
    sl_free(Y);
  }
  sl_kern_pool_destroy(pools[0]);
  sl_kern_pool_destroy(pools[1]);
  return 0;
}
