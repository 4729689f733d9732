// The quantized linear kernel at ISA level avx2_vnni (kernels.hpp): avx2.hpp's kernel with the
// int8 products by VEX vpdpbusd, for CPUs with AVX-VNNI (dispatch.cpp checks the CPUID bit).
#define PAGEDSERVE_AVX2_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#define PAGEDSERVE_AVX2_VNNI 1
#define PAGEDSERVE_AVX2_ENTRY quant_linear_avx2_vnni
#include "linear_quant/avx2.hpp"
