// The packed layout of linear_quant.hpp's weights and the per-row int8 activations, shared by
// the packer (linear_quant/pack.cpp), the VNNI kernel and the portable one.
//
// Weight: [tile of 32 columns][block of 32 features] -> quant bytes, then scales, then mins.
//   8-bit: byte [s][h][c][j] = u(column 16 h + c, feature 4 s + j), s < 8, h < 2, c < 16, j < 4:
//          one 64-byte vector per (step of 4 features, half tile) is vpdpbusd's u8 operand.
//   4-bit: byte [s][h][c][j] = u(.., 4 s + j) | u(.., 4 (s + 4) + j) << 4, s < 4: the low
//          nibbles are step s, the high ones step s + 4.
//   scales / mins: [group][32 columns], 32 / group_size groups per block: fp16 where the GGUF
//          format's own scales are fp16 and the packed ones equal them exactly (Q4_0: d and
//          -8 d, Q4_1: d and m, Q8_0: d and -128 d), else fp32 (the K-quants' d * sub-scale).
// Activations, per row: int8 q[k], then fp32 d[k / 32], sum32[k / 32] = d * sum(q over the
// block), sum16[k / 16] = d * sum(q over 16 features); the row is activation_row_bytes(k) long.
// int16 activations (QuantLinearArgs::int16_activations) store each q = 255 hi + lo as two int8
// parts, hi[k] then lo[k] (|hi|, |lo| <= 127), before the same d and sums: every int8 kernel sums
// u * hi and u * lo exactly and folds 255 isum(hi) + isum(lo) as one int32 (activations16.cpp);
// such a row is activation_row_bytes(k, 2) long.
#pragma once

#include "cpu/arch.hpp"
#include "pagedserve/rows.hpp"  // half_to_float

#if PAGEDSERVE_X86  // the AVX-512 kernels' view of the scales
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pagedserve::quant_detail {

inline constexpr std::int64_t kTileN = 32;   // columns per tile
inline constexpr std::int64_t kBlockK = 32;  // features per packed block

struct Format {
    int bits = 8;              // 4: two values per byte, 8: one
    int group_size = 32;       // features sharing one scale and min (16 or 32)
    bool half_scales = false;  // scales and mins in fp16 (exact), else fp32

    constexpr std::int64_t groups() const { return kBlockK / group_size; }
    constexpr std::int64_t quant_bytes() const { return kTileN * kBlockK * bits / 8; }
    constexpr std::int64_t scale_bytes() const { return half_scales ? 2 : 4; }
    constexpr std::int64_t block_bytes() const {
        return quant_bytes() + 2 * groups() * kTileN * scale_bytes();
    }
    // Byte offset in a block of the 32 scales (which = 0) or mins (1) of group g.
    constexpr std::int64_t scales_at(int which, std::int64_t g) const {
        return quant_bytes() + (which * groups() + g) * kTileN * scale_bytes();
    }
};

#if PAGEDSERVE_X86  // AVX-512 registers: the VNNI and AMX-INT8 paths only
// The AVX-512 kernels' view of a group's scales: half tile h's 16 scales and 16 mins as fp32.
struct HalfScales {
    __m512 scale, min;
};

template <bool kHalf>
__attribute__((target("avx512f"), always_inline)) inline __m512 load_scales(const std::uint8_t* at) {
    if constexpr (kHalf) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
    } else {
        return _mm512_loadu_ps(reinterpret_cast<const float*>(at));
    }
}

// Group g's scales and mins for half tile h of a packed block in format f (kHalf: f.half_scales).
template <bool kHalf>
__attribute__((target("avx512f"), always_inline)) inline HalfScales half_scales(
    const Format& f, const std::uint8_t* block, std::int64_t g, int h) {
    const std::int64_t half = 16 * h * f.scale_bytes();
    return {load_scales<kHalf>(block + f.scales_at(0, g) + half),
            load_scales<kHalf>(block + f.scales_at(1, g) + half)};
}

// out + float(isum) * (scale * d) + min * group_sum: one group of one row and half tile, the
// fold of every int8 path (VNNI, AMX-INT8 tiles: the same operations, so the same bits).
__attribute__((target("avx512f"), always_inline)) inline __m512 fold_group(
    __m512 out, __m512i isum, const HalfScales& s, float d, float group_sum) {
    const __m512 sd = _mm512_mul_ps(s.scale, _mm512_set1_ps(d));
    out = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sd, out);
    return _mm512_fmadd_ps(s.min, _mm512_set1_ps(group_sum), out);
}
#endif  // PAGEDSERVE_X86

// Scale (which = 0) or min (1) of column c, group g of a packed block.
inline float block_scale(const Format& f, const std::uint8_t* block, int which, std::int64_t g,
                         std::int64_t c) {
    const std::uint8_t* at = block + f.scales_at(which, g) + c * f.scale_bytes();
    if (f.half_scales) {
        std::uint16_t h;
        std::memcpy(&h, at, sizeof(h));
        return half_to_float(h);
    }
    float v;
    std::memcpy(&v, at, sizeof(v));
    return v;
}

Format format_of(int ggml_type);  // throws std::invalid_argument for a type without a kernel

inline std::int64_t num_tiles(std::int64_t n) { return (n + kTileN - 1) / kTileN; }
inline std::int64_t tile_bytes(const Format& f, std::int64_t k) {
    return (k / kBlockK) * f.block_bytes();
}

// parts: 1 (int8 q), or 2 (int16 q as its hi and lo int8 parts).
inline std::int64_t activation_row_bytes(std::int64_t k, int parts = 1) {
    return parts * k + 4 * (k / kBlockK) * 2 + 4 * (k / 16);
}

// The weight of part 0 (hi) of an int16 activation: q = kInt16Radix hi + lo.
inline constexpr std::int32_t kInt16Radix = 255;

// Views of one activation row (parts 2: q is hi, lo follows it, k bytes on).
struct ActivationRow {
    const std::int8_t* q;
    const float* d;
    const float* sum32;
    const float* sum16;

    ActivationRow(const std::uint8_t* row, std::int64_t k, int parts = 1)
        : q(reinterpret_cast<const std::int8_t*>(row)),
          d(reinterpret_cast<const float*>(row + parts * k)),
          sum32(d + k / kBlockK),
          sum16(sum32 + k / kBlockK) {}

    // d * sum(q) over group g (of f's size) of block b.
    float group_sum(const Format& f, std::int64_t b, std::int64_t g) const {
        return f.group_size == 32 ? sum32[b] : sum16[2 * b + g];
    }

    std::int32_t step(std::int64_t b, std::int64_t s) const {  // 4 int8 of features 32 b + 4 s
        std::int32_t v;
        std::memcpy(&v, q + kBlockK * b + 4 * s, sizeof(v));
        return v;
    }
};

// Element i of an activation row: fp32, or bf16 bits widened (exact).
template <typename T>
float to_float(const T* x, std::int64_t i) {
    if constexpr (sizeof(T) == 4) {
        return x[i];
    } else {
        const std::uint32_t bits = static_cast<std::uint32_t>(x[i]) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof(f));
        return f;
    }
}

// Quantizes rows [0, m) of x (bf16 bits or fp32) into `out` (activation_row_bytes(k) each);
// portable: the plain loop even where AVX-512 exists (the bytes are the same either way).
void quantize_activations(const void* x, bool float32, std::int64_t x_stride, std::int64_t m,
                          std::int64_t k, std::uint8_t* out, int num_threads, bool portable);

// The int16 rows (activation_row_bytes(k, 2) each): per 32 features d = max|x| / 32512 and
// q = round-half-even(x * (32512 / max|x|)), |q| <= 32512 = 255 x 127 + 127, split as
// hi = round(q / 255), lo = q - 255 hi; the sums as the int8 rows' (d * sum(q)). portable: the
// plain loop even where the AVX2 row runs (activations16.cpp; the same bytes either way).
void quantize_activations16(const void* x, bool float32, std::int64_t x_stride, std::int64_t m,
                            std::int64_t k, std::uint8_t* out, int num_threads, bool portable);

}  // namespace pagedserve::quant_detail
