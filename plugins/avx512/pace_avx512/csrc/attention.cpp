// Decode attention over contiguous-in-D K/V [B, Hk, S, D] with GQA, a boolean mask
// (True = attend) and optional sinks, as pace_native.kernels.attention for few queries.
//
// One work item is (batch row, KV head): all `group * T` query rows of that KV head use each
// block of BS keys/values while it is in L1, so K and V are read once per KV head (bf16
// blocks are widened to fp32 once, for all rows). Scores of 16 keys come from 16 partial dot
// products reduced together (no per-key horizontal sum); an online softmax (running max m,
// running sum l, rescaled accumulator) means no [rows, S] score matrix is kept. A sink joins
// the softmax denominator only: it starts as (m = sink, l = 1). All math is fp32.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "simd.h"

namespace pace_avx512 {
namespace {

constexpr int64_t BS = 64;  // keys per online-softmax block

static inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
static inline __m512 load(const bf16_t* p, __mmask16 m) { return load_bf16(p, m); }
static inline void store(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
static inline void store(bf16_t* p, __m512 v, __mmask16 m) { store_bf16(p, v, m); }

// out[k] = sum of the 16 lanes of v[k], for 16 vectors at once (transpose-and-add tree).
static inline __m512 reduce16(const __m512 (&v)[16]) {
  __m512 s[8], u[4];
  for (int i = 0; i < 8; ++i)  // lane L of s[i]: pairwise sums of v[2i], v[2i+1] in that lane
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // lane L of u[i]: the lane-L sums of v[4i .. 4i+3]
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * i], s[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(s[2 * i], s[2 * i + 1], 0xEE));
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
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

// Rows [0, n) of a block of K or V as fp32 with row stride `ld`: bf16 is widened once into
// `scratch` (shared by all query rows of the group), fp32 is read in place.
template <typename T>
inline const float* as_fp32(const T* src, int64_t stride, int64_t n, int64_t D, int64_t Dp,
                            float* scratch, int64_t& ld) {
  if constexpr (std::is_same_v<T, float>) {
    ld = stride;
    return src;
  } else {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < Dp; i += 16)
        _mm512_storeu_ps(scratch + j * Dp + i, load(src + j * stride + i, lane_mask(D - i)));
    ld = Dp;
    return scratch;
  }
}

template <typename T>
void attend_item(const AttnArgs<T>& a, int64_t b, int64_t g, std::vector<float>& buf) {
  const int64_t group = a.hq / a.hk, rows = group * a.tq, D = a.d, Dp = (D + 15) / 16 * 16;
  buf.assign(rows * (Dp * 2 + BS + 2) + 2 * BS * Dp, 0.0f);
  float* qf = buf.data();          // [rows, Dp] scaled queries
  float* acc = qf + rows * Dp;     // [rows, Dp] unnormalised outputs
  float* sc = acc + rows * Dp;     // [rows, BS] scores, then probabilities, of the block
  float* m = sc + rows * BS;       // [rows] running max
  float* l = m + rows;             // [rows] running sum
  float* kscratch = l + rows;      // [BS, Dp] bf16 keys widened
  float* vscratch = kscratch + BS * Dp;
  const float ninf = -std::numeric_limits<float>::infinity();
  const __m512 vscale = _mm512_set1_ps(a.scale);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = g * group + r / a.tq, t = r % a.tq;
    const T* src = a.q + b * a.qs[0] + h * a.qs[1] + t * a.qs[2];
    for (int64_t i = 0; i < D; i += 16)
      _mm512_storeu_ps(qf + r * Dp + i, _mm512_mul_ps(load(src + i, lane_mask(D - i)), vscale));
    m[r] = a.sinks ? a.sinks[h] : ninf;
    l[r] = a.sinks ? 1.0f : 0.0f;
  }
  const T* kb = a.k + b * a.ks[0] + g * a.ks[1];
  const T* vb = a.v + b * a.vs[0] + g * a.vs[1];
  for (int64_t s0 = 0; s0 < a.s; s0 += BS) {
    const int64_t n = std::min(BS, a.s - s0);
    int64_t kld, vld;
    const float* keys = as_fp32(kb + s0 * a.ks[2], a.ks[2], n, D, Dp, kscratch, kld);
    // scores, 16 keys at a time: 16 partial dot products, one transpose-add for all of them
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
      const int64_t nk = std::min<int64_t>(16, n - j0);
      for (int64_t r = 0; r < rows; ++r) {
        __m512 dots[16];
        for (int j = 0; j < 16; ++j) dots[j] = _mm512_setzero_ps();
        for (int64_t i = 0; i < D; i += 16) {
          const __mmask16 mk = lane_mask(D - i);
          const __m512 qv = _mm512_loadu_ps(qf + r * Dp + i);
          for (int j = 0; j < 16; ++j)
            if (j < nk) dots[j] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(mk, keys + (j0 + j) * kld + i), dots[j]);
        }
        const int64_t t = r % a.tq;
        const __mmask16 live = mask_bits(a.mask + b * a.ms[0] + t * a.ms[1] + (s0 + j0) * a.ms[2], a.ms[2], nk);
        const __m512 s = _mm512_mask_mov_ps(_mm512_set1_ps(ninf), live, reduce16(dots));
        _mm512_mask_storeu_ps(sc + r * BS + j0, lane_mask(nk), s);
      }
    }
    // online softmax: rescale what was accumulated when the max grows, then add this block
    for (int64_t r = 0; r < rows; ++r) {
      float* p = sc + r * BS;
      float bm = ninf;
      for (int64_t j = 0; j < n; ++j) bm = std::max(bm, p[j]);
      if (bm == ninf) {  // every key of this block is masked for this row
        std::fill(p, p + n, 0.0f);
        continue;
      }
      const float mnew = std::max(m[r], bm);
      const float alpha = m[r] == ninf ? 0.0f : std::exp(m[r] - mnew);
      __m512 sum = _mm512_setzero_ps();
      for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 mk = lane_mask(n - j);
        const __m512 x = _mm512_maskz_loadu_ps(mk, p + j);
        const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(ninf), _CMP_NEQ_OQ) & mk;
        const __m512 e = _mm512_maskz_mov_ps(live, exp512(_mm512_sub_ps(x, _mm512_set1_ps(mnew))));
        _mm512_mask_storeu_ps(p + j, mk, e);
        sum = _mm512_add_ps(sum, e);
      }
      l[r] = l[r] * alpha + _mm512_reduce_add_ps(sum);
      m[r] = mnew;
      if (alpha != 1.0f)
        for (int64_t i = 0; i < Dp; i += 16)
          _mm512_storeu_ps(acc + r * Dp + i, _mm512_mul_ps(_mm512_loadu_ps(acc + r * Dp + i), _mm512_set1_ps(alpha)));
    }
    // values: per query row, up to 128 output dims in registers while the block's rows go by
    const float* vals = as_fp32(vb + s0 * a.vs[2], a.vs[2], n, D, Dp, vscratch, vld);
    for (int64_t i0 = 0; i0 < Dp; i0 += 128) {
      const int64_t nv = std::min<int64_t>(8, (Dp - i0) / 16);
      for (int64_t r = 0; r < rows; ++r) {
        __m512 o[8];
        for (int c = 0; c < 8; ++c) o[c] = c < nv ? _mm512_loadu_ps(acc + r * Dp + i0 + 16 * c) : _mm512_setzero_ps();
        for (int64_t j = 0; j < n; ++j) {
          const float pr = sc[r * BS + j];
          if (pr == 0.0f) continue;
          const __m512 pv = _mm512_set1_ps(pr);
          const float* row = vals + j * vld + i0;
          for (int c = 0; c < 8; ++c)
            if (c < nv) o[c] = _mm512_fmadd_ps(pv, _mm512_maskz_loadu_ps(lane_mask(D - i0 - 16 * c), row + 16 * c), o[c]);
        }
        for (int c = 0; c < 8; ++c)
          if (c < nv) _mm512_storeu_ps(acc + r * Dp + i0 + 16 * c, o[c]);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = g * group + r / a.tq, t = r % a.tq;
    T* dst = a.out + ((b * a.hq + h) * a.tq + t) * D;
    const __m512 inv = _mm512_set1_ps(1.0f / l[r]);  // a fully masked row gives inf/NaN, like SDPA
    for (int64_t i = 0; i < D; i += 16)
      store(dst + i, _mm512_mul_ps(_mm512_loadu_ps(acc + r * Dp + i), inv), lane_mask(D - i));
  }
}

}  // namespace

template <typename T>
void attention(const AttnArgs<T>& a, int nthreads) {
  const int64_t items = a.b * a.hk;
  const int64_t work = items * a.s * a.d * (a.hq / a.hk) * a.tq;
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>({(int64_t)nthreads, items, work / (1 << 16)}));
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    std::vector<float> buf;
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) attend_item(a, it / a.hk, it % a.hk, buf);
  }
}

template void attention<float>(const AttnArgs<float>&, int);
template void attention<bf16_t>(const AttnArgs<bf16_t>&, int);

}  // namespace pace_avx512
