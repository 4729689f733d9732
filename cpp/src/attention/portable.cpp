// ISA level portable of the CPU paged attention (kernels.hpp, chosen by dispatch.cpp): plain loops:
// SSE2 at most (x86-64's baseline), NEON's auto-vectorized floats on aarch64.
#include "cpu/arch.hpp"

#define PAGEDSERVE_ISA_NS attention_portable
#define PAGEDSERVE_ISA_AVX2 0
#define PAGEDSERVE_ISA_AVX512 0
#define PAGEDSERVE_ISA_AVX512_BF16 0
#include "attention/kernels.hpp"
