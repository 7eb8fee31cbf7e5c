// GGUF q4_k (KIND_Q4K) against int8 activations quantized per super-block of 256 (qrows.h,
// span 256: one scale per row and 256 k, llama.cpp's q8_K class), integer inside a super-block.
// Per block of 16 weight rows, activation row and super-block, with u the 4-bit codes, xq the
// activation codes, sc and m the 6-bit sub-block scales and mins of each weight row:
//   isum_i = sum u xq over sub-block i's 32 k          vpdpbusd (isa.h dpbusd_nibbles)
//   acc    = sum_i sc_i isum_i                           vpmulld, vpaddd per sub-block
//   msum   = sum_i m_i csum_i (csum_i: the row's code sum over sub-block i)
//                                                        4 vpdpwssd on int16 pairs (i, i + 1)
//   total  = fma(float(acc), d xs, total), then total = fma(float(msum), -dmin xs, total)
// exact in int32 (|acc| <= 8 * 63 * 15 * 127 * 32 < 2^31, |msum| <= 8 * 63 * 4064 < 2^24):
// float(acc) rounds to nearest even, d xs and -dmin xs are fp32 products; two FMAs per 256 k
// where the per-32 path took two per 32 and the conversion of sc and m to float each time.
// Each output takes the same operations at any MT x NB, so the decode GEMV (MT = 1) is a tile.
#pragma once

#include "isa.h"

#include <cstdint>

#include "kernels.h"
#include "ksuper_tile.h"
#include "qrows.h"
#include "simd.h"

PACE_VNNI_BEGIN

#define PACE_UNROLL _Pragma("GCC unroll 16")

namespace pace_avx512 {

// m bytes of sub-blocks 2p and 2p + 1 ([16] each, at `m`) interleaved per row as int16 pairs.
__attribute__((always_inline)) inline __m512i q4k_min_pairs(const uint8_t* m, int p) {
  const __m128i a = _mm_loadu_si128((const __m128i*)(m + 32 * p));
  const __m128i b = _mm_loadu_si128((const __m128i*)(m + 32 * p + 16));
  return _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b)));
}

// total[j][m]: the 16 rows of row block `block[j]` (NB blocks side by side) against the int8
// activation rows [m0, m0 + MT) of `x` (quantized per 256), K = 32 G.
template <int MT, int NB>
inline void q4k_tile(const uint8_t* const (&block)[NB], int64_t G, const QuantizedRows& x,
                     int64_t K, int64_t m0, __m512 (&total)[NB][MT]) {
  // Independent chains per row and block when the rows are few (a dot product's ~5 cycles)
  constexpr int CH = MT >= 4 ? 1 : MT >= 2 || NB >= 2 ? 2 : 4;
  const __m512i low = _mm512_set1_epi8(0x0F);
  // a group (sub-block i of 32 k): acc += sc_i * (sum u xq)
  const auto group = [&](const int32_t* const (&xq)[MT], int64_t g, int i,
                         const uint8_t* const (&codes)[NB], const uint16_t* const (&tables)[NB],
                         __m512i (&acc)[NB][MT]) __attribute__((always_inline)) {
    __m512i isum[CH][NB][MT];
    PACE_UNROLL for (int c = 0; c < CH; ++c) PACE_UNROLL for (int j = 0; j < NB; ++j)
      PACE_UNROLL for (int m = 0; m < MT; ++m) isum[c][j][m] = _mm512_setzero_si512();
    // isum[chain][j][m] += block j's codes of quad `quad` (w[j]) . row m's quad broadcast
    auto dot4 = [&](const __m512i (&w)[NB], int quad, int chain) {
      const int c = chain % CH;
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        const __m512i xm = _mm512_set1_epi32(xq[m][g * 8 + quad]);
        PACE_UNROLL for (int j = 0; j < NB; ++j)
          isum[c][j][m] = dpbusd_nibbles(isum[c][j][m], w[j], xm);
      }
    };
    // line v: quad 2v in the low nibbles, 2v + 1 in the high ones
    PACE_UNROLL for (int v = 0; v < 4; ++v) {
      __m512i raw[NB], w[NB];
      PACE_UNROLL for (int j = 0; j < NB; ++j) {
        raw[j] = _mm512_loadu_si512(codes[j] + 64 * v);
        w[j] = _mm512_and_si512(raw[j], low);
      }
      dot4(w, 2 * v, 2 * v);
      PACE_UNROLL for (int j = 0; j < NB; ++j)
        w[j] = _mm512_and_si512(_mm512_srli_epi16(raw[j], 4), low);
      dot4(w, 2 * v + 1, 2 * v + 1);
    }
    PACE_UNROLL for (int j = 0; j < NB; ++j) {
      const uint8_t* sc = (const uint8_t*)(tables[j] + 32) + 16 * i;
      const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)sc));
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        __m512i sum = widen_nibble_sums(isum[0][j][m]);
        PACE_UNROLL for (int c = 1; c < CH; ++c)
          sum = _mm512_add_epi32(sum, widen_nibble_sums(isum[c][j][m]));
        acc[j][m] = _mm512_add_epi32(acc[j][m], _mm512_mullo_epi32(sum, s));
      }
    }
  };
  // the super-block's flush: the min term on int16 pairs, then the two FMAs
  const auto flush = [&](int64_t g0, const uint16_t* const (&tables)[NB],
                         const __m512i (&acc)[NB][MT], __m512 (&out)[NB][MT])
                         __attribute__((always_inline)) {
    PACE_UNROLL for (int j = 0; j < NB; ++j) {
      const uint8_t* mins = (const uint8_t*)(tables[j] + 32) + 128;
      __m512i pairs[4];
      PACE_UNROLL for (int p = 0; p < 4; ++p) pairs[p] = q4k_min_pairs(mins, p);
      const __m512 d = fp16x16(tables[j]);
      const __m512 neg_dmin = _mm512_sub_ps(_mm512_setzero_ps(), fp16x16(tables[j] + 16));
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        const int32_t* csum = x.pair_sums.data() + ((m0 + m) * G + g0) / 2;
        __m512i msum = _mm512_setzero_si512();
        PACE_UNROLL for (int p = 0; p < 4; ++p)
          msum = _mm512_dpwssd_epi32(msum, pairs[p], _mm512_set1_epi32(csum[p]));
        const __m512 xs = _mm512_set1_ps(x.scales[(m0 + m) * G + g0]);
        out[j][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[j][m]), _mm512_mul_ps(d, xs), out[j][m]);
        out[j][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(neg_dmin, xs), out[j][m]);
      }
    }
  };
  super_block_runs<KIND_Q4K, MT, NB>(block, G, x, K, m0, total, group, flush);
}

}  // namespace pace_avx512

PACE_VNNI_END
