// Linear layers over GGUF quantized weights kept quantized (issue 12): Q4_0, Q4_1, Q8_0, Q4_K,
// Q5_K and Q6_K rows are repacked once, at load, into 32-column tiles of unsigned integers with
// a scale and min per (column, group of 16 or 32 features), w = scale * u + min, which every one
// of these formats is exactly (Q4_0: min = -8 scale, Q8_0: u = q + 128, min = -128 scale,
// K-quants: scale = d * sub-scale, min = -dmin * sub-min, all exact in fp32), kept in fp16 where
// they are exact in it (Q4_0, Q4_1, Q8_0: the file's own; packing refuses a file whose scale
// times 8 or 128 leaves fp16's range), else in fp32.
//
// A product quantizes each activation row to int8 in blocks of 32 features (fp32 scale, as
// llama.cpp's Q8 activations: d = max|x| / 127, q = round(x / d)) and sums u * q with
// AVX512-VNNI (vpdpbusd) in int32 per group, then
//     acc = fma(float(isum), scale * d, acc);  acc = fma(min, d * sum(q of the group), acc)
// in fp32 over the groups in order. Every output element takes the same operations in the same
// order whatever the row count, the micro-tile or the threads: batch-invariant (issue 16). The
// portable path (CPUs without AVX512-VNNI/BF16, chosen at run time) does the same arithmetic
// with std::fma, so its plain products are bit-identical to the VNNI path's.
//
// With QuantLinearArgs::float_activations the activations are not rounded (issue 42: a 135M
// model does not survive int8 activations): each x row is used as fp32 (bf16 widened exactly),
// each weight dequantized in registers as w = fma(scale, float(u), min) (exact, see above), and
//     acc = fma(x[e], w[e], acc)
// over the k features in order, one fp32 accumulator per output element (then the same
// epilogue): batch-invariant as above. Paths: AVX2 + FMA (8 lanes; ISA level avx2 and every x86
// level above it) and portable loops (std::fma; every other CPU, aarch64 included).
//
// With QuantLinearArgs::int16_activations each x row is rounded to int16 per 32 features instead
// (d = max|x| / 32512, q = round(x / d): 2^-15 of the block's largest value, where int8 keeps
// 2^-7), stored as two int8 parts q = 255 hi + lo, and the int8 kernels sum u * hi and u * lo
// exactly in int32 and fold 255 isum(hi) + isum(lo) as they fold isum: the int8 path's
// arithmetic on an exact int16 product, so batch-invariant, and the same bits at every level
// (portable loops below avx2 and on aarch64; the AVX2 kernel, or its AVX-VNNI copy, from level
// avx2 up, the AVX-512 levels included). Twice the int8 path's multiplies, none of the float
// path's dequantization: the answers of the dequantized model on SmolLM2-135M (issue 42).
#pragma once

#include <cstdint>

namespace pagedserve {

// ggml's type ids (GGMLQuantizationType) of the formats with a kernel.
inline constexpr int kGgmlQ4_0 = 2, kGgmlQ4_1 = 3, kGgmlQ8_0 = 8;
inline constexpr int kGgmlQ4_K = 12, kGgmlQ5_K = 13, kGgmlQ6_K = 14;

bool quant_type_supported(int ggml_type);

// Features per GGUF block (32, or 256 for the K-quants): k must be a multiple of it.
std::int64_t quant_block_features(int ggml_type);

// Bytes of one GGUF row of k features.
std::int64_t quant_row_bytes(int ggml_type, std::int64_t k);

// Bytes of the packed weight of n columns (output features) and k input features.
std::int64_t packed_quant_bytes(int ggml_type, std::int64_t n, std::int64_t k);

// rows[c]: the address of the GGUF row (quant_row_bytes(type, k) bytes) that becomes packed
// column c, or 0 for a zero column (padding, a gated weight's gap); n entries. A row table
// lets the caller concatenate (q, k, v), permute (llama.cpp's rotary order) and interleave
// (gate/up by 16, see kLinearGateCols) without copying the blocks first.
void pack_quant_weight(int ggml_type, const std::int64_t* rows, std::int64_t n, std::int64_t k,
                       std::uint8_t* packed, int num_threads);

struct QuantLinearArgs {
    int ggml_type = 0;
    const void* x = nullptr;  // [m, k] bf16 (or fp32 when float32), rows x_stride elements apart
    std::int64_t x_stride = 0;
    bool float32 = false;                  // x, bias, residual (and out) are fp32, else bf16
    const std::uint8_t* packed = nullptr;  // pack_quant_weight of the [n, k] weight
    const void* bias = nullptr;            // [n], x's dtype, or null
    const void* residual = nullptr;        // [m, n], x's dtype, or null; may be out itself
    std::int64_t residual_stride = 0;
    void* out = nullptr;  // [m, n] (or [m, gated_width]), rows out_stride elements apart
    std::int64_t out_stride = 0;
    bool out_float32 = false;  // fp32 output (logits) for bf16 x; fp32 x always writes fp32
    std::int64_t m = 0, n = 0, k = 0;
    std::int64_t gated_width = 0;  // > 0: silu(gate) * up, as LinearArgs::gated_width
    // The measured alternative (bench/linear.py; slower, so no layer uses it): bf16 x times the
    // weights converted to bf16 in registers, AVX512-BF16 dot products; bf16 x only.
    bool dequant_bf16 = false;
    // A call of at least this many rows runs on AMX-INT8 tiles where
    // quant_linear_amx_supported() (0: never). Same bits as AVX512-VNNI (exact int32 sums per
    // group, folded in the same order), so any threshold keeps batch invariance.
    std::int64_t amx_from_rows = 0;
    // x kept in fp32 (see the top of this file): a W4A32 / W8A32 product, no int8 rounding of
    // the activations. Excludes dequant_bf16; amx_from_rows does not apply.
    bool float_activations = false;
    // x rounded to int16 per 32 features instead of int8 (issue 42: a 135M model survives it;
    // see the top of this file), on the int8 paths' kernels: excludes float_activations and
    // dequant_bf16; amx_from_rows does not apply.
    bool int16_activations = false;
};

// Which path quant_linear runs on this CPU: "avx512-vnni" or "portable".
const char* quant_linear_path();

// Which path quant_linear runs with float_activations on this CPU: "avx2" or "portable".
const char* quant_linear_float_path();

// Which path quant_linear runs with int16_activations on this CPU: the int8 rows' kernels, so
// quant_linear_path()'s.
const char* quant_linear_int16_path();

// True when quant_linear may take AMX-INT8 tiles (with AVX512-VNNI, whose epilogue they share):
// the CPU has them and Linux granted them, or linear_amx_emulation (linear.hpp) is on.
bool quant_linear_amx_supported();

// out = x W^T (+ bias) (+ residual). force_portable runs the portable path (tests, benches).
void quant_linear(const QuantLinearArgs& args, int num_threads, bool force_portable = false);

}  // namespace pagedserve
