// The quantized linear kernel at ISA level neon_i8mm (kernels.hpp): neon.hpp's kernel with the
// int8 products by USMMLA (2 x 8 by 8 x 2 matrices of u8 weights and s8 activations), for CPUs
// with the int8 matrix multiplies (HWCAP2 I8MM, and ASIMDDP for the levels below it: checked by
// cpu_features.cpp). arm_neon.h declares USMMLA under armv8.2-a+i8mm; as in neon_dotprod.cpp,
// USMMLA is then the file's one instruction beyond Armv8.0 (no atomics).
#define PAGEDSERVE_NEON_TARGET "arch=armv8.2-a+i8mm"
#define PAGEDSERVE_NEON_DOTPROD 0
#define PAGEDSERVE_NEON_I8MM 1
#define PAGEDSERVE_NEON_ENTRY quant_linear_neon_i8mm
#include "linear_quant/neon.hpp"
