// Quantized linear for many rows on AVX512-BF16 (and on the avx2 target): de-quantize weight
// panels to bf16 in L2 and run the dense bf16 tiles on them.
//
// Where vdpbf16ps exists (Zen 4/5, Cooper Lake, Sapphire Rapids and later) it retires 32 bf16
// products per instruction at the rate of an FMA. The VNNI tiles of qlinear.cpp need two
// vpdpbusd per k-quad for 15-bit activations (also 32 useful products) plus, for every row tile,
// the unpacking of the codes and a scale flush per group: prefill on quantized weights there
// ran at about half of the dense bf16 GEMM. Here each thread de-quantizes one group of 4 row
// blocks (64 output columns x K) once per call, w = u s + m in fp32 rounded to bf16 (nearest
// even), into the dense packed layout (kernels.h: k-pair lines of 16 columns) in a per-thread
// buffer that stays in L2, and runs all M rows against it with gemm_tiles.h. The
// de-quantization is paid per weight, the tiles per weight and row, so from
// `tuning().qpanel_rows` rows on the panel is the faster path. The activations are used as
// they are (bf16); the only rounding beyond the weight format's own is the weight's to bf16
// (2^-9 relative), as in a bf16 model.
//
// The avx2 target takes the same path with the widened-bf16 tiles (activations widened to fp32
// once per call): its vpdpbusd is emulated (several instructions per 256 bits), so the VNNI
// tiles of qlinear.cpp ran at about a third of the dense bf16 rate there.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "gemm_tiles.h"
#include "kernels.h"
#include "qblock.h"
#include "simd.h"
#include "work_ranges.h"

namespace pace_avx512 {

#if defined(PACE_HAS_BF16) || !defined(__AVX512F__)
namespace {

constexpr int64_t PAIR_STRIDE = 32 * GROUP;  // bf16 elements per k-pair of a dense group

// Rows j of the k-pair line: (even[j], odd[j]) as bf16, from fp32 vectors of the 16 rows.
inline void put_pair(bf16_t* dst, __m512 even, __m512 odd) {
#ifdef PACE_HAS_BF16
  alignas(64) static constexpr int16_t ORDER[32] = {
      0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(odd, even);  // even in lanes 0-15
  _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(_mm512_load_si512(ORDER), halves));
#else  // each 32-bit lane (even[j], odd[j]): the same bits, rounded as to_bf16 does
  const __m512i e = _mm512_cvtepu16_epi32(to_bf16(even)), o = _mm512_cvtepu16_epi32(to_bf16(odd));
  _mm512_storeu_si512(dst, _mm512_or_si512(e, _mm512_slli_epi32(o, 16)));
#endif
}

// One code per row: each row's 32-bit lane shifted down by `bits` and masked, as fp32.
inline __m512 code(__m512i line, int bits, int mask) {
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(line, bits), _mm512_set1_epi32(mask)));
}

// One block of 16 rows (all G groups) into its 16 columns of a dense group (`dense` points
// at them: k-pair p of the block at dense + p * PAIR_STRIDE).
template <int KIND>
void dequantize_block(const uint8_t* block, int64_t G, bf16_t* dense) {
  constexpr int SUB = qscales_per_group(KIND);
  QScales<KIND> scales;  // 4-bit kinds
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* codes = qgroup_codes<KIND>(block, G, g);
    const uint16_t* tables = qgroup_tables<KIND>(block, g);  // scales [SUB][16], mins [16]
    bf16_t* pairs = dense + g * (QGROUP / 2) * PAIR_STRIDE;  // this group's 16 k-pairs
    if constexpr (is_byte_coded(KIND)) {  // quad q: k = 4 q + e in byte e of each row's lane
      PACE_UNROLL for (int q = 0; q < 8; ++q) {
        const __m512 s = span_scale<KIND>(tables, g, q * SUB / 8);
        // u = q + 128 (int8), q + 32 (KIND_Q6)
        const __m512 m = _mm512_mul_ps(s, _mm512_set1_ps(-(float)qcode_offset(KIND)));
        const __m512i line = quad_codes<KIND>(codes, q);
        __m512 w[4];
        PACE_UNROLL for (int e = 0; e < 4; ++e) w[e] = _mm512_fmadd_ps(code(line, 8 * e, 0xFF), s, m);
        put_pair(pairs + (2 * q) * PAIR_STRIDE, w[0], w[1]);
        put_pair(pairs + (2 * q + 1) * PAIR_STRIDE, w[2], w[3]);
      }
    } else {  // line v: quad 2 v in the low nibbles, 2 v + 1 in the high ones
      scales.group(tables, g);
      const __m512 s = scales.scale, m = scales.min;
      PACE_UNROLL for (int v = 0; v < 4; ++v) {
        const __m512i line = _mm512_loadu_si512(codes + 64 * v);
        PACE_UNROLL for (int h = 0; h < 2; ++h) {
          const int quad = 2 * v + h;
          __m512 w[4];
          PACE_UNROLL for (int e = 0; e < 4; ++e)
            w[e] = _mm512_fmadd_ps(code(line, 8 * e + 4 * h, 0x0F), s, m);
          put_pair(pairs + (2 * quad) * PAIR_STRIDE, w[0], w[1]);
          put_pair(pairs + (2 * quad + 1) * PAIR_STRIDE, w[2], w[3]);
        }
      }
    }
  }
}

// Blocks [b0, b0 + count) (count <= GROUP) as one dense group. The columns of missing blocks
// keep whatever the buffer held: each column has its own accumulators and the epilogue stores
// only columns below N.
template <int KIND>
void dequantize_group(const uint8_t* w, int64_t block_stride, int64_t G, int64_t b0,
                      int64_t count, bf16_t* dense) {
  for (int64_t n = 0; n < count; ++n)
    dequantize_block<KIND>(w + (b0 + n) * block_stride, G, dense + 32 * n);
}

template <int KIND>
void panel_matmul(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                  int64_t block_stride, const float* bias, int64_t N, bf16_t* y, int64_t ldy,
                  int nthreads) {
  const int64_t G = K / QGROUP, blocks = (N + 15) / 16, groups = (blocks + GROUP - 1) / GROUP;
  const int nt = pick_threads(nthreads, blocks * block_stride, M, groups);
#ifndef PACE_HAS_BF16  // the widened-bf16 tiles read fp32 activation rows (K is even)
  const float* xw = widen_rows(x, ldx, M, K);  // the calling thread's buffer, shared below
#endif
  EvenStealRanges work(groups, nt);  // each thread's contiguous range of groups, with stealing
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    thread_local std::vector<bf16_t> dense;
    dense.resize(K * COLUMNS);
#ifdef PACE_HAS_BF16
    const Args<bf16_t, bf16_t> a{x, ldx, dense.data(), K / 2 * PAIR_STRIDE, K / 2};
#else
    const Args<float, bf16_t> a{xw, K, dense.data(), K / 2 * PAIR_STRIDE, K / 2};
#endif
    work.drain(omp_get_thread_num(), [&](int64_t g, bool next_own) {
      const int64_t b0 = g * GROUP, count = std::min<int64_t>(GROUP, blocks - b0);
      dequantize_group<KIND>(w, block_stride, G, b0, count, dense.data());
      if (next_own)  // the next group's codes into L2 while the tiles run
        for (int64_t i = 0; i < GROUP * block_stride; i += 64)
          _mm_prefetch((const char*)(w + (b0 + GROUP) * block_stride + i), _MM_HINT_T1);
      const int64_t col = g * COLUMNS;
      const LinearEpilogue<bf16_t> e{y + col, ldy, bias ? bias + col : nullptr, N - col};
#ifdef PACE_HAS_BF16
      column_tile<Bf16Kernel, PREFILL_ROWS, GROUP>(a, e, M, 0, nullptr);
#else
      column_tile<Bf16WideKernel, PREFILL_ROWS, GROUP>(a, e, M, 0, nullptr);
#endif
    });
  }
}

}  // namespace

bool qlinear_bf16_panel(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                        int64_t block_stride, int kind, const float* bias, int64_t N, bf16_t* y,
                        int64_t ldy, int nthreads) {
  if (!panel_call(kind, M)) return false;
  by_kind(kind, [&](auto k) { panel_matmul<decltype(k)::value>(x, ldx, M, K, w, block_stride, bias, N, y, ldy, nthreads); });
  return true;
}

#else  // AVX-512 without AVX512-BF16: qlinear.cpp's (native) VNNI tiles run every call

bool qlinear_bf16_panel(const bf16_t*, int64_t, int64_t, int64_t, const uint8_t*, int64_t, int,
                        const float*, int64_t, bf16_t*, int64_t, int) {
  return false;
}

#endif

}  // namespace pace_avx512
