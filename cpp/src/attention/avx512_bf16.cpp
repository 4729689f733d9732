// ISA level avx512_bf16 of the CPU paged attention (kernels.hpp, chosen by dispatch.cpp): the item
// kernels with vdpbf16ps bf16 dot products.
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // elsewhere only the portable copy exists
#define PAGEDSERVE_ISA_NS attention_avx512_bf16
#define PAGEDSERVE_ISA_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"
#define PAGEDSERVE_ISA_AVX2 0
#define PAGEDSERVE_ISA_AVX512 1
#define PAGEDSERVE_ISA_AVX512_BF16 1
#include "attention/kernels.hpp"
#endif  // PAGEDSERVE_X86
