// Rows of float32 or bfloat16 storage, converted to and from fp32 scratch. Plain loops the
// compiler vectorizes (`omp simd`); bf16 is the top 16 bits of an IEEE float.
#pragma once

#include <cstdint>
#include <cstring>

namespace pagedserve {

struct Bf16 {
    std::uint16_t bits;
};

inline void load_row(const float* src, float* dst, std::int64_t n) {
    std::memcpy(dst, src, sizeof(float) * n);
}

inline void load_row(const Bf16* src, float* dst, std::int64_t n) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
        const std::uint32_t bits = static_cast<std::uint32_t>(src[i].bits) << 16;
        std::memcpy(dst + i, &bits, sizeof(float));
    }
}

inline void store_row(const float* src, float* dst, std::int64_t n) {
    std::memcpy(dst, src, sizeof(float) * n);
}

// Round to nearest even; NaN stays NaN (quieted).
inline void store_row(const float* src, Bf16* dst, std::int64_t n) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
        std::uint32_t u;
        std::memcpy(&u, src + i, sizeof(u));
        const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
        const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        dst[i].bits = static_cast<std::uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
    }
}

}  // namespace pagedserve
