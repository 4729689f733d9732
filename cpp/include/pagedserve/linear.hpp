// Dense bf16 products for the model's linear layers on the CPU: out = x W^T (+ bias)
// (+ residual), accumulated in fp32 and rounded once. The weight is packed once, at load time,
// into the operand order of AVX512-BF16's dot-product instruction, so the inner loop is one
// 64-byte load per 16 output columns and 2 input features; no libtorch, no oneDNN.
//
// Why our own: at the shapes of a small model's decode step (tens of rows, hidden 576) torch's
// bf16 matmul neither splits across threads well nor streams weights at memory speed for one row.
#pragma once

#include <cstdint>

namespace pagedserve {

// Packed weight layout: [ceil(n / 32)][ceil(k / 2)][32][2] bf16, zero-padded. Row (t, p) holds
// features 2p and 2p + 1 of output columns 32t .. 32t + 31, interleaved by pairs.
inline constexpr std::int64_t kLinearTileN = 32;

std::int64_t packed_linear_elements(std::int64_t n, std::int64_t k);

// weight: [n, k] bf16 row-major (torch's Linear layout); packed: packed_linear_elements(n, k).
void pack_linear_weight_bf16(const std::uint16_t* weight, std::int64_t n, std::int64_t k,
                             std::uint16_t* packed, int num_threads);

struct LinearArgs {
    const std::uint16_t* x = nullptr;  // [m, k] bf16, rows x_stride elements apart
    std::int64_t x_stride = 0;
    const std::uint16_t* packed = nullptr;  // pack_linear_weight_bf16 of the [n, k] weight
    const std::uint16_t* bias = nullptr;    // [n] bf16, or null
    const std::uint16_t* residual = nullptr;  // [m, n] bf16 added to the product, or null;
    std::int64_t residual_stride = 0;         // it may be `out` itself (in-place add)
    void* out = nullptr;                      // [m, n], rows out_stride elements apart
    std::int64_t out_stride = 0;
    bool out_float32 = false;  // fp32 output (logits), else bf16
    std::int64_t m = 0, n = 0, k = 0;
};

// True when this CPU has AVX512-BF16 (checked at run time; the kernel is compiled for it with a
// function target attribute whatever the build's -march).
bool linear_bf16_supported();

// Throws std::runtime_error if !linear_bf16_supported().
void linear_bf16(const LinearArgs& args, int num_threads);

}  // namespace pagedserve
