// The CPU paged-attention kernels' ISA levels: one copy of kernels.hpp per level, each in its own
// file and namespace, all with the same entry. dispatch.cpp calls the one cpu_isa() names
// (avx512_bf16's copy also serves amx, neon's neon_dotprod and neon_i8mm). A new level: a file like avx2.cpp, a line here and a
// case in dispatch.cpp.
#pragma once

#include "cpu/arch.hpp"
#include "pagedserve/paged_attention.hpp"

namespace pagedserve {

namespace attention_portable {  // portable.cpp: plain loops (SSE2 at most)
void attention(const AttentionArgs& args, int num_threads);
}

#if PAGEDSERVE_X86  // the x86 levels' copies exist only there
namespace attention_avx2 {  // avx2.cpp: the plain loops for AVX2 + FMA, with avx2.hpp's steps
void attention(const AttentionArgs& args, int num_threads);
}
namespace attention_avx512 {  // avx512.cpp: the intrinsic item kernels
void attention(const AttentionArgs& args, int num_threads);
}
namespace attention_avx512_bf16 {  // avx512_bf16.cpp: the item kernels with vdpbf16ps
void attention(const AttentionArgs& args, int num_threads);
}
#endif  // PAGEDSERVE_X86

#if PAGEDSERVE_AARCH64  // the aarch64 level's copy exists only there
namespace attention_neon {  // neon.cpp: the loops with neon.hpp's steps (every neon level)
void attention(const AttentionArgs& args, int num_threads);
}
#endif  // PAGEDSERVE_AARCH64

}  // namespace pagedserve
