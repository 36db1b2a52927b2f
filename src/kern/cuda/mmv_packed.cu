/* sluice — kern/cuda: the matrix-vector kernels (n <= SL_KCU_MMV_MAX_TOKENS)
 * for Q4_0, Q4_1 and Q8_0 weights in the packed layout (packed.cuh): the
 * decode path of the benchmark models, built to read the weights at HBM
 * speed.
 *
 * A thread block takes RL tiles of 16 rows and W warps split the row's
 * 16-byte chunks between them: warp w takes the chunk pairs j = w, w + W,
 * ..., lane l the chunk 2j + l / 16 of row-in-tile l % 16. So each 16-byte
 * load of a warp reads 512 contiguous bytes (coalesced, 4 sectors of 128
 * bytes), its scale load 64 contiguous bytes, and every lane of a half-warp
 * wants the same x: x loads are broadcasts (one L1 wavefront for the 16
 * lanes) instead of the 32 distinct lines, 128 bytes apart, that a lane per
 * block along the row reads (a 16- or 32-way L1 bank conflict per x load:
 * the bottleneck of the previous kernel, which ran at ~1.1 TB/s).
 *
 * Each thread keeps U chunks of each of its RL rows in flight (16 bytes
 * each, loaded with L1::no_allocate so that the stream of weights does not
 * evict x from L1) and loads the next U before computing the current ones
 * (double buffering in registers). W and RL are chosen from the matrix shape
 * alone so that ~2048 warps (16 per SM of an H200) run, each with >= 2 pairs
 * per pass where the row is long enough.
 *
 * Arithmetic, all f32: a byte becomes an exact float by the exponent trick
 * (one PRMT, one FADD, packed.cuh). Per chunk and token, a Q4 row keeps two
 * partial dots, low nibbles (q - 8) x and high nibbles 16 (q - 8) x (the
 * high nibble is used in place, times 16: one LOP instead of a shift; the
 * factor 16 is exact and is taken out of the scale, d / 16), then
 * acc += d * lo + (d / 16) * hi; Q4_1 adds m * sum(x of the block), the block
 * sums of x being computed once per thread block into shared memory; Q8_0
 * keeps two partial dots over its 16 bytes, acc += d * (p0 + p1). For one
 * token that is ~3.6 instructions per weight (PRMT, FADD, 1.06 FMA, 0.25
 * LOP, 0.25 / RL x loads, the rest per chunk): the H200's 128 lanes a clock
 * per SM can then issue 28 Q4_0 weights (16 bytes of HBM) a clock per SM,
 * just about the HBM rate; Q8_0 (1.06 bytes a weight) is memory-bound.
 *
 * Batch invariance: a row's sum runs over the same chunks in the same order
 * (its lane's chunks in increasing order, then the half-warp exchange, then
 * warps 0..W-1 in order) for any n; n only adds tokens beside it.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "mm_impl.cuh"
#include "packed.cuh"

namespace sl_kcu {
namespace {

__device__ __forceinline__ float h2f(uint32_t bits) {
  return __half2float(__ushort_as_half((unsigned short)bits));
}
__device__ __forceinline__ float lane4(const float4 &v, int e) {
  return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}
__device__ __forceinline__ uint32_t word(const uint4 &v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* U chunks of each of RL rows: quants and scale words. */
template <int U, int RL> struct stage {
  uint4 q[U][RL];
  uint32_t s[U][RL];
};

/* acc[k][t] += the dot of chunk c of row k (quants q[k], scale word s[k])
 * with token t of x. sx: the block sums of x (Q4_1 only), (N, nb). */
template <class T, int N, int RL>
__device__ __forceinline__ void
chunk(const uint4 *q, const uint32_t *s, const float *__restrict__ x,
      int64_t cols, int c, const float *sx, int nb, float (&acc)[RL][N]) {
  constexpr bool MIN = T::SB == 4;
  float d[RL];
#pragma unroll
  for (int k = 0; k < RL; k++)
    d[k] = h2f(s[k] & 0xFFFF);

  if (T::QB == 16) { /* Q4_0, Q4_1: chunk c is block c */
    constexpr float blo = MIN ? 8388608.0f : 8388616.0f; /* 2^23 + 8 */
    constexpr float bhi = MIN ? 8388608.0f : 8388736.0f; /* 2^23 + 128 */
    const float *xb = x + (int64_t)c * 32;
    float plo[RL][N], phi[RL][N];
#pragma unroll
    for (int k = 0; k < RL; k++)
#pragma unroll
      for (int t = 0; t < N; t++)
        plo[k][t] = phi[k][t] = 0.0f;
        /* many tokens: a rolled loop, or the compiler hoists every x load of
         * the chunk and spills (the order of the sums is the same) */
#pragma unroll(N >= 5 ? 1 : 4)
    for (int wd = 0; wd < 4; wd++) {
      float ql[RL][4], qh[RL][4];
#pragma unroll
      for (int k = 0; k < RL; k++) {
        const uint32_t v = word(q[k], wd);
        const uint32_t lo = v & 0x0F0F0F0Fu, hi = v & 0xF0F0F0F0u;
#pragma unroll
        for (int e = 0; e < 4; e++) {
          ql[k][e] = pk_byte_f(lo, e) - blo;
          qh[k][e] = pk_byte_f(hi, e) - bhi;
        }
      }
#pragma unroll
      for (int t = 0; t < N; t++) {
        const float4 xl = __ldg((const float4 *)(xb + t * cols + 4 * wd));
        const float4 xh = __ldg((const float4 *)(xb + t * cols + 16 + 4 * wd));
#pragma unroll
        for (int k = 0; k < RL; k++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            plo[k][t] = fmaf(ql[k][e], lane4(xl, e), plo[k][t]);
            phi[k][t] = fmaf(qh[k][e], lane4(xh, e), phi[k][t]);
          }
      }
    }
#pragma unroll
    for (int k = 0; k < RL; k++) {
      const float d16 = d[k] * 0.0625f; /* exact */
      const float m = MIN ? h2f(s[k] >> 16) : 0.0f;
#pragma unroll
      for (int t = 0; t < N; t++) {
        float a = fmaf(d[k], plo[k][t], acc[k][t]);
        a = fmaf(d16, phi[k][t], a);
        if (MIN)
          a = fmaf(m, sx[t * nb + c], a);
        acc[k][t] = a;
      }
    }
  } else { /* Q8_0: chunk c is half c % 2 of block c / 2 */
    const float *xb = x + (int64_t)c * 16;
    float p[RL][N][2]; /* even and odd words: two chains */
#pragma unroll
    for (int k = 0; k < RL; k++)
#pragma unroll
      for (int t = 0; t < N; t++)
        p[k][t][0] = p[k][t][1] = 0.0f;
#pragma unroll(N >= 5 ? 1 : 2)
    for (int wp = 0; wp < 2; wp++) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int wd = 2 * wp + h;
        float qv[RL][4];
#pragma unroll
        for (int k = 0; k < RL; k++) {
          /* flipping the sign bits maps int8 q to the unsigned q + 128 */
          const uint32_t v = word(q[k], wd) ^ 0x80808080u;
#pragma unroll
          for (int e = 0; e < 4; e++)
            qv[k][e] = pk_byte_f(v, e) - 8388736.0f;
        }
#pragma unroll
        for (int t = 0; t < N; t++) {
          const float4 xv = __ldg((const float4 *)(xb + t * cols + 4 * wd));
#pragma unroll
          for (int k = 0; k < RL; k++)
#pragma unroll
            for (int e = 0; e < 4; e++)
              p[k][t][h] = fmaf(qv[k][e], lane4(xv, e), p[k][t][h]);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < RL; k++)
#pragma unroll
      for (int t = 0; t < N; t++)
        acc[k][t] = fmaf(d[k], p[k][t][0] + p[k][t][1], acc[k][t]);
  }
}

/* y[t][r] = dot(W row r, x[t]) for the rows of tiles [blockIdx.x * RL, +RL).
 * Dynamic shared memory: the block sums of x (Q4_1: N * nb floats), then
 * the warps' partial sums (W * RL * N * 16 floats). */
template <class T, int N, int RL, int U>
__global__ void __launch_bounds__(512, N == 1 ? 2 : 1)
    mmvp_kernel(const uint8_t *__restrict__ w, size_t tile_bytes, int64_t tiles,
                int64_t rows, int nb, const float *__restrict__ x, int64_t cols,
                float *__restrict__ y) {
  extern __shared__ float smem[];
  constexpr bool MIN = T::SB == 4;
  const int W = blockDim.x >> 5;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rr = lane & 15, hh = lane >> 4;
  const int64_t t0 = (int64_t)blockIdx.x * RL;
  const int C = nb * T::CPB, P = (C + 1) >> 1, step = W * U;

  const uint8_t *tq[RL], *ts[RL];
#pragma unroll
  for (int k = 0; k < RL; k++) { /* a tile past the end rereads the last */
    const int64_t ti = t0 + k < tiles ? t0 + k : tiles - 1;
    const uint8_t *base = w + (size_t)ti * tile_bytes;
    tq[k] = base + rr * 16;
    ts[k] = base + (size_t)kTileRows * nb * T::QB + rr * T::SB;
  }

  auto load = [&](int j0, stage<U, RL> &st) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int j = j0 + u * W, c = 2 * j + hh;
      if (j < P && c < C) {
        const size_t sb = (size_t)(c / T::CPB) * kTileRows * T::SB;
#pragma unroll
        for (int k = 0; k < RL; k++) {
          st.q[u][k] = ld_stream16(tq[k] + (size_t)c * kTileRows * 16);
          st.s[u][k] = T::SB == 4 ? ld_stream_u32(ts[k] + sb)
                                  : ld_stream_u16(ts[k] + sb);
        }
      }
    }
  };

  float acc[RL][N];
#pragma unroll
  for (int k = 0; k < RL; k++)
#pragma unroll
    for (int t = 0; t < N; t++)
      acc[k][t] = 0.0f;

  const float *sx = smem;
  auto compute = [&](int j0, const stage<U, RL> &st) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int j = j0 + u * W, c = 2 * j + hh;
      if (j < P && c < C)
        chunk<T, N, RL>(st.q[u], st.s[u], x, cols, c, sx, nb, acc);
    }
  };

  stage<U, RL> sa, sb;
  int j0 = warp;
  if (j0 < P)
    load(j0, sa); /* in flight while the block sums of x are made */
  if (MIN) {
    for (int i = threadIdx.x; i < N * nb; i += blockDim.x) {
      const int t = i / nb, b = i - t * nb;
      const float4 *p = (const float4 *)(x + t * cols + 32 * b);
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const float4 v = __ldg(p + k);
        s += v.x;
        s += v.y;
        s += v.z;
        s += v.w;
      }
      smem[i] = s;
    }
    __syncthreads();
  }
  /* two stages in turn: the next one's loads go out before the current one
   * is used */
  for (;;) {
    if (j0 >= P)
      break;
    if (j0 + step < P)
      load(j0 + step, sb);
    compute(j0, sa);
    j0 += step;
    if (j0 >= P)
      break;
    if (j0 + step < P)
      load(j0 + step, sa);
    compute(j0, sb);
    j0 += step;
  }

  /* lanes l and l + 16 hold the two halves of row l's pairs */
#pragma unroll
  for (int k = 0; k < RL; k++)
#pragma unroll
    for (int t = 0; t < N; t++)
      acc[k][t] += __shfl_xor_sync(0xffffffffu, acc[k][t], 16);
  float *part = smem + (MIN ? N * nb : 0);
  constexpr int PW = RL * N * kTileRows; /* floats per warp */
  if (hh == 0) {
#pragma unroll
    for (int k = 0; k < RL; k++)
#pragma unroll
      for (int t = 0; t < N; t++)
        part[warp * PW + (k * N + t) * kTileRows + rr] = acc[k][t];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < PW; i += blockDim.x) {
    const int k = i / (N * kTileRows), t = (i / kTileRows) % N,
              r16 = i % kTileRows;
    float s = part[i];
    for (int v = 1; v < W; v++)
      s += part[v * PW + i];
    const int64_t ti = t0 + k, r = ti * kTileRows + r16;
    if (ti < tiles && r < rows)
      y[t * rows + r] = s;
  }
}

/* The warps along the row, W: from the matrix shape alone, as it sets the
 * order of a row's sums (batch invariance: the same sums for every n). ~2048
 * warps (16 an SM on 132 SMs), with >= 2 chunk pairs a warp where the rows
 * are long enough; tall matrices count 2 tiles a block (RL = 2, x loads
 * shared by 2 rows, for up to 4 tokens; RL does not change the sums). */
bool tall(int64_t tiles) {
  return tiles >= 2048;
}
int choose_w(int64_t tiles, int chunks) {
  const int64_t blocks = tall(tiles) ? (tiles + 1) / 2 : tiles;
  const int pairs = (chunks + 1) / 2;
  int w = 4;
  while (w < 16 && blocks * w < 2048 && pairs >= 4 * w)
    w *= 2;
  if (w > pairs)
    w = pairs > 0 ? pairs : 1;
  return w;
}

template <class T, int N, int RL>
sl_status launch_p(cudaStream_t stream, const sl_kern_weight *w, const float *x,
                   float *y, int W) {
  /* chunks a stage: 4 a thread for 1 or 2 tokens (memory-bound), fewer
   * for more tokens (compute-bound, and their registers go to the sums) */
  constexpr int UT = N <= 2 ? 4 : N <= 4 ? 2 : 1;
  constexpr int U = RL == 2 ? (N == 1       ? 1
                               : UT / 2 > 0 ? UT / 2
                                            : 1)
                            : (N == 1 && T::SB == 4 ? 3 : UT);
  const int64_t nb = w->cols / 32;
  const int64_t tiles = (w->rows + kTileRows - 1) / kTileRows;
  const int64_t blocks = (tiles + RL - 1) / RL;
  const size_t tb = pk_tile_bytes(T::QB, T::SB, nb);
  const size_t smem = ((T::SB == 4 ? (size_t)N * (size_t)nb : 0) +
                       (size_t)W * RL * N * kTileRows) *
                      sizeof(float);
  if (blocks > 0x7fffffff || nb * T::CPB > 0x7fffffff)
    return SL_ERR_INVALID_ARG;
  auto kern = mmvp_kernel<T, N, RL, U>;
  if (sl_status st = allow_smem(kern, smem); st != SL_OK)
    return st;
  kern<<<(unsigned)blocks, W * 32, smem, stream>>>(
      (const uint8_t *)w->data, tb, tiles, w->rows, (int)nb, x, w->cols, y);
  return launch_status();
}

template <class T, int N>
sl_status launch_n(cudaStream_t stream, const sl_kern_weight *w, const float *x,
                   float *y) {
  const int64_t tiles = (w->rows + kTileRows - 1) / kTileRows;
  const int W = choose_w(tiles, (int)(w->cols / 32 * T::CPB));
  if (N <= 4 && tall(tiles))
    return launch_p<T, N, (N <= 4 ? 2 : 1)>(stream, w, x, y, W);
  return launch_p<T, N, 1>(stream, w, x, y, W);
}

template <class T>
sl_status launch(cudaStream_t stream, const sl_kern_weight *w, const float *x,
                 float *y, int n) {
  return for_tokens(n, [&](auto N) {
    return launch_n<T, decltype(N)::value>(stream, w, x, y);
  });
}

} // namespace

sl_status mmv_packed(cudaStream_t stream, const sl_kern_weight *w,
                     const float *x, float *y, int n) {
  return with_packed(w->type, SL_ERR_UNSUPPORTED, [&](auto tr) {
    return launch<decltype(tr)>(stream, w, x, y, n);
  });
}

} // namespace sl_kcu
