// AMX-INT8 tiles for the quantized linear kernel (linear_quant/dispatch.cpp), on the shared driver
// (linear/driver.hpp) and the tiles of linear/amx.hpp: an item's rows go 32 at a time
// through a 2 x 2 block of 16 x 16 int32 accumulator tiles per 32-column weight tile.
//
// The packed weight is TDPBSUD's B operand as it is: a block's step s (4 features) of half tile
// h is 16 columns x 4 unsigned bytes, one 64-byte row, and steps are 128 bytes apart (the two
// halves side by side), so a group of 32 (16) features is a B tile of 8 (4) rows; 4-bit blocks
// are spread to one value per byte first (1 KB per block). A is 16 rows of a group's int8
// activations, read in place from the quantized rows.
//
// Same bits as the VNNI path: a group's int32 sums are exact however they are added (at most
// 32 x 255 x 127 in magnitude), and they are folded into the fp32 accumulators with the VNNI
// path's own operations in its order (scale * d, then the two FMAs, group after group). So
// any row threshold between the two keeps batch invariance. int16 activation rows (K::kParts
// 2) are two tile products a group, their hi and lo int8 parts, folded as 255 hi + lo as the
// VNNI path folds them. The fp32 accumulators of a block
// live in memory between groups (a group's int32 tiles are stored, converted and folded).
#pragma once

#include <cstdint>

#include "cpu/arch.hpp"
#include "linear/amx.hpp"
#include "linear_quant/layout.hpp"

#if PAGEDSERVE_X86  // AMX-INT8 tiles and the AVX-512 fold: x86 only
namespace pagedserve::linear_detail {

// A block of `rows` (1 .. 32) rows of groups of `group` features: A tiles `group` bytes wide,
// B tiles group / 4 rows of 64 bytes, C tiles 16 int32 wide.
inline TileConfig int8_block_config(std::int64_t rows, std::int64_t group) {
    TileConfig c = block_config(rows);
    c.colsb[kA0] = static_cast<std::uint16_t>(group);
    if (c.rows[kA0 + 1] > 0) c.colsb[kA0 + 1] = static_cast<std::uint16_t>(group);
    c.rows[kB0] = c.rows[kB0 + 1] = static_cast<std::uint8_t>(group / 4);
    return c;
}

// The driver's Item for quantized kernel K (avx512_vnni.hpp's QuantKernel, as avx512_bf16.cpp
// compiles it) on Tiles.
template <typename K, typename Tiles>
struct AmxQuantItems {
    using Args = typename K::Args;
    static constexpr quant_detail::Format kFormat = K::kFormat;
    static constexpr std::int64_t kSteps = quant_detail::kBlockK / 4;  // 4-feature steps per block
    static constexpr std::int64_t kStepBytes = 2 * kTileBytes;          // both half tiles
    static constexpr int kParts = K::kParts;  // int8 rows (1), int16 rows as two int8 parts (2)
    using Sums = std::int32_t[kBlockRows][kLinearTileN];

    static void run(const Args& a, std::int64_t row0, std::int64_t rows, std::int64_t tile0,
                    std::int64_t tile_end, std::int64_t next0, std::int64_t next_end) {
        run_blocks<K, Tiles, AmxQuantItems>(
            a, row0, rows, tile0, tile_end, next0, next_end,
            [](std::int64_t block_rows) { return int8_block_config(block_rows, kFormat.group_size); });
    }

    // Rows [row0, row0 + rows) x weight tile t, with `halves` A tiles (rows > 16: 2).
    template <int halves>
    static void block(Tiles& tiles, const Args& a, std::int64_t row0, std::int64_t rows,
                      std::int64_t t, Prefetch prefetch) {
        const std::uint8_t* w = tile_weights<K>(a, t);
        const std::int64_t blocks = a.k / quant_detail::kBlockK;
        const std::int64_t block_bytes = kFormat.block_bytes();
        alignas(64) float acc[kBlockRows][kLinearTileN] = {};
        alignas(64) Sums sums[kParts];  // per activation part
        alignas(64) std::uint8_t spread[kSteps * kStepBytes];  // a 4-bit block, a value a byte
        std::int64_t line = 0;
        for (std::int64_t b = 0; b < blocks; ++b) {
            for (std::int64_t i = 0; i <= block_bytes / 64 && line < prefetch.lines; ++i, ++line)
                _mm_prefetch(prefetch.begin + 64 * line, _MM_HINT_T1);
            const std::uint8_t* quants = w + b * block_bytes;
            const std::uint8_t* values = quants;
            if constexpr (kFormat.bits == 4) values = spread_nibbles(quants, spread);
            for (std::int64_t g = 0; g < kFormat.groups(); ++g) {
                const std::uint8_t* x =
                    a.acts + row0 * a.act_row_bytes + quant_detail::kBlockK * b + kFormat.group_size * g;
                const std::uint8_t* v = values + g * (kFormat.group_size / 4) * kStepBytes;
                tiles.template load<kB0>(v, kStepBytes);
                tiles.template load<kB0 + 1>(v + kTileBytes, kStepBytes);
                for (int p = 0; p < kParts; ++p)  // part p of the rows: k bytes after part p - 1
                    group_sums<halves>(tiles, a, x + p * a.k, sums[p]);
                fold(a, row0, rows, b, g, quants, sums, acc);
            }
        }
        store_block<K>(a, row0, rows, t, acc, NothingMore{});
    }

private:
    // sums = the loaded B tiles times the group's int8 activations at x (rows act_row_bytes
    // apart), `halves` A tiles of 16 rows.
    template <int halves>
    static void group_sums(Tiles& tiles, const Args& a, const std::uint8_t* x, Sums& sums) {
        constexpr std::int64_t row_bytes = sizeof(sums[0]);
        tiles.template zero<0>();
        tiles.template zero<1>();
        tiles.template load<kA0>(x, a.act_row_bytes);
        tiles.template dot_int8<0, kA0, kB0>();
        tiles.template dot_int8<1, kA0, kB0 + 1>();
        tiles.template store<0>(&sums[0][0], row_bytes);
        tiles.template store<1>(&sums[0][kTileCols], row_bytes);
        if constexpr (halves == 2) {
            tiles.template zero<2>();
            tiles.template zero<3>();
            tiles.template load<kA0 + 1>(x + kTileRows * a.act_row_bytes, a.act_row_bytes);
            tiles.template dot_int8<2, kA0 + 1, kB0>();
            tiles.template dot_int8<3, kA0 + 1, kB0 + 1>();
            tiles.template store<2>(&sums[kTileRows][0], row_bytes);
            tiles.template store<3>(&sums[kTileRows][kTileCols], row_bytes);
        }
    }

    // A 4-bit block's steps s < 4 (low nibbles) and s + 4 (high nibbles) as one byte each, in
    // the 8-bit layout.
    PAGEDSERVE_LINEAR_TARGET static const std::uint8_t* spread_nibbles(const std::uint8_t* quants,
                                                                       std::uint8_t* out) {
        const __m512i low = _mm512_set1_epi8(0x0F);
        for (std::int64_t i = 0; i < kSteps; ++i) {  // row i = 2 s + h holds steps s and s + 4
            const __m512i v = _mm512_loadu_si512(quants + i * kTileBytes);
            _mm512_store_si512(out + i * kTileBytes, _mm512_and_si512(v, low));
            _mm512_store_si512(out + (i + kSteps) * kTileBytes,
                               _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
        }
        return out;
    }

    // acc[r] += float(sums[r]) * (scale * d) + min * group_sum: the VNNI path's fold_group
    // (int16 rows: sums = 255 sums(hi) + sums(lo), as it folds them).
    PAGEDSERVE_LINEAR_TARGET static void fold(const Args& a, std::int64_t row0, std::int64_t rows,
                                              std::int64_t b, std::int64_t g,
                                              const std::uint8_t* quants, const Sums (&sums)[kParts],
                                              float (&acc)[kBlockRows][kLinearTileN]) {
        for (int h = 0; h < 2; ++h) {
            const quant_detail::HalfScales sc =
                quant_detail::half_scales<kFormat.half_scales>(kFormat, quants, g, h);
            for (std::int64_t r = 0; r < rows; ++r) {
                const quant_detail::ActivationRow row(a.acts + (row0 + r) * a.act_row_bytes, a.k,
                                                      kParts);
                __m512i sum = _mm512_load_si512(&sums[0][r][16 * h]);
                if constexpr (kParts == 2) {  // 255 sums(hi) + sums(lo)
                    sum = _mm512_sub_epi32(_mm512_slli_epi32(sum, 8), sum);
                    sum = _mm512_add_epi32(sum, _mm512_load_si512(&sums[1][r][16 * h]));
                }
                const __m512 out = quant_detail::fold_group(_mm512_load_ps(&acc[r][16 * h]), sum,
                                                            sc, row.d[b],
                                                            row.group_sum(kFormat, b, g));
                _mm512_store_ps(&acc[r][16 * h], out);
            }
        }
    }
};

}  // namespace pagedserve::linear_detail
#endif  // PAGEDSERVE_X86
