// The packed layout of linear_quant.hpp's weights and the per-row int8 activations, shared by
// the packer (linear_quant_pack.cpp), the VNNI kernel and the portable one.
//
// Weight: [tile of 32 columns][block of 32 features] -> quant bytes, then scales, then mins.
//   8-bit: byte [s][h][c][j] = u(column 16 h + c, feature 4 s + j), s < 8, h < 2, c < 16, j < 4:
//          one 64-byte vector per (step of 4 features, half tile) is vpdpbusd's u8 operand.
//   4-bit: byte [s][h][c][j] = u(.., 4 s + j) | u(.., 4 (s + 4) + j) << 4, s < 4: the low
//          nibbles are step s, the high ones step s + 4.
//   scales / mins: fp32 [group][32 columns], 32 / group_size groups per block.
// Activations, per row: int8 q[k], then fp32 d[k / 32], sum32[k / 32] = d * sum(q over the
// block), sum16[k / 16] = d * sum(q over 16 features); the row is activation_row_bytes(k) long.
#pragma once

#include <cstdint>
#include <cstring>

namespace pagedserve::quant_detail {

inline constexpr std::int64_t kTileN = 32;   // columns per tile
inline constexpr std::int64_t kBlockK = 32;  // features per packed block

struct Format {
    int bits = 8;         // 4: two values per byte, 8: one
    int group_size = 32;  // features sharing one scale and min (16 or 32)

    std::int64_t groups() const { return kBlockK / group_size; }
    std::int64_t quant_bytes() const { return kTileN * kBlockK * bits / 8; }
    std::int64_t block_bytes() const { return quant_bytes() + 2 * groups() * kTileN * 4; }
};

Format format_of(int ggml_type);  // throws std::invalid_argument for a type without a kernel

inline std::int64_t num_tiles(std::int64_t n) { return (n + kTileN - 1) / kTileN; }
inline std::int64_t tile_bytes(const Format& f, std::int64_t k) {
    return (k / kBlockK) * f.block_bytes();
}

inline std::int64_t activation_row_bytes(std::int64_t k) {
    return k + 4 * (k / kBlockK) * 2 + 4 * (k / 16);
}

// Views of one activation row.
struct ActivationRow {
    const std::int8_t* q;
    const float* d;
    const float* sum32;
    const float* sum16;

    ActivationRow(const std::uint8_t* row, std::int64_t k)
        : q(reinterpret_cast<const std::int8_t*>(row)),
          d(reinterpret_cast<const float*>(row + k)),
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

// Quantizes rows [0, m) of x (bf16 bits or fp32) into `out` (activation_row_bytes(k) each);
// portable: the plain loop even where AVX-512 exists (the bytes are the same either way).
void quantize_activations(const void* x, bool float32, std::int64_t x_stride, std::int64_t m,
                          std::int64_t k, std::uint8_t* out, int num_threads, bool portable);

}  // namespace pagedserve::quant_detail
