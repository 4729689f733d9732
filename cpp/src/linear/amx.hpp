// AMX-BF16 tiles for the bf16 linear kernel (linear/avx512_bf16.cpp), on the driver's threads, shares
// and panels (linear/driver.hpp): an item's rows go 32 at a time through a 2 x 2 block of
// 16 x 16 fp32 accumulator tiles per 32-column weight tile.
//
// The packed weight needs no second layout: TDPBF16PS's B operand is K/2 rows of N column pairs
// (feature 2p, 2p + 1 of each column side by side), which is what a packed tile's row p holds
// for its 32 columns. So B tile j (columns 16j .. 16j + 15) of feature pairs 16s .. 16s + 15 is
// 16 rows of 64 bytes, 128 bytes apart, at pair 16s; A is 16 rows x 32 features of x read in
// place at x_stride. Features past the last whole 32 (k % 32) are added after the tiles with
// AVX512-BF16 (the kernel's own `accumulate`, in the tiles' order), then bias, residual and
// SiLU-and-mul run the micro-tile path's epilogue (store_tile) on the fp32 sums.
//
// Arithmetic: the Intel SDM's TDPBF16PS adds a pair's products even feature first, VDPBF16PS
// odd feature first (both round after each add; Zen 4's VDPBF16PS matches its pseudo-code bit
// for bit). So a row's result on AMX need not equal the AVX512 path's; each row's does not
// depend on how many rows share a call (rows are independent in a tile, the blocks' rows are
// only configured shorter), so a call that always takes AMX (amx_from_rows = 1) stays
// batch-invariant. A row threshold does where the rows below it sum in the tiles' order
// (LinearArgs::tile_order: a pair's even feature first, on AVX512-BF16; bit for bit the
// emulation) and the CPU's tiles do what the SDM says (core/models/linear/dispatch.py checks on
// the hardware). The features past the last whole 32 run in that order too, so a tile product
// is the SDM's order throughout.
//
// Tiles are a policy: HardwareTiles issues the instructions; SoftwareTiles does what the SDM's
// pseudo-code says in plain C++, so the blocking, the tails and the epilogue run and are tested
// on CPUs without AMX (linear_amx_emulation()).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "cpu/arch.hpp"
#include "linear/driver.hpp"
#include "pagedserve/cpu_features.hpp"

namespace pagedserve::linear_detail {

// LDTILECFG's 64-byte operand, palette 1: per register, bytes per row and rows (0: unused).
struct alignas(64) TileConfig {
    std::uint8_t palette = 1;
    std::uint8_t start_row = 0;
    std::uint8_t reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

inline constexpr std::int64_t kTileRows = 16;      // rows of an A or C tile
inline constexpr std::int64_t kTileBytes = 64;     // bytes of a tile row
inline constexpr std::int64_t kTileCols = 16;      // columns of a B or C tile (32-bit elements)
inline constexpr std::int64_t kTilePairs = 16;     // feature pairs per A / B tile (32 features)
inline constexpr std::int64_t kBlockRows = 2 * kTileRows;

inline std::atomic<std::int64_t> amx_items_run{0};  // see linear_amx_items()
inline std::atomic<bool> amx_emulated{false};          // see linear_amx_emulation()

// Whether a call may run on tiles: emulated, or the CPU's (with AMX-INT8 for int8 products) once
// Linux granted this process tile data. The caller checks AVX512-BF16 (and VNNI) itself.
inline bool amx_usable(bool int8) {
    if (amx_emulated.load(std::memory_order_relaxed)) return true;
    const CpuFeatures& f = cpu_features();
    return cpu_isa_at_least(CpuIsa::kAmx) && f.amx_tile && f.amx_permitted &&
           (int8 ? f.amx_int8 : f.amx_bf16);
}

// The tiles, their emulation and the items on them (AMX instructions, the AVX-512 epilogue)
// exist only on x86; elsewhere amx_usable() answers the entry points and no call takes tiles.
#if PAGEDSERVE_X86

// Registers: C[i][j] = 2i + j accumulates rows 16i.. x columns 16j..; A[i] = 4 + i; B[j] = 6 + j.
inline constexpr int kA0 = 4, kB0 = 6;

// A block of `rows` (1 .. 32) rows: its A and C tiles hold min(rows, 16) and rows - 16 rows.
inline TileConfig block_config(std::int64_t rows) {
    TileConfig c;
    const std::int64_t top = std::min(rows, kTileRows), bottom = rows - top;
    for (int j = 0; j < 2; ++j) {
        c.colsb[j] = c.colsb[kA0] = c.colsb[kB0 + j] = kTileBytes;
        c.rows[j] = c.rows[kA0] = static_cast<std::uint8_t>(top);
        c.rows[kB0 + j] = kTilePairs;
        if (bottom > 0) {
            c.colsb[2 + j] = c.colsb[kA0 + 1] = kTileBytes;
            c.rows[2 + j] = c.rows[kA0 + 1] = static_cast<std::uint8_t>(bottom);
        }
    }
    return c;
}

// The AMX instructions (Linux must have granted this process tile data: cpu_features()):
// TDPBF16PS for the bf16 kernel, TDPBSUD for the quantized one (linear_quant/amx.hpp).
// Inline assembly rather than the intrinsics: GCC 12's take the register as a macro token, not
// a template argument.
struct HardwareTiles {
    void configure(const TileConfig& c) { asm volatile("ldtilecfg %0" ::"m"(c)); }
    template <int T>
    void load(const void* p, std::int64_t stride) {
        asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(p), "r"(stride), "i"(T) : "memory");
    }
    template <int T>
    void store(void* p, std::int64_t stride) {
        asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(p), "r"(stride), "i"(T) : "memory");
    }
    template <int T>
    void zero() {
        asm volatile("tilezero %%tmm%c0" ::"i"(T));
    }
    template <int C, int A, int B>  // C += A B, bf16 pairs into fp32
    void dot() {
        asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
    }
    template <int C, int A, int B>  // C += A B, signed A bytes x unsigned B bytes into int32
    void dot_int8() {
        asm volatile("tdpbsud %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
    }
    void release() { asm volatile("tilerelease" ::); }
};

// The same instructions in plain C++, after the SDM's pseudo-code: loads zero what the
// configuration leaves out, products are fp32 with bf16 inputs' denormals read as zero, each
// add rounds to nearest even and flushes a denormal sum to zero; int8 products sum in int32.
class SoftwareTiles {
public:
    void configure(const TileConfig& c) {
        config_ = c;
        std::memset(tiles_, 0, sizeof(tiles_));
    }
    template <int T>
    void load(const void* p, std::int64_t stride) {
        std::memset(tiles_[T], 0, sizeof(tiles_[T]));
        for (int r = 0; r < config_.rows[T]; ++r)
            std::memcpy(tiles_[T][r], static_cast<const char*>(p) + r * stride, config_.colsb[T]);
    }
    template <int T>
    void store(void* p, std::int64_t stride) const {
        for (int r = 0; r < config_.rows[T]; ++r)
            std::memcpy(static_cast<char*>(p) + r * stride, tiles_[T][r], config_.colsb[T]);
    }
    template <int T>
    void zero() {
        std::memset(tiles_[T], 0, sizeof(tiles_[T]));
    }
    template <int C, int A, int B>
    void dot() {
        for (int m = 0; m < config_.rows[C]; ++m) {
            for (int k = 0; k < config_.colsb[A] / 4; ++k) {
                for (int n = 0; n < config_.colsb[C] / 4; ++n) {
                    float c = fp32(tiles_[C][m], n);
                    c = ftz(c + bf16(tiles_[A][m], 2 * k) * bf16(tiles_[B][k], 2 * n));
                    c = ftz(c + bf16(tiles_[A][m], 2 * k + 1) * bf16(tiles_[B][k], 2 * n + 1));
                    std::memcpy(tiles_[C][m] + 4 * n, &c, sizeof(c));
                }
            }
        }
    }
    template <int C, int A, int B>
    void dot_int8() {
        for (int m = 0; m < config_.rows[C]; ++m) {
            for (int k = 0; k < config_.colsb[A] / 4; ++k) {
                for (int n = 0; n < config_.colsb[C] / 4; ++n) {
                    std::int32_t c;
                    std::memcpy(&c, tiles_[C][m] + 4 * n, sizeof(c));
                    for (int j = 0; j < 4; ++j) {  // int32 sums wrap (they never reach 2^31)
                        const auto a = static_cast<std::int8_t>(tiles_[A][m][4 * k + j]);
                        c = static_cast<std::int32_t>(static_cast<std::uint32_t>(c) +
                                                      static_cast<std::uint32_t>(a * tiles_[B][k][4 * n + j]));
                    }
                    std::memcpy(tiles_[C][m] + 4 * n, &c, sizeof(c));
                }
            }
        }
    }
    void release() {}

private:
    static float fp32(const std::uint8_t* row, int i) {
        float v;
        std::memcpy(&v, row + 4 * i, sizeof(v));
        return v;
    }
    static float bf16(const std::uint8_t* row, int i) {
        std::uint16_t b;
        std::memcpy(&b, row + 2 * i, sizeof(b));
        if ((b & 0x7f80u) == 0) b &= 0x8000u;  // denormal in: zero
        const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
        float v;
        std::memcpy(&v, &bits, sizeof(v));
        return v;
    }
    static float ftz(float v) {
        std::uint32_t bits;
        std::memcpy(&bits, &v, sizeof(bits));
        if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;  // denormal out: zero
        std::memcpy(&v, &bits, sizeof(v));
        return v;
    }

    TileConfig config_;
    alignas(64) std::uint8_t tiles_[8][kTileRows][kTileBytes];
};

// Runs an item (rows x tiles [tile0, tile_end)) in blocks of up to kBlockRows rows across its
// tiles: `config(rows)` configures the tiles when the block height changes, then
// Item::block<halves>(tiles, args, row0, rows, tile, prefetch) computes one block x tile with
// one A tile (up to 16 rows) or two. The next panel is prefetched a part per block, as the
// micro-tiles do.
template <typename K, typename Tiles, typename Item, typename Config>
void run_blocks(const typename K::Args& a, std::int64_t row0, std::int64_t rows,
                std::int64_t tile0, std::int64_t tile_end, std::int64_t next0,
                std::int64_t next_end, Config config) {
    Tiles tiles;
    const std::int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
    const PanelPrefetch prefetch =
        panel_prefetch<K>(a, next0, next_end, blocks * (tile_end - tile0));
    std::int64_t part = 0, configured = 0;
    for (std::int64_t r = row0; r < row0 + rows; r += kBlockRows) {
        const std::int64_t block_rows = std::min(kBlockRows, row0 + rows - r);
        if (block_rows != configured) tiles.configure(config(configured = block_rows));
        for (std::int64_t t = tile0; t < tile_end; ++t) {
            if (block_rows > kTileRows)
                Item::template block<2>(tiles, a, r, block_rows, t, prefetch.part(part++));
            else
                Item::template block<1>(tiles, a, r, block_rows, t, prefetch.part(part++));
        }
    }
    tiles.release();
    amx_items_run.fetch_add(1, std::memory_order_relaxed);
}

// Nothing to add to a block's sums before the epilogue (see store_block).
struct NothingMore {
    template <int R>
    PAGEDSERVE_LINEAR_TARGET void add(__m512 (&)[R][2], std::int64_t) const {}
};

// The driver's epilogue (bias, residual, SiLU-and-mul, rounding into out) on a block's fp32
// sums, 8 rows at a time, after more.add<R>(acc, first row) adds what the tiles left out.
template <typename K, int R, typename More>
PAGEDSERVE_LINEAR_TARGET void store_rows(const typename K::Args& a, std::int64_t row0,
                                         std::int64_t r, std::int64_t t,
                                         const float (&sums)[kBlockRows][kLinearTileN],
                                         const More& more) {
    __m512 acc[R][2];
    for (int i = 0; i < R; ++i) {
        acc[i][0] = _mm512_load_ps(&sums[r + i][0]);
        acc[i][1] = _mm512_load_ps(&sums[r + i][kTileCols]);
    }
    more.template add<R>(acc, r);
    store_tile<K, R>(a, row0 + r, t, acc);
}

template <typename K, typename More>
void store_block(const typename K::Args& a, std::int64_t row0, std::int64_t rows, std::int64_t t,
                 const float (&sums)[kBlockRows][kLinearTileN], const More& more) {
    std::int64_t r = 0;
    for (; r + kRows <= rows; r += kRows) store_rows<K, kRows>(a, row0, r, t, sums, more);
    with_rows(rows - r, [&](auto count) {
        store_rows<K, decltype(count)::value>(a, row0, r, t, sums, more);
    });
}

// The driver's Item (see MicroTiles) for kernel K (linear/avx512_bf16.cpp's Bf16Kernel) on Tiles.
template <typename K, typename Tiles>
struct AmxItems {
    using Args = typename K::Args;

    static void run(const Args& a, std::int64_t row0, std::int64_t rows, std::int64_t tile0,
                    std::int64_t tile_end, std::int64_t next0, std::int64_t next_end) {
        run_blocks<K, Tiles, AmxItems>(a, row0, rows, tile0, tile_end, next0, next_end,
                                       block_config);
    }

    // Rows [row0, row0 + rows) x weight tile t, with `halves` A tiles (rows > 16: 2).
    template <int halves>
    static void block(Tiles& tiles, const Args& a, std::int64_t row0, std::int64_t rows,
                      std::int64_t t, Prefetch prefetch) {
        const auto* w = tile_weights<K>(a, t);
        const std::int64_t steps = a.k / (2 * kTilePairs);  // whole 32-feature steps
        constexpr std::int64_t pair_bytes = 2 * kLinearTileN * sizeof(*w);
        const std::int64_t x_bytes = a.x_stride * static_cast<std::int64_t>(sizeof(*a.x));
        tiles.template zero<0>();
        tiles.template zero<1>();
        if constexpr (halves == 2) {
            tiles.template zero<2>();
            tiles.template zero<3>();
        }
        for (std::int64_t s = 0; s < steps; ++s) {
            const std::int64_t first = prefetch.lines * s / steps;
            const std::int64_t last = prefetch.lines * (s + 1) / steps;
            for (std::int64_t line = first; line < last; ++line)
                _mm_prefetch(prefetch.begin + 64 * line, _MM_HINT_T1);
            const auto* b = w + s * kTilePairs * 2 * kLinearTileN;
            const auto* x = a.x + row0 * a.x_stride + s * 2 * kTilePairs;
            tiles.template load<kB0>(b, pair_bytes);
            tiles.template load<kB0 + 1>(b + 2 * kTileCols, pair_bytes);
            tiles.template load<kA0>(x, x_bytes);
            tiles.template dot<0, kA0, kB0>();
            tiles.template dot<1, kA0, kB0 + 1>();
            if constexpr (halves == 2) {
                tiles.template load<kA0 + 1>(x + kTileRows * a.x_stride, x_bytes);
                tiles.template dot<2, kA0 + 1, kB0>();
                tiles.template dot<3, kA0 + 1, kB0 + 1>();
            }
        }
        alignas(64) float sums[kBlockRows][kLinearTileN];
        constexpr std::int64_t row_bytes = sizeof(sums[0]);
        tiles.template store<0>(&sums[0][0], row_bytes);
        tiles.template store<1>(&sums[0][kTileCols], row_bytes);
        if constexpr (halves == 2) {
            tiles.template store<2>(&sums[kTileRows][0], row_bytes);
            tiles.template store<3>(&sums[kTileRows][kTileCols], row_bytes);
        }
        store_block<K>(a, row0, rows, t, sums, TailPairs{a, row0, t, steps * kTilePairs});
    }

private:
    // The feature pairs from `first` on (past the last whole 32), in the tiles' order on
    // AVX512-BF16.
    struct TailPairs {
        const Args& a;
        std::int64_t row0, tile, first;

        template <int R>
        PAGEDSERVE_LINEAR_TARGET void add(__m512 (&acc)[R][2], std::int64_t r) const {
            K::template accumulate<R, true>(a, row0 + r, tile_weights<K>(a, tile), first,
                                            Prefetch{}, acc);
        }
    };
};
#endif  // PAGEDSERVE_X86

}  // namespace pagedserve::linear_detail
