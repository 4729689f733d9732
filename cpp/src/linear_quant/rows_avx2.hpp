// The AVX2 pieces the activation rows share (activations.cpp: int8 rows, activations16.cpp:
// int16 rows' two parts): 8 lanes of x widened to fp32, an exact int32 lane sum, 32 int32
// lanes stored as int8 bytes in order. Every function is in an anonymous namespace: each
// translation unit's own copy, compiled for AVX2 + FMA by its target attribute.
#pragma once

#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // AVX2 intrinsics
#include <immintrin.h>

#include <cstdint>

#define PAGEDSERVE_ROWS_AVX2_TARGET __attribute__((target("avx2,fma")))

namespace pagedserve::quant_detail {
namespace {

// x[0 .. 8) as fp32 lanes: fp32 as it is, bf16 bits widened exactly.
template <typename T>
PAGEDSERVE_ROWS_AVX2_TARGET __m256 load8(const T* x) {
    if constexpr (sizeof(T) == 4) {
        return _mm256_loadu_ps(x);
    } else {
        const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    }
}

PAGEDSERVE_ROWS_AVX2_TARGET inline int sum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// 32 int32 lanes (|v| <= 127) as 32 int8 bytes in order: pack dwords -> words -> bytes, then
// undo packs' 128-bit lane interleave.
PAGEDSERVE_ROWS_AVX2_TARGET inline void store_bytes(const __m256i (&v)[4], std::int8_t* to) {
    const __m256i w01 = _mm256_packs_epi32(v[0], v[1]), w23 = _mm256_packs_epi32(v[2], v[3]);
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23),
                                                      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), bytes);
}

}  // namespace
}  // namespace pagedserve::quant_detail
#endif  // PAGEDSERVE_X86
