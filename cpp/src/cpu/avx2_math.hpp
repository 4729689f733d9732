// The AVX-512 driver's epilogue math (linear/driver.hpp's exp_ps, silu_mul, vcvtneps2bf16) in
// 8-lane AVX2 registers, operation for operation (cpu/kernel_math.hpp has the scalar twins), so
// an AVX2 kernel's epilogue rounds as the AVX-512 one's: the dense linear's AVX2 path
// (linear/avx2.cpp) gives the fp32 AVX-512 path's bits, and the quantized kernel's AVX2 path
// (linear_quant/avx2.hpp) the VNNI path's.
//
// Compiled for AVX2 + FMA only (no F16C needed): a caller compiled for more (avx2,fma,f16c or
// avx2 + avxvnni) may inline them.
#pragma once

#include "cpu/arch.hpp"

#if PAGEDSERVE_X86
#include <immintrin.h>

#include "cpu/kernel_math.hpp"

#define PAGEDSERVE_AVX2_MATH inline __attribute__((target("avx2,fma")))

// No multiply-add fused but the source's: GCC's default (-ffp-contract=fast) would fuse
// exp8's last product into silu_mul8's 1 + e, which vscalefps's AVX-512 twin cannot.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

namespace pagedserve::avx2_math {

// e^y as linear_detail::exp_ps; 2^i as two normal powers of two (equal to vscalefps's p * 2^i:
// p * 2^floor(i / 2) is exact, the second factor rounds once, as vscalefps does; |i| > 252 is
// 0 or inf either way).
PAGEDSERVE_AVX2_MATH __m256 exp8(__m256 y) {
    using namespace kernel_math;
    const __m256 i = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(kLog2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(i, _mm256_set1_ps(kLn2Hi), y);
    f = _mm256_fnmadd_ps(i, _mm256_set1_ps(kLn2Lo), f);
    __m256 p = _mm256_set1_ps(kExpTaylor[0]);
    for (int c = 1; c < 8; ++c) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExpTaylor[c]));
    const __m256 clamped =
        _mm256_min_ps(_mm256_max_ps(i, _mm256_set1_ps(-252.0f)), _mm256_set1_ps(252.0f));
    const __m256i whole = _mm256_cvttps_epi32(clamped);  // NaN: 0x80000000, p is NaN anyway
    const __m256i half = _mm256_srai_epi32(whole, 1);   // floor(i / 2)
    const __m256i rest = _mm256_sub_epi32(whole, half);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
    const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, p1), p2);
}

// silu(gate) * up = gate * up / (1 + e^-gate), as linear_detail::silu_mul.
PAGEDSERVE_AVX2_MATH __m256 silu_mul8(__m256 gate, __m256 up) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gate));
    return _mm256_div_ps(_mm256_mul_ps(gate, up), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// 8 fp32 lanes as 8 bf16 in vcvtneps2bf16's rounding (kernel_math's
// bf16_bits_like_vcvtneps2bf16): nearest even, zero and denormals to a signed zero, NaN quieted.
PAGEDSERVE_AVX2_MATH __m128i bf16_bits8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i top = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
    __m256i bits = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i magnitude = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
    const __m256i tiny = _mm256_cmpeq_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7f800000)),
                                            _mm256_setzero_si256());
    bits = _mm256_blendv_epi8(bits, _mm256_or_si256(top, _mm256_set1_epi32(0x40)), nan);
    bits = _mm256_blendv_epi8(bits, _mm256_and_si256(top, _mm256_set1_epi32(0x8000)), tiny);
    // Lanes are < 2^16: pack the 8 dwords to 8 words (packus works within 128-bit halves).
    const __m256i packed = _mm256_packus_epi32(bits, bits);
    return _mm_unpacklo_epi64(_mm256_castsi256_si128(packed), _mm256_extracti128_si256(packed, 1));
}

// 8 bf16 as fp32: the bits shifted into the top half (exact; no F16C, which converts fp16).
PAGEDSERVE_AVX2_MATH __m256 widen_bf16x8(__m128i bits) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

}  // namespace pagedserve::avx2_math

#pragma GCC pop_options  // fp-contract
#undef PAGEDSERVE_AVX2_MATH
#endif  // PAGEDSERVE_X86
