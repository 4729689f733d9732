// The LoRA product's ISA levels: one copy of kernels.hpp per level, each in its own file and
// namespace, with the same entry; dispatch.cpp checks the arguments, groups the rows into blocks
// and calls the copy cpu_isa() names (avx512's also serves avx512_bf16 and amx). On aarch64 the
// portable copy is the one built; NEON is its baseline there, so the compiler vectorizes its
// loops for it.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/arch.hpp"
#include "pagedserve/lora.hpp"

namespace pagedserve::lora {

inline constexpr int kBlockRows = 8;  // rows of one slot computed together (one pass over a, b)

// Up to kBlockRows rows of the step that run one slot, in ascending order.
struct Block {
    std::int32_t slot = 0;
    int num_rows = 0;
    std::int64_t rows[kBlockRows] = {};
};

}  // namespace pagedserve::lora

// Each level's namespace declares this entry (kernels.hpp defines it).
#define PAGEDSERVE_LORA_ENTRIES \
    void add_blocks(const LoraArgs& args, const std::vector<lora::Block>& blocks, int num_threads);

namespace pagedserve {

namespace lora_portable {  // portable.cpp
PAGEDSERVE_LORA_ENTRIES
}

#if PAGEDSERVE_X86  // the x86 levels' copies exist only there
namespace lora_avx2 {  // avx2.cpp
PAGEDSERVE_LORA_ENTRIES
}
namespace lora_avx512 {  // avx512.cpp
PAGEDSERVE_LORA_ENTRIES
}
#endif  // PAGEDSERVE_X86

}  // namespace pagedserve

#undef PAGEDSERVE_LORA_ENTRIES
