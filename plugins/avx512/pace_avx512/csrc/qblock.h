// Reading a packed quantized row block (layout: qlinear.cpp, kernels.h): a group's codes as
// unsigned bytes per k-quad (quad_codes) and a 4-bit kind's scales and mins in fp32 (QScales),
// shared by the VNNI kernels (qlinear.cpp), the bf16 panels (qpanel.cpp) and the row lookup.
#pragma once

#include "isa.h"

#include <cstdint>

#include "kernels.h"
#include "simd.h"

namespace pace_avx512 {

// KIND_Q6 codes of a group: per sub-block of 16 k (quads 4s..4s + 3: one scale), its high
// line s, then nibble lines 2s and 2s + 1 (line v: quad 2v in the low nibbles, 2v + 1 in the
// high ones, as the 4-bit kinds), 192 bytes, the two sub-blocks one after the other: the high
// 2 bits of quad q are bits 2 (q % 4), 2 (q % 4) + 1 of the same byte (4j + e: row j,
// k = 4q + e) of high line q / 4. The kernels read a group's lines in ascending order: with
// the high lines after all 4 nibble lines, each sub-block read line 2s, then 4 + s, then 2s +
// 1, and Zen 4's prefetchers followed it badly (decode GEMV, one core: 17.5-19.5 GB/s against
// 26-31 in this order; CHANGELOG). q6_quad(q, nibble line q / 2, high line q / 4): quad q's
// codes u (0..63), one per byte: a shift (odd quads) for the nibble, a shift and an AND for
// the high bits (then at bits 4-5, 16 times their value), one ternary-logic merge.
constexpr int64_t q6_high_line(int h) { return 192 * h; }        // byte offset in the group
constexpr int64_t q6_nibble_line(int v) { return 64 * (v + v / 2 + 1); }
__attribute__((always_inline)) inline __m512i q6_quad(int q, __m512i nib, __m512i high) {
  const int i = q % 4;  // bits 2i, 2i + 1 of the high line, to bits 4, 5
  __m512i h = i == 0 ? _mm512_slli_epi16(high, 4) : i == 1 ? _mm512_slli_epi16(high, 2)
            : i == 2 ? high : _mm512_srli_epi16(high, 2);
  h = _mm512_and_si512(h, _mm512_set1_epi8(0x30));
  const __m512i n = q % 2 ? _mm512_srli_epi16(nib, 4) : nib;
  // (n & 0x0F) | h: ternary logic over (a = n, b = h, c = 0x0F): (a & c) | b
  return _mm512_ternarylogic_epi32(n, h, _mm512_set1_epi8(0x0F), 0xEC);
}
// Kinds with one byte code per weight in the kernels (int8 as stored, KIND_Q6 once merged).
constexpr bool is_byte_coded(int kind) { return is_int8(kind) || kind == KIND_Q6; }
// Quad q (0..7) of a group's codes (`codes`: qgroup_codes) of a byte-coded kind, unsigned.
template <int KIND>
__attribute__((always_inline)) inline __m512i quad_codes(const uint8_t* codes, int q) {
  if constexpr (KIND == KIND_Q6)
    return q6_quad(q, _mm512_loadu_si512(codes + q6_nibble_line(q / 2)),
                   _mm512_loadu_si512(codes + q6_high_line(q / 4)));
  else
    return _mm512_loadu_si512(codes + 64 * q);
}

// KIND_Q6's int8 scales of sub-block `sub` (0..15, 16 k each) of a run (`tables`: its
// qgroup_tables), one per row.
__attribute__((always_inline)) inline const int8_t* q6_sub_scales(const uint16_t* tables, int sub) {
  return (const int8_t*)(tables + 16) + 16 * sub;
}
// A byte-coded kind's scale per row of a block (16 fp32 lanes) over scale span `sub` of group
// g (`tables`: qgroup_tables of group g): the fp16 scales as stored; KIND_Q6's d sc, its run's
// fp16 d times the int8 sub-block scale (exact in fp32: GGUF's own de-quantization).
template <int KIND>
__attribute__((always_inline)) inline __m512 span_scale(const uint16_t* tables, int64_t g, int sub) {
  if constexpr (KIND == KIND_Q6) {
    const __m128i sc = _mm_loadu_si128((const __m128i*)q6_sub_scales(tables, 2 * (g % 8) + sub));
    return _mm512_mul_ps(fp16x16(tables), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
  } else {
    return fp16x16(tables + 16 * sub);
  }
}

// 16 bytes (one per row) as fp32: one load, vpmovzxbd, vcvtdq2ps.
__attribute__((always_inline)) inline __m512 bytes16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)));
}

// A 4-bit kind's scale and min per row of a block (16 fp32 lanes), group after group from
// the first (`tables`: qgroup_tables of group g). fp16 tables as stored (the min -8 s for
// KIND_INT4_SYM); KIND_Q4K converts its run's d and dmin as the run starts, then per group
// d sc[g] and -dmin m[g] from the run's bytes: GGUF's own de-quantization, in fp32.
template <int KIND>
struct QScales {
  __m512 d = _mm512_setzero_ps(), neg_dmin = _mm512_setzero_ps();  // KIND_Q4K: the run's
  __m512 scale, min;                                                // group g's

  __attribute__((always_inline)) inline void group(const uint16_t* tables, int64_t g) {
    if constexpr (KIND == KIND_Q4K) {
      if (g % 8 == 0) {
        d = fp16x16(tables);
        neg_dmin = _mm512_sub_ps(_mm512_setzero_ps(), fp16x16(tables + 16));
      }
      const uint8_t* sc = (const uint8_t*)(tables + 32) + 16 * (g % 8);  // m: 128 bytes on
      scale = _mm512_mul_ps(d, bytes16(sc));
      min = _mm512_mul_ps(neg_dmin, bytes16(sc + 128));
    } else {
      scale = fp16x16(tables);
      min = KIND == KIND_INT4_SYM ? _mm512_mul_ps(scale, _mm512_set1_ps(-8.0f))
                                  : fp16x16(tables + 16);
    }
  }
};

}  // namespace pace_avx512
