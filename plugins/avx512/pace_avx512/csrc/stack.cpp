// The decoder blocks of one forward step in a single call (op `decoder_stack`).
//
// The Python forward spends ~30 calls and ~15 tensor ops per layer around the kernels (about
// 2-3 ms per token on SmolLM2-135M, 15-20% of a 1-thread decode step). Here the same kernels
// run in a C++ loop over the blocks' descriptions (pace_core/stack_spec.py), read once at model
// load: pre-norm (Llama, Qwen2, Phi-3, SmolLM) and sandwich (Gemma 3) blocks with fused QKV,
// QK-norm, rope, the KV cache written in place, attention, output projection and gated MLP.
// The cache is contiguous (per layer [B, Hk, capacity, D], a row per sequence: the caches'
// direct_buffers()) or a block pool (per layer [blocks, Hk, block_size, D] and the step's
// block table: block_buffers() of paged / slab caches), written and read through the table.
// Ragged rows (left-padded batches, prefill chunks and decodes in one step) are packed: the
// real tokens of every row are gathered into one [N, H] matrix, so norms, projections and the
// MLP never compute padding (a step of 32 decodes and one 128-token chunk is 160 rows, not
// 33 x 128), and each run of consecutive rows with the same token count attends as one call
// over views of the step's masks, rope tables and block table. Each row writes its real
// tokens only into the cache, like the cache's own update(); padded positions come back 0.
// When only each row's last position is wanted (`last_only`: logits of the next token, not of
// every prompt token), the last layer computes every token's keys and values but the
// attention, output projection and MLP of the last tokens only (as llama.cpp does), and the
// step returns [B, 1, H]: 1/L of a prompt's work (SmolLM2: 30 layers, Gemma-3-270M: 18).
// A step allocates its intermediate rows once and runs every layer on raw pointers
// (raw_ops.h, stack_layers.h): no tensor op per layer. The ~80 per layer it took before (views,
// outputs, casts) cost ~0.5 ms of a 6.5 ms SmolLM2 q4_0 token on one Zen 4 core.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels.h"
#include "simd.h"
#include "stack_layers.h"
#include "tensor_ops.h"

namespace pace_avx512 {
namespace {

namespace py = pybind11;

struct Step {  // what one forward step provides
  const std::vector<Tensor>& keys;    // per layer: [B, Hk, capacity, D] or a pool [blocks, Hk, bs, D]
  const std::vector<Tensor>& values;
  const std::vector<int64_t>& starts;  // row b's new tokens go to positions starts[b] ...
  const std::vector<int64_t>& counts;  // ... onwards: its last counts[b] query positions
  int64_t length;                     // keys per row after the step (S)
  const std::vector<Tensor>& masks;   // [B, 1, T, S] per distinct window
  const std::vector<std::pair<Tensor, Tensor>>& ropes;  // (cos, sin) [B or 1, T, R] per rotary,
                                                        // in the activation dtype
  const OptTensor& table;             // block caches: [B, blocks per row] int64 block ids
  int64_t block_size;                 // block caches: tokens per block
};

// Consecutive rows [b0, b1) of a step that add `count` tokens each; their packed tokens are
// rows [offset, offset + (b1 - b0) * count) of the step's [N, H] matrix.
struct RowGroup {
  int64_t b0, b1, count, offset;
};

// Runs of equal counts, in row order (rows adding no token are skipped).
std::vector<RowGroup> row_groups(const std::vector<int64_t>& counts) {
  std::vector<RowGroup> groups;
  int64_t offset = 0;
  for (int64_t b = 0; b < (int64_t)counts.size(); ++b) {
    const int64_t c = counts[b];
    if (c == 0) continue;
    if (!groups.empty() && groups.back().b1 == b && groups.back().count == c) ++groups.back().b1;
    else groups.push_back({b, b + 1, c, offset});
    offset += c;
  }
  return groups;
}

template <typename T>
T* data(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// One (token, head) row of D values as an int8 KV row (pace_core/caches/kv_quant.py): the D
// values round(x / scale) (to nearest even: the default MXCSR mode; clamped to +-127), then
// per group of KV8_GROUP values its fp32 scale amax / 127 (a zero group: zeros, scale 0). The
// same fp32 operations as kv_quant.quantize_rows, so both writers store the same bytes.
template <typename T>
void quantize_kv_row(const T* x, int64_t D, int8_t* dst) {
  for (int64_t g0 = 0; g0 < D; g0 += KV8_GROUP) {
    const int64_t end = std::min(D, g0 + KV8_GROUP);
    __m512 mx = _mm512_setzero_ps();
    for (int64_t i = g0; i < end; i += 16) mx = _mm512_max_ps(mx, _mm512_abs_ps(load(x + i, lane_mask(end - i))));
    const float amax = _mm512_reduce_max_ps(mx);
    const float scale = amax / 127.0f;
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t i = g0; i < end; i += 16) {
      const __mmask16 mk = lane_mask(end - i);
      __m512i q = _mm512_setzero_si512();
      if (amax > 0) {
        q = _mm512_cvtps_epi32(_mm512_div_ps(load(x + i, mk), vs));
        q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
      }
      _mm512_mask_cvtepi32_storeu_epi8(dst + i, mk, q);
    }
    std::memcpy(dst + D + 4 * (g0 / KV8_GROUP), &scale, sizeof(float));
  }
}

// Group g's k or v rows (its tokens' rows `ld` apart in the qkv rows, heads D apart) into the
// cache at positions starts[b] + j: plain row copies, or int8 rows (an int8 pool). Contiguous:
// row b's position p is [b, h, p]; block pool: [table[b, p / bs], h, p % bs].
template <typename T>
void write_cache(const Tensor& cache, const T* x, int64_t ld, int64_t H, int64_t D, const Step& s,
                 const RowGroup& g) {
  const bool q8 = cache.scalar_type() == at::kChar;
  char* dst = static_cast<char*>(cache.data_ptr());
  const int64_t elt = q8 ? 1 : (int64_t)sizeof(T);
  const int64_t st0 = cache.stride(0), st1 = cache.stride(1), st2 = cache.stride(2);
  const int64_t* table = s.table ? s.table->data_ptr<int64_t>() : nullptr;
  const int64_t table_stride = s.table ? s.table->stride(0) : 0;
  for (int64_t b = g.b0; b < g.b1; ++b)
    for (int64_t j = 0; j < g.count; ++j) {
      const int64_t pos = s.starts[b] + j;
      // (slot, offset): the cache row and position within it that hold token `pos`
      const int64_t slot = table ? table[b * table_stride + pos / s.block_size] : b;
      const int64_t off = table ? pos % s.block_size : pos;
      const T* row = x + ((b - g.b0) * g.count + j) * ld;
      for (int64_t h = 0; h < H; ++h) {
        char* out = dst + (slot * st0 + h * st1 + off * st2) * elt;
        if (q8) quantize_kv_row(row + h * D, D, reinterpret_cast<int8_t*>(out));
        else std::memcpy(out, row + h * D, D * sizeof(T));
      }
    }
}

// One step's rows, [N, width] each, reused by every layer.
template <typename T>
struct Rows {
  T* h;    // a norm's output, the projections' input
  T* qkv;  // q | k | v of each token
  T* att;  // attention output, heads side by side
  T* y;    // output projection
  T* gu;   // quantized MLP: gate | up
  T* act;  // act(gate) * up
};

// Group g's attention over its tokens' qkv rows: QK-norms and rope in place, k and v into the
// caches, the output into its rows of `att`.
// With `last`, only each row's last token attends, its output in row b of `att` (the rows'
// other tokens still write their keys and values).
template <typename T>
void attend_group(const LayerSpec& L, const Step& s, const RowGroup& g, int64_t steps, Rows<T>& w,
                  int nt, bool last = false) {
  const int64_t n = g.b1 - g.b0, c = g.count, ldq = L.nq + L.nk + L.nv;
  T* q = w.qkv + g.offset * ldq;
  T* k = q + L.nq;
  const T* v = k + L.nk;
  if (L.q_norm.on || L.k_norm.on) {  // a token's heads are rows of d
    const int64_t grain = std::max<int64_t>(1, MIN_VALUES_PER_THREAD / ((L.hq + L.hk) * L.d));
    at::parallel_for(0, n * c, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        T* qr = q + r * ldq;
        T* kr = k + r * ldq;
        if (L.q_norm.on) L.q_norm(qr, (const T*)nullptr, L.hq, L.d, qr, (T*)nullptr, 1);
        if (L.k_norm.on) L.k_norm(kr, (const T*)nullptr, L.hk, L.d, kr, (T*)nullptr, 1);
      }
    });
  }
  if (L.rope >= 0) {  // the group's rows and last c positions of the step's tables
    const auto& [cos, sin] = s.ropes[L.rope];
    const int64_t R = cos.size(2), bs = cos.size(0) == 1 ? 0 : steps * R;
    TORCH_CHECK(R <= L.d, "pace_avx512: decoder stack rope table of ", R, " dims > head dim ", L.d);
    const int64_t off = g.b0 * bs + (steps - c) * R, qs[3] = {c * ldq, ldq, L.d}, cs[2] = {bs, R};
    rope_rows(q, qs, L.hq, k, qs, L.hk, data<T>(cos) + off, data<T>(sin) + off, cs, n, c, R,
              L.interleaved, nt);
  }
  const Tensor& keys = s.keys[L.layer];
  const Tensor& values = s.values[L.layer];
  write_cache(keys, k, ldq, L.hk, L.d, s, g);
  write_cache(values, v, ldq, L.hk, L.d, s, g);
  const Tensor& mask = s.masks[L.mask];  // [B or 1, 1, T, S]
  const int64_t mb = mask.size(0) == 1 ? 0 : mask.stride(0);
  AttnArgs<T> a{};
  const bool q8 = keys.scalar_type() == at::kChar;  // int8 KV rows (kv_quant.py)
  if (q8) a.k8 = data<int8_t>(keys), a.v8 = data<int8_t>(values);
  else a.k = data<T>(keys), a.v = data<T>(values);
  for (int i = 0; i < 3; ++i) a.ks[i] = keys.stride(i), a.vs[i] = values.stride(i);
  if (s.table) {
    a.table = s.table->data_ptr<int64_t>() + g.b0 * s.table->stride(0);
    a.table_stride = s.table->stride(0), a.block_size = s.block_size;
  } else if (q8) {
    a.k8 += g.b0 * a.ks[0], a.v8 += g.b0 * a.vs[0];
  } else {
    a.k += g.b0 * a.ks[0], a.v += g.b0 * a.vs[0];
  }
  const int64_t tq = last ? 1 : c;  // the group's last tq tokens attend
  a.q = q + (c - tq) * ldq;
  a.qs[0] = c * ldq, a.qs[1] = L.d, a.qs[2] = ldq;  // b, h, t
  a.mask = mask.data_ptr<bool>() + g.b0 * mb + (steps - tq) * mask.stride(2);
  a.ms[0] = mb, a.ms[1] = mask.stride(2), a.ms[2] = mask.stride(3);
  a.sinks = L.sinks.defined() ? L.sinks.data_ptr<float>() : nullptr;
  a.scale = (float)L.scale;
  a.b = n, a.hq = L.hq, a.hk = L.hk, a.tq = tq, a.s = mask.size(3), a.d = L.d;
  a.out = w.att + (last ? g.b0 : g.offset) * L.nq;
  a.os[0] = tq * L.nq, a.os[1] = L.d, a.os[2] = L.nq;
  attention<T>(a, nt);
}

// The caches of a step: contiguous [B, Hk, >= length, D] per layer, or block pools of one
// block count, the table's ids inside them and its rows long enough for every row's keys.
// Block pools may hold int8 KV rows (kv_quant.py: [blocks, Hk, bs, kv8_row_bytes(D)] int8).
void check_caches(const std::vector<Tensor>& keys, const std::vector<Tensor>& values,
                  const OptTensor& table, int64_t block_size, int64_t B, int64_t length,
                  at::ScalarType act) {
  TORCH_CHECK(keys.size() == values.size(), "pace_avx512: decoder stack key and value caches");
  const at::ScalarType dtype = !keys.empty() && table && keys[0].scalar_type() == at::kChar ? at::kChar : act;
  for (size_t i = 0; i < keys.size(); ++i)
    TORCH_CHECK(keys[i].dim() == 4 && values[i].sizes() == keys[i].sizes() &&
                    keys[i].is_contiguous() && values[i].is_contiguous() &&
                    keys[i].scalar_type() == dtype && values[i].scalar_type() == dtype,
                "pace_avx512: decoder stack cache ", i, " must be contiguous ", dtype, " K/V of "
                "one shape, got ", keys[i].sizes(), " ", keys[i].scalar_type());
  if (!table) {
    for (const Tensor& c : keys)
      TORCH_CHECK(c.size(0) == B && c.size(2) >= length, "pace_avx512: cache rows");
    return;
  }
  TORCH_CHECK(table->scalar_type() == at::kLong && table->dim() == 2 && table->size(0) == B &&
                  table->stride(1) == 1 && block_size > 0 && table->size(1) * block_size >= length,
              "pace_avx512: decoder stack block table ", table->sizes(), " / block size ",
              block_size, " does not cover ", length, " keys of ", B, " rows");
  const int64_t blocks = keys.empty() ? 0 : keys[0].size(0);
  for (const Tensor& c : keys)
    TORCH_CHECK(c.size(0) == blocks && c.size(2) == block_size,
                "pace_avx512: decoder stack pools ", c.sizes(), " differ from ", blocks,
                " blocks of ", block_size);
  const int64_t* ids = table->data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < table->size(1); ++i) {
      const int64_t id = ids[b * table->stride(0) + i];
      TORCH_CHECK(id >= 0 && id < blocks, "pace_avx512: block table row ", b, " names block ", id,
                  " of a pool of ", blocks);
    }
}

// The step's masks ([B or 1, 1, T, S <= length] bool) and rope tables ([B or 1, T, R], R even),
// the tables converted to the activation dtype once for every layer.
std::vector<std::pair<Tensor, Tensor>> check_tables(const std::vector<Tensor>& masks,
                                                    const std::vector<std::pair<Tensor, Tensor>>& ropes,
                                                    int64_t B, int64_t T, int64_t length,
                                                    at::ScalarType dtype) {
  for (const Tensor& m : masks)
    TORCH_CHECK(m.scalar_type() == at::kBool && m.dim() == 4 && (m.size(0) == 1 || m.size(0) == B) &&
                    m.size(1) == 1 && m.size(2) == T && m.size(3) <= length,
                "pace_avx512: decoder stack mask ", m.sizes(), " for ", B, " rows of ", T,
                " positions and ", length, " keys");
  std::vector<std::pair<Tensor, Tensor>> tables;
  for (const auto& [cos, sin] : ropes) {
    TORCH_CHECK(cos.dim() == 3 && cos.sizes() == sin.sizes() && (cos.size(0) == 1 || cos.size(0) == B) &&
                    cos.size(1) == T && cos.size(2) % 2 == 0,
                "pace_avx512: decoder stack rope tables ", cos.sizes(), " for ", B, " rows of ", T);
    tables.emplace_back(cos.to(dtype).contiguous(), sin.to(dtype).contiguous());
  }
  return tables;
}

// act(x @ gate^T) * (x @ up^T) @ down^T for the step's N rows of h into out.
template <typename T>
void mlp(const LayerSpec& L, const T* h, int64_t N, Rows<T>& w, T* out, int nt) {
  if (L.quantized_mlp) {
    L.q_gate_up(h, N, w.gu, nt);
    gated_act_rows(w.gu, w.gu + L.inter, 2 * L.inter, N, L.inter, (int)L.act, w.act, nt);
    L.q_down(w.act, N, out, L.hidden, nt);
  } else {  // the activation fused in the gate/up pass
    gated_rows(h, L.hidden, N, L.hidden, L.gate_up.data_ptr(), L.inter, (int)L.act, w.act, L.inter, nt);
    L.dense_down(w.act, N, out, L.hidden, nt);
  }
}

// The attention block of the step's N rows of h into out; with `last`, of each row's last
// token only (out gets a row per step row; every row has a token, so the groups end at B).
template <typename T>
void attention_block(const LayerSpec& L, const T* h, int64_t N, const Step& s,
                     const std::vector<RowGroup>& groups, int64_t steps, Rows<T>& w, T* out, int nt,
                     bool last = false) {
  L.qkv(h, N, w.qkv, nt);
  for (const RowGroup& g : groups) attend_group(L, s, g, steps, w, nt, last);
  L.o(w.att, last ? groups.back().b1 : N, out, L.hidden, nt);
}

// Row b's last token's row of the packed [N, H] x moved to row b (rows in order; every row
// has a token, so a row is never overwritten before it is moved).
template <typename T>
void keep_last_tokens(T* x, int64_t H, const std::vector<RowGroup>& groups) {
  for (const RowGroup& g : groups)
    for (int64_t b = g.b0; b < g.b1; ++b) {
      const int64_t from = g.offset + (b - g.b0 + 1) * g.count - 1;
      if (from != b) std::memcpy(x + b * H, x + from * H, H * sizeof(T));
    }
}

class DecoderStack {
 public:
  DecoderStack(const py::list& blocks, const std::vector<int64_t>& rope_slots,
               const std::vector<int64_t>& mask_slots) {
    TORCH_CHECK(rope_slots.size() == blocks.size() && mask_slots.size() == blocks.size(),
                "pace_avx512: decoder stack needs a rope and a mask slot per block");
    for (size_t i = 0; i < blocks.size(); ++i)
      layers_.push_back(layer_spec(blocks[i], rope_slots[i], mask_slots[i]));
  }

  // (x, residual) after every block; the hidden state is x + residual, as in Python.
  std::tuple<Tensor, OptTensor> run(Tensor x, OptTensor residual, const std::vector<Tensor>& keys,
                                    const std::vector<Tensor>& values,
                                    const std::vector<int64_t>& starts,
                                    const std::vector<int64_t>& counts, int64_t length,
                                    const std::vector<Tensor>& masks,
                                    const std::vector<std::pair<Tensor, Tensor>>& ropes,
                                    const OptTensor& block_table, int64_t block_size,
                                    bool last_only) const {
    TORCH_CHECK(x.dim() == 3, "pace_avx512: decoder stack input must be [B, T, H]");
    const int64_t B = x.size(0), T = x.size(1);
    TORCH_CHECK((int64_t)starts.size() == B && (int64_t)counts.size() == B,
                "pace_avx512: decoder stack needs a start and a count per row");
    for (int64_t b = 0; b < B; ++b)
      TORCH_CHECK(counts[b] >= 0 && counts[b] <= T && starts[b] >= 0 && starts[b] + counts[b] <= length,
                  "pace_avx512: decoder stack row ", b, " writes outside its cache");
    const at::ScalarType dtype = x.scalar_type();
    TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat,
                "pace_avx512: decoder stack activations must be float32 or bfloat16, got ", dtype);
    TORCH_CHECK(!residual || (residual->sizes() == x.sizes() && residual->scalar_type() == dtype),
                "pace_avx512: decoder stack residual ", residual ? residual->sizes() : x.sizes(),
                " differs from x ", x.sizes());
    check_caches(keys, values, block_table, block_size, B, length, dtype);
    const auto tables = check_tables(masks, ropes, B, T, length, dtype);
    for (const LayerSpec& L : layers_) {
      TORCH_CHECK(L.layer < (int64_t)keys.size() && L.mask < (int64_t)masks.size() &&
                      L.rope < (int64_t)ropes.size(),
                  "pace_avx512: decoder stack step is missing caches, masks or rope tables");
      const int64_t row = keys[L.layer].scalar_type() == at::kChar ? kv8_row_bytes(L.d) : L.d;
      TORCH_CHECK(keys[L.layer].size(1) == L.hk && keys[L.layer].size(3) == row,
                  "pace_avx512: decoder stack cache ", L.layer, " ", keys[L.layer].sizes(),
                  " does not hold ", L.hk, " heads of ", L.d);
      TORCH_CHECK(L.hidden == x.size(2) && (L.dense_dtype == at::ScalarType::Undefined || L.dense_dtype == dtype),
                  "pace_avx512: decoder stack weights are for ", L.dense_dtype, " rows of ",
                  L.hidden, ", not ", dtype, " rows of ", x.size(2));
    }
    const Step s{keys, values, starts, counts, length, masks, tables, block_table, block_size};
    const std::vector<RowGroup> groups = row_groups(counts);
    const int64_t H = x.size(2);
    int64_t N = 0;
    for (const int64_t c : counts) N += c;
    // the real tokens [N, H]: row b's last counts[b] positions (all of x when nothing is padded)
    Tensor index;
    if (N != B * T) {
      index = at::empty({N}, x.options().dtype(at::kLong));
      int64_t* idx = index.data_ptr<int64_t>();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = T - counts[b]; t < T; ++t) *idx++ = b * T + t;
    }
    const auto pack = [&](const Tensor& t) {
      const Tensor flat = t.reshape({B * T, H});
      return (index.defined() ? flat.index_select(0, index) : flat).contiguous();
    };
    Tensor xr = pack(x);
    OptTensor rr = residual ? OptTensor(pack(*residual)) : OptTensor();
    // the last tokens alone through the last layer: worth it when some row has several
    // tokens, and defined when every row has one
    const bool last = last_only && N > B && !layers_.empty() &&
                      std::all_of(counts.begin(), counts.end(), [](int64_t c) { return c > 0; });
    if (N > 0 && !layers_.empty()) {
      if (dtype == at::kBFloat16) std::tie(xr, rr) = run_rows<bf16_t>(xr, rr, s, groups, T, last);
      else std::tie(xr, rr) = run_rows<float>(xr, rr, s, groups, T, last);
    }
    if (last) return {xr.view({B, 1, H}), rr ? OptTensor(rr->view({B, 1, H})) : OptTensor()};
    const auto unpack = [&](const Tensor& t) {  // back to [B, T, H], padded positions 0
      if (!index.defined()) return t.reshape({B, T, H});
      return at::zeros({B * T, H}, t.options()).index_copy_(0, index, t).view({B, T, H});
    };
    return {unpack(xr), rr ? OptTensor(unpack(*rr)) : OptTensor()};
  }

  size_t size() const { return layers_.size(); }

 private:
  // Every layer over the step's packed rows x [N, H] (and residual): no tensor op per layer, the
  // intermediate rows allocated once. Returns the last block's (x, residual) as new tensors.
  // With `last` (every step row has a token), the last layer runs the attention, projection
  // and MLP of each row's last token only, and the result has a row per step row.
  template <typename T>
  std::tuple<Tensor, Tensor> run_rows(const Tensor& x, const OptTensor& residual, const Step& s,
                                      const std::vector<RowGroup>& groups, int64_t steps,
                                      bool last) const {
    int64_t N = x.size(0);
    const int64_t H = x.size(1);
    const int nt = at::get_num_threads();
    int64_t wq = 0, wa = 0, wg = 0, wi = 0;
    for (const LayerSpec& L : layers_)
      wq = std::max(wq, L.qkv.width()), wa = std::max(wa, L.nq),
      wg = std::max(wg, L.quantized_mlp ? 2 * L.inter : 0), wi = std::max(wi, L.inter);
    const int64_t widths[6] = {H, wq, wa, H, wg, wi};  // Rows' fields, in order
    int64_t total = 0;
    for (const int64_t wd : widths) total += (N * wd + 31) / 32 * 32;  // 64-byte aligned starts
    const Tensor scratch = at::empty({total}, x.options());
    T* p = data<T>(scratch);
    T* fields[6];
    for (int i = 0; i < 6; ++i) fields[i] = p, p += (N * widths[i] + 31) / 32 * 32;
    Rows<T> w{fields[0], fields[1], fields[2], fields[3], fields[4], fields[5]};
    Tensor X = at::empty({N, H}, x.options()), R = at::empty({N, H}, x.options());
    const T* xp = data<T>(x);  // the step's input, read only
    const T* rp = residual ? data<T>(*residual) : nullptr;
    for (const LayerSpec& L : layers_) {
      const auto& n = L.norms;  // R = x + residual (x alone at first), h = norm(R)
      n[0](xp, rp, N, H, w.h, rp ? data<T>(R) : nullptr, nt);
      if (!rp) std::memcpy(data<T>(R), xp, N * H * sizeof(T));
      const bool prune = last && &L == &layers_.back();
      attention_block(L, w.h, N, s, groups, steps, w, w.y, nt, prune);
      if (prune) {  // from here on, a row per step row
        keep_last_tokens(data<T>(R), H, groups);
        N = groups.back().b1;
      }
      if (!L.sandwich) {
        n[1](w.y, data<T>(R), N, H, w.h, data<T>(R), nt);
      } else {  // post-attention norm alone, then the pre-MLP norm with the residual
        n[1](w.y, (const T*)nullptr, N, H, w.y, (T*)nullptr, nt);
        n[2](w.y, data<T>(R), N, H, w.h, data<T>(R), nt);
      }
      mlp(L, w.h, N, w, data<T>(X), nt);
      if (L.sandwich) n[3](data<T>(X), (const T*)nullptr, N, H, data<T>(X), (T*)nullptr, nt);
      xp = data<T>(X), rp = data<T>(R);
    }
    if (last) return {X.narrow(0, 0, N), R.narrow(0, 0, N)};
    return {X, R};
  }

  std::vector<LayerSpec> layers_;
};

}  // namespace

void register_decoder_stack(py::module_& m) {
  py::class_<DecoderStack>(m, "DecoderStack",
                           "the decoder blocks of a forward step in one call (see stack.cpp)")
      .def(py::init<const py::list&, const std::vector<int64_t>&, const std::vector<int64_t>&>(),
           py::kw_only(), py::arg("blocks"), py::arg("rope_slots"), py::arg("mask_slots"))
      .def("run", &DecoderStack::run, py::call_guard<py::gil_scoped_release>(),  // see bindings.cpp
           py::arg("x"), py::arg("residual"), py::arg("keys"),
           py::arg("values"), py::arg("starts"), py::arg("counts"), py::arg("length"),
           py::arg("masks"), py::arg("ropes"), py::arg("block_table") = py::none(),
           py::arg("block_size") = 0, py::arg("last_only") = false)
      .def("__len__", &DecoderStack::size);
}

}  // namespace pace_avx512
