// Decode attention over contiguous-in-D K/V [B, Hk, S, D] with GQA, a boolean mask
// (True = attend) and optional sinks, as pace_native.kernels.attention for few queries.
//
// One work item is (batch row, KV head): all `group * T` query rows of that KV head are
// scored against each key as it streams by, so K and V are read once per KV head. Keys are
// taken in blocks of BS with an online softmax (running max m, running sum l, rescaled
// accumulator), so no [rows, S] score matrix is kept. A sink joins the softmax denominator
// only: it starts as (m = sink, l = 1). All math is fp32.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
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

template <typename T>
void attend_item(const AttnArgs<T>& a, int64_t b, int64_t g, std::vector<float>& buf) {
  const int64_t group = a.hq / a.hk, rows = group * a.tq, D = a.d, Dp = (D + 15) / 16 * 16;
  buf.assign(rows * (Dp * 2 + BS + 2), 0.0f);
  float* qf = buf.data();          // [rows, Dp] scaled queries
  float* acc = qf + rows * Dp;     // [rows, Dp] unnormalised outputs
  float* sc = acc + rows * Dp;     // [rows, BS] scores of the current block
  float* m = sc + rows * BS;       // [rows] running max
  float* l = m + rows;             // [rows] running sum
  const float ninf = -std::numeric_limits<float>::infinity();
  const __m512 vscale = _mm512_set1_ps(a.scale);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = g * group + r / a.tq, t = r % a.tq;
    const T* src = a.q + b * a.qs[0] + h * a.qs[1] + t * a.qs[2];
    for (int64_t i = 0; i < D; i += 16) {
      const __mmask16 mk = lane_mask(D - i);
      _mm512_storeu_ps(qf + r * Dp + i, _mm512_mul_ps(load(src + i, mk), vscale));
    }
    m[r] = a.sinks ? a.sinks[h] : ninf;
    l[r] = a.sinks ? 1.0f : 0.0f;
  }
  const T* kb = a.k + b * a.ks[0] + g * a.ks[1];
  const T* vb = a.v + b * a.vs[0] + g * a.vs[1];
  for (int64_t s0 = 0; s0 < a.s; s0 += BS) {
    const int64_t n = std::min(BS, a.s - s0);
    // scores: each key row is loaded once and dotted with every query row
    for (int64_t j = 0; j < n; ++j) {
      const T* key = kb + (s0 + j) * a.ks[2];
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = r % a.tq;
        if (!a.mask[b * a.ms[0] + t * a.ms[1] + (s0 + j) * a.ms[2]]) {
          sc[r * BS + j] = ninf;
          continue;
        }
        __m512 dot = _mm512_setzero_ps();
        for (int64_t i = 0; i < D; i += 16)
          dot = _mm512_fmadd_ps(_mm512_loadu_ps(qf + r * Dp + i), load(key + i, lane_mask(D - i)), dot);
        sc[r * BS + j] = _mm512_reduce_add_ps(dot);
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
    // values: each value row is loaded once and added to every query row's accumulator
    for (int64_t j = 0; j < n; ++j) {
      const T* val = vb + (s0 + j) * a.vs[2];
      for (int64_t i = 0; i < D; i += 16) {
        const __m512 vv = load(val + i, lane_mask(D - i));
        for (int64_t r = 0; r < rows; ++r) {
          const float pr = sc[r * BS + j];
          if (pr != 0.0f)
            _mm512_storeu_ps(acc + r * Dp + i,
                             _mm512_fmadd_ps(_mm512_set1_ps(pr), vv, _mm512_loadu_ps(acc + r * Dp + i)));
        }
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
