// act(gate) * up over rows: the middle of a gated MLP whose halves come from separate matmuls
// (quantized weights). gate and up are rows of `inter` values `ld` apart (the two halves of
// one [gate | up] output); fp32 math and one rounding at the store, as the fused gated_mlp
// epilogue. Rows split over threads in contiguous ranges.
#include <omp.h>

#include <algorithm>

#include "kernels.h"
#include "simd.h"

namespace pace_avx512 {
namespace {

template <typename T>
void act_mul_rows(const T* gate, const T* up, int64_t ld, int64_t rows, int64_t inter, int act,
                  T* out, int nthreads) {
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, rows * inter / 16384));
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; i += 16) {
      const __mmask16 m = lane_mask(inter - i);
      const __m512 g = load(gate + r * ld + i, m), u = load(up + r * ld + i, m);
      store(out + r * inter + i, _mm512_mul_ps(activate(g, act), u), m);
    }
}

}  // namespace

void gated_act_bf16(const bf16_t* gate, const bf16_t* up, int64_t ld, int64_t rows, int64_t inter,
                    int act, bf16_t* out, int nthreads) {
  act_mul_rows(gate, up, ld, rows, inter, act, out, nthreads);
}

void gated_act_fp32(const float* gate, const float* up, int64_t ld, int64_t rows, int64_t inter,
                    int act, float* out, int nthreads) {
  act_mul_rows(gate, up, ld, rows, inter, act, out, nthreads);
}

}  // namespace pace_avx512
