// Decode attention over bf16 caches: values (and on CPUs without AVX512-BF16, where scores
// cannot use vdpbf16ps, keys too) are read as bf16 pairs and widened in registers (a 32-bit lane (x[2p], x[2p+1]) gives x[2p] = lane << 16
// and x[2p+1] = lane & 0xFFFF0000 as fp32), instead of widening every block into an fp32
// scratch copy first. The query rows and the output accumulators are kept "split": per chunk
// of 32 dims, the 16 even dims then the 16 odd ones, so a pair of loads feeds two FMAs with no
// shuffles. Used for items of few query rows (decode, small GQA groups) and D a multiple of 32.
#pragma once

#include <cstdint>

#include "simd.h"

namespace pace_avx512 {
namespace bf16_pairs {

// Rows of D floats, in place: each 32 floats (lo = the first 16, hi = the next 16) become
// permutex2var(lo, first, hi), permutex2var(lo, second, hi).
inline void permute_rows(float* x, int64_t rows, int64_t stride, int64_t D, __m512i first,
                         __m512i second) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < D; c += 32) {
      float* p = x + r * stride + c;
      const __m512 lo = _mm512_loadu_ps(p), hi = _mm512_loadu_ps(p + 16);
      _mm512_storeu_ps(p, _mm512_permutex2var_ps(lo, first, hi));
      _mm512_storeu_ps(p + 16, _mm512_permutex2var_ps(lo, second, hi));
    }
}

// Natural order -> split order (per 32 dims: the 16 even ones, then the 16 odd ones).
inline void split_rows(float* x, int64_t rows, int64_t stride, int64_t D) {
  permute_rows(x, rows, stride, D,
               _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
               _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31));
}

// Split order -> natural order (the inverse of split_rows).
inline void join_rows(float* x, int64_t rows, int64_t stride, int64_t D) {
  permute_rows(x, rows, stride, D,
               _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
               _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31));
}

// The even and odd elements of 32 bf16 values as two fp32 vectors.
static inline void widen_pairs(const bf16_t* p, __m512& even, __m512& odd) {
  const __m512i v = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
}

// dots[j] = 16 partial sums of q . key j, for keys[0 .. nk) (nk <= 16) and one split query
// row q (reduce them together for the 16 scores).
static inline void key_dots(const float* q, const bf16_t* const* keys, int64_t nk, int64_t D,
                            __m512 (&dots)[16]) {
  for (int j = 0; j < 16; ++j) dots[j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < D; c += 32) {
    const __m512 qe = _mm512_loadu_ps(q + c), qo = _mm512_loadu_ps(q + c + 16);
    for (int j = 0; j < 16; ++j)
      if (j < nk) {
        __m512 ke, ko;
        widen_pairs(keys[j] + c, ke, ko);
        dots[j] = _mm512_fmadd_ps(qo, ko, _mm512_fmadd_ps(qe, ke, dots[j]));
      }
  }
}

// acc[r0+i][c0 .. c0+32 NC) (split order) += sum_j p[r0+i][j] * v_j for R rows at once: each
// value chunk is widened once for all R rows.
template <int R, int NC>
inline void add_values(float* acc, int64_t stride, const float* p, int64_t pstride, int64_t r0,
                       int64_t n, const bf16_t* const* vals, int64_t c0) {
  __m512 o[R][2 * NC];
  for (int i = 0; i < R; ++i)
    for (int h = 0; h < 2 * NC; ++h) o[i][h] = _mm512_loadu_ps(acc + (r0 + i) * stride + c0 + 16 * h);
  for (int64_t j = 0; j < n; ++j) {
    __m512 v[2 * NC];
    for (int c = 0; c < NC; ++c) widen_pairs(vals[j] + c0 + 32 * c, v[2 * c], v[2 * c + 1]);
    for (int i = 0; i < R; ++i) {
      const __m512 pj = _mm512_set1_ps(p[(r0 + i) * pstride + j]);
      for (int h = 0; h < 2 * NC; ++h) o[i][h] = _mm512_fmadd_ps(pj, v[h], o[i][h]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int h = 0; h < 2 * NC; ++h) _mm512_storeu_ps(acc + (r0 + i) * stride + c0 + 16 * h, o[i][h]);
}

// add_values over every row (tiles of up to 4) and every 64 dims (tiles of 1-2 chunks).
template <int R>
inline void add_values_rows(float* acc, int64_t stride, const float* p, int64_t pstride,
                            int64_t r0, int64_t n, const bf16_t* const* vals, int64_t D) {
  for (int64_t c0 = 0; c0 < D; c0 += 64) {
    if (D - c0 >= 64) add_values<R, 2>(acc, stride, p, pstride, r0, n, vals, c0);
    else add_values<R, 1>(acc, stride, p, pstride, r0, n, vals, c0);
  }
}

inline void add_all_values(float* acc, int64_t stride, const float* p, int64_t pstride,
                           int64_t rows, int64_t n, const bf16_t* const* vals, int64_t D) {
  int64_t r0 = 0;
  for (; r0 + 4 <= rows; r0 += 4) add_values_rows<4>(acc, stride, p, pstride, r0, n, vals, D);
  switch (rows - r0) {
    case 1: add_values_rows<1>(acc, stride, p, pstride, r0, n, vals, D); break;
    case 2: add_values_rows<2>(acc, stride, p, pstride, r0, n, vals, D); break;
    case 3: add_values_rows<3>(acc, stride, p, pstride, r0, n, vals, D); break;
    default: break;
  }
}

}  // namespace bf16_pairs
}  // namespace pace_avx512
