// Small AVX-512 helpers shared by the kernels: bf16 <-> fp32 conversion, typed loads and
// stores, masks, the lane sums of 16 vectors at once, exp and the activation functions of the
// gated MLP. Everything computes in fp32 (the lane sums in int32 too).
#pragma once

#include "isa.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pace_avx512 {

using bf16_t = uint16_t;  // raw bfloat16 bits (torch::kBFloat16 storage)

// out lane k = the sum of the 16 lanes of v[k], for 16 vectors at once: a transpose-and-add
// tree (no horizontal sum per vector). `add` adds two vectors, as fp32 or as int32 bits.
template <typename Add>
static inline __m512 sum_lanes16(const __m512 (&v)[16], Add add) {
  __m512 s[8], u[4];
  for (int i = 0; i < 8; ++i)  // lane L of s[i]: pairwise sums of v[2i], v[2i+1] in that lane
    s[i] = add(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // lane L of u[i]: the lane-L sums of v[4i .. 4i+3]
    u[i] = add(_mm512_shuffle_ps(s[2 * i], s[2 * i + 1], 0x44), _mm512_shuffle_ps(s[2 * i], s[2 * i + 1], 0xEE));
  const __m512 ab = add(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
  const __m512 cd = add(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
  return add(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
}
static inline __m512 reduce16(const __m512 (&v)[16]) {
  return sum_lanes16(v, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
}
static inline __m512i reduce16_epi32(const __m512i (&v)[16]) {
  __m512 f[16];
  for (int i = 0; i < 16; ++i) f[i] = _mm512_castsi512_ps(v[i]);
  return _mm512_castps_si512(sum_lanes16(f, [](__m512 a, __m512 b) {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }));
}

// Lanes [0, n) of a 16-lane vector (n may exceed 16 or be <= 0).
static inline __mmask16 lane_mask(int64_t n) {
  return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

// bf16 -> fp32 is exact: the bf16 bits are the upper half of the fp32 bits.
static inline __m512 load_bf16(const bf16_t* p, __mmask16 m = 0xFFFF) {
  __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// fp32 -> bf16, round to nearest even (as torch's .to(torch.bfloat16)); NaN stays NaN.
static inline __m256i to_bf16(__m512 v) {
#ifdef PACE_HAS_BF16
  return (__m256i)_mm512_cvtneps_pbh(v);
#else
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
#endif
}

static inline void store_bf16(bf16_t* p, __m512 v, __mmask16 m = 0xFFFF) {
  _mm256_mask_storeu_epi16(p, m, to_bf16(v));
}

// Typed loads and stores of 16 lanes (masked) in fp32, for kernels templated on the storage
// type: fp32 as is, bf16 widened on load and rounded to nearest even on store.
static inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
static inline __m512 load(const bf16_t* p, __mmask16 m) { return load_bf16(p, m); }
static inline void store(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
static inline void store(bf16_t* p, __m512 v, __mmask16 m) { store_bf16(p, v, m); }

// 16 fp16 values (e.g. the 16 rows' scales or mins of one quantization group) as fp32.
static inline __m512 fp16x16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}

static inline float bf16_to_float(bf16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// exp(x) for fp32: x = n*ln2 + r, exp(r) by the Cephes polynomial (~1 ulp), then 2^n by scalef.
static inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.376f)), _mm512_set1_ps(88.376f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// erf(x) by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7).
static inline __m512 erf512(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 a = _mm512_abs_ps(x);
  __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(a, _mm512_set1_ps(0.3275911f), one));
  __m512 p = _mm512_set1_ps(1.061405429f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
  p = _mm512_mul_ps(p, t);
  __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(a, a)));
  __m512 y = _mm512_fnmadd_ps(p, e, one);
  // copy the sign of x
  return _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_castps_si512(y),
      _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u))));
}

// Activation codes of the gated MLP. ACT_NAMES[code] must be pace_core.ops.ACTIVATIONS in
// order: the extension exports it and pace_avx512/build.py checks it at load.
enum Act : int { ACT_SILU = 0, ACT_GELU = 1, ACT_GELU_TANH = 2, ACT_RELU = 3, ACT_COUNT };
inline constexpr const char* ACT_NAMES[ACT_COUNT] = {"silu", "gelu", "gelu_tanh", "relu"};

static inline __m512 activate(__m512 x, int act) {
  const __m512 one = _mm512_set1_ps(1.0f), half = _mm512_set1_ps(0.5f);
  switch (act) {
    case ACT_SILU:  // x * sigmoid(x)
      return _mm512_div_ps(x, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    case ACT_GELU:  // 0.5 x (1 + erf(x / sqrt 2))
      return _mm512_mul_ps(_mm512_mul_ps(half, x),
                           _mm512_add_ps(one, erf512(_mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f)))));
    case ACT_GELU_TANH: {  // 0.5 x (1 + tanh(y)), tanh(y) = 1 - 2 / (1 + exp(2y))
      __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
      __m512 y = _mm512_mul_ps(_mm512_set1_ps(0.79788456080286536f),
                               _mm512_fmadd_ps(x3, _mm512_set1_ps(0.044715f), x));
      __m512 e = exp512(_mm512_add_ps(y, y));
      __m512 th = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(one, e)));
      return _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, th));
    }
    default:  // relu
      return _mm512_max_ps(x, _mm512_setzero_ps());
  }
}

}  // namespace pace_avx512
