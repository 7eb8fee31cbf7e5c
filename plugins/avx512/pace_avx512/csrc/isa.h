// The instruction set the kernels are written in: AVX-512 intrinsics, native where the build
// target has AVX-512 (-mavx512f ...), else the same intrinsics on pairs of AVX2 registers
// (avx512_on_avx2.h, the `avx2` build target). Every kernel source includes this, never
// <immintrin.h> directly.
#pragma once

#include <immintrin.h>

#if defined(__AVX512F__)
// Code between these is compiled with AVX512-VNNI (vpdpbusd), which the plugin only runs on
// CPUs that have it (plugin.py checks avx512_vnni per quantized weight).
#define PACE_VNNI_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma\")")
#define PACE_VNNI_END _Pragma("GCC pop_options")
// vpdpbusd by what the kernel knows of its operands, so that the avx2 target can use its
// cheapest exact form (avx512_on_avx2.h); plain vpdpbusd here. The unsigned operand a is
//   dpbusd_small_codes:  a code in [0, 63] (a 6-bit code);
//   dpbusd_offset_bytes: a signed byte q stored as q + 128, against b in [-127, 127] (never
//     -128); it adds sum (a - OFFSET_BYTES_BIAS) b, which is sum a b here, sum q b on avx2;
//   dpbusd_nibbles:      a 4-bit code (a low nibble masked, a high one shifted down),
//   dpbusd_high_nibbles: 16 times a 4-bit code (a high nibble masked in place),
//     both into a nibble accumulator: int32 sums here, int16 pair sums on avx2 (vpmaddubsw,
//     vpaddw), so a kernel adds at most 8 dot products to one and reads it only through
//     widen_nibble_sums / widen_high_nibble_sums (the int32 sums; of 16 n for the latter).
#define dpbusd_small_codes(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
#define dpbusd_offset_bytes(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
#define dpbusd_nibbles(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
#define dpbusd_high_nibbles(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
#define widen_nibble_sums(acc) (acc)
#define widen_high_nibble_sums(acc) (acc)
namespace pace_avx512 {
constexpr int OFFSET_BYTES_BIAS = 0;
// An empty asm that claims to read (and, for opaque, change) v: keeps a load the compiler
// would otherwise drop, without emitting anything.
template <class V>
static inline void opaque(V& v) { asm volatile("" : "+v"(v)); }
template <class V>
static inline void consume(const V& v) { asm volatile("" : : "v"(v)); }
}  // namespace pace_avx512
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "avx512_on_avx2.h"
#define PACE_VNNI_BEGIN  // the dpbusd_* forms are exact AVX2 sequences (avx512_on_avx2.h)
#define PACE_VNNI_END
#else
#error "pace-avx512 kernels need AVX-512 (-mavx512f -mavx512bw -mavx512vl) or AVX2 + FMA + F16C"
#endif
