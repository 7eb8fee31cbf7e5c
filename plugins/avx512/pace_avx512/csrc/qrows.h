// The activation rows of the quantized VNNI kernels (qlinear.cpp), quantized once per call
// with a scale per group of 32 (int8 against the k-quant kinds: per super-block of 256,
// q4k_tile.h, q6k_tile.h) and the sums of their codes per 16.
#pragma once

#include "isa.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels.h"
#include "simd.h"

namespace pace_avx512 {

// Activation rows quantized per group of 32. SPLIT (the default): codes c in +-127 x 128 (scale
// amax / 16256) as two int8 planes c = 128 hi + lo, hi in [-127, 127] at codes[0, M K), lo in
// [0, 127] at codes[M K, 2 M K): two vpdpbusd per quad give int16-class precision. Else int8
// codes (scale amax / 127). Neither plane holds -128 (isa.h dpbusd_offset_bytes). SPLIT with
// `words` (the avx2 build's tiles, qwords_tile.h): the codes c as int16 words instead of planes.
struct QuantizedRows {
  std::vector<int8_t> codes;  // [M][K] (SPLIT: [2][M][K])
  std::vector<int16_t> words;  // [M][K] (SPLIT with words, in place of the planes)
  std::vector<float> scales;  // [M][G] (a span's scale repeated for each of its groups)
  std::vector<float> sums;    // [M][2G]: scale * sum of the codes of each 16 (as seen)
  std::vector<int32_t> code_sums;  // [M][2G]: the sums of the codes of each 16 (code_shift)
  // Row m's code sum and activation sum (sums) over scale span `sub` of group g of G: with one
  // scale per group (SUB 1) its two 16s added, with one per 16 (SUB 2) the 16 `sub`.
  template <int SUB>
  int32_t span_codes(int64_t m, int64_t G, int64_t g, int sub) const {
    const int32_t* s = code_sums.data() + (m * G + g) * 2;
    return SUB == 2 ? s[sub] : s[0] + s[1];
  }
  template <int SUB>
  float span_sum(int64_t m, int64_t G, int64_t g, int sub) const {
    const float* s = sums.data() + (m * G + g) * 2;
    return SUB == 2 ? s[sub] : s[0] + s[1];
  }
  // Spans of 256 only, vpdpwssd operands: [M][G / 2] the code sums of groups 2p and 2p + 1
  // as the low and high int16 of one int32 (|sum| <= 32 * 127, q4k_tile.h); [M][G] those of
  // the two 16s of each group (q6k_tile.h)
  std::vector<int32_t> pair_sums, half_pairs;
};

// One per thread, shared by every kind and mode (it grows to the largest call's rows).
inline QuantizedRows& scratch_rows() {
  thread_local QuantizedRows rows;
  return rows;
}

// Rows split over up to `nthreads` threads, one scale per `span` k (32, or 256: int8 only, K
// a multiple of it). The code sums of 8 groups come from one transpose-and-add, not two
// horizontal sums per group (those took half of this function's time).
// `fixed` (int8 only): static scales, one per group of 32 columns shared by every row
// (calibrated activation scales; a span takes its groups' largest); codes are clamped to
// +-127. Null: a dynamic scale per row and span (amax / LEVELS). `words` (SPLIT only): int16
// codes in q.words, no planes.
template <bool SPLIT, typename T>
inline void quantize_rows(const T* x, int64_t ldx, int64_t M, int64_t K, QuantizedRows& q,
                          int nthreads, const float* fixed = nullptr, int64_t span = QGROUP,
                          bool words = false) {
  constexpr float LEVELS = SPLIT ? 127.0f * 128.0f : 127.0f;
  const int64_t G = K / QGROUP, per = span / QGROUP;  // groups per scale
  words = SPLIT && words;
  if (words)
    q.words.resize(M * K);
  else
    q.codes.resize((SPLIT ? 2 : 1) * M * K);
  q.scales.resize(M * G);
  q.sums.resize(M * G * 2);
  q.code_sums.resize(M * G * 2);
  if (per > 1) q.pair_sums.resize(M * G / 2), q.half_pairs.resize(M * G);
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, M * K / 8192));
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const T* row = x + m * ldx;
    // The scale of the span from group g0: inv (codes per unit) and scale (units per code).
    const auto span_scale = [&](int64_t g0, float& inv, float& scale) {
      if (!SPLIT && fixed) {
        scale = *std::max_element(fixed + g0, fixed + g0 + per);
        inv = scale > 0 ? 1.0f / scale : 0.0f;
      } else {
        __m512 top = _mm512_setzero_ps();
        for (int64_t k = g0 * QGROUP; k < (g0 + per) * QGROUP; k += 16)
          top = _mm512_max_ps(top, _mm512_abs_ps(load(row + k, 0xFFFF)));
        const float amax = _mm512_reduce_max_ps(top);
        inv = amax > 0 ? LEVELS / amax : 0.0f, scale = amax / LEVELS;
      }
      if (!std::isfinite(inv)) inv = 0.0f, scale = 0.0f;  // a span of denormals: all codes 0
    };
    // Group g's codes c (qa: its first 16, qb: the next 16, as int32), stored, and its scale.
    const auto group_codes = [&](int64_t g, float inv, float scale, __m512i& qa, __m512i& qb) {
      const T* src = row + g * QGROUP;
      const __m512 a = load(src, 0xFFFF), b = load(src + 16, 0xFFFF);
      qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inv)));
      qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inv)));
      if (!SPLIT && fixed) {  // values past the calibrated range saturate
        const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127);
        qa = _mm512_max_epi32(_mm512_min_epi32(qa, hi), lo);
        qb = _mm512_max_epi32(_mm512_min_epi32(qb, hi), lo);
      }
      if (words) {  // |c| <= 16256: the low 16 bits are c
        int16_t* w = q.words.data() + m * K + g * QGROUP;
        _mm256_storeu_si256((__m256i*)w, _mm512_cvtepi32_epi16(qa));
        _mm256_storeu_si256((__m256i*)(w + 16), _mm512_cvtepi32_epi16(qb));
      } else if constexpr (SPLIT) {
        int8_t* dst = q.codes.data() + m * K + g * QGROUP;
        const __m512i seven = _mm512_set1_epi32(127);
        _mm_storeu_si128((__m128i*)dst, _mm512_cvtsepi32_epi8(_mm512_srai_epi32(qa, 7)));
        _mm_storeu_si128((__m128i*)(dst + 16), _mm512_cvtsepi32_epi8(_mm512_srai_epi32(qb, 7)));
        _mm_storeu_si128((__m128i*)(dst + M * K), _mm512_cvtsepi32_epi8(_mm512_and_si512(qa, seven)));
        _mm_storeu_si128((__m128i*)(dst + M * K + 16), _mm512_cvtsepi32_epi8(_mm512_and_si512(qb, seven)));
      } else {
        int8_t* dst = q.codes.data() + m * K + g * QGROUP;
        _mm_storeu_si128((__m128i*)dst, _mm512_cvtsepi32_epi8(qa));
        _mm_storeu_si128((__m128i*)(dst + 16), _mm512_cvtsepi32_epi8(qb));
      }
      q.scales[m * G + g] = scale;
    };
    // The pair sums of groups g - 1, g (g odd) from their code sums (spans of 256).
    const auto pair_sum = [&](int64_t g) {
      const int32_t* c = q.code_sums.data() + (m * G + g - 1) * 2;
      q.pair_sums[(m * G + g) / 2] = (int32_t)((uint16_t)(c[0] + c[1]) | (uint32_t)(c[2] + c[3]) << 16);
    };
    float inv = 0.0f, scale = 0.0f;
    int64_t g = 0;
    // 8 groups at a time (spans of 32 or 256 k): their 16 code sums from one transpose-and-
    // add (simd.h reduce16_epi32) instead of a horizontal sum per 16, stored as vectors.
    for (; g + 8 <= G; g += 8) {
      __m512i c[16];
      alignas(64) float scales[16];
      for (int i = 0; i < 8; ++i) {
        if ((g + i) % per == 0) span_scale(g + i, inv, scale);
        group_codes(g + i, inv, scale, c[2 * i], c[2 * i + 1]);
        scales[2 * i] = scales[2 * i + 1] = scale;
      }
      const __m512i sums = reduce16_epi32(c);
      const int64_t at = (m * G + g) * 2;
      _mm512_storeu_si512(q.code_sums.data() + at, sums);
      _mm512_storeu_ps(q.sums.data() + at, _mm512_mul_ps(_mm512_load_ps(scales), _mm512_cvtepi32_ps(sums)));
      if (per > 1) {  // each group's two sums as the low, high int16 of one int32
        _mm256_storeu_si256((__m256i*)(q.half_pairs.data() + m * G + g), _mm512_cvtepi32_epi16(sums));
        for (int i = 1; i < 8; i += 2) pair_sum(g + i);
      }
    }
    // the groups left over, one at a time: spans of 32 only (a span of 256 divides K)
    for (; g < G; ++g) {
      span_scale(g, inv, scale);
      __m512i qa, qb;
      group_codes(g, inv, scale, qa, qb);
      const int32_t sa = _mm512_reduce_add_epi32(qa), sb = _mm512_reduce_add_epi32(qb);
      q.code_sums[(m * G + g) * 2] = sa, q.code_sums[(m * G + g) * 2 + 1] = sb;
      q.sums[(m * G + g) * 2] = scale * (float)sa;
      q.sums[(m * G + g) * 2 + 1] = scale * (float)sb;
    }
  }
}

}  // namespace pace_avx512
