// CPUID and XGETBV by hand (cpuid.h's __get_cpuid_count, no inline asm beyond xgetbv), plus the
// Linux AMX permission request; on aarch64, Linux's hardware capability bits (getauxval); and
// the active ISA level. Elsewhere every feature is false and the level is portable.
#include "pagedserve/cpu_features.hpp"

#include <atomic>
#include <cstdint>

#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // CPUID exists only on x86
#include <cpuid.h>
#endif

#if defined(__linux__) && PAGEDSERVE_X86  // arch_prctl's AMX permission request
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__linux__) && PAGEDSERVE_AARCH64  // AT_HWCAP, AT_HWCAP2
#include <sys/auxv.h>
#endif

namespace pagedserve {
namespace {

#if PAGEDSERVE_X86  // CPUID and XGETBV: elsewhere every feature is false (level portable)
struct Regs {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Regs cpuid(unsigned leaf, unsigned subleaf) {
    Regs r;
    if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) return Regs{};
    return r;
}

bool bit(unsigned value, int index) { return (value >> index) & 1u; }

// XCR0: which register states the OS saves on a context switch (0 without OSXSAVE).
std::uint64_t xcr0() {
    if (!bit(cpuid(1, 0).ecx, 27)) return 0;  // OSXSAVE
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

// Linux >= 5.16 hands out AMX tile data per process on request (arch_prctl, not in glibc's
// headers everywhere, hence the raw numbers: ARCH_REQ_XCOMP_PERM 0x1023, XFEATURE_XTILEDATA 18).
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
}

CpuFeatures detect() {
    CpuFeatures f;
    if (cpuid(0, 0).eax < 7) return f;
    const Regs l1 = cpuid(1, 0), l7 = cpuid(7, 0), l7s1 = cpuid(7, 1);
    const std::uint64_t xcr = xcr0();
    const bool ymm_saved = (xcr & 0x6) == 0x6;    // SSE, AVX
    const bool zmm_saved = (xcr & 0xE6) == 0xE6;  // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
    f.avx2 = bit(l7.ebx, 5) && ymm_saved;
    f.fma = f.avx2 && bit(l1.ecx, 12);
    f.f16c = f.avx2 && bit(l1.ecx, 29);
    f.avx_vnni = f.avx2 && bit(l7s1.eax, 4);
    f.avx512f = bit(l7.ebx, 16) && zmm_saved;
    f.avx512bw = f.avx512f && bit(l7.ebx, 30);
    f.avx512vl = f.avx512f && bit(l7.ebx, 31);
    f.avx512dq = f.avx512f && bit(l7.ebx, 17);
    f.avx512_vnni = f.avx512f && bit(l7.ecx, 11);
    f.avx512_bf16 = f.avx512f && bit(l7s1.eax, 5);
    f.amx_bf16 = bit(l7.edx, 22);
    f.amx_tile = bit(l7.edx, 24);
    f.amx_int8 = bit(l7.edx, 25);
    f.amx_os_enabled = f.amx_tile && (xcr & (3ull << 17)) == (3ull << 17);
    f.amx_permitted = f.amx_os_enabled && request_amx_permission();
    return f;
}
#elif PAGEDSERVE_AARCH64
// Linux's arm64 hwcap bits (the kernel's uapi asm/hwcap.h, numbered here as the kernel's ABI
// fixes them, since older cross headers lack the newer names): HWCAP_ASIMD 1 << 1, HWCAP_ASIMDDP
// 1 << 20, HWCAP2_I8MM 1 << 13. Without getauxval (not Linux) Advanced SIMD alone is assumed:
// every aarch64 CPU has it, and the compiler's own baseline says whether it may use dotprod.
CpuFeatures detect() {
    CpuFeatures f;
#if defined(__linux__)
    const unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
    f.neon = (hwcap >> 1) & 1ul;
    f.neon_dotprod = f.neon && ((hwcap >> 20) & 1ul);
    f.i8mm = f.neon && ((hwcap2 >> 13) & 1ul);
#else
    f.neon = true;
#if defined(__ARM_FEATURE_DOTPROD)
    f.neon_dotprod = true;
#endif
#endif
    return f;
}
#else
CpuFeatures detect() { return CpuFeatures{}; }
#endif

CpuIsa best_level(const CpuFeatures& f) {
    if (f.neon) {  // neon_i8mm sits on neon_dotprod's ladder: it takes both extensions
        if (!f.neon_dotprod) return CpuIsa::kNeon;
        return f.i8mm ? CpuIsa::kNeonI8mm : CpuIsa::kNeonDotprod;
    }
    if (!(f.avx2 && f.fma && f.f16c)) return CpuIsa::kPortable;
    if (!(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq))
        return f.avx_vnni ? CpuIsa::kAvx2Vnni : CpuIsa::kAvx2;
    if (!f.avx512_bf16) return CpuIsa::kAvx512;
    if (!(f.amx_bf16 && f.amx_int8 && f.amx_permitted)) return CpuIsa::kAvx512Bf16;
    return CpuIsa::kAmx;
}

std::atomic<int>& active_level() {
    static std::atomic<int> level{static_cast<int>(cpu_isa_supported())};
    return level;
}

}  // namespace

const CpuFeatures& cpu_features() {
    static const CpuFeatures features = detect();  // C++11: initialised once, thread-safe
    return features;
}

CpuIsa cpu_isa_supported() {
    static const CpuIsa level = best_level(cpu_features());
    return level;
}

CpuIsa cpu_isa() { return static_cast<CpuIsa>(active_level().load(std::memory_order_relaxed)); }

CpuIsa set_cpu_isa(CpuIsa level) {
    const CpuIsa best = cpu_isa_supported();
    CpuIsa capped = level;
    if (cpu_isa_arch(level) != cpu_isa_arch(best)) {
        capped = CpuIsa::kPortable;  // the other architecture's level: none of it runs here
    } else if (!cpu_isa_covers(best, level)) {
        capped = best;
    }
    if (capped == CpuIsa::kAvx2Vnni && !cpu_features().avx_vnni)
        capped = CpuIsa::kAvx2;  // an AVX-512 CPU without AVX-VNNI
    active_level().store(static_cast<int>(capped), std::memory_order_relaxed);
    return capped;
}

const char* cpu_isa_name(CpuIsa level) {
    switch (level) {
        case CpuIsa::kPortable: return "portable";
        case CpuIsa::kAvx2: return "avx2";
        case CpuIsa::kAvx2Vnni: return "avx2_vnni";
        case CpuIsa::kAvx512: return "avx512";
        case CpuIsa::kAvx512Bf16: return "avx512_bf16";
        case CpuIsa::kAmx: return "amx";
        case CpuIsa::kNeon: return "neon";
        case CpuIsa::kNeonDotprod: return "neon_dotprod";
        case CpuIsa::kNeonI8mm: return "neon_i8mm";
    }
    return "portable";
}

}  // namespace pagedserve
