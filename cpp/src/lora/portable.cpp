// ISA level portable of the LoRA product (kernels.hpp, chosen by dispatch.cpp).
#include "cpu/arch.hpp"

#define PAGEDSERVE_ISA_NS lora_portable
#define PAGEDSERVE_LORA_LANES 4  // SSE2 on x86-64, NEON on aarch64
#include "lora/kernels.hpp"
