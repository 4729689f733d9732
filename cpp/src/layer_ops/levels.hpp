// The fused layer ops' ISA levels: one copy of kernels.hpp per level, each in its own file and
// namespace, all with the same entries; dispatch.cpp calls the one cpu_isa() names (avx512's
// copy also serves avx512_bf16 and amx).
#pragma once

#include <cstdint>

#include "cpu/arch.hpp"
#include "pagedserve/layer_ops.hpp"

// Each level's namespace declares these same three entries (kernels.hpp defines them).
#define PAGEDSERVE_LAYER_OPS_ENTRIES                                                          \
    void rms_norm(const RmsNormArgs& a, int num_threads);                                     \
    void rotary(const RotaryArgs& args, int num_threads);                                     \
    void silu_and_mul(RowView out, RowView gate_up, std::int64_t num_rows,                    \
                      std::int64_t intermediate_size, DType dtype, int torch_lanes, int num_threads);

namespace pagedserve {

namespace layer_ops_portable {  // portable.cpp
PAGEDSERVE_LAYER_OPS_ENTRIES
}

#if PAGEDSERVE_X86  // the x86 levels' copies exist only there
namespace layer_ops_avx2 {  // avx2.cpp
PAGEDSERVE_LAYER_OPS_ENTRIES
}
namespace layer_ops_avx512 {  // avx512.cpp
PAGEDSERVE_LAYER_OPS_ENTRIES
}
#endif  // PAGEDSERVE_X86

}  // namespace pagedserve

#undef PAGEDSERVE_LAYER_OPS_ENTRIES
