// The portable quantized product (CPUs without AVX512-VNNI / AVX512-BF16): plain loops over the
// same packed layout and int8 activations as the VNNI kernel, in the same order (int32 group
// sums, then std::fma), so plain products agree with it bit for bit.
#pragma once

#include <cstdint>

#include "pagedserve/linear_quant.hpp"

namespace pagedserve::quant_detail {

void quant_linear_portable(const QuantLinearArgs& args, const std::uint8_t* acts,
                           std::int64_t act_row_bytes, int num_threads);

}  // namespace pagedserve::quant_detail
