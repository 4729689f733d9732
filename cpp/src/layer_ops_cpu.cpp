// Fused per-token CPU ops of a Llama layer (RMSNorm, add + RMSNorm, rotary, SiLU-and-mul).
//
// Each op works on one row (token) at a time in fp32 scratch, rounding once to the storage dtype;
// OpenMP splits rows only when there is enough work to pay for waking the threads. Plain loops
// written for the compiler's vectorizer (`omp simd`), no intrinsics, compiled once per ISA level
// (layer_ops_cpu_impl.hpp: portable, avx2, avx512) and chosen at run time by cpu_isa().
//
// Bit-exactness with torch (float32): the engine's greedy tokens must equal transformers' in fp32,
// so every float32 result here equals the torch expression it replaces bit for bit: the same
// operation order, no fused multiply-adds torch does not use (hence fp-contract=off below), the
// RMSNorm mean summed in torch's order, and SiLU's exp computed as torch's vector exp (SLEEF's
// 1-ulp expf) computes it.

// GCC contracts a * b + c into an FMA under -std=gnu++17; torch's kernels round each step. Set
// before the includes, so that inline helpers share the option and can still be inlined.
#pragma GCC optimize("fp-contract=off")

#include "pagedserve/layer_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "arch.hpp"
#include "pagedserve/cpu_features.hpp"
#include "pagedserve/rows.hpp"

#define PAGEDSERVE_ISA_NS layer_ops_portable
#include "layer_ops_cpu_impl.hpp"
#undef PAGEDSERVE_ISA_NS

#if PAGEDSERVE_X86  // the x86 levels' copies: elsewhere only the portable one exists
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define PAGEDSERVE_ISA_NS layer_ops_avx2
#include "layer_ops_cpu_impl.hpp"
#undef PAGEDSERVE_ISA_NS
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#define PAGEDSERVE_ISA_NS layer_ops_avx512
#include "layer_ops_cpu_impl.hpp"
#undef PAGEDSERVE_ISA_NS
#pragma GCC pop_options
#endif  // PAGEDSERVE_X86

namespace pagedserve {

// The copy of the ops for the active ISA level (avx512_bf16 and amx use the AVX-512 one).
#if PAGEDSERVE_X86  // the x86 levels' copies exist only there
#define PAGEDSERVE_LAYER_OP(op, ...)                                          \
    switch (cpu_isa()) {                                                     \
        case CpuIsa::kPortable: return layer_ops_portable::op(__VA_ARGS__); \
        case CpuIsa::kAvx2: return layer_ops_avx2::op(__VA_ARGS__);         \
        default: return layer_ops_avx512::op(__VA_ARGS__);                  \
    }
#else
#define PAGEDSERVE_LAYER_OP(op, ...) return layer_ops_portable::op(__VA_ARGS__);
#endif

void rms_norm_cpu(const RmsNormArgs& a, int num_threads) { PAGEDSERVE_LAYER_OP(rms_norm, a, num_threads) }

void rotary_cpu(const RotaryArgs& args, int num_threads) {
    PAGEDSERVE_LAYER_OP(rotary, args, num_threads)
}

void silu_and_mul_cpu(RowView out, RowView gate_up, std::int64_t num_rows,
                      std::int64_t intermediate_size, DType dtype, int torch_lanes,
                      int num_threads) {
    PAGEDSERVE_LAYER_OP(silu_and_mul, out, gate_up, num_rows, intermediate_size, dtype,
                        torch_lanes, num_threads)
}

#undef PAGEDSERVE_LAYER_OP

}  // namespace pagedserve
