// Linear over quantized weights with AVX512-VNNI: y = x @ W^T + bias, W in groups of 32 along
// K with a scale (and a min) per row and group.
//
// Every weight code is an unsigned byte u with w = u * s + m: 4-bit codes (0..15) with their
// min (q4_0 / symmetric int4: m = -8 s; GGUF q4_k: s = d sc, m = -dmin m6 in fp32), 8-bit
// codes stored as q + 128 (m = -128 s), 6-bit codes (KIND_Q6, GGUF q6_k: s = d sc in fp32) as
// q + 32 (m = -32 s). The
// activation rows are quantized once per call per group of 32 (round to nearest even) with
// the sum of their codes per 16 (qrows.h), so that
//   sum w x = s xs sum u xq + m xs sum xq,
// the first sum exact in int32 by vpdpbusd (16 rows x a k-quad of unsigned weight bytes times
// the activation quad broadcast, per instruction; 4-bit nibbles need only a mask or a shift).
// The kinds without mins (m = -offset s) fold m into the integer sum,
//   sum w x = s xs (sum u xq - offset sum xq),
// one FMA per scale span (`folds`), on int8 and 15-bit activations alike. KIND_Q4K (GGUF q4_k,
// s = d sc, m = -dmin m6 with 6-bit sc, m6 per 32 k) cannot fold, so on int8 activations its
// rows are quantized per super-block of 256 (llama.cpp's q8_K class) and its tiles sum
// integers across the super-block: sum_i sc_i (sum u xq)_i and sum_i m6_i (sum xq)_i, two
// FMAs per 256 k (q4k_tile.h). KIND_Q6 (GGUF q6_k, s = d sc with an int8 sc per 16 k) does
// the same on int8 activations: sum_i sc_i (sum q xq)_i, one FMA per 256 k (q6k_tile.h).
// The activations are 15-bit (scale amax / 16256 = 127 x 128, error ~3e-5 relative, far below
// any weight format's own) held as two int8 planes, c = 128 hi + lo, so each quad takes two
// vpdpbusd; bf16 rows of a weight packed with int8 activations (qpacking.QPackedLinear, from
// PACE_QUANT_ACTIVATIONS: pace_avx512/settings.py) are quantized to int8 instead (amax / 127,
// as llama.cpp's q8 activations: one vpdpbusd per quad, ~0.5% error per group). The avx2 build
// (no vpdpbusd) holds 15-bit rows of calls of 2 rows or more as int16 words instead and runs
// them through its word tiles (qwords_tile.h: vpmaddwd on codes widened to int16 per tile).
//
// Packed layout (pace_avx512/qpacking.py), per block of 16 rows, one contiguous span of
// `block_stride` bytes read front to back: runs of 1 or 2 groups (kernels.h qrun_groups),
// each its groups' tables, then their codes; a group's tables are fp16 scales [SUB][16]
// (SUB = 2 for scales per 16 k: int8-g16), then (4-bit with mins) fp16 mins [16]; KIND_Q4K
// (GGUF q4_k): runs of 8 groups (a super-block), tables fp16 d, dmin [16], then its 6-bit
// sub-block scales and mins as bytes [8][16] each (qblock.h QScales); KIND_Q6 (GGUF q6_k):
// runs of 8 groups, tables fp16 d [16], then its int8 scales per 16 k [16][16] (qblock.h
// span_scale). In a
// group, byte 4j + e of a k-quad = row j, k = 4 quad + e:
//   8-bit: 8 quads of 64 bytes, quad q at byte 64 q;
//   4-bit: 4 lines of 64 bytes, line v = quad 2v in the low nibbles and 2v + 1 in the high ones;
//   6-bit (KIND_Q6, GGUF q6_k as u = q + 32): per 16 k a line of the high 2 bits, then the two
//   4-bit lines of the low 4 bits (qblock.h q6_quad), merged per quad into one byte code u as
//   8-bit.
// Threads take contiguous ranges of row blocks, each one sequential stream that the hardware
// prefetchers follow (software prefetch on top of it lost a third of the bandwidth on Zen 4);
// calls of more rows take theirs in jobs and steal the others' last ones when done (qdrive).
// A single activation row (decode; split or int8) reads its thread's range as 4 runs side by
// side (`qrow`; 1, 2 or 4 measured alike once the layout was in order, KIND_Q6's super-block
// runs too, where 2 read 25-35% slower than 4 on 15-bit rows); the tiles of other calls
// have 4 rows, the leftover 1-3 rows keep 4 or 2 accumulator chains per group. On int8
// activations a tile takes 1-3 row blocks side by side (`tile_blocks`, per kind as measured):
// once folded (or integer per super-block: q4_k, q6_k), the flush no longer bounds the wider tiles
// (CHANGELOG).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "q4k_tile.h"
#include "q6k_tile.h"
#include "qblock.h"
#include "qrows.h"
#include "qwords_tile.h"
#include "simd.h"
#include "work_ranges.h"

PACE_VNNI_BEGIN

namespace pace_avx512 {

namespace {

#define PACE_UNROLL _Pragma("GCC unroll 16")

// Accumulator chain tags (reduced modulo the chains a tile uses).
using C0 = std::integral_constant<int, 0>;
using C1 = std::integral_constant<int, 1>;
using C2 = std::integral_constant<int, 2>;
using C3 = std::integral_constant<int, 3>;

struct QArgs {
  const uint8_t* w;
  int64_t block_stride;  // bytes per block of 16 rows
  int64_t G;             // groups per row
  const QuantizedRows* x;
  int64_t K;
  int64_t M;  // activation rows
};

// The fold: a kind without mins (its min is -offset s) sums the signed codes, sum q xq = sum
// u xq - offset sum xq, exact in int32 (15-bit rows too: |128 sum u hi + sum u lo - offset
// sum xq| < 2^28 per span), so a scale span's flush is one FMA, total += sum * (s xs), and
// no min term whose product would cancel most of the first one's; as the avx2 word tiles.
// Kinds with mins keep sum u xq and the min FMA.
template <int KIND>
constexpr bool folds() { return !has_mins(KIND); }
// acc + a quad's codes u (quad_codes, or a nibble line's masked or shifted codes) . an
// activation quad: an 8-bit kind's u = q + 128, whose sum falls short by OFFSET_BYTES_BIAS per
// activation code (isa.h; code_shift adds it back); KIND_Q6's u in [0, 63]; a 4-bit kind's
// into a nibble accumulator (at most 8 quads, read through widen_codes).
template <int KIND>
__attribute__((always_inline)) inline __m512i dot_codes(__m512i acc, __m512i u, __m512i x) {
  if constexpr (is_int8(KIND)) return dpbusd_offset_bytes(acc, u, x);
  else if constexpr (KIND == KIND_Q6) return dpbusd_small_codes(acc, u, x);
  else return dpbusd_nibbles(acc, u, x);
}
// The int32 sums of an accumulator of dot_codes.
template <int KIND>
__attribute__((always_inline)) inline __m512i widen_codes(__m512i acc) {
  if constexpr (is_byte_coded(KIND)) return acc;
  else return widen_nibble_sums(acc);
}
// What a span's integer sum adds per activation code (times the span's code sum,
// QuantizedRows::span_codes).
template <int KIND>
constexpr int code_shift() {
  const int of_u = folds<KIND>() ? -qcode_offset(KIND) : 0;
  return of_u + (is_int8(KIND) ? OFFSET_BYTES_BIAS : 0);  // dot_codes sums (u - bias) x
}

// The decode GEMV: the single activation row (15-bit split, or int8: one plane) against the
// blocks bs[0..NB), total[j][0] for block bs[j]. Its speed is set by memory and by the per-group
// work no other row shares:
// - the NB blocks advance group by group, each activation quad broadcast once for all NB;
// - 4-bit: a high nibble is used in place (`& 0xF0`, 16 times its code) with accumulators of
//   its own, so a line costs two ANDs; the flush weighs the low-nibble sums by 16 and the
//   scale by 1 / 16 (|16 (128 hi + lo) sums| < 16 * 2^15 * 15 * 32 < 2^31): powers of two,
//   so an int8 row's results are bit for bit a tile's (`qtile`) for the same row;
// - accumulators are fresh each group (or sub-group of 16 k): consecutive groups are
//   independent chains for the out-of-order core;
// - KIND_Q4K's scale and min per group and block are d sc and -dmin m (QScales: two byte
//   loads widened, converted and multiplied; d and dmin converted once per run of 8 groups)
//   on 15 bits; an int8 row is a q4k_tile of one row (qrow_step);
// - the integer sums shift by code_shift (the fold): the kinds without mins sum their signed
//   codes q; KIND_Q6's scale per 16 k is d sc (span_scale) on 15 bits, and an int8 row is a
//   q6k_tile of one row (qrow_step).
template <int KIND, bool SPLIT, int NB>
inline void qrow(const QArgs& a, const int64_t (&bs)[NB], __m512 (&total)[NB][1]) {
  constexpr bool BYTES = is_byte_coded(KIND);
  constexpr bool FOLD = folds<KIND>();
  constexpr int SHIFT = code_shift<KIND>();
  constexpr int SUB = qscales_per_group(KIND);
  const int32_t* hi = (const int32_t*)a.x->codes.data();
  const int32_t* lo = (const int32_t*)(a.x->codes.data() + a.M * a.K);
  const float* xs = a.x->scales.data();
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8((char)0xF0);
  const uint8_t* block[NB];
  QScales<KIND> scales[NB];  // 4-bit kinds
  PACE_UNROLL for (int j = 0; j < NB; ++j) {
    block[j] = a.w + bs[j] * a.block_stride;
    total[j][0] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < a.G; ++g) {
    const uint8_t* codes[NB];
    const uint16_t* tables[NB];  // fp16 scales [SUB][16], then mins [16] (KIND_Q4K: QScales)
    PACE_UNROLL for (int j = 0; j < NB; ++j) {
      qtouch_run<KIND>(block[j], g);
      codes[j] = qgroup_codes<KIND>(block[j], a.G, g);
      tables[j] = qgroup_tables<KIND>(block[j], g);
    }
    if constexpr (BYTES) {  // quad q's codes u (quad_codes), summed as u + SHIFT (folded)
      static_assert(FOLD, "the byte-coded kinds have no mins");
      PACE_UNROLL for (int sub = 0; sub < SUB; ++sub) {
        __m512i acc[NB][2];  // [block][activation plane]
        PACE_UNROLL for (int j = 0; j < NB; ++j) acc[j][0] = acc[j][1] = _mm512_setzero_si512();
        PACE_UNROLL for (int q = sub * 8 / SUB; q < (sub + 1) * 8 / SUB; ++q) {
          const __m512i xh = _mm512_set1_epi32(hi[g * 8 + q]);
          const __m512i xl = SPLIT ? _mm512_set1_epi32(lo[g * 8 + q]) : xh;
          PACE_UNROLL for (int j = 0; j < NB; ++j) {
            const __m512i w = quad_codes<KIND>(codes[j], q);
            acc[j][0] = dot_codes<KIND>(acc[j][0], w, xh);
            if constexpr (SPLIT) acc[j][1] = dot_codes<KIND>(acc[j][1], w, xl);
          }
        }
        const __m512 sx = _mm512_set1_ps(xs[g]);
        const __m512i shift = _mm512_set1_epi32(SHIFT * a.x->span_codes<SUB>(0, a.G, g, sub));
        PACE_UNROLL for (int j = 0; j < NB; ++j) {
          __m512i sum = SPLIT ? _mm512_add_epi32(_mm512_slli_epi32(acc[j][0], 7), acc[j][1]) : acc[j][0];
          if constexpr (SHIFT) sum = _mm512_add_epi32(sum, shift);
          const __m512 s = span_scale<KIND>(tables[j], g, sub);
          total[j][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(s, sx), total[j][0]);
        }
      }
    } else {  // line v = quad 2v in the low nibbles, 2v + 1 in the high ones
      __m512i acc[NB][2][2];  // [block][nibble: even quads, odd quads x16][activation plane]
      PACE_UNROLL for (int j = 0; j < NB; ++j)
        acc[j][0][0] = acc[j][0][1] = acc[j][1][0] = acc[j][1][1] = _mm512_setzero_si512();
      PACE_UNROLL for (int v = 0; v < 4; ++v) {
        const int64_t q = g * 8 + 2 * v;
        const __m512i xh0 = _mm512_set1_epi32(hi[q]), xh1 = _mm512_set1_epi32(hi[q + 1]);
        const __m512i xl0 = SPLIT ? _mm512_set1_epi32(lo[q]) : xh0;
        const __m512i xl1 = SPLIT ? _mm512_set1_epi32(lo[q + 1]) : xh1;
        PACE_UNROLL for (int j = 0; j < NB; ++j) {
          const __m512i raw = _mm512_loadu_si512(codes[j] + 64 * v);
          const __m512i even = _mm512_and_si512(raw, low), odd = _mm512_and_si512(raw, high);
          acc[j][0][0] = dpbusd_nibbles(acc[j][0][0], even, xh0);
          acc[j][1][0] = dpbusd_high_nibbles(acc[j][1][0], odd, xh1);
          if constexpr (SPLIT) {
            acc[j][0][1] = dpbusd_nibbles(acc[j][0][1], even, xl0);
            acc[j][1][1] = dpbusd_high_nibbles(acc[j][1][1], odd, xl1);
          }
        }
      }
      const __m512 sx = _mm512_set1_ps(xs[g] / 16.0f);
      const __m512 xsum = _mm512_set1_ps(a.x->span_sum<1>(0, a.G, g, 0));
      const __m512i shift = _mm512_set1_epi32(16 * SHIFT * a.x->span_codes<1>(0, a.G, g, 0));
      PACE_UNROLL for (int j = 0; j < NB; ++j) {
        // 16 (128 hi + lo) over the 32 k = 128 (16 E_hi + O_hi) + (16 E_lo + O_lo)
        const __m512i h = _mm512_add_epi32(_mm512_slli_epi32(widen_nibble_sums(acc[j][0][0]), 4),
                                           widen_high_nibble_sums(acc[j][1][0]));
        __m512i sum = h;
        if constexpr (SPLIT) {
          const __m512i l = _mm512_add_epi32(_mm512_slli_epi32(widen_nibble_sums(acc[j][0][1]), 4),
                                             widen_high_nibble_sums(acc[j][1][1]));
          sum = _mm512_add_epi32(_mm512_slli_epi32(h, 7), l);
        }
        if constexpr (SHIFT) sum = _mm512_add_epi32(sum, shift);  // 16 times the fold
        scales[j].group(tables[j], g);
        const __m512 s = _mm512_mul_ps(scales[j].scale, sx);
        total[j][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), s, total[j][0]);
        if constexpr (!FOLD) total[j][0] = _mm512_fmadd_ps(scales[j].min, xsum, total[j][0]);
      }
    }
  }
}

// total[j][m] (the 16 rows of block b + j, NB blocks side by side) for activation rows
// [m0, m0 + MT). Each output takes the operations of the one-block tile in the same order:
// the blocks only interleave, each activation quad broadcast once for all NB (bit for bit the
// same results at any NB).
template <int KIND, bool SPLIT, int MT, int NB = 1>
inline void qtile(const QArgs& a, int64_t b, int64_t m0, __m512 (&total)[NB][MT]) {
  constexpr bool BYTES = is_byte_coded(KIND);
  constexpr bool FOLD = folds<KIND>();
  constexpr int SHIFT = code_shift<KIND>();
  constexpr int SUB = qscales_per_group(KIND);
  // Independent accumulator chains per activation row and block: with few rows a single chain
  // of dot products waits on its own latency (~5 cycles) every instruction.
  constexpr int CH = MT * NB >= 4 ? 1 : MT * NB >= 2 ? 2 : 4;
  const uint8_t* block[NB];
  PACE_UNROLL for (int j = 0; j < NB; ++j) block[j] = a.w + (b + j) * a.block_stride;
  const int32_t* xq[MT];
  const int32_t* xl[MT];  // SPLIT: the low plane
  PACE_UNROLL for (int m = 0; m < MT; ++m) {
    PACE_UNROLL for (int j = 0; j < NB; ++j) total[j][m] = _mm512_setzero_ps();
    xq[m] = (const int32_t*)(a.x->codes.data() + (m0 + m) * a.K);
    xl[m] = SPLIT ? (const int32_t*)(a.x->codes.data() + (a.M + m0 + m) * a.K) : nullptr;
  }
  const __m512i low = _mm512_set1_epi8(0x0F);
  QScales<KIND> scales[NB];  // 4-bit kinds
  for (int64_t g = 0; g < a.G; ++g) {
    __m512i acc[CH][NB][MT], low_acc[SPLIT ? CH : 1][NB][MT];
    const uint8_t* cg[NB];
    const uint16_t* tables[NB];  // scales [SUB][16], mins [16]
    PACE_UNROLL for (int j = 0; j < NB; ++j) {
      qtouch_run<KIND>(block[j], g);
      cg[j] = qgroup_codes<KIND>(block[j], a.G, g);
      tables[j] = qgroup_tables<KIND>(block[j], g);
    }
    PACE_UNROLL for (int c = 0; c < CH; ++c) PACE_UNROLL for (int j = 0; j < NB; ++j)
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        acc[c][j][m] = _mm512_setzero_si512();
        if constexpr (SPLIT) low_acc[c][j][m] = _mm512_setzero_si512();
      }
    // acc[chain][j][m] += block j's 16 rows x k-quad (unsigned bytes w[j]) . the quad of row m
    // broadcast
    auto dot4 = [&](const __m512i (&w)[NB], int64_t quad, auto chain) {
      constexpr int c = decltype(chain)::value % CH;
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        const __m512i xm = _mm512_set1_epi32(xq[m][g * 8 + quad]);
        PACE_UNROLL for (int j = 0; j < NB; ++j)
          acc[c][j][m] = dot_codes<KIND>(acc[c][j][m], w[j], xm);
        if constexpr (SPLIT) {
          const __m512i xlm = _mm512_set1_epi32(xl[m][g * 8 + quad]);
          PACE_UNROLL for (int j = 0; j < NB; ++j)
            low_acc[c][j][m] = dot_codes<KIND>(low_acc[c][j][m], w[j], xlm);
        }
      }
    };
    // total[j][m] += (sum of the chains of j, m, shifted by code_shift times row m's code sum
    // over span `sub`) * block j's scale `s` * row m's activation scale; the chains restart
    auto flush = [&](int j, const __m512 s, int sub) {
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        __m512i sum = widen_codes<KIND>(acc[0][j][m]);
        PACE_UNROLL for (int c = 1; c < CH; ++c)
          sum = _mm512_add_epi32(sum, widen_codes<KIND>(acc[c][j][m]));
        if constexpr (SPLIT) {  // 128 sum(hi) + sum(lo)
          sum = _mm512_slli_epi32(sum, 7);
          PACE_UNROLL for (int c = 0; c < CH; ++c) {
            sum = _mm512_add_epi32(sum, widen_codes<KIND>(low_acc[c][j][m]));
            low_acc[c][j][m] = _mm512_setzero_si512();
          }
        }
        if constexpr (SHIFT)
          sum = _mm512_add_epi32(sum, _mm512_set1_epi32(SHIFT * a.x->span_codes<SUB>(m0 + m, a.G, g, sub)));
        const __m512 sx = _mm512_mul_ps(s, _mm512_set1_ps(a.x->scales[(m0 + m) * a.G + g]));
        total[j][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sx, total[j][m]);
        PACE_UNROLL for (int c = 0; c < CH; ++c) acc[c][j][m] = _mm512_setzero_si512();
      }
    };
    // total[j][m] += block j's min `mn` * row m's activation sum over scale span `sub` (none
    // once folded)
    auto add_min = [&](int j, const __m512 mn, int sub) {
      if constexpr (!FOLD)
        PACE_UNROLL for (int m = 0; m < MT; ++m) {
          const __m512 xsum = _mm512_set1_ps(a.x->span_sum<SUB>(m0 + m, a.G, g, sub));
          total[j][m] = _mm512_fmadd_ps(mn, xsum, total[j][m]);
        }
    };
    if constexpr (BYTES) {  // quad q's codes u (quad_codes), summed as u + SHIFT
      PACE_UNROLL for (int sub = 0; sub < SUB; ++sub) {
        auto quad = [&](int q, auto chain) {
          __m512i w[NB];
          PACE_UNROLL for (int j = 0; j < NB; ++j) w[j] = quad_codes<KIND>(cg[j], q);
          dot4(w, q, chain);
        };
        PACE_UNROLL for (int q = sub * 8 / SUB; q < (sub + 1) * 8 / SUB; q += 4) {
          quad(q, C0{});
          quad(q + 1, C1{});
          quad(q + 2, C2{});
          quad(q + 3, C3{});
        }
        PACE_UNROLL for (int j = 0; j < NB; ++j) {
          flush(j, span_scale<KIND>(tables[j], g, sub), sub);  // byte kinds fold: no min
        }
      }
    } else {
      auto line = [&](int64_t v, auto lo_chain, auto hi_chain) {
        __m512i raw[NB], w[NB];
        PACE_UNROLL for (int j = 0; j < NB; ++j) {
          raw[j] = _mm512_loadu_si512(cg[j] + 64 * v);
          w[j] = _mm512_and_si512(raw[j], low);
        }
        dot4(w, 2 * v, lo_chain);
        PACE_UNROLL for (int j = 0; j < NB; ++j)
          w[j] = _mm512_and_si512(_mm512_srli_epi16(raw[j], 4), low);
        dot4(w, 2 * v + 1, hi_chain);
      };
      line(0, C0{}, C1{});
      line(1, C2{}, C3{});
      line(2, C0{}, C1{});
      line(3, C2{}, C3{});
      PACE_UNROLL for (int j = 0; j < NB; ++j) {
        scales[j].group(tables[j], g);
        flush(j, scales[j].scale, 0);
        add_min(j, scales[j].min, 0);
      }
    }
  }
}

// Whether a kind's tiles on these activations are integer per super-block: the k-quant kinds
// on int8 activations (q4k_tile.h, q6k_tile.h).
template <int KIND, bool SPLIT>
constexpr bool super_tiles() { return is_super_run(KIND) && !SPLIT; }

// A k-quant kind's int8 tile over the row blocks bs[0..NB) against rows [m0, m0 + MT).
template <int KIND, int MT, int NB>
inline void super_blocks(const QArgs& a, const int64_t (&bs)[NB], int64_t m0,
                         __m512 (&total)[NB][MT]) {
  const uint8_t* block[NB];
  PACE_UNROLL for (int j = 0; j < NB; ++j) block[j] = a.w + bs[j] * a.block_stride;
  if constexpr (KIND == KIND_Q4K)
    q4k_tile<MT, NB>(block, a.G, *a.x, a.K, m0, total);
  else
    q6k_tile<MT, NB>(block, a.G, *a.x, a.K, m0, total);
}

// A tile of MT rows x NB blocks from block b: the k-quant kinds on int8 activations per
// super-block (super_blocks), the rest per group (qtile).
template <int KIND, bool SPLIT, int MT, int NB = 1>
inline void tile(const QArgs& a, int64_t b, int64_t m0, __m512 (&total)[NB][MT]) {
  if constexpr (super_tiles<KIND, SPLIT>()) {
    int64_t bs[NB];
    PACE_UNROLL for (int j = 0; j < NB; ++j) bs[j] = b + j;
    super_blocks<KIND, MT, NB>(a, bs, m0, total);
  } else {
    qtile<KIND, SPLIT, MT, NB>(a, b, m0, total);
  }
}

template <typename T>
struct QStore {
  T* y;
  int64_t ldy;
  const float* bias;
  int64_t n;

  template <int MT>
  inline void operator()(__m512 (&total)[MT], int64_t b, int64_t m0) const {
    const int64_t col = b * 16;
    const __mmask16 mask = lane_mask(n - col);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + col) : _mm512_setzero_ps();
    PACE_UNROLL for (int m = 0; m < MT; ++m)
      store(y + (m0 + m) * ldy + col, _mm512_add_ps(total[m], bv), mask);
  }
};

template <int KIND, bool SPLIT, int MT, typename Store>
inline void rows_tail(const QArgs& a, const Store& st, int64_t b, int64_t m0, int64_t mt) {
  if constexpr (MT > 0) {
    if (mt == MT) {
      __m512 total[1][MT];
      tile<KIND, SPLIT, MT>(a, b, m0, total);
      st.template operator()<MT>(total[0], b, m0);
    } else {
      rows_tail<KIND, SPLIT, MT - 1>(a, st, b, m0, mt);
    }
  }
}

// One activation row against blocks bs[0..NB) side by side, stored.
template <int KIND, bool SPLIT, int NB, typename Store>
inline void qrow_step(const QArgs& a, const Store& st, const int64_t (&bs)[NB]) {
  __m512 total[NB][1];
  if constexpr (super_tiles<KIND, SPLIT>())  // a tile of one row
    super_blocks<KIND, 1, NB>(a, bs, 0, total);
  else
    qrow<KIND, SPLIT, NB>(a, bs, total);
  PACE_UNROLL for (int j = 0; j < NB; ++j) st.template operator()<1>(total[j], bs[j], 0);
}

// One activation row (the decode GEMV): a thread's blocks [b, end) as NB contiguous runs read
// side by side (NB streams), step i taking block i of each run, then the few blocks left over
// one at a time: jobs [0, steps(b, end)) of qrow_job, in order.
template <int NB>
constexpr int64_t qrow_steps(int64_t b, int64_t end) {
  return (end - b) / NB + (end - b) % NB;
}
template <int KIND, bool SPLIT, int NB, typename Store>
inline void qrow_job(const QArgs& a, const Store& st, int64_t b, int64_t end, int64_t k) {
  const int64_t run = (end - b) / NB;
  if (k < run) {
    int64_t bs[NB];
    PACE_UNROLL for (int j = 0; j < NB; ++j) bs[j] = b + j * run + k;
    qrow_step<KIND, SPLIT, NB>(a, st, bs);
  } else {
    const int64_t one[1] = {b + NB * run + (k - run)};
    qrow_step<KIND, SPLIT, 1>(a, st, one);
  }
}

// Activation code bytes a thread's tiles keep in L2 while they walk its row blocks: with all
// rows at once, 512 rows of K = 1536 (1.5 MB split) were re-read from L3 for every block.
constexpr int64_t ROW_CHUNK_BYTES = 256 * 1024;

// A thread's blocks [b, end) against the rows [r0, r1): tiles of MT rows x NB blocks side by
// side, the blocks left over one at a time, the rows left over (fewer than MT) block by block.
template <int KIND, bool SPLIT, int MT, int NB, typename Store>
inline void qblocks(const QArgs& a, const Store& st, int64_t b, int64_t end, int64_t r0,
                    int64_t r1) {
  for (; b + NB <= end; b += NB) {
    int64_t m0 = r0;
    for (; m0 + MT <= r1; m0 += MT) {
      __m512 total[NB][MT];
      tile<KIND, SPLIT, MT, NB>(a, b, m0, total);
      PACE_UNROLL for (int j = 0; j < NB; ++j) st.template operator()<MT>(total[j], b + j, m0);
    }
    if (m0 < r1)
      for (int j = 0; j < NB; ++j) rows_tail<KIND, SPLIT, MT - 1>(a, st, b + j, m0, r1 - m0);
  }
  if constexpr (NB > 1) qblocks<KIND, SPLIT, MT, 1>(a, st, b, end, r0, r1);
}

// Row blocks side by side in a tile of 4 int8 activation rows, per kind as measured (1 Zen 4
// core, 2048 x 8192 and 8192 x 2048, M 32-512, GFLOP/s at 1 / 2 / 3 blocks): folded q8_0
// 233-304 / 278-334 / 262-324, q4_0 246-307 / 294-326 / 292-323, q6_k 169-211 / 206-237 /
// 207-232; q4_k per super-block (q4k_tile.h) 214-245 / 243-332 / 249-324 (4 rows x 2 blocks
// spill nothing in the inner loop; 8 x 1 gave 216-257, 2 x 4 204-270); int4 with mins (not
// folded) one. 15-bit activations take one.
constexpr int tile_blocks(int kind) { return kind == KIND_INT4 ? 1 : 2; }

// Rows per tile: 4 on AVX-512 (its 32 registers); 2 on the avx2 target, whose 16 registers of
// half the width hold half as many accumulators.
#if defined(__AVX512F__)
constexpr int QTILE_ROWS = 4;
#else
constexpr int QTILE_ROWS = 2;
#endif

// Whether a call's 15-bit activation rows go to the word tiles (qwords_tile.h): the avx2
// build, 2 rows or more (one row keeps the planes of the decode GEMV), unless tuned off.
inline bool word_tiles(bool split, int64_t M) {
#if defined(__AVX512F__)
  return false;
#else
  return split && M > 1 && tuning().qword_tiles;
#endif
}

#if !defined(__AVX512F__)
// Block b against rows [m0, m0 + mt) (mt <= MT) as one word tile of mt rows.
template <int KIND, int MT, typename Store>
inline void words_rows(const QArgs& a, const Store& st, int64_t b, const uint8_t* merged,
                       int64_t m0, int64_t mt) {
  if constexpr (MT > 0) {
    if (mt == MT) {
      __m512 total[MT];
      qwords_tile<KIND, MT>(a.w + b * a.block_stride, merged, a.G, *a.x, a.K, m0, total);
      st.template operator()<MT>(total, b, m0);
    } else {
      words_rows<KIND, MT - 1>(a, st, b, merged, m0, mt);
    }
  }
}

// Rows per word tile (x 8 weight rows: 2 int32 accumulators a row): 4 measured at or above
// 2 and 3 on one Zen 3 core; a tile of 2 rows x a whole block (16 weight rows) ran as 4.
constexpr int WORD_TILE_ROWS = 4;

// A thread's blocks [b, end) against rows [r0, r1) in word tiles, KIND_Q6's codes merged to
// bytes once per block (merge_q6_codes) for all of its tiles.
template <int KIND, typename Store>
inline void qword_blocks(const QArgs& a, const Store& st, int64_t b, int64_t end, int64_t r0,
                         int64_t r1) {
  thread_local std::vector<uint8_t> merged;
  if constexpr (KIND == KIND_Q6) merged.resize(a.G * 512);
  for (; b < end; ++b) {
    if constexpr (KIND == KIND_Q6) merge_q6_codes(a.w + b * a.block_stride, a.G, merged.data());
    for (int64_t m0 = r0; m0 < r1; m0 += WORD_TILE_ROWS)
      words_rows<KIND, WORD_TILE_ROWS>(a, st, b, merged.data(), m0,
                                       std::min<int64_t>(WORD_TILE_ROWS, r1 - m0));
  }
}
#endif

// Blocks [b, end) against rows [r0, r1) in the call's tiles: the avx2 build's word tiles, or
// tiles of MT rows x `wide` blocks side by side (1 on 15-bit planes).
template <int KIND, bool SPLIT, typename Store>
inline void qtiles(const QArgs& a, const Store& st, int64_t b, int64_t end, int64_t r0,
                   int64_t r1, int64_t wide) {
  constexpr int MT = QTILE_ROWS;
#if !defined(__AVX512F__)
  if (word_tiles(SPLIT, a.M)) {
    qword_blocks<KIND>(a, st, b, end, r0, r1);
    return;
  }
#endif
  if (!SPLIT && wide == 3)
    qblocks<KIND, SPLIT, MT, SPLIT ? 1 : 3>(a, st, b, end, r0, r1);
  else if (!SPLIT && wide == 2)
    qblocks<KIND, SPLIT, MT, SPLIT ? 1 : 2>(a, st, b, end, r0, r1);
  else
    qblocks<KIND, SPLIT, MT, 1>(a, st, b, end, r0, r1);
}

// Each thread its contiguous range of blocks, in jobs: the decode GEMV's steps (qrow_job);
// for more rows one tile's width of blocks, row chunk after row chunk (the activation codes of
// a chunk stay in L2 across the thread's blocks). With work stealing (work_ranges.h): a
// thread done with its jobs takes the others' last ones, so a thread the OS preempts (a shared
// host, the server's own threads) no longer holds the other at the end of the call.
template <int KIND, bool SPLIT, typename Store>
void qdrive(const QArgs& a, const Store& st, int64_t M, int64_t blocks, int nthreads) {
  const auto first = [&](int64_t t) { return blocks * t / nthreads; };
  std::vector<int64_t> sizes(nthreads);
  if (M == 1) {
    constexpr int NB = 4;
    for (int t = 0; t < nthreads; ++t) sizes[t] = qrow_steps<NB>(first(t), first(t + 1));
    StealRanges work(sizes);
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    work.drain(omp_get_thread_num(), [&](int u, int64_t k, bool) {
      qrow_job<KIND, SPLIT, NB>(a, st, first(u), first(u + 1), k);
    });
    return;
  }
  constexpr int MT = QTILE_ROWS;
  const int64_t wide = tuning().qtile_blocks ? tuning().qtile_blocks : tile_blocks(KIND);
  const int64_t unit = SPLIT ? 1 : wide;  // blocks per job
  const int64_t chunk = std::max<int64_t>(MT, ROW_CHUNK_BYTES / ((SPLIT ? 2 : 1) * a.K) / MT * MT);
  const int64_t chunks = (M + chunk - 1) / chunk;
  const auto jobs = [&](int64_t t) { return (first(t + 1) - first(t) + unit - 1) / unit; };
  for (int t = 0; t < nthreads; ++t) sizes[t] = jobs(t) * chunks;
  StealRanges work(sizes);
  const auto run = [&](int u, int64_t k, bool) {  // job k of thread u: chunk-major
    const int64_t per = jobs(u), c = k / per, b = first(u) + k % per * unit;
    const int64_t r0 = c * chunk;
    qtiles<KIND, SPLIT>(a, st, b, std::min(first(u + 1), b + unit), r0, std::min(M, r0 + chunk),
                        wide);
  };
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  work.drain(omp_get_thread_num(), run);
}

// k per activation scale: the k-quant kinds' int8 tiles take one per super-block.
template <int KIND, bool SPLIT>
constexpr int64_t activation_span() { return super_tiles<KIND, SPLIT>() ? 256 : QGROUP; }

// Quantize the activation rows (into the per-thread buffer reused across calls: no allocation
// per decode step), then run the tiles.
template <int KIND, bool SPLIT, typename T>
void qlinear_kind(const T* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                  int64_t block_stride, const QStore<T>& st, int64_t N, int nthreads,
                  const float* act_scales) {
  QuantizedRows& rows = scratch_rows();
  const int64_t blocks = (N + 15) / 16;
  const int nt = pick_threads(nthreads, blocks * block_stride, M, blocks);
  quantize_rows<SPLIT>(x, ldx, M, K, rows, nt, act_scales, activation_span<KIND, SPLIT>(),
                       word_tiles(SPLIT, M));
  const QArgs a{w, block_stride, K / QGROUP, &rows, K, M};
  qdrive<KIND, SPLIT>(a, st, M, blocks, nt);
}

// 15-bit split activations, or int8 (`int8_act`: bf16 rows under PACE_QUANT_ACTIVATIONS=int8,
// and rows of either dtype against W8A8 weights).
template <int KIND, typename T>
void qlinear_rows(const T* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                  int64_t block_stride, bool int8_act, const QStore<T>& st, int64_t N,
                  int nthreads, const float* act_scales) {
  if (int8_act)
    qlinear_kind<KIND, false>(x, ldx, M, K, w, block_stride, st, N, nthreads, act_scales);
  else
    qlinear_kind<KIND, true>(x, ldx, M, K, w, block_stride, st, N, nthreads, nullptr);
}

template <typename T>
void qlinear(const T* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
             int64_t block_stride, int kind, bool int8_act, const float* bias, int64_t N, T* y,
             int64_t ldy, int nthreads, const float* act_scales) {
  if (kind == KIND_W8A8) {  // int8 activations in every dtype (igemm.cpp)
    if constexpr (std::is_same_v<T, bf16_t>)
      w8a8_linear_bf16(x, ldx, M, K, w, block_stride, bias, N, y, ldy, nthreads, act_scales);
    else
      w8a8_linear_fp32(x, ldx, M, K, w, block_stride, bias, N, y, ldy, nthreads, act_scales);
    return;
  }
  if constexpr (std::is_same_v<T, bf16_t>) {  // prefill on AVX512-BF16: dense bf16 tiles
    if (!int8_act &&
        qlinear_bf16_panel(x, ldx, M, K, w, block_stride, kind, bias, N, y, ldy, nthreads))
      return;
  }
  const QStore<T> st{y, ldy, bias, N};
  by_kind(kind, [&](auto k) {
    qlinear_rows<decltype(k)::value>(x, ldx, M, K, w, block_stride, int8_act, st, N, nthreads,
                                     act_scales);
  });
}

// Row `lane` of a packed row block, de-quantized to fp32 [G * 32].
template <int KIND>
void packed_row(const uint8_t* block, int64_t G, int64_t lane, float* row) {
  constexpr int SUB = qscales_per_group(KIND);
  QScales<KIND> scales;  // 4-bit kinds
  alignas(64) float s4[16], m4[16];
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* cg = qgroup_codes<KIND>(block, G, g) + 4 * lane;
    const uint16_t* tables = qgroup_tables<KIND>(block, g);  // scales [SUB][16], mins [16]
    if constexpr (!is_byte_coded(KIND)) {
      scales.group(tables, g);
      _mm512_store_ps(s4, scales.scale);
      _mm512_store_ps(m4, scales.min);
    }
    for (int64_t k = 0; k < QGROUP; ++k) {
      const int64_t quad = k / 4, e = k % 4;
      const int span = k * SUB / QGROUP;
      float scale;  // byte-coded kinds: span_scale's value for this row
      if constexpr (KIND == KIND_Q6)
        scale = _cvtsh_ss(tables[lane]) * (float)q6_sub_scales(tables, 2 * (g % 8) + span)[lane];
      else
        scale = _cvtsh_ss(tables[span * 16 + lane]);
      float v;
      if constexpr (is_int8(KIND)) {  // u = q + 128
        v = (float)((int)cg[64 * quad + e] - 128) * scale;
      } else if constexpr (KIND == KIND_Q6) {  // u = nibble | high 2 bits << 4 (qblock.h)
        const uint8_t byte = cg[q6_nibble_line(quad / 2) + e];
        const uint8_t high = cg[q6_high_line(quad / 4) + e];
        const int u = (quad % 2 ? byte >> 4 : byte & 0x0F) | ((high >> (2 * (quad % 4))) & 3) << 4;
        v = (float)(u - 32) * scale;
      } else {  // line quad / 2: even quads in the low nibbles; u s + m as GGUF (no FMA)
        const uint8_t byte = cg[64 * (quad / 2) + e];
        v = (float)(quad % 2 ? byte >> 4 : byte & 0x0F) * s4[lane];
        v = v + m4[lane];
      }
      row[g * QGROUP + k] = v;
    }
  }
}

}  // namespace

void qpacked_rows(const uint8_t* w, int64_t block_stride, int kind, int64_t K,
                  const int64_t* ids, int64_t n, float* out, int nthreads) {
  if (kind == KIND_W8A8) return w8a8_rows(w, block_stride, K, ids, n, out, nthreads);
  const int64_t G = K / QGROUP;
  const auto row = by_kind(kind, [](auto k) { return &packed_row<decltype(k)::value>; });
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, n / 16));
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < n; ++i) row(w + (ids[i] / 16) * block_stride, G, ids[i] % 16, out + i * K);
}

void qlinear_bf16(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                  int64_t block_stride, int kind, bool int8_act, const float* bias, int64_t N,
                  bf16_t* y, int64_t ldy, int nthreads, const float* act_scales) {
  qlinear(x, ldx, M, K, w, block_stride, kind, int8_act, bias, N, y, ldy, nthreads, act_scales);
}

void qlinear_fp32(const float* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                  int64_t block_stride, int kind, bool int8_act, const float* bias, int64_t N,
                  float* y, int64_t ldy, int nthreads, const float* act_scales) {
  qlinear(x, ldx, M, K, w, block_stride, kind, int8_act, bias, N, y, ldy, nthreads, act_scales);
}

}  // namespace pace_avx512

PACE_VNNI_END
