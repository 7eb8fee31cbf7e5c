// The AVX-512 intrinsics the kernels use, on CPUs with AVX2 + FMA + F16C only (Zen 2/3, Intel
// Haswell to Alder Lake client parts): a 512-bit register is a pair of 256-bit ones, a mask
// register a plain integer. Included by isa.h for the `avx2` build target, never directly.
//
// Each intrinsic keeps its AVX-512 meaning (lane order, rounding, saturation), so the kernels
// compute the same numbers; only their speed differs. vpdpbusd comes only in isa.h's dpbusd_*
// forms, each exact for the operands its name states. Masked
// loads and stores never touch memory outside the mask (vmaskmov for 32-bit lanes, a prefix
// copy or a per-lane loop for bytes and words), as AVX-512's do.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace pace_avx2 {

struct m512 {
  __m256 lo, hi;
};
struct m512i {
  __m256i lo, hi;
};

using mask16 = __mmask16;
using mask32 = __mmask32;
using mask64 = __mmask64;

#define PACE_E static inline __attribute__((always_inline))

// ---- masks -------------------------------------------------------------------------------
// Lanes of 8 x 32 bits, all ones where bit i of k is set.
PACE_E __m256i lanes8(unsigned k) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)(k & 0xFF)), bit), bit);
}
PACE_E bool is_prefix(uint64_t k) { return (k & (k + 1)) == 0; }  // lanes [0, n) only

// Bytes of `n` elements of `size` bytes selected by k, into a zeroed `out` (no read outside).
PACE_E void masked_copy(void* out, const void* p, uint64_t k, int lanes, int size) {
  std::memset(out, 0, (size_t)lanes * size);
  if (is_prefix(k)) {
    std::memcpy(out, p, (size_t)__builtin_popcountll(k) * size);
    return;
  }
  for (int i = 0; i < lanes; ++i)
    if ((k >> i) & 1) std::memcpy((char*)out + i * size, (const char*)p + i * size, size);
}
PACE_E void masked_store(void* p, const void* in, uint64_t k, int lanes, int size) {
  if (is_prefix(k)) {
    std::memcpy(p, in, (size_t)__builtin_popcountll(k) * size);
    return;
  }
  for (int i = 0; i < lanes; ++i)
    if ((k >> i) & 1) std::memcpy((char*)p + i * size, (const char*)in + i * size, size);
}

// ---- fp32 ----------------------------------------------------------------------------------
#define PACE_PS2(name, op) \
  PACE_E m512 name(m512 a, m512 b) { return {op(a.lo, b.lo), op(a.hi, b.hi)}; }
#define PACE_PS3(name, op) \
  PACE_E m512 name(m512 a, m512 b, m512 c) { return {op(a.lo, b.lo, c.lo), op(a.hi, b.hi, c.hi)}; }
PACE_PS2(add_ps, _mm256_add_ps)
PACE_PS2(sub_ps, _mm256_sub_ps)
PACE_PS2(mul_ps, _mm256_mul_ps)
PACE_PS2(div_ps, _mm256_div_ps)
PACE_PS2(max_ps, _mm256_max_ps)
PACE_PS2(min_ps, _mm256_min_ps)
PACE_PS2(unpackhi_ps, _mm256_unpackhi_ps)
PACE_PS2(unpacklo_ps, _mm256_unpacklo_ps)
PACE_PS3(fmadd_ps, _mm256_fmadd_ps)
PACE_PS3(fmsub_ps, _mm256_fmsub_ps)
PACE_PS3(fnmadd_ps, _mm256_fnmadd_ps)
PACE_PS3(fmaddsub_ps, _mm256_fmaddsub_ps)

PACE_E m512 set1_ps(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
PACE_E m512 setzero_ps() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
PACE_E m512 abs_ps(m512 a) {
  const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return {_mm256_and_ps(a.lo, m), _mm256_and_ps(a.hi, m)};
}
PACE_E m512 loadu_ps(const void* p) {
  return {_mm256_loadu_ps((const float*)p), _mm256_loadu_ps((const float*)p + 8)};
}
PACE_E m512 load_ps(const void* p) {
  return {_mm256_load_ps((const float*)p), _mm256_load_ps((const float*)p + 8)};
}
PACE_E void storeu_ps(void* p, m512 v) {
  _mm256_storeu_ps((float*)p, v.lo);
  _mm256_storeu_ps((float*)p + 8, v.hi);
}
PACE_E void store_ps(void* p, m512 v) {
  _mm256_store_ps((float*)p, v.lo);
  _mm256_store_ps((float*)p + 8, v.hi);
}
PACE_E m512 maskz_loadu_ps(mask16 k, const void* p) {
  if (k == 0xFFFF) return loadu_ps(p);
  const float* f = (const float*)p;
  return {_mm256_maskload_ps(f, lanes8(k)), _mm256_maskload_ps(f + 8, lanes8(k >> 8))};
}
PACE_E m512 mask_mov_ps(m512 src, mask16 k, m512 a) {
  return {_mm256_blendv_ps(src.lo, a.lo, _mm256_castsi256_ps(lanes8(k))),
          _mm256_blendv_ps(src.hi, a.hi, _mm256_castsi256_ps(lanes8(k >> 8)))};
}
PACE_E m512 maskz_mov_ps(mask16 k, m512 a) {
  return {_mm256_and_ps(a.lo, _mm256_castsi256_ps(lanes8(k))),
          _mm256_and_ps(a.hi, _mm256_castsi256_ps(lanes8(k >> 8)))};
}
PACE_E m512 mask_loadu_ps(m512 src, mask16 k, const void* p) {
  return mask_mov_ps(src, k, maskz_loadu_ps(k, p));
}
PACE_E m512 maskz_sub_ps(mask16 k, m512 a, m512 b) { return maskz_mov_ps(k, sub_ps(a, b)); }
PACE_E void mask_storeu_ps(void* p, mask16 k, m512 v) {
  if (k == 0xFFFF) return storeu_ps(p, v);
  _mm256_maskstore_ps((float*)p, lanes8(k), v.lo);
  _mm256_maskstore_ps((float*)p + 8, lanes8(k >> 8), v.hi);
}
template <int imm>
PACE_E mask16 cmp_ps_mask(m512 a, m512 b) {
  const int lo = _mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, imm));
  const int hi = _mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, imm));
  return (mask16)(lo | (hi << 8));
}
template <int imm>
PACE_E m512 permute_ps(m512 a) {
  return {_mm256_permute_ps(a.lo, imm), _mm256_permute_ps(a.hi, imm)};
}
template <int imm>
PACE_E m512 shuffle_ps(m512 a, m512 b) {
  return {_mm256_shuffle_ps(a.lo, b.lo, imm), _mm256_shuffle_ps(a.hi, b.hi, imm)};
}
// 128-bit lanes: result lanes 0, 1 from a, 2, 3 from b, each picked by two bits of imm.
template <int imm>
PACE_E m512 shuffle_f32x4(m512 a, m512 b) {
  return {_mm256_permute2f128_ps(a.lo, a.hi, (imm & 3) | (((imm >> 2) & 3) << 4)),
          _mm256_permute2f128_ps(b.lo, b.hi, ((imm >> 4) & 3) | (((imm >> 6) & 3) << 4))};
}
template <int imm>
PACE_E m512 roundscale_ps(m512 a) {
  static_assert((imm >> 4) == 0, "roundscale with a scale is not emulated");
  return {_mm256_round_ps(a.lo, imm & 0xF), _mm256_round_ps(a.hi, imm & 0xF)};
}
// a * 2^floor(b) (as vscalefps for the finite b the kernels pass): two exact power-of-two steps.
PACE_E __m256 scalef8(__m256 a, __m256 b) {
  __m256i n = _mm256_cvttps_epi32(_mm256_floor_ps(b));
  n = _mm256_min_epi32(_mm256_max_epi32(n, _mm256_set1_epi32(-252)), _mm256_set1_epi32(254));
  const __m256i n1 = _mm256_srai_epi32(n, 1), n2 = _mm256_sub_epi32(n, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(a, p1), p2);
}
PACE_PS2(scalef_ps, scalef8)
// Lane i of the result is lane idx[i] (5 bits) of the 32 lanes a ++ b.
PACE_E __m256 pick8(m512 a, m512 b, __m256i i) {
  const __m256 from_a = _mm256_blendv_ps(_mm256_permutevar8x32_ps(a.lo, i),
                                         _mm256_permutevar8x32_ps(a.hi, i),
                                         _mm256_castsi256_ps(_mm256_slli_epi32(i, 28)));
  const __m256 from_b = _mm256_blendv_ps(_mm256_permutevar8x32_ps(b.lo, i),
                                         _mm256_permutevar8x32_ps(b.hi, i),
                                         _mm256_castsi256_ps(_mm256_slli_epi32(i, 28)));
  return _mm256_blendv_ps(from_a, from_b, _mm256_castsi256_ps(_mm256_slli_epi32(i, 27)));
}
PACE_E m512 permutex2var_ps(m512 a, m512i idx, m512 b) {
  return {pick8(a, b, idx.lo), pick8(a, b, idx.hi)};
}
PACE_E float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
PACE_E float reduce_add_ps(m512 a) { return hsum8(_mm256_add_ps(a.lo, a.hi)); }
PACE_E float reduce_max_ps(m512 a) {
  const __m256 m = _mm256_max_ps(a.lo, a.hi);
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

// ---- integers ------------------------------------------------------------------------------
#define PACE_EPI2(name, op) \
  PACE_E m512i name(m512i a, m512i b) { return {op(a.lo, b.lo), op(a.hi, b.hi)}; }
PACE_EPI2(add_epi32, _mm256_add_epi32)
PACE_EPI2(sub_epi32, _mm256_sub_epi32)
PACE_EPI2(add_epi64, _mm256_add_epi64)
PACE_EPI2(mullo_epi32, _mm256_mullo_epi32)
PACE_EPI2(max_epi32, _mm256_max_epi32)
PACE_EPI2(min_epi32, _mm256_min_epi32)
PACE_EPI2(and_si512, _mm256_and_si256)
PACE_EPI2(or_si512, _mm256_or_si256)
PACE_EPI2(xor_si512, _mm256_xor_si256)
#define PACE_SHIFT(name, op) \
  PACE_E m512i name(m512i a, unsigned n) { return {op(a.lo, (int)n), op(a.hi, (int)n)}; }
PACE_SHIFT(slli_epi16, _mm256_slli_epi16)
PACE_SHIFT(slli_epi32, _mm256_slli_epi32)
PACE_SHIFT(srli_epi16, _mm256_srli_epi16)
PACE_SHIFT(srli_epi32, _mm256_srli_epi32)
PACE_SHIFT(srai_epi32, _mm256_srai_epi32)

PACE_E m512i set1_epi32(int x) { return {_mm256_set1_epi32(x), _mm256_set1_epi32(x)}; }
PACE_E m512i set1_epi8(char x) { return {_mm256_set1_epi8(x), _mm256_set1_epi8(x)}; }
PACE_E m512i setzero_si512() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
PACE_E m512i setr_epi32(int a0, int a1, int a2, int a3, int a4, int a5, int a6, int a7, int a8,
                        int a9, int a10, int a11, int a12, int a13, int a14, int a15) {
  return {_mm256_setr_epi32(a0, a1, a2, a3, a4, a5, a6, a7),
          _mm256_setr_epi32(a8, a9, a10, a11, a12, a13, a14, a15)};
}
PACE_E m512i loadu_si512(const void* p) {
  return {_mm256_loadu_si256((const __m256i*)p), _mm256_loadu_si256((const __m256i*)p + 1)};
}
PACE_E m512i load_si512(const void* p) {
  return {_mm256_load_si256((const __m256i*)p), _mm256_load_si256((const __m256i*)p + 1)};
}
PACE_E void storeu_si512(void* p, m512i v) {
  _mm256_storeu_si256((__m256i*)p, v.lo);
  _mm256_storeu_si256((__m256i*)p + 1, v.hi);
}
PACE_E m512i castps_si512(m512 a) { return {_mm256_castps_si256(a.lo), _mm256_castps_si256(a.hi)}; }
PACE_E m512 castsi512_ps(m512i a) { return {_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
PACE_E m512 cvtepi32_ps(m512i a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
PACE_E m512i cvtps_epi32(m512 a) { return {_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi)}; }
PACE_E m512i mask_mov_epi32(m512i src, mask16 k, m512i a) {
  return {_mm256_blendv_epi8(src.lo, a.lo, lanes8(k)), _mm256_blendv_epi8(src.hi, a.hi, lanes8(k >> 8))};
}
PACE_E m512 cvtph_ps(__m256i h) {
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
}
PACE_E m512i cvtepi8_epi32(__m128i x) {
  return {_mm256_cvtepi8_epi32(x), _mm256_cvtepi8_epi32(_mm_srli_si128(x, 8))};
}
PACE_E m512i cvtepu8_epi32(__m128i x) {
  return {_mm256_cvtepu8_epi32(x), _mm256_cvtepu8_epi32(_mm_srli_si128(x, 8))};
}
PACE_E m512i cvtepu16_epi32(__m256i x) {
  return {_mm256_cvtepu16_epi32(_mm256_castsi256_si128(x)),
          _mm256_cvtepu16_epi32(_mm256_extracti128_si256(x, 1))};
}
PACE_E m512i cvtepu8_epi16(__m256i x) {
  return {_mm256_cvtepu8_epi16(_mm256_castsi256_si128(x)),
          _mm256_cvtepu8_epi16(_mm256_extracti128_si256(x, 1))};
}
PACE_E m512i cvtepi8_epi16(__m256i x) {
  return {_mm256_cvtepi8_epi16(_mm256_castsi256_si128(x)),
          _mm256_cvtepi8_epi16(_mm256_extracti128_si256(x, 1))};
}
// Truncating narrowings (vpmovdw, vpmovdb): the low 16 / 8 bits of each 32-bit lane.
PACE_E __m128i low_words8(__m256i x) {
  const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(x, pick), 0x08));
}
PACE_E __m256i cvtepi32_epi16(m512i a) { return _mm256_set_m128i(low_words8(a.hi), low_words8(a.lo)); }
PACE_E __m128i low_bytes8(__m256i x) {
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i b = _mm256_shuffle_epi8(x, pick);
  return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1)));
}
PACE_E __m128i cvtepi32_epi8(m512i a) { return _mm_unpacklo_epi64(low_bytes8(a.lo), low_bytes8(a.hi)); }
// Signed saturation to int8 (vpmovsdb): through int16 saturation, which clamps the same.
PACE_E __m128i sat_bytes8(__m256i x) {
  const __m256i w = _mm256_packs_epi32(x, x);  // lane 0: x0..x3 twice, lane 1: x4..x7 twice
  const __m256i b = _mm256_packs_epi16(w, w);
  return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1)));
}
PACE_E __m128i cvtsepi32_epi8(m512i a) { return _mm_unpacklo_epi64(sat_bytes8(a.lo), sat_bytes8(a.hi)); }
PACE_E void mask_cvtepi32_storeu_epi8(void* p, mask16 k, m512i a) {
  const __m128i b = cvtepi32_epi8(a);
  if (k == 0xFFFF) return _mm_storeu_si128((__m128i*)p, b);
  masked_store(p, &b, k, 16, 1);
}
template <int imm>
PACE_E __m256i ternary8(__m256i a, __m256i b, __m256i c) {
  const __m256i ones = _mm256_set1_epi32(-1);
  __m256i r = _mm256_setzero_si256();
  for (int i = 0; i < 8; ++i)
    if ((imm >> i) & 1) {
      const __m256i x = (i & 4) ? a : _mm256_xor_si256(a, ones);
      const __m256i y = (i & 2) ? b : _mm256_xor_si256(b, ones);
      const __m256i z = (i & 1) ? c : _mm256_xor_si256(c, ones);
      r = _mm256_or_si256(r, _mm256_and_si256(x, _mm256_and_si256(y, z)));
    }
  return r;
}
template <int imm>
PACE_E m512i ternarylogic_epi32(m512i a, m512i b, m512i c) {
  return {ternary8<imm>(a.lo, b.lo, c.lo), ternary8<imm>(a.hi, b.hi, c.hi)};
}
PACE_E uint32_t nonzero_bytes(__m256i x) {
  return ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(x, _mm256_setzero_si256()));
}
PACE_E mask64 test_epi8_mask(m512i a, m512i b) {
  return (mask64)nonzero_bytes(_mm256_and_si256(a.lo, b.lo)) |
         ((mask64)nonzero_bytes(_mm256_and_si256(a.hi, b.hi)) << 32);
}
PACE_E mask16 test_epi8_mask128(__m128i a, __m128i b) {
  const __m128i z = _mm_cmpeq_epi8(_mm_and_si128(a, b), _mm_setzero_si128());
  return (mask16)~_mm_movemask_epi8(z);
}
PACE_E int reduce_add_epi32(m512i a) {
  __m256i s = _mm256_add_epi32(a.lo, a.hi);
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  return _mm_cvtsi128_si32(t);
}
PACE_E long long reduce_or_epi64(m512i a) {
  const __m256i s = _mm256_or_si256(a.lo, a.hi);
  const __m128i t = _mm_or_si128(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  return _mm_cvtsi128_si64(_mm_or_si128(t, _mm_unpackhi_epi64(t, t)));
}
// vpdpbusd (each 32-bit lane + the four products of unsigned bytes of a and signed bytes of
// b) in the forms isa.h names, each exact for what the kernel knows of its operands:
// vpmaddubsw's int16 pair sums cannot saturate when 2 |a| |b| < 2^15.
// a in [0, 63] (2 x 63 x 128 < 2^15): 3 instructions per 256 bits.
PACE_E m512i dpbusd_small_codes(m512i src, m512i a, m512i b) {
  const __m256i one = _mm256_set1_epi16(1);
  return {_mm256_add_epi32(src.lo, _mm256_madd_epi16(_mm256_maddubs_epi16(a.lo, b.lo), one)),
          _mm256_add_epi32(src.hi, _mm256_madd_epi16(_mm256_maddubs_epi16(a.hi, b.hi), one))};
}
// Nibble accumulators: int16 pair sums, |each| <= 2 x 15 x 128 = 3840, so 8 of them fit in
// int16; widened (vpmaddwd by 1, or by 16 for high nibbles used in place) when read. 2
// instructions per 256 bits, 3 for a high nibble (shifted down first).
PACE_E m512i dpbusd_nibbles(m512i acc, m512i a, m512i b) {
  return {_mm256_add_epi16(acc.lo, _mm256_maddubs_epi16(a.lo, b.lo)),
          _mm256_add_epi16(acc.hi, _mm256_maddubs_epi16(a.hi, b.hi))};
}
// a = 16 n has no low bits, so a 16-bit shift by 4 moves nothing across its bytes.
PACE_E m512i dpbusd_high_nibbles(m512i acc, m512i a, m512i b) {
  return dpbusd_nibbles(acc, {_mm256_srli_epi16(a.lo, 4), _mm256_srli_epi16(a.hi, 4)}, b);
}
PACE_E m512i widen_pairs(m512i acc, int16_t times) {
  const __m256i t = _mm256_set1_epi16(times);
  return {_mm256_madd_epi16(acc.lo, t), _mm256_madd_epi16(acc.hi, t)};
}
PACE_E m512i widen_nibble_sums(m512i acc) { return widen_pairs(acc, 1); }
PACE_E m512i widen_high_nibble_sums(m512i acc) { return widen_pairs(acc, 16); }
// a = q + 128 against b in [-127, 127]: sum q b (OFFSET_BYTES_BIAS = 128) as |q| times b
// signed by q (vpsignb; b != -128, so negating it is exact), 2 x 128 x 127 < 2^15: 6
// instructions per 256 bits, where any unsigned a takes 9 (even and odd bytes widened).
PACE_E __m256i dp_offset8(__m256i src, __m256i a, __m256i b) {
  const __m256i q = _mm256_xor_si256(a, _mm256_set1_epi8((char)0x80));
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(b, q));
  return _mm256_add_epi32(src, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
PACE_E m512i dpbusd_offset_bytes(m512i src, m512i a, m512i b) {
  return {dp_offset8(src.lo, a.lo, b.lo), dp_offset8(src.hi, a.hi, b.hi)};
}
PACE_E m512i dpwssd_epi32(m512i src, m512i a, m512i b) {
  return {_mm256_add_epi32(src.lo, _mm256_madd_epi16(a.lo, b.lo)),
          _mm256_add_epi32(src.hi, _mm256_madd_epi16(a.hi, b.hi))};
}
PACE_E m512i permutexvar_epi16(m512i idx, m512i a) {
  alignas(64) uint16_t in[32], ix[32], out[32];
  storeu_si512(in, a);
  storeu_si512(ix, idx);
  for (int i = 0; i < 32; ++i) out[i] = in[ix[i] & 31];
  return loadu_si512(out);
}

// ---- masked byte and word loads and stores -------------------------------------------------
PACE_E m512i maskz_loadu_epi8(mask64 k, const void* p) {
  if (k == ~(mask64)0) return loadu_si512(p);
  alignas(64) uint8_t buf[64];
  masked_copy(buf, p, k, 64, 1);
  return load_si512(buf);
}
PACE_E m512i maskz_loadu_epi16(mask32 k, const void* p) {
  if (k == ~(mask32)0) return loadu_si512(p);
  alignas(64) uint16_t buf[32];
  masked_copy(buf, p, k, 32, 2);
  return load_si512(buf);
}
PACE_E __m256i maskz_loadu_epi16_256(mask16 k, const void* p) {
  if (k == 0xFFFF) return _mm256_loadu_si256((const __m256i*)p);
  alignas(32) uint16_t buf[16];
  masked_copy(buf, p, k, 16, 2);
  return _mm256_load_si256((const __m256i*)buf);
}
PACE_E void mask_storeu_epi16_256(void* p, mask16 k, __m256i v) {
  if (k == 0xFFFF) return _mm256_storeu_si256((__m256i*)p, v);
  alignas(32) uint16_t buf[16];
  _mm256_store_si256((__m256i*)buf, v);
  masked_store(p, buf, k, 16, 2);
}
PACE_E __m128i maskz_loadu_epi8_128(mask16 k, const void* p) {
  if (k == 0xFFFF) return _mm_loadu_si128((const __m128i*)p);
  alignas(16) uint8_t buf[16];
  masked_copy(buf, p, k, 16, 1);
  return _mm_load_si128((const __m128i*)buf);
}

}  // namespace pace_avx2

namespace pace_avx512 {
constexpr int OFFSET_BYTES_BIAS = 128;  // dpbusd_offset_bytes sums q b, not (q + 128) b
// As isa.h's native ones: keep a load the compiler would drop, emitting nothing.
static inline void opaque(pace_avx2::m512i& v) { asm volatile("" : "+x"(v.lo), "+x"(v.hi)); }
static inline void consume(const pace_avx2::m512i& v) { asm volatile("" : : "x"(v.lo), "x"(v.hi)); }
}  // namespace pace_avx512

// The kernels' names for the types and intrinsics, mapped onto the pairs above.
#define __m512 pace_avx2::m512
#define __m512i pace_avx2::m512i
#define _mm512_add_ps pace_avx2::add_ps
#define _mm512_sub_ps pace_avx2::sub_ps
#define _mm512_mul_ps pace_avx2::mul_ps
#define _mm512_div_ps pace_avx2::div_ps
#define _mm512_max_ps pace_avx2::max_ps
#define _mm512_min_ps pace_avx2::min_ps
#define _mm512_abs_ps pace_avx2::abs_ps
#define _mm512_unpackhi_ps pace_avx2::unpackhi_ps
#define _mm512_unpacklo_ps pace_avx2::unpacklo_ps
#define _mm512_fmadd_ps pace_avx2::fmadd_ps
#define _mm512_fmsub_ps pace_avx2::fmsub_ps
#define _mm512_fnmadd_ps pace_avx2::fnmadd_ps
#define _mm512_fmaddsub_ps pace_avx2::fmaddsub_ps
#define _mm512_set1_ps pace_avx2::set1_ps
#define _mm512_setzero_ps pace_avx2::setzero_ps
#define _mm512_loadu_ps pace_avx2::loadu_ps
#define _mm512_load_ps pace_avx2::load_ps
#define _mm512_storeu_ps pace_avx2::storeu_ps
#define _mm512_store_ps pace_avx2::store_ps
#define _mm512_maskz_loadu_ps pace_avx2::maskz_loadu_ps
#define _mm512_mask_loadu_ps pace_avx2::mask_loadu_ps
#define _mm512_mask_storeu_ps pace_avx2::mask_storeu_ps
#define _mm512_mask_mov_ps pace_avx2::mask_mov_ps
#define _mm512_maskz_mov_ps pace_avx2::maskz_mov_ps
#define _mm512_maskz_sub_ps pace_avx2::maskz_sub_ps
#define _mm512_cmp_ps_mask(a, b, imm) pace_avx2::cmp_ps_mask<(imm)>(a, b)
#define _mm512_permute_ps(a, imm) pace_avx2::permute_ps<(imm)>(a)
#define _mm512_shuffle_ps(a, b, imm) pace_avx2::shuffle_ps<(imm)>(a, b)
#define _mm512_shuffle_f32x4(a, b, imm) pace_avx2::shuffle_f32x4<(imm)>(a, b)
#define _mm512_roundscale_ps(a, imm) pace_avx2::roundscale_ps<(imm)>(a)
#define _mm512_scalef_ps pace_avx2::scalef_ps
#define _mm512_permutex2var_ps pace_avx2::permutex2var_ps
#define _mm512_reduce_add_ps pace_avx2::reduce_add_ps
#define _mm512_reduce_max_ps pace_avx2::reduce_max_ps
#define _mm512_add_epi32 pace_avx2::add_epi32
#define _mm512_sub_epi32 pace_avx2::sub_epi32
#define _mm512_add_epi64 pace_avx2::add_epi64
#define _mm512_mullo_epi32 pace_avx2::mullo_epi32
#define _mm512_max_epi32 pace_avx2::max_epi32
#define _mm512_min_epi32 pace_avx2::min_epi32
#define _mm512_and_si512 pace_avx2::and_si512
#define _mm512_or_si512 pace_avx2::or_si512
#define _mm512_xor_si512 pace_avx2::xor_si512
#define _mm512_slli_epi16 pace_avx2::slli_epi16
#define _mm512_slli_epi32 pace_avx2::slli_epi32
#define _mm512_srli_epi16 pace_avx2::srli_epi16
#define _mm512_srli_epi32 pace_avx2::srli_epi32
#define _mm512_srai_epi32 pace_avx2::srai_epi32
#define _mm512_set1_epi32 pace_avx2::set1_epi32
#define _mm512_set1_epi8 pace_avx2::set1_epi8
#define _mm512_setzero_si512 pace_avx2::setzero_si512
#define _mm512_setr_epi32 pace_avx2::setr_epi32
#define _mm512_loadu_si512 pace_avx2::loadu_si512
#define _mm512_load_si512 pace_avx2::load_si512
#define _mm512_storeu_si512 pace_avx2::storeu_si512
#define _mm512_castps_si512 pace_avx2::castps_si512
#define _mm512_castsi512_ps pace_avx2::castsi512_ps
#define _mm512_cvtepi32_ps pace_avx2::cvtepi32_ps
#define _mm512_cvtps_epi32 pace_avx2::cvtps_epi32
#define _mm512_mask_mov_epi32 pace_avx2::mask_mov_epi32
#define _mm512_cvtph_ps pace_avx2::cvtph_ps
#define _mm512_cvtepi8_epi32 pace_avx2::cvtepi8_epi32
#define _mm512_cvtepu8_epi32 pace_avx2::cvtepu8_epi32
#define _mm512_cvtepu16_epi32 pace_avx2::cvtepu16_epi32
#define _mm512_cvtepu8_epi16 pace_avx2::cvtepu8_epi16
#define _mm512_cvtepi8_epi16 pace_avx2::cvtepi8_epi16
#define _mm512_cvtepi32_epi16 pace_avx2::cvtepi32_epi16
#define _mm512_cvtepi32_epi8 pace_avx2::cvtepi32_epi8
#define _mm512_cvtsepi32_epi8 pace_avx2::cvtsepi32_epi8
#define _mm512_mask_cvtepi32_storeu_epi8 pace_avx2::mask_cvtepi32_storeu_epi8
#define _mm512_ternarylogic_epi32(a, b, c, imm) pace_avx2::ternarylogic_epi32<(imm)>(a, b, c)
#define _mm512_test_epi8_mask pace_avx2::test_epi8_mask
#define _mm_test_epi8_mask pace_avx2::test_epi8_mask128
#define _mm512_reduce_add_epi32 pace_avx2::reduce_add_epi32
#define _mm512_reduce_or_epi64 pace_avx2::reduce_or_epi64
#define _mm512_dpwssd_epi32 pace_avx2::dpwssd_epi32
#define dpbusd_small_codes pace_avx2::dpbusd_small_codes
#define dpbusd_offset_bytes pace_avx2::dpbusd_offset_bytes
#define dpbusd_nibbles pace_avx2::dpbusd_nibbles
#define dpbusd_high_nibbles pace_avx2::dpbusd_high_nibbles
#define widen_nibble_sums pace_avx2::widen_nibble_sums
#define widen_high_nibble_sums pace_avx2::widen_high_nibble_sums
#define _mm512_permutexvar_epi16 pace_avx2::permutexvar_epi16
#define _mm512_maskz_loadu_epi8 pace_avx2::maskz_loadu_epi8
#define _mm512_maskz_loadu_epi16 pace_avx2::maskz_loadu_epi16
#define _mm256_maskz_loadu_epi16 pace_avx2::maskz_loadu_epi16_256
#define _mm256_mask_storeu_epi16 pace_avx2::mask_storeu_epi16_256
#define _mm_maskz_loadu_epi8 pace_avx2::maskz_loadu_epi8_128
