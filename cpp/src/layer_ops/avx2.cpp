// ISA level avx2 of the fused layer ops (kernels.hpp, chosen by dispatch.cpp).
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // elsewhere only the portable copy exists
#define PAGEDSERVE_ISA_NS layer_ops_avx2
#define PAGEDSERVE_ISA_TARGET "avx2,fma,f16c"
#include "layer_ops/kernels.hpp"
#endif  // PAGEDSERVE_X86
