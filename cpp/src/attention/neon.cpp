// ISA level neon (and neon_dotprod, neon_i8mm) of the CPU paged attention (kernels.hpp, chosen by
// dispatch.cpp): the plain loops, with neon.hpp's score, softmax and value steps for head sizes
// 64 and 128. Advanced SIMD is aarch64's baseline: no target pragma.
#include "cpu/arch.hpp"

#if PAGEDSERVE_AARCH64  // elsewhere only the portable (and x86) copies exist
#define PAGEDSERVE_ISA_NS attention_neon
#define PAGEDSERVE_ISA_AVX2 0
#define PAGEDSERVE_ISA_AVX512 0
#define PAGEDSERVE_ISA_AVX512_BF16 0
#define PAGEDSERVE_ISA_NEON 1
#include "attention/kernels.hpp"
#endif  // PAGEDSERVE_AARCH64
