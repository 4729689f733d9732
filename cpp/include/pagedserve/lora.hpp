// The grouped (segmented) low-rank product of LoRA adapters on the CPU: for one projection, each
// token row that runs an adapter adds x A_slot^T B_slot^T (the scaling folded into B) to the
// projection's output; rows of the base model are skipped. Pointers, sizes and strides only.
//
// Batch-invariant: a row's delta is summed in a fixed order (the shrink over k in order, the
// expand over its slot's rank columns in order, one fp32 FMA each; std::fma in every copy), so
// it does not depend on the other rows of the step, their adapters, the thread count or the ISA
// level (every level gives the same bits). The rows of one slot are taken in blocks, wherever they sit
// in the step, so a slot's weights are read once per block rather than once per request.
// pagedserve/core/lora/native.py and the decoder stack (decoder_stack.hpp) are the callers.
#pragma once

#include <cstdint>

#include "pagedserve/paged_attention.hpp"  // DType

namespace pagedserve {

inline constexpr int kLoraMaxParts = 4;

// One projection's adapter stacks, one slot per loaded adapter, as core/lora/weights.py's
// LoraWeights holds them: a [num_slots, k, num_parts * max_rank], b [num_slots, num_parts *
// max_rank, n], both contiguous in `dtype` (float32 or bfloat16). Part p (q, k, v of a fused qkv;
// gate, up) owns columns [p max_rank, (p + 1) max_rank) of a and the output columns
// [sum(part_widths[:p]), + part_widths[p]) of b; b is zero elsewhere, and those zeros are
// skipped. A slot's adapter fills the first ranks[slot] columns of each part (the rest are
// zeros, skipped too): its chains run over those columns only, so a rank-8 adapter costs the
// same in a stack of max_rank 16 or 64.
struct LoraStacks {
    const void* a = nullptr;
    const void* b = nullptr;
    const std::int32_t* ranks = nullptr;  // [num_slots], each 0 .. max_rank; null: max_rank each
    std::int64_t num_slots = 0;
    std::int64_t k = 0;
    std::int64_t max_rank = 0;
    int num_parts = 0;
    std::int64_t part_widths[kLoraMaxParts] = {};  // their sum is n
    DType dtype = DType::kFloat32;

    std::int64_t n() const;
    std::int64_t columns() const { return num_parts * max_rank; }
    std::int64_t rank(std::int64_t slot) const { return ranks ? ranks[slot] : max_rank; }
};

// A step's token rows by adapter: segment i covers rows [starts[i], starts[i + 1]) and runs
// slots[i] (-1: the base model, skipped). starts[0] = 0, starts[num_segments] = the step's rows.
struct LoraSegments {
    const std::int64_t* starts = nullptr;  // [num_segments + 1]
    const std::int32_t* slots = nullptr;   // [num_segments]
    std::int64_t num_segments = 0;
};

// y[r, :] += (x[r, :] a[s]) b[s] for every row r of a segment with slot s >= 0.
struct LoraArgs {
    const void* x = nullptr;  // [m, k] rows, x_stride elements apart, in x_dtype
    std::int64_t x_stride = 0;
    DType x_dtype = DType::kFloat32;
    void* y = nullptr;  // [m, n] rows, y_stride apart, in y_dtype: added to (widened, rounded once)
    std::int64_t y_stride = 0;
    DType y_dtype = DType::kFloat32;
    LoraStacks stacks;
    LoraSegments segments;
};

// Throws std::invalid_argument on bad sizes, dtypes, segments or slots (before writing).
void lora_add_cpu(const LoraArgs& args, int num_threads);

// The level whose copy lora_add_cpu runs ("portable", "avx2", "avx512"), for tests.
const char* lora_path();

}  // namespace pagedserve
