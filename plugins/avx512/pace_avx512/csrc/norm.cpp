// RMSNorm and LayerNorm with fused residual add, same semantics as pace_native.kernels:
//   s = x + res        (in the activation dtype, i.e. rounded to bf16 for bf16)
//   rms:   y = (s * rsqrt(mean(s^2) + eps)) * w
//   layer: y = (s - mean(s)) * rsqrt(var(s) + eps) * w + b     (biased variance, two passes)
// in fp32, rounded once to the activation dtype. The first pass adds and accumulates, the
// later ones run while the row is in L1. Rows are independent; long batches split rows over
// threads.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels.h"
#include "simd.h"

namespace pace_avx512 {
namespace {

// Round to the storage dtype and back (identity for fp32), as torch's x + res in that dtype.
static inline __m512 round_to(const float*, __m512 v) { return v; }
static inline __m512 round_to(const bf16_t*, __m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(v)), 16));
}

// Pass 1: s = x + res stored to `sum` (the caller gets it back as the new residual) when res
// is given; returns the row to normalise and the sums of s (lanes) and s^2 (lanes).
template <typename T>
const T* add_row(const T* x, const T* res, int64_t H, T* sum, __m512& s1, __m512& s2) {
  s1 = s2 = _mm512_setzero_ps();
  for (int64_t i = 0; i < H; i += 16) {
    const __mmask16 m = lane_mask(H - i);
    __m512 s = load(x + i, m);
    if (res) {
      s = round_to(x, _mm512_add_ps(s, load(res + i, m)));
      store(sum + i, s, m);
    }
    s1 = _mm512_add_ps(s1, s);
    s2 = _mm512_fmadd_ps(s, s, s2);
  }
  return res ? sum : x;
}

template <typename T>
void rms_row(const T* x, const T* res, const float* w, const float*, float eps, int64_t H, T* y,
             T* sum) {
  __m512 s1, s2;
  const T* src = add_row(x, res, H, sum, s1, s2);
  const float ms = _mm512_reduce_add_ps(s2) / (float)H;
  const __m512 r = _mm512_set1_ps(1.0f / std::sqrt(ms + eps));
  for (int64_t i = 0; i < H; i += 16) {
    const __mmask16 m = lane_mask(H - i);
    store(y + i, _mm512_mul_ps(_mm512_mul_ps(load(src + i, m), r), _mm512_maskz_loadu_ps(m, w + i)), m);
  }
}

template <typename T>
void layer_row(const T* x, const T* res, const float* w, const float* b, float eps, int64_t H,
               T* y, T* sum) {
  __m512 s1, s2;
  const T* src = add_row(x, res, H, sum, s1, s2);
  const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(s1) / (float)H);
  __m512 dev = _mm512_setzero_ps();  // pass 2: centred sum of squares (no cancellation)
  for (int64_t i = 0; i < H; i += 16) {
    const __mmask16 m = lane_mask(H - i);
    const __m512 d = _mm512_maskz_sub_ps(m, load(src + i, m), mean);
    dev = _mm512_fmadd_ps(d, d, dev);
  }
  const __m512 r = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(dev) / (float)H + eps));
  for (int64_t i = 0; i < H; i += 16) {
    const __mmask16 m = lane_mask(H - i);
    const __m512 n = _mm512_mul_ps(_mm512_sub_ps(load(src + i, m), mean), r);
    const __m512 bias = b ? _mm512_maskz_loadu_ps(m, b + i) : _mm512_setzero_ps();
    store(y + i, _mm512_fmadd_ps(n, _mm512_maskz_loadu_ps(m, w + i), bias), m);
  }
}

template <typename T, class Row>
void norm_rows(Row row, const T* x, const T* res, const float* w, const float* b, float eps,
               int64_t rows, int64_t H, T* y, T* sum, int nthreads) {
  const int64_t want = rows * H / MIN_VALUES_PER_THREAD;
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, std::min(want, rows)));
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    row(x + r * H, res ? res + r * H : nullptr, w, b, eps, H, y + r * H, sum ? sum + r * H : nullptr);
}

}  // namespace

void rms_norm_bf16(const bf16_t* x, const bf16_t* res, const float* w, float eps, int64_t rows,
                   int64_t H, bf16_t* y, bf16_t* sum, int nthreads) {
  norm_rows(rms_row<bf16_t>, x, res, w, nullptr, eps, rows, H, y, sum, nthreads);
}

void rms_norm_fp32(const float* x, const float* res, const float* w, float eps, int64_t rows,
                   int64_t H, float* y, float* sum, int nthreads) {
  norm_rows(rms_row<float>, x, res, w, nullptr, eps, rows, H, y, sum, nthreads);
}

void layer_norm_bf16(const bf16_t* x, const bf16_t* res, const float* w, const float* b, float eps,
                     int64_t rows, int64_t H, bf16_t* y, bf16_t* sum, int nthreads) {
  norm_rows(layer_row<bf16_t>, x, res, w, b, eps, rows, H, y, sum, nthreads);
}

void layer_norm_fp32(const float* x, const float* res, const float* w, const float* b, float eps,
                     int64_t rows, int64_t H, float* y, float* sum, int nthreads) {
  norm_rows(layer_row<float>, x, res, w, b, eps, rows, H, y, sum, nthreads);
}

}  // namespace pace_avx512
