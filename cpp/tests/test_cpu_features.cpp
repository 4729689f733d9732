// Unit tests of the CPU feature read-out and the ISA level: the flags are consistent with each
// other and stable (the Python test checks them against /proc/cpuinfo), a level set lower is
// capped and restorable, and the two architectures' ladders never mix (an aarch64 level is not
// an x86 one). The last line names the level: tests/native/test_cpp_aarch64.py reads it to
// know qemu's CPU model ran the level it should.
#include <cstdio>
#include <string>

#include "check.hpp"
#include "pagedserve/cpu_features.hpp"

using pagedserve::CpuIsa;
using pagedserve::cpu_isa_covers;

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
    CHECK(!f.neon_dotprod || f.neon);
    CHECK(!f.i8mm || f.neon);
    CHECK(!(f.neon && f.avx2));  // one architecture's features only
#if defined(__aarch64__)
    CHECK(f.neon);  // Advanced SIMD is part of every aarch64 CPU
#endif
    std::fprintf(stderr, "  avx2 %d fma %d f16c %d avx512f %d avx512_bf16 %d avx512_vnni %d "
                 "amx_bf16 %d amx_int8 %d amx usable %d neon %d dotprod %d i8mm %d: level %s\n",
                 f.avx2, f.fma, f.f16c, f.avx512f, f.avx512_bf16, f.avx512_vnni, f.amx_bf16,
                 f.amx_int8, f.amx_permitted, f.neon, f.neon_dotprod, f.i8mm,
                 pagedserve::cpu_isa_name(pagedserve::cpu_isa_supported()));
}

TEST(isa_level_follows_the_features) {
    const pagedserve::CpuFeatures& f = pagedserve::cpu_features();
    const CpuIsa level = pagedserve::cpu_isa_supported();
    CHECK(cpu_isa_covers(level, CpuIsa::kAvx2) == (f.avx2 && f.fma && f.f16c));
    if (level == CpuIsa::kAvx2Vnni) CHECK(f.avx_vnni);
    if (cpu_isa_covers(level, CpuIsa::kAvx512))
        CHECK(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq);
    if (cpu_isa_covers(level, CpuIsa::kAvx512Bf16)) CHECK(f.avx512_bf16);
    if (cpu_isa_covers(level, CpuIsa::kAmx)) CHECK(f.amx_permitted && f.amx_bf16 && f.amx_int8);
    CHECK(cpu_isa_covers(level, CpuIsa::kNeon) == f.neon);
    CHECK(cpu_isa_covers(level, CpuIsa::kNeonDotprod) == f.neon_dotprod);
    CHECK(cpu_isa_covers(level, CpuIsa::kNeonI8mm) == (f.neon_dotprod && f.i8mm));
    CHECK(pagedserve::cpu_isa() == level);  // nothing set yet
}

// The ladders: portable under both, each level covering only its own architecture's lower ones.
TEST(aarch64_levels_are_never_x86_ones) {
    CHECK(cpu_isa_covers(CpuIsa::kNeon, CpuIsa::kPortable));
    CHECK(cpu_isa_covers(CpuIsa::kNeonDotprod, CpuIsa::kNeon));
    CHECK(cpu_isa_covers(CpuIsa::kNeonI8mm, CpuIsa::kNeonDotprod));
    CHECK(!cpu_isa_covers(CpuIsa::kNeonDotprod, CpuIsa::kNeonI8mm));
    CHECK(!cpu_isa_covers(CpuIsa::kNeon, CpuIsa::kNeonDotprod));
    CHECK(cpu_isa_covers(CpuIsa::kAmx, CpuIsa::kAvx2));
    CHECK(!cpu_isa_covers(CpuIsa::kPortable, CpuIsa::kNeon));
    for (CpuIsa arm : {CpuIsa::kNeon, CpuIsa::kNeonDotprod, CpuIsa::kNeonI8mm}) {
        for (CpuIsa x86 : {CpuIsa::kAvx2, CpuIsa::kAvx2Vnni, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16,
                           CpuIsa::kAmx}) {
            CHECK(!cpu_isa_covers(arm, x86));
            CHECK(!cpu_isa_covers(x86, arm));
        }
    }
    int names = 0;  // every level has its own name
    for (CpuIsa a : pagedserve::kCpuIsas)
        for (CpuIsa b : pagedserve::kCpuIsas)
            names += std::string(pagedserve::cpu_isa_name(a)) == pagedserve::cpu_isa_name(b);
    CHECK(names == static_cast<int>(sizeof(pagedserve::kCpuIsas) / sizeof(CpuIsa)));
    CHECK(std::string(pagedserve::cpu_isa_name(CpuIsa::kNeonDotprod)) == "neon_dotprod");
    CHECK(std::string(pagedserve::cpu_isa_name(CpuIsa::kNeonI8mm)) == "neon_i8mm");
}

TEST(set_cpu_isa_is_capped_and_restorable) {
    const CpuIsa best = pagedserve::cpu_isa_supported();
    CHECK(pagedserve::set_cpu_isa(CpuIsa::kPortable) == CpuIsa::kPortable);
    CHECK(pagedserve::cpu_isa() == CpuIsa::kPortable);
    CHECK(!pagedserve::cpu_isa_at_least(CpuIsa::kAvx2));
    CHECK(!pagedserve::cpu_isa_at_least(CpuIsa::kNeon));
    const bool arm = cpu_isa_covers(best, CpuIsa::kNeon);
    // The top of this architecture's ladder is capped at what the CPU has; the other
    // architecture's levels give portable.
    CHECK(pagedserve::set_cpu_isa(arm ? CpuIsa::kNeonI8mm : CpuIsa::kAmx) == best);
    CHECK(pagedserve::cpu_isa() == best);
    CHECK(pagedserve::set_cpu_isa(arm ? CpuIsa::kAmx : CpuIsa::kNeonI8mm) == CpuIsa::kPortable);
    CHECK(pagedserve::set_cpu_isa(best) == best);
    CHECK(std::string(pagedserve::cpu_isa_name(CpuIsa::kAvx512Bf16)) == "avx512_bf16");
    // avx2_vnni on a CPU without AVX-VNNI (Zen 4, Ice Lake: AVX-512 but no VEX VNNI) is avx2.
    if (cpu_isa_covers(best, CpuIsa::kAvx2Vnni)) {
        const CpuIsa want = pagedserve::cpu_features().avx_vnni ? CpuIsa::kAvx2Vnni : CpuIsa::kAvx2;
        CHECK(pagedserve::set_cpu_isa(CpuIsa::kAvx2Vnni) == want);
        CHECK(pagedserve::set_cpu_isa(best) == best);
    }
    if (arm) {  // neon is always there; neon_dotprod (and i8mm) only where the CPU has SDOT
        CHECK(pagedserve::set_cpu_isa(CpuIsa::kNeon) == CpuIsa::kNeon);
        CHECK(pagedserve::cpu_isa_at_least(CpuIsa::kNeon));
        CHECK(!pagedserve::cpu_isa_at_least(CpuIsa::kNeonDotprod));
        CHECK(!pagedserve::cpu_isa_at_least(CpuIsa::kAvx2));
        CHECK(pagedserve::set_cpu_isa(best) == best);
    }
}

int main() {
    const int rc = check::run_all_tests();
    std::printf("cpu isa level: %s\n", pagedserve::cpu_isa_name(pagedserve::cpu_isa_supported()));
    return rc;
}
