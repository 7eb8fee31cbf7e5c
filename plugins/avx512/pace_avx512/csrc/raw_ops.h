// The raw kernels of kernels.h overloaded by activation type, for code written once for bf16
// and fp32 (the fused decoder step, step.h). Pointers and sizes only: no tensors, no checks.
#pragma once

#include "kernels.h"

namespace pace_avx512 {

inline void linear_rows(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const void* w,
                        const float* bias, int64_t N, bf16_t* y, int64_t ldy, int nt) {
  linear_bf16(x, ldx, M, K, static_cast<const bf16_t*>(w), bias, N, y, ldy, nt);
}
inline void linear_rows(const float* x, int64_t ldx, int64_t M, int64_t K, const void* w,
                        const float* bias, int64_t N, float* y, int64_t ldy, int nt) {
  linear_fp32(x, ldx, M, K, static_cast<const float*>(w), bias, N, y, ldy, nt);
}

inline void qlinear_rows(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                         int64_t block_stride, int kind, bool int8_act, const float* bias,
                         int64_t N, bf16_t* y, int64_t ldy, int nt) {
  qlinear_bf16(x, ldx, M, K, w, block_stride, kind, int8_act, bias, N, y, ldy, nt);
}
// fp32 rows keep 15-bit activations whatever `int8_act` says (an fp32 model asks for fp32
// precision; pace_avx512/settings.py), except against W8A8 weights (their kind is int8 x int8).
inline void qlinear_rows(const float* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                         int64_t block_stride, int kind, bool /*int8_act*/, const float* bias,
                         int64_t N, float* y, int64_t ldy, int nt) {
  qlinear_fp32(x, ldx, M, K, w, block_stride, kind, false, bias, N, y, ldy, nt);
}

inline void gated_rows(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const void* w,
                       int64_t I, int act, bf16_t* h, int64_t ldh, int nt) {
  gated_bf16(x, ldx, M, K, static_cast<const bf16_t*>(w), I, act, h, ldh, nt);
}
inline void gated_rows(const float* x, int64_t ldx, int64_t M, int64_t K, const void* w,
                       int64_t I, int act, float* h, int64_t ldh, int nt) {
  gated_fp32(x, ldx, M, K, static_cast<const float*>(w), I, act, h, ldh, nt);
}

inline void gated_act_rows(const bf16_t* gate, const bf16_t* up, int64_t ld, int64_t rows,
                           int64_t inter, int act, bf16_t* out, int nt) {
  gated_act_bf16(gate, up, ld, rows, inter, act, out, nt);
}
inline void gated_act_rows(const float* gate, const float* up, int64_t ld, int64_t rows,
                           int64_t inter, int act, float* out, int nt) {
  gated_act_fp32(gate, up, ld, rows, inter, act, out, nt);
}

// RMSNorm (rms) or LayerNorm (b: its bias or null) of `rows` rows of H; see kernels.h.
inline void norm_rows(bool rms, const bf16_t* x, const bf16_t* res, const float* w, const float* b,
                      float eps, int64_t rows, int64_t H, bf16_t* y, bf16_t* sum, int nt) {
  if (rms) rms_norm_bf16(x, res, w, eps, rows, H, y, sum, nt);
  else layer_norm_bf16(x, res, w, b, eps, rows, H, y, sum, nt);
}
inline void norm_rows(bool rms, const float* x, const float* res, const float* w, const float* b,
                      float eps, int64_t rows, int64_t H, float* y, float* sum, int nt) {
  if (rms) rms_norm_fp32(x, res, w, eps, rows, H, y, sum, nt);
  else layer_norm_fp32(x, res, w, b, eps, rows, H, y, sum, nt);
}

inline void rope_rows(bf16_t* q, const int64_t* qs, int64_t hq, bf16_t* k, const int64_t* ks,
                      int64_t hk, const bf16_t* cos, const bf16_t* sin, const int64_t* cs,
                      int64_t B, int64_t T, int64_t R, bool interleaved, int nt) {
  rope_bf16(q, qs, hq, k, ks, hk, cos, sin, cs, B, T, R, interleaved, nt);
}
inline void rope_rows(float* q, const int64_t* qs, int64_t hq, float* k, const int64_t* ks,
                      int64_t hk, const float* cos, const float* sin, const int64_t* cs,
                      int64_t B, int64_t T, int64_t R, bool interleaved, int nt) {
  rope_fp32(q, qs, hq, k, ks, hk, cos, sin, cs, B, T, R, interleaved, nt);
}

}  // namespace pace_avx512
