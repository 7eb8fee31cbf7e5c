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

// The integer sums of one scale span for activation rows 0..MT-1: per row two vectors, rows 0-3
// and 4-7 of the half, each lane one weight row's sum over k-pair 0 or 1 of the span's quads
// (`dot`), added per row in the flush order by `rows` (vphaddd).
template <int MT>
struct WordSums {
  __m256i acc[MT][2];
  __attribute__((always_inline)) WordSums() {
    PACE_UNROLL for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_si256();
  }
  // += the quad's widened codes (w0: rows 0-3, w1: 4-7) . row m's quad at x[m] + k, broadcast
  __attribute__((always_inline)) void dot(__m256i w0, __m256i w1, const int16_t* const (&x)[MT],
                                          int64_t k) {
    PACE_UNROLL for (int m = 0; m < MT; ++m) {
      const __m256i xm = _mm256_set1_epi64x(*(const int64_t*)(x[m] + k));
      acc[m][0] = _mm256_add_epi32(acc[m][0], _mm256_madd_epi16(w0, xm));
      acc[m][1] = _mm256_add_epi32(acc[m][1], _mm256_madd_epi16(w1, xm));
    }
  }
  __attribute__((always_inline)) void rows(__m256i (&out)[MT]) const {
    PACE_UNROLL for (int m = 0; m < MT; ++m) out[m] = _mm256_hadd_epi32(acc[m][0], acc[m][1]);
  }
};

// The full tile's 4 rows: the same operations, written so that the 8 accumulators stay in
// registers. As an array (above) GCC kept one of them on the stack, a store and a load on
// the loop's critical path every quad: ~92 GOP/s on one Zen 3 core against ~108 here (q8_0,
// 2048-k rows, hot). One asm statement per quad with the accumulators as named operands.
#define PACE_WORDS_ROW(i)                                      \
  "vpbroadcastq %[x" #i "], %%ymm14\n\t"                       \
  "vpmaddwd %%ymm14, %[w0], %%ymm15\n\t"                       \
  "vpmaddwd %%ymm14, %[w1], %%ymm14\n\t"                       \
  "vpaddd %%ymm15, %[a" #i "0], %[a" #i "0]\n\t"               \
  "vpaddd %%ymm14, %[a" #i "1], %[a" #i "1]\n\t"
template <>
struct WordSums<4> {
  __m256i a00, a01, a10, a11, a20, a21, a30, a31;
  __attribute__((always_inline)) WordSums() {
    a00 = a01 = a10 = a11 = a20 = a21 = a30 = a31 = _mm256_setzero_si256();
  }
  __attribute__((always_inline)) void dot(__m256i w0, __m256i w1, const int16_t* const (&x)[4],
                                          int64_t k) {
    asm(PACE_WORDS_ROW(0) PACE_WORDS_ROW(1) PACE_WORDS_ROW(2) PACE_WORDS_ROW(3)
        : [a00] "+x"(a00), [a01] "+x"(a01), [a10] "+x"(a10), [a11] "+x"(a11),
          [a20] "+x"(a20), [a21] "+x"(a21), [a30] "+x"(a30), [a31] "+x"(a31)
        : [w0] "x"(w0), [w1] "x"(w1), [x0] "m"(*(const int64_t*)(x[0] + k)),
          [x1] "m"(*(const int64_t*)(x[1] + k)), [x2] "m"(*(const int64_t*)(x[2] + k)),
          [x3] "m"(*(const int64_t*)(x[3] + k))
        : "xmm14", "xmm15");
  }
  __attribute__((always_inline)) void rows(__m256i (&out)[4]) const {
    out[0] = _mm256_hadd_epi32(a00, a01);
    out[1] = _mm256_hadd_epi32(a10, a11);
    out[2] = _mm256_hadd_epi32(a20, a21);
    out[3] = _mm256_hadd_epi32(a30, a31);
  }
};
#undef PACE_WORDS_ROW

// The row sums (WordSums::rows) of half H of group `codes` over quads [q0, q1) against the
// activation rows x[m] (at the group's first k): byte-coded kinds one quad at a time, 4-bit
// kinds a line (two quads) at a time.
template <int KIND, int H, int MT>
__attribute__((always_inline)) inline void span_rows(const uint8_t* codes,
                                                     const int16_t* const (&x)[MT], int q0,
                                                     int q1, __m256i (&out)[MT]) {
  WordSums<MT> sums;
  if constexpr (is_byte_coded(KIND)) {  // quad q's codes u, one byte each
    _Pragma("GCC unroll 1") for (int q = q0; q < q1; ++q) {
      const uint8_t* quad = codes + 64 * q + 32 * H;  // rows 0-3, then 4-7 of the half
      sums.dot(words16(_mm_loadu_si128((const __m128i*)quad)),
               words16(_mm_loadu_si128((const __m128i*)(quad + 16))), x, 4 * q);
    }
  } else {  // line v: quad 2v in the low nibbles, 2v + 1 in the high ones
    const __m256i low = _mm256_set1_epi16(0x0F);
    _Pragma("GCC unroll 1") for (int v = q0 / 2; v < q1 / 2; ++v) {
      const uint8_t* line = codes + 64 * v + 32 * H;
      const __m256i lo = words16(_mm_loadu_si128((const __m128i*)line));
      const __m256i hi = words16(_mm_loadu_si128((const __m128i*)(line + 16)));
      sums.dot(_mm256_and_si256(lo, low), _mm256_and_si256(hi, low), x, 8 * v);
      sums.dot(_mm256_srli_epi16(lo, 4), _mm256_srli_epi16(hi, 4), x, 8 * v + 4);
    }
  }
  sums.rows(out);
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
  PACE_UNROLL for (int m = 0; m < MT; ++m) total[m] = _mm256_setzero_ps();
  QScales<KIND> scales;  // 4-bit kinds
  for (int64_t g = 0; g < G; ++g) {
    qtouch_run<KIND>(block, g);
    const uint8_t* codes = KIND == KIND_Q6 ? merged + 512 * g : qgroup_codes<KIND>(block, G, g);
    const uint16_t* tables = qgroup_tables<KIND>(block, g);
    const int16_t* xg[MT];
    PACE_UNROLL for (int m = 0; m < MT; ++m) xg[m] = x.words.data() + (m0 + m) * K + g * QGROUP;
    // total[m] += (row m's sums + OF_U x its code sum over scale span `sub`) * s * row m's
    // scale, then (kinds with mins) + mn * row m's activation sum over the span
    auto flush = [&](const __m256i (&sum)[MT], __m256 s, __m256 mn, int sub) {
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        __m256i row = sum[m];
        if constexpr (OF_U != 0)
          row = _mm256_add_epi32(
              row, _mm256_set1_epi32(OF_U * x.span_codes<SUB>(m0 + m, G, g, sub)));
        const __m256 sx = _mm256_mul_ps(s, _mm256_set1_ps(x.scales[(m0 + m) * G + g]));
        total[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(row), sx, total[m]);
        if constexpr (!FOLD) {
          const __m256 xsum = _mm256_set1_ps(x.span_sum<SUB>(m0 + m, G, g, sub));
          total[m] = _mm256_fmadd_ps(mn, xsum, total[m]);
        }
      }
    };
    __m256i sum[MT];
    if constexpr (is_byte_coded(KIND)) {
      PACE_UNROLL for (int sub = 0; sub < SUB; ++sub) {
        span_rows<KIND, H, MT>(codes, xg, sub * 8 / SUB, (sub + 1) * 8 / SUB, sum);
        flush(sum, half_rows<H>(span_scale<KIND>(tables, g, sub)), _mm256_setzero_ps(), sub);  // folded
      }
    } else {
      span_rows<KIND, H, MT>(codes, xg, 0, 8, sum);
      scales.group(tables, g);
      flush(sum, half_rows<H>(scales.scale), half_rows<H>(scales.min), 0);
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
