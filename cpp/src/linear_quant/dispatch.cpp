// Quantized linear layers (linear_quant.hpp): the entry, its checks, and the run-time choice among
// the paths of kernels.hpp (one file per ISA level) by cpu_isa().
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/arch.hpp"
#include "linear/amx.hpp"
#include "linear/driver.hpp"
#include "linear_quant/kernels.hpp"
#include "linear_quant/layout.hpp"
#include "pagedserve/cpu_features.hpp"
#include "pagedserve/linear_quant.hpp"

namespace pagedserve {
namespace {

using linear_detail::amx_usable;
using linear_detail::check_linear;
using linear_detail::check_linear_args;

// The VNNI kernel runs at ISA level avx512 on CPUs with AVX512-VNNI (avx512_vnni.cpp); from
// avx512_bf16 on, its copy compiled with AVX512-BF16 (avx512_bf16.cpp), where bf16 outputs round
// in hardware and the dequant-bf16 alternative and AMX-INT8 tiles run.
bool vnni_supported() {
    return cpu_isa_at_least(CpuIsa::kAvx512) && cpu_features().avx512_vnni;
}

bool hardware_bf16() { return cpu_isa_at_least(CpuIsa::kAvx512Bf16); }

// The AVX2 kernel sums by VEX vpdpbusd from level avx2_vnni on, where the CPU has AVX-VNNI.
bool avx_vnni() { return cpu_isa_at_least(CpuIsa::kAvx2Vnni) && cpu_features().avx_vnni; }

// A vector path runs from avx2 (x86-64) or neon (aarch64) up.
bool vector_level() { return cpu_isa_at_least(CpuIsa::kAvx2) || cpu_isa_at_least(CpuIsa::kNeon); }

// float_activations: x as fp32 rows, bf16 widened (exactly) into a per-thread buffer grown to
// the largest call seen; then the AVX2 path from level avx2 up (x86), else the portable loops.
void quant_linear_float(const QuantLinearArgs& args, int num_threads, bool force_portable) {
    const float* x = static_cast<const float*>(args.x);
    std::int64_t stride = args.x_stride;
    thread_local std::vector<float> widened;
    if (!args.float32) {
        if (widened.size() < static_cast<std::size_t>(args.m * args.k)) widened.resize(args.m * args.k);
        const auto* bits = static_cast<const std::uint16_t*>(args.x);
        float* to = widened.data();
        const int threads = args.m * args.k < (1 << 18) ? 1 : num_threads;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (std::int64_t r = 0; r < args.m; ++r) {
            for (std::int64_t i = 0; i < args.k; ++i) {
                const std::uint32_t v = static_cast<std::uint32_t>(bits[r * args.x_stride + i]) << 16;
                std::memcpy(to + r * args.k + i, &v, sizeof(float));
            }
        }
        x = to, stride = args.k;
    }
#if PAGEDSERVE_X86  // the AVX2 + FMA path, from level avx2 up
    if (!force_portable && cpu_isa_at_least(CpuIsa::kAvx2))
        return quant_detail::quant_linear_float_avx2(args, x, stride, num_threads);
#endif
    quant_detail::quant_linear_float_portable(args, x, stride, num_threads);
}

// The rows in acts (quantize_activations' int8 rows, or quantize_activations16's int16 rows as
// two int8 parts: args.int16_activations) through the int8 kernels' path of the active level:
// on x86 the VNNI kernel from level avx512 on CPUs with AVX512-VNNI (with AMX-INT8 tiles from
// amx_from_rows rows; int16 rows two tile products a group), else the AVX2 kernel (its AVX-VNNI
// copy where the level has it) from avx2 up; on aarch64 the NEON kernel of the level; else, or
// force_portable, the portable loops.
void run_rows(const QuantLinearArgs& args, const std::uint8_t* acts, std::int64_t row_bytes,
              int num_threads, bool force_portable) {
    const int threads = std::max(1, num_threads);
    if (force_portable || !vector_level())
        return quant_detail::quant_linear_portable(args, acts, row_bytes, threads);
#if PAGEDSERVE_AARCH64  // the levels imply the CPU has SDOT, USMMLA (cpu_features.cpp)
    if (cpu_isa_at_least(CpuIsa::kNeonI8mm))
        return quant_detail::quant_linear_neon_i8mm(args, acts, row_bytes, threads);
    if (cpu_isa_at_least(CpuIsa::kNeonDotprod))
        return quant_detail::quant_linear_neon_dotprod(args, acts, row_bytes, threads);
    quant_detail::quant_linear_neon(args, acts, row_bytes, threads);
#endif
#if PAGEDSERVE_X86  // the x86 vector paths (elsewhere cpu_isa() is not an x86 level)
    if (!vnni_supported())
        return avx_vnni() ? quant_detail::quant_linear_avx2_vnni(args, acts, row_bytes, threads)
                          : quant_detail::quant_linear_avx2(args, acts, row_bytes, threads);
    if (hardware_bf16()) return quant_detail::quant_linear_avx512_bf16(args, acts, row_bytes, threads);
    quant_detail::quant_linear_avx512_vnni(args, acts, row_bytes, threads);
#endif
}

// int16_activations: int16 rows (quantize_activations16) on the int8 kernels (run_rows).
void quant_linear_int16(const QuantLinearArgs& args, int num_threads, bool force_portable) {
    const std::int64_t row_bytes = quant_detail::activation_row_bytes(args.k, 2);
    thread_local std::vector<std::uint8_t> acts;  // as quant_linear's int8 rows
    if (acts.size() < static_cast<std::size_t>(args.m * row_bytes)) acts.resize(args.m * row_bytes);
    quant_detail::quantize_activations16(args.x, args.float32, args.x_stride, args.m, args.k,
                                         acts.data(), num_threads, force_portable);
    run_rows(args, acts.data(), row_bytes, num_threads, force_portable);
}

}  // namespace

const char* quant_linear_int16_path() { return quant_linear_path(); }  // the same kernels

const char* quant_linear_path() {
    if (vnni_supported()) return "avx512-vnni";
    if (avx_vnni()) return "avx2-vnni";
    if (cpu_isa_at_least(CpuIsa::kNeonI8mm)) return "neon-i8mm";
    if (cpu_isa_at_least(CpuIsa::kNeonDotprod)) return "neon-dotprod";
    if (cpu_isa_at_least(CpuIsa::kNeon)) return "neon";
    return cpu_isa_at_least(CpuIsa::kAvx2) ? "avx2" : "portable";
}

const char* quant_linear_float_path() {
    return cpu_isa_at_least(CpuIsa::kAvx2) ? "avx2" : "portable";
}

bool quant_linear_amx_supported() { return vnni_supported() && hardware_bf16() && amx_usable(true); }

void quant_linear(const QuantLinearArgs& args, int num_threads, bool force_portable) {
    check_linear(quant_type_supported(args.ggml_type),
                 "quant_linear: no kernel for ggml type " + std::to_string(args.ggml_type));
    check_linear(args.k > 0 && args.k % quant_block_features(args.ggml_type) == 0,
                 "quant_linear: k must be a multiple of the type's block size");
    if (!check_linear_args(args, "quant_linear")) return;
    check_linear(args.amx_from_rows >= 0, "quant_linear: amx_from_rows must be >= 0");
    check_linear(!(args.float_activations && args.dequant_bf16),
                 "quant_linear: float_activations and dequant_bf16 exclude each other");
    check_linear(!(args.int16_activations && (args.float_activations || args.dequant_bf16)),
                 "quant_linear: int16_activations excludes float_activations and dequant_bf16");
    if (args.float_activations) return quant_linear_float(args, std::max(1, num_threads), force_portable);
    if (args.int16_activations) return quant_linear_int16(args, std::max(1, num_threads), force_portable);
    const std::int64_t row_bytes = quant_detail::activation_row_bytes(args.k);
    // Per calling thread, grown to the largest call seen: a step calls this several times per
    // layer, so the int8 rows are not allocated each time.
    thread_local std::vector<std::uint8_t> acts;
    if (acts.size() < static_cast<std::size_t>(args.m * row_bytes)) acts.resize(args.m * row_bytes);
    if (args.dequant_bf16) {
        check_linear(vnni_supported() && hardware_bf16() && !args.float32 && !force_portable,
                     "quant_linear: dequant_bf16 needs bf16 x on an AVX512-BF16 CPU");
#if PAGEDSERVE_X86  // elsewhere the check above has thrown
        return quant_detail::quant_linear_dequant_bf16(args, acts.data(), row_bytes,
                                                       std::max(1, num_threads));
#endif
    }
    quant_detail::quantize_activations(args.x, args.float32, args.x_stride, args.m, args.k,
                                       acts.data(), num_threads, force_portable);
    run_rows(args, acts.data(), row_bytes, num_threads, force_portable);
}

}  // namespace pagedserve
