// Decode and prefill attention over int8 KV rows (kv_cache_dtype "int8",
// pace_core/caches/kv_quant.py: D int8 values, then an fp32 scale per group of KV8_GROUP = 32)
// without an fp32 copy of the cache: groups de-quantized in registers (q * scale in fp32, the
// reference's read-back) for the keys' dot products and the values' accumulation, and for
// prefill tiles keys split into two bf16 rows so the bf16 tiles (vdpbf16ps) score them.
// Used for D a multiple of 32.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels.h"
#include "simd.h"

namespace pace_avx512 {
namespace kv8 {

// Values [i, i + 32) of an int8 KV row (i a multiple of KV8_GROUP, within D) as fp32, q * scale
// (kv_quant.py's read-back), in two vectors of 16.
inline void dequant_group(const int8_t* row, int64_t D, int64_t i, __m512& lo, __m512& hi) {
  static_assert(KV8_GROUP == 32);
  float sc;
  std::memcpy(&sc, row + D + 4 * (i / KV8_GROUP), sizeof(float));
  const __m512 scale = _mm512_set1_ps(sc);
  const auto widen = [&](const int8_t* p) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))), scale);
  };
  lo = widen(row + i);
  hi = widen(row + i + 16);
}

inline void dequant_group(const int8_t* row, int64_t D, int64_t i, float* lo, float* hi) {
  __m512 l, h;
  dequant_group(row, D, i, l, h);
  _mm512_storeu_ps(lo, l);
  _mm512_storeu_ps(hi, h);
}

// acc[r] += the 16 partial sums of query row r (qf + r * Dp, scaled fp32) dotted with the
// int8 key row, for R rows: each group is de-quantized once for all R rows (the lanes' sums
// in the order ScoreRow's fp32 dot takes them: 16 values at a time, ascending).
template <int R>
inline void key_dots(const float* qf, int64_t Dp, const int8_t* key, int64_t D, __m512 (&acc)[R]) {
  for (int64_t i = 0; i < D; i += KV8_GROUP) {
    __m512 lo, hi;
    dequant_group(key, D, i, lo, hi);
    for (int r = 0; r < R; ++r) {
      const float* q = qf + r * Dp + i;
      acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16), hi, _mm512_fmadd_ps(_mm512_loadu_ps(q), lo, acc[r]));
    }
  }
}

// Values [d, d + 16 ND) of an int8 row as ND fp32 vectors (ND even, d a multiple of 32).
template <int ND>
inline void dequant_chunk(const int8_t* row, int64_t D, int64_t d, __m512 (&v)[ND]) {
  for (int c = 0; c < ND; c += 2) dequant_group(row, D, d + 16 * c, v[c], v[c + 1]);
}

#ifdef PACE_HAS_BF16
// Int8 key rows (D a multiple of 32) as bf16 rows of 2D values [hi, lo] for the bf16 tiles:
// the de-quantized key x = q * scale (fp32, as rows_int8) is hi = bf16(x) plus lo =
// bf16(x - hi), so a query dotted with the row [q, q] gets q.x to ~2^-17 of |x|, not bf16's 2^-9.
inline void split_int8_keys(const int8_t* const* rows, int64_t n, int64_t D, bf16_t* out) {
  const auto widen = [](__m256bh h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
  };
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < D; i += KV8_GROUP) {
      __m512 x[2];
      dequant_group(rows[j], D, i, x[0], x[1]);
      for (int c = 0; c < 2; ++c) {
        const __m256bh hi = _mm512_cvtneps_pbh(x[c]);
        const __m256bh lo = _mm512_cvtneps_pbh(_mm512_sub_ps(x[c], widen(hi)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j * 2 * D + i + 16 * c), (__m256i)hi);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j * 2 * D + D + i + 16 * c), (__m256i)lo);
      }
    }
}
#endif

}  // namespace kv8
}  // namespace pace_avx512
