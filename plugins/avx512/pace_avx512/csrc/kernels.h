// Raw-pointer kernel entry points. The kernel files include no torch headers (they compile in
// seconds); bindings.cpp turns tensors into these arguments.
//
// Packed weight layouts (made by pace_avx512/packing.py), in groups of 64 output columns
// (4 blocks of 16), each group one contiguous run:
//   bf16: [NG][Kp/2][4][16][2]  Kp = K rounded up to even; each 64-byte line holds a k-pair of
//                               one block's 16 columns, exactly the operand of one vdpbf16ps.
//   fp32: [NG][K][4][16]        each 64-byte line holds one k of one block's 16 columns.
// Columns past N and the k-pad are zero. Gated-MLP weights interleave gate and up rows in
// blocks of 16 (g0, u0, g1, u1, ...) so one pass computes both halves of each 16 columns.
#pragma once

#include "isa.h"

#include <cstdint>
#include <type_traits>

namespace pace_avx512 {

using bf16_t = uint16_t;

// The packed layout's sizes (exported by the extension: pace_avx512/packing.py reads them).
constexpr int64_t BLOCK = 16;  // columns per vector of accumulators
constexpr int64_t GROUP = 4;   // blocks per packed group
constexpr int64_t COLUMNS = BLOCK * GROUP;  // columns per packed group
// Values per thread from which norms, rope and QK-norms split their rows over threads.
constexpr int64_t MIN_VALUES_PER_THREAD = 1 << 13;

// y[M, N] = x[M, K] @ W^T + bias. x rows have stride ldx >= Kp (the k-pad lane must be zero);
// y rows have stride ldy. bias is fp32 [NB*16] or null.
void linear_bf16(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const bf16_t* w,
                 const float* bias, int64_t N, bf16_t* y, int64_t ldy, int nthreads);
void linear_fp32(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w,
                 const float* bias, int64_t N, float* y, int64_t ldy, int nthreads);

// h[M, I] = act(x @ gate^T) * (x @ up^T) over the interleaved gate/up weight.
void gated_bf16(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const bf16_t* w,
                int64_t I, int act, bf16_t* h, int64_t ldh, int nthreads);
void gated_fp32(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w,
                int64_t I, int act, float* h, int64_t ldh, int nthreads);

// y[M, N] = x[M, K] @ W^T + bias over a quantized weight packed as qlinear.cpp describes
// (kind 0: 4-bit codes with mins; 1: int8, a scale per 32 k; 2: int8, a scale per 16 k;
// 3: 4-bit symmetric; 5: GGUF q6_k's 6-bit codes and tables; 6: GGUF q4_k's 4-bit codes and
// tables), K a multiple of 32 (256 for kinds 5 and 6). Needs AVX512-VNNI. bf16 rows take int8
// activations when `int8_act` (pace_avx512/settings.py), else 15 bits; fp32 rows always 15
// bits. `act_scales` (int8 activations only): static scales [K / 32] (calibrated), else dynamic
// per row and 32 (kinds 5 and 6: per row and 256, static ones the largest of each 256).
void qlinear_bf16(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                  int64_t block_stride, int kind, bool int8_act, const float* bias, int64_t N,
                  bf16_t* y, int64_t ldy, int nthreads, const float* act_scales = nullptr);
// fp32 rows take int8 activations only when `int8_act` (W8A8 weights, QuantizedWeight
// activations "int8"); the LLM paths pass false (raw_ops.h).
void qlinear_fp32(const float* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                  int64_t block_stride, int kind, bool int8_act, const float* bias, int64_t N,
                  float* y, int64_t ldy, int nthreads, const float* act_scales = nullptr);

// Rows `ids` [n] of the de-quantized [N, K] matrix a quantized packed weight holds, as fp32
// [n, K] (a tied embedding's lookup): the values the kernels multiply by (pace_core's
// de-quantizer's, but for q6_k's scales and kind 0's q4_k ones rounded to fp16 at packing).
void qpacked_rows(const uint8_t* w, int64_t block_stride, int kind, int64_t K,
                  const int64_t* ids, int64_t n, float* out, int nthreads);
// Quantized weight kinds (pace_avx512/qpacking.py KINDS): 4-bit with mins, int8 with a scale
// per 32 k, int8 with a scale per 16 k, 4-bit symmetric ((q - 8) s: the min -8 s is not
// stored), and W8A8 (int8 with one fp32 scale per row, int8 activations: igemm.cpp, its own
// layout; qlinear_* hand it over). int8 codes are stored as unsigned q + 128 (the min -128 s
// is not stored).
// KIND_Q6 (GGUF q6_k, K a multiple of 256): 6-bit codes u = q + 32 (w = (u - 32) d sc, with a
// scale per 16 k), each 16 k as a line of the high 2 bits, then two of the 4-bit kinds' nibble
// lines (the low 4 bits; qblock.h q6_quad); one run per super-block (8 groups) whose tables
// are fp16 d [16], then the int8 sub-block scales sc [16][16] (one per 16 k), 32 bytes of
// padding (qblock.h span_scale).
// KIND_Q4K (GGUF q4_k, K a multiple of 256): 4-bit codes as the nibble lines; one run per
// super-block (8 groups) whose tables are fp16 d [16] and dmin [16], then uint8 sub-block
// scales sc [8][16] and mins m [8][16] (6-bit): w = d sc u - dmin m (qblock.h QScales).
enum Kind : int {
  KIND_INT4 = 0, KIND_INT8 = 1, KIND_INT8_G16 = 2, KIND_INT4_SYM = 3, KIND_W8A8 = 4, KIND_Q6 = 5,
  KIND_Q4K = 6
};
// Bytes per block of 16 rows of a KIND_W8A8 weight: fp32 scales [16], then 16 K codes.
constexpr int64_t w8a8_block_bytes(int64_t K) { return 64 + 16 * K; }

// The W8A8 GEMM (igemm.cpp): y[M, N] = x @ W^T + bias over a KIND_W8A8 weight, activations
// int8 per row and group of k: dynamic amax / 127 per w8a8_activation_group(K, false) values,
// or `act_scales` [K / 32] static.
constexpr int64_t w8a8_activation_group(int64_t K, bool fixed) {
  return !fixed && K % 64 == 0 ? 64 : 32;
}
void w8a8_linear_bf16(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                      int64_t block_stride, const float* bias, int64_t N, bf16_t* y, int64_t ldy,
                      int nthreads, const float* act_scales);
void w8a8_linear_fp32(const float* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                      int64_t block_stride, const float* bias, int64_t N, float* y, int64_t ldy,
                      int nthreads, const float* act_scales);
// Rows `ids` [n] of a KIND_W8A8 weight, de-quantized to fp32 [n, K].
void w8a8_rows(const uint8_t* w, int64_t block_stride, int64_t K, const int64_t* ids, int64_t n,
               float* out, int nthreads);
constexpr int64_t QGROUP = 32;  // k per quantization group
constexpr bool is_int8(int kind) { return kind == KIND_INT8 || kind == KIND_INT8_G16; }
// Code bytes per block and group: 8 quads of 64 (int8), 4 nibble lines (4-bit), or 4 nibble
// lines and 2 lines of high bits (KIND_Q6).
constexpr int64_t qcode_bytes(int kind) {
  return is_int8(kind) ? 512 : kind == KIND_Q6 ? 384 : 256;
}
constexpr int qscales_per_group(int kind) {
  return kind == KIND_INT8_G16 || kind == KIND_Q6 ? 2 : 1;
}
// The offset that makes a kind's unsigned codes signed (w = (u - offset) s): its min is
// -offset s, not stored.
constexpr int qcode_offset(int kind) { return is_int8(kind) ? 128 : kind == KIND_Q6 ? 32 : 8; }
// Kinds that store mins (a table per group): the others' min is -offset s, which the int8
// activation kernels fold into the integer sum (qlinear.cpp).
constexpr bool has_mins(int kind) { return kind == KIND_INT4 || kind == KIND_Q4K; }

// f(std::integral_constant<int, KIND>{}) for the kind's compile-time value: the one runtime
// dispatch of the quantized kernels (templates take decltype(k)::value).
template <typename F>
inline decltype(auto) by_kind(int kind, F&& f) {
  switch (kind) {
    case KIND_INT8: return f(std::integral_constant<int, KIND_INT8>{});
    case KIND_INT8_G16: return f(std::integral_constant<int, KIND_INT8_G16>{});
    case KIND_INT4_SYM: return f(std::integral_constant<int, KIND_INT4_SYM>{});
    case KIND_Q6: return f(std::integral_constant<int, KIND_Q6>{});
    case KIND_Q4K: return f(std::integral_constant<int, KIND_Q4K>{});
    default: return f(std::integral_constant<int, KIND_INT4>{});
  }
}

// The GGUF k-quant kinds: a run per super-block of 256 k (8 groups) with the file's tables.
constexpr bool is_super_run(int kind) { return kind == KIND_Q4K || kind == KIND_Q6; }
// A group's tables per row block: fp16 scales [SUB][16], then (KIND_INT4) fp16 mins [16];
// the k-quant kinds: its share of its run's 320 bytes (KIND_Q4K: d, dmin [16] fp16 and sc, m
// [8][16] bytes; KIND_Q6: d [16] fp16, sc [16][16] int8, padding).
constexpr int64_t qtable_bytes(int kind) {
  return is_super_run(kind) ? 40 : 32 * qscales_per_group(kind) + (kind == KIND_INT4 ? 32 : 0);
}
// Bytes per row block and group of 32 k of a quantized kind: codes and tables.
constexpr int64_t qgroup_bytes(int kind) { return qcode_bytes(kind) + qtable_bytes(kind); }
// Groups per run: a block is runs of groups, each run its groups' tables, then their codes,
// so a block is read front to back in one pass (Zen 4's prefetchers follow that; reading
// the codes and a separate table region side by side held the decode GEMV at ~22 of 31 GB/s
// on one core). Runs of 2 groups when a group's tables take 32 bytes, so a run's tables are
// one 64-byte line (kernels touch it as they enter the run) and its codes whole lines after
// it; an odd last group is a run of its own (padded at the end of the block). KIND_Q4K: a
// run per GGUF super-block (8 groups: 320 bytes of tables, 5 lines, then 2048 of codes; KIND_Q6
// 3072 of codes).
constexpr int64_t qrun_groups(int kind) {
  return is_super_run(kind) ? 8 : qtable_bytes(kind) == 32 ? 2 : 1;
}

// Where group g (of G) of a packed row block starts: its tables (the k-quant kinds: its run's,
// which QScales / span_scale read), and its codes.
template <int KIND>
inline const uint16_t* qgroup_tables(const uint8_t* block, int64_t g) {
  constexpr int64_t P = qrun_groups(KIND), RUN = P * qgroup_bytes(KIND);
  const int64_t own = is_super_run(KIND) ? 0 : g % P * qtable_bytes(KIND);
  return (const uint16_t*)(block + g / P * RUN + own);
}
template <int KIND>
inline const uint8_t* qgroup_codes(const uint8_t* block, int64_t G, int64_t g) {
  constexpr int64_t P = qrun_groups(KIND), RUN = P * qgroup_bytes(KIND);
  const int64_t first = g / P * P, in_run = G - first < P ? G - first : P;
  return block + g / P * RUN + in_run * qtable_bytes(KIND) + (g - first) * qcode_bytes(KIND);
}
// A group that starts a run: touch the run's table lines (one; the k-quant kinds' 5) before its
// codes (front to back).
template <int KIND>
inline void qtouch_run(const uint8_t* block, int64_t g) {
  constexpr int64_t BYTES = qrun_groups(KIND) * qtable_bytes(KIND);
  if (g % qrun_groups(KIND) == 0) {
    const char* tables = (const char*)qgroup_tables<KIND>(block, g);
    for (int64_t i = 0; i < BYTES; i += 64) _mm_prefetch(tables + i, _MM_HINT_T0);
  }
}

// The bf16 panel path of qlinear_bf16 (qpanel.cpp, AVX512-BF16 and avx2 builds): each thread
// de-quantizes a group of 4 row blocks to bf16 in the dense packed layout, in L2, and runs the
// dense tiles on it. Returns false (nothing computed) when this build has no panel path or the
// call does not take it (panel_call).
bool qlinear_bf16_panel(const bf16_t* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w,
                        int64_t block_stride, int kind, const float* bias, int64_t N, bf16_t* y,
                        int64_t ldy, int nthreads);

// out[r] = act(gate[r]) * up[r] for `rows` rows of `inter` values, gate/up rows `ld` apart and
// out contiguous (activation.cpp); act by its code (simd.h ACT_NAMES).
void gated_act_bf16(const bf16_t* gate, const bf16_t* up, int64_t ld, int64_t rows, int64_t inter,
                    int act, bf16_t* out, int nthreads);
void gated_act_fp32(const float* gate, const float* up, int64_t ld, int64_t rows, int64_t inter,
                    int act, float* out, int nthreads);

// RMSNorm over rows of H: s = x + res (rounded to the activation dtype), written to `sum`
// when res is given; y = s * rsqrt(mean(s^2) + eps) * w (fp32 math, one final rounding).
void rms_norm_bf16(const bf16_t* x, const bf16_t* res, const float* w, float eps, int64_t rows,
                   int64_t H, bf16_t* y, bf16_t* sum, int nthreads);
void rms_norm_fp32(const float* x, const float* res, const float* w, float eps, int64_t rows,
                   int64_t H, float* y, float* sum, int nthreads);
// LayerNorm likewise: y = (s - mean) * rsqrt(var + eps) * w + b (b fp32 [H] or null).
void layer_norm_bf16(const bf16_t* x, const bf16_t* res, const float* w, const float* b, float eps,
                     int64_t rows, int64_t H, bf16_t* y, bf16_t* sum, int nthreads);
void layer_norm_fp32(const float* x, const float* res, const float* w, const float* b, float eps,
                     int64_t rows, int64_t H, float* y, float* sum, int nthreads);

// Rotary embedding in place on the first R dims of q [B, T, Hq, D] and k [B, T, Hk, D]
// (strides of b, t, h in qs/ks; last dim contiguous) with cos/sin [B, T, R] (strides cs).
void rope_bf16(bf16_t* q, const int64_t* qs, int64_t hq, bf16_t* k, const int64_t* ks, int64_t hk,
               const bf16_t* cos, const bf16_t* sin, const int64_t* cs, int64_t B, int64_t T,
               int64_t R, bool interleaved, int nthreads);
void rope_fp32(float* q, const int64_t* qs, int64_t hq, float* k, const int64_t* ks, int64_t hk,
               const float* cos, const float* sin, const int64_t* cs, int64_t B, int64_t T,
               int64_t R, bool interleaved, int nthreads);

// Attention: softmax(scale q k^T, mask) v with GQA and sinks, tiled over queries and keys.
// K/V are [B, Hk, S, D] (table null; strides of b, h, s) or block pools [blocks, Hk, bs, D]
// (strides of block, h, s) addressed through table[b * table_stride + s / block_size].
template <typename T>
struct AttnArgs {
  const T* q;
  int64_t qs[3];  // strides (elements) of b, h, t; d contiguous
  const T* k;
  int64_t ks[3];  // b (or block), h, s
  const T* v;
  int64_t vs[3];  // b (or block), h, s
  // int8 KV (kv_cache_dtype "int8", k and v unused): rows of d int8 values then one fp32
  // scale per group of KV8_GROUP values (pace_core/caches/kv_quant.py); ks / vs count bytes
  const int8_t* k8 = nullptr;
  const int8_t* v8 = nullptr;
  const int64_t* table;  // [B, table_stride] block ids, or null for a contiguous cache
  int64_t table_stride;
  int64_t block_size;
  const bool* mask;
  int64_t ms[3];  // b, t, s (True = attend)
  const float* sinks;  // [hq] or null
  float scale;
  int64_t b, hq, hk, tq, s, d;
  T* out;
  int64_t os[3];  // strides (elements) of out's b, h, t; d contiguous
};
template <typename T>
void attention(const AttnArgs<T>& a, int nthreads);

// int8 KV rows (pace_core/caches/kv_quant.py): d int8 values, then an fp32 scale per group.
constexpr int64_t KV8_GROUP = 32;
inline int64_t kv8_row_bytes(int64_t d) { return d + 4 * ((d + KV8_GROUP - 1) / KV8_GROUP); }

// DLRMv2 (dlrm.cpp). Sum-pooled embedding bags: out[b, :D] = sum of rows
// indices[offsets[b] .. offsets[b + 1]) of a table of `type` (TABLE_INT8: w = q * scales[row]),
// fp32 accumulation; indices must be in range (checked by the caller).
enum TableType : int { TABLE_FP32 = 0, TABLE_BF16 = 1, TABLE_INT8 = 2 };
void embedding_bag_fp32(const int64_t* indices, const int64_t* offsets, int64_t bags,
                        const void* table, int type, const float* scales, int64_t dim, float* out,
                        int nthreads);
void embedding_bag_bf16(const int64_t* indices, const int64_t* offsets, int64_t bags,
                        const void* table, int type, const float* scales, int64_t dim,
                        bf16_t* out, int nthreads);
// out[i] = x0[i] * y[i] + xl[i] over n values (a DCNv2 cross layer's tail); out may be xl.
void cross_combine_fp32(const float* x0, const float* y, const float* xl, float* out, int64_t n,
                        int nthreads);
void cross_combine_bf16(const bf16_t* x0, const bf16_t* y, const bf16_t* xl, bf16_t* out,
                        int64_t n, int nthreads);

// Benchmark reference: read `bytes` once (64-byte lines), return a checksum.
int64_t stream_read(const void* data, int64_t bytes, int nthreads);
// Threads an OpenMP region of this library gets when asking for `nthreads`.
int parallel_width(int nthreads);

// Threads worth using for a matmul over `weight_bytes` with M rows split into `units`
// (about `tuning().min_work_per_thread` weight-byte equivalents each, at most nthreads).
int pick_threads(int nthreads, int64_t weight_bytes, int64_t M, int64_t units);

// Tuning knobs for benchmarks/experiments (defaults are the measured best).
struct Tuning {
  int64_t min_work_per_thread = 1 << 17;  // bytes-equivalent below which a thread is not worth it
  // Quantized weights, bf16 activations, AVX512-BF16 and avx2 builds: calls of at least this
  // many rows de-quantize weight panels to bf16 and run the dense tiles (qpanel.cpp); 0 =
  // never. On the avx2 build only the kinds with a scale per 16 k do (q6_k, int8-g16: their
  // word tiles flush every 16 k) unless `qpanel_every_kind`. Measured, 2 cores at 2048 x 8192
  // and 8192 x 2048 (`pace bench kernels --sections qgemm --qgemm-paths`): Zen 4 from 16 rows;
  // Zen 3 (avx2: int16 word tiles, fp32 FMA panels) the word tiles 1.8-3.5x the panel at 8
  // rows, at 128-512 rows 1.07-1.32x on q8_0, q4_0, q4_k, int8 and int4, q6_k 0.83-0.98x
  // from 256 rows.
#if defined(__AVX512F__)
  int64_t qpanel_rows = 16;
#else
  int64_t qpanel_rows = 256;
#endif
  bool qpanel_every_kind = false;  // avx2 build: every kind takes the panel from qpanel_rows
  // int8 activations: row blocks side by side per tile of 4 rows, 1-3; 0 = each kind's
  // measured width (qlinear.cpp tile_blocks). Every width gives the same bits.
  int64_t qtile_blocks = 0;
  // avx2 build, 15-bit activations, calls of 2 rows or more: int16 word tiles (vpmaddwd,
  // qwords_tile.h) instead of the two-plane ones; false = the planes (as AVX-512 builds).
  bool qword_tiles = true;
};
Tuning& tuning();

// Whether a call of M bf16 activation rows on a quantized weight of `kind` takes the bf16
// panel (qpanel.cpp) where the build has one (Tuning::qpanel_rows, qpanel_every_kind).
inline bool panel_call(int kind, int64_t M) {
  const int64_t from = tuning().qpanel_rows;
  if (from <= 0 || M < from) return false;
#if defined(__AVX512F__)
  (void)kind;
  return true;
#else
  return tuning().qpanel_every_kind || qscales_per_group(kind) == 2;
#endif
}

}  // namespace pace_avx512
