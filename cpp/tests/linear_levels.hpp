// For the dense linear kernels' tests: runs a body once per path this CPU has (the AVX2 path at
// level avx2, bf16 widened in 16 lanes at avx512, the AVX512-BF16 one at avx512_bf16), each
// level set for the body's duration, saying which ran; a CPU (or build) with none runs nothing
// and says so.
#pragma once

#include <cstdio>
#include <cstring>

#include "pagedserve/cpu_features.hpp"
#include "pagedserve/linear.hpp"

namespace linear_levels {

inline constexpr pagedserve::CpuIsa kLevels[] = {
    pagedserve::CpuIsa::kAvx2, pagedserve::CpuIsa::kAvx512, pagedserve::CpuIsa::kAvx512Bf16};

// True where the CPU runs `level`.
inline bool has_level(pagedserve::CpuIsa level) {
    return pagedserve::cpu_isa_covers(pagedserve::cpu_isa_supported(), level);
}

// body(path name); returns how many levels ran.
template <typename Body>
int on_each_path(Body body) {
    using namespace pagedserve;
    const CpuIsa best = cpu_isa_supported();
    int ran = 0;
    for (CpuIsa level : kLevels) {
        if (!cpu_isa_covers(best, level) || set_cpu_isa(level) != level) continue;
        if (!linear_bf16_supported()) continue;  // a build without the x86 paths
        ++ran;
        body(linear_path());
    }
    set_cpu_isa(best);
    if (ran == 0) std::fprintf(stderr, "  (no dense linear path at this CPU's level: skipped)\n");
    return ran;
}

// The AVX512-BF16 path (and the AMX one on it) runs here.
inline bool has_avx512_bf16() {
    return pagedserve::cpu_isa_covers(pagedserve::cpu_isa_supported(),
                                      pagedserve::CpuIsa::kAvx512Bf16);
}

}  // namespace linear_levels
