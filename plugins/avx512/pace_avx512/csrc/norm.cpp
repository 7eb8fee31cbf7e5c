// RMSNorm with fused residual add, same semantics as pace_native.kernels.rms_norm:
//   s = x + res        (in the activation dtype, i.e. rounded to bf16 for bf16)
//   y = (s * rsqrt(mean(s^2) + eps)) * w      in fp32, rounded once to the activation dtype.
// Rows are independent; long batches split rows over threads.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels.h"
#include "simd.h"

namespace pace_avx512 {
namespace {

static inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
static inline __m512 load(const bf16_t* p, __mmask16 m) { return load_bf16(p, m); }
static inline void store(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
static inline void store(bf16_t* p, __m512 v, __mmask16 m) { store_bf16(p, v, m); }
// Round to the storage dtype and back (identity for fp32), as torch's x + res in that dtype.
static inline __m512 round_to(const float*, __m512 v) { return v; }
static inline __m512 round_to(const bf16_t*, __m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(v)), 16));
}

template <typename T>
void rms_row(const T* x, const T* res, const float* w, float eps, int64_t H, T* y, T* sum) {
  __m512 ss = _mm512_setzero_ps();
  const T* src = x;
  if (res) {  // pass 1a: s = x + res, stored (the caller gets it back as the new residual)
    for (int64_t i = 0; i < H; i += 16) {
      const __mmask16 m = lane_mask(H - i);
      const __m512 s = round_to(x, _mm512_add_ps(load(x + i, m), load(res + i, m)));
      store(sum + i, s, m);
      ss = _mm512_fmadd_ps(s, s, ss);
    }
    src = sum;
  } else {
    for (int64_t i = 0; i < H; i += 16) {
      const __m512 s = load(x + i, lane_mask(H - i));
      ss = _mm512_fmadd_ps(s, s, ss);
    }
  }
  const float mean = _mm512_reduce_add_ps(ss) / (float)H;
  const __m512 r = _mm512_set1_ps(1.0f / std::sqrt(mean + eps));
  for (int64_t i = 0; i < H; i += 16) {  // pass 2: the row is in L1 now
    const __mmask16 m = lane_mask(H - i);
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(load(src + i, m), r), _mm512_maskz_loadu_ps(m, w + i));
    store(y + i, v, m);
  }
}

template <typename T>
void rms_norm(const T* x, const T* res, const float* w, float eps, int64_t rows, int64_t H, T* y,
              T* sum, int nthreads) {
  const int64_t want = rows * H / (1 << 15);  // ~32k elements per thread at least
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, std::min(want, rows)));
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    rms_row(x + r * H, res ? res + r * H : nullptr, w, eps, H, y + r * H, sum ? sum + r * H : nullptr);
}

}  // namespace

void rms_norm_bf16(const bf16_t* x, const bf16_t* res, const float* w, float eps, int64_t rows,
                   int64_t H, bf16_t* y, bf16_t* sum, int nthreads) {
  rms_norm(x, res, w, eps, rows, H, y, sum, nthreads);
}

void rms_norm_fp32(const float* x, const float* res, const float* w, float eps, int64_t rows,
                   int64_t H, float* y, float* sum, int nthreads) {
  rms_norm(x, res, w, eps, rows, H, y, sum, nthreads);
}

}  // namespace pace_avx512
