// ISA level portable of the fused layer ops (kernels.hpp, chosen by dispatch.cpp).
#include "cpu/arch.hpp"

#define PAGEDSERVE_ISA_NS layer_ops_portable
#include "layer_ops/kernels.hpp"
