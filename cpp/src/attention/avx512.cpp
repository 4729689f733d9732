// ISA level avx512 of the CPU paged attention (kernels.hpp, chosen by dispatch.cpp): the intrinsic
// item kernels (head sizes that are multiples of 32), the loops elsewhere.
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // elsewhere only the portable copy exists
#define PAGEDSERVE_ISA_NS attention_avx512
#define PAGEDSERVE_ISA_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"
#define PAGEDSERVE_ISA_AVX2 0
#define PAGEDSERVE_ISA_AVX512 1
#define PAGEDSERVE_ISA_AVX512_BF16 0
#include "attention/kernels.hpp"
#endif  // PAGEDSERVE_X86
