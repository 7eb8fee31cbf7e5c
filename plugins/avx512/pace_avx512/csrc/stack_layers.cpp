// Reading a decoder layer for the fused stack (stack_layers.h): the blocks' descriptions of
// pace_core/stack_spec.py and the packed weights of pace_avx512/packing.py / qpacking.py they
// hold, by attribute name, checked once here as the tensor-level ops check them per call.
#include "stack_layers.h"

#include <string>

#include "tensor_ops.h"

namespace pace_avx512 {
namespace {

namespace py = pybind11;

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
  s.weight = field<Tensor>(spec, "weight").to(at::kFloat).contiguous();
  s.w = s.weight.data_ptr<float>();
  const OptTensor bias = optional_tensor(spec, "bias");
  if (bias) s.bias = bias->to(at::kFloat).contiguous(), s.b = s.bias.data_ptr<float>();
  TORCH_CHECK(!s.bias.defined() || s.bias.numel() == s.weight.numel(),
              "pace_avx512: decoder stack norm bias and weight sizes differ");
  s.eps = (float)field<double>(spec, "eps");
  s.rms = op == "rms_norm";
  return s;
}

// A dense packed weight (packing.py) for an [n, k] matrix (n: at least n columns).
void check_dense(const Tensor& w, int64_t n, int64_t k) {
  const bool bf = w.scalar_type() == at::kBFloat16;
  TORCH_CHECK((bf || w.scalar_type() == at::kFloat) && w.dim() == 3 && w.is_contiguous() &&
                  w.size(2) == (bf ? 2 : 1) * COLUMNS && w.size(1) * (bf ? 2 : 1) == k &&
                  w.size(0) * COLUMNS >= n,
              "pace_avx512: decoder stack packed weight ", w.sizes(), " of ", w.scalar_type(),
              " does not match N=", n, " K=", k);
}

// A packing.PackedLinear, or a qpacking.QPackedLinear (which has a `kind`), checked as the
// tensor-level linear / qlinear check them per call. Dense bf16 needs an even K here: the
// step's rows carry no k-pad lane (stack.py declines odd sizes before this).
LinearSpec linear_spec(const py::handle& packed) {
  LinearSpec s;
  s.weight = field<Tensor>(packed, "weight");
  s.n = field<int64_t>(packed, "out_features");
  s.k = field<int64_t>(packed, "in_features");
  s.w = s.weight.data_ptr();
  const OptTensor bias = optional_tensor(packed, "bias");
  if (py::hasattr(packed, "kind")) {
    s.kind = field<int64_t>(packed, "kind");
    s.int8_act = field<bool>(packed, "int8_activations");
    check_qpacked(s.weight, s.n, s.k, s.kind);
    s.block_stride = s.weight.size(1);
  } else {
    check_dense(s.weight, s.n, s.k);
  }
  if (bias) {
    const int64_t need = s.kind < 0 ? s.weight.size(0) * COLUMNS : s.n;
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() >= need,
                "pace_avx512: decoder stack bias must be fp32 with ", need, " values");
    s.bias = *bias, s.b = s.bias.data_ptr<float>();
  }
  return s;
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

}  // namespace

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
  TORCH_CHECK(!L.sinks.defined() || L.sinks.numel() == L.hq, "pace_avx512: decoder stack sinks");
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
    check_dense(L.gate_up, 2 * L.inter, L.hidden);
    L.dense_down.weight = field<Tensor>(mlp, "down");
    L.dense_down.w = L.dense_down.weight.data_ptr();
    L.dense_down.n = L.hidden, L.dense_down.k = L.inter;
    check_dense(L.dense_down.weight, L.hidden, L.inter);
  }
  // the activation dtype the dense weights were packed for (the step checks it)
  for (const Tensor* w : {&L.qkv.parts[0].weight, &L.o.weight, &L.gate_up})
    if (w->defined() && w->scalar_type() != at::kByte) L.dense_dtype = w->scalar_type();
  TORCH_CHECK(L.qkv.width() == L.nq + L.nk + L.nv && L.o.k == L.nq && L.o.n == L.hidden &&
                  (!L.quantized_mlp || (L.q_gate_up.width() == 2 * L.inter && L.q_down.n == L.hidden)),
              "pace_avx512: decoder stack projection sizes differ from the layer's");
  return L;
}

}  // namespace pace_avx512
