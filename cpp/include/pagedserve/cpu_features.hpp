// The CPU's vector and matrix features, read once at run time (CPUID, the OS's saved register
// state and, on Linux, the kernel's grant of AMX tile state), and the ISA level the kernels run
// at: one build runs on any x86-64 CPU and each kernel family picks its best path at or below
// the active level (pagedserve/core/ops/cpu_features.py; --cpu-isa lowers it).
#pragma once

namespace pagedserve {

struct CpuFeatures {
    bool avx2 = false;          // CPUID.(7,0):EBX[5], and the OS saves YMM state (XCR0 1-2)
    bool fma = false;           // CPUID.1:ECX[12]
    bool f16c = false;          // CPUID.1:ECX[29]
    bool avx_vnni = false;      // CPUID.(7,1):EAX[4]: VEX vpdpbusd on 256-bit registers
    bool avx512f = false;       // CPUID.(7,0):EBX[16], and the OS saves ZMM state (XCR0 5-7)
    bool avx512bw = false;      // CPUID.(7,0):EBX[30]
    bool avx512vl = false;      // CPUID.(7,0):EBX[31]
    bool avx512dq = false;      // CPUID.(7,0):EBX[17]
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

// ISA levels, each one the level below plus:
//   avx2         AVX2 + FMA + F16C (x86-64-v3: Haswell, Zen 1-3 and later)
//   avx2_vnni    AVX-VNNI (VEX vpdpbusd on 256-bit registers: Alder Lake, Sapphire Rapids, Zen 5)
//                for the int8 kernel; an extension more than a level, as AVX-512 CPUs may lack
//                it (Zen 4, Ice Lake): it is used from this level up where the CPU has it, and
//                setting the level on a CPU without it gives avx2
//   avx512       AVX-512 F/BW/VL/DQ (Skylake-X and later); the int8 kernels also want VNNI
//   avx512_bf16  AVX512-BF16 (Zen 4, Sapphire Rapids and later)
//   amx          AMX-BF16 and AMX-INT8 tiles that Linux granted this process
// A kernel family runs its best path at or below cpu_isa(): its portable loops below avx2.
enum class CpuIsa : int {
    kPortable = 0,
    kAvx2 = 1,
    kAvx2Vnni = 2,
    kAvx512 = 3,
    kAvx512Bf16 = 4,
    kAmx = 5,
};

CpuIsa cpu_isa_supported();  // the best level this CPU and OS can run
CpuIsa cpu_isa();            // the active level: cpu_isa_supported() unless set lower
// Process-wide, like the thread count: kernels called after it run at min(level, supported).
// Returns the level now active.
CpuIsa set_cpu_isa(CpuIsa level);
// "portable", "avx2", "avx2_vnni", "avx512", "avx512_bf16", "amx"
const char* cpu_isa_name(CpuIsa level);

inline bool cpu_isa_at_least(CpuIsa level) {
    return static_cast<int>(cpu_isa()) >= static_cast<int>(level);
}

}  // namespace pagedserve
