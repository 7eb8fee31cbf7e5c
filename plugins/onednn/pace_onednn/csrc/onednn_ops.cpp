// pace-onednn glue: oneDNN matmul primitives behind two small Python classes.
//
// Dense: y = post_ops(x @ W^T + b). W is reordered once into the layout the M=1 primitive
// prefers (the brgemm layout does not depend on M); one primitive per M is cached.
// GatedMLP: up = x@Wu; h = act(x@Wg) * up (eltwise + binary-mul post-ops); y = h@Wd.
#include <torch/extension.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace {

using namespace dnnl;
using dt = memory::data_type;
using tag = memory::format_tag;

constexpr size_t kMaxCachedShapes = 64;  // distinct M per weight before the cache is reset

engine& eng() {
  static engine e(engine::kind::cpu, 0);
  return e;
}

stream& strm() {
  thread_local stream s(eng());
  return s;
}

dt dnnl_type(at::ScalarType t) {
  if (t == at::kFloat) return dt::f32;
  if (t == at::kBFloat16) return dt::bf16;
  TORCH_CHECK(false, "pace-onednn: unsupported dtype ", t, " (float32 and bfloat16 only)");
}

algorithm activation(const std::string& name) {
  if (name == "silu") return algorithm::eltwise_swish;
  if (name == "gelu") return algorithm::eltwise_gelu_erf;
  if (name == "gelu_tanh") return algorithm::eltwise_gelu_tanh;
  if (name == "relu") return algorithm::eltwise_relu;
  TORCH_CHECK(false, "pace-onednn: unknown activation '", name, "'");
}

class Dense {
 public:
  Dense(torch::Tensor weight, const std::optional<torch::Tensor>& bias, const std::string& act,
        bool mul)
      : act_(act), mul_(mul) {
    TORCH_CHECK(weight.dim() == 2, "pace-onednn: weight must be [N, K]");
    weight = weight.contiguous();
    n_ = weight.size(0);
    k_ = weight.size(1);
    scalar_ = weight.scalar_type();
    type_ = dnnl_type(scalar_);
    if (bias.has_value() && bias->defined()) {
      bias_ = bias->to(scalar_).contiguous().view({1, n_});
      bias_mem_ = memory({{1, n_}, type_, tag::ab}, eng(), bias_.data_ptr());
    }
    auto pd = make_pd(1, memory::desc({k_, n_}, type_, tag::any));
    packed_md_ = pd.weights_desc();
    packed_ = torch::empty({static_cast<int64_t>(packed_md_.get_size())}, torch::kUInt8);
    packed_mem_ = memory(packed_md_, eng(), packed_.data_ptr());
    memory plain({{k_, n_}, type_, tag::ba}, eng(), weight.data_ptr());
    reorder(plain, packed_mem_).execute(strm(), plain, packed_mem_);
    strm().wait();
    cache_.emplace(1, matmul(pd));
  }

  torch::Tensor forward(const torch::Tensor& x, const std::optional<torch::Tensor>& other) {
    TORCH_CHECK(x.size(-1) == k_, "pace-onednn: expected last dim ", k_, ", got ", x.size(-1));
    TORCH_CHECK(x.scalar_type() == scalar_, "pace-onednn: activation dtype ", x.scalar_type(),
                " differs from weight dtype ", scalar_);
    auto x2 = x.reshape({-1, k_}).contiguous();
    const int64_t m = x2.size(0);
    auto sizes = x.sizes().vec();
    sizes.back() = n_;
    auto y = torch::empty({m, n_}, x.options());
    if (m == 0) return y.view(sizes);
    auto prim = get(m);
    memory::desc src_md({m, k_}, type_, tag::ab), dst_md({m, n_}, type_, tag::ab);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, memory(src_md, eng(), x2.data_ptr())},
        {DNNL_ARG_WEIGHTS, packed_mem_},
        {DNNL_ARG_DST, memory(dst_md, eng(), y.data_ptr())}};
    if (bias_.defined()) args.emplace(DNNL_ARG_BIAS, bias_mem_);
    torch::Tensor o;
    if (mul_) {
      TORCH_CHECK(other.has_value(), "pace-onednn: this matmul needs the multiplier tensor");
      o = other->reshape({m, n_}).contiguous();
      const int idx = act_.empty() ? 0 : 1;
      args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx) | DNNL_ARG_SRC_1,
                   memory(dst_md, eng(), o.data_ptr()));
    }
    prim.execute(strm(), args);
    strm().wait();
    return y.view(sizes);
  }

  torch::Tensor call(const torch::Tensor& x) { return forward(x, std::nullopt); }

  // The oneDNN implementation chosen for M rows, e.g. "brg:avx512_core_bf16".
  std::string impl(int64_t m) const { return make_pd(m, packed_md_).impl_info_str(); }

  int64_t packed_bytes() const { return packed_.numel(); }
  size_t cached_shapes() {
    std::lock_guard<std::mutex> lock(mu_);
    return cache_.size();
  }

 private:
  matmul::primitive_desc make_pd(int64_t m, const memory::desc& weights) const {
    memory::desc src({m, k_}, type_, tag::ab), dst({m, n_}, type_, tag::ab);
    post_ops po;
    if (!act_.empty()) po.append_eltwise(activation(act_), act_ == "silu" ? 1.f : 0.f, 0.f);
    if (mul_) po.append_binary(algorithm::binary_mul, dst);
    primitive_attr attr;
    attr.set_post_ops(po);
    if (bias_.defined()) {
      memory::desc bias({1, n_}, type_, tag::ab);
      return matmul::primitive_desc(eng(), src, weights, bias, dst, attr);
    }
    return matmul::primitive_desc(eng(), src, weights, dst, attr);
  }

  matmul get(int64_t m) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(m);
    if (it != cache_.end()) return it->second;
    if (cache_.size() >= kMaxCachedShapes) {
      auto decode = cache_.at(1);
      cache_.clear();
      cache_.emplace(1, decode);
    }
    return cache_.emplace(m, matmul(make_pd(m, packed_md_))).first->second;
  }

  std::string act_;
  bool mul_;
  int64_t n_ = 0, k_ = 0;
  at::ScalarType scalar_;
  dt type_;
  torch::Tensor bias_, packed_;
  memory bias_mem_, packed_mem_;
  memory::desc packed_md_;
  std::mutex mu_;
  std::unordered_map<int64_t, matmul> cache_;
};

class GatedMLP {
 public:
  GatedMLP(const torch::Tensor& gate, const torch::Tensor& up, const torch::Tensor& down,
           const std::string& act)
      : up_(up, std::nullopt, "", false),
        gate_(gate, std::nullopt, act, true),
        down_(down, std::nullopt, "", false) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto u = up_.call(x);
    return down_.call(gate_.forward(x, u));
  }

  std::string impl(int64_t m) const { return gate_.impl(m); }

 private:
  Dense up_, gate_, down_;
};

// Cap oneDNN's ISA (e.g. "avx512_core_vnni") so PACE_CPU_FEATURES overrides reach it too.
bool set_max_isa(const std::string& name) {
  static const std::unordered_map<std::string, cpu_isa> isas{
      {"sse41", cpu_isa::sse41}, {"avx", cpu_isa::avx}, {"avx2", cpu_isa::avx2},
      {"avx512_core", cpu_isa::avx512_core}, {"avx512_core_vnni", cpu_isa::avx512_core_vnni},
      {"avx512_core_bf16", cpu_isa::avx512_core_bf16}};
  if (name == "all") return true;  // no cap: oneDNN's own detection
  auto it = isas.find(name);
  TORCH_CHECK(it != isas.end(), "pace-onednn: unknown oneDNN ISA '", name, "'");
  return set_max_cpu_isa(it->second) == status::success;
}

std::string onednn_version() {
  const auto* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using release = py::call_guard<py::gil_scoped_release>;
  py::class_<Dense>(m, "Dense")
      .def(py::init<torch::Tensor, std::optional<torch::Tensor>, std::string, bool>(),
           py::arg("weight"), py::arg("bias") = py::none(), py::arg("act") = "",
           py::arg("mul") = false)
      .def("forward", &Dense::forward, py::arg("x"), py::arg("other") = py::none(), release())
      .def("impl", &Dense::impl)
      .def_property_readonly("packed_bytes", &Dense::packed_bytes)
      .def_property_readonly("cached_shapes", &Dense::cached_shapes);
  py::class_<GatedMLP>(m, "GatedMLP")
      .def(py::init<torch::Tensor, torch::Tensor, torch::Tensor, std::string>())
      .def("forward", &GatedMLP::forward, release())
      .def("impl", &GatedMLP::impl);
  m.def("set_max_isa", &set_max_isa);
  m.def("version", &onednn_version);
}
