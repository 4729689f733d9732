// ISA level avx2 of the CPU paged attention (kernels.hpp, chosen by dispatch.cpp): the plain loops,
// vectorized for AVX2 + FMA, with avx2.hpp's score, softmax and value steps for head sizes 64 and 128.
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // elsewhere only the portable copy exists
#define PAGEDSERVE_ISA_NS attention_avx2
#define PAGEDSERVE_ISA_TARGET "avx2,fma,f16c"
#define PAGEDSERVE_ISA_AVX2 1
#define PAGEDSERVE_ISA_AVX512 0
#define PAGEDSERVE_ISA_AVX512_BF16 0
#include "attention/kernels.hpp"
#endif  // PAGEDSERVE_X86
