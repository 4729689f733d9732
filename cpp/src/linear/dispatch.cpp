// The dense linear entries (linear.hpp): the argument checks, then the path of the active ISA
// level (kernels.hpp). Whether a layer runs them at all, or torch's matmul, is Python's choice,
// measured per row count at start-up (core/models/linear/dispatch.py).
#include <algorithm>
#include <stdexcept>

#include "cpu/arch.hpp"
#include "linear/driver.hpp"
#include "linear/kernels.hpp"
#include "pagedserve/cpu_features.hpp"
#include "pagedserve/linear.hpp"

namespace pagedserve {

// A relaxed atomic load: linear_bf16 asks on every call. False at every aarch64 level
// (cpu_isa_covers never orders them with x86's) and where the build is not x86-64.
bool linear_bf16_supported() { return PAGEDSERVE_X86 && cpu_isa_at_least(CpuIsa::kAvx2); }

const char* linear_path() {
    if (!linear_bf16_supported()) return "none";
    if (cpu_isa_at_least(CpuIsa::kAvx512Bf16)) return "avx512_bf16";
    return cpu_isa_at_least(CpuIsa::kAvx512) ? "avx512" : "avx2";
}

namespace {

void require_kernel() {
    if (!linear_bf16_supported())
        throw std::runtime_error("no native dense linear kernel below ISA level avx2 (x86-64 "
                                 "AVX2 + FMA + F16C): run these layers on torch");
}

}  // namespace

void linear_bf16(const LinearArgs& args, int num_threads) {
    require_kernel();
    // No rows is a valid product with nothing to read or write: torch gives an empty tensor a
    // null data pointer (e.g. the logits of a step whose prefill chunks all end mid-prompt).
    if (!linear_detail::check_linear_args(args, "linear_bf16")) return;
    linear_detail::check_linear(args.amx_from_rows >= 0, "linear_bf16: amx_from_rows must be >= 0");
#if PAGEDSERVE_X86  // require_kernel() threw elsewhere
    const int threads = std::max(1, num_threads);
    if (cpu_isa_at_least(CpuIsa::kAvx512Bf16))
        return linear_detail::linear_bf16_avx512_bf16(args, threads);
    // No tiles below avx512_bf16 (linear_amx_supported() is false), so amx_from_rows has no
    // effect; tile_order neither: the AVX2 path's own order (even feature first, each add
    // rounded once), which avx512's keeps, is the SDM tiles' but for their denormal flushing.
    if (cpu_isa_at_least(CpuIsa::kAvx512)) return linear_detail::linear_bf16_avx512(args, threads);
    linear_detail::linear_bf16_avx2(args, threads);
#else
    (void)num_threads;
#endif
}

void linear_f32(const LinearF32Args& args, int num_threads) {
    require_kernel();
    if (!linear_detail::check_linear_args(args, "linear_f32")) return;
#if PAGEDSERVE_X86
    const int threads = std::max(1, num_threads);
    // The AVX-512 fp32 kernel needs no AVX512-BF16; the AVX2 one below it gives its bits.
    if (cpu_isa_at_least(CpuIsa::kAvx512)) return linear_detail::linear_f32_avx512(args, threads);
    linear_detail::linear_f32_avx2(args, threads);
#else
    (void)num_threads;
#endif
}

}  // namespace pagedserve
