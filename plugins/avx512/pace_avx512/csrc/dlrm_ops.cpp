// Tensor-level entry points of DLRMv2's ops (pace_avx512/dlrm.py): checks and allocation here,
// the math in dlrm.cpp, linear.cpp and qlinear.cpp.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels.h"
#include "raw_ops.h"
#include "tensor_ops.h"

namespace pace_avx512 {
namespace {

namespace py = pybind11;

int threads() { return at::get_num_threads(); }

// Sum-pooled bags of `table` [V, D] (fp32, bf16, or int8 codes with fp32 `scales` [V]) for
// indices [N] and offsets [B + 1]; the output is [B, D] in bf16 when `out_bf16`, else fp32.
Tensor embedding_bag(const Tensor& indices, const Tensor& offsets, const Tensor& table,
                     const OptTensor& scales, bool out_bf16) {
  TORCH_CHECK(indices.scalar_type() == at::kLong && indices.dim() == 1,
              "pace_avx512: embedding_bag indices must be int64 [N], got ", indices.scalar_type(),
              " ", indices.sizes());
  TORCH_CHECK(offsets.scalar_type() == at::kLong && offsets.dim() == 1 && offsets.numel() >= 1,
              "pace_avx512: embedding_bag offsets must be int64 [B + 1], got ",
              offsets.scalar_type(), " ", offsets.sizes());
  TORCH_CHECK(table.dim() == 2 && table.is_contiguous(),
              "pace_avx512: embedding_bag table must be a contiguous [V, D] tensor");
  int type;
  switch (table.scalar_type()) {
    case at::kFloat: type = TABLE_FP32; break;
    case at::kBFloat16: type = TABLE_BF16; break;
    case at::kChar: type = TABLE_INT8; break;
    default: TORCH_CHECK(false, "pace_avx512: embedding_bag table dtype ", table.scalar_type(),
                         " unsupported (float32, bfloat16 or int8 with scales)");
  }
  const int64_t V = table.size(0), D = table.size(1);
  const float* sp = nullptr;
  if (type == TABLE_INT8) {
    TORCH_CHECK(scales && scales->scalar_type() == at::kFloat && scales->is_contiguous() &&
                    scales->numel() == V,
                "pace_avx512: an int8 table needs fp32 scales [V]");
    sp = scales->data_ptr<float>();
  }
  const Tensor idx = indices.contiguous(), off = offsets.contiguous();
  const int64_t* ip = idx.data_ptr<int64_t>();
  const int64_t* op = off.data_ptr<int64_t>();
  const int64_t B = off.numel() - 1, N = idx.numel();
  TORCH_CHECK(op[0] >= 0 && op[B] <= N, "pace_avx512: embedding_bag offsets span [", op[0], ", ",
              op[B], "] outside the ", N, " indices");
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(op[b] <= op[b + 1], "pace_avx512: embedding_bag offsets decrease at bag ", b);
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (int64_t i = op[0]; i < op[B]; ++i) lo = std::min(lo, ip[i]), hi = std::max(hi, ip[i]);
  TORCH_CHECK(op[0] == op[B] || (lo >= 0 && hi < V), "pace_avx512: embedding_bag index ",
              lo < 0 ? lo : hi, " outside the table's ", V, " rows");
  Tensor out = at::empty({B, D}, table.options().dtype(out_bf16 ? at::kBFloat16 : at::kFloat));
  if (B == 0 || D == 0) return out;
  if (out_bf16)
    embedding_bag_bf16(ip, op, B, table.data_ptr(), type, sp, D,
                       reinterpret_cast<bf16_t*>(out.data_ptr<at::BFloat16>()), threads());
  else
    embedding_bag_fp32(ip, op, B, table.data_ptr(), type, sp, D, out.data_ptr<float>(), threads());
  return out;
}

template <typename T>
T* raw(const Tensor& t) {
  if constexpr (std::is_same_v<T, bf16_t>) return reinterpret_cast<bf16_t*>(t.data_ptr<at::BFloat16>());
  else return t.data_ptr<float>();
}

inline void combine_rows(const float* x0, const float* y, const float* xl, float* out, int64_t n, int nt) {
  cross_combine_fp32(x0, y, xl, out, n, nt);
}
inline void combine_rows(const bf16_t* x0, const bf16_t* y, const bf16_t* xl, bf16_t* out, int64_t n,
                         int nt) {
  cross_combine_bf16(x0, y, xl, out, n, nt);
}
inline void qlinear_any(const float* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                        int64_t stride, int kind, bool act8, const float* bias, int64_t N, float* y,
                        int64_t ldy, int nt, const float* fixed) {
  qlinear_fp32(x, ldx, M, K, w, stride, kind, act8, bias, N, y, ldy, nt, fixed);
}
inline void qlinear_any(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                        int64_t stride, int kind, bool act8, const float* bias, int64_t N, bf16_t* y,
                        int64_t ldy, int nt, const float* fixed) {
  qlinear_bf16(x, ldx, M, K, w, stride, kind, act8, bias, N, y, ldy, nt, fixed);
}

// DCNv2's low-rank cross stack in one call: for each layer, h = V x_l, y = U h + b, then
// x_{l+1} = x0 * y + x_l. `kind` < 0: V [r, D] and U [D, r] packed dense (packing.py) with U's
// bias padded to the packed width; else quantized packs of that kind (qpacking.py), bias [D],
// activations int8 when `int8_act`, with the static scales `act_scales` when given (per layer:
// V's input [D / 32], then U's [rank / 32]; fp32), else dynamic ones.
Tensor cross_stack(const Tensor& x0, const std::vector<Tensor>& vs, const std::vector<Tensor>& us,
                   const std::vector<Tensor>& biases, int64_t rank, int64_t kind, bool int8_act,
                   const std::vector<Tensor>& act_scales) {
  TORCH_CHECK(x0.dim() == 2, "pace_avx512: cross_stack takes x0 [B, D], got ", x0.sizes());
  TORCH_CHECK(x0.scalar_type() == at::kFloat || x0.scalar_type() == at::kBFloat16,
              "pace_avx512: cross_stack activations must be float32 or bfloat16");
  TORCH_CHECK(vs.size() == us.size() && us.size() == biases.size(),
              "pace_avx512: cross_stack needs as many V, U and biases");
  const bool bf = x0.scalar_type() == at::kBFloat16;
  const int64_t B = x0.size(0), D = x0.size(1);
  TORCH_CHECK(act_scales.empty() || (kind >= 0 && int8_act && act_scales.size() == 2 * vs.size()),
              "pace_avx512: cross_stack static scales need int8 activations, two per layer");
  for (size_t i = 0; i < act_scales.size(); ++i)
    TORCH_CHECK(act_scales[i].scalar_type() == at::kFloat && act_scales[i].is_contiguous() &&
                    act_scales[i].numel() == (i % 2 ? rank : D) / 32,
                "pace_avx512: cross_stack static scales must be fp32 [D / 32] and [rank / 32]");
  for (size_t l = 0; l < vs.size(); ++l) {
    if (kind >= 0) {
      check_qpacked(vs[l], rank, D, kind);
      check_qpacked(us[l], D, rank, kind);
      TORCH_CHECK(biases[l].scalar_type() == at::kFloat && biases[l].numel() >= D,
                  "pace_avx512: cross_stack bias must be fp32 [D]");
    } else {
      TORCH_CHECK(!bf || (D % 2 == 0 && rank % 2 == 0),
                  "pace_avx512: bf16 cross_stack needs an even D and rank");
      for (const Tensor* w : {&vs[l], &us[l]})
        TORCH_CHECK(w->scalar_type() == x0.scalar_type() && w->dim() == 3 && w->is_contiguous() &&
                        w->size(2) == (bf ? 2 : 1) * COLUMNS,
                    "pace_avx512: cross_stack weight ", w->sizes(), " is not packed for ",
                    x0.scalar_type());
      TORCH_CHECK(vs[l].size(1) == (bf ? D / 2 : D) && vs[l].size(0) * COLUMNS >= rank &&
                      us[l].size(1) == (bf ? rank / 2 : rank) && us[l].size(0) * COLUMNS >= D,
                  "pace_avx512: cross_stack packed weights do not match D=", D, " rank=", rank);
      TORCH_CHECK(biases[l].scalar_type() == at::kFloat && biases[l].numel() >= us[l].size(0) * COLUMNS,
                  "pace_avx512: cross_stack bias must be fp32, padded to the packed width");
    }
  }
  const Tensor x = x0.contiguous();
  Tensor out = at::empty({B, D}, x.options());
  if (B == 0 || D == 0) return out;
  if (vs.empty()) return out.copy_(x);
  Tensor h = at::empty({B, rank}, x.options()), y = at::empty({B, D}, x.options());
  const int nt = threads();
  const auto run = [&](auto t) {
    using T = decltype(t);
    const T* xp = raw<T>(x);
    T *hp = raw<T>(h), *yp = raw<T>(y), *op = raw<T>(out);
    for (size_t l = 0; l < vs.size(); ++l) {
      const T* xl = l == 0 ? xp : op;
      const float* b = biases[l].data_ptr<float>();
      if (kind >= 0) {
        const bool fixed = !act_scales.empty();
        qlinear_any(xl, D, B, D, vs[l].data_ptr<uint8_t>(), vs[l].size(1), (int)kind, int8_act,
                    nullptr, rank, hp, rank, nt,
                    fixed ? act_scales[2 * l].data_ptr<float>() : nullptr);
        qlinear_any(hp, rank, B, rank, us[l].data_ptr<uint8_t>(), us[l].size(1), (int)kind,
                    int8_act, b, D, yp, D, nt,
                    fixed ? act_scales[2 * l + 1].data_ptr<float>() : nullptr);
      } else {
        linear_rows(xl, D, B, D, vs[l].data_ptr(), nullptr, rank, hp, rank, nt);
        linear_rows(hp, rank, B, rank, us[l].data_ptr(), b, D, yp, D, nt);
      }
      combine_rows(xp, yp, xl, op, B * D, nt);
    }
  };
  if (bf) run(bf16_t{});
  else run(float{});
  return out;
}

}  // namespace

void register_dlrm(py::module_& m) {
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("embedding_bag", &embedding_bag, nogil, py::arg("indices"), py::arg("offsets"),
        py::arg("table"), py::arg("scales"), py::arg("out_bf16"),
        "sum-pooled bags of an fp32 / bf16 / int8 (scale per row) table -> [B, D]");
  m.def("cross_stack", &cross_stack, nogil, py::arg("x0"), py::arg("vs"), py::arg("us"),
        py::arg("biases"), py::arg("rank"), py::arg("kind"), py::arg("int8_act"),
        py::arg("act_scales") = std::vector<Tensor>{},
        "DCNv2 low-rank cross layers x_{l+1} = x0 * (U (V x_l) + b) + x_l over packed weights");
}

}  // namespace pace_avx512
