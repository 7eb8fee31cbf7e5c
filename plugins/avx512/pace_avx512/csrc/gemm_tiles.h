// Register tiles over packed weight groups (layouts in kernels.h), shared by the dense linear
// (linear.cpp) and the quantized linear's bf16 panels (qpanel.cpp).
//
// A micro-kernel accumulates acc[MT][NB] = x[MT rows] . W[NB blocks] over all of K in fp32; an
// epilogue stores a tile (bias + store, or act(gate) * up + store); `column_tile` runs all M rows
// against one group of 4 blocks, the row tiles prefetching the thread's next group into L2.
// Everything here has internal linkage: each kernel file compiles its own copy with its own
// ISA flags.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "simd.h"

#ifndef PACE_UNROLL
#define PACE_UNROLL _Pragma("GCC unroll 16")
#endif

namespace pace_avx512 {
namespace {

// Tile shapes, rows x column blocks of 16: decode streams one group (4 independent accumulator
// chains per row), DECODE_ROWS rows at a time; prefill uses 6 x 4 = 24 accumulators (+ 4
// weight registers) of AVX-512's 32. The avx2 target has 16 registers of half the width (a
// 16-lane accumulator takes two): 2 rows x a group, measured best of 1-3 rows for decode and
// for bf16 (whose widened weights take registers of their own); its fp32 prefill tile is 3 rows
// x 2 blocks (PrefillTile<Fp32Kernel> below).
#if defined(__AVX512F__)
constexpr int DECODE_ROWS = 4, PREFILL_ROWS = 6;
#else
constexpr int DECODE_ROWS = 2, PREFILL_ROWS = 2;
#endif
// The prefill tile of a micro-kernel: `rows` x `blocks` (a group's blocks in runs of `blocks`).
template <template <int, int> class Kernel>
struct PrefillTile {
  static constexpr int rows = PREFILL_ROWS, blocks = GROUP;
};

// bf16 activation rows widened to fp32, `kp` floats a row, in this thread's buffer (reused
// across calls): the operand of Bf16WideKernel, where the build lacks vdpbf16ps. Returns it.
inline const float* widen_rows(const bf16_t* x, int64_t ldx, int64_t M, int64_t kp) {
  thread_local std::vector<float> wide;
  if ((int64_t)wide.size() < M * kp) wide.resize(M * kp);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < kp; k += 16) {
      const __mmask16 lanes = lane_mask(kp - k);
      _mm512_mask_storeu_ps(&wide[m * kp + k], lanes, load_bf16(x + m * ldx + k, lanes));
    }
  return wide.data();
}

// A slice of `count` cache lines of the next group's weights, prefetched into L2 `lines` per
// k step of a tile (none when `count` is 0).
struct NextGroup {
  const char* base = nullptr;
  int64_t lines = 0;
  int64_t count = 0;

  inline void step(int64_t k) const {
    for (int64_t i = k * lines; i < std::min(count, (k + 1) * lines); ++i)
      _mm_prefetch(base + 64 * i, _MM_HINT_T1);
  }
};

template <typename XT, typename WT>
struct Args {  // what a micro-kernel reads
  const XT* x;
  int64_t ldx;
  const WT* w;
  int64_t gstride;  // elements per group
  int64_t steps;    // k-pairs (bf16) or k (fp32)
};

// ---- micro-kernels: acc[MT][NB] = x[MT rows] . W[NB blocks] over all of K ----------------
// Each kernel reads Args (x rows, their stride, the packed weights, the elements per group and
// the k steps) and prefetches `next` as it goes.
template <int MT, int NB>
struct Bf16Kernel {  // steps = Kp / 2 k-pairs, gstride = Kp/2 * 128
  Args<bf16_t, bf16_t> a;
  NextGroup next;

  inline void run(int64_t m0, int64_t b0, __m512 (&acc)[MT][NB]) const {
#ifdef PACE_HAS_BF16
    const int64_t ldx = a.ldx;
    const bf16_t* xr = a.x + m0 * ldx;
    const bf16_t* wb = a.w + (b0 / GROUP) * a.gstride + (b0 % GROUP) * 32;
    PACE_UNROLL for (int m = 0; m < MT; ++m)
      PACE_UNROLL for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_setzero_ps();
    for (int64_t p = 0; p < a.steps; ++p) {
      next.step(p);
      __m512bh wv[NB];
      PACE_UNROLL for (int n = 0; n < NB; ++n)
        wv[n] = (__m512bh)_mm512_loadu_si512(wb + 32 * n + 32 * GROUP * p);
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        int32_t xp;  // the k-pair (x[2p], x[2p+1]) of row m, broadcast to all 16 lanes
        std::memcpy(&xp, xr + m * ldx + 2 * p, 4);
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(xp);
        PACE_UNROLL for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xb, wv[n]);
      }
    }
#else
    (void)m0, (void)b0, (void)acc;  // built without AVX512-BF16: Bf16WideKernel runs instead
#endif
  }
};

// bf16 weights without AVX512-BF16: x is the activation widened to fp32 (rows of Kp floats).
template <int MT, int NB>
struct Bf16WideKernel {  // steps = Kp / 2 k-pairs, gstride = Kp/2 * 128
  Args<float, bf16_t> a;
  NextGroup next;

  inline void run(int64_t m0, int64_t b0, __m512 (&acc)[MT][NB]) const {
    const int64_t ldx = a.ldx;
    const float* xr = a.x + m0 * ldx;
    const bf16_t* wb = a.w + (b0 / GROUP) * a.gstride + (b0 % GROUP) * 32;
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    PACE_UNROLL for (int m = 0; m < MT; ++m)
      PACE_UNROLL for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_setzero_ps();
    for (int64_t p = 0; p < a.steps; ++p) {
      next.step(p);
      PACE_UNROLL for (int n = 0; n < NB; ++n) {
        const __m512i wv = _mm512_loadu_si512(wb + 32 * n + 32 * GROUP * p);
        const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(wv, 16));
        const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(wv, high));
        PACE_UNROLL for (int m = 0; m < MT; ++m) {
          acc[m][n] = _mm512_fmadd_ps(_mm512_set1_ps(xr[m * ldx + 2 * p]), even, acc[m][n]);
          acc[m][n] = _mm512_fmadd_ps(_mm512_set1_ps(xr[m * ldx + 2 * p + 1]), odd, acc[m][n]);
        }
      }
    }
  }
};

template <int MT, int NB>
struct Fp32Kernel {  // steps = K, gstride = K * 64
  Args<float, float> a;
  NextGroup next;

  inline void run(int64_t m0, int64_t b0, __m512 (&acc)[MT][NB]) const {
    const int64_t ldx = a.ldx;
    const float* xr = a.x + m0 * ldx;
    const float* wb = a.w + (b0 / GROUP) * a.gstride + (b0 % GROUP) * 16;
    PACE_UNROLL for (int m = 0; m < MT; ++m)
      PACE_UNROLL for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_setzero_ps();
    for (int64_t i = 0; i < a.steps; ++i) {
      next.step(i);
      __m512 wv[NB];
      PACE_UNROLL for (int n = 0; n < NB; ++n) wv[n] = _mm512_loadu_ps(wb + 16 * n + 16 * GROUP * i);
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        const __m512 xb = _mm512_set1_ps(xr[m * ldx + i]);
        PACE_UNROLL for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_fmadd_ps(xb, wv[n], acc[m][n]);
      }
    }
  }
};

#if !defined(__AVX512F__)
// avx2 fp32: 2 rows x a group held 16 accumulators in 16 registers, so two of them lived on the
// stack and every weight was loaded once per row; 3 rows x 2 blocks keeps 12 accumulators, the
// 4 weight registers of a k step and the broadcast in registers (both blocks' lines of a k step
// are adjacent). On 2 Zen 3 cores: 1.25-1.6x at 32-512 rows on SmolLM2's shapes, 1.0-1.2x on
// 2048 x 8192 (`pace bench kernels --sections gemm --dtypes float32`); bf16 at 2 x 2 or 6 x 1
// measured slower than 2 x 4.
template <>
struct PrefillTile<Fp32Kernel> {
  static constexpr int rows = 3, blocks = 2;
};
#endif

// ---- epilogues ----------------------------------------------------------------------------

template <typename T>
struct LinearEpilogue {  // y = acc + bias
  T* y;
  int64_t ldy;
  const float* bias;
  int64_t n;

  template <int MT, int NB>
  inline void store_tile(__m512 (&acc)[MT][NB], int64_t m0, int64_t b0) const {
    PACE_UNROLL for (int j = 0; j < NB; ++j) {
      const int64_t col = (b0 + j) * 16;
      const __mmask16 mask = lane_mask(n - col);
      const __m512 b = bias ? _mm512_loadu_ps(bias + col) : _mm512_setzero_ps();
      PACE_UNROLL for (int m = 0; m < MT; ++m)
        store(y + (m0 + m) * ldy + col, _mm512_add_ps(acc[m][j], b), mask);
    }
  }
};

template <typename T>
struct GatedEpilogue {  // h = act(gate) * up, blocks (2j, 2j+1) = (gate, up) of group b0/2 + j
  T* h;
  int64_t ldh;
  int64_t inter;
  int act;

  template <int MT, int NB>
  inline void store_tile(__m512 (&acc)[MT][NB], int64_t m0, int64_t b0) const {
    static_assert(NB % 2 == 0, "gated tiles hold (gate, up) block pairs");
    PACE_UNROLL for (int j = 0; j < NB / 2; ++j) {
      const int64_t col = (b0 / 2 + j) * 16;
      const __mmask16 mask = lane_mask(inter - col);
      PACE_UNROLL for (int m = 0; m < MT; ++m)
        store(h + (m0 + m) * ldh + col,
              _mm512_mul_ps(activate(acc[m][2 * j], act), acc[m][2 * j + 1]), mask);
    }
  }
};

// ---- drivers ------------------------------------------------------------------------------
template <template <int, int> class Kernel, int MT, int NB, class Args, class Epi>
inline void tile(const Args& a, const Epi& e, int64_t m0, int64_t b0, NextGroup next) {
  __m512 acc[MT][NB];
  Kernel<MT, NB>{a, next}.run(m0, b0, acc);
  e.template store_tile<MT, NB>(acc, m0, b0);
}

// Rows [m0, m0 + mt) with mt < MTMAX: pick the matching tile height at run time.
template <template <int, int> class Kernel, int MT, int NB, class Args, class Epi>
inline void tail_rows(const Args& a, const Epi& e, int64_t mt, int64_t m0, int64_t b0,
                      NextGroup next) {
  if constexpr (MT > 0) {
    if (mt == MT) tile<Kernel, MT, NB>(a, e, m0, b0, next);
    else tail_rows<Kernel, MT - 1, NB>(a, e, mt, m0, b0, next);
  }
}

// All M rows against the column blocks [b0, b0 + NB), in tiles of MTMAX rows x BLK blocks
// (block runs in turn, each under every row tile); the tiles each prefetch an equal slice of
// `next` (the thread's next group, or null).
template <template <int, int> class Kernel, int MTMAX, int NB, int BLK = NB, class Args, class Epi>
inline void column_tile(const Args& a, const Epi& e, int64_t M, int64_t b0, const char* next) {
  static_assert(NB % BLK == 0, "a column span is whole tiles");
  const int64_t rows = (M + MTMAX - 1) / MTMAX, tiles = rows * (NB / BLK);
  const int64_t lines = a.gstride * (int64_t)sizeof(*a.w) / 64;
  const int64_t slice = (lines + tiles - 1) / tiles;  // lines per tile
  const int64_t per_step = (slice + a.steps - 1) / a.steps;
  auto share = [&](int64_t t) {  // tile t's slice of `next`
    if (tiles == 1 || !next || slice * t >= lines) return NextGroup{};
    return NextGroup{next + 64 * slice * t, per_step, std::min(slice, lines - slice * t)};
  };
  for (int j = 0; j < NB / BLK; ++j) {
    const int64_t b = b0 + j * BLK;
    int64_t m0 = 0;
    for (; m0 + MTMAX <= M; m0 += MTMAX) tile<Kernel, MTMAX, BLK>(a, e, m0, b, share(j * rows + m0 / MTMAX));
    if (m0 < M) tail_rows<Kernel, MTMAX - 1, BLK>(a, e, M - m0, m0, b, share(j * rows + m0 / MTMAX));
  }
}

}  // namespace
}  // namespace pace_avx512
