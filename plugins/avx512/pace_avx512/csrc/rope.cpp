// Rotary embedding in place on the first R dims of every head, as pace_native.kernels.rope:
//   neox (halves):       out[i] = x[i] c[i] - x[i+R/2] s[i],  out[i+R/2] = x[i+R/2] c[i+R/2] + x[i] s[i+R/2]
//   interleaved (pairs): out[2i] = x[2i] c[2i] - x[2i+1] s[2i], out[2i+1] = x[2i+1] c[2i+1] + x[2i] s[2i+1]
// in fp32, rounded once. q/k may be strided views (e.g. of the fused QKV output); only the
// last dim must be contiguous.
#include <omp.h>

#include <algorithm>

#include "kernels.h"
#include "simd.h"

namespace pace_avx512 {
namespace {


template <typename T>
inline void rotate_head(T* x, const T* c, const T* s, int64_t R, bool interleaved) {
  if (interleaved) {
    for (int64_t i = 0; i < R; i += 16) {
      const __mmask16 m = lane_mask(R - i);
      const __m512 v = load(x + i, m);
      const __m512 swapped = _mm512_permute_ps(v, 0xB1);  // (x1, x0, x3, x2, ...)
      // even lanes: v c - swapped s, odd lanes: v c + swapped s
      store(x + i, _mm512_fmaddsub_ps(v, load(c + i, m), _mm512_mul_ps(swapped, load(s + i, m))), m);
    }
    return;
  }
  const int64_t half = R / 2;
  for (int64_t i = 0; i < half; i += 16) {
    const __mmask16 m = lane_mask(half - i);
    const __m512 x1 = load(x + i, m), x2 = load(x + half + i, m);
    const __m512 o1 = _mm512_fmsub_ps(x1, load(c + i, m), _mm512_mul_ps(x2, load(s + i, m)));
    const __m512 o2 = _mm512_fmadd_ps(x2, load(c + half + i, m), _mm512_mul_ps(x1, load(s + half + i, m)));
    store(x + i, o1, m);
    store(x + half + i, o2, m);
  }
}

template <typename T>
void rope(T* q, const int64_t* qs, int64_t hq, T* k, const int64_t* ks, int64_t hk,
          const T* cos, const T* sin, const int64_t* cs, int64_t B, int64_t Tn, int64_t R,
          bool interleaved, int nthreads) {
  const int64_t rows = B * Tn;
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, rows * (hq + hk) * R / MIN_VALUES_PER_THREAD));
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / Tn, t = r % Tn;
    const T* c = cos + b * cs[0] + t * cs[1];
    const T* s = sin + b * cs[0] + t * cs[1];
    for (int64_t h = 0; h < hq; ++h) rotate_head(q + b * qs[0] + t * qs[1] + h * qs[2], c, s, R, interleaved);
    for (int64_t h = 0; h < hk; ++h) rotate_head(k + b * ks[0] + t * ks[1] + h * ks[2], c, s, R, interleaved);
  }
}

}  // namespace

void rope_bf16(bf16_t* q, const int64_t* qs, int64_t hq, bf16_t* k, const int64_t* ks, int64_t hk,
               const bf16_t* cos, const bf16_t* sin, const int64_t* cs, int64_t B, int64_t T,
               int64_t R, bool interleaved, int nthreads) {
  rope(q, qs, hq, k, ks, hk, cos, sin, cs, B, T, R, interleaved, nthreads);
}

void rope_fp32(float* q, const int64_t* qs, int64_t hq, float* k, const int64_t* ks, int64_t hk,
               const float* cos, const float* sin, const int64_t* cs, int64_t B, int64_t T,
               int64_t R, bool interleaved, int nthreads) {
  rope(q, qs, hq, k, ks, hk, cos, sin, cs, B, T, R, interleaved, nthreads);
}

}  // namespace pace_avx512
