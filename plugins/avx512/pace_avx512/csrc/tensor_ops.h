// Tensor-level entry points (defined in bindings.cpp): checks, allocation, dispatch to the
// raw kernels of kernels.h. Python calls them through pybind11; the fused decoder stack
// (stack.cpp) runs the raw kernels itself (raw_ops.h) and uses check_qpacked.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <tuple>

namespace pace_avx512 {

using at::Tensor;
using OptTensor = c10::optional<Tensor>;

Tensor linear(const Tensor& x, const Tensor& w, const OptTensor& bias, int64_t n);
Tensor qlinear(const Tensor& x, const Tensor& w, const OptTensor& bias, int64_t n, int64_t kind,
               bool int8_activations, bool all_rows = false,
               const OptTensor& act_scales = c10::nullopt);
Tensor gated_activation(const Tensor& gate, const Tensor& up, int64_t act);
Tensor gated_mlp(const Tensor& x, const Tensor& gate_up, const Tensor& down, int64_t inter,
                 int64_t hidden, int64_t act);
std::tuple<Tensor, Tensor> norm(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                                double eps, const OptTensor& residual, bool rms);
std::tuple<Tensor, Tensor> rope(Tensor q, Tensor k, const Tensor& cos, const Tensor& sin,
                                bool interleaved);
// Raises unless w is a quantized weight packed by qpacking.py for an [n, K] matrix of `kind`.
void check_qpacked(const Tensor& w, int64_t n, int64_t K, int64_t kind);
Tensor attend(Tensor q, Tensor k, Tensor v, const Tensor& mask, double scale,
              const OptTensor& sinks, const OptTensor& block_table, int64_t block_size);

// Adds the DecoderStack class to the extension module.
void register_decoder_stack(pybind11::module_& m);
// Adds DLRMv2's embedding_bag and cross_stack (dlrm_ops.cpp) to the extension module.
void register_dlrm(pybind11::module_& m);

}  // namespace pace_avx512
