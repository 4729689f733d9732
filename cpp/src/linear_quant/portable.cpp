// The portable path of linear_quant.hpp (see linear_quant/kernels.hpp). Threads split the
// 32-column tiles; each (row, column) is one fp32 accumulator over the groups in order, and the
// epilogue rounds as the vector paths do (cpu/kernel_math.hpp): the same bits, SiLU-gated included.
// Also the float-activation product (quant_linear_float_portable), on the same epilogue.
#include "linear_quant/kernels.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/kernel_math.hpp"
#include "linear_quant/layout.hpp"
#include "pagedserve/linear.hpp"

namespace pagedserve::quant_detail {
namespace {

// u of column c (< 32), feature e (< 32) of a packed block.
std::int32_t unsigned_value(const Format& f, const std::uint8_t* block, std::int64_t c,
                            std::int64_t e) {
    const std::int64_t s = e / 4, j = e % 4, h = c / 16, lane = c % 16;
    if (f.bits == 8) return block[((s * 2 + h) * 16 + lane) * 4 + j];
    const std::uint8_t byte = block[(((s % 4) * 2 + h) * 16 + lane) * 4 + j];
    return s < 4 ? (byte & 0xF) : (byte >> 4);
}

// The activation q of feature e of a row: int8, or int16 from its two parts (layout.hpp).
std::int32_t activation(const ActivationRow& row, std::int64_t k, int parts, std::int64_t e) {
    return parts == 1 ? row.q[e] : kInt16Radix * row.q[e] + row.q[k + e];
}

float dot(const Format& f, const std::uint8_t* tile, std::int64_t c, const std::uint8_t* act,
          std::int64_t k, int parts) {
    const ActivationRow row(act, k, parts);
    float acc = 0.0f;
    const std::int64_t per_group = f.group_size;
    for (std::int64_t b = 0; b < k / kBlockK; ++b) {
        const std::uint8_t* block = tile + b * f.block_bytes();
        for (std::int64_t g = 0; g < f.groups(); ++g) {
            std::int32_t isum = 0;
            for (std::int64_t e = g * per_group; e < (g + 1) * per_group; ++e)
                isum += unsigned_value(f, block, c, e) * activation(row, k, parts, kBlockK * b + e);
            const float sd = block_scale(f, block, 0, g, c) * row.d[b];
            acc = std::fma(static_cast<float>(isum), sd, acc);
            acc = std::fma(block_scale(f, block, 1, g, c), row.group_sum(f, b, g), acc);
        }
    }
    return acc;
}

float load(const void* p, bool float32, std::int64_t i) {
    if (float32) return static_cast<const float*>(p)[i];
    const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(p)[i])
                               << 16;
    float v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
}

void store(const QuantLinearArgs& a, std::int64_t row, std::int64_t col, float v) {
    if (a.float32 || a.out_float32) {
        static_cast<float*>(a.out)[row * a.out_stride + col] = v;
        return;
    }
    static_cast<std::uint16_t*>(a.out)[row * a.out_stride + col] =
        kernel_math::bf16_bits_like_vcvtneps2bf16(v);
}

// The driver's epilogue for one row of tile t's 32 sums: bias, then residual; or a gated tile's
// silu(gate) * up.
void store_tile_row(const QuantLinearArgs& a, std::int64_t t, std::int64_t row,
                    const float (&acc)[kTileN]) {
    if (a.gated_width > 0) {
        for (std::int64_t c = 0; c < kLinearGateCols; ++c) {
            const std::int64_t col = t * kLinearGateCols + c;
            const float gate = acc[c], up = acc[c + kLinearGateCols];
            if (col < a.gated_width) store(a, row, col, kernel_math::silu_mul_like_kernels(gate, up));
        }
        return;
    }
    for (std::int64_t c = 0; c < kTileN && t * kTileN + c < a.n; ++c) {
        const std::int64_t col = t * kTileN + c;
        float v = acc[c] + (a.bias ? load(a.bias, a.float32, col) : 0.0f);
        if (a.residual) v += load(a.residual, a.float32, row * a.residual_stride + col);
        store(a, row, col, v);
    }
}

// One tile's 32 columns for one row of int8 (or int16) activations.
void tile_row(const QuantLinearArgs& a, const Format& f, std::int64_t t, std::int64_t row,
              const std::uint8_t* act) {
    const std::uint8_t* tile = a.packed + t * tile_bytes(f, a.k);
    float acc[kTileN];
    const int parts = a.int16_activations ? 2 : 1;
    for (std::int64_t c = 0; c < kTileN; ++c) acc[c] = dot(f, tile, c, act, a.k, parts);
    store_tile_row(a, t, row, acc);
}

// float_activations: x[e] times w = fma(scale, u, min), one fp32 FMA chain over the features
// in order per column (the AVX2 path's operations, so its bits too, though no level promises
// another's).
void float_tile_row(const QuantLinearArgs& a, const Format& f, std::int64_t t, const float* x,
                    std::int64_t row) {
    const std::uint8_t* tile = a.packed + t * tile_bytes(f, a.k);
    float acc[kTileN] = {};
    for (std::int64_t b = 0; b < a.k / kBlockK; ++b) {
        const std::uint8_t* block = tile + b * f.block_bytes();
        for (std::int64_t c = 0; c < kTileN; ++c) {
            for (std::int64_t e = 0; e < kBlockK; ++e) {
                const std::int64_t g = e / f.group_size;
                const float w = std::fma(block_scale(f, block, 0, g, c),
                                         static_cast<float>(unsigned_value(f, block, c, e)),
                                         block_scale(f, block, 1, g, c));
                acc[c] = std::fma(x[kBlockK * b + e], w, acc[c]);
            }
        }
    }
    store_tile_row(a, t, row, acc);
}

}  // namespace

void quant_linear_portable(const QuantLinearArgs& args, const std::uint8_t* acts,
                           std::int64_t act_row_bytes, int num_threads) {
    const Format f = format_of(args.ggml_type);
    const std::int64_t tiles = num_tiles(args.n);
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (std::int64_t t = 0; t < tiles; ++t) {
        for (std::int64_t r = 0; r < args.m; ++r) tile_row(args, f, t, r, acts + r * act_row_bytes);
    }
}

}  // namespace pagedserve::quant_detail

namespace pagedserve::quant_detail {

void quant_linear_float_portable(const QuantLinearArgs& args, const float* x,
                                 std::int64_t x_stride, int num_threads) {
    const Format f = format_of(args.ggml_type);
    const std::int64_t tiles = num_tiles(args.n);
    const int threads = args.m * args.n * args.k < (1 << 18) ? 1 : num_threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::int64_t t = 0; t < tiles; ++t) {
        for (std::int64_t r = 0; r < args.m; ++r) float_tile_row(args, f, t, x + r * x_stride, r);
    }
}

}  // namespace pagedserve::quant_detail
