// ISA level avx2 of the LoRA product (kernels.hpp, chosen by dispatch.cpp).
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // elsewhere only the portable copy exists
#define PAGEDSERVE_ISA_NS lora_avx2
#define PAGEDSERVE_ISA_TARGET "avx2,fma,f16c"
#define PAGEDSERVE_LORA_LANES 8
#include "lora/kernels.hpp"
#endif  // PAGEDSERVE_X86
