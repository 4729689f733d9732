// ISA level portable of the LoRA product (kernels.hpp, chosen by dispatch.cpp).
#include "cpu/arch.hpp"

#define PAGEDSERVE_ISA_NS lora_portable
#include "lora/kernels.hpp"
