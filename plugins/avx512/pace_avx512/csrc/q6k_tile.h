// GGUF q6_k (KIND_Q6) against int8 activations quantized per super-block of 256 (qrows.h,
// span 256, as q4k_tile.h), integer inside a super-block. Per block of 16 weight rows,
// activation row and super-block, with u = q + 32 the 6-bit codes (q6_quad merges them to
// bytes), xq the activation codes, sc the int8 scales of the 16 sub-blocks of 16 k:
//   isum_i = sum u xq over sub-block i's 16 k            4 vpdpbusd (isa.h dpbusd_small_codes)
//   acc    = sum_i sc_i isum_i                           vpmulld, vpaddd per sub-block
//   msum   = sum_i sc_i csum_i (csum_i: the row's code sum over sub-block i)
//                                                        8 vpdpwssd on int16 pairs (i, i + 1)
//   total  = fma(float(acc - 32 msum), d xs, total)      acc - 32 msum = sum_i sc_i sum q xq
// exact in int32 (|acc| <= 16 * 128 * 63 * 127 * 16 < 2^28, |32 msum| <= 32 * 16 * 128 * 2032
// < 2^28): one FMA per 256 k where the per-16 tiles took one per 16, with the offset's integer
// add, the conversion and the scale product each time. Each output takes the same operations
// at any MT x NB, so the decode GEMV (MT = 1) is a tile.
#pragma once

#include "isa.h"

#include <cstdint>

#include "kernels.h"
#include "ksuper_tile.h"
#include "qblock.h"
#include "qrows.h"
#include "simd.h"

PACE_VNNI_BEGIN

#define PACE_UNROLL _Pragma("GCC unroll 16")

namespace pace_avx512 {

// The sc bytes of sub-blocks 2p and 2p + 1 ([16] each) interleaved per row as int16 pairs.
__attribute__((always_inline)) inline __m512i q6k_scale_pairs(const uint16_t* tables, int p) {
  const __m128i a = _mm_loadu_si128((const __m128i*)q6_sub_scales(tables, 2 * p));
  const __m128i b = _mm_loadu_si128((const __m128i*)q6_sub_scales(tables, 2 * p + 1));
  return _mm512_cvtepi8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b)));
}

// total[j][m]: the 16 rows of row block `block[j]` (NB blocks side by side) against the int8
// activation rows [m0, m0 + MT) of `x` (quantized per 256), K = 32 G.
template <int MT, int NB>
inline void q6k_tile(const uint8_t* const (&block)[NB], int64_t G, const QuantizedRows& x,
                     int64_t K, int64_t m0, __m512 (&total)[NB][MT]) {
  // a group's two sub-blocks of 16 k: acc += sc * (sum u xq)
  const auto group = [&](const int32_t* const (&xq)[MT], int64_t g, int i,
                         const uint8_t* const (&codes)[NB], const uint16_t* const (&tables)[NB],
                         __m512i (&acc)[NB][MT]) __attribute__((always_inline)) {
    PACE_UNROLL for (int half = 0; half < 2; ++half) {  // sub-block 2i + half: quads 4 half..
      __m512i isum[NB][MT];
      PACE_UNROLL for (int j = 0; j < NB; ++j) PACE_UNROLL for (int m = 0; m < MT; ++m)
        isum[j][m] = _mm512_setzero_si512();
      PACE_UNROLL for (int q = 4 * half; q < 4 * half + 4; ++q) {
        __m512i w[NB];
        PACE_UNROLL for (int j = 0; j < NB; ++j) w[j] = quad_codes<KIND_Q6>(codes[j], q);
        PACE_UNROLL for (int m = 0; m < MT; ++m) {
          const __m512i xm = _mm512_set1_epi32(xq[m][g * 8 + q]);
          PACE_UNROLL for (int j = 0; j < NB; ++j)
            isum[j][m] = dpbusd_small_codes(isum[j][m], w[j], xm);
        }
      }
      PACE_UNROLL for (int j = 0; j < NB; ++j) {
        const __m512i s = _mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i*)q6_sub_scales(tables[j], 2 * i + half)));
        PACE_UNROLL for (int m = 0; m < MT; ++m)
          acc[j][m] = _mm512_add_epi32(acc[j][m], _mm512_mullo_epi32(isum[j][m], s));
      }
    }
  };
  // the super-block's flush: the offset term on int16 pairs, then one FMA
  const auto flush = [&](int64_t g0, const uint16_t* const (&tables)[NB],
                         const __m512i (&acc)[NB][MT], __m512 (&out)[NB][MT])
                         __attribute__((always_inline)) {
    PACE_UNROLL for (int j = 0; j < NB; ++j) {
      const __m512 d = fp16x16(tables[j]);
      __m512i msum[MT];
      PACE_UNROLL for (int m = 0; m < MT; ++m) msum[m] = _mm512_setzero_si512();
      PACE_UNROLL for (int p = 0; p < 8; ++p) {
        const __m512i pairs = q6k_scale_pairs(tables[j], p);
        PACE_UNROLL for (int m = 0; m < MT; ++m) {
          const __m512i csum = _mm512_set1_epi32(x.half_pairs[(m0 + m) * G + g0 + p]);
          msum[m] = _mm512_dpwssd_epi32(msum[m], pairs, csum);
        }
      }
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        const __m512i sum = _mm512_sub_epi32(acc[j][m], _mm512_slli_epi32(msum[m], 5));
        const __m512 xs = _mm512_set1_ps(x.scales[(m0 + m) * G + g0]);
        out[j][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, xs), out[j][m]);
      }
    }
  };
  super_block_runs<KIND_Q6, MT, NB>(block, G, x, K, m0, total, group, flush);
}

}  // namespace pace_avx512

PACE_VNNI_END
