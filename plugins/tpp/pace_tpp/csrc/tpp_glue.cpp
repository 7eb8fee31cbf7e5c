// pace-tpp glue: blocked BRGEMM linear and fused gated MLP on libxsmm 1.17 (old dispatch API).
//
// libxsmm is column-major, so Y[M, N] = X[M, K] W^T is computed as Y^T = W X^T per block:
// A = one packed weight block (bn x bk, lda = bn; VNNI-2 pairs along k for bf16),
// B = bk columns of X rows (ldb = row stride of X), C = an fp32 scratch block [rows][bn].
// One BRGEMM call reduces over every K block of a weight panel (strides are in bytes).
#include <ATen/Parallel.h>
#include <libxsmm.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace {

using bf16 = at::BFloat16;
using Count = unsigned long long;

template <typename T>
struct Brgemm;

template <>
struct Brgemm<float> {
  using Fn = libxsmm_smmfunction_reducebatch_strd;
  static Fn get(libxsmm_blasint m, libxsmm_blasint n, libxsmm_blasint k, libxsmm_blasint lda,
                libxsmm_blasint ldb, libxsmm_blasint ldc) {
    const float alpha = 1.f, beta = 0.f;
    const int flags = LIBXSMM_GEMM_FLAG_BETA_0, prefetch = LIBXSMM_PREFETCH_NONE;
    return libxsmm_smmdispatch_reducebatch_strd(m, n, k, lda * k * sizeof(float),
                                                k * sizeof(float), &lda, &ldb, &ldc, &alpha,
                                                &beta, &flags, &prefetch);
  }
  static void call(Fn f, const float* a, const float* b, float* c, Count count) {
    f(a, b, c, &count);
  }
};

template <>
struct Brgemm<bf16> {
  using Fn = libxsmm_bsmmfunction_reducebatch_strd;
  static Fn get(libxsmm_blasint m, libxsmm_blasint n, libxsmm_blasint k, libxsmm_blasint lda,
                libxsmm_blasint ldb, libxsmm_blasint ldc) {
    const float alpha = 1.f, beta = 0.f;
    const int flags = LIBXSMM_GEMM_FLAG_BETA_0 | LIBXSMM_GEMM_FLAG_VNNI_A;
    const int prefetch = LIBXSMM_PREFETCH_NONE;
    return libxsmm_bsmmdispatch_reducebatch_strd(m, n, k, lda * k * sizeof(bf16),
                                                 k * sizeof(bf16), &lda, &ldb, &ldc, &alpha,
                                                 &beta, &flags, &prefetch);
  }
  static void call(Fn f, const bf16* a, const bf16* b, float* c, Count count) {
    f(reinterpret_cast<const libxsmm_bfloat16*>(a), reinterpret_cast<const libxsmm_bfloat16*>(b),
      c, &count);
  }
};

// The blocking of one product: N in blocks of bn (last may be short), M in blocks of bm,
// K fully reduced in one BRGEMM over kb blocks of bk. Kernels for the 4 tail combinations.
template <typename T>
struct Plan {
  int64_t M, N, kb, bn, bk, bm, ldx, nb_count, mb_count;
  typename Brgemm<T>::Fn fn[2][2];

  Plan(int64_t M, int64_t N, int64_t kb, int64_t bn, int64_t bk, int64_t bm, int64_t ldx)
      : M(M), N(N), kb(kb), bn(bn), bk(bk), bm(bm), ldx(ldx) {
    nb_count = (N + bn - 1) / bn;
    mb_count = (M + bm - 1) / bm;
    for (int nt = 0; nt < 2; ++nt) {
      for (int mt = 0; mt < 2; ++mt) {
        int64_t m = nt ? N - (nb_count - 1) * bn : bn;
        int64_t n = mt ? M - (mb_count - 1) * bm : bm;
        fn[nt][mt] = Brgemm<T>::get(m, n, bk, bn, ldx, bn);
        TORCH_CHECK(fn[nt][mt], "libxsmm could not JIT a BRGEMM kernel for m=", m, " n=", n,
                    " k=", bk, " (target ", libxsmm_get_target_arch(), ")");
      }
    }
  }
  int64_t cols(int64_t nb) const { return std::min(bn, N - nb * bn); }
  int64_t rows(int64_t mb) const { return std::min(bm, M - mb * bm); }
  int64_t panel() const { return kb * bk * bn; }  // elements of one packed N panel
  // C[rows(mb)][bn] = X[mb rows] . panel^T, reduced over all kb blocks.
  void run(const T* panel_ptr, const T* x, float* c, int64_t nb, int64_t mb) const {
    auto f = fn[nb == nb_count - 1][mb == mb_count - 1];
    Brgemm<T>::call(f, panel_ptr, x + mb * bm * ldx, c, static_cast<Count>(kb));
  }
};

enum Act { kSilu = 0, kGelu = 1, kGeluTanh = 2, kRelu = 3 };

template <int A>
inline float activate(float g) {
  if constexpr (A == kSilu) return g / (1.f + std::exp(-g));
  if constexpr (A == kGelu) return 0.5f * g * (1.f + std::erf(g * 0.70710678118654752f));
  if constexpr (A == kGeluTanh) {
    const float inner = 0.79788456080286536f * (g + 0.044715f * g * g * g);
    return 0.5f * g * (1.f + std::tanh(inner));
  }
  return g > 0.f ? g : 0.f;
}

// X as rows [M, K] with K zero-padded to the packed K (a copy only when K % bk != 0).
at::Tensor rows(const at::Tensor& x, int64_t k, int64_t kp) {
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == k, "x has ", x.dim() ? x.size(-1) : 0,
                    " features, the weight expects ", k);
  auto xr = x.reshape({-1, k}).contiguous();
  return k == kp ? xr : at::constant_pad_nd(xr, {0, kp - k});
}

std::vector<int64_t> out_shape(const at::Tensor& x, int64_t n) {
  auto shape = x.sizes().vec();
  shape.back() = n;
  return shape;
}

template <typename T>
void linear_impl(const at::Tensor& x, const at::Tensor& w, const float* bias, at::Tensor& out,
                 int64_t N, int64_t bn, int64_t bk, int64_t bm) {
  const int64_t M = x.size(0);
  Plan<T> plan(M, N, w.size(1), bn, bk, std::min(bm, M), x.size(1));
  const T* xp = x.data_ptr<T>();
  const T* wp = w.data_ptr<T>();
  T* yp = out.data_ptr<T>();
  // Task t = (N block, M block), M fastest: a thread's tasks share weight panels.
  at::parallel_for(0, plan.nb_count * plan.mb_count, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> c(plan.bm * bn);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t nb = t / plan.mb_count, mb = t % plan.mb_count;
      plan.run(wp + nb * plan.panel(), xp, c.data(), nb, mb);
      const int64_t n0 = nb * bn, m0 = mb * plan.bm, cols = plan.cols(nb);
      for (int64_t i = 0; i < plan.rows(mb); ++i) {
        T* y = yp + (m0 + i) * N + n0;
        const float* ci = c.data() + i * bn;
        if (bias) {
          for (int64_t j = 0; j < cols; ++j) y[j] = static_cast<T>(ci[j] + bias[n0 + j]);
        } else {
          for (int64_t j = 0; j < cols; ++j) y[j] = static_cast<T>(ci[j]);
        }
      }
    }
  });
}

template <typename T, int A>
void gate_up_impl(const at::Tensor& x, const at::Tensor& w, at::Tensor& h, int64_t inter,
                  int64_t bn, int64_t bk, int64_t bm) {
  const int64_t M = x.size(0), ldh = h.size(1);
  Plan<T> plan(M, inter, w.size(2), bn, bk, std::min(bm, M), x.size(1));
  const T* xp = x.data_ptr<T>();
  const T* wp = w.data_ptr<T>();
  T* hp = h.data_ptr<T>();
  at::parallel_for(0, plan.nb_count * plan.mb_count, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> cg(plan.bm * bn), cu(plan.bm * bn);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t nb = t / plan.mb_count, mb = t % plan.mb_count;
      const T* gate = wp + 2 * nb * plan.panel();  // packed [NB][gate, up][KB][...]
      plan.run(gate, xp, cg.data(), nb, mb);
      plan.run(gate + plan.panel(), xp, cu.data(), nb, mb);
      const int64_t n0 = nb * bn, m0 = mb * plan.bm, cols = plan.cols(nb);
      for (int64_t i = 0; i < plan.rows(mb); ++i) {
        T* y = hp + (m0 + i) * ldh + n0;
        const float *g = cg.data() + i * bn, *u = cu.data() + i * bn;
        for (int64_t j = 0; j < cols; ++j) y[j] = static_cast<T>(activate<A>(g[j]) * u[j]);
      }
    }
  });
}

template <typename T>
void gate_up_dispatch(int64_t act, const at::Tensor& x, const at::Tensor& w, at::Tensor& h,
                      int64_t inter, int64_t bn, int64_t bk, int64_t bm) {
  switch (act) {
    case kSilu: return gate_up_impl<T, kSilu>(x, w, h, inter, bn, bk, bm);
    case kGelu: return gate_up_impl<T, kGelu>(x, w, h, inter, bn, bk, bm);
    case kGeluTanh: return gate_up_impl<T, kGeluTanh>(x, w, h, inter, bn, bk, bm);
    case kRelu: return gate_up_impl<T, kRelu>(x, w, h, inter, bn, bk, bm);
    default: TORCH_CHECK(false, "unknown activation id ", act);
  }
}

void check_packed(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "x is ", x.scalar_type(),
              " but the packed weight is ", w.scalar_type());
  TORCH_CHECK(w.is_contiguous(), "packed weight must be contiguous");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "pace-tpp supports float32 and bfloat16");
}

}  // namespace

// y[..., N] = x[..., K] W^T (+ bias): w packed [NB][KB][bk][bn] (fp32) or [NB][KB][bk/2][bn][2].
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                  int64_t N, int64_t K, int64_t bn, int64_t bk, int64_t bm) {
  check_packed(x, w);
  auto xr = rows(x, K, w.size(1) * bk);
  const int64_t M = xr.size(0);
  auto out = at::empty({M, N}, x.options());
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;  // fp32, contiguous
  if (M > 0 && x.scalar_type() == at::kFloat) {
    linear_impl<float>(xr, w, b, out, N, bn, bk, bm);
  } else if (M > 0) {
    linear_impl<bf16>(xr, w, b, out, N, bn, bk, bm);
  }
  return out.view(out_shape(x, N));
}

// down(act(x gate^T) * (x up^T)): gate_up packed [NB][2][KB][...], down packed like linear.
at::Tensor gated_mlp(const at::Tensor& x, const at::Tensor& gate_up, const at::Tensor& down,
                     int64_t inter, int64_t hidden, int64_t act, int64_t bn, int64_t bk,
                     int64_t bm) {
  check_packed(x, gate_up);
  check_packed(x, down);
  auto xr = rows(x, hidden, gate_up.size(2) * bk);
  const int64_t M = xr.size(0), kd = down.size(1) * bk;
  auto out = at::empty({M, hidden}, x.options());
  auto h = at::empty({M, kd}, x.options());
  if (kd > inter) h.narrow(1, inter, kd - inter).zero_();
  if (M > 0 && x.scalar_type() == at::kFloat) {
    gate_up_dispatch<float>(act, xr, gate_up, h, inter, bn, bk, bm);
    linear_impl<float>(h, down, nullptr, out, hidden, bn, bk, bm);
  } else if (M > 0) {
    gate_up_dispatch<bf16>(act, xr, gate_up, h, inter, bn, bk, bm);
    linear_impl<bf16>(h, down, nullptr, out, hidden, bn, bk, bm);
  }
  return out.view(out_shape(x, hidden));
}

std::string target_arch() { return libxsmm_get_target_arch(); }

// Runs libxsmm_init(), leaving the process environment as it found it. libxsmm 1.x (AUTOPIN,
// on in Debian's build) putenv()s OMP_PROC_BIND=TRUE during its one-time init unless
// GOMP_CPU_AFFINITY, KMP_AFFINITY or OMP_PROC_BIND is set. torch's OpenMP runtime has already
// read its environment and is unaffected, but any OpenMP runtime started later in the process
// (e.g. the libgomp vendored in the sentencepiece wheel, loaded with a HF tokenizer) then binds
// the calling thread to its first place, pinning the whole process to one CPU, and child
// processes inherit the variable. libxsmm runs its init once, so later calls do not redo this.
void init_libxsmm_keeping_env() {
  static const char* const kNames[] = {"OMP_PROC_BIND", "I_MPI_SHM_HEAP"};
  constexpr size_t kCount = sizeof(kNames) / sizeof(kNames[0]);
  std::optional<std::string> saved[kCount];
  for (size_t i = 0; i < kCount; ++i) {
    if (const char* value = std::getenv(kNames[i])) saved[i] = value;
  }
  libxsmm_init();
  for (size_t i = 0; i < kCount; ++i) {
    const char* now = std::getenv(kNames[i]);
    if (!saved[i]) {
      if (now) unsetenv(kNames[i]);
    } else if (!now || *saved[i] != now) {
      setenv(kNames[i], saved[i]->c_str(), 1);
    }
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  init_libxsmm_keeping_env();
  // without the GIL, as pace-avx512's and pace-onednn's kernels: other Python threads (a
  // server's HTTP thread) run while a kernel does
  const auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("linear", &linear, nogil, "blocked BRGEMM linear");
  m.def("gated_mlp", &gated_mlp, nogil, "fused gate/up BRGEMM + activation + down BRGEMM");
  m.def("target_arch", &target_arch, "libxsmm's JIT target (e.g. cpx)");
  m.attr("libxsmm_version") = LIBXSMM_CONFIG_VERSION;
}
