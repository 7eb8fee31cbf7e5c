// A decoder layer as the fused stack runs it (stack.cpp): its norms, projections and attention
// shape, read once from the block's description (pace_core/stack_spec.py) and the packed
// weights it holds (stack_layers.cpp), with the raw pointers the step's kernels read.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <vector>

#include "raw_ops.h"

namespace pace_avx512 {

using at::Tensor;

// Each spec holds its tensors (kept alive) and the raw pointers the step's kernels read, taken
// once when the stack is built; a step then runs every layer with no tensor op.
struct NormSpec {
  bool on = false;
  Tensor weight, bias;  // fp32 [H]; bias only for LayerNorm (may be undefined)
  const float* w = nullptr;
  const float* b = nullptr;
  float eps = 0;
  bool rms = true;

  // y = norm(x (+ res, that sum written to `sum`)) over `rows` rows of H; y may be x, sum res.
  template <typename T>
  void operator()(const T* x, const T* res, int64_t rows, int64_t H, T* y, T* sum, int nt) const {
    norm_rows(rms, x, res, w, b, eps, rows, H, y, sum, nt);
  }
};

struct LinearSpec {
  Tensor weight, bias;  // bias: fp32 (dense: padded to the packed width) or undefined
  const void* w = nullptr;
  const float* b = nullptr;
  int64_t n = 0, k = 0;
  int64_t kind = -1;  // -1: dense packed (packing.PackedLinear); else a qpacking.KINDS value
  int64_t block_stride = 0;  // quantized: bytes per block of 16 rows
  bool int8_act = false;  // quantized: bf16 rows take int8 activations (qpacking.QPackedLinear)

  // y[M, n] (rows ldy apart) = x[M, k] (contiguous rows) @ W^T + bias.
  template <typename T>
  void operator()(const T* x, int64_t M, T* y, int64_t ldy, int nt) const {
    if (kind < 0) linear_rows(x, k, M, k, w, b, n, y, ldy, nt);
    else qlinear_rows(x, k, M, k, static_cast<const uint8_t*>(w), block_stride, (int)kind,
                      int8_act, b, n, y, ldy, nt);
  }
};

// A projection held as one matrix, or (quantized, formats differing) one per part, each
// writing its columns of the output: QKV as (q, k, v), gate/up as (gate, up).
struct Projection {
  std::vector<LinearSpec> parts;

  int64_t width() const {
    int64_t n = 0;
    for (const auto& p : parts) n += p.n;
    return n;
  }

  template <typename T>
  void operator()(const T* x, int64_t M, T* y, int nt) const {
    const int64_t ldy = width();
    int64_t col = 0;
    for (const auto& p : parts) p(x, M, y + col, ldy, nt), col += p.n;
  }
};

struct LayerSpec {
  bool sandwich = false;
  std::vector<NormSpec> norms;  // pre-norm: norm1, norm2; sandwich: pre/post attn, pre/post mlp
  Projection qkv;
  LinearSpec o;
  int64_t nq = 0, nk = 0, nv = 0;  // columns of q, k, v in the qkv output
  NormSpec q_norm, k_norm;
  Tensor gate_up;  // dense: the packed interleaved gate/up, and down
  LinearSpec dense_down;
  Projection q_gate_up;  // quantized: [gate; up] (or gate, up) and down, activation in between
  LinearSpec q_down;
  bool quantized_mlp = false;
  int64_t inter = 0, hidden = 0, act = 0;
  int64_t layer = 0, hq = 0, hk = 0, d = 0;
  double scale = 1.0;
  int64_t rope = -1;  // index into the step's rope tables, -1: none
  bool interleaved = false;
  int64_t mask = 0;  // index into the step's masks (one per distinct window)
  Tensor sinks;      // fp32 [hq] or undefined
  at::ScalarType dense_dtype = at::ScalarType::Undefined;  // of the dense weights, if any
};

// A stack_spec.BlockSpec; `rope` and `mask` index the step's rope tables and masks.
LayerSpec layer_spec(const pybind11::handle& block, int64_t rope, int64_t mask);

}  // namespace pace_avx512
