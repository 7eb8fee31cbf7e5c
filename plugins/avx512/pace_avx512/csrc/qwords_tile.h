// The avx2 build's tiles for 15-bit activations: one vpmaddwd per 16 products.
//
// Without VNNI a 15-bit activation (c = 128 hi + lo, qrows.h) against a weight byte took two
// emulated vpdpbusd per quad (qlinear.cpp qtile, one per plane, each several instructions), so
// the avx2 build's default (`exact`) mode ran its batched calls at the bf16 panel's rate or
// below. Here the activation rows are int16 words (quantize_rows with `words`) and the codes
// are widened to int16 once per tile: vpmaddwd multiplies 16 word pairs and adds them in pairs
// to int32, exact (|u c| <= 255 x 16256, a group's sum < 2^28), twice the multiply-adds of an
// FMA per instruction.
//
// A tile is MT activation rows x one half (8 rows) of a packed row block, its groups in order.
// Per quad (4 k of 8 weight rows: 32 bytes of the line, qlinear.cpp's layout) the codes widen
// to two vectors of 16 words, rows 0-3 and 4-7 of the half, row r's 4 k at words 4r..4r + 3;
// the activation quad (4 words) is broadcast per row, so each int32 lane holds the sum over
// k-pair 0 or 1 of one weight row. A scale span's flush adds the two lanes of each row
// (vphaddd: rows in the order 0 1 4 5 2 3 6 7, the order the totals keep until the store);
// kinds without mins fold their offset into that integer sum (one FMA per span), q4_k and
// int4 add their min term as qtile does. KIND_Q6's codes are merged to bytes once per block
// and call (merge_q6_codes), not per tile.
#pragma once

#include "isa.h"

#if !defined(__AVX512F__)

#include <cstdint>

#include "kernels.h"
#include "qblock.h"
#include "qrows.h"
#include "simd.h"

#ifndef PACE_UNROLL
#define PACE_UNROLL _Pragma("GCC unroll 16")
#endif

namespace pace_avx512 {

// Lanes of a half in the order the flush leaves them (an involution: it also restores).
inline __m256 hadd_order(__m256 v) {
  return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
}

// Half H of a 16-lane fp32 vector (rows 0-7 or 8-15 of a block), in the flush order.
template <int H>
__attribute__((always_inline)) inline __m256 half_rows(__m512 v) {
  return hadd_order(H ? v.hi : v.lo);
}

// 16 code bytes (4 weight rows x 4 k) as int16 words.
__attribute__((always_inline)) inline __m256i words16(__m128i bytes) {
  return _mm256_cvtepu8_epi16(bytes);
}

// KIND_Q6's codes of a packed row block merged to one byte per code (quad_codes), group g's
// 8 quads of 64 bytes at merged + 512 g as an 8-bit kind's: once per block and call, so the
// tiles of every row read them as bytes.
inline void merge_q6_codes(const uint8_t* block, int64_t G, uint8_t* merged) {
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* codes = qgroup_codes<KIND_Q6>(block, G, g);
    PACE_UNROLL for (int q = 0; q < 8; ++q)
      _mm512_storeu_si512(merged + 512 * g + 64 * q, quad_codes<KIND_Q6>(codes, q));
  }
}

// total[m] (8 lanes, rows of half H of the block at `block`, flush order) for the activation
// rows [m0, m0 + MT) as words. KIND_Q6 reads its codes from `merged` (merge_q6_codes).
template <int KIND, int H, int MT>
inline void qwords_half(const uint8_t* block, const uint8_t* merged, int64_t G,
                        const QuantizedRows& x, int64_t K, int64_t m0, __m256 (&total)[MT]) {
  constexpr int SUB = qscales_per_group(KIND);
  // The fold (qlinear.cpp folds): a kind without mins (its min is -offset s) sums (u - offset)
  // c = q c, exact in int32, and takes no min term; q4_k and int4 keep sum u c and their mins.
  constexpr bool FOLD = !has_mins(KIND);
  constexpr int OF_U = FOLD ? -qcode_offset(KIND) : 0;
  const int16_t* xw[MT];
  PACE_UNROLL for (int m = 0; m < MT; ++m) {
    total[m] = _mm256_setzero_ps();
    xw[m] = x.words.data() + (m0 + m) * K;
  }
  const __m256i low = _mm256_set1_epi16(0x0F);
  QScales<KIND> scales;  // 4-bit kinds
  for (int64_t g = 0; g < G; ++g) {
    qtouch_run<KIND>(block, g);
    const uint8_t* codes = KIND == KIND_Q6 ? merged + 512 * g : qgroup_codes<KIND>(block, G, g);
    const uint16_t* tables = qgroup_tables<KIND>(block, g);
    __m256i acc[MT][2];
    auto clear = [&]() {
      PACE_UNROLL for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_si256();
    };
    // acc[m] += the quad's widened codes (rows 0-3, 4-7) . row m's activation quad
    auto dot = [&](__m256i w0, __m256i w1, int quad) {
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        const __m256i xm = _mm256_set1_epi64x(*(const int64_t*)(xw[m] + g * QGROUP + 4 * quad));
        acc[m][0] = _mm256_add_epi32(acc[m][0], _mm256_madd_epi16(w0, xm));
        acc[m][1] = _mm256_add_epi32(acc[m][1], _mm256_madd_epi16(w1, xm));
      }
    };
    // total[m] += (acc[m]'s row sums + OF_U x row m's code sum over scale span `sub`) * s *
    // row m's scale, then (kinds with mins) + mn * row m's activation sum over the span
    auto flush = [&](__m256 s, __m256 mn, int sub) {
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        __m256i sum = _mm256_hadd_epi32(acc[m][0], acc[m][1]);
        if constexpr (OF_U != 0)
          sum = _mm256_add_epi32(
              sum, _mm256_set1_epi32(OF_U * x.span_codes<SUB>(m0 + m, G, g, sub)));
        const __m256 sx = _mm256_mul_ps(s, _mm256_set1_ps(x.scales[(m0 + m) * G + g]));
        total[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), sx, total[m]);
        if constexpr (!FOLD) {
          const __m256 xsum = _mm256_set1_ps(x.span_sum<SUB>(m0 + m, G, g, sub));
          total[m] = _mm256_fmadd_ps(mn, xsum, total[m]);
        }
      }
    };
    if constexpr (is_byte_coded(KIND)) {  // quad q's codes u, one byte each
      PACE_UNROLL for (int sub = 0; sub < SUB; ++sub) {
        clear();
        _Pragma("GCC unroll 1") for (int q = sub * 8 / SUB; q < (sub + 1) * 8 / SUB; ++q) {
          const uint8_t* quad = codes + 64 * q + 32 * H;  // rows 0-3, then 4-7 of the half
          dot(words16(_mm_loadu_si128((const __m128i*)quad)),
              words16(_mm_loadu_si128((const __m128i*)(quad + 16))), q);
        }
        flush(half_rows<H>(fp16x16(tables + 16 * sub)), _mm256_setzero_ps(), sub);  // folded
      }
    } else {  // line v: quad 2v in the low nibbles, 2v + 1 in the high ones
      clear();
      _Pragma("GCC unroll 1") for (int v = 0; v < 4; ++v) {
        const uint8_t* line = codes + 64 * v + 32 * H;
        const __m256i lo = words16(_mm_loadu_si128((const __m128i*)line));
        const __m256i hi = words16(_mm_loadu_si128((const __m128i*)(line + 16)));
        dot(_mm256_and_si256(lo, low), _mm256_and_si256(hi, low), 2 * v);
        dot(_mm256_srli_epi16(lo, 4), _mm256_srli_epi16(hi, 4), 2 * v + 1);
      }
      scales.group(tables, g);
      flush(half_rows<H>(scales.scale), half_rows<H>(scales.min), 0);
    }
  }
}

// total[m] (16 lanes: the rows of the block at `block`) for activation rows [m0, m0 + MT):
// the two halves in turn, each over all groups (KIND_Q6: codes from `merged`).
template <int KIND, int MT>
inline void qwords_tile(const uint8_t* block, const uint8_t* merged, int64_t G,
                        const QuantizedRows& x, int64_t K, int64_t m0, __m512 (&total)[MT]) {
  __m256 half[MT];
  qwords_half<KIND, 0, MT>(block, merged, G, x, K, m0, half);
  PACE_UNROLL for (int m = 0; m < MT; ++m) total[m].lo = hadd_order(half[m]);
  qwords_half<KIND, 1, MT>(block, merged, G, x, K, m0, half);
  PACE_UNROLL for (int m = 0; m < MT; ++m) total[m].hi = hadd_order(half[m]);
}

}  // namespace pace_avx512

#endif
