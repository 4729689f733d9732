// Scalar twins of the vector kernels' math, operation for operation, so that every ISA path of a
// kernel rounds alike: the portable loops give the AVX2 and AVX-512 paths' bits.
//   exp_like_kernels   linear/driver.hpp's exp_ps (Cody-Waite by ln 2, degree-7 Taylor,
//                      then the power of two exactly, as vscalefps)
//   silu_mul_like_kernels   gate * up / (1 + e^-gate), as silu_mul
//   bf16_bits_like_vcvtneps2bf16   the SDM's vcvtneps2bf16: round to nearest even, zero and
//                      denormals to a signed zero, NaN quieted
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pagedserve::kernel_math {

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;       // exact in few bits: i * kLn2Hi is exact
inline constexpr float kLn2Lo = -2.12194440e-4f;
// The Taylor coefficients of e^f, highest first (the Horner order of every path).
inline constexpr float kExpTaylor[8] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f,
                                        1.0f / 24.0f,   1.0f / 6.0f,   0.5f,
                                        1.0f,           1.0f};

inline float exp_like_kernels(float y) {
    if (std::isnan(y)) return y;
    const float i = std::nearbyint(y * kLog2e);  // the default rounding: to nearest even
    float f = std::fma(-i, kLn2Hi, y);            // vfnmadd: -(i * hi) + y, one rounding
    f = std::fma(-i, kLn2Lo, f);
    float p = kExpTaylor[0];
    for (int c = 1; c < 8; ++c) p = std::fma(p, f, kExpTaylor[c]);
    return std::ldexp(p, static_cast<int>(std::fmax(-300.0f, std::fmin(300.0f, i))));
}

inline float silu_mul_like_kernels(float gate, float up) {
    const float e = exp_like_kernels(0.0f - gate);
    return (gate * up) / (1.0f + e);
}

inline std::uint16_t bf16_bits_like_vcvtneps2bf16(float v) {
    std::uint32_t u;
    std::memcpy(&u, &v, sizeof(u));
    if ((u & 0x7f800000u) == 0) return static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
    return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace pagedserve::kernel_math
