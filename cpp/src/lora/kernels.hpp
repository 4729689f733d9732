// The LoRA product's loops (lora.hpp has the contract), included once per ISA level by that
// level's file (portable.cpp, avx2.cpp, avx512.cpp), each time in its own namespace
// (PAGEDSERVE_ISA_NS) under its own target (PAGEDSERVE_ISA_TARGET; undefined: portable), with
// that level's vector width in floats (PAGEDSERVE_LORA_LANES). Plain loops over fixed-size tiles
// that the compiler keeps in registers and vectorizes over the columns (`omp simd`); each output
// lane is one std::fma chain in a fixed order, so every level gives the same bits. The headers
// come before the target pragma (see attention/kernels.hpp).
//
// A block (up to kBlockRows rows of one slot): the rows widened to fp32 (and a bf16 slot's a and
// b); the shrink low[r, c] = sum_k x[r, k] a[k, c], k in order, over each part's first
// rank(slot) columns (all parts in one pass over k); then per part the expand acc[r, j] =
// sum_c low[r, c] b[c, j], c in order over the same columns; y += acc, rounded once to y's
// dtype. Both run in register tiles of up to kTileRows rows by a few vectors of columns: the
// accumulators stay in registers for the whole chain, and each loaded row of a or b serves
// every row of the tile.
#pragma once

#pragma GCC optimize("fp-contract=off")  // only the explicit std::fma below fuse

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/arch.hpp"
#include "lora/levels.hpp"
#include "pagedserve/lora.hpp"
#include "pagedserve/rows.hpp"

#ifdef PAGEDSERVE_ISA_TARGET
#pragma GCC push_options
PAGEDSERVE_TARGET_PRAGMA(PAGEDSERVE_ISA_TARGET)
#endif

namespace pagedserve::PAGEDSERVE_ISA_NS {
namespace {

using lora::Block;
using lora::kBlockRows;

constexpr int kLanes = PAGEDSERVE_LORA_LANES;  // floats in one of this level's vectors
constexpr int kTileRows = 4;                    // rows of a register tile
constexpr int kShrinkColumns = 2 * kLanes;      // a shrink tile: 4 rows x 2 vectors
constexpr int kExpandColumns = 2 * kLanes;      // an expand tile: 4 rows x 2 vectors
// Multiply-adds of a call below which one thread runs it (~13 us of work here): waking the others
// costs more. The linears' threshold (linear/driver.hpp).
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 18;

// `n` elements of a `dtype` row at p (+ offset elements) as fp32 into dst.
void widen(const void* p, std::int64_t offset, DType dtype, float* dst, std::int64_t n) {
    if (dtype == DType::kFloat32) {
        load_row(static_cast<const float*>(p) + offset, dst, n);
    } else {
        load_row(static_cast<const Bf16*>(p) + offset, dst, n);
    }
}

// One thread's fp32 rows: x [kBlockRows, k], low [kBlockRows, columns], a bf16 slot's a [k,
// columns] and b [columns, n] widened (fp32 stacks are read in place), and a tile's y rows. Kept
// per thread across calls (grown, never shrunk): a step calls the kernel for every projection.
struct Scratch {
    std::vector<float> x, low, a, b, y;
    void fit(const LoraStacks& s) {
        const auto room = [](std::vector<float>& v, std::int64_t n) {
            if (static_cast<std::int64_t>(v.size()) < n) v.resize(n);
        };
        room(x, kBlockRows * s.k), room(low, kBlockRows * s.columns());
        if (s.dtype != DType::kFloat32) room(a, s.k * s.columns()), room(b, s.columns() * s.n());
        room(y, kExpandColumns);
    }
};

// acc[r][p][(0, W)] += sum_i lhs[r lhs_stride + i] rhs[i rhs_stride + p part_stride + .], i in
// [0, len), for R rows and P column groups part_stride apart (the callers start acc at zero): W
// fp32 chains per row and group over i in order, in registers. The shrink (x, a; a group per
// part) and the expand (low, b; one group) are both this.
template <int R, int P, int W>
void tile_product(const float* lhs, std::int64_t lhs_stride, const float* rhs,
                  std::int64_t rhs_stride, std::int64_t part_stride, std::int64_t len,
                  float (&acc)[R][P][W]) {
    for (std::int64_t i = 0; i < len; ++i) {
        const float* row = rhs + i * rhs_stride;
        for (int r = 0; r < R; ++r) {
            const float v = lhs[r * lhs_stride + i];
            for (int p = 0; p < P; ++p) {
                const float* group = row + p * part_stride;
#pragma omp simd
                for (int c = 0; c < W; ++c) acc[r][p][c] = std::fma(v, group[c], acc[r][p][c]);
            }
        }
    }
}

// The widest shrink tile for P column groups: about two vectors of accumulators per row.
template <int P>
constexpr int shrink_width() {
    return P == 1 ? kShrinkColumns : P == 2 ? kLanes : std::max(1, kLanes / 2);
}

// low[r, p part_stride + c + (0, W)] = sum_i x[r, i] a[i, p part_stride + c + .] for R rows and
// the P parts, over columns [c, width) of each part (a and low rows `cols` apart): tiles W wide
// while they fit, then narrower.
template <int R, int P, int W = shrink_width<P>()>
void shrink_rows(const float* x, std::int64_t k, const float* a, std::int64_t cols,
                 std::int64_t part_stride, float* low, std::int64_t width, std::int64_t c = 0) {
    for (; c + W <= width; c += W) {
        float acc[R][P][W] = {};
        tile_product<R, P, W>(x, k, a + c, cols, part_stride, k, acc);
        for (int r = 0; r < R; ++r) {
            for (int p = 0; p < P; ++p) {
                std::copy(acc[r][p], acc[r][p] + W, low + r * cols + p * part_stride + c);
            }
        }
    }
    if constexpr (W > 1) shrink_rows<R, P, W / 2>(x, k, a, cols, part_stride, low, width, c);
}

// shrink_rows with P known only at run time (1 .. kLoraMaxParts).
template <int R>
void shrink_parts(int parts, const float* x, std::int64_t k, const float* a, std::int64_t cols,
                  std::int64_t part_stride, float* low, std::int64_t width) {
    static_assert(kLoraMaxParts == 4);
    switch (parts) {
        case 1: return shrink_rows<R, 1>(x, k, a, cols, part_stride, low, width);
        case 2: return shrink_rows<R, 2>(x, k, a, cols, part_stride, low, width);
        case 3: return shrink_rows<R, 3>(x, k, a, cols, part_stride, low, width);
        default: return shrink_rows<R, 4>(x, k, a, cols, part_stride, low, width);
    }
}

// dst[0, W) += acc[0, W), rounded once to dtype.
template <int W>
void accumulate(void* y, std::int64_t offset, DType dtype, const float* acc, float* tmp) {
    if (dtype == DType::kFloat32) {
        float* out = static_cast<float*>(y) + offset;
#pragma omp simd
        for (int j = 0; j < W; ++j) out[j] += acc[j];
        return;
    }
    Bf16* out = static_cast<Bf16*>(y) + offset;
    load_row(out, tmp, W);
#pragma omp simd
    for (int j = 0; j < W; ++j) tmp[j] += acc[j];
    store_row(tmp, out, W);
}

// One part's expand for R rows: y[rows[r], j + (0, W)] += sum_c low[r, c] b[c, j + .] over the
// part's `rank` columns (low and b start at its first), over output columns [j, end): tiles W
// wide while they fit, then narrower.
template <int R, int W = kExpandColumns>
void expand_rows(const LoraArgs& a, const std::int64_t* rows, const float* low, std::int64_t cols,
                 const float* b, std::int64_t n, std::int64_t rank, std::int64_t j,
                 std::int64_t end, float* tmp) {
    for (; j + W <= end; j += W) {
        float acc[R][1][W] = {};
        tile_product<R, 1, W>(low, cols, b + j, n, 0, rank, acc);
        for (int r = 0; r < R; ++r) {
            accumulate<W>(a.y, rows[r] * a.y_stride + j, a.y_dtype, acc[r][0], tmp);
        }
    }
    if constexpr (W > 1) expand_rows<R, W / 2>(a, rows, low, cols, b, n, rank, j, end, tmp);
}

// f(R, first row) over a block's rows in tiles of kTileRows, then 2, then 1.
template <typename F>
void over_row_tiles(int num_rows, F f) {
    int r = 0;
    for (; r + kTileRows <= num_rows; r += kTileRows) {
        f(std::integral_constant<int, kTileRows>{}, r);
    }
    if (r + 2 <= num_rows) f(std::integral_constant<int, 2>{}, r), r += 2;
    if (r < num_rows) f(std::integral_constant<int, 1>{}, r);
}

void add_block(const LoraArgs& a, const Block& block, Scratch& t) {
    const LoraStacks& s = a.stacks;
    const std::int64_t k = s.k, cols = s.columns(), n = s.n();
    for (int r = 0; r < block.num_rows; ++r) {
        widen(a.x, block.rows[r] * a.x_stride, a.x_dtype, t.x.data() + r * k, k);
    }
    const std::int64_t rank = s.rank(block.slot);  // the columns of each part the slot fills
    const float* as = t.a.data();
    const float* bs = t.b.data();
    if (s.dtype == DType::kFloat32) {  // read in place
        as = static_cast<const float*>(s.a) + block.slot * k * cols;
        bs = static_cast<const float*>(s.b) + block.slot * cols * n;
    } else {  // the slot's a, and b's blocks of each part, widened
        widen(s.a, block.slot * k * cols, s.dtype, t.a.data(), k * cols);
        std::int64_t j0 = 0;
        for (int p = 0; p < s.num_parts; ++p) {
            for (std::int64_t c = p * s.max_rank; c < p * s.max_rank + rank; ++c) {
                widen(s.b, (block.slot * cols + c) * n + j0, s.dtype, t.b.data() + c * n + j0,
                      s.part_widths[p]);
            }
            j0 += s.part_widths[p];
        }
    }
    // The shrink: every part in one pass over k (a full slot's columns are one contiguous run).
    const bool full = rank == s.max_rank;
    over_row_tiles(block.num_rows, [&](auto rows, int r0) {
        shrink_parts<decltype(rows)::value>(full ? 1 : s.num_parts, t.x.data() + r0 * k, k, as,
                                            cols, s.max_rank, t.low.data() + r0 * cols,
                                            full ? cols : rank);
    });
    std::int64_t j0 = 0;
    for (int p = 0; p < s.num_parts; ++p) {
        const std::int64_t c0 = p * s.max_rank;
        over_row_tiles(block.num_rows, [&](auto rows, int r0) {
            expand_rows<decltype(rows)::value>(a, block.rows + r0, t.low.data() + r0 * cols + c0,
                                               cols, bs + c0 * n, n, rank, j0,
                                               j0 + s.part_widths[p], t.y.data());
        });
        j0 += s.part_widths[p];
    }
}

}  // namespace

void add_blocks(const LoraArgs& args, const std::vector<Block>& blocks, int num_threads) {
    const LoraStacks& s = args.stacks;
    std::int64_t work = 0;  // multiply-adds
    for (const Block& b : blocks) work += b.num_rows * s.rank(b.slot) * (s.num_parts * s.k + s.n());
    const bool parallel = num_threads > 1 && work >= kMinParallelWork && blocks.size() > 1;
    const std::int64_t num_blocks = static_cast<std::int64_t>(blocks.size());
#pragma omp parallel num_threads(num_threads) if (parallel)
    {
        thread_local Scratch scratch;
        scratch.fit(s);
#pragma omp for schedule(static)
        for (std::int64_t i = 0; i < num_blocks; ++i) add_block(args, blocks[i], scratch);
    }
}

}  // namespace pagedserve::PAGEDSERVE_ISA_NS

#ifdef PAGEDSERVE_ISA_TARGET
#pragma GCC pop_options
#endif
#undef PAGEDSERVE_ISA_NS
#undef PAGEDSERVE_ISA_TARGET
#undef PAGEDSERVE_LORA_LANES
