// The quantized linear kernel at ISA level neon_dotprod (kernels.hpp): neon.hpp's kernel with the
// int8 products by SDOT, for CPUs with the dot-product extension (HWCAP ASIMDDP, checked by
// cpu_features.cpp). arm_neon.h declares SDOT under armv8.2-a+dotprod, and a function inlines
// it only under a target that includes that; of Armv8.1 / 8.2's other instructions the compiler
// would emit only atomics by itself, which this file has none of (objdump: SDOT is the one
// instruction beyond Armv8.0 here), so it runs on any CPU that reports ASIMDDP.
#define PAGEDSERVE_NEON_TARGET "arch=armv8.2-a+dotprod"
#define PAGEDSERVE_NEON_DOTPROD 1
#define PAGEDSERVE_NEON_ENTRY quant_linear_neon_dotprod
#include "linear_quant/neon.hpp"
