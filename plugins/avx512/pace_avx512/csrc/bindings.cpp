// pybind11 bindings: tensor checks and allocation here, the math in linear.cpp / norm.cpp.
// This is the only file that includes torch headers, and only the few it needs:
// <torch/extension.h> would take ~2.5x longer to compile (measured 57 s vs 24 s here).
#include <ATen/Parallel.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <torch/csrc/utils/pybind.h>

#include <tuple>
#include <type_traits>

#include "kernels.h"
#include "raw_ops.h"
#include "simd.h"
#include "tensor_ops.h"

namespace pace_avx512 {
namespace {

namespace py = pybind11;
using at::Tensor;
using OptTensor = c10::optional<Tensor>;

int threads() { return at::get_num_threads(); }

template <typename T>
T* ptr(const Tensor& t) {
  if constexpr (std::is_same_v<T, bf16_t>) return reinterpret_cast<bf16_t*>(t.data_ptr<at::BFloat16>());
  else return t.data_ptr<float>();
}

bool is_bf16(const Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "pace_avx512: activations must be float32 or bfloat16, got ", x.scalar_type());
  return x.scalar_type() == at::kBFloat16;
}

// x as contiguous rows of `width` elements; a bf16 row of odd K gets a zero k-pad lane.
Tensor as_rows(const Tensor& x, int64_t width) {
  Tensor xc = x.contiguous();
  return xc.size(-1) == width ? xc : at::constant_pad_nd(xc, {0, width - xc.size(-1)}, 0);
}

// Packed weight [groups, steps, 4 * lanes]: check it matches K and the activation dtype.
int64_t check_packed(const Tensor& x, const Tensor& w, int64_t k) {
  TORCH_CHECK(w.scalar_type() == x.scalar_type(), "pace_avx512: weight dtype ", w.scalar_type(),
              " != activation dtype ", x.scalar_type());
  const bool bf = is_bf16(x);
  const int64_t width = bf ? (k + 1) / 2 * 2 : k;
  TORCH_CHECK(w.dim() == 3 && w.is_contiguous() && w.size(2) == (bf ? 2 : 1) * COLUMNS &&
                  w.size(1) == (bf ? width / 2 : width),
              "pace_avx512: packed weight ", w.sizes(), " does not match K=", k);
  return width;
}

// y [..., n] for x [..., K], uninitialized.
Tensor rows_out(const Tensor& x, int64_t n) {
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  return at::empty(sizes, x.options());
}

// The fp32 bias's data (null without one); it must hold at least `numel` values.
const float* bias_ptr(const OptTensor& bias, int64_t numel, const char* what) {
  if (!bias) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                  bias->numel() >= numel,
              "pace_avx512: bias must be fp32 ", what);
  return bias->data_ptr<float>();
}

// f(T{}) for T the activation type of x (bf16_t or float): the raw kernels of raw_ops.h are
// overloaded by it, so each op below is written once for both.
template <class F>
void by_dtype(const Tensor& x, F&& f) {
  if (is_bf16(x)) f(bf16_t{});
  else f(float{});
}

void run_linear(const Tensor& xr, int64_t width, int64_t M, int64_t K, const Tensor& w,
                const float* bias, int64_t N, Tensor& y) {
  by_dtype(xr, [&](auto t) {
    using T = decltype(t);
    linear_rows(ptr<T>(xr), width, M, K, w.data_ptr(), bias, N, ptr<T>(y), N, threads());
  });
}

}  // namespace

// The tensor-level ops (declared in tensor_ops.h).

// y[..., N] = x[..., K] @ W^T + bias over the packed W.
Tensor linear(const Tensor& x, const Tensor& w, const OptTensor& bias, int64_t n) {
  const int64_t K = x.size(-1);
  const int64_t width = check_packed(x, w, K);
  TORCH_CHECK(w.size(0) * COLUMNS >= n, "pace_avx512: packed weight has fewer than N columns");
  Tensor y = rows_out(x, n);
  const int64_t M = K ? x.numel() / K : 0;
  if (M == 0 || n == 0) return y;
  const float* b = bias_ptr(bias, w.size(0) * COLUMNS, "padded to the packed width");
  run_linear(as_rows(x, width), width, M, K, w, b, n, y);
  return y;
}

// act(gate) * up, the activation by its code (simd.h ACT_NAMES), on [..., I] views with unit
// last stride (activation.cpp).
Tensor gated_activation(const Tensor& gate, const Tensor& up, int64_t act) {
  TORCH_CHECK(act >= 0 && act < ACT_COUNT, "pace_avx512: unknown activation code ", act);
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
              "pace_avx512: gate ", gate.sizes(), " and up ", up.sizes(), " differ");
  const int64_t inter = gate.size(-1), rows = inter ? gate.numel() / inter : 0;
  const auto rows_view = [&](const Tensor& t) {  // [rows, inter] with unit last stride
    const Tensor r = t.reshape({rows, inter});  // a view of a [gate | up] half, or a copy
    return r.stride(1) == 1 ? r : r.contiguous();
  };
  Tensor out = at::empty(gate.sizes(), gate.options());
  if (rows == 0 || inter == 0) return out;
  Tensor g = rows_view(gate), u = rows_view(up);
  if (g.stride(0) != u.stride(0)) u = u.contiguous(), g = g.contiguous();
  by_dtype(gate, [&](auto t) {
    using T = decltype(t);
    gated_act_rows(ptr<T>(g), ptr<T>(u), g.stride(0), rows, inter, (int)act, ptr<T>(out), threads());
  });
  return out;
}

// A quantized weight packed by pace_avx512/qpacking.py for an [n, K] matrix of `kind`.
void check_qpacked(const Tensor& w, int64_t n, int64_t K, int64_t kind) {
  TORCH_CHECK(K % 32 == 0, "pace_avx512: quantized weights need K a multiple of 32, got ", K);
  TORCH_CHECK(!is_super_run((int)kind) || K % 256 == 0, "pace_avx512: q4_k and q6_k weights "
              "need K a multiple of 256, got ", K);
  const int64_t block_bytes = kind == KIND_W8A8 ? w8a8_block_bytes(K) : K / 32 * qgroup_bytes(kind);
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous() && kind >= 0 &&
                  kind <= KIND_Q4K && w.size(0) == (n + 15) / 16 && w.size(1) >= block_bytes,
              "pace_avx512: quantized weight ", w.sizes(), " does not match N=", n, " K=", K,
              " kind ", kind);
}

// Rows `ids` of the [n, k] matrix a quantized packed weight holds (layout in qlinear.cpp), fp32.
Tensor qpacked_rows_op(const Tensor& w, const Tensor& ids, int64_t n, int64_t k, int64_t kind) {
  check_qpacked(w, n, k, kind);
  TORCH_CHECK(ids.scalar_type() == at::kLong, "pace_avx512: qpacked_rows needs int64 ids");
  const Tensor idc = ids.contiguous().view(-1);
  const int64_t* id = idc.data_ptr<int64_t>();
  for (int64_t i = 0; i < idc.numel(); ++i)
    TORCH_CHECK(id[i] >= 0 && id[i] < n, "pace_avx512: row ", id[i], " outside ", n);
  Tensor out = at::empty({idc.numel(), k}, w.options().dtype(at::kFloat));
  qpacked_rows(w.data_ptr<uint8_t>(), w.size(1), (int)kind, k, id, idc.numel(), out.data_ptr<float>(),
               threads());
  return out;
}

// y[..., N] = x[..., K] @ W^T + bias over a quantized W packed by pace_avx512/qpacking.py:
// uint8 [blocks of 16 rows, block_stride bytes] (layout in qlinear.cpp).
// `act_scales`: static int8 activation scales fp32 [K / 32] (W8A8 with calibrated scales).
Tensor qlinear(const Tensor& x, const Tensor& w, const OptTensor& bias, int64_t n, int64_t kind,
               bool int8_activations, bool all_rows, const OptTensor& act_scales) {
  const int64_t K = x.size(-1);
  check_qpacked(w, n, K, kind);
  Tensor y = rows_out(x, n);
  const int64_t M = K ? x.numel() / K : 0;
  if (M == 0 || n == 0) return y;
  const float* b = bias_ptr(bias, n, "with N values");
  const float* fixed = nullptr;
  if (act_scales) {
    TORCH_CHECK(int8_activations && act_scales->scalar_type() == at::kFloat &&
                    act_scales->is_contiguous() && act_scales->numel() == K / 32,
                "pace_avx512: static activation scales must be fp32 [K / 32] with int8 "
                "activations");
    fixed = act_scales->data_ptr<float>();
  }
  const Tensor xc = x.contiguous();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  by_dtype(xc, [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, float>)  // fp32 rows: int8 only for W8A8 weights
      qlinear_fp32(ptr<T>(xc), K, M, K, wp, w.size(1), (int)kind, int8_activations && all_rows,
                   b, n, ptr<T>(y), n, threads(), all_rows ? fixed : nullptr);
    else
      qlinear_bf16(ptr<T>(xc), K, M, K, wp, w.size(1), (int)kind, int8_activations, b, n,
                   ptr<T>(y), n, threads(), fixed);
  });
  return y;
}

// act(x @ gate^T) * (x @ up^T) @ down^T: one pass over the interleaved gate/up weight
// (activation fused in the epilogue), then the down projection.
Tensor gated_mlp(const Tensor& x, const Tensor& gate_up, const Tensor& down, int64_t inter,
                 int64_t hidden, int64_t act) {
  const int64_t K = x.size(-1);
  const int64_t width = check_packed(x, gate_up, K);
  const int64_t hwidth = check_packed(x, down, inter);
  const int64_t M = K ? x.numel() / K : 0;
  auto sizes = x.sizes().vec();
  sizes.back() = hidden;
  Tensor y = at::empty(sizes, x.options());
  if (M == 0) return y;
  Tensor h = at::empty({M, hwidth}, x.options());
  if (hwidth != inter) h.narrow(1, inter, hwidth - inter).zero_();
  const Tensor xr = as_rows(x, width);
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    gated_rows(ptr<T>(xr), width, M, K, gate_up.data_ptr(), inter, (int)act, ptr<T>(h), hwidth,
               threads());
  });
  run_linear(h, hwidth, M, inter, down, nullptr, hidden, y);
  return y;
}

// (y, x + residual) as pace_native.kernels.rms_norm / layer_norm (bias only for LayerNorm).
std::tuple<Tensor, Tensor> norm(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                                double eps, const OptTensor& residual, bool rms) {
  if (residual && (residual->sizes() != x.sizes() || residual->scalar_type() != x.scalar_type())) {
    const Tensor s = x.add(*residual);  // broadcasting / promotion: let torch add, then normalise
    return {std::get<0>(norm(s, weight, bias, eps, c10::nullopt, rms)), s};
  }
  (void)is_bf16(x);  // raises for a dtype other than float32 / bfloat16, empty x too
  const int64_t H = x.size(-1), rows = H ? x.numel() / H : 0;
  TORCH_CHECK(weight.numel() == H && (!bias || bias->numel() == H), "pace_avx512: norm weight/bias ",
              "have ", weight.numel(), " elements, expected ", H);
  auto as_fp32 = [](const Tensor& t) {  // model norm weights already are: no op then
    return t.scalar_type() == at::kFloat && t.is_contiguous() ? t : t.to(at::kFloat).contiguous();
  };
  const Tensor w = as_fp32(weight);
  const Tensor b = bias ? as_fp32(*bias) : Tensor();
  const Tensor xc = x.contiguous();
  Tensor y = at::empty_like(xc);
  Tensor sum = residual ? at::empty_like(xc) : x;
  if (rows == 0) return {y, sum};
  const Tensor rc = residual ? residual->contiguous() : Tensor();
  const float* wp = w.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    norm_rows(rms, ptr<T>(xc), residual ? ptr<T>(rc) : nullptr, wp, bp, (float)eps, rows, H,
              ptr<T>(y), residual ? ptr<T>(sum) : nullptr, threads());
  });
  return {y, sum};
}

std::tuple<Tensor, Tensor> rms_norm(const Tensor& x, const Tensor& weight, double eps,
                                    const OptTensor& residual) {
  return norm(x, weight, c10::nullopt, eps, residual, true);
}

std::tuple<Tensor, Tensor> layer_norm(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                                      double eps, const OptTensor& residual) {
  return norm(x, weight, bias, eps, residual, false);
}

// Rotary embedding in place (q, k rotated and returned; a copy only if the last dim is strided).
std::tuple<Tensor, Tensor> rope(Tensor q, Tensor k, const Tensor& cos, const Tensor& sin,
                                bool interleaved) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && cos.dim() == 3 && sin.dim() == 3,
              "pace_avx512: rope expects q/k [B, T, H, D] and cos/sin [B, T, R]");
  TORCH_CHECK(k.scalar_type() == q.scalar_type(), "pace_avx512: rope q/k dtypes differ");
  if (q.stride(3) != 1) q = q.contiguous();
  if (k.stride(3) != 1) k = k.contiguous();
  const int64_t B = q.size(0), T = q.size(1), R = cos.size(-1);
  TORCH_CHECK(R % 2 == 0 && R <= q.size(3) && R <= k.size(3) && k.size(0) == B && k.size(1) == T,
              "pace_avx512: rope shapes q ", q.sizes(), " k ", k.sizes(), " cos ", cos.sizes());
  const Tensor c = cos.to(q.scalar_type()).expand({B, T, R}).contiguous();
  const Tensor s = sin.to(q.scalar_type()).expand({B, T, R}).contiguous();
  const int64_t qs[3] = {q.stride(0), q.stride(1), q.stride(2)};
  const int64_t ks[3] = {k.stride(0), k.stride(1), k.stride(2)};
  const int64_t cs[2] = {T * R, R};
  if (q.numel() == 0) return {q, k};
  by_dtype(q, [&](auto t) {
    using U = decltype(t);
    rope_rows(ptr<U>(q), qs, q.size(2), ptr<U>(k), ks, k.size(2), ptr<U>(c), ptr<U>(s), cs, B, T,
              R, interleaved, threads());
  });
  return {q, k};
}

template <typename T>
void run_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& m,
                   const Tensor& sinks, const Tensor& table, int64_t block_size, double scale,
                   Tensor& out) {
  AttnArgs<T> a{};
  a.q = ptr<T>(q);
  if (k.scalar_type() == at::kChar) {  // int8 KV rows (kv_quant.py)
    a.k8 = k.data_ptr<int8_t>(), a.v8 = v.data_ptr<int8_t>();
  } else {
    a.k = ptr<T>(k), a.v = ptr<T>(v);
  }
  a.mask = m.data_ptr<bool>();
  for (int i = 0; i < 3; ++i) {
    a.qs[i] = q.stride(i);
    a.ks[i] = k.stride(i);
    a.vs[i] = v.stride(i);
  }
  if (table.defined()) {
    a.table = table.data_ptr<int64_t>();
    a.table_stride = table.stride(0);
    a.block_size = block_size;
  }
  a.ms[0] = m.stride(0), a.ms[1] = m.stride(2), a.ms[2] = m.stride(3);
  a.sinks = sinks.defined() ? sinks.data_ptr<float>() : nullptr;
  a.scale = (float)scale;
  a.b = q.size(0), a.hq = q.size(1), a.tq = q.size(2), a.d = q.size(3);
  a.hk = k.size(1), a.s = m.size(3);
  a.out = ptr<T>(out);
  for (int i = 0; i < 3; ++i) a.os[i] = out.stride(i);
  attention<T>(a, threads());
}

// softmax(scale q k^T masked) v for q [B, Hq, T, D] and mask [B, 1, T, S] over
// k/v [B, Hk, >= S, D] (no table) or pools [blocks, Hk, block_size, D] with table [B, n].
Tensor attend(Tensor q, Tensor k, Tensor v, const Tensor& mask, double scale,
              const OptTensor& sinks, const OptTensor& block_table, int64_t block_size) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && mask.dim() == 4,
              "pace_avx512: attention expects 4-d q, k, v and mask");
  const bool bf = is_bf16(q);
  // int8 KV: rows of D int8 values and their fp32 scale (pace_core/caches/kv_quant.py)
  const bool q8 = k.scalar_type() == at::kChar;
  TORCH_CHECK((q8 || k.scalar_type() == q.scalar_type()) && v.scalar_type() == k.scalar_type(),
              "pace_avx512: attention q/k/v dtypes differ");
  TORCH_CHECK(mask.scalar_type() == at::kBool, "pace_avx512: attention mask must be bool");
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hk = k.size(1), S = mask.size(3);
  TORCH_CHECK(Hk > 0 && Hq % Hk == 0 && k.size(3) == (q8 ? kv8_row_bytes(D) : D) && v.sizes() == k.sizes(),
              "pace_avx512: attention shapes q ", q.sizes(), " k ", k.sizes(), " v ", v.sizes());
  Tensor table;
  if (block_table) {
    table = *block_table;
    TORCH_CHECK(table.scalar_type() == at::kLong && table.dim() == 2 && table.size(0) == B &&
                    table.stride(1) == 1 && block_size > 0 && table.size(1) * block_size >= S &&
                    k.size(2) == block_size,
                "pace_avx512: block table ", table.sizes(), " / block size ", block_size,
                " do not cover ", S, " keys of pool ", k.sizes());
  } else {
    TORCH_CHECK(k.size(0) == B && k.size(2) >= S, "pace_avx512: cache ", k.sizes(),
                " has fewer than ", S, " keys for batch ", B);
  }
  if (q.stride(3) != 1) q = q.contiguous();
  if (k.stride(3) != 1) k = k.contiguous();
  if (v.stride(3) != 1) v = v.contiguous();
  const Tensor m = mask.expand({B, 1, T, S});
  const Tensor sk = sinks ? sinks->to(at::kFloat).contiguous() : Tensor();
  Tensor out = at::empty({B, Hq, T, D}, q.options());
  if (out.numel() == 0) return out;
  if (bf) run_attention<bf16_t>(q, k, v, m, sk, table, block_size, scale, out);
  else run_attention<float>(q, k, v, m, sk, table, block_size, scale, out);
  return out;
}

// Rows `ids` of the [N, K] matrix a packed weight holds (layouts in kernels.h): a tied
// embedding's lookup reads the LM head's packed table, row by row (no group copies).
Tensor packed_rows(const Tensor& w, const Tensor& ids, int64_t k) {
  TORCH_CHECK(w.dim() == 3 && w.is_contiguous() && ids.scalar_type() == at::kLong,
              "pace_avx512: packed_rows needs a packed weight and int64 ids");
  const bool bf = is_bf16(w);
  const Tensor idc = ids.contiguous().view(-1);
  const int64_t n = idc.numel(), steps = w.size(1), lanes = w.size(2);
  const int64_t rows = w.size(0) * COLUMNS;
  Tensor out = at::empty({n, k}, w.options());
  const int64_t* id = idc.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(id[i] >= 0 && id[i] < rows, "pace_avx512: row ", id[i], " outside ", rows);
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t g = id[i] / COLUMNS, r = id[i] % COLUMNS;
      if (bf) {  // [g, p, 32 (r / 16) + 2 (r % 16) + e] = W[64g + r, 2p + e]
        const uint32_t* src = reinterpret_cast<const uint32_t*>(ptr<bf16_t>(w) + g * steps * lanes) +
                              (r / BLOCK) * BLOCK + r % BLOCK;
        bf16_t* dst = ptr<bf16_t>(out) + i * k;
        for (int64_t p = 0; p < steps; ++p) {
          const uint32_t pair = src[p * lanes / 2];
          dst[2 * p] = (bf16_t)(pair & 0xFFFF);
          if (2 * p + 1 < k) dst[2 * p + 1] = (bf16_t)(pair >> 16);
        }
      } else {  // [g, k, 16i + j] = W[64g + 16i + j, k]
        const float* src = ptr<float>(w) + g * steps * lanes + r;
        float* dst = ptr<float>(out) + i * k;
        for (int64_t c = 0; c < k; ++c) dst[c] = src[c * lanes];
      }
    }
  });
  return out;
}

// Packed weights live in arenas of transparent huge pages: chunks of >= 64 MiB, 2 MiB aligned,
// madvise(MADV_HUGEPAGE), handed out in 64-byte aligned pieces. Streaming weights then walks
// ~500x fewer page-table entries (measured +18-35% on cold 1-thread bf16 GEMVs here). A chunk
// is freed when the last tensor cut from it is gone and the arena has moved on to a new one.
struct Chunk {
  char* base = nullptr;
  size_t size = 0, used = 0;
  ~Chunk() { std::free(base); }
};

// `bytes` (rounded up to 64) from the arena of transparent huge pages, uninitialized; null when
// the arena cannot grow. The chunk stays alive as long as a tensor over it does.
static Tensor huge_page_alloc(size_t bytes, const std::vector<int64_t>& sizes,
                              const c10::TensorOptions& options) {
  static std::mutex lock;
  static std::shared_ptr<Chunk> current;
  constexpr size_t kAlign = size_t(2) << 20, kChunk = size_t(64) << 20;
  const size_t need = (bytes + 63) / 64 * 64;
  std::shared_ptr<Chunk> chunk;
  char* p = nullptr;
  {
    std::lock_guard<std::mutex> guard(lock);
    if (!current || current->used + need > current->size) {
      auto fresh = std::make_shared<Chunk>();
      fresh->size = std::max(kChunk, (need + kAlign - 1) / kAlign * kAlign);
      fresh->base = static_cast<char*>(std::aligned_alloc(kAlign, fresh->size));
      if (fresh->base == nullptr) return Tensor();
      madvise(fresh->base, fresh->size, MADV_HUGEPAGE);  // advice only: ignored if THP is off
      current = fresh;
    }
    chunk = current;
    p = chunk->base + chunk->used;
    chunk->used += need;
  }
  return at::from_blob(p, sizes, [chunk](void*) mutable { chunk.reset(); }, options);
}

// The copy is made straight from `t` (any strides: a permuted view is packed as it is copied,
// with no contiguous intermediate) and returned with `shape` (t's own when empty).
Tensor huge_page_copy(const Tensor& t, c10::IntArrayRef shape) {
  const std::vector<int64_t> sizes = shape.empty() ? t.sizes().vec() : shape.vec();
  TORCH_CHECK(c10::multiply_integers(sizes) == t.numel(), "huge_page_copy: shape ", sizes,
              " does not hold the ", t.numel(), " elements of the tensor");
  const size_t bytes = t.numel() * t.element_size();
  Tensor out = huge_page_alloc(bytes, sizes, t.options());
  if (!out.defined()) return t.contiguous().reshape(sizes).clone();  // plain copy
  if (t.is_contiguous()) std::memcpy(out.data_ptr(), t.data_ptr(), bytes);
  else out.view(t.sizes()).copy_(t);
  return out;
}

Tensor huge_page_empty(int64_t rows, int64_t row_bytes) {
  TORCH_CHECK(rows >= 0 && row_bytes >= 0, "huge_page_empty: negative size");
  const std::vector<int64_t> sizes{rows, row_bytes};
  const auto options = at::TensorOptions().dtype(at::kByte);
  Tensor out = huge_page_alloc(size_t(rows) * size_t(row_bytes), sizes, options);
  return out.defined() ? out : at::empty(sizes, options);
}

}  // namespace pace_avx512

// The kernels run without the GIL (their arguments are converted before, their results
// after): a serving engine's forward then no longer blocks the HTTP thread's Python for its
// whole length, and the engine's own Python never queues behind a backlog of it.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace pace_avx512;
  namespace py = pybind11;
  m.doc() = "pace-avx512 kernels (see pace_avx512/csrc/kernels.h for the packed layouts)";
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("linear", &linear, nogil, "y = x @ W^T + b over a packed W", py::arg("x"),
        py::arg("w"), py::arg("bias"), py::arg("n"));
  m.def("gated_mlp", &gated_mlp, nogil, "act(x@gate) * (x@up) @ down over packed weights");
  m.def("packed_rows", &packed_rows, nogil, py::arg("w"), py::arg("ids"), py::arg("k"),
        "rows ids of the [N, K] matrix a packed weight holds (tied embedding lookups)");
  m.def("rms_norm", &rms_norm, nogil, "RMSNorm with fused residual add -> (y, x + residual)");
  m.def("layer_norm", &layer_norm, nogil,
        "LayerNorm with fused residual add -> (y, x + residual)");
  m.def("rope", &rope, nogil,
        "rotary embedding in place on q [B,T,Hq,D], k [B,T,Hk,D] -> (q, k)");
  m.def("attention", &attend, nogil,
        "attention with GQA, boolean mask and sinks over a contiguous cache or block pools + "
        "block table", py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"),
        py::arg("scale"), py::arg("sinks"), py::arg("block_table") = py::none(),
        py::arg("block_size") = 0);
  // Constants Python reads instead of copying: the packed layout and the activation codes.
  m.attr("BLOCK") = BLOCK;
  m.attr("GROUP") = GROUP;
  py::tuple activations(static_cast<size_t>(ACT_COUNT));
  for (int i = 0; i < ACT_COUNT; ++i) activations[i] = ACT_NAMES[i];
  m.attr("ACTIVATIONS") = activations;
#ifdef PACE_HAS_BF16
  m.attr("has_bf16") = true;
#else
  m.attr("has_bf16") = false;
#endif
#if defined(PACE_HAS_BF16) || !defined(__AVX512F__)
  m.attr("has_bf16_panel") = true;  // csrc/qpanel.cpp: quantized prefill on de-quantized panels
#else
  m.attr("has_bf16_panel") = false;
#endif
#if defined(__AVX512F__)
  m.attr("has_word_tiles") = false;
#else
  m.attr("has_word_tiles") = true;  // csrc/qwords_tile.h: 15-bit activations as int16 words
#endif
  register_decoder_stack(m);
  register_dlrm(m);
  m.def("gated_activation", &gated_activation, nogil, py::arg("gate"), py::arg("up"),
        py::arg("act"), "act(gate) * up by activation code");
  m.def("qpacked_rows", &qpacked_rows_op, nogil, py::arg("w"), py::arg("ids"), py::arg("n"),
        py::arg("k"), py::arg("kind"), "rows of a quantized packed weight, de-quantized to fp32");
  m.def("qlinear", &qlinear, nogil, py::arg("x"), py::arg("w"), py::arg("bias"),
        py::arg("n"), py::arg("kind"), py::arg("int8_activations") = false,
        py::arg("all_rows") = false, py::arg("act_scales") = py::none(),
        "y = x @ W^T + bias over a quantized packed W (AVX512-VNNI); bf16 x quantized to int8 "
        "per 32 when int8_activations, fp32 x too when all_rows, else to 15 bits (the W8A8 "
        "kind: int8 in every dtype, igemm.cpp); act_scales: static int8 scales per 32 columns "
        "instead of dynamic ones");
  m.def("huge_page_copy", &huge_page_copy, py::arg("t"), py::arg("shape") = std::vector<int64_t>{},
        "copy a tensor into an arena of transparent huge pages (packed weights)");
  m.def("huge_page_empty", &huge_page_empty, py::arg("rows"), py::arg("row_bytes"),
        "uninitialized uint8 [rows, row_bytes] from the same arena (filled a chunk at a time)");
  m.def("stream_read", [](const Tensor& t) {
    TORCH_CHECK(t.is_contiguous(), "stream_read needs a contiguous tensor");
    return stream_read(t.data_ptr(), t.numel() * t.element_size(), threads());
  }, "benchmark reference: read every byte of t once (DRAM bandwidth), return a checksum");
  m.def("parallel_width", []() { return parallel_width(threads()); },
        "threads an OpenMP region of the kernels gets at torch.get_num_threads()");
  m.def("set_qpanel_rows", [](int64_t v) { tuning().qpanel_rows = v; }, py::arg("rows"),
        "quantized weights, bf16 activations, AVX512-BF16 and avx2 builds: calls of at least this many rows de-quantize weight panels to bf16 (0: never; avx2: kinds with a scale per 16 k only, unless qpanel_every_kind)");
  m.def("qpanel_rows", []() { return tuning().qpanel_rows; });
  m.def("set_qpanel_every_kind", [](bool v) { tuning().qpanel_every_kind = v; }, py::arg("on"),
        "avx2 build: every kind takes the bf16 panel from qpanel_rows rows (else only the kinds with a scale per 16 k)");
  m.def("qpanel_every_kind", []() { return tuning().qpanel_every_kind; });
  m.def("panel_call", &panel_call, py::arg("kind"), py::arg("rows"),
        "whether a call of `rows` bf16 rows on a quantized weight of `kind` takes the bf16 panel (where built)");
  m.def("set_qtile_blocks", [](int64_t v) {
    TORCH_CHECK(v >= 0 && v <= 3, "qtile blocks: 1-3, or 0 for each kind's own");
    tuning().qtile_blocks = v;
  }, py::arg("blocks"), "int8 activations: row blocks per quantized tile (1-3; 0: each kind's own)");
  m.def("qtile_blocks", []() { return tuning().qtile_blocks; });
  m.def("set_qword_tiles", [](bool v) { tuning().qword_tiles = v; }, py::arg("on"),
        "avx2 build, 15-bit activations, 2+ rows: int16 word tiles (vpmaddwd) or the two planes");
  m.def("qword_tiles", []() { return tuning().qword_tiles; });
  m.def("set_min_work_per_thread", [](int64_t v) { tuning().min_work_per_thread = v; },
        "tuning: weight-byte equivalents below which an extra thread is not used");
  m.def("min_work_per_thread", []() { return tuning().min_work_per_thread; });
}
