/* sluice — kern/cuda: the tensor-core matrix times a few tokens, for Q4_0,
 * Q4_1 and Q8_0 weights in the packed layout (packed.cuh): the decode path
 * for any batch of up to SL_KCU_MMT_MAX_TOKENS tokens in one pass over the
 * weights.
 *
 * The f32 matrix-vector kernel (mmv_packed.cu) spends one FMA a weight a
 * token on the CUDA cores: at 8 tokens a step it is compute-bound, and a
 * batch of 32 decode tokens read the weights four times. Here each weight is
 * dequantized once into f16 (exact: a 4- or 8-bit integer) and multiplied
 * with up to 64 tokens by mma.sync.m16n8k16 (f16 in, f32 accumulate), so a
 * step of 1 to 64 decode tokens costs about one read of the weights.
 *
 * Fragments. A warp holds one tile of 16 rows (A, 16 x 16 per k-step) and 8
 * tokens per n-tile (B, 16 x 8). Lane (g = lane / 4, c = lane % 4) holds rows
 * g and g + 8 and token g. The mma sums over the 16 k-slots of a step in
 * whatever order it likes, so the slots may stand for any 16 weights of the
 * row as long as A and B agree: lane c's slots {2c, 2c+1, 2c+8, 2c+9} take
 * the 4 weights of byte word c of the row's 16-byte chunk, and x at the same
 * 4 positions (one float4). A Q4 block (one chunk) is two k-steps, its low
 * nibbles (weights 4c..4c+3) and its high nibbles (16+4c..16+4c+3); a Q8_0
 * chunk is half a block, one k-step. A k-step never mixes blocks, so each
 * block's sum comes out of the mma alone and takes its f32 scale after:
 * acc += d * sum (Q4_1: + m * the block's sum of x, from the f32 x).
 *
 * x is rounded to f16 (the batched path rounds it too; llama.cpp rounds it
 * to 8 bits); the weights are exact, every sum is f32.
 *
 * Batch invariance: warp w of a thread block takes the chunks w, w + W, ...
 * of its rows in increasing order, then the warps' sums are added in warp
 * order; W comes from the matrix shape alone. A token's sums are the mma's
 * column of that token, independent of the other columns. So the result for
 * a token is the same bits for any n and any grouping of rows (RL).
 */
#include <stdlib.h>

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "mm_impl.cuh"
#include "packed.cuh"
#include "pdl.cuh"

namespace sl_kcu {
namespace {

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t h2bits(__half2 h) {
  return *reinterpret_cast<uint32_t *>(&h);
}
__device__ __forceinline__ __half2 bits2h(uint32_t u) {
  return *reinterpret_cast<__half2 *>(&u);
}

/* Bytes e and e + 1 of v (e = 0 or 2) as an f16 pair: each masked by `mask`
 * (0x0F: a nibble; 0xFF: a byte) and offset by -bias, exactly: 0x6400 is
 * f16 1024, whose spacing is 1 up to 2048. */
__device__ __forceinline__ uint32_t pair(uint32_t v, int e, uint32_t mask,
                                         __half2 bias) {
  const uint32_t t = __byte_perm(v, 0, e == 0 ? 0x4140u : 0x4342u);
  return h2bits(
      __hsub2(bits2h((t & (mask * 0x00010001u)) | 0x64006400u), bias));
}

/* The A fragment of one k-step from word vg (row g) and vg8 (row g + 8). */
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], uint32_t vg,
                                       uint32_t vg8, uint32_t mask,
                                       __half2 bias) {
  a[0] = pair(vg, 0, mask, bias);
  a[1] = pair(vg8, 0, mask, bias);
  a[2] = pair(vg, 2, mask, bias);
  a[3] = pair(vg8, 2, mask, bias);
}

__device__ __forceinline__ float h2f(uint32_t bits) {
  return __half2float(__ushort_as_half((unsigned short)bits));
}

/* Tuning switches for measurement, read once (the sums' order depends on
 * the warps a row gets, so they must not change within a process):
 * SLUICE_CUDA_MMT_VARIANT (the one-token kernel: 0 = 4 chunks a stage, two
 * stages, the default: measured best on the H200 (docs/PERF.md); 1 = 8,
 * two; 2 = 8, one; 3 = 4, one), SLUICE_CUDA_MMT_WARPS (the warps a
 * matrix is spread over, 2048 by default) and SLUICE_CUDA_MMT_KS_BLOCKS
 * (mmt_ksplit; 0: off). */
int env_int(const char *name, int dflt) {
  const char *e = getenv(name);
  return e && *e ? atoi(e) : dflt;
}
int mmt_variant(void) {
  static int v = -1;
  if (v < 0)
    v = env_int("SLUICE_CUDA_MMT_VARIANT", 0) & 3;
  return v;
}
int64_t mmt_target_warps(void) {
  static int v = -1;
  if (v < 0)
    v = env_int("SLUICE_CUDA_MMT_WARPS", 2048);
  return v;
}
int64_t mmt_ks_blocks(void) {
  static int v = -1;
  if (v < 0)
    v = env_int("SLUICE_CUDA_MMT_KS_BLOCKS", 0);
  return v;
}

/* Where row r of token t goes: part i holds rows [r0[i], r0[i + 1]) into
 * y[i] (n x (r0[i + 1] - r0[i])); one part is the plain product. */
struct outmap {
  float *y[SL_KCU_SPLIT_MAX];
  int64_t r0[SL_KCU_SPLIT_MAX + 1];
  int np;
};

/* y[t][r] = dot(W row r, x[t]) for the rows of tiles [blockIdx.x * RL, +RL)
 * and tokens t < n <= 8 NT. Shared memory: the warps' sums,
 * W x RL x NT x 128 floats. */
template <class T, int NT, int RL, int U, bool DB>
__global__ void __launch_bounds__(256)
    mmt_kernel(const uint8_t *__restrict__ w, size_t tile_bytes, int64_t tiles,
               int64_t rows, int nb, const float *__restrict__ x, int64_t cols,
               int n, outmap om) {
  extern __shared__ float part[];
  constexpr bool Q8 = T::QB == 32, MIN = T::SB == 4;
  const int W = blockDim.x >> 5;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int64_t t0 = (int64_t)blockIdx.x * RL;
  /* KS blocks of a cluster share the row tiles: block y's warp w is the
   * virtual warp y W + w of KS W, exactly as one block of KS W warps */
  const int KS = gridDim.y, Wv = W * KS, vw = blockIdx.y * W + warp;
  const int C = nb * T::CPB; /* 16-byte chunks a row */

  const uint8_t *tq[RL], *ts[RL];
#pragma unroll
  for (int k = 0; k < RL; k++) { /* a tile past the end rereads the last */
    const int64_t ti = t0 + k < tiles ? t0 + k : tiles - 1;
    const uint8_t *base = w + (size_t)ti * tile_bytes;
    tq[k] = base + g * 16 + c * 4;
    ts[k] = base + (size_t)kTileRows * nb * T::QB + g * T::SB;
  }
  /* token rows of x this lane loads (a token past n loads nothing and
   * multiplies zeros; its column is never stored) */
  const float *xr[NT];
  bool xv_ok[NT];
#pragma unroll
  for (int t = 0; t < NT; t++) {
    const int tok = 8 * t + g;
    xv_ok[t] = tok < n;
    xr[t] = x + (int64_t)(tok < n ? tok : 0) * cols + c * 4;
  }

  float acc[RL][NT][4];
#pragma unroll
  for (int k = 0; k < RL; k++)
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
      for (int i = 0; i < 4; i++)
        acc[k][t][i] = 0.0f;

  const __half2 bias = Q8 ? __float2half2_rn(1152.0f)
                          : __float2half2_rn(MIN ? 1024.0f : 1032.0f);
  const uint32_t mask = Q8 ? 0xFFu : 0x0Fu;

  /* U chunks of each row tile: quants of rows g, g + 8 and their scales.
   * For one token, two stages in turn (registers): the next U chunks' loads
   * go out before the current ones are used, so each warp keeps 2U chunks in
   * flight (the order of the sums is the same either way). */
  struct stage {
    uint32_t qa[U][RL], qb[U][RL], sa[U][RL], sb[U][RL];
  };
  auto load = [&](int j0, stage &st) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int ch = j0 + u * Wv;
#pragma unroll
      for (int k = 0; k < RL; k++) {
        if (ch < C) {
          const size_t qo = (size_t)ch * kTileRows * 16;
          const size_t so = (size_t)(ch / T::CPB) * kTileRows * T::SB;
          st.qa[u][k] = ld_stream_u32(tq[k] + qo);
          st.qb[u][k] = ld_stream_u32(tq[k] + qo + 8 * 16);
          if (MIN) {
            st.sa[u][k] = ld_stream_u32(ts[k] + so);
            st.sb[u][k] = ld_stream_u32(ts[k] + so + 8 * T::SB);
          } else {
            st.sa[u][k] = ld_stream_u16(ts[k] + so);
            st.sb[u][k] = ld_stream_u16(ts[k] + so + 8 * T::SB);
          }
        } else {
          st.qa[u][k] = st.qb[u][k] = st.sa[u][k] = st.sb[u][k] = 0;
        }
      }
    }
  };
  auto compute = [&](int j0, const stage &st) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int ch = j0 + u * Wv;
      if (ch >= C)
        break;
      /* x: Q4 chunk ch is block ch (x at 32 ch, two k-steps: +0, +16);
       * Q8_0 chunk ch is half ch % 2 of block ch / 2 (x at 16 ch) */
      const int64_t xo = Q8 ? (int64_t)ch * 16 : (int64_t)ch * 32;
#pragma unroll
      for (int t = 0; t < NT; t++) {
        uint32_t b[2][2];
        float xs = 0.0f; /* Q4_1: this lane's part of the block sum of x */
#pragma unroll
        for (int s = 0; s < (Q8 ? 1 : 2); s++) {
          const float4 xv = xv_ok[t]
                                ? __ldg((const float4 *)(xr[t] + xo + 16 * s))
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          b[s][0] = h2bits(__floats2half2_rn(xv.x, xv.y));
          b[s][1] = h2bits(__floats2half2_rn(xv.z, xv.w));
          if (MIN)
            xs += (xv.x + xv.y) + (xv.z + xv.w);
        }
        float sx0 = 0.0f, sx1 = 0.0f;
        if (MIN) { /* the block sum of token 8t + g, then of 8t + 2c, +1 */
          xs += __shfl_xor_sync(0xffffffffu, xs, 1);
          xs += __shfl_xor_sync(0xffffffffu, xs, 2);
          sx0 = __shfl_sync(0xffffffffu, xs, 8 * c);
          sx1 = __shfl_sync(0xffffffffu, xs, 8 * c + 4);
        }
#pragma unroll
        for (int k = 0; k < RL; k++) {
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          uint32_t a[4];
          /* Q8_0: the sign bit flipped maps int8 q to the byte q + 128 */
          const uint32_t flip = Q8 ? 0x80808080u : 0u;
          frag_a(a, st.qa[u][k] ^ flip, st.qb[u][k] ^ flip, mask, bias);
          mma16816(d, a, b[0][0], b[0][1]);
          if (!Q8) {
            frag_a(a, st.qa[u][k] >> 4, st.qb[u][k] >> 4, mask, bias);
            mma16816(d, a, b[1][0], b[1][1]);
          }
          const float dg = h2f(st.sa[u][k] & 0xFFFF),
                      dg8 = h2f(st.sb[u][k] & 0xFFFF);
          float *ac = acc[k][t];
          ac[0] = fmaf(dg, d[0], ac[0]);
          ac[1] = fmaf(dg, d[1], ac[1]);
          ac[2] = fmaf(dg8, d[2], ac[2]);
          ac[3] = fmaf(dg8, d[3], ac[3]);
          if (MIN) {
            const float mg = h2f(st.sa[u][k] >> 16),
                        mg8 = h2f(st.sb[u][k] >> 16);
            ac[0] = fmaf(mg, sx0, ac[0]);
            ac[1] = fmaf(mg, sx1, ac[1]);
            ac[2] = fmaf(mg8, sx0, ac[2]);
            ac[3] = fmaf(mg8, sx1, ac[3]);
          }
        }
      }
    }
  };

  /* The first stages' weights are loaded before pdl_wait(): with PDL
   * (pdl.cuh) they stream in while the kernel before, which writes x,
   * finishes. Nothing in flight writes the weights (loaded once, at load). */
  const int step = Wv * U;
  stage s0;
  int j0 = vw;
  if constexpr (DB) {
    /* one token: memory-bound, two stages in flight */
    stage s1;
    if (j0 < C)
      load(j0, s0);
    if (j0 + step < C)
      load(j0 + step, s1);
    pdl_wait();
    pdl_launch_dependents();
    for (;;) {
      if (j0 >= C)
        break;
      compute(j0, s0);
      j0 += step;
      if (j0 >= C)
        break;
      if (j0 + step < C)
        load(j0 + step, s0);
      compute(j0, s1);
      j0 += step;
      if (j0 >= C)
        break;
      if (j0 + step < C)
        load(j0 + step, s1);
    }
  } else {
    /* more tokens: the sums take the registers a second stage would */
    if (j0 < C)
      load(j0, s0);
    pdl_wait();
    pdl_launch_dependents();
    for (; j0 < C; j0 += step) {
      if (j0 != vw)
        load(j0, s0);
      compute(j0, s0);
    }
  }

  /* the warps' sums, added in warp order */
  constexpr int PW = RL * NT * 128; /* floats per warp: 16 rows x 8 tokens */
#pragma unroll
  for (int k = 0; k < RL; k++)
#pragma unroll
    for (int t = 0; t < NT; t++) {
      float *p = part + warp * PW + (k * NT + t) * 128;
      p[g * 8 + 2 * c] = acc[k][t][0];
      p[g * 8 + 2 * c + 1] = acc[k][t][1];
      p[(g + 8) * 8 + 2 * c] = acc[k][t][2];
      p[(g + 8) * 8 + 2 * c + 1] = acc[k][t][3];
    }
  auto store = [&](int i, float s) {
    const int k = i / (NT * 128), t = (i / 128) % NT, r16 = (i % 128) / 8,
              tk = 8 * t + i % 8;
    const int64_t ti = t0 + k, r = ti * kTileRows + r16;
    if (ti < tiles && r < rows && tk < n) {
      int p = 0;
      while (p + 1 < om.np && r >= om.r0[p + 1])
        p++;
      const int64_t pr = om.r0[p + 1] - om.r0[p];
      om.y[p][(int64_t)tk * pr + (r - om.r0[p])] = s;
    }
  };
  if (KS == 1) {
    __syncthreads();
    for (int i = threadIdx.x; i < PW; i += blockDim.x) {
      float s = part[i];
      for (int v = 1; v < W; v++)
        s += part[v * PW + i];
      store(i, s);
    }
  } else {
    /* the cluster's blocks share the outputs; each sums the KS W virtual
     * warps' parts in order, read from their blocks' shared memory */
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < PW;
         i += KS * blockDim.x) {
      float s = 0.0f;
      for (int b = 0; b < KS; b++) {
        const float *pb = cl.map_shared_rank(part, b);
        for (int v = 0; v < W; v++)
          s = b == 0 && v == 0 ? pb[i] : s + pb[v * PW + i];
      }
      store(i, s);
    }
    cl.sync(); /* no block leaves while another reads its parts */
  }
}

/* The warps along a row, W (1..8): from the matrix shape alone (batch
 * invariance). ~2048 warps over the tiles, each with >= 4 chunks. */
int mmt_warps(int64_t tiles, int chunks) {
  int w = 1;
  while (w < 8 && tiles * w < mmt_target_warps() && chunks >= 8 * w)
    w *= 2;
  return w;
}

/* The blocks a row tile is split over, KS (1, 2 or 4; a thread-block
 * cluster): from the shape alone, as W. Matrices of few tiles (the 4096
 * rows of o and down: 256 blocks of 8 warps, 16 warps an SM) get more warps
 * in flight, each with >= 8 chunks, in up to SLUICE_CUDA_MMT_KS_BLOCKS
 * blocks (1024 is the setting to measure). Off (0) by default until it has
 * run on a GPU: it is compiled, not yet measured or tested there. */
int mmt_ksplit(int64_t tiles, int chunks, int W) {
  const int64_t most = mmt_ks_blocks();
  int ks = 1;
  while (ks < 4 && tiles * ks * 2 <= most && chunks >= 8 * W * ks * 2)
    ks *= 2;
  return ks;
}

template <class T, int NT, int RL, int U, bool DB>
sl_status launch_k(cudaStream_t stream, const sl_kern_weight *w, const float *x,
                   const outmap &om, int n, int W) {
  const int64_t nb = w->cols / 32;
  const int64_t tiles = (w->rows + kTileRows - 1) / kTileRows;
  const int64_t blocks = (tiles + RL - 1) / RL;
  const size_t tb = pk_tile_bytes(T::QB, T::SB, nb);
  const size_t smem = (size_t)W * RL * NT * 128 * sizeof(float);
  if (blocks > 0x7fffffff || nb * T::CPB > 0x7fffffff)
    return SL_ERR_INVALID_ARG;
  auto kern = mmt_kernel<T, NT, RL, U, DB>;
  if (sl_status st = allow_smem(kern, smem); st != SL_OK)
    return st;
  const int ks = mmt_ksplit(tiles, (int)(nb * T::CPB), W);
  if (ks == 1)
    return launch(kern, (unsigned)blocks, W * 32, smem, stream,
                  (const uint8_t *)w->data, tb, tiles, w->rows, (int)nb, x,
                  w->cols, n, om);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)blocks, (unsigned)ks, 1);
  cfg.blockDim = dim3((unsigned)W * 32, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = 1;
  at[0].val.clusterDim.y = (unsigned)ks;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  cudaError_t e =
      cudaLaunchKernelEx(&cfg, kern, (const uint8_t *)w->data, tb, tiles,
                         w->rows, (int)nb, x, w->cols, n, om);
  if (e != cudaSuccess)
    (void)cudaGetLastError(); /* reported as the launch's error below */
  return e == cudaSuccess ? launch_status() : SL_ERR_DEVICE;
}

/* One token: U chunks a stage, one or two stages (mmt_variant). More
 * tokens: fewer chunks, one stage (the sums need the registers). */
template <class T, int NT, int RL>
sl_status launch_t(cudaStream_t stream, const sl_kern_weight *w, const float *x,
                   const outmap &om, int n, int W) {
  if constexpr (NT == 1) {
    switch (mmt_variant()) {
    case 1:
      return launch_k<T, 1, RL, 8, true>(stream, w, x, om, n, W);
    case 2:
      return launch_k<T, 1, RL, 8, false>(stream, w, x, om, n, W);
    case 3:
      return launch_k<T, 1, RL, 4, false>(stream, w, x, om, n, W);
    default:
      return launch_k<T, 1, RL, 4, true>(stream, w, x, om, n, W);
    }
  } else {
    return launch_k<T, NT, RL, (NT <= 2 ? 4 : 2), false>(stream, w, x, om, n,
                                                         W);
  }
}

/* RL, the row tiles a warp takes: more tiles share each x load (the x
 * traffic grows with the tokens), as long as ~264 thread blocks remain. */
template <class T, int NT>
sl_status launch_nt(cudaStream_t stream, const sl_kern_weight *w,
                    const float *x, const outmap &y, int n) {
  const int64_t tiles = (w->rows + kTileRows - 1) / kTileRows;
  const int W = mmt_warps(tiles, (int)(w->cols / 32 * T::CPB));
  if constexpr (NT >= 2 && NT <= 4)
    if (tiles >= 4 * 264)
      return launch_t<T, NT, 4>(stream, w, x, y, n, W);
  if constexpr (NT >= 2)
    if (tiles >= 2 * 264)
      return launch_t<T, NT, 2>(stream, w, x, y, n, W);
  return launch_t<T, NT, 1>(stream, w, x, y, n, W);
}

template <class T>
sl_status launch_mmt(cudaStream_t stream, const sl_kern_weight *w,
                     const float *x, const outmap &y, int n) {
  switch ((n + 7) / 8) {
  case 1:
    return launch_nt<T, 1>(stream, w, x, y, n);
  case 2:
    return launch_nt<T, 2>(stream, w, x, y, n);
  case 3:
  case 4:
    return launch_nt<T, 4>(stream, w, x, y, n);
  case 5:
  case 6:
  case 7:
  case 8:
    return launch_nt<T, 8>(stream, w, x, y, n);
  }
  return SL_ERR_INVALID_ARG;
}

/* Slices of SL_KCU_MMT_MAX_TOKENS tokens, each part's outputs advanced by
 * the slice's tokens. */
sl_status mmt_run(cudaStream_t stream, const sl_kern_weight *w, const float *x,
                  outmap om, int n) {
  return with_packed(w->type, SL_ERR_UNSUPPORTED, [&](auto tr) {
    using T = decltype(tr);
    for (int t = 0; t < n; t += SL_KCU_MMT_MAX_TOKENS) {
      const int k =
          n - t < SL_KCU_MMT_MAX_TOKENS ? n - t : SL_KCU_MMT_MAX_TOKENS;
      outmap o = om;
      for (int p = 0; p < om.np; p++)
        o.y[p] += (size_t)t * (size_t)(om.r0[p + 1] - om.r0[p]);
      sl_status st =
          launch_mmt<T>(stream, w, x + (size_t)t * (size_t)w->cols, o, k);
      if (st != SL_OK)
        return st;
    }
    return SL_OK;
  });
}

} // namespace

bool mmt_enabled(void) {
  static int on = -1; /* read once: one kernel for every n (invariance) */
  if (on < 0) {
    const char *e = getenv("SLUICE_CUDA_MMT");
    on = !(e && e[0] == '0');
  }
  return on;
}

sl_status mmt_packed(cudaStream_t stream, const sl_kern_weight *w,
                     const float *x, float *y, int n) {
  outmap om = {};
  om.y[0] = y;
  om.r0[0] = 0;
  om.r0[1] = w->rows;
  om.np = 1;
  return mmt_run(stream, w, x, om, n);
}

} // namespace sl_kcu

extern "C" bool sl_kcu_split_ok(sl_ggml_type t) {
  return sl_kcu_type_packed(t) && sl_kcu::mmt_enabled();
}

extern "C" sl_status sl_kcu_matmul_vec_split(void *stream,
                                             const sl_kern_weight *w,
                                             const float *x, int n,
                                             const sl_kcu_split *sp) {
  using namespace sl_kcu;
  if (!w || !sp || sp->n_parts < 1 || sp->n_parts > SL_KCU_SPLIT_MAX || n < 0)
    return SL_ERR_INVALID_ARG;
  if (!sl_kcu_split_ok(w->type))
    return SL_ERR_UNSUPPORTED;
  outmap om = {};
  om.np = sp->n_parts;
  int64_t r = 0;
  for (int p = 0; p < sp->n_parts; p++) {
    if (sp->rows[p] <= 0 || !sp->y[p] ||
        (p + 1 < sp->n_parts && sp->rows[p] % kTileRows))
      return SL_ERR_INVALID_ARG;
    om.y[p] = sp->y[p];
    om.r0[p] = r;
    r += sp->rows[p];
  }
  om.r0[sp->n_parts] = r;
  if (r != w->rows || w->cols <= 0 || w->cols % 32 || !w->data || !x ||
      (uintptr_t)x % 16 || (uintptr_t)w->data % 16)
    return SL_ERR_INVALID_ARG;
  if (n == 0)
    return SL_OK;
  return mmt_run((cudaStream_t)stream, w, x, om, n);
}
