// The quantized linear kernel at ISA level avx2 (kernels.hpp): avx2.hpp's kernel for plain AVX2,
// int8 products by vpmaddubsw + vpmaddwd.
#define PAGEDSERVE_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define PAGEDSERVE_AVX2_VNNI 0
#define PAGEDSERVE_AVX2_ENTRY quant_linear_avx2
#include "linear_quant/avx2.hpp"
