// The CPU's matrix features, read once at run time (CPUID and, on Linux, the kernel's grant of
// AMX tile state), so that one build runs on Zen 4 and on Intel AMX CPUs and says which linear
// path runs where (pagedserve/core/ops/cpu_features.py).
#pragma once

namespace pagedserve {

struct CpuFeatures {
    bool avx512f = false;       // CPUID.(7,0):EBX[16], and the OS saves ZMM state (XCR0 5-7)
    bool avx512_bf16 = false;   // CPUID.(7,1):EAX[5]
    bool avx512_vnni = false;   // CPUID.(7,0):ECX[11]
    bool amx_bf16 = false;      // CPUID.(7,0):EDX[22]
    bool amx_tile = false;      // CPUID.(7,0):EDX[24]
    bool amx_int8 = false;      // CPUID.(7,0):EDX[25]
    bool amx_os_enabled = false;  // XCR0 bits 17 and 18 (XTILECFG, XTILEDATA) set by the OS
    // Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) succeeded, so this process may
    // use the tiles (false where the CPU has no AMX, the kernel is older than 5.16 or refuses).
    bool amx_permitted = false;
};

// Read once (the first call asks the kernel for AMX tile data where the CPU has AMX), then
// cached; thread-safe.
const CpuFeatures& cpu_features();

}  // namespace pagedserve
