// The LoRA product's loops (lora.hpp has the contract), included once per ISA level by that
// level's file (portable.cpp, avx2.cpp, avx512.cpp), each time in its own namespace
// (PAGEDSERVE_ISA_NS) under its own target (PAGEDSERVE_ISA_TARGET; undefined: portable). Plain
// loops the compiler vectorizes over the output lanes (`omp simd`), each lane one std::fma chain
// in a fixed order, so every level gives the same bits; the headers come before the target
// pragma (see attention/kernels.hpp).
//
// A block (up to kBlockRows rows of one slot): the rows widened to fp32; the shrink low[r, c] =
// sum_k x[r, k] a[k, c], k in order; then per part, in column blocks of kColumns, the expand
// acc[r, j] = sum_c low[r, c] b[c, j], c in order over the part's max_rank columns; y += acc,
// rounded once to y's dtype.
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

constexpr std::int64_t kColumns = 128;  // output columns of one expand pass (acc stays in L1)
// Multiply-adds of a call below which one thread runs it: waking the others costs more.
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 20;

// `n` elements of a `dtype` row at p (+ offset elements) as fp32 into dst.
void widen(const void* p, std::int64_t offset, DType dtype, float* dst, std::int64_t n) {
    if (dtype == DType::kFloat32) {
        load_row(static_cast<const float*>(p) + offset, dst, n);
    } else {
        load_row(static_cast<const Bf16*>(p) + offset, dst, n);
    }
}

// dst[0, n) += acc[0, n), rounded once to dtype.
void accumulate(void* y, std::int64_t offset, DType dtype, const float* acc, float* tmp,
                std::int64_t n) {
    if (dtype == DType::kFloat32) {
        float* out = static_cast<float*>(y) + offset;
#pragma omp simd
        for (std::int64_t j = 0; j < n; ++j) out[j] += acc[j];
        return;
    }
    Bf16* out = static_cast<Bf16*>(y) + offset;
    load_row(out, tmp, n);
#pragma omp simd
    for (std::int64_t j = 0; j < n; ++j) tmp[j] += acc[j];
    store_row(tmp, out, n);
}

// One thread's fp32 rows: x [kBlockRows, k], low [kBlockRows, columns], a row of a or b, acc
// [kBlockRows, kColumns], and a row of y.
struct Scratch {
    std::vector<float> x, low, weight, acc, y;
    explicit Scratch(const LoraStacks& s)
        : x(kBlockRows * s.k), low(kBlockRows * s.columns()),
          weight(std::max(s.columns(), kColumns)), acc(kBlockRows * kColumns), y(kColumns) {}
};

// low[r, :] = x[r, :] a[slot] over the block's rows.
void shrink(const LoraStacks& s, std::int32_t slot, int rows, Scratch& t) {
    const std::int64_t k = s.k, cols = s.columns();
    std::fill(t.low.begin(), t.low.end(), 0.0f);
    float* arow = t.weight.data();
    for (std::int64_t i = 0; i < k; ++i) {
        widen(s.a, (slot * k + i) * cols, s.dtype, arow, cols);
        for (int r = 0; r < rows; ++r) {
            const float xv = t.x[r * k + i];
            float* low = t.low.data() + r * cols;
#pragma omp simd
            for (std::int64_t c = 0; c < cols; ++c) low[c] = std::fma(xv, arow[c], low[c]);
        }
    }
}

// y[row, j0 + (0, width)] += low[r, c0 + (0, max_rank)] b[slot][c0 + ., j0 + .] for each row.
void expand_part(const LoraArgs& a, const Block& block, std::int64_t c0, std::int64_t j0,
                 std::int64_t width, Scratch& t) {
    const LoraStacks& s = a.stacks;
    const std::int64_t n = s.n(), cols = s.columns();
    float* brow = t.weight.data();
    for (std::int64_t jb = 0; jb < width; jb += kColumns) {
        const std::int64_t w = std::min(kColumns, width - jb);
        std::fill(t.acc.begin(), t.acc.end(), 0.0f);
        for (std::int64_t c = c0; c < c0 + s.max_rank; ++c) {
            widen(s.b, (block.slot * cols + c) * n + j0 + jb, s.dtype, brow, w);
            for (int r = 0; r < block.num_rows; ++r) {
                const float lv = t.low[r * cols + c];
                float* acc = t.acc.data() + r * kColumns;
#pragma omp simd
                for (std::int64_t j = 0; j < w; ++j) acc[j] = std::fma(lv, brow[j], acc[j]);
            }
        }
        for (int r = 0; r < block.num_rows; ++r) {
            accumulate(a.y, block.rows[r] * a.y_stride + j0 + jb, a.y_dtype,
                       t.acc.data() + r * kColumns, t.y.data(), w);
        }
    }
}

void add_block(const LoraArgs& a, const Block& block, Scratch& t) {
    const LoraStacks& s = a.stacks;
    for (int r = 0; r < block.num_rows; ++r) {
        widen(a.x, block.rows[r] * a.x_stride, a.x_dtype, t.x.data() + r * s.k, s.k);
    }
    shrink(s, block.slot, block.num_rows, t);
    std::int64_t j0 = 0;
    for (int p = 0; p < s.num_parts; ++p) {
        expand_part(a, block, p * s.max_rank, j0, s.part_widths[p], t);
        j0 += s.part_widths[p];
    }
}

}  // namespace

void add_blocks(const LoraArgs& args, const std::vector<Block>& blocks, int num_threads) {
    const LoraStacks& s = args.stacks;
    std::int64_t rows = 0;
    for (const Block& b : blocks) rows += b.num_rows;
    const std::int64_t work = rows * s.max_rank * (s.num_parts * s.k + s.n());
    const bool parallel = num_threads > 1 && work >= kMinParallelWork && blocks.size() > 1;
    const std::int64_t num_blocks = static_cast<std::int64_t>(blocks.size());
#pragma omp parallel num_threads(num_threads) if (parallel)
    {
        Scratch scratch(s);
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
