// The quantized linear kernel at ISA level neon_dotprod (kernels.hpp): neon.hpp's kernel with the
// int8 products by SDOT, for CPUs with the dot-product extension (HWCAP ASIMDDP, checked by
// cpu_features.cpp). arm_neon.h declares SDOT for armv8.2-a+dotprod, which a function must
// include to inline it; every CPU with the extension implements Armv8.2.
#define PAGEDSERVE_NEON_TARGET "arch=armv8.2-a+dotprod"
#define PAGEDSERVE_NEON_DOTPROD 1
#define PAGEDSERVE_NEON_ENTRY quant_linear_neon_dotprod
#include "linear_quant/neon.hpp"
