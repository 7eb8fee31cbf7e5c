// DLRMv2's own kernels (ops embedding_bag and cross_interaction; pace_avx512/dlrm.py):
//
// - embedding_bag: sum-pooled bags over a table of fp32, bf16 or int8 rows (int8: one fp32
//   scale per row, w = q * s). Each bag accumulates in fp32 registers, 8 vectors (128 values)
//   of a row at a time, the next row of the bag prefetched; int8 rows are widened and scaled
//   by one FMA per 16 values. Bags are split over threads in chunks (dynamic schedule: bags
//   differ in size).
// - cross_combine: the element-wise tail of a DCNv2 cross layer, out = x0 * y + xl (fp32 math,
//   one rounding to bf16 at the store); out may be xl.
// The cross stack itself (dlrm_ops.cpp) runs the layers' matmuls with the linear / qlinear
// kernels and this combine, in one call.
#include <omp.h>

#include <algorithm>
#include <type_traits>

#include "kernels.h"
#include "simd.h"

namespace pace_avx512 {

namespace {

constexpr int64_t BAG_VECTORS = 8;  // values of a row per pass: 8 x 16 = 128 (DLRMv2's D)
constexpr int64_t BAG_CHUNK = 16;   // bags per scheduling chunk

template <typename TT>
inline __m512 load_row(const TT* p, __mmask16 m) {
  if constexpr (std::is_same_v<TT, int8_t>) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
  } else {
    return load(p, m);
  }
}

// out[b, c0 : c0 + width) for every bag b in [b0, b1); TT: the table's storage type.
template <typename TT, typename TO>
void bag_rows(const int64_t* idx, const int64_t* off, int64_t b0, int64_t b1, const TT* table,
              const float* scales, int64_t D, TO* out) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t first = off[b], last = off[b + 1];
    for (int64_t c0 = 0; c0 < D; c0 += BAG_VECTORS * 16) {
      const int64_t width = std::min<int64_t>(BAG_VECTORS * 16, D - c0);
      const int nv = (int)((width + 15) / 16);
      __m512 acc[BAG_VECTORS];
      for (int v = 0; v < BAG_VECTORS; ++v) acc[v] = _mm512_setzero_ps();
      for (int64_t i = first; i < last; ++i) {
        const int64_t r = idx[i];
        if (i + 1 < last) _mm_prefetch((const char*)(table + idx[i + 1] * D + c0), _MM_HINT_T0);
        const TT* row = table + r * D + c0;
        if (nv == BAG_VECTORS && width == BAG_VECTORS * 16) {
          if constexpr (std::is_same_v<TT, int8_t>) {
            const __m512 s = _mm512_set1_ps(scales[r]);
            for (int v = 0; v < BAG_VECTORS; ++v)
              acc[v] = _mm512_fmadd_ps(load_row(row + 16 * v, 0xFFFF), s, acc[v]);
          } else {
            for (int v = 0; v < BAG_VECTORS; ++v)
              acc[v] = _mm512_add_ps(load_row(row + 16 * v, 0xFFFF), acc[v]);
          }
        } else {
          const __m512 s = std::is_same_v<TT, int8_t> ? _mm512_set1_ps(scales[r]) : _mm512_set1_ps(1.0f);
          for (int v = 0; v < nv; ++v)
            acc[v] = _mm512_fmadd_ps(load_row(row + 16 * v, lane_mask(width - 16 * v)), s, acc[v]);
        }
      }
      TO* dst = out + b * D + c0;
      for (int v = 0; v < nv; ++v) store(dst + 16 * v, acc[v], lane_mask(width - 16 * v));
    }
  }
}

template <typename TT, typename TO>
void bags(const int64_t* idx, const int64_t* off, int64_t B, const TT* table, const float* scales,
          int64_t D, TO* out, int nthreads) {
  const int64_t lookups = off[B] - off[0];
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, lookups * D / (1 << 14)));
  const int64_t chunks = (B + BAG_CHUNK - 1) / BAG_CHUNK;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c)
    bag_rows(idx, off, c * BAG_CHUNK, std::min(B, (c + 1) * BAG_CHUNK), table, scales, D, out);
}

template <typename TO>
void bags_out(const int64_t* idx, const int64_t* off, int64_t B, const void* table, int type,
              const float* scales, int64_t D, TO* out, int nthreads) {
  switch (type) {
    case TABLE_INT8: return bags(idx, off, B, (const int8_t*)table, scales, D, out, nthreads);
    case TABLE_BF16: return bags(idx, off, B, (const bf16_t*)table, scales, D, out, nthreads);
    default: return bags(idx, off, B, (const float*)table, scales, D, out, nthreads);
  }
}

template <typename T>
void combine(const T* x0, const T* y, const T* xl, T* out, int64_t n, int nthreads) {
  const int64_t vecs = (n + 15) / 16;
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, n / MIN_VALUES_PER_THREAD));
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t i = 0; i < vecs; ++i) {
    const __mmask16 m = lane_mask(n - 16 * i);
    const __m512 r = _mm512_fmadd_ps(load(x0 + 16 * i, m), load(y + 16 * i, m), load(xl + 16 * i, m));
    store(out + 16 * i, r, m);
  }
}

}  // namespace

void embedding_bag_fp32(const int64_t* indices, const int64_t* offsets, int64_t bags,
                        const void* table, int type, const float* scales, int64_t dim, float* out,
                        int nthreads) {
  bags_out(indices, offsets, bags, table, type, scales, dim, out, nthreads);
}

void embedding_bag_bf16(const int64_t* indices, const int64_t* offsets, int64_t bags,
                        const void* table, int type, const float* scales, int64_t dim,
                        bf16_t* out, int nthreads) {
  bags_out(indices, offsets, bags, table, type, scales, dim, out, nthreads);
}

void cross_combine_fp32(const float* x0, const float* y, const float* xl, float* out, int64_t n,
                        int nthreads) {
  combine(x0, y, xl, out, n, nthreads);
}

void cross_combine_bf16(const bf16_t* x0, const bf16_t* y, const bf16_t* xl, bf16_t* out,
                        int64_t n, int nthreads) {
  combine(x0, y, xl, out, n, nthreads);
}

}  // namespace pace_avx512
