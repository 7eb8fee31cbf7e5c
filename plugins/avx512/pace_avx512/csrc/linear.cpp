// Linear and gated-MLP kernels over packed weights (layouts in kernels.h).
//
// One register tile is MT rows x one group of 4 column blocks (64 columns) accumulated in fp32
// over the whole K, then handed to an epilogue (bias + store, or act(gate) * up + store).
// Threads split the groups into contiguous ranges (from 16 rows in half groups, see drive);
// each thread walks its groups once and runs every row tile against a group before moving
// on, so the weights stream from DRAM once whatever M is (decode), and a group stays in L1/L2
// while the row tiles reuse it (prefill).
// A group is one contiguous run read front to back (4 cache lines per k step), so each thread
// reads a single sequential stream: no prefetcher restarts at block boundaries, which cost
// ~25% on small-K decode GEMVs with one stream per block. With several row tiles (batched
// decode, prefill) the first tile of a group would wait on DRAM while the others run from L2:
// the tiles prefetch the thread's next group into L2, a few lines per k step.
//
// bf16 weights use vdpbf16ps (16 lanes x 2 products per instruction). Measured on Zen 4 it
// peaks at 2x the FLOP rate of fp32 FMA on bf16 weights widened in registers, so it is used
// for every M. CPUs without AVX512-BF16 (Skylake-SP to Ice Lake) widen the same packed
// weights in registers (a k-pair line: shift for the even k, mask for the odd k) and run two
// FMAs against the activation widened once per call to fp32 and broadcast from memory.
// fp32 weights use FMA with the activation broadcast from memory.
#include <omp.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "gemm_tiles.h"
#include "kernels.h"
#include "simd.h"
#include "work_ranges.h"

namespace pace_avx512 {

Tuning& tuning() {
  static Tuning t;
  return t;
}

namespace {

// Rows from which threads split the groups in half groups (below, a call streams its weights
// from DRAM, and two threads reading alternate halves of each k step's lines stream slower).
constexpr int64_t HALF_SPLIT_ROWS = 16;

// The column tile jobs of a range [lo, hi) of half groups: a half group at an odd start, then
// whole groups, then a half group at an odd end. Job k is (first half group, half groups).
struct HalfRange {
  int64_t lo, hi;

  int64_t lead() const { return lo % 2; }
  int64_t size() const {
    const int64_t body = hi - lo - lead();
    return lead() + body / 2 + body % 2;
  }
  std::pair<int64_t, int64_t> job(int64_t k) const {
    if (k < lead()) return {lo, 1};
    const int64_t h = lo + lead() + 2 * (k - lead());
    return {h, std::min<int64_t>(2, hi - h)};
  }
};

// Split the groups of 4 column blocks over threads in contiguous ranges; each group is one
// tile of 4 blocks (gate/up pairs never straddle a group). From HALF_SPLIT_ROWS rows the
// ranges are counted in half groups (2 blocks), so an odd number of groups still splits evenly:
// SmolLM2's 576 columns are 9 groups, 4.5 per thread instead of 4 and 5 (one thread waited a
// fifth of the call); a half group at either end of a range runs as 2-block tiles. A thread
// done with its range takes jobs from the others' ends (work_ranges.h).
template <template <int, int> class Kernel, int MTMAX, int BLK, class Args, class Epi>
void drive(const Args& a, const Epi& e, int64_t M, int64_t groups, int nthreads) {
  constexpr int HALF = GROUP / 2, HALF_BLK = BLK < HALF ? BLK : HALF;
  const int64_t unit = M >= HALF_SPLIT_ROWS ? 1 : 2;  // half groups per range step
  const auto range = [&](int64_t t) {
    return HalfRange{2 * groups / unit * t / nthreads * unit, 2 * groups / unit * (t + 1) / nthreads * unit};
  };
  std::vector<int64_t> sizes(nthreads);
  for (int t = 0; t < nthreads; ++t) sizes[t] = range(t).size();
  StealRanges work(sizes);
  const auto run = [&](int u, int64_t k, bool own) {  // job k of thread u's range
    const HalfRange r = range(u);
    const auto [h, halves] = r.job(k);
    if (halves == 1) {
      column_tile<Kernel, MTMAX, HALF, HALF_BLK>(a, e, M, h * HALF, nullptr);
      return;
    }
    // the owner prefetches its next job's group while it works (a thief works backwards)
    const char* next = own && k + 1 < r.size() ? (const char*)(a.w + r.job(k + 1).first / 2 * a.gstride)
                                               : nullptr;
    column_tile<Kernel, MTMAX, GROUP, BLK>(a, e, M, h / 2 * GROUP, next);
  };
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  work.drain(omp_get_thread_num(), run);
}

// Tile shapes (gemm_tiles.h): DECODE_ROWS x a group up to 4 rows, else the kernel's PrefillTile.
template <template <int, int> class Kernel, class A, class Epi>
void dispatch(const A& a, const Epi& e, int64_t M, int64_t groups, int nt) {
  if (M <= 4) drive<Kernel, DECODE_ROWS, GROUP>(a, e, M, groups, nt);
  else drive<Kernel, PrefillTile<Kernel>::rows, PrefillTile<Kernel>::blocks>(a, e, M, groups, nt);
}

}  // namespace

// Threads worth using: about `min_work_per_thread` weight-byte equivalents each.
int pick_threads(int nthreads, int64_t weight_bytes, int64_t M, int64_t units) {
  const int64_t work = weight_bytes * (1 + M / 4);
  const int64_t n = std::max<int64_t>(1, work / tuning().min_work_per_thread);
  return (int)std::max<int64_t>(1, std::min<int64_t>({(int64_t)nthreads, n, units}));
}

namespace {

// A bf16 matmul over `groups` packed groups: vdpbf16ps where built with AVX512-BF16, else the
// activation widened to fp32 once (a per-thread buffer reused across calls) and FMAs.
template <class Epi>
void bf16_matmul(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const bf16_t* w,
                 int64_t groups, const Epi& e, int nthreads) {
  const int64_t kp = (K + 1) / 2 * 2;
  const int nt = pick_threads(nthreads, groups * kp * 128, M, groups);
#ifdef PACE_HAS_BF16
  dispatch<Bf16Kernel>(Args<bf16_t, bf16_t>{x, ldx, w, kp / 2 * 128, kp / 2}, e, M, groups, nt);
#else
  const float* wide = widen_rows(x, ldx, M, kp);
  dispatch<Bf16WideKernel>(Args<float, bf16_t>{wide, kp, w, kp / 2 * 128, kp / 2}, e, M, groups, nt);
#endif
}

}  // namespace

void linear_bf16(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const bf16_t* w,
                 const float* bias, int64_t N, bf16_t* y, int64_t ldy, int nthreads) {
  bf16_matmul(x, ldx, M, K, w, (N + 63) / 64, LinearEpilogue<bf16_t>{y, ldy, bias, N}, nthreads);
}

void linear_fp32(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w,
                 const float* bias, int64_t N, float* y, int64_t ldy, int nthreads) {
  const int64_t groups = (N + 63) / 64;
  const Args<float, float> a{x, ldx, w, K * 64, K};
  const int nt = pick_threads(nthreads, groups * K * 256, M, groups);
  dispatch<Fp32Kernel>(a, LinearEpilogue<float>{y, ldy, bias, N}, M, groups, nt);
}

// Gate/up rows interleave in 16-row blocks (g0, u0, g1, u1, ...): 2 * ceil(I / 16) blocks.
void gated_bf16(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const bf16_t* w,
                int64_t I, int act, bf16_t* h, int64_t ldh, int nthreads) {
  const int64_t groups = ((I + 15) / 16 * 2 + 3) / 4;
  bf16_matmul(x, ldx, M, K, w, groups, GatedEpilogue<bf16_t>{h, ldh, I, act}, nthreads);
}

void gated_fp32(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w, int64_t I,
                int act, float* h, int64_t ldh, int nthreads) {
  const int64_t groups = ((I + 15) / 16 * 2 + 3) / 4;
  const Args<float, float> a{x, ldx, w, K * 64, K};
  const int nt = pick_threads(nthreads, groups * K * 256, M, groups);
  dispatch<Fp32Kernel>(a, GatedEpilogue<float>{h, ldh, I, act}, M, groups, nt);
}

}  // namespace pace_avx512
