// Dense bf16 products for the model's linear layers on the CPU: out = x W^T (+ bias)
// (+ residual), or SwiGLU's silu(x W_gate^T) * (x W_up^T), accumulated in fp32 and rounded
// once. The weight is packed once, at load time, into the operand order of AVX512-BF16's
// dot-product instruction, so the inner loop is one 64-byte load per 16 output columns and 2
// input features (without AVX512-BF16, the same load, or a 32-byte one per 8 columns on AVX2,
// split into the two features' fp32 values by a shift and a mask); no libtorch, no oneDNN.
//
// Why our own: at the shapes of a small model's decode step (tens of rows, hidden 576) torch's
// bf16 matmul neither splits across threads well nor streams weights at memory speed for one row.
#pragma once

#include <cstdint>

namespace pagedserve {

// Packed weight layout: [ceil(n / 32)][ceil(k / 2)][32][2] bf16, zero-padded. Row (t, p) holds
// features 2p and 2p + 1 of output columns 32t .. 32t + 31, interleaved by pairs.
inline constexpr std::int64_t kLinearTileN = 32;

// Gated products (SwiGLU's gate and up projections in one): the [2 I, k] weight, gate rows
// first, is packed with its rows interleaved by kLinearGateCols, so that every tile holds 16
// gate columns and the 16 up columns they multiply: gate rows 16t .. 16t + 15, then up rows
// 16t .. 16t + 15, zero rows where I is not a multiple of 16. gated_rows(I) rows in all.
inline constexpr std::int64_t kLinearGateCols = kLinearTileN / 2;
inline constexpr std::int64_t gated_rows(std::int64_t width) {
    return 2 * ((width + kLinearGateCols - 1) / kLinearGateCols) * kLinearGateCols;
}

std::int64_t packed_linear_elements(std::int64_t n, std::int64_t k);

// weight: [n, k] bf16 row-major (torch's Linear layout); packed: packed_linear_elements(n, k).
void pack_linear_weight_bf16(const std::uint16_t* weight, std::int64_t n, std::int64_t k,
                             std::uint16_t* packed, int num_threads);

// weight: [2 width, k] bf16, gate rows then up rows; packed: packed_linear_elements(
// gated_rows(width), k), for linear_bf16 with gated_width = width.
void pack_gated_weight_bf16(const std::uint16_t* weight, std::int64_t width, std::int64_t k,
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
    // > 0: a gated product, out [m, gated_width] = silu(x W_gate^T) * (x W_up^T) from a weight
    // of n = gated_rows(gated_width) interleaved rows (see kLinearGateCols); no bias, residual.
    std::int64_t gated_width = 0;
    // A call of at least this many rows runs on AMX-BF16 tiles where linear_amx_supported()
    // (0: never; 1: every call). Tiles and AVX512-BF16 may round a row differently (see
    // linear/amx.hpp): only a threshold of 1 or 0 is batch-invariant by construction ...
    std::int64_t amx_from_rows = 0;
    // ... or, with tile_order, the calls below it sum in the order of the SDM's TDPBF16PS (a
    // pair's even feature first: two VDPBF16PS per pair, each with one feature of x): bit for
    // bit the tiles where the CPU's follow the SDM (the emulated ones do), at twice the dot
    // products of the plain path (bench/kernels/linear.py's 'order' column).
    bool tile_order = false;
};

// True where linear_bf16 and linear_f32 run: ISA level avx2 or above on x86-64 (cpu_features.hpp:
// checked at run time; each path is compiled for its ISA with function target attributes
// whatever the build's -march). Below it (portable, and every aarch64 level) the model's layers
// run torch. The paths (linear/kernels.hpp): AVX512-BF16 dot products (and AMX tiles) from level
// avx512_bf16; at avx512, bf16 widened to fp32 by shifts and fp32 FMAs in 16 lanes; at avx2 and
// avx2_vnni, the same in 8 lanes (the same bits as avx512's).
bool linear_bf16_supported();

// The path linear_bf16 / linear_f32 take at the active level: "avx512_bf16", "avx512", "avx2",
// or "none".
const char* linear_path();

// Throws std::runtime_error if !linear_bf16_supported().
void linear_bf16(const LinearArgs& args, int num_threads);

// True when linear_bf16 may take AMX-BF16 tiles: the CPU has them (with AVX512-BF16, which runs
// the features past the last whole 32 and the epilogue) and Linux granted this process tile
// data (cpu_features.hpp), or linear_amx_emulation is on.
bool linear_amx_supported();

// For tests and benchmarks: while on, the AMX path runs on tiles emulated in software after the
// Intel SDM's pseudo-code (slow; same blocking, tails and epilogue), on any CPU with AVX512-BF16.
void linear_amx_emulation(bool on);

// Work items linear_bf16 ran on AMX tiles (the hardware's or emulated) since the process
// started: for tests and benchmarks, as linear_items_taken_over().
std::int64_t linear_amx_items();

// Work items (a panel of tiles x a chunk of rows) that a thread ran from a peer's share since the
// process started, over every CPU linear kernel: a thread that finishes its own share runs what a
// preempted peer has not started yet (linear/driver.hpp). For tests and benchmarks.
std::int64_t linear_items_taken_over();

// Float32 products (the float32 model), on the same tiles and driver: every output element is
// one fp32 FMA chain over the k features in order, so a row's result does not depend on how
// many rows share the call (torch's fp32 matmul picks its kernel, and so its summation order,
// by the row count). Packed layout: [ceil(n / 32)][k][32] fp32, zero-padded.
std::int64_t packed_linear_elements_f32(std::int64_t n, std::int64_t k);

// weight: [n, k] fp32 row-major; packed: packed_linear_elements_f32(n, k).
void pack_linear_weight_f32(const float* weight, std::int64_t n, std::int64_t k, float* packed,
                            int num_threads);

// weight: [2 width, k] fp32, gate rows then up rows, interleaved as pack_gated_weight_bf16.
void pack_gated_weight_f32(const float* weight, std::int64_t width, std::int64_t k,
                           float* packed, int num_threads);

// LinearArgs for fp32 tensors (all of them fp32; the output too).
struct LinearF32Args {
    const float* x = nullptr;  // [m, k], rows x_stride elements apart
    std::int64_t x_stride = 0;
    const float* packed = nullptr;    // pack_linear_weight_f32 of the [n, k] weight
    const float* bias = nullptr;      // [n], or null
    const float* residual = nullptr;  // [m, n] added to the product, or null; may be out
    std::int64_t residual_stride = 0;
    float* out = nullptr;  // [m, n] (or [m, gated_width]), rows out_stride elements apart
    std::int64_t out_stride = 0;
    std::int64_t m = 0, n = 0, k = 0;
    std::int64_t gated_width = 0;  // as in LinearArgs
};

// Runs where linear_bf16_supported(), on AVX-512 from level avx512 and on AVX2 below it,
// the same bits on both (the same FMA chains and epilogue); throws std::runtime_error elsewhere.
void linear_f32(const LinearF32Args& args, int num_threads);

}  // namespace pagedserve
