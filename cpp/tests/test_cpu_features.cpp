// Unit tests of the CPU feature read-out: the flags are consistent with each other and stable
// (the Python test checks them against /proc/cpuinfo).
#include <cstdio>

#include "check.hpp"
#include "pagedserve/cpu_features.hpp"

TEST(features_are_cached_and_consistent) {
    const pagedserve::CpuFeatures& f = pagedserve::cpu_features();
    CHECK(&f == &pagedserve::cpu_features());  // read once
    CHECK(!f.avx512_bf16 || f.avx512f);
    CHECK(!f.avx512_vnni || f.avx512f);
    CHECK(!f.amx_os_enabled || f.amx_tile);
    CHECK(!f.amx_permitted || f.amx_os_enabled);
    std::fprintf(stderr, "  avx512_bf16 %d avx512_vnni %d amx_bf16 %d amx_int8 %d amx usable %d\n",
                 f.avx512_bf16, f.avx512_vnni, f.amx_bf16, f.amx_int8, f.amx_permitted);
}

int main() { return check::run_all_tests(); }
