// Linear over quantized weights with AVX512-VNNI: y = x @ W^T + bias, W in groups of 32 along
// K with a scale (and, for 4-bit, a min) per row and group.
//
// The activation rows are quantized once per call per group of 32 (round to nearest even),
// with the sum of their codes; integer dot products with the weight codes are exact in int32
// over the group, then scaled in fp32:
//   int8:  w = q * s       sum w x = s xs sum q xq   (s per 32 k, or per 16 k: GGUF q6_k)
//   4-bit: w = q * s + m   sum w x = s xs sum q xq + m xs sum xq      (q in 0..15)
// int8 weights take int16 activations (scale amax / 32767: error ~1e-5 relative, far below
// the weights' own): the codes are widened to int16 in registers and each vpdpwssd multiplies
// 16 rows x a k-pair by the activation pair broadcast to all lanes. 4-bit weights take int8
// activations (scale amax / 127, as llama.cpp's q8 activations: ~0.3% relative per group,
// well below 4-bit weights' ~5%): the nibbles feed vpdpbusd as unsigned bytes with no
// widening, 16 rows x a k-quad by the activation quad per instruction, 4x the weights per
// instruction of the int16 path, so decode stays bound by the weight stream and prefill runs
// 2x the MACs.
//
// Packed layout (pace_avx512/qpacking.py), per block of 16 rows, one contiguous run of
// `block_stride` bytes: codes of every group, then fp16 scales [G * SUB][16] (SUB = 2 for
// scales per 16 k), then (4-bit with mins) fp16 mins [G][16].
//   int8:  16 k-pairs of 32 signed bytes, pair p at byte 32 p: byte 2j + e = row j, k = 2p + e;
//   4-bit: 4 lines of 64 bytes, line v = k-quad 2v in the low nibbles and 2v + 1 in the high
//          ones: byte 4j + e = row j, k = 4 quad + e.
// Threads take contiguous ranges of row blocks, so each streams one sequential run, prefetched
// 16 KB ahead (simd.h prefetch_stream); a decode row keeps 4 accumulator chains per block.
#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "simd.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")

namespace pace_avx512 {

namespace {

#define PACE_UNROLL _Pragma("GCC unroll 16")

constexpr int64_t QGROUP = 32;  // k per quantization group

// Accumulator chain tags (reduced modulo the chains a tile uses).
using C0 = std::integral_constant<int, 0>;
using C1 = std::integral_constant<int, 1>;
using C2 = std::integral_constant<int, 2>;
using C3 = std::integral_constant<int, 3>;

// Activation rows quantized per group of 32: int16 codes for int8 weights, int8 codes for
// 4-bit weights (see the top of the file).
// SPLIT (4-bit weights, few rows): 15-bit codes c = 128 hi + lo as two int8 planes, hi in
// [-128, 127] at codes[0, M K), lo in [0, 127] at codes[M K, 2 M K): two vpdpbusd per quad
// give int16-class precision without widening the weights.
template <typename Code>
struct QuantizedRows {
  std::vector<Code> codes;    // [M][K] (SPLIT: [2][M][K])
  std::vector<float> scales;  // [M][G]
  std::vector<float> sums;    // [M][G]: scale * sum of codes (the row's group sum as seen)
};

template <bool SPLIT, typename Code, typename T>
void quantize_rows(const T* x, int64_t ldx, int64_t M, int64_t K, QuantizedRows<Code>& q) {
  constexpr float LEVELS = sizeof(Code) == 2 ? 32767.0f : SPLIT ? 16383.0f : 127.0f;
  const int64_t G = K / QGROUP;
  q.codes.resize((SPLIT ? 2 : 1) * M * K);
  q.scales.resize(M * G);
  q.sums.resize(M * G);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      const T* src = x + m * ldx + g * QGROUP;
      const __m512 a = load(src, 0xFFFF), b = load(src + 16, 0xFFFF);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
      const float scale = amax / LEVELS, inv = amax > 0 ? LEVELS / amax : 0.0f;
      const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inv)));
      const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inv)));
      Code* dst = q.codes.data() + m * K + g * QGROUP;
      if constexpr (sizeof(Code) == 2) {
        _mm256_storeu_si256((__m256i*)dst, _mm512_cvtsepi32_epi16(qa));
        _mm256_storeu_si256((__m256i*)(dst + 16), _mm512_cvtsepi32_epi16(qb));
      } else if constexpr (SPLIT) {
        const __m512i seven = _mm512_set1_epi32(127);
        _mm_storeu_si128((__m128i*)dst, _mm512_cvtsepi32_epi8(_mm512_srai_epi32(qa, 7)));
        _mm_storeu_si128((__m128i*)(dst + 16), _mm512_cvtsepi32_epi8(_mm512_srai_epi32(qb, 7)));
        _mm_storeu_si128((__m128i*)(dst + M * K), _mm512_cvtsepi32_epi8(_mm512_and_si512(qa, seven)));
        _mm_storeu_si128((__m128i*)(dst + M * K + 16), _mm512_cvtsepi32_epi8(_mm512_and_si512(qb, seven)));
      } else {
        _mm_storeu_si128((__m128i*)dst, _mm512_cvtsepi32_epi8(qa));
        _mm_storeu_si128((__m128i*)(dst + 16), _mm512_cvtsepi32_epi8(qb));
      }
      const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
      q.scales[m * G + g] = scale;
      q.sums[m * G + g] = scale * (float)sum;
    }
  }
}

template <typename Code>
struct QArgs {
  const uint8_t* w;
  int64_t block_stride;  // bytes per block of 16 rows
  int64_t G;             // groups per row
  const QuantizedRows<Code>* x;
  int64_t K;
  int64_t M;  // activation rows
};

// Weight kinds (pace_avx512/qpacking.py KINDS): 4-bit with mins, int8 with a scale per 32 k,
// int8 with a scale per 16 k, 4-bit symmetric ((q - 8) s: the min -8 s is not stored).
enum Kind : int { KIND_INT4 = 0, KIND_INT8 = 1, KIND_INT8_G16 = 2, KIND_INT4_SYM = 3 };

constexpr bool is_int8(int kind) { return kind == KIND_INT8 || kind == KIND_INT8_G16; }

// Activation codes a kind takes: int16 for int8 weights, int8 for 4-bit ones.
template <int KIND>
using CodeOf = std::conditional_t<is_int8(KIND), int16_t, int8_t>;

// total[MT] (16 rows of block `b`) for activation rows [m0, m0 + MT).
template <int KIND, bool SPLIT, int MT>
inline void qtile(const QArgs<CodeOf<KIND>>& a, int64_t b, int64_t m0, __m512 (&total)[MT]) {
  constexpr bool INT8 = is_int8(KIND);
  constexpr int SUB = KIND == KIND_INT8_G16 ? 2 : 1;  // scales per group of 32
  // Independent accumulator chains per activation row: with few rows a single chain of
  // dot products waits on its own latency (~5 cycles) every instruction.
  constexpr int CH = MT >= 4 ? 1 : MT >= 2 ? 2 : 4;
  const int64_t code_bytes = INT8 ? 512 : 256;
  const uint8_t* codes = a.w + b * a.block_stride;
  const uint16_t* scales = (const uint16_t*)(codes + a.G * code_bytes);
  const uint16_t* mins = scales + a.G * 16;
  const int32_t* xq[MT];
  const int32_t* xl[MT];  // SPLIT: the low plane
  PACE_UNROLL for (int m = 0; m < MT; ++m) {
    total[m] = _mm512_setzero_ps();
    xq[m] = (const int32_t*)(a.x->codes.data() + (m0 + m) * a.K);
    xl[m] = SPLIT ? (const int32_t*)(a.x->codes.data() + (a.M + m0 + m) * a.K) : nullptr;
  }
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < a.G; ++g) {
    __m512i acc[CH][MT], low_acc[SPLIT ? CH : 1][MT];
    const uint8_t* cg = codes + g * code_bytes;
    prefetch_stream(cg, code_bytes);
    PACE_UNROLL for (int c = 0; c < CH; ++c)
      PACE_UNROLL for (int m = 0; m < MT; ++m) acc[c][m] = _mm512_setzero_si512();
    if constexpr (SPLIT)
      PACE_UNROLL for (int c = 0; c < CH; ++c)
        PACE_UNROLL for (int m = 0; m < MT; ++m) low_acc[c][m] = _mm512_setzero_si512();
    // acc[chain][m] += 16 rows x k-pair p (int16 words w) . the pair of row m broadcast
    auto dot = [&](const __m512i w, int64_t p, auto chain) {
      constexpr int c = decltype(chain)::value % CH;
      PACE_UNROLL for (int m = 0; m < MT; ++m)
        acc[c][m] = _mm512_dpwssd_epi32(acc[c][m], w, _mm512_set1_epi32(xq[m][g * 16 + p]));
    };
    // acc[chain][m] += 16 rows x k-quad (unsigned bytes w) . the quad of row m broadcast
    auto dot4 = [&](const __m512i w, int64_t quad, auto chain) {
      constexpr int c = decltype(chain)::value % CH;
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        acc[c][m] = _mm512_dpbusd_epi32(acc[c][m], w, _mm512_set1_epi32(xq[m][g * 8 + quad]));
        if constexpr (SPLIT)
          low_acc[c][m] = _mm512_dpbusd_epi32(low_acc[c][m], w, _mm512_set1_epi32(xl[m][g * 8 + quad]));
      }
    };
    // total[m] += (sum of the chains of m) * the 16 rows' scale `si` * row m's activation
    // scale; the chains restart at 0
    auto flush = [&](int64_t si) {
      const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(scales + si * 16)));
      PACE_UNROLL for (int m = 0; m < MT; ++m) {
        __m512i sum = acc[0][m];
        PACE_UNROLL for (int c = 1; c < CH; ++c) sum = _mm512_add_epi32(sum, acc[c][m]);
        if constexpr (SPLIT) {  // 128 sum(hi) + sum(lo)
          sum = _mm512_slli_epi32(sum, 7);
          PACE_UNROLL for (int c = 0; c < CH; ++c) {
            sum = _mm512_add_epi32(sum, low_acc[c][m]);
            low_acc[c][m] = _mm512_setzero_si512();
          }
        }
        const __m512 sx = _mm512_mul_ps(s, _mm512_set1_ps(a.x->scales[(m0 + m) * a.G + g]));
        total[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sx, total[m]);
        PACE_UNROLL for (int c = 0; c < CH; ++c) acc[c][m] = _mm512_setzero_si512();
      }
    };
    if constexpr (INT8) {
      PACE_UNROLL for (int sub = 0; sub < SUB; ++sub) {
        auto pair = [&](int64_t p, auto chain) {
          dot(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(cg + 32 * p))), p, chain);
        };
        PACE_UNROLL for (int p = sub * 16 / SUB; p < (sub + 1) * 16 / SUB; p += 4) {
          pair(p, C0{});
          pair(p + 1, C1{});
          pair(p + 2, C2{});
          pair(p + 3, C3{});
        }
        flush(g * SUB + sub);
      }
    } else {
      auto line = [&](int64_t v, auto lo_chain, auto hi_chain) {
        const __m512i raw = _mm512_loadu_si512(cg + 64 * v);
        dot4(_mm512_and_si512(raw, low), 2 * v, lo_chain);
        dot4(_mm512_and_si512(_mm512_srli_epi16(raw, 4), low), 2 * v + 1, hi_chain);
      };
      line(0, C0{}, C1{});
      line(1, C2{}, C3{});
      line(2, C0{}, C1{});
      line(3, C2{}, C3{});
      flush(g);
      const __m512 mn =
          KIND == KIND_INT4_SYM
              ? _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(scales + g * 16))),
                              _mm512_set1_ps(-8.0f))
              : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(mins + g * 16)));
      PACE_UNROLL for (int m = 0; m < MT; ++m)
        total[m] = _mm512_fmadd_ps(mn, _mm512_set1_ps(a.x->sums[(m0 + m) * a.G + g]), total[m]);
    }
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
inline void rows_tail(const QArgs<CodeOf<KIND>>& a, const Store& st, int64_t b, int64_t m0, int64_t mt) {
  if constexpr (MT > 0) {
    if (mt == MT) {
      __m512 total[MT];
      qtile<KIND, SPLIT, MT>(a, b, m0, total);
      st.template operator()<MT>(total, b, m0);
    } else {
      rows_tail<KIND, SPLIT, MT - 1>(a, st, b, m0, mt);
    }
  }
}

template <int KIND, bool SPLIT, typename Store>
void qdrive(const QArgs<CodeOf<KIND>>& a, const Store& st, int64_t M, int64_t blocks, int nthreads) {
  constexpr int MT = 4;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t end = blocks * (t + 1) / nt;
    for (int64_t b = blocks * t / nt; b < end; ++b) {
      int64_t m0 = 0;
      for (; m0 + MT <= M; m0 += MT) {
        __m512 total[MT];
        qtile<KIND, SPLIT, MT>(a, b, m0, total);
        st.template operator()<MT>(total, b, m0);
      }
      if (m0 < M) rows_tail<KIND, SPLIT, MT - 1>(a, st, b, m0, M - m0);
    }
  }
}

// Quantize the activation rows as KIND takes them (a per-thread buffer reused across calls:
// no allocation per decode step), then run the tiles.
template <int KIND, bool SPLIT, typename T>
void qlinear_kind(const T* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                  int64_t block_stride, const QStore<T>& st, int64_t N, int nthreads) {
  thread_local QuantizedRows<CodeOf<KIND>> rows;
  quantize_rows<SPLIT>(x, ldx, M, K, rows);
  const int64_t blocks = (N + 15) / 16;
  const QArgs<CodeOf<KIND>> a{w, block_stride, K / QGROUP, &rows, K, M};
  qdrive<KIND, SPLIT>(a, st, M, blocks, pick_threads(nthreads, blocks * block_stride, M, blocks));
}

// 4-bit weights: 15-bit split activations, or int8 from `int8_activation_rows` rows (if set).
template <int KIND, typename T>
void qlinear_4bit(const T* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                  int64_t block_stride, const QStore<T>& st, int64_t N, int nthreads) {
  const int64_t from = tuning().int8_activation_rows;
  if (from <= 0 || M < from)
    qlinear_kind<KIND, true>(x, ldx, M, K, w, block_stride, st, N, nthreads);
  else
    qlinear_kind<KIND, false>(x, ldx, M, K, w, block_stride, st, N, nthreads);
}

template <typename T>
void qlinear(const T* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
             int64_t block_stride, int kind, const float* bias, int64_t N, T* y, int64_t ldy,
             int nthreads) {
  const QStore<T> st{y, ldy, bias, N};
  if (kind == KIND_INT8) qlinear_kind<KIND_INT8, false>(x, ldx, M, K, w, block_stride, st, N, nthreads);
  else if (kind == KIND_INT8_G16) qlinear_kind<KIND_INT8_G16, false>(x, ldx, M, K, w, block_stride, st, N, nthreads);
  else if (kind == KIND_INT4_SYM) qlinear_4bit<KIND_INT4_SYM>(x, ldx, M, K, w, block_stride, st, N, nthreads);
  else qlinear_4bit<KIND_INT4>(x, ldx, M, K, w, block_stride, st, N, nthreads);
}

}  // namespace

void qlinear_bf16(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                  int64_t block_stride, int kind, const float* bias, int64_t N, bf16_t* y,
                  int64_t ldy, int nthreads) {
  qlinear(x, ldx, M, K, w, block_stride, kind, bias, N, y, ldy, nthreads);
}

void qlinear_fp32(const float* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                  int64_t block_stride, int kind, const float* bias, int64_t N, float* y,
                  int64_t ldy, int nthreads) {
  qlinear(x, ldx, M, K, w, block_stride, kind, bias, N, y, ldy, nthreads);
}

}  // namespace pace_avx512

#pragma GCC pop_options
