// Rows of float32, bfloat16 or float16 storage, converted to and from fp32 scratch. Plain loops
// the compiler vectorizes (`omp simd`); bf16 is the top 16 bits of an IEEE float, fp16 IEEE
// binary16 (an fp16 KV cache under fp32 or bf16 activations: paged_attention.hpp). Also the
// 8-bit float e4m3 ("fn": no infinities, 0x7f and 0xff NaN) of an fp8 KV cache.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

namespace pagedserve {

struct Bf16 {
    std::uint16_t bits;
};

struct Half {
    std::uint16_t bits;
};

// binary16 -> float, exactly: normals rebiased, subnormals as m x 2^-24, inf and NaN kept.
inline float half_to_float(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t magnitude = h & 0x7fffu;
    std::uint32_t bits = (magnitude << 13) + 0x38000000u;  // normal: exponent + (127 - 15)
    if (magnitude >= 0x7c00u) bits = (magnitude << 13) | 0x7f800000u;  // inf, NaN
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    if (magnitude < 0x0400u) f = static_cast<float>(magnitude) * 0x1p-24f;  // zero, subnormal
    std::uint32_t out;
    std::memcpy(&out, &f, sizeof(out));
    out |= sign;
    std::memcpy(&f, &out, sizeof(f));
    return f;
}

// float -> binary16, round to nearest even (torch's .to(torch.float16)): past 65504 to inf at
// the halfway point 65520, below 2^-14 to subnormals, NaN stays NaN (quieted).
inline std::uint16_t float_to_half(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | static_cast<std::uint16_t>((a >> 13) & 0x3ffu);
    if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520: inf
    if (a >= 0x38800000u) {                        // >= 2^-14: a normal half
        const std::uint32_t v = a - 0x38000000u;   // exponent - (127 - 15)
        return sign | static_cast<std::uint16_t>((v + 0xfffu + ((v >> 13) & 1u)) >> 13);
    }
    // Subnormal or zero: adding 0.5 (whose ulp is 2^-24, the subnormal step) rounds |f| to a
    // multiple of 2^-24 in the float unit, to nearest even; its low bits are the half's.
    float magnitude;
    std::memcpy(&magnitude, &a, sizeof(magnitude));
    const float rounded = magnitude + 0.5f;
    std::uint32_t r;
    std::memcpy(&r, &rounded, sizeof(r));
    return sign | static_cast<std::uint16_t>(r - 0x3f000000u);
}

// e4m3 -> float, exactly: 1 sign, 4 exponent (bias 7), 3 mantissa bits; e = 0 subnormal
// (m x 2^-9), magnitude 0x7f NaN. The largest finite value is 448 (0x7e).
inline float e4m3_to_float(std::uint8_t b) {
    const std::uint32_t magnitude = b & 0x7fu;
    float f = static_cast<float>(magnitude & 7u) * 0x1p-9f;  // zero, subnormal
    if (magnitude >= 8u) {
        const std::uint32_t bits = (magnitude << 20) + (120u << 23);  // exponent + (127 - 7)
        std::memcpy(&f, &bits, sizeof(f));
    }
    if (magnitude == 0x7fu) f = std::numeric_limits<float>::quiet_NaN();
    return (b & 0x80u) ? -f : f;
}

// float -> e4m3, round to nearest even, saturating at +-448 (torch's .to(torch.float8_e4m3fn)
// on this range: anything at or past 448, infinities included, becomes 448); NaN stays NaN.
inline std::uint8_t float_to_e4m3(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    const std::uint8_t sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7fu;  // NaN
    if (a >= 0x43e00000u) return sign | 0x7eu;  // >= 448: saturate
    if (a >= 0x3c800000u) {                     // >= 2^-6: a normal e4m3
        const std::uint32_t v = a - 0x3c000000u;  // exponent - (127 - 7)
        return sign | static_cast<std::uint8_t>((v + 0x7ffffu + ((v >> 20) & 1u)) >> 20);
    }
    // Subnormal or zero: adding 2^14 (whose ulp is 2^-9, the subnormal step) rounds |f| to a
    // multiple of 2^-9 in the float unit, to nearest even; 8 steps is 2^-6, the code 0x08.
    float magnitude;
    std::memcpy(&magnitude, &a, sizeof(magnitude));
    const float rounded = magnitude + 0x1p14f;
    std::uint32_t r;
    std::memcpy(&r, &rounded, sizeof(r));
    return sign | static_cast<std::uint8_t>(r - 0x46800000u);
}

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

inline void load_row(const Half* src, float* dst, std::int64_t n) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i].bits);
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

inline void store_row(const float* src, Half* dst, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) dst[i].bits = float_to_half(src[i]);
}

}  // namespace pagedserve
