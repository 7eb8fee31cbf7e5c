// The W8A8 GEMM with AVX512-VNNI: y = x @ W^T + bias for int8 weights with one fp32 scale per
// output row (KIND_W8A8: `quantization="w8a8"`) times int8 activations, `vpdpbusd` on both.
//
// Packed layout (pace_avx512/qpacking.py), per block of 16 rows, `block_stride` = 64 + 16 K
// bytes: the rows' fp32 scales [16], then the codes as k-quads, quad q at byte 64 + 64 q with
// byte 4 j + e = row j, k = 4 q + e, stored unsigned (u = q + 128: vpdpbusd's first operand;
// the avx2 target sums q c instead, isa.h dpbusd_offset_bytes, and its comp is 0).
//
// Activation rows are quantized once per call, per row and group of k, as the native
// reference rounds them (pace_native.kernels.int8_activations): codes c with the dynamic scale
// amax / 127 per group of 64 (of 32 where K is not a multiple of 64), or the calibrated static
// scales of each group of 32. With w = (u - 128) sw,
//   y[m, n] = sw[n] (sum_g sx[m, g] sum_{k in g} u c  +  comp[m]) + b[n],
//   comp[m] = -128 sum_g sx[m, g] sum_{k in g} c  (AVX-512; 0 on avx2),
// each group's inner sum exact in int32 (16 or 8 vpdpbusd per row and 16 columns), one cvt
// and one fp32 FMA per group into the totals, comp[m] computed with the codes. Those two run
// on the pipes vpdpbusd needs: groups of 64 reach ~88% of the vpdpbusd peak, groups of 32
// ~80% (Zen 4); 64 is the finest group at 1.8x the bf16 GEMM's rate.
//
// Tiles of MR = 4 rows x NB = 3 blocks (48 columns): 12 int32 chains for the group and 12
// fp32 totals in registers; per k-quad 3 weight loads and 4 activation broadcasts feed 12
// vpdpbusd. Threads take contiguous ranges of tile columns (panels); a panel's weights stay
// in L2 while every row tile passes over them.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels.h"
#include "simd.h"
#include "work_ranges.h"

PACE_VNNI_BEGIN

namespace pace_avx512 {

namespace {

#define PACE_UNROLL _Pragma("GCC unroll 16")

constexpr int MR = 4;  // activation rows per tile
constexpr int NB = 3;  // blocks of 16 columns per tile

// Activation rows as int8 codes, per row and group of `group` k.
struct ActivationCodes {
  int64_t group = QGROUP;
  std::vector<int8_t> codes;  // [M][K]
  std::vector<float> scales;  // [M][G]
  std::vector<float> comp;    // [M]: -128 sum_g scale * (sum of the group's codes), or 0
};

// One per thread, reused across calls (it grows to the largest call's rows).
ActivationCodes& scratch_codes() {
  thread_local ActivationCodes codes;
  return codes;
}

// Codes of x's rows: dynamic scales amax / 127 per row and group of c.group, or `fixed` [G]
// (calibrated, shared by every row; codes past them clamp to +-127). Round to nearest even.
template <typename T>
void quantize_rows(const T* x, int64_t ldx, int64_t M, int64_t K, const float* fixed,
                   ActivationCodes& c, int nthreads) {
  const int64_t group = c.group, G = K / group;
  c.codes.resize(M * K);
  c.scales.resize(M * G);
  c.comp.resize(M);
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, M * K / 8192));
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    float comp = 0.0f;
    for (int64_t g = 0; g < G; ++g) {
      const T* src = x + m * ldx + g * group;
      float scale, inv;
      if (fixed) {
        scale = fixed[g];
        inv = scale > 0 ? 1.0f / scale : 0.0f;
      } else {
        __m512 amax = _mm512_setzero_ps();
        for (int64_t i = 0; i < group; i += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(load(src + i, 0xFFFF)));
        const float top = _mm512_reduce_max_ps(amax);
        inv = top > 0 ? 127.0f / top : 0.0f, scale = top / 127.0f;
      }
      if (!std::isfinite(inv)) inv = 0.0f, scale = 0.0f;  // a group of denormals: all codes 0
      const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127);
      __m512i sum = _mm512_setzero_si512();
      for (int64_t i = 0; i < group; i += 16) {
        const __m512 v = _mm512_mul_ps(load(src + i, 0xFFFF), _mm512_set1_ps(inv));
        const __m512i q = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(v), hi), lo);
        _mm_storeu_si128((__m128i*)(c.codes.data() + m * K + g * group + i), _mm512_cvtepi32_epi8(q));
        sum = _mm512_add_epi32(sum, q);
      }
      c.scales[m * G + g] = scale;
      comp += scale * (float)_mm512_reduce_add_epi32(sum);
    }
    c.comp[m] = (float)(OFFSET_BYTES_BIAS - 128) * comp;
  }
}

template <typename T>
struct Call {
  const uint8_t* w;
  int64_t block_stride;
  int64_t K, G, N;
  const ActivationCodes* x;
  const float* bias;
  T* y;
  int64_t ldy;
};

// Rows [m0, m0 + R) x blocks [b0, b0 + C) of y, activation groups of QUADS k-quads.
template <int QUADS, int R, int C, typename T>
inline void tile(const Call<T>& a, int64_t m0, int64_t b0) {
  const uint8_t* codes[C];
  PACE_UNROLL for (int j = 0; j < C; ++j) codes[j] = a.w + (b0 + j) * a.block_stride + 64;
  const int32_t* xq[R];
  const float* xs[R];
  PACE_UNROLL for (int m = 0; m < R; ++m) {
    xq[m] = (const int32_t*)(a.x->codes.data() + (m0 + m) * a.K);
    xs[m] = a.x->scales.data() + (m0 + m) * a.G;
  }
  __m512 total[R][C];
  PACE_UNROLL for (int m = 0; m < R; ++m)
    PACE_UNROLL for (int j = 0; j < C; ++j) total[m][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < a.G; ++g) {
    __m512i acc[R][C];
    PACE_UNROLL for (int m = 0; m < R; ++m)
      PACE_UNROLL for (int j = 0; j < C; ++j) acc[m][j] = _mm512_setzero_si512();
    PACE_UNROLL for (int q = 0; q < QUADS; ++q) {
      __m512i w[C];
      PACE_UNROLL for (int j = 0; j < C; ++j) w[j] = _mm512_loadu_si512(codes[j] + 64 * (g * QUADS + q));
      PACE_UNROLL for (int m = 0; m < R; ++m) {
        const __m512i xb = _mm512_set1_epi32(xq[m][g * QUADS + q]);
        PACE_UNROLL for (int j = 0; j < C; ++j) acc[m][j] = dpbusd_offset_bytes(acc[m][j], w[j], xb);
      }
    }
    PACE_UNROLL for (int m = 0; m < R; ++m) {
      const __m512 s = _mm512_set1_ps(xs[m][g]);
      PACE_UNROLL for (int j = 0; j < C; ++j)
        total[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[m][j]), s, total[m][j]);
    }
  }
  PACE_UNROLL for (int j = 0; j < C; ++j) {
    const int64_t col = (b0 + j) * 16;
    const __mmask16 mask = lane_mask(a.N - col);
    const __m512 sw = _mm512_loadu_ps((const float*)(a.w + (b0 + j) * a.block_stride));
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(mask, a.bias + col) : _mm512_setzero_ps();
    PACE_UNROLL for (int m = 0; m < R; ++m) {
      const __m512 sum = _mm512_add_ps(total[m][j], _mm512_set1_ps(a.x->comp[m0 + m]));
      store(a.y + (m0 + m) * a.ldy + col, _mm512_fmadd_ps(sum, sw, bias), mask);
    }
  }
}

template <int QUADS, int R, typename T>
inline void tile_columns(const Call<T>& a, int64_t m0, int64_t b0, int64_t c) {
  if (c >= 3) tile<QUADS, R, 3>(a, m0, b0);
  else if (c == 2) tile<QUADS, R, 2>(a, m0, b0);
  else tile<QUADS, R, 1>(a, m0, b0);
}

// A tile of r <= MR rows and c <= NB blocks.
template <int QUADS, typename T>
inline void any_tile(const Call<T>& a, int64_t m0, int64_t r, int64_t b0, int64_t c) {
  switch (r) {
    case 4: return tile_columns<QUADS, 4>(a, m0, b0, c);
    case 3: return tile_columns<QUADS, 3>(a, m0, b0, c);
    case 2: return tile_columns<QUADS, 2>(a, m0, b0, c);
    default: return tile_columns<QUADS, 1>(a, m0, b0, c);
  }
}

static_assert(MR == 4 && NB == 3, "any_tile and tile_columns spell out the tile sizes");

template <typename T>
void w8a8_linear(const T* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                 int64_t block_stride, const float* bias, int64_t N, T* y, int64_t ldy,
                 int nthreads, const float* act_scales) {
  const int64_t blocks = (N + 15) / 16, panels = (blocks + NB - 1) / NB;
  const int nt = pick_threads(nthreads, blocks * block_stride, M, panels);
  ActivationCodes& codes = scratch_codes();
  codes.group = w8a8_activation_group(K, act_scales != nullptr);
  quantize_rows(x, ldx, M, K, act_scales, codes, nt);
  const Call<T> a{w, block_stride, K, K / codes.group, N, &codes, bias, y, ldy};
  const auto run = codes.group == 64 ? &any_tile<16, T> : &any_tile<8, T>;
  EvenStealRanges work(panels, nt);  // each thread's contiguous range of panels, with stealing
#pragma omp parallel num_threads(nt) if (nt > 1)
  work.drain(omp_get_thread_num(), [&](int64_t p, bool) {
    const int64_t b0 = p * NB, c = std::min<int64_t>(NB, blocks - b0);
    for (int64_t m0 = 0; m0 < M; m0 += MR) run(a, m0, std::min<int64_t>(MR, M - m0), b0, c);
  });
}

}  // namespace

void w8a8_linear_bf16(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                      int64_t block_stride, const float* bias, int64_t N, bf16_t* y, int64_t ldy,
                      int nthreads, const float* act_scales) {
  w8a8_linear(x, ldx, M, K, w, block_stride, bias, N, y, ldy, nthreads, act_scales);
}

void w8a8_linear_fp32(const float* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                      int64_t block_stride, const float* bias, int64_t N, float* y, int64_t ldy,
                      int nthreads, const float* act_scales) {
  w8a8_linear(x, ldx, M, K, w, block_stride, bias, N, y, ldy, nthreads, act_scales);
}

void w8a8_rows(const uint8_t* w, int64_t block_stride, int64_t K, const int64_t* ids, int64_t n,
               float* out, int nthreads) {
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, n / 16));
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* block = w + (ids[i] / 16) * block_stride;
    const int64_t lane = ids[i] % 16;
    const float s = ((const float*)block)[lane];
    for (int64_t k = 0; k < K; ++k)
      out[i * K + k] = (float)((int)block[64 + 64 * (k / 4) + 4 * lane + k % 4] - 128) * s;
  }
}

}  // namespace pace_avx512

PACE_VNNI_END
