// Unit tests of the CPU feature read-out and the ISA level: the flags are consistent with each
// other and stable (the Python test checks them against /proc/cpuinfo), and a level set lower is
// capped and restorable.
#include <cstdio>
#include <string>

#include "check.hpp"
#include "pagedserve/cpu_features.hpp"

using pagedserve::CpuIsa;

TEST(features_are_cached_and_consistent) {
    const pagedserve::CpuFeatures& f = pagedserve::cpu_features();
    CHECK(&f == &pagedserve::cpu_features());  // read once
    CHECK(!f.avx512_bf16 || f.avx512f);
    CHECK(!f.avx512_vnni || f.avx512f);
    CHECK(!f.avx512bw || f.avx512f);
    CHECK(!f.fma || f.avx2);
    CHECK(!f.avx_vnni || f.avx2);
    CHECK(!f.amx_os_enabled || f.amx_tile);
    CHECK(!f.amx_permitted || f.amx_os_enabled);
    std::fprintf(stderr, "  avx2 %d fma %d f16c %d avx512f %d avx512_bf16 %d avx512_vnni %d "
                 "amx_bf16 %d amx_int8 %d amx usable %d: level %s\n", f.avx2, f.fma, f.f16c,
                 f.avx512f, f.avx512_bf16, f.avx512_vnni, f.amx_bf16, f.amx_int8,
                 f.amx_permitted, pagedserve::cpu_isa_name(pagedserve::cpu_isa_supported()));
}

TEST(isa_level_follows_the_features) {
    const pagedserve::CpuFeatures& f = pagedserve::cpu_features();
    const CpuIsa level = pagedserve::cpu_isa_supported();
    CHECK((level >= CpuIsa::kAvx2) == (f.avx2 && f.fma && f.f16c));
    if (level == CpuIsa::kAvx2Vnni) CHECK(f.avx_vnni);
    if (level >= CpuIsa::kAvx512) CHECK(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq);
    if (level >= CpuIsa::kAvx512Bf16) CHECK(f.avx512_bf16);
    if (level >= CpuIsa::kAmx) CHECK(f.amx_permitted && f.amx_bf16 && f.amx_int8);
    CHECK(pagedserve::cpu_isa() == level);  // nothing set yet
}

TEST(set_cpu_isa_is_capped_and_restorable) {
    const CpuIsa best = pagedserve::cpu_isa_supported();
    CHECK(pagedserve::set_cpu_isa(CpuIsa::kPortable) == CpuIsa::kPortable);
    CHECK(pagedserve::cpu_isa() == CpuIsa::kPortable);
    CHECK(!pagedserve::cpu_isa_at_least(CpuIsa::kAvx2));
    CHECK(pagedserve::set_cpu_isa(CpuIsa::kAmx) == best);  // capped at what the CPU has
    CHECK(pagedserve::cpu_isa() == best);
    CHECK(std::string(pagedserve::cpu_isa_name(CpuIsa::kAvx512Bf16)) == "avx512_bf16");
    // avx2_vnni on a CPU without AVX-VNNI (Zen 4, Ice Lake: AVX-512 but no VEX VNNI) is avx2.
    if (best >= CpuIsa::kAvx2Vnni) {
        const CpuIsa want = pagedserve::cpu_features().avx_vnni ? CpuIsa::kAvx2Vnni : CpuIsa::kAvx2;
        CHECK(pagedserve::set_cpu_isa(CpuIsa::kAvx2Vnni) == want);
        CHECK(pagedserve::set_cpu_isa(best) == best);
    }
}

int main() { return check::run_all_tests(); }
