// The AVX2 quantized product (linear_quant_avx2.cpp): ISA level avx2, or avx512 without
// AVX512-VNNI. The VNNI kernel's packed layout, activations, fold and epilogue: its bits.
// Defined on x86 only.
#pragma once

#include <cstdint>

#include "pagedserve/linear_quant.hpp"

namespace pagedserve::quant_detail {

void quant_linear_avx2(const QuantLinearArgs& args, const std::uint8_t* acts,
                       std::int64_t act_row_bytes, int num_threads);

}  // namespace pagedserve::quant_detail
