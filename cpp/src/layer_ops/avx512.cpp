// ISA level avx512 of the fused layer ops (kernels.hpp, chosen by dispatch.cpp).
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // elsewhere only the portable copy exists
#define PAGEDSERVE_ISA_NS layer_ops_avx512
#define PAGEDSERVE_ISA_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"
#include "layer_ops/kernels.hpp"
#endif  // PAGEDSERVE_X86
