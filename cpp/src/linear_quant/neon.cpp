// The quantized linear kernel at ISA level neon (kernels.hpp): neon.hpp's kernel for plain
// Advanced SIMD (every aarch64 CPU), int8 products by SMULL / SMLAL into int16, widened pairwise.
#define PAGEDSERVE_NEON_DOTPROD 0
#define PAGEDSERVE_NEON_ENTRY quant_linear_neon
#include "linear_quant/neon.hpp"
