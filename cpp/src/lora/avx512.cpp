// ISA level avx512 of the LoRA product (kernels.hpp, chosen by dispatch.cpp).
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // elsewhere only the portable copy exists
#define PAGEDSERVE_ISA_NS lora_avx512
#define PAGEDSERVE_ISA_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"
#define PAGEDSERVE_LORA_LANES 16
#include "lora/kernels.hpp"
#endif  // PAGEDSERVE_X86
