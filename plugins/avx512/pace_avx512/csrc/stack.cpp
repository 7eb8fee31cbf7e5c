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
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor_ops.h"

namespace pace_avx512 {
namespace {

namespace py = pybind11;

struct NormSpec {
  bool on = false;
  Tensor weight;
  OptTensor bias;
  double eps = 0;
  bool rms = true;

  std::tuple<Tensor, Tensor> operator()(const Tensor& x, const OptTensor& residual) const {
    return norm(x, weight, bias, eps, residual, rms);
  }
};

struct LinearSpec {
  Tensor weight;
  OptTensor bias;
  int64_t n = 0;
  int64_t kind = -1;  // -1: dense packed (packing.PackedLinear); else a qpacking.KINDS value

  Tensor operator()(const Tensor& x) const {
    return kind < 0 ? linear(x, weight, bias, n) : qlinear(x, weight, bias, n, kind);
  }
};

// A projection held as one matrix, or (quantized, formats differing) one per part whose
// outputs are concatenated: QKV as (q, k, v), gate/up as (gate, up).
struct Projection {
  std::vector<LinearSpec> parts;

  Tensor operator()(const Tensor& x) const {
    if (parts.size() == 1) return parts[0](x);
    std::vector<Tensor> outs;
    for (const auto& p : parts) outs.push_back(p(x));
    return at::cat(outs, -1);
  }
};

struct LayerSpec {
  bool sandwich = false;
  std::vector<NormSpec> norms;  // pre-norm: norm1, norm2; sandwich: pre/post attn, pre/post mlp
  Projection qkv;
  LinearSpec o;
  int64_t nq = 0, nk = 0, nv = 0;  // columns of q, k, v in the qkv output
  NormSpec q_norm, k_norm;
  Tensor gate_up, down;  // dense: the packed interleaved gate/up and down
  Projection q_gate_up;  // quantized: [gate; up] (or gate, up) and down, activation in between
  LinearSpec q_down;
  bool quantized_mlp = false;
  int64_t inter = 0, hidden = 0, act = 0;
  int64_t layer = 0, hq = 0, hk = 0, d = 0;
  double scale = 1.0;
  int64_t rope = -1;  // index into the step's rope tables, -1: none
  bool interleaved = false;
  int64_t mask = 0;  // index into the step's masks (one per distinct window)
  OptTensor sinks;
};

// The layers are read once, when the stack is built, from the descriptions of
// pace_core/stack_spec.py (the blocks' describe()) and the packed weights of
// pace_avx512/packing.py they hold, by attribute name.
template <typename T>
T field(const py::handle& o, const char* name) {
  return o.attr(name).cast<T>();
}

OptTensor optional_tensor(const py::handle& o, const char* name) {
  const py::object v = o.attr(name);
  return v.is_none() ? OptTensor() : OptTensor(v.cast<Tensor>());
}

NormSpec norm_spec(const py::handle& spec) {  // a stack_spec.NormSpec or None
  NormSpec s;
  if (spec.is_none()) return s;
  const auto op = field<std::string>(spec, "op");
  TORCH_CHECK(op == "rms_norm" || op == "layer_norm", "pace_avx512: decoder stack norm op ", op);
  s.on = true;
  s.weight = field<Tensor>(spec, "weight");
  s.bias = optional_tensor(spec, "bias");
  s.eps = field<double>(spec, "eps");
  s.rms = op == "rms_norm";
  return s;
}

// A packing.PackedLinear, or a qpacking.QPackedLinear (which has a `kind`).
LinearSpec linear_spec(const py::handle& packed) {
  const bool quantized = py::hasattr(packed, "kind");
  return {field<Tensor>(packed, "weight"), optional_tensor(packed, "bias"),
          field<int64_t>(packed, "out_features"), quantized ? field<int64_t>(packed, "kind") : -1};
}

// One packed linear, or a tuple of them (quantized parts in different formats).
Projection projection(const py::handle& packed) {
  Projection p;
  if (py::isinstance<py::tuple>(packed))
    for (const auto& part : packed) p.parts.push_back(linear_spec(part));
  else
    p.parts.push_back(linear_spec(packed));
  return p;
}

// A stack_spec.BlockSpec; `rope` and `mask` index the step's rope tables and masks.
LayerSpec layer_spec(const py::handle& block, int64_t rope, int64_t mask) {
  LayerSpec L;
  const auto kind = field<std::string>(block, "kind");
  TORCH_CHECK(kind == "pre_norm" || kind == "sandwich", "pace_avx512: decoder stack runs pre-norm "
              "and sandwich blocks, not ", kind);
  L.sandwich = kind == "sandwich";
  for (const auto& n : block.attr("norms")) L.norms.push_back(norm_spec(n));
  TORCH_CHECK(L.norms.size() == (L.sandwich ? 4u : 2u), "pace_avx512: decoder stack norms");
  const py::object attn = block.attr("attention");
  L.layer = field<int64_t>(attn, "layer");
  L.hq = field<int64_t>(attn, "num_heads");
  L.hk = field<int64_t>(attn, "num_kv_heads");
  L.d = field<int64_t>(attn, "head_dim");
  L.scale = field<double>(attn, "scale");
  const OptTensor sinks = optional_tensor(attn, "sinks");
  if (sinks) L.sinks = sinks->to(at::kFloat).contiguous();
  L.q_norm = norm_spec(attn.attr("q_norm"));
  L.k_norm = norm_spec(attn.attr("k_norm"));
  const py::object rotary = attn.attr("rope");
  L.rope = rotary.is_none() ? -1 : rope;
  L.interleaved = !rotary.is_none() && field<bool>(rotary, "interleaved");
  L.mask = mask;
  const py::object qkv = attn.attr("qkv").attr("weight");  // a packing.PackedQKV
  L.qkv = projection(qkv.attr("linear"));
  L.nq = L.hq * L.d, L.nk = L.nv = L.hk * L.d;
  TORCH_CHECK(field<std::vector<int64_t>>(qkv, "sizes") == std::vector<int64_t>({L.nq, L.nk, L.nv}),
              "pace_avx512: decoder stack QKV sizes differ from the heads");
  L.o = linear_spec(attn.attr("o_proj").attr("weight"));
  // a packing.PackedGatedMLP, or a qpacking.QPackedGatedMLP (gate_up/down packed linears)
  const py::object mlp = block.attr("mlp").attr("kernel").attr("weight");
  L.inter = field<int64_t>(mlp, "intermediate");
  L.hidden = field<int64_t>(mlp, "hidden");
  L.act = field<int64_t>(mlp, "activation");
  L.quantized_mlp = py::hasattr(mlp.attr("down"), "kind");  // a qpacking.QPackedLinear
  if (L.quantized_mlp) {
    L.q_gate_up = projection(mlp.attr("gate_up"));
    L.q_down = linear_spec(mlp.attr("down"));
  } else {
    L.gate_up = field<Tensor>(mlp, "gate_up");
    L.down = field<Tensor>(mlp, "down");
  }
  return L;
}

struct Step {  // what one forward step provides
  const std::vector<Tensor>& keys;    // per layer: [B, Hk, capacity, D] or a pool [blocks, Hk, bs, D]
  const std::vector<Tensor>& values;
  const std::vector<int64_t>& starts;  // row b's new tokens go to positions starts[b] ...
  const std::vector<int64_t>& counts;  // ... onwards: its last counts[b] query positions
  int64_t length;                     // keys per row after the step (S)
  const std::vector<Tensor>& masks;   // [B, 1, T, S] per distinct window
  const std::vector<std::pair<Tensor, Tensor>>& ropes;  // (cos, sin) [B, T, R] per rotary
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

// Group g's tokens of x [n, c, H, D] (D contiguous) into the cache at positions starts[b] + j:
// plain row copies, no tensor ops (a decode step writes 2 * H rows of D here).
// Contiguous: row b's position p is [b, h, p]; block pool: [table[b, p / bs], h, p % bs].
void write_cache(const Tensor& cache, const Tensor& x, const Step& s, const RowGroup& g) {
  TORCH_CHECK(cache.is_contiguous() && x.stride(3) == 1 && cache.scalar_type() == x.scalar_type(),
              "pace_avx512: decoder stack cache write layout");
  const int64_t H = x.size(2), D = x.size(3);
  const int64_t cap = cache.size(2), row = D * x.element_size();
  char* dst = static_cast<char*>(cache.data_ptr());
  const char* src = static_cast<const char*>(x.data_ptr());
  const int64_t es = x.element_size();
  const int64_t* table = s.table ? s.table->data_ptr<int64_t>() : nullptr;
  const int64_t table_stride = s.table ? s.table->stride(0) : 0;
  for (int64_t b = g.b0; b < g.b1; ++b)
    for (int64_t j = 0; j < g.count; ++j) {
      const int64_t pos = s.starts[b] + j;
      // (slot, offset): the cache row and position within it that hold token `pos`
      const int64_t slot = table ? table[b * table_stride + pos / s.block_size] : b;
      const int64_t off = table ? pos % s.block_size : pos;
      for (int64_t h = 0; h < H; ++h)
        std::memcpy(dst + (((slot * H + h) * cap + off) * D) * es,
                    src + ((b - g.b0) * x.stride(0) + j * x.stride(1) + h * x.stride(2)) * es, row);
    }
}

// Attention of one row group over the packed qkv rows of its tokens: [n * c, hq * d].
Tensor attend_group(const LayerSpec& L, const Tensor& qkv, const Step& s, const RowGroup& g,
                    int64_t T) {
  const int64_t n = g.b1 - g.b0, c = g.count;
  const Tensor rows = qkv.narrow(0, g.offset, n * c);
  Tensor q = rows.narrow(-1, 0, L.nq).view({n, c, L.hq, L.d});
  Tensor k = rows.narrow(-1, L.nq, L.nk).view({n, c, L.hk, L.d});
  const Tensor v = rows.narrow(-1, L.nq + L.nk, L.nv).view({n, c, L.hk, L.d});
  if (L.q_norm.on) q = std::get<0>(L.q_norm(q, c10::nullopt));
  if (L.k_norm.on) k = std::get<0>(L.k_norm(k, c10::nullopt));
  if (L.rope >= 0) {  // the group's rows and last c positions of the step's [B, T, R] tables
    const auto& [cos, sin] = s.ropes[L.rope];
    const auto part = [&](const Tensor& t) {
      return t.size(0) == 1 ? t.narrow(1, T - c, c) : t.narrow(0, g.b0, n).narrow(1, T - c, c);
    };
    std::tie(q, k) = rope(q, k, part(cos), part(sin), L.interleaved);
  }
  const Tensor& keys = s.keys[L.layer];
  const Tensor& values = s.values[L.layer];
  write_cache(keys, k, s, g);
  write_cache(values, v, s, g);
  const Tensor& full = s.masks[L.mask];  // [B or 1, 1, T, S]
  const Tensor mask = (full.size(0) == 1 ? full : full.narrow(0, g.b0, n)).narrow(2, T - c, c);
  const Tensor out =
      s.table ? attend(q.transpose(1, 2), keys, values, mask, L.scale, L.sinks,
                       s.table->narrow(0, g.b0, n), s.block_size)
              : attend(q.transpose(1, 2), keys.narrow(0, g.b0, n).narrow(2, 0, s.length),
                       values.narrow(0, g.b0, n).narrow(2, 0, s.length), mask, L.scale, L.sinks,
                       c10::nullopt, 0);
  return out.transpose(1, 2).reshape({n * c, L.hq * L.d});
}

// h: the step's packed tokens [N, H].
Tensor attention_block(const LayerSpec& L, const Tensor& h, const Step& s,
                       const std::vector<RowGroup>& groups, int64_t T) {
  const Tensor qkv = L.qkv(h);
  if (groups.size() == 1) return L.o(attend_group(L, qkv, s, groups[0], T));
  Tensor out = at::empty({h.size(0), L.hq * L.d}, h.options());
  for (const RowGroup& g : groups)
    out.narrow(0, g.offset, (g.b1 - g.b0) * g.count).copy_(attend_group(L, qkv, s, g, T));
  return L.o(out);
}

// The caches of a step: contiguous [B, Hk, >= length, D] per layer, or block pools of one
// block count, the table's ids inside them and its rows long enough for every row's keys.
void check_caches(const std::vector<Tensor>& keys, const std::vector<Tensor>& values,
                  const OptTensor& table, int64_t block_size, int64_t B, int64_t length) {
  TORCH_CHECK(keys.size() == values.size(), "pace_avx512: decoder stack key and value caches");
  for (size_t i = 0; i < keys.size(); ++i)
    TORCH_CHECK(keys[i].dim() == 4 && values[i].sizes() == keys[i].sizes(),
                "pace_avx512: decoder stack cache ", i, " shapes");
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

Tensor mlp(const LayerSpec& L, const Tensor& h) {
  if (!L.quantized_mlp) return gated_mlp(h, L.gate_up, L.down, L.inter, L.hidden, L.act);
  const Tensor gu = L.q_gate_up(h);
  const Tensor gate = gu.narrow(-1, 0, L.inter), up = gu.narrow(-1, L.inter, L.inter);
  return L.q_down(gated_activation(gate, up, L.act));
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
                                    const OptTensor& block_table, int64_t block_size) const {
    TORCH_CHECK(x.dim() == 3, "pace_avx512: decoder stack input must be [B, T, H]");
    const int64_t B = x.size(0), T = x.size(1);
    TORCH_CHECK((int64_t)starts.size() == B && (int64_t)counts.size() == B,
                "pace_avx512: decoder stack needs a start and a count per row");
    for (int64_t b = 0; b < B; ++b)
      TORCH_CHECK(counts[b] >= 0 && counts[b] <= T && starts[b] >= 0 && starts[b] + counts[b] <= length,
                  "pace_avx512: decoder stack row ", b, " writes outside its cache");
    check_caches(keys, values, block_table, block_size, B, length);
    const Step s{keys, values, starts, counts, length, masks, ropes, block_table, block_size};
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
      return index.defined() ? flat.index_select(0, index) : flat;
    };
    x = pack(x);
    if (residual) residual = pack(*residual);
    for (const LayerSpec& L : layers_) {
      TORCH_CHECK(L.layer < (int64_t)keys.size() && L.layer < (int64_t)values.size() &&
                      L.mask < (int64_t)masks.size() && L.rope < (int64_t)ropes.size(),
                  "pace_avx512: decoder stack step is missing caches, masks or rope tables");
      if (N == 0) break;
      const auto& n = L.norms;
      if (!L.sandwich) {
        auto [h, res] = n[0](x, residual);
        std::tie(h, res) = n[1](attention_block(L, h, s, groups, T), res);
        x = mlp(L, h);
        residual = res;
      } else {
        auto [h, res] = n[0](x, residual);
        h = std::get<0>(n[1](attention_block(L, h, s, groups, T), c10::nullopt));
        std::tie(h, res) = n[2](h, res);
        x = std::get<0>(n[3](mlp(L, h), c10::nullopt));
        residual = res;
      }
    }
    const auto unpack = [&](const Tensor& t) {  // back to [B, T, H], padded positions 0
      if (!index.defined()) return t.reshape({B, T, H});
      return at::zeros({B * T, H}, t.options()).index_copy_(0, index, t).view({B, T, H});
    };
    return {unpack(x), residual ? OptTensor(unpack(*residual)) : OptTensor()};
  }

  size_t size() const { return layers_.size(); }

 private:
  std::vector<LayerSpec> layers_;
};

}  // namespace

void register_decoder_stack(py::module_& m) {
  py::class_<DecoderStack>(m, "DecoderStack",
                           "the decoder blocks of a forward step in one call (see stack.cpp)")
      .def(py::init<const py::list&, const std::vector<int64_t>&, const std::vector<int64_t>&>(),
           py::kw_only(), py::arg("blocks"), py::arg("rope_slots"), py::arg("mask_slots"))
      .def("run", &DecoderStack::run, py::arg("x"), py::arg("residual"), py::arg("keys"),
           py::arg("values"), py::arg("starts"), py::arg("counts"), py::arg("length"),
           py::arg("masks"), py::arg("ropes"), py::arg("block_table") = py::none(),
           py::arg("block_size") = 0)
      .def("__len__", &DecoderStack::size);
}

}  // namespace pace_avx512
