// Diagnostics for benchmarks and tests: a plain streaming read and the OpenMP team width.
//
// A plain streaming read (benchmark reference for DRAM bandwidth): every 64-byte line of a
// buffer is loaded once and folded into accumulators. Each thread reads its share as
// STREAMS interleaved sequential streams, the access pattern of the GEMV kernels (4 column
// blocks at a time); one stream per core leaves bandwidth unused on Zen 4.
#include <omp.h>

#include "kernels.h"
#include "simd.h"

#ifndef PACE_STREAMS
#define PACE_STREAMS 4
#endif

namespace pace_avx512 {

int64_t stream_read(const void* data, int64_t bytes, int nthreads) {
  constexpr int S = PACE_STREAMS;
  const int64_t lines = bytes / 64;
  const char* base = static_cast<const char*>(data);
  int64_t total = 0;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1) reduction(^ : total)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t begin = lines * t / nt, len = (lines * (t + 1) / nt - begin) / S;
    const __m512i* p[S];
    __m512i acc[S];
    for (int s = 0; s < S; ++s) {
      p[s] = reinterpret_cast<const __m512i*>(base + 64 * (begin + s * len));
      acc[s] = _mm512_setzero_si512();
    }
    for (int64_t i = 0; i < len; ++i)
      _Pragma("GCC unroll 8") for (int s = 0; s < S; ++s) acc[s] = _mm512_xor_si512(acc[s], _mm512_loadu_si512(p[s] + i));
    for (int s = 1; s < S; ++s) acc[0] = _mm512_xor_si512(acc[0], acc[s]);
    total ^= _mm512_reduce_or_epi64(acc[0]);
  }
  return total;
}

int parallel_width(int nthreads) {
  int width = 1;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
#pragma omp single
    width = omp_get_num_threads();
  }
  return width;
}

}  // namespace pace_avx512
