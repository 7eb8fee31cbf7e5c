// Attention of a few (decode) or many (prefill) queries over a KV cache with GQA, a boolean
// mask (True = attend) and optional sinks, as pace_native.kernels.attention. The cache is
// contiguous [B, Hk, S, D] or a block pool (paged / slab layouts) read through the block table
// in place: no gather.
//
// One work item is (batch row, KV head, tile of query positions): all `group * tile` query
// rows of that KV head use each block of BS keys/values while it is in L1, so K and V are read
// once per KV head (bf16 blocks are widened to fp32 once, for all rows; items of few rows
// widen bf16 value pairs in registers instead, and key pairs too without AVX512-BF16:
// attention_pairs.h; int8 KV rows are de-quantized in registers or, for prefill tiles, once
// per block: attention_int8.h). Only the keys some row of the tile may see are visited (a causal
// prefill tile stops at its last position). Scores of 16 keys come from 16 partial dot
// products reduced together (no per-key horizontal sum); an
// online softmax (running max m, running sum l, rescaled accumulator) means no [rows, S] score
// matrix is kept (flash-attention style). A sink joins the softmax denominator only: it starts
// as (m = sink, l = 1). All math is fp32. Decode items first load their live K/V rows into
// L2 with a load loop over many runs at once (warm_item: the scoring loop alone keeps too few
// DRAM misses in flight), and threads that finish their range of items take the others'.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "attention_int8.h"
#include "attention_pairs.h"
#include "kernels.h"
#include "simd.h"
#include "work_ranges.h"

namespace pace_avx512 {
namespace {

#define ALWAYS_INLINE inline __attribute__((always_inline))

constexpr int64_t BS = 64;  // keys per online-softmax block
constexpr float NINF = -std::numeric_limits<float>::infinity();

// Whether bf16 scores come from vdpbf16ps on the bf16 query and key rows (else fp32 rows).
template <typename T>
#ifdef PACE_HAS_BF16
constexpr bool kDotBf16 = std::is_same_v<T, bf16_t>;
#else
constexpr bool kDotBf16 = false;
#endif

// Bytes [0, n) of a 64-byte vector (n may exceed 64).
static inline __mmask64 bytes_mask(int64_t n) {
  return n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
}

// Mask bits of up to 16 keys (True = attend) starting at `m` with element stride `stride`.
static inline __mmask16 mask_bits(const bool* m, int64_t stride, int64_t n) {
  if (stride == 1) {
    const __m128i v = _mm_maskz_loadu_epi8(lane_mask(n), m);
    return _mm_test_epi8_mask(v, v);
  }
  __mmask16 bits = 0;
  for (int64_t j = 0; j < n; ++j) bits |= (__mmask16)((m[j * stride] ? 1u : 0u) << j);
  return bits;
}

// Key or value row s of (batch row b, KV head g). Without a block table the cache is
// [B, Hk, S, D] (strides st = b, h, s); with one it is a pool [blocks, Hk, block_size, D]
// (st = block, h, s) and key s of row b lives in block table[b, s / block_size]. E is the
// cache's element: T, or int8_t for int8 KV rows (D values, then their fp32 scale).
template <typename E, typename T>
ALWAYS_INLINE const E* kv_row(const E* base, const int64_t (&st)[3], const AttnArgs<T>& a,
                              int64_t b, int64_t g, int64_t s) {
  return a.table == nullptr ? base + b * st[0] + g * st[1] + s * st[2]
                            : base + a.table[b * a.table_stride + s / a.block_size] * st[0] +
                                  g * st[1] + (s % a.block_size) * st[2];
}

// Rows s0 .. s0+n-1 of K or V for (b, g) as pointers into the cache (no conversion): one
// table lookup per run of keys within a block, not a division per key (on the decode path
// that division and lookup took a fifth of the attention time).
template <typename E, typename T>
inline void rows_raw(const E* base, const int64_t (&st)[3], const AttnArgs<T>& a, int64_t b,
                     int64_t g, int64_t s0, int64_t n, const E* (&out)[BS]) {
  for (int64_t j = 0; j < n;) {
    const int64_t s = s0 + j;
    const int64_t run =
        a.table == nullptr ? n - j : std::min(n - j, a.block_size - s % a.block_size);
    const E* row = kv_row(base, st, a, b, g, s);
    for (int64_t i = 0; i < run; ++i) out[j + i] = row + i * st[2];
    j += run;
  }
}

// Rows s0 .. s0+n-1 of K or V for (b, g) as fp32 row pointers: bf16 is widened once into
// `scratch` (shared by all query rows of the group), fp32 is read in place.
template <typename T>
inline void rows_fp32(const T* base, const int64_t (&st)[3], const AttnArgs<T>& a, int64_t b,
                      int64_t g, int64_t s0, int64_t n, int64_t D, int64_t Dp, float* scratch,
                      const float* (&out)[BS]) {
  const T* src[BS];
  rows_raw(base, st, a, b, g, s0, n, src);
  for (int64_t j = 0; j < n; ++j) {
    if constexpr (std::is_same_v<T, float>) {
      out[j] = src[j];
    } else {
      for (int64_t i = 0; i < Dp; i += 16)
        _mm512_storeu_ps(scratch + j * Dp + i, load(src[j] + i, lane_mask(D - i)));
      out[j] = scratch + j * Dp;
    }
  }
}

// Rows s0 .. s0+n-1 of int8 K or V rows (kv_cache_dtype "int8": D int8 values, then an fp32
// scale per group of 32) for (b, g) de-quantized into `scratch` as fp32 rows q * scale,
// exactly as pace_core/caches/kv_quant.py reads them, once for all query rows of the group.
template <typename T>
inline void rows_int8(const int8_t* base, const int64_t (&st)[3], const AttnArgs<T>& a, int64_t b,
                      int64_t g, int64_t s0, int64_t n, int64_t D, int64_t Dp, float* scratch,
                      const float* (&out)[BS]) {
  const int8_t* src[BS];
  rows_raw(base, st, a, b, g, s0, n, src);
  if (D % KV8_GROUP == 0) {  // whole groups: one scale broadcast per 32 values, no masks
    for (int64_t j = 0; j < n; ++j) {
      float* dst = scratch + j * Dp;
      for (int64_t i = 0; i < D; i += KV8_GROUP) kv8::dequant_group(src[j], D, i, dst + i, dst + i + 16);
      out[j] = dst;
    }
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const int8_t* scales = src[j] + D;
    float* dst = scratch + j * Dp;
    for (int64_t i = 0; i < Dp; i += 16) {
      float scale;
      std::memcpy(&scale, scales + 4 * (i / KV8_GROUP), sizeof(float));
      const __m512i q = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(lane_mask(D - i), src[j] + i));
      _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(scale)));
    }
    out[j] = dst;
  }
}

// Keys [lo, hi) that any of the query rows t0 .. t0+nt-1 of batch row b may attend: keys
// outside are skipped entirely (causal prefill tiles, ragged rows, sliding windows).
template <typename T>
void live_keys(const AttnArgs<T>& a, int64_t b, int64_t t0, int64_t nt, int64_t& lo,
               int64_t& hi) {
  lo = a.s, hi = 0;
  for (int64_t t = t0; t < t0 + nt; ++t) {
    const bool* m = a.mask + b * a.ms[0] + t * a.ms[1];
    int64_t first = 0, last = a.s;
    if (a.ms[2] == 1) {  // 64 mask bytes per test
      while (first < a.s && !_mm512_test_epi8_mask(_mm512_maskz_loadu_epi8(bytes_mask(a.s - first), m + first),
                                                   _mm512_set1_epi8(1))) first += 64;
      while (last > first) {
        const int64_t n = std::min<int64_t>(64, last - first);
        const __mmask64 live = _mm512_test_epi8_mask(_mm512_maskz_loadu_epi8(bytes_mask(n), m + last - n),
                                                     _mm512_set1_epi8(1));
        if (live) {
          last = last - n + 64 - __builtin_clzll(live);  // one past the highest live byte
          break;
        }
        last -= n;
      }
      first = std::min(first, a.s);
      if (last > first)
        while (!m[first]) ++first;
    } else {
      while (first < a.s && !m[first * a.ms[2]]) ++first;
      while (last > first && !m[(last - 1) * a.ms[2]]) --last;
    }
    if (last > first) lo = std::min(lo, first), hi = std::max(hi, last);
  }
  if (hi <= lo) lo = hi = 0;
}

// Scores of keys[0 .. nk) (nk <= 16) for one query row, as 16 lanes: 16 partial dot products
// reduced together. bf16 caches with AVX512-BF16 dot the bf16 query and key rows directly
// (vdpbf16ps: exact products, fp32 sums; no widening), the others read fp32 rows.
struct ScoreRow {
  const float* qf;    // scaled fp32 query row [Dp]
  const bf16_t* qb;   // raw bf16 query row or null
  float scale;
  int64_t D;

  inline __m512 operator()(const float* const* keys, int64_t nk) const {
    __m512 dots[16];
    for (int j = 0; j < 16; ++j) dots[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < D; i += 16) {
      const __mmask16 mk = lane_mask(D - i);
      const __m512 qv = _mm512_loadu_ps(qf + i);
      for (int j = 0; j < 16; ++j)
        if (j < nk) dots[j] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(mk, keys[j] + i), dots[j]);
    }
    return reduce16(dots);
  }

  inline __m512 operator()(const bf16_t* const* keys, int64_t nk) const {
    __m512 dots[16];
    for (int j = 0; j < 16; ++j) dots[j] = _mm512_setzero_ps();
#ifdef PACE_HAS_BF16
    for (int64_t i = 0; i < D; i += 32) {
      const __mmask32 mk = D - i >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << (D - i)) - 1);
      const __m512bh qv = (__m512bh)_mm512_maskz_loadu_epi16(mk, qb + i);
      for (int j = 0; j < 16; ++j)
        if (j < nk)
          dots[j] = _mm512_dpbf16_ps(dots[j], qv, (__m512bh)_mm512_maskz_loadu_epi16(mk, keys[j] + i));
    }
#else
    (void)keys, (void)nk;  // never called: the fp32 overload runs on widened keys
#endif
    return _mm512_mul_ps(reduce16(dots), _mm512_set1_ps(scale));
  }
};

// Prefill tiles (>= TILE_ROWS query rows per KV head) compute scores and P.V as small GEMMs:
// 4 query rows x up to 64 keys (scores) or 64 output dims (P.V) of fp32 accumulators, so each
// loaded key / value vector feeds 4 rows and no horizontal sums are needed.
constexpr int64_t TILE_ROWS = 16;
// Items of at most this many query rows read bf16 keys and values as pairs in registers on
// CPUs without AVX512-BF16 (attention_pairs.h); larger ones widen each block once for all rows.
constexpr int64_t PAIR_ROWS = 8;

// The block's bf16 keys as 32-bit k-pairs, key-minor: kt[p * 64 + j] = (k_j[2p], k_j[2p+1]);
// keys past n are zero.
inline void pack_key_pairs(const bf16_t* const* keys, int64_t n, int64_t pairs, uint32_t* kt) {
  for (int64_t p = 0; p < pairs; ++p) {
    uint32_t* dst = kt + p * 64;
    for (int64_t j = 0; j < n; ++j) std::memcpy(dst + j, keys[j] + 2 * p, 4);
    for (int64_t j = n; j < 64; ++j) dst[j] = 0;
  }
}

// Raw scores of rows r0..r0+3 against NC chunks of 16 keys: acc = q . k by vdpbf16ps over the
// packed pairs (q read as 32-bit pairs straight from the bf16 query rows).
template <int NC>
inline void score_tile(const uint32_t* const* qw, const uint32_t* kt, int64_t pairs, float* out) {
#ifdef PACE_HAS_BF16
  __m512 acc[4][NC];  // local and fixed-size: stays in registers through the k loop
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) acc[i][c] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh kv[NC];
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) kv[c] = (__m512bh)_mm512_loadu_si512(kt + p * 64 + 16 * c);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m512bh qb = (__m512bh)_mm512_set1_epi32((int)qw[i][p]);
#pragma GCC unroll 4
      for (int c = 0; c < NC; ++c) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], qb, kv[c]);
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out + i * 64 + 16 * c, acc[i][c]);
#else
  (void)qw, (void)kt, (void)pairs, (void)out;
#endif
}

// Values [d, d + 16 ND) of a value row as ND fp32 vectors: fp32 rows masked at D, int8 rows
// de-quantized in registers (attention_int8.h).
template <int ND>
ALWAYS_INLINE void value_chunk(const float* row, int64_t D, int64_t d, __m512 (&v)[ND]) {
  for (int c = 0; c < ND; ++c) v[c] = _mm512_maskz_loadu_ps(lane_mask(D - d - 16 * c), row + d + 16 * c);
}
template <int ND>
ALWAYS_INLINE void value_chunk(const int8_t* row, int64_t D, int64_t d, __m512 (&v)[ND]) {
  kv8::dequant_chunk<ND>(row, D, d, v);
}

// acc[r0+i][d0 .. d0+16*ND) += sum_j p[r0+i][j] * v_j[d0 ..] for R <= 4 rows at once: each
// value vector is loaded (or de-quantized) once for all R rows (decode GQA groups of 1-3
// rows, 4-row tiles).
template <int R, int ND, typename V>
inline void pv_tile(float* acc, int64_t Dp, const float* sc, int64_t r0, int64_t n,
                    const V* const* vals, int64_t d0, int64_t D) {
  __m512 o[R][ND];
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < ND; ++c) o[i][c] = _mm512_loadu_ps(acc + (r0 + i) * Dp + d0 + 16 * c);
  for (int64_t j = 0; j < n; ++j) {
    __m512 v[ND];
    value_chunk<ND>(vals[j], D, d0, v);
    for (int i = 0; i < R; ++i) {
      const __m512 pj = _mm512_set1_ps(sc[(r0 + i) * BS + j]);
      for (int c = 0; c < ND; ++c) o[i][c] = _mm512_fmadd_ps(pj, v[c], o[i][c]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < ND; ++c) _mm512_storeu_ps(acc + (r0 + i) * Dp + d0 + 16 * c, o[i][c]);
}

// pv_tile over the output dims [0, Dp) in chunks of up to 64, for R rows from r0.
template <int R, typename V>
ALWAYS_INLINE void pv_rows(float* acc, int64_t Dp, const float* sc, int64_t r0, int64_t n,
                           const V* const* vals, int64_t D) {
  for (int64_t d0 = 0; d0 < Dp; d0 += 64) {
    if constexpr (std::is_same_v<V, int8_t>) {  // D % 32 == 0: chunks of 32 or 64
      if (Dp - d0 >= 64) pv_tile<R, 4>(acc, Dp, sc, r0, n, vals, d0, D);
      else pv_tile<R, 2>(acc, Dp, sc, r0, n, vals, d0, D);
    } else {
      switch (std::min<int64_t>(4, (Dp - d0) / 16)) {
        case 1: pv_tile<R, 1>(acc, Dp, sc, r0, n, vals, d0, D); break;
        case 2: pv_tile<R, 2>(acc, Dp, sc, r0, n, vals, d0, D); break;
        case 3: pv_tile<R, 3>(acc, Dp, sc, r0, n, vals, d0, D); break;
        default: pv_tile<R, 4>(acc, Dp, sc, r0, n, vals, d0, D); break;
      }
    }
  }
}

// Keys and values of every (row, KV head) prepared once for all the query tiles of a prefill
// (instead of once per tile): key pairs packed per 64-key block (int8 keys as [hi, lo] rows),
// values widened or de-quantized to fp32.
struct Prepared {
  const uint32_t* kt = nullptr;  // [heads][blocks][pairs][64]
  const float* v = nullptr;      // [heads][blocks * 64][Dp]
  int64_t blocks = 0;
  int64_t pairs = 0;  // key pairs per packed row: D / 2, or D for int8 keys (split_int8_keys)
};

// Running softmax state of one query row: max m, sum l, unnormalised output acc [Dp].
struct Partial {
  float* acc;
  float* m;
  float* l;
};

// The query rows of one work item and their scratch: row r is head g * group + r / nt at
// position t0 + r % nt of batch row b.
template <typename T>
struct ItemRows {
  const AttnArgs<T>& a;
  int64_t b, g, t0, nt, group, rows, D, Dp;
  float* qf;   // [rows, Dp] scaled queries
  float* acc;  // [rows, Dp] unnormalised outputs
  float* sc;   // [rows, BS] scores, then probabilities, of the block
  float* m;    // [rows] running max
  float* l;    // [rows] running sum

  int64_t head(int64_t r) const { return g * group + r / nt; }
  int64_t pos(int64_t r) const { return t0 + r % nt; }
  const T* query(int64_t r) const { return a.q + b * a.qs[0] + head(r) * a.qs[1] + pos(r) * a.qs[2]; }
  const bool* mask(int64_t r, int64_t s) const {
    return a.mask + b * a.ms[0] + pos(r) * a.ms[1] + s * a.ms[2];
  }
};

// Zero accumulators, the scaled fp32 queries, and the softmax state of every row: a sink
// starts it as (m = sink, l = 1) in the item that starts the row's softmax, else (-inf, 0).
template <typename T>
ALWAYS_INLINE void start_rows(const ItemRows<T>& it, bool with_sinks) {
  const AttnArgs<T>& a = it.a;
  const __m512 vscale = _mm512_set1_ps(a.scale);
  std::fill(it.acc, it.acc + it.rows * it.Dp, 0.0f);
  for (int64_t r = 0; r < it.rows; ++r) {
    const T* src = it.query(r);
    for (int64_t i = 0; i < it.Dp; i += 16)
      _mm512_storeu_ps(it.qf + r * it.Dp + i, _mm512_mul_ps(load(src + i, lane_mask(it.D - i)), vscale));
    it.m[r] = with_sinks && a.sinks ? a.sinks[it.head(r)] : NINF;
    it.l[r] = with_sinks && a.sinks ? 1.0f : 0.0f;
  }
}

// Scores of the block's n keys (packed pairs kt) for the rows in groups of 4 (score_tile,
// bf16 only); returns the number of rows scored. With `qdup` (int8 keys split into [hi, lo],
// split_int8_keys) the query rows are read from there as [q, q], rows of 2D values.
template <typename T>
ALWAYS_INLINE int64_t tile_scores(const ItemRows<T>& it, int64_t s0, int64_t n, const uint32_t* kt,
                                  const bf16_t* qdup = nullptr) {
  const AttnArgs<T>& a = it.a;
  const int64_t nc = (n + 15) / 16, pairs = qdup ? it.D : it.D / 2;
  int64_t r_done = 0;
  for (; r_done + 4 <= it.rows; r_done += 4) {
    const uint32_t* qw[4];
    for (int i = 0; i < 4; ++i)
      qw[i] = qdup ? reinterpret_cast<const uint32_t*>(qdup + (r_done + i) * 2 * it.D)
                   : reinterpret_cast<const uint32_t*>(it.query(r_done + i));
    alignas(64) float tile[4 * 64];
    switch (nc) {
      case 1: score_tile<1>(qw, kt, pairs, tile); break;
      case 2: score_tile<2>(qw, kt, pairs, tile); break;
      case 3: score_tile<3>(qw, kt, pairs, tile); break;
      default: score_tile<4>(qw, kt, pairs, tile); break;
    }
    for (int i = 0; i < 4; ++i) {
      const int64_t r = r_done + i;
      for (int64_t c = 0; c < nc; ++c) {
        const int64_t j0 = 16 * c, nk = std::min<int64_t>(16, n - j0);
        const __mmask16 live = mask_bits(it.mask(r, s0 + j0), a.ms[2], nk);
        const __m512 sv = _mm512_mask_mov_ps(_mm512_set1_ps(NINF), live,
                                             _mm512_mul_ps(_mm512_load_ps(tile + i * 64 + 16 * c),
                                                           _mm512_set1_ps(a.scale)));
        _mm512_mask_storeu_ps(it.sc + r * BS + j0, lane_mask(nk), sv);
      }
    }
  }
  return r_done;
}

// Scores of the block's n keys for rows r0 .. rows-1, 16 keys at a time (ScoreRow): bf16 key
// rows `bkeys` read in place by vdpbf16ps, else the fp32 rows `keys`. Masked keys get -inf.
template <typename T>
ALWAYS_INLINE void row_scores(const ItemRows<T>& it, int64_t s0, int64_t n, int64_t r0,
                              const float* const* keys, const bf16_t* const* bkeys, bool dot_bf16) {
  const AttnArgs<T>& a = it.a;
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int64_t nk = std::min<int64_t>(16, n - j0);
    for (int64_t r = r0; r < it.rows; ++r) {
      const __mmask16 live = mask_bits(it.mask(r, s0 + j0), a.ms[2], nk);
      __m512 s = _mm512_set1_ps(NINF);
      if (live) {
        const ScoreRow score{it.qf + r * it.Dp, reinterpret_cast<const bf16_t*>(it.query(r)),
                             a.scale, it.D};
        s = _mm512_mask_mov_ps(s, live, dot_bf16 ? score(bkeys + j0, nk) : score(keys + j0, nk));
      }
      _mm512_mask_storeu_ps(it.sc + r * BS + j0, lane_mask(nk), s);
    }
  }
}

// Scores of the block's n int8 keys (D a multiple of 32) for R rows from r0, 16 keys at a
// time: each group of 32 values of a key is de-quantized in registers once for the R rows
// and dotted with their scaled fp32 queries (kv8::key_dots, in ScoreRow's order).
template <int R, typename T>
inline void int8_score_rows(const ItemRows<T>& it, int64_t s0, int64_t n, int64_t r0,
                            const int8_t* const* keys) {
  const AttnArgs<T>& a = it.a;
  const int64_t D = it.D, Dp = it.Dp;
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int64_t nk = std::min<int64_t>(16, n - j0);
    __m512 dots[R][16];
    for (int64_t j = 0; j < 16; ++j) {
      __m512 acc[R];
      for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
      if (j < nk) kv8::key_dots<R>(it.qf + r0 * Dp, Dp, keys[j0 + j], D, acc);
      for (int r = 0; r < R; ++r) dots[r][j] = acc[r];
    }
    for (int r = 0; r < R; ++r) {
      const __mmask16 live = mask_bits(it.mask(r0 + r, s0 + j0), a.ms[2], nk);
      const __m512 sv = _mm512_mask_mov_ps(_mm512_set1_ps(NINF), live, reduce16(dots[r]));
      _mm512_mask_storeu_ps(it.sc + (r0 + r) * BS + j0, lane_mask(nk), sv);
    }
  }
}

// int8_score_rows over every row, 4 at a time.
template <typename T>
ALWAYS_INLINE void int8_scores(const ItemRows<T>& it, int64_t s0, int64_t n, const int8_t* const* keys) {
  int64_t r0 = 0;
  for (; r0 + 4 <= it.rows; r0 += 4) int8_score_rows<4>(it, s0, n, r0, keys);
  switch (it.rows - r0) {
    case 1: int8_score_rows<1>(it, s0, n, r0, keys); break;
    case 2: int8_score_rows<2>(it, s0, n, r0, keys); break;
    case 3: int8_score_rows<3>(it, s0, n, r0, keys); break;
    default: break;
  }
}

// row_scores for split query rows over bf16 key rows widened in registers (attention_pairs.h).
template <typename T>
ALWAYS_INLINE void pair_scores(const ItemRows<T>& it, int64_t s0, int64_t n,
                               const bf16_t* const* bkeys) {
  const AttnArgs<T>& a = it.a;
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int64_t nk = std::min<int64_t>(16, n - j0);
    for (int64_t r = 0; r < it.rows; ++r) {
      const __mmask16 live = mask_bits(it.mask(r, s0 + j0), a.ms[2], nk);
      __m512 s = _mm512_set1_ps(NINF);
      if (live) {
        __m512 dots[16];
        bf16_pairs::key_dots(it.qf + r * it.Dp, bkeys + j0, nk, it.D, dots);
        s = _mm512_mask_mov_ps(s, live, reduce16(dots));
      }
      _mm512_mask_storeu_ps(it.sc + r * BS + j0, lane_mask(nk), s);
    }
  }
}

// Online softmax over the block's n scores of every row: when the max grows, what was
// accumulated is rescaled by e^(m_old - m_new); the scores become e^(s - m), summed into l.
template <typename T>
ALWAYS_INLINE void softmax_block(const ItemRows<T>& it, int64_t n) {
  const int64_t Dp = it.Dp;
  for (int64_t r = 0; r < it.rows; ++r) {
    float* p = it.sc + r * BS;
    float* acc = it.acc + r * Dp;
    __m512 mx = _mm512_set1_ps(NINF);
    for (int64_t j = 0; j < n; j += 16)
      mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(NINF), lane_mask(n - j), p + j));
    const float bm = _mm512_reduce_max_ps(mx);
    if (bm == NINF) {  // every key of this block is masked for this row
      std::fill(p, p + n, 0.0f);
      continue;
    }
    const float mnew = std::max(it.m[r], bm);
    const float alpha = it.m[r] == NINF ? 0.0f : std::exp(it.m[r] - mnew);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 mk = lane_mask(n - j);
      const __m512 x = _mm512_maskz_loadu_ps(mk, p + j);
      const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(NINF), _CMP_NEQ_OQ) & mk;
      const __m512 e = _mm512_maskz_mov_ps(live, exp512(_mm512_sub_ps(x, _mm512_set1_ps(mnew))));
      _mm512_mask_storeu_ps(p + j, mk, e);
      sum = _mm512_add_ps(sum, e);
    }
    it.l[r] = it.l[r] * alpha + _mm512_reduce_add_ps(sum);
    it.m[r] = mnew;
    if (alpha != 1.0f)
      for (int64_t i = 0; i < Dp; i += 16)
        _mm512_storeu_ps(acc + i, _mm512_mul_ps(_mm512_loadu_ps(acc + i), _mm512_set1_ps(alpha)));
  }
}

// acc += P . V over the block's n value rows: 4 query rows at a time (pv_tile, any 4 rows of
// one KV head: prefill tiles and decode GQA groups of 4+), then the 1-3 rows left in one tile.
template <typename T, typename V>
ALWAYS_INLINE void add_values(const ItemRows<T>& it, int64_t n, const V* const* vals) {
  const int64_t rows = it.rows, D = it.D, Dp = it.Dp;
  int64_t r0 = 0;
  for (; r0 + 4 <= rows; r0 += 4) pv_rows<4>(it.acc, Dp, it.sc, r0, n, vals, D);
  switch (rows - r0) {
    case 1: pv_rows<1>(it.acc, Dp, it.sc, r0, n, vals, D); break;
    case 2: pv_rows<2>(it.acc, Dp, it.sc, r0, n, vals, D); break;
    case 3: pv_rows<3>(it.acc, Dp, it.sc, r0, n, vals, D); break;
    default: break;
  }
}

// The item's result: its softmax state into `part` (split-key decode, merged by the caller),
// else each row's output acc / l.
template <typename T>
ALWAYS_INLINE void finish_rows(const ItemRows<T>& it, const Partial* part) {
  const AttnArgs<T>& a = it.a;
  const int64_t rows = it.rows, D = it.D, Dp = it.Dp;
  if (part) {
    std::copy(it.acc, it.acc + rows * Dp, part->acc);
    std::copy(it.m, it.m + rows, part->m);
    std::copy(it.l, it.l + rows, part->l);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* dst = a.out + it.b * a.os[0] + it.head(r) * a.os[1] + it.pos(r) * a.os[2];
    const __m512 inv = _mm512_set1_ps(1.0f / it.l[r]);  // a fully masked row gives inf/NaN, like SDPA
    for (int64_t i = 0; i < D; i += 16)
      store(dst + i, _mm512_mul_ps(_mm512_loadu_ps(it.acc + r * Dp + i), inv), lane_mask(D - i));
  }
}

// Decode items read their keys and values from DRAM (a step's K/V far exceeds L3), and the
// scoring loop alone keeps few misses in flight: each 16-token block is a 2 KB run per head,
// too short for the hardware prefetcher. So a decode item first loads every line of its live
// K and V with plain loads, WARM_STREAMS runs of at most WARM_RUN_LINES lines side by side
// (misses of many streams in flight at once), and then attends from L2. Zen 4, 2 threads, 25
// rows of ~190 keys over 30 layers (107 MB): 9.4-11.8 ms without, 6.3-7.3 ms with.
constexpr int WARM_STREAMS = 16;
constexpr int64_t WARM_RUN_LINES = 32;

// Load every cache line of item (b, g)'s keys and values [lo, hi) once (see above). Only
// for caches whose rows are contiguous within a block (the keys of a run are adjacent).
template <typename T>
void warm_item(const AttnArgs<T>& a, int64_t b, int64_t g, int64_t lo, int64_t hi) {
  const bool q8 = a.k8 != nullptr;
  const int64_t row_bytes = q8 ? kv8_row_bytes(a.d) : a.d * (int64_t)sizeof(T);
  if (a.ks[2] * (q8 ? 1 : (int64_t)sizeof(T)) != row_bytes || a.vs[2] != a.ks[2]) return;
  const char* runs[WARM_STREAMS];
  int64_t lens[WARM_STREAMS];
  int n = 0;
  __m512i sum = _mm512_setzero_si512();
  const auto read_runs = [&] {  // line i of every run, then line i + 1 ...
    for (int64_t i = 0; i < WARM_RUN_LINES; ++i)
      for (int r = 0; r < n; ++r)
        if (i < lens[r]) {
          __m512i x = _mm512_load_si512(runs[r] + 64 * i);
          opaque(x);  // the load is the point: keep it
          sum = _mm512_add_epi64(sum, x);
        }
    n = 0;
  };
  const auto add = [&](const void* row, int64_t keys) {  // the lines holding `keys` rows from `row`
    const uintptr_t first = reinterpret_cast<uintptr_t>(row) / 64 * 64;
    const uintptr_t end = reinterpret_cast<uintptr_t>(row) + keys * row_bytes;  // one past the last byte
    for (uintptr_t p = first; p < end; p += 64 * WARM_RUN_LINES) {
      runs[n] = reinterpret_cast<const char*>(p);
      lens[n] = std::min<int64_t>(WARM_RUN_LINES, (end - p + 63) / 64);
      if (++n == WARM_STREAMS) read_runs();
    }
  };
  for (int64_t s0 = lo; s0 < hi;) {  // runs of keys adjacent in memory: a block, or all of them
    const int64_t keys = a.table ? std::min(a.block_size - s0 % a.block_size, hi - s0) : hi - s0;
    if (q8) {
      add(kv_row(a.k8, a.ks, a, b, g, s0), keys);
      add(kv_row(a.v8, a.vs, a, b, g, s0), keys);
    } else {
      add(kv_row(a.k, a.ks, a, b, g, s0), keys);
      add(kv_row(a.v, a.vs, a, b, g, s0), keys);
    }
    s0 += keys;
  }
  read_runs();
  consume(sum);
}

// Query rows t0 .. t0+nt-1 of every head of KV head g in batch row b, over the keys
// [k0, k1) that the mask leaves live, one block of BS keys at a time: scores, online
// softmax, values. With `part` the unnormalised state is written there (split-key decode,
// merged by the caller), else the normalised output. With `warm` (decode items) the live
// keys and values are first loaded into L2 (warm_item).
template <typename T>
void attend_item(const AttnArgs<T>& a, int64_t b, int64_t g, int64_t t0, int64_t nt, int64_t k0,
                 int64_t k1, bool with_sinks, const Partial* part, bool warm,
                 std::vector<float>& buf, const Prepared& pre = {}) {
  const int64_t group = a.hq / a.hk, rows = group * nt, D = a.d, Dp = (D + 15) / 16 * 16;
  buf.resize(rows * (Dp * 2 + BS + 2) + 2 * BS * Dp);
  float* qf = buf.data();
  const ItemRows<T> it{a, b, g, t0, nt, group, rows, D, Dp, qf, qf + rows * Dp, qf + 2 * rows * Dp,
                       qf + rows * (2 * Dp + BS), qf + rows * (2 * Dp + BS + 1)};
  float* kscratch = it.l + rows;  // [BS, Dp] bf16 keys widened
  float* vscratch = kscratch + BS * Dp;
  const float* keys[BS];    // fp32 row of each key of the block (widened or in place)
  const bf16_t* bkeys[BS];  // bf16 rows, read in place by vdpbf16ps
  const float* vals[BS];
  const bool q8 = a.k8 != nullptr;  // int8 KV: rows de-quantized to fp32 (rows_int8)
  const bool dot_bf16 = kDotBf16<T> && !q8;
  const bool tiled = rows >= TILE_ROWS && D % 2 == 0;
  std::vector<uint32_t> kt_buf(tiled && dot_bf16 && pre.kt == nullptr ? (D / 2) * 64 : 0);
  // bf16, few rows: values widened in registers (attention_pairs.h), and without
  // AVX512-BF16 the keys too; the accumulators are then in split order until the end
  constexpr bool kPairs = std::is_same_v<T, bf16_t> && !kDotBf16<T>;
  const bool value_pairs = std::is_same_v<T, bf16_t> && rows <= PAIR_ROWS && D % 32 == 0 &&
                           pre.v == nullptr && !q8;
  const bool in_pairs = kPairs && value_pairs;
  // int8 KV, few rows: keys and values de-quantized in registers (int8_scores, pv_tile)
  // rather than into fp32 scratch rows (shared by more rows, as prefill tiles have)
  const bool q8_regs = q8 && D % KV8_GROUP == 0 && rows <= PAIR_ROWS;
  // int8 keys prepared as [hi, lo] bf16 rows (split_int8_keys): the query rows as [q, q]
  std::vector<bf16_t> qdup;
  if constexpr (std::is_same_v<T, bf16_t>) {
    if (q8 && pre.kt != nullptr) {
      qdup.resize(rows * 2 * D);
      for (int64_t r = 0; r < rows; ++r) {
        std::copy(it.query(r), it.query(r) + D, qdup.data() + r * 2 * D);
        std::copy(it.query(r), it.query(r) + D, qdup.data() + r * 2 * D + D);
      }
    }
  }
  start_rows(it, with_sinks);
  if (in_pairs) bf16_pairs::split_rows(it.qf, rows, Dp, D);
  int64_t lo, hi;
  live_keys(a, b, t0, nt, lo, hi);
  lo = std::max(lo, k0), hi = std::min(hi, k1);
  if (warm) warm_item(a, b, g, lo, hi);
  if (pre.kt != nullptr) lo = lo / BS * BS;  // prepared blocks are 64-key aligned
  for (int64_t s0 = lo; s0 < hi; s0 += BS) {
    const int64_t n = std::min(BS, hi - s0);
    if constexpr (kPairs) {
      if (in_pairs) {
        const bf16_t* bvals[BS];
        rows_raw(a.k, a.ks, a, b, g, s0, n, bkeys);
        pair_scores(it, s0, n, bkeys);
        softmax_block(it, n);
        rows_raw(a.v, a.vs, a, b, g, s0, n, bvals);
        bf16_pairs::add_all_values(it.acc, Dp, it.sc, BS, rows, n, bvals, D);
        continue;
      }
    }
    int64_t r_done = 0;  // rows whose scores the tiles computed
    if constexpr (kDotBf16<T>) {
      if (dot_bf16 || !qdup.empty()) {
        if (dot_bf16) rows_raw(a.k, a.ks, a, b, g, s0, n, bkeys);
        if (tiled) {
          const uint32_t* kt = kt_buf.data();  // the block's packed key pairs
          if (pre.kt != nullptr)
            kt = pre.kt + ((b * a.hk + g) * pre.blocks + s0 / BS) * pre.pairs * 64;
          else
            pack_key_pairs(bkeys, n, D / 2, kt_buf.data());
          r_done = tile_scores(it, s0, n, kt, qdup.empty() ? nullptr : qdup.data());
        }
      }
    }
    if (r_done < it.rows && q8_regs) {
      const int8_t* qkeys[BS];
      rows_raw(a.k8, a.ks, a, b, g, s0, n, qkeys);
      int8_scores(it, s0, n, qkeys);
    } else if (r_done < it.rows) {
      if (q8)
        rows_int8(a.k8, a.ks, a, b, g, s0, n, D, Dp, kscratch, keys);
      else if (!dot_bf16)
        rows_fp32(a.k, a.ks, a, b, g, s0, n, D, Dp, kscratch, keys);
      row_scores(it, s0, n, r_done, keys, bkeys, dot_bf16);
    }
    softmax_block(it, n);
    if constexpr (std::is_same_v<T, bf16_t>) {
      if (value_pairs) {
        const bf16_t* bvals[BS];
        rows_raw(a.v, a.vs, a, b, g, s0, n, bvals);
        bf16_pairs::add_all_values(it.acc, Dp, it.sc, BS, rows, n, bvals, D);
        continue;
      }
    }
    if (pre.v != nullptr) {
      const float* vb = pre.v + ((b * a.hk + g) * pre.blocks * BS + s0) * Dp;
      for (int64_t j = 0; j < n; ++j) vals[j] = vb + j * Dp;
    } else if (q8_regs) {
      const int8_t* qvals[BS];
      rows_raw(a.v8, a.vs, a, b, g, s0, n, qvals);
      add_values(it, n, qvals);
      continue;
    } else if (q8) {
      rows_int8(a.v8, a.vs, a, b, g, s0, n, D, Dp, vscratch, vals);
    } else {
      rows_fp32(a.v, a.vs, a, b, g, s0, n, D, Dp, vscratch, vals);
    }
    add_values(it, n, vals);
  }
  if (value_pairs) bf16_pairs::join_rows(it.acc, rows, Dp, D);
  finish_rows(it, part);
}

// Split-key decode: the states of `splits` key ranges of one (row, KV head) merged into the
// output, o = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
template <typename T>
void merge_splits(const AttnArgs<T>& a, int64_t b, int64_t g, int64_t splits, const float* part,
                  int64_t rows, int64_t Dp) {
  const int64_t group = a.hq / a.hk, D = a.d, stride = rows * (Dp + 2);
  for (int64_t r = 0; r < rows; ++r) {
    float M = NINF;
    for (int64_t s = 0; s < splits; ++s) M = std::max(M, part[s * stride + rows * Dp + r]);
    __m512 o[16];
    const int64_t nv = Dp / 16;
    for (int64_t c = 0; c < nv; ++c) o[c] = _mm512_setzero_ps();
    float L = 0.0f;
    for (int64_t s = 0; s < splits; ++s) {
      const float* p = part + s * stride;
      const float ms = p[rows * Dp + r], ls = p[rows * Dp + rows + r];
      if (ms == NINF) continue;  // no live key in this range
      const float w = std::exp(ms - M);
      L += w * ls;
      for (int64_t c = 0; c < nv; ++c)
        o[c] = _mm512_fmadd_ps(_mm512_set1_ps(w), _mm512_loadu_ps(p + r * Dp + 16 * c), o[c]);
    }
    const int64_t h = g * group + r / a.tq, t = r % a.tq;
    T* dst = a.out + b * a.os[0] + h * a.os[1] + t * a.os[2];
    const __m512 inv = _mm512_set1_ps(1.0f / L);
    for (int64_t c = 0; c < nv; ++c) store(dst + 16 * c, _mm512_mul_ps(o[c], inv), lane_mask(D - 16 * c));
  }
}

}  // namespace

template <typename T>
void attention(const AttnArgs<T>& a, int nthreads) {
  // Decode (T <= 16): one item per (row, KV head), or per (row, KV head, key range) when
  // there are fewer items than threads and enough keys (split-key, merged after). Prefill:
  // tiles of QT query positions, so causal tiles skip the keys after them.
  const int64_t qt = a.tq <= 16 ? a.tq : 16, tiles = (a.tq + qt - 1) / qt;
  const int64_t heads = a.b * a.hk, work = a.b * a.hq * a.s * a.d * a.tq;
  const int64_t Dp = (a.d + 15) / 16 * 16, rows = (a.hq / a.hk) * qt;
  int64_t splits = 1;
  if (tiles == 1 && nthreads > 1 && Dp <= 256) {
    const int64_t want = (2 * nthreads + heads - 1) / heads;  // >= 2 items per thread
    splits = std::max<int64_t>(1, std::min<int64_t>(want, a.s / 256));
  }
  const int64_t items = heads * tiles * splits;
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>({(int64_t)nthreads, items, work / (1 << 16)}));
  const int64_t chunk = (a.s + splits - 1) / splits, pstride = rows * (Dp + 2);
  std::vector<float> parts(splits > 1 ? heads * splits * pstride : 0);
  // Prefill with tiled bf16 scores: pack keys / widen values once, shared by all tiles (int8
  // KV: keys split into [hi, lo] bf16 rows, split_int8_keys; values de-quantized).
  const bool q8 = a.k8 != nullptr;
  const bool share = std::is_same_v<T, bf16_t> && tiles > 1 && rows >= TILE_ROWS && a.d % 2 == 0 &&
                     (!q8 || (kDotBf16<T> && a.d % KV8_GROUP == 0));
  const int64_t kpairs = q8 ? a.d : a.d / 2;
  const int64_t blocks = (a.s + BS - 1) / BS;
  // not zeroed (a serial memset of ~0.4 MB a layer for a 150-key chunk): every block is
  // packed below, its key tail zeroed, and a tile reads only the block's live value rows
  std::unique_ptr<uint32_t[]> kt_all(share ? new uint32_t[heads * blocks * kpairs * 64] : nullptr);
  std::unique_ptr<float[]> v_all(share ? new float[heads * blocks * BS * Dp] : nullptr);
  Prepared pre;
  if (share) pre = Prepared{kt_all.get(), v_all.get(), blocks, kpairs};
  std::optional<StealRanges> ranges;  // decode: each thread's contiguous range of items
  if (tiles == 1 && splits == 1) {
    std::vector<int64_t> sizes(nt);
    for (int t = 0; t < nt; ++t) sizes[t] = items * (t + 1) / nt - items * t / nt;
    ranges.emplace(sizes);
  }
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    if (share) {
      std::vector<bf16_t> split;  // int8 keys of a block as [hi, lo] rows
#pragma omp for schedule(static)
      for (int64_t it = 0; it < heads * blocks; ++it) {
        const int64_t bg = it / blocks, s0 = it % blocks * BS, n = std::min(BS, a.s - s0);
        const float* vr[BS];
        float* vdst = v_all.get() + it * BS * Dp;
        if (q8) {
#ifdef PACE_HAS_BF16
          const int8_t* kr[BS];
          rows_raw(a.k8, a.ks, a, bg / a.hk, bg % a.hk, s0, n, kr);
          split.resize(BS * 2 * a.d);
          kv8::split_int8_keys(kr, n, a.d, split.data());
          const bf16_t* sr[BS];
          for (int64_t j = 0; j < n; ++j) sr[j] = split.data() + j * 2 * a.d;
          pack_key_pairs(sr, n, kpairs, kt_all.get() + it * kpairs * 64);
#endif
          rows_int8(a.v8, a.vs, a, bg / a.hk, bg % a.hk, s0, n, a.d, Dp, vdst, vr);
        } else {
          const T* kr[BS];
          rows_raw(a.k, a.ks, a, bg / a.hk, bg % a.hk, s0, n, kr);
          pack_key_pairs(reinterpret_cast<const bf16_t* const*>(kr), n, kpairs,
                         kt_all.get() + it * kpairs * 64);
          rows_fp32(a.v, a.vs, a, bg / a.hk, bg % a.hk, s0, n, a.d, Dp, vdst, vr);
        }
        for (int64_t j = 0; j < n; ++j)
          if (vr[j] != vdst + j * Dp) std::copy(vr[j], vr[j] + a.d, vdst + j * Dp);  // fp32 in place
      }
    }
    std::vector<float> buf;
    if (tiles == 1 && splits == 1) {
      // decode: each thread one contiguous range of (row, KV head) items, which reads the
      // cache in fewer, longer runs than items handed out one at a time (25 rows of ~190
      // cold keys, 2 threads: 7.6 against 8.2-8.8 ms per 30 layers), each item first loaded
      // into L2 (warm_item); a thread done with its range takes items from the others' ends
      ranges->drain(omp_get_thread_num(), [&](int u, int64_t k, bool) {
        const int64_t it = items * u / nt + k;  // item k of thread u's range
        attend_item(a, it / a.hk, it % a.hk, 0, a.tq, 0, a.s, true, nullptr, true, buf);
      });
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < items; ++it) {
        if (splits == 1) {
          const int64_t tile = it % tiles, bg = it / tiles, t0 = tile * qt;
          attend_item(a, bg / a.hk, bg % a.hk, t0, std::min(qt, a.tq - t0), 0, a.s, true, nullptr,
                      false, buf, pre);
        } else {
          const int64_t split = it % splits, bg = it / splits;
          float* p = parts.data() + (bg * splits + split) * pstride;
          const Partial part{p, p + rows * Dp, p + rows * Dp + rows};
          attend_item(a, bg / a.hk, bg % a.hk, 0, a.tq, split * chunk, (split + 1) * chunk,
                      split == 0, &part, true, buf);
        }
      }
    }
    if (splits > 1) {
#pragma omp for schedule(static)
      for (int64_t bg = 0; bg < heads; ++bg)
        merge_splits(a, bg / a.hk, bg % a.hk, splits, parts.data() + bg * splits * pstride, rows, Dp);
    }
  }
}

template void attention<float>(const AttnArgs<float>&, int);
template void attention<bf16_t>(const AttnArgs<bf16_t>&, int);

}  // namespace pace_avx512
