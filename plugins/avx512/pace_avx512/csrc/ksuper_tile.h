// The frame of the k-quant kinds' int8 tiles (q4k_tile.h, q6k_tile.h): against activation rows
// quantized per super-block of 256 (qrows.h span 256), each tile walks its blocks' runs (one
// per super-block: the tables, then 8 groups of codes) side by side, sums integers across a
// run and flushes once per run. The kinds differ only in a group's integer work and a run's
// flush, which they pass in.
#pragma once

#include "isa.h"

#include <cstdint>

#include "kernels.h"
#include "qrows.h"
#include "simd.h"

PACE_VNNI_BEGIN

namespace pace_avx512 {

// total[j][m] = 0, then per run of the NB blocks block[j] (K = 32 G): its tables touched,
// integer accumulators acc[j][m] zeroed, group(xq, g, i, codes, tables, acc) for its groups
// g = g0 + i (xq[m]: activation row m0 + m's int8 codes as int32 quads; codes[j]: block j's
// codes of group g; tables[j]: block j's run tables), then flush(g0, tables, acc, total).
template <int KIND, int MT, int NB, typename Group, typename Flush>
__attribute__((always_inline)) inline void super_block_runs(
    const uint8_t* const (&block)[NB], int64_t G, const QuantizedRows& x, int64_t K, int64_t m0,
    __m512 (&total)[NB][MT], Group&& group, Flush&& flush) {
  const int32_t* xq[MT];
  _Pragma("GCC unroll 16") for (int m = 0; m < MT; ++m) {
    _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) total[j][m] = _mm512_setzero_ps();
    xq[m] = (const int32_t*)(x.codes.data() + (m0 + m) * K);
  }
  for (int64_t g0 = 0; g0 < G; g0 += 8) {
    const uint16_t* tables[NB];
    _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) {
      qtouch_run<KIND>(block[j], g0);
      tables[j] = qgroup_tables<KIND>(block[j], g0);
    }
    __m512i acc[NB][MT];
    _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j)
      _Pragma("GCC unroll 16") for (int m = 0; m < MT; ++m) acc[j][m] = _mm512_setzero_si512();
    for (int i = 0; i < 8; ++i) {
      const uint8_t* codes[NB];
      _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j)
        codes[j] = qgroup_codes<KIND>(block[j], G, g0 + i);
      group(xq, g0 + i, i, codes, tables, acc);
    }
    flush(g0, tables, acc, total);
  }
}

}  // namespace pace_avx512

PACE_VNNI_END
