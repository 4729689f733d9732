// Fused per-token CPU ops of a Llama layer (RMSNorm, add + RMSNorm, rotary, SiLU-and-mul).
//
// Each op works on one row (token) at a time in fp32 scratch, rounding once to the storage dtype;
// OpenMP splits rows only when there is enough work to pay for waking the threads. Plain loops
// written for the compiler's vectorizer (`omp simd`), no intrinsics, compiled once per ISA level
// (kernels.hpp, in portable.cpp, avx2.cpp, avx512.cpp) and chosen at run time by cpu_isa().
//
// Bit-exactness with torch (float32): the engine's greedy tokens must equal transformers' in fp32,
// so every float32 result here equals the torch expression it replaces bit for bit: the same
// operation order, no fused multiply-adds torch does not use (hence fp-contract=off in
// kernels.hpp), the RMSNorm mean summed in torch's order, and SiLU's exp computed as torch's
// vector exp (SLEEF's 1-ulp expf) computes it.

#include "pagedserve/layer_ops.hpp"

#include <cstdint>

#include "cpu/arch.hpp"
#include "layer_ops/levels.hpp"
#include "pagedserve/cpu_features.hpp"

namespace pagedserve {

// The copy of the ops for the active ISA level (avx512_bf16 and amx use the AVX-512 one).
#if PAGEDSERVE_X86  // the x86 levels' copies exist only there
#define PAGEDSERVE_LAYER_OP(op, ...)                                          \
    switch (cpu_isa()) {                                                     \
        case CpuIsa::kPortable: return layer_ops_portable::op(__VA_ARGS__); \
        case CpuIsa::kAvx2:                                                  \
        case CpuIsa::kAvx2Vnni: return layer_ops_avx2::op(__VA_ARGS__);     \
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
