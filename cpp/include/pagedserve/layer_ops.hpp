// Fused per-token CPU ops of a Llama layer: RMSNorm (optionally with the residual add), rotary
// position embedding and SiLU-and-mul. Pointers, sizes and strides only: no torch anywhere.
//
// Every op computes in fp32 and rounds once to the storage dtype (float32 or bfloat16; every
// tensor an op touches shares it). Rows are contiguous; `*_stride` arguments are element strides
// between rows (tokens). pagedserve/core/ops/layer_ops.py is the only caller.
#pragma once

#include <cstdint>

#include "pagedserve/paged_attention.hpp"  // DType

namespace pagedserve {

// A [num_rows, row_stride] view: row r starts at data + r * row_stride elements.
struct RowView {
    void* data = nullptr;
    std::int64_t row_stride = 0;
};

// out = x / sqrt(mean(x^2) + eps) * weight over rows of `hidden_size`. `sum_lanes` is the
// vector width (8 or 16) whose summation order the mean reproduces: torch's CPU sum uses its
// own vector width, and float32 results match torch bit for bit only with the same order.
struct RmsNormArgs {
    RowView out;
    RowView x;
    const void* weight = nullptr;  // [hidden_size], contiguous
    std::int64_t num_rows = 0;
    std::int64_t hidden_size = 0;
    float eps = 0.0f;
    DType dtype = DType::kFloat32;
    int sum_lanes = 8;
};
void rms_norm_cpu(const RmsNormArgs& args, int num_threads);

// In place, HF rotate-half form over qk [num_tokens, num_heads, head_size]:
// qk = qk * cos + roll(qk, head_size / 2) * signed_sin, with cos and signed_sin one
// [head_size] row per token (signed_sin = [-sin, sin]).
struct RotaryArgs {
    void* qk = nullptr;
    std::int64_t token_stride = 0;
    std::int64_t head_stride = 0;
    RowView cos;
    RowView signed_sin;
    std::int64_t num_tokens = 0;
    std::int64_t num_heads = 0;
    std::int64_t head_size = 0;  // even
    DType dtype = DType::kFloat32;
};
void rotary_cpu(const RotaryArgs& args, int num_threads);

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, intermediate_size + i]; torch_lanes: the floats
// of torch's CPU vectors (16 where it runs its AVX512 kernels, 8 with AVX2), whose loop bounds
// the float32 results follow bit for bit.
void silu_and_mul_cpu(RowView out, RowView gate_up, std::int64_t num_rows,
                      std::int64_t intermediate_size, DType dtype, int torch_lanes,
                      int num_threads);

}  // namespace pagedserve
