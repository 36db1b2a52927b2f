/* Sampling on the device (sluice/kern_cuda.h, "sampling on the device"):
 * each sequence draws its token as sl_sampler_sample_with does
 * (src/engine/sampler.c) and, when asked, the raw row's log softmax at that
 * token and its top entries as sl__logprobs does (src/engine/detok.c).
 *
 * One block of 1024 threads per sequence, everything in shared memory; the
 * work buffer is not used (sl_kcu_sample_work_bytes is 0). Nothing here
 * waits, allocates or touches another stream, so a call may be captured in a
 * CUDA graph. Sums are in double in a fixed order, so that the same inputs
 * give bitwise the same outputs; a sequence's result depends on its own
 * params and row only.
 *
 * The row is read in groups of 4 consecutive ids (one float4 when the rows
 * are 16-byte aligned); warp w owns a contiguous chunk of groups, and a lane
 * sees its elements in increasing id order. The penalized row is never
 * written: a penalized id is found through a 8192-bit filter and a list of
 * at most SL_KCU_SAMPLE_MAX_PEN (id, penalized logit) pairs.
 *
 * The cases:
 * - greedy (temperature <= 0): the argmax of the penalized row, lowest id on
 *   a tie (and 0 when element 0 is NaN, as the CPU's `>` scan).
 * - "ordered" (top-k off or >= n_vocab, top-p off, any min-p): the CPU walks
 *   every kept candidate in id order. Three passes: the max, the softmax
 *   denominator (expf in float, summed in double), then each warp's mass in
 *   id order; the warp whose prefix crosses r * total rescans its chunk to
 *   find the element. min-p keeps exactly the ids whose logit is at least a
 *   threshold (the CPU's test pr >= min_p * pmax is monotone in the logit),
 *   found by bisection over the float keys in one thread. Never -1.
 * - "sorted" (top-k on, or top-p on): the c = min(m, SL_KCU_SAMPLE_MAX_SORT)
 *   best candidates (logit desc, id asc; m the top-k count) are selected by
 *   a radix select on the 64-bit key (order-preserving logit key << 32 | ~id:
 *   unique, so ties go to the lower id), gathered and bitonic-sorted; then
 *   probabilities (exp in double rounded to float for these c), min-p, top-p
 *   (after a re-sort by (probability desc, id asc) when top-k is off, as the
 *   CPU) and the inverse CDF over the kept prefix. id is -1 when the kept set
 *   may reach past the c candidates (see sample_sorted).
 * The radix select first counts only the elements at or above a bound that
 * the threads' own maxima give (the r-th largest of them: at least r
 * elements reach it), and when those fit in shared memory (LIST_CAP) the
 * later passes run over that list instead of the row.
 *
 * Differences from the CPU that are allowed by the contract: expf is CUDA's
 * (2 ulp) for the vocabulary-wide sums, and sums are associated differently
 * from the CPU's sequential ones, so r * total may land on the other side of
 * a CDF boundary when it lies within ~1e-6 of it.
 */
#include <cooperative_groups.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>

#include "cuda_status.h"
#include "sluice/kern_cuda.h"

namespace cg = cooperative_groups;

namespace {

constexpr int NT = 1024;       /* threads per block, one block per sequence */
constexpr int LIST_CAP = 4096; /* candidates kept in shared memory */
constexpr int PEN_BITS = 8192; /* the penalized ids' filter */
constexpr uint32_t KEY_NEG_INF = 0x007FFFFFu; /* fkey(-INFINITY) */
constexpr uint32_t NONE = 0xFFFFFFFFu;
static_assert(SL_KCU_SAMPLE_MAX_SORT == NT, "one candidate per thread");
static_assert(SL_KCU_SAMPLE_MAX_TOP <= 32, "one warp writes the top");

struct Shared {
  int32_t pen_id[SL_KCU_SAMPLE_MAX_PEN]; /* -1: out of range, unused */
  float pen_val[SL_KCU_SAMPLE_MAX_PEN];  /* the penalized logit */
  uint32_t pen_bits[PEN_BITS / 32];      /* bit (id % PEN_BITS) */
  union {
    uint64_t list[LIST_CAP]; /* selection candidates (64-bit keys) */
    double cum[NT];          /* the kept mass, in order */
  } a;
  union {
    uint32_t hist[2048]; /* one radix digit */
    uint64_t sort[NT];   /* the sorted candidates */
  } b;
  double red_d[32];
  uint64_t red_u[32];
  uint32_t red_s[32];
  uint32_t list_n, gather_n;
  uint32_t bin, above, cnt; /* find_bin's answer */
  uint32_t kmin;            /* the ordered case's min-p threshold key */
  int32_t pick;
  int ws;
  double pws, target;
};

__device__ __forceinline__ int lane_id() {
  return threadIdx.x & 31;
}
__device__ __forceinline__ int warp_id() {
  return threadIdx.x >> 5;
}

/* ---- keys ---------------------------------------------------------------- */

/* Order-preserving key of a logit: a larger logit has a larger key; -0 and
 * +0 have the same key (the CPU's `>` sees them equal); NaN has key 0, below
 * -inf. */
__device__ __forceinline__ uint32_t fkey(float f) {
  if (f != f)
    return 0;
  uint32_t u = f == 0.0f ? 0u : __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_f(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

/* The candidates' total order as one number: (key desc, id asc) is U desc.
 * Every U is >= 2^31 (ids < 2^31), so 0 pads. */
__device__ __forceinline__ uint64_t ukey(uint32_t key, int64_t id) {
  return ((uint64_t)key << 32) | (uint32_t) ~(uint32_t)id;
}

__device__ __forceinline__ int32_t ukey_id(uint64_t u) {
  return (int32_t) ~(uint32_t)u;
}

/* expf as the CPU's libm gives it, nearly always (the double exp rounded
 * once): for the few values whose cuts are decided one by one. */
__device__ __forceinline__ float exp_prec(float z) {
  return (float)exp((double)z);
}

/* ---- block reductions (all threads call; every thread gets the result) -- */

__device__ double block_sum_d(Shared &s, double v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane_id() == 0)
    s.red_d[warp_id()] = v;
  __syncthreads();
  double t = 0.0;
  for (int i = 0; i < 32; i++)
    t += s.red_d[i];
  return t;
}

/* Inclusive prefix sum over the threads, in a fixed association. */
__device__ double block_incl_scan_d(Shared &s, double v) {
  double x = v;
  for (int o = 1; o < 32; o <<= 1) {
    double y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane_id() >= o)
      x += y;
  }
  __syncthreads();
  if (lane_id() == 31)
    s.red_d[warp_id()] = x;
  __syncthreads();
  double pre = 0.0;
  for (int i = 0; i < warp_id(); i++)
    pre += s.red_d[i];
  return pre + x;
}

__device__ uint32_t block_excl_scan_u32(Shared &s, uint32_t v) {
  uint32_t x = v;
  for (int o = 1; o < 32; o <<= 1) {
    uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane_id() >= o)
      x += y;
  }
  __syncthreads();
  if (lane_id() == 31)
    s.red_s[warp_id()] = x;
  __syncthreads();
  uint32_t pre = 0;
  for (int i = 0; i < warp_id(); i++)
    pre += s.red_s[i];
  return pre + x - v;
}

__device__ uint64_t block_max_u64(Shared &s, uint64_t v) {
  for (int o = 16; o > 0; o >>= 1) {
    uint64_t y = __shfl_xor_sync(0xffffffffu, v, o);
    v = y > v ? y : v;
  }
  __syncthreads();
  if (lane_id() == 0)
    s.red_u[warp_id()] = v;
  __syncthreads();
  uint64_t t = s.red_u[0];
  for (int i = 1; i < 32; i++)
    t = s.red_u[i] > t ? s.red_u[i] : t;
  return t;
}

__device__ uint32_t block_min_u32(Shared &s, uint32_t v) {
  return (uint32_t)~block_max_u64(s, ~(uint64_t)v);
}

__device__ uint32_t block_sum_u32(Shared &s, uint32_t v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane_id() == 0)
    s.red_s[warp_id()] = v;
  __syncthreads();
  uint32_t t = 0;
  for (int i = 0; i < 32; i++)
    t += s.red_s[i];
  return t;
}

/* Sorts a[0..NT) descending, one element per thread; synchronizes before
 * and after. */
__device__ void bitonic_desc(uint64_t *a) {
  __syncthreads();
  const unsigned i = threadIdx.x;
  for (unsigned k = 2; k <= NT; k <<= 1)
    for (unsigned j = k >> 1; j > 0; j >>= 1) {
      const unsigned q = i ^ j;
      if (q > i) {
        uint64_t x = a[i], y = a[q];
        if ((i & k) == 0 ? x < y : x > y) {
          a[i] = y;
          a[q] = x;
        }
      }
      __syncthreads();
    }
}

/* A slot in a shared list for each calling thread (one atomic per warp). */
__device__ __forceinline__ uint32_t append_slot(uint32_t *count) {
  cg::coalesced_group g = cg::coalesced_threads();
  uint32_t base = 0;
  if (g.thread_rank() == 0)
    base = atomicAdd(count, (uint32_t)g.size());
  return g.shfl(base, 0) + g.thread_rank();
}

/* ---- the row ------------------------------------------------------------- */

__device__ __forceinline__ float4 load_group(const float *__restrict__ x,
                                             int64_t g, int64_t n, bool vec) {
  if (vec)
    return __ldg((const float4 *)x + g);
  const int64_t i = 4 * g;
  float4 v;
  v.x = __ldg(x + i);
  v.y = i + 1 < n ? __ldg(x + i + 1) : 0.0f;
  v.z = i + 2 < n ? __ldg(x + i + 2) : 0.0f;
  v.w = i + 3 < n ? __ldg(x + i + 3) : 0.0f;
  return v;
}

/* Calls f(id, logit) for every element of the row, each thread its own
 * elements in increasing id order, four loads in flight per thread. */
template <class F>
__device__ __forceinline__ void row_for(const float *__restrict__ x, int64_t n,
                                        bool vec, F &&f) {
  const int64_t ng = (n + 3) >> 2, G = (ng + 31) >> 5;
  const int64_t g_end = min(G * (warp_id() + 1), ng);
  for (int64_t g = G * warp_id() + lane_id(); g < g_end; g += 128) {
    float4 v[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
      v[k] = g + 32 * k < g_end ? load_group(x, g + 32 * k, n, vec)
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int64_t i = 4 * (g + 32 * k);
      if (g + 32 * k < g_end) {
        f(i, v[k].x);
        if (i + 1 < n)
          f(i + 1, v[k].y);
        if (i + 2 < n)
          f(i + 2, v[k].z);
        if (i + 3 < n)
          f(i + 3, v[k].w);
      }
    }
  }
}

/* The penalized logit of element i (raw value xv). */
__device__ __forceinline__ float pen_of(const Shared &s, int n_pen, int64_t i,
                                        float xv) {
  if (n_pen == 0)
    return xv;
  const uint32_t h = (uint32_t)i & (PEN_BITS - 1);
  if (!((s.pen_bits[h >> 5] >> (h & 31)) & 1u))
    return xv;
  for (int j = 0; j < n_pen; j++)
    if (s.pen_id[j] == (int32_t)i)
      return s.pen_val[j];
  return xv;
}

/* ---- radix select -------------------------------------------------------- */

/* The chosen elements: those with key >= kw and (U & M) >= P. */
struct Sel {
  uint64_t P, M;
  uint32_t kw;
  bool list; /* the candidates are s.a.list[0..s.list_n) */
  bool ok;
};

/* Digit d of the 64-bit key: widths 11, 11, 10 (the logit key), 11, 11, 10
 * (the id part). */
__device__ __forceinline__ int digit_shift(int d) {
  return d == 0   ? 53
         : d == 1 ? 42
         : d == 2 ? 32
         : d == 3 ? 21
         : d == 4 ? 10
                  : 0;
}
__device__ __forceinline__ int digit_bits(int d) {
  return d == 2 || d == 5 ? 10 : 11;
}

/* The bin of s.b.hist[0..nb) that holds the r-th largest counted element
 * (r >= 1): s.bin, s.above (elements in higher bins), s.cnt (in the bin);
 * s.cnt = NONE when fewer than r were counted (a bug). */
__device__ void find_bin(Shared &s, uint32_t nb, uint32_t r) {
  const int b0 = (int)nb - 1 - 2 * (int)threadIdx.x, b1 = b0 - 1;
  const uint32_t h0 = b0 >= 0 ? s.b.hist[b0] : 0u;
  const uint32_t h1 = b1 >= 0 ? s.b.hist[b1] : 0u;
  if (threadIdx.x == 0)
    s.cnt = NONE;
  const uint32_t ex = block_excl_scan_u32(s, h0 + h1); /* synchronizes */
  if (ex < r && r <= ex + h0) {
    s.bin = (uint32_t)b0;
    s.above = ex;
    s.cnt = h0;
  } else if (ex + h0 < r && r <= ex + h0 + h1) {
    s.bin = (uint32_t)b1;
    s.above = ex + h0;
    s.cnt = h1;
  }
  __syncthreads();
}

/* Selects the r best (U desc) of the row's elements under key function kf,
 * counting only keys >= kw (at least r elements must reach kw). *bmax: this
 * thread's largest key below kw (0 if none). */
template <class KF>
__device__ Sel select_top(Shared &s, const float *__restrict__ x, int64_t n,
                          bool vec, KF &&kf, uint32_t kw, uint32_t r,
                          uint32_t *bmax) {
  Sel sel = {0, 0, kw, false, true};
  __syncthreads();
  for (int b = threadIdx.x; b < 2048; b += NT)
    s.b.hist[b] = 0;
  if (threadIdx.x == 0)
    s.list_n = 0;
  __syncthreads();
  uint32_t bm = 0;
  row_for(x, n, vec, [&](int64_t i, float xv) {
    const uint32_t k = kf(i, xv);
    if (k >= kw) {
      atomicAdd(&s.b.hist[k >> 21], 1u);
      const uint32_t slot = append_slot(&s.list_n);
      if (slot < LIST_CAP)
        s.a.list[slot] = ukey(k, i);
    } else {
      bm = k > bm ? k : bm;
    }
  });
  *bmax = bm;
  __syncthreads();
  const uint32_t nl = s.list_n;
  sel.list = nl <= LIST_CAP;
  for (int d = 0; d < 6; d++) {
    const int shift = digit_shift(d);
    const uint32_t nb = 1u << digit_bits(d);
    if (d > 0) {
      for (int b = threadIdx.x; b < (int)nb; b += NT)
        s.b.hist[b] = 0;
      __syncthreads();
      const uint64_t P = sel.P, M = sel.M;
      auto count = [&](uint64_t U) {
        if ((U & M) == P)
          atomicAdd(&s.b.hist[(U >> shift) & (nb - 1)], 1u);
      };
      if (sel.list) {
        for (uint32_t j = threadIdx.x; j < nl; j += NT)
          count(s.a.list[j]);
      } else {
        row_for(x, n, vec, [&](int64_t i, float xv) {
          const uint32_t k = kf(i, xv);
          if (k >= kw)
            count(ukey(k, i));
        });
      }
      __syncthreads();
    }
    find_bin(s, nb, r);
    const uint32_t bin = s.bin, above = s.above, cnt = s.cnt;
    __syncthreads(); /* before the next digit clears the histogram */
    if (cnt == NONE) {
      sel.ok = false;
      break;
    }
    sel.P |= (uint64_t)bin << shift;
    sel.M |= (uint64_t)(nb - 1) << shift;
    r -= above;
    if (cnt == r)
      break;
  }
  return sel;
}

/* Gathers the selected elements into s.b.sort (padded with 0) and sorts
 * them, best first. Returns their count; *nonsel = the largest key of the
 * elements not selected (0 if none). bmax: select_top's. */
template <class KF>
__device__ uint32_t gather_sorted(Shared &s, const float *__restrict__ x,
                                  int64_t n, bool vec, KF &&kf, const Sel &sel,
                                  uint32_t bmax, uint32_t *nonsel) {
  __syncthreads();
  if (threadIdx.x == 0)
    s.gather_n = 0;
  __syncthreads();
  uint32_t nm = sel.list ? bmax : 0u;
  auto take = [&](uint64_t U) {
    if ((U & sel.M) >= sel.P) {
      const uint32_t slot = append_slot(&s.gather_n);
      if (slot < NT)
        s.b.sort[slot] = U;
    } else {
      const uint32_t k = (uint32_t)(U >> 32);
      nm = k > nm ? k : nm;
    }
  };
  if (sel.list) {
    const uint32_t nl = s.list_n;
    for (uint32_t j = threadIdx.x; j < nl; j += NT)
      take(s.a.list[j]);
  } else {
    row_for(x, n, vec, [&](int64_t i, float xv) {
      const uint32_t k = kf(i, xv);
      if (k >= sel.kw)
        take(ukey(k, i));
      else
        nm = k > nm ? k : nm;
    });
  }
  __syncthreads();
  const uint32_t got = s.gather_n;
  if (threadIdx.x >= got)
    s.b.sort[threadIdx.x] = 0;
  *nonsel = (uint32_t)block_max_u64(s, nm);
  bitonic_desc(s.b.sort);
  return got;
}

/* The r-th largest (1 <= r <= NT) of the threads' keys w: a bound that at
 * least r elements reach when each w is a distinct element's key. */
__device__ uint32_t witness_bound(Shared &s, uint32_t w, uint32_t r) {
  __syncthreads();
  s.b.sort[threadIdx.x] = ((uint64_t)w << 32) | threadIdx.x;
  bitonic_desc(s.b.sort);
  const uint32_t kw = (uint32_t)(s.b.sort[r - 1] >> 32);
  __syncthreads();
  return kw;
}

/* ---- the cases ----------------------------------------------------------- */

/* sum over the row of expf((l - mx) / T) (l penalized), for the elements
 * that `in(key, id)` admits */
template <class IN>
__device__ double row_softmax_sum(Shared &s, const float *__restrict__ x,
                                  int64_t n, bool vec, int n_pen, float mx,
                                  float T, IN &&in) {
  double acc = 0.0;
  row_for(x, n, vec, [&](int64_t i, float xv) {
    const float l = pen_of(s, n_pen, i, xv);
    if (in(fkey(l), i))
      acc += (double)expf((l - mx) / T);
  });
  return block_sum_d(s, acc);
}

/* The kept probability of element i in the ordered case: 0 below the min-p
 * threshold key. */
__device__ __forceinline__ float ordered_prob(const Shared &s, int n_pen,
                                              int64_t i, float xv, float mx,
                                              float T, double inv,
                                              uint32_t kmin) {
  const float l = pen_of(s, n_pen, i, xv);
  if (fkey(l) < kmin)
    return 0.0f;
  return (float)((double)expf((l - mx) / T) * inv);
}

/* One warp-iteration of the ordered walk: lane's group g (4 ids), its
 * probabilities pv and their sum in id order. */
__device__ __forceinline__ double
ordered_group(const Shared &s, const float *__restrict__ x, int64_t n, bool vec,
              int n_pen, int64_t g, int64_t g_end, float mx, float T,
              double inv, uint32_t kmin, float pv[4]) {
  pv[0] = pv[1] = pv[2] = pv[3] = 0.0f;
  if (g >= g_end)
    return 0.0;
  const float4 v = load_group(x, g, n, vec);
  const float xs[4] = {v.x, v.y, v.z, v.w};
  double ls = 0.0;
#pragma unroll
  for (int k = 0; k < 4; k++)
    if (4 * g + k < n) {
      pv[k] = ordered_prob(s, n_pen, 4 * g + k, xs[k], mx, T, inv, kmin);
      ls += (double)pv[k];
    }
  return ls;
}

__device__ double warp_incl_scan_d(double x) {
  for (int o = 1; o < 32; o <<= 1) {
    double y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane_id() >= o)
      x += y;
  }
  return x;
}

/* Top-k off and top-p off: the kept candidates (all, or those at or above
 * the min-p threshold) walked in id order. -1 only when min-p keeps nothing
 * (min_p > 1; the CPU's behaviour is undefined there). */
__device__ int32_t sample_ordered(Shared &s, const float *__restrict__ x,
                                  int64_t n, bool vec, int n_pen, float mx,
                                  float T, float min_p, double u) {
  const double sum = row_softmax_sum(s, x, n, vec, n_pen, mx, T,
                                     [](uint32_t, int64_t) { return true; });
  uint32_t kmin = 0;
  if (min_p > 0.0f) {
    if (threadIdx.x == 0) {
      /* the CPU keeps pr >= min_p * pmax, pr = (float)(expf(z) / sum), pmax
       * the max's pr: true from some logit up */
      const float floor_p = min_p * (float)(1.0 / sum);
      auto keep = [&](uint32_t k) {
        const float e = exp_prec((key_f(k) - mx) / T);
        return (float)((double)e / sum) >= floor_p;
      };
      uint32_t lo = KEY_NEG_INF, hi = fkey(mx);
      if (!keep(hi)) {
        s.kmin = NONE;
      } else {
        while (lo < hi) {
          const uint32_t mid = lo + (hi - lo) / 2;
          if (keep(mid))
            hi = mid;
          else
            lo = mid + 1;
        }
        s.kmin = lo;
      }
    }
    __syncthreads();
    kmin = s.kmin;
    if (kmin == NONE)
      return -1;
  }
  const double inv = 1.0 / sum;
  const int64_t ng = (n + 3) >> 2, G = (ng + 31) >> 5;
  const int64_t g_beg = G * warp_id(), g_end = min(g_beg + G, ng);
  /* each warp's kept mass, iteration by iteration in id order */
  double wacc = 0.0;
  int64_t last = -1; /* the last kept id: the CPU's pick when none crosses */
  for (int64_t g0 = g_beg; g0 < g_end; g0 += 32) {
    float pv[4];
    const int64_t g = g0 + lane_id();
    const double ls =
        ordered_group(s, x, n, vec, n_pen, g, g_end, mx, T, inv, kmin, pv);
    for (int k = 0; k < 4; k++)
      if (pv[k] > 0.0f)
        last = 4 * g + k;
    const double incl = warp_incl_scan_d(ls);
    wacc = wacc + __shfl_sync(0xffffffffu, incl, 31);
  }
  /* with min-p on, every kept element has pr >= floor_p > 0 (unless that
   * underflows); without it every element is kept */
  const int64_t last_all =
      kmin > KEY_NEG_INF ? (int64_t)block_max_u64(s, (uint64_t)(last + 1)) - 1
                         : n - 1;
  __syncthreads();
  if (lane_id() == 0)
    s.red_d[warp_id()] = wacc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double tot = 0.0;
    for (int w = 0; w < 32; w++)
      tot = tot + s.red_d[w];
    const double target = u * tot;
    double pre = 0.0;
    int ws = -1;
    double pws = 0.0;
    for (int w = 0; w < 32 && ws < 0; w++) {
      const double nx = pre + s.red_d[w];
      if (target < nx) {
        ws = w;
        pws = pre;
      }
      pre = nx;
    }
    s.ws = ws;
    s.pws = pws;
    s.target = target;
    s.pick = (int32_t)last_all;
  }
  __syncthreads();
  const int ws = s.ws;
  if (ws >= 0 && warp_id() == ws) {
    /* rescan this warp's chunk with the same sums; at every level the last
     * child's cumulative is the parent's, bit for bit, so a crossing is
     * always found */
    const double pws = s.pws, target = s.target;
    wacc = 0.0;
    for (int64_t g0 = g_beg; g0 < g_end; g0 += 32) {
      float pv[4];
      const int64_t g = g0 + lane_id();
      const double ls =
          ordered_group(s, x, n, vec, n_pen, g, g_end, mx, T, inv, kmin, pv);
      const double incl = warp_incl_scan_d(ls);
      double prev = __shfl_up_sync(0xffffffffu, incl, 1);
      if (lane_id() == 0)
        prev = 0.0;
      const double nacc = wacc + __shfl_sync(0xffffffffu, incl, 31);
      if (target < pws + nacc) {
        const bool hit = target < pws + (wacc + incl);
        const unsigned bal = __ballot_sync(0xffffffffu, hit);
        const int L = bal ? __ffs(bal) - 1 : 31;
        if (lane_id() == L) {
          int k = -1;
          double part = 0.0;
          for (int kk = 0; kk < 3 && k < 0; kk++) {
            part += (double)pv[kk];
            if (target < pws + (wacc + (prev + part)))
              k = kk;
          }
          if (k < 0) { /* the lane's last element, unless it has no mass */
            k = 0;
            for (int kk = 3; kk >= 0; kk--)
              if (pv[kk] > 0.0f) {
                k = kk;
                break;
              }
          }
          s.pick = (int32_t)(4 * g + k);
        }
        break;
      }
      wacc = nacc;
    }
  }
  __syncthreads();
  return s.pick;
}

/* Top-k on or top-p on. m: the top-k count (n when off). The kept set is
 * decided on C, the c = min(m, NT) best; -1 when it may reach past C:
 * - top-k > NT (m < n): when no min-p cut falls inside C (the best element
 *   outside C passes min-p, or min-p is off) and no top-p cut either;
 * - top-k off, top-p on: when min-p keeps an element outside C and the
 *   top-p prefix (by probability desc, id asc) does not end, inside C, on a
 *   probability strictly above the best outside element's;
 * - min-p keeping nothing (min_p > 1), or a failed selection (a bug). */
__device__ int32_t sample_sorted(Shared &s, const float *__restrict__ x,
                                 int64_t n, bool vec, int n_pen, float mx,
                                 float T, int64_t m, float min_p, float top_p,
                                 double u, uint32_t wkey) {
  const bool sorted = m < n;
  const uint32_t c = (uint32_t)(m < NT ? m : NT);
  auto kf = [&](int64_t i, float xv) { return fkey(pen_of(s, n_pen, i, xv)); };
  /* the softmax denominator over the m best, when they are not just C */
  double sum = 0.0;
  if (m > c && !sorted) {
    sum = row_softmax_sum(s, x, n, vec, n_pen, mx, T,
                          [](uint32_t, int64_t) { return true; });
  } else if (m > c) {
    uint32_t bm;
    const Sel sm = select_top(s, x, n, vec, kf, 0u, (uint32_t)m, &bm);
    if (!sm.ok)
      return -1;
    sum =
        row_softmax_sum(s, x, n, vec, n_pen, mx, T, [&](uint32_t k, int64_t i) {
          return (ukey(k, i) & sm.M) >= sm.P;
        });
  }
  /* C, sorted best first */
  const uint32_t kw = witness_bound(s, wkey, c);
  uint32_t bmax, nonsel;
  const Sel sel = select_top(s, x, n, vec, kf, kw, c, &bmax);
  if (!sel.ok)
    return -1;
  const uint32_t got = gather_sorted(s, x, n, vec, kf, sel, bmax, &nonsel);
  if (got != c)
    return -1;
  const uint32_t t = threadIdx.x;
  uint64_t U = s.b.sort[t];
  const float e =
      t < c ? exp_prec((key_f((uint32_t)(U >> 32)) - mx) / T) : 0.0f;
  if (m <= c)
    sum = block_sum_d(s, (double)e);
  float pr = t < c ? (float)((double)e / sum) : 0.0f;
  const float pmax = (float)(1.0 / sum); /* the best's: expf(0) = 1 */
  const bool has_next = m > c;
  const float pr_next =
      has_next ? (float)((double)exp_prec((key_f(nonsel) - mx) / T) / sum)
               : 0.0f;
  /* min-p: the kept ones are a prefix (pr falls along the order) */
  uint32_t j1 = c;
  bool ext = has_next; /* the kept set goes on past C */
  if (min_p > 0.0f) {
    const float floor_p = min_p * pmax;
    j1 = block_min_u32(s, t < c && !(pr >= floor_p) ? t : c);
    ext = has_next && j1 == c && pr_next >= floor_p;
  }
  if (j1 == 0)
    return -1;
  /* top-k off: the CPU orders the kept ones by probability, then id */
  if (!sorted && top_p < 1.0f) {
    __syncthreads();
    s.b.sort[t] =
        t < j1 ? ((uint64_t)__float_as_uint(pr) << 32) | (uint32_t)U : 0;
    bitonic_desc(s.b.sort);
    U = s.b.sort[t];
    pr = t < j1 ? __uint_as_float((uint32_t)(U >> 32)) : 0.0f;
  }
  const double cum = block_incl_scan_d(s, t < j1 ? (double)pr : 0.0);
  __syncthreads();
  s.a.cum[t] = cum;
  uint32_t keep = j1;
  if (top_p < 1.0f) {
    const uint32_t j2 =
        block_min_u32(s, t < j1 && cum >= (double)top_p ? t : NONE);
    if (j2 < j1) {
      keep = j2 + 1;
      if (ext && !sorted) {
        /* everything outside C has pr <= pr_next: it comes after the
         * prefix only when the prefix's last pr is above it */
        const float last = __uint_as_float((uint32_t)(s.b.sort[j2] >> 32));
        if (!(last > pr_next))
          return -1;
      }
      ext = false;
    }
  }
  if (ext)
    return -1;
  __syncthreads();
  const double target = u * s.a.cum[keep - 1];
  const uint32_t pick = block_min_u32(s, t < keep && target < cum ? t : NONE);
  const int32_t id = ukey_id(s.b.sort[pick < keep ? pick : keep - 1]);
  __syncthreads();
  return id;
}

__global__ void __launch_bounds__(NT, 1)
    sample_kernel(const float *__restrict__ logits, int64_t n,
                  const sl_kcu_sample_params *__restrict__ params,
                  sl_kcu_sample_out *__restrict__ out, bool vec) {
  __shared__ Shared s;
  const sl_kcu_sample_params *p = params + blockIdx.x;
  sl_kcu_sample_out *o = out + blockIdx.x;
  const int tid = threadIdx.x;
  const float T = p->temperature, top_p = p->top_p, min_p = p->min_p;
  const int32_t top_k = p->top_k, row = p->row;
  const int n_top =
      p->n_top < SL_KCU_SAMPLE_MAX_TOP ? p->n_top : SL_KCU_SAMPLE_MAX_TOP;
  int n_pen = p->n_pen;
  n_pen = n_pen < 0
              ? 0
              : (n_pen > SL_KCU_SAMPLE_MAX_PEN ? SL_KCU_SAMPLE_MAX_PEN : n_pen);
  if (row < 0) {
    if (tid == 0) {
      o->id = -1;
      o->logprob = NAN;
    }
    if (tid < SL_KCU_SAMPLE_MAX_TOP) {
      o->top_id[tid] = -1;
      o->top_logprob[tid] = -INFINITY;
    }
    return;
  }
  const float *x = logits + (int64_t)row * n;

  /* the penalties, as apply_penalties: on the listed ids only */
  if (tid < PEN_BITS / 32)
    s.pen_bits[tid] = 0;
  __syncthreads();
  if (tid < n_pen) {
    int32_t id = p->pen_id[tid];
    float l = 0.0f;
    if (id >= 0 && id < n) {
      const float rp = p->repeat_penalty;
      l = x[id];
      if (rp != 1.0f)
        l = l > 0.0f ? __fdiv_rn(l, rp) : __fmul_rn(l, rp);
      l = __fsub_rn(l, __fadd_rn(__fmul_rn((float)p->pen_count[tid],
                                           p->frequency_penalty),
                                 p->presence_penalty));
      const uint32_t h = (uint32_t)id & (PEN_BITS - 1);
      atomicOr(&s.pen_bits[h >> 5], 1u << (h & 31));
    } else {
      id = -1;
    }
    s.pen_id[tid] = id;
    s.pen_val[tid] = l;
  }
  __syncthreads();

  /* pass 1: the penalized max (and this thread's best: its witness); the
   * raw row's max and sum of exp for the logprobs */
  const bool want_lp = n_top >= 0;
  uint64_t best_u = 0;
  float rm = -INFINITY;
  double rs = 0.0;
  uint32_t nfin = 0;
  row_for(x, n, vec, [&](int64_t i, float xv) {
    const uint64_t U = ukey(fkey(pen_of(s, n_pen, i, xv)), i);
    best_u = U > best_u ? U : best_u;
    if (want_lp) {
      if (xv > rm) {
        rs = rs * (double)expf(rm - xv) + 1.0;
        rm = xv;
      } else if (xv > -INFINITY) {
        rs += (double)expf(xv - rm);
      }
      nfin += xv > -INFINITY;
    }
  });
  const uint64_t best = block_max_u64(s, best_u);
  const float mx = key_f((uint32_t)(best >> 32));
  float lse = 0.0f;
  uint32_t n_fin = 0;
  if (want_lp) {
    const float M = key_f((uint32_t)(block_max_u64(s, fkey(rm)) & NONE));
    const double part = rm > -INFINITY ? rs * exp((double)(rm - M)) : 0.0;
    lse = M + (float)log(block_sum_d(s, part));
    n_fin = block_sum_u32(s, nfin);
  }

  int32_t id;
  if (T <= 0.0f) {
    id = ukey_id(best);
    const float l0 = pen_of(s, n_pen, 0, x[0]);
    if (l0 != l0)
      id = 0; /* the CPU's scan starts at a NaN and keeps it */
  } else {
    const int64_t m = top_k > 0 && top_k < n ? top_k : n;
    if (m == n && !(top_p < 1.0f))
      id = sample_ordered(s, x, n, vec, n_pen, mx, T, min_p, p->r);
    else
      id = sample_sorted(s, x, n, vec, n_pen, mx, T, m, min_p, top_p, p->r,
                         (uint32_t)(best_u >> 32));
  }
  if (tid == 0) { /* every field written: the output is the same bytes */
    o->id = id;
    o->logprob = !want_lp ? 0.0f : id >= 0 ? x[id] - lse : NAN;
  }
  if (tid >= (n_top > 0 ? n_top : 0) && tid < SL_KCU_SAMPLE_MAX_TOP) {
    o->top_id[tid] = -1;
    o->top_logprob[tid] = -INFINITY;
  }

  /* the top entries of the raw row, ordered by logprob (desc), id (asc) */
  if (n_top > 0) {
    const uint32_t r = (uint32_t)n_top < n_fin ? (uint32_t)n_top : n_fin;
    uint32_t nonsel = 0;
    bool ok = r > 0;
    if (r > 0) {
      auto kv = [&](int64_t, float xv) { return fkey(xv - lse); };
      const uint32_t kw = witness_bound(s, fkey(rm - lse), r);
      uint32_t bmax;
      const Sel sel = select_top(s, x, n, vec, kv, kw, r, &bmax);
      ok = sel.ok && gather_sorted(s, x, n, vec, kv, sel, bmax, &nonsel) == r;
    }
    if (tid < n_top) {
      const bool have = ok && (uint32_t)tid < r;
      const uint64_t U = have ? s.b.sort[tid] : 0;
      o->top_id[tid] = have ? ukey_id(U) : -1;
      o->top_logprob[tid] = have ? key_f((uint32_t)(U >> 32)) : -INFINITY;
    }
  }
}

bool aligned16(const void *p) {
  return ((uintptr_t)p & 15) == 0;
}

} // namespace

extern "C" size_t sl_kcu_sample_work_bytes(int n_seq, int64_t n_vocab) {
  (void)n_seq;
  (void)n_vocab;
  return 0;
}

extern "C" sl_status sl_kcu_sample(void *stream, const float *logits,
                                   int64_t n_vocab, int n_seq,
                                   const sl_kcu_sample_params *params,
                                   sl_kcu_sample_out *out, void *work,
                                   size_t work_bytes) {
  (void)work;
  (void)work_bytes;
  if (n_seq < 0 || n_vocab < 1 || n_vocab > INT32_MAX)
    return SL_ERR_INVALID_ARG;
  if (n_seq == 0)
    return SL_OK;
  if (!logits || !params || !out)
    return SL_ERR_INVALID_ARG;
  const bool vec = n_vocab % 4 == 0 && aligned16(logits);
  sample_kernel<<<(unsigned)n_seq, NT, 0, (cudaStream_t)stream>>>(
      logits, n_vocab, params, out, vec);
  return sl__kcu_launch_status();
}
