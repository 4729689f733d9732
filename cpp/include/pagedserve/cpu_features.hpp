// The CPU's vector and matrix features, read once at run time (x86-64: CPUID, the OS's saved
// register state and, on Linux, the kernel's grant of AMX tile state; aarch64: Linux's hardware
// capability bits), and the ISA level the kernels run at: one build runs on any x86-64 (or
// aarch64) CPU and each kernel family picks its best path at or below the active level
// (pagedserve/core/ops/cpu_features.py; --cpu-isa lowers it).
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
    // aarch64 (Linux getauxval; false elsewhere):
    bool neon = false;          // AT_HWCAP ASIMD: Armv8 Advanced SIMD, on every aarch64 CPU
    bool neon_dotprod = false;  // AT_HWCAP ASIMDDP: SDOT / UDOT (Armv8.2 dot product, 8.4 on)
    bool i8mm = false;          // AT_HWCAP2 I8MM: USDOT / USMMLA (Armv8.6 int8 matrix multiply)
};

// Read once (the first call asks the kernel for AMX tile data where the CPU has AMX), then
// cached; thread-safe.
const CpuFeatures& cpu_features();

// ISA levels, in two ladders (one per architecture) that share only portable. x86-64, each one
// the level below plus:
//   avx2         AVX2 + FMA + F16C (x86-64-v3: Haswell, Zen 1-3 and later)
//   avx2_vnni    AVX-VNNI (VEX vpdpbusd on 256-bit registers: Alder Lake, Sapphire Rapids, Zen 5)
//                for the int8 kernel; an extension more than a level, as AVX-512 CPUs may lack
//                it (Zen 4, Ice Lake): it is used from this level up where the CPU has it, and
//                setting the level on a CPU without it gives avx2
//   avx512       AVX-512 F/BW/VL/DQ (Skylake-X and later); the int8 kernels also want VNNI
//   avx512_bf16  AVX512-BF16 (Zen 4, Sapphire Rapids and later)
//   amx          AMX-BF16 and AMX-INT8 tiles that Linux granted this process
// aarch64:
//   neon         Armv8 Advanced SIMD (every aarch64 CPU: Cortex-A53 and up)
//   neon_dotprod the SDOT / UDOT dot products (Armv8.2 option: Neoverse N1 / Graviton 2 and
//                later, Apple M1 and later, Cortex-A55 / A76 and later)
//   neon_i8mm    the int8 matrix multiplies USMMLA / USDOT (Armv8.6; Neoverse V1 / Graviton 3
//                and later, Apple M2 and later), for the int8 kernel
// A kernel family runs its best path at or below cpu_isa(): its portable loops below avx2 (or
// neon). The enumerators carry their architecture in bits 8 and up and their rank below, so an
// aarch64 level never compares as an x86 one: levels are ordered only by cpu_isa_covers (the
// relational operators are deleted below), and cpu_isa_at_least(kAvx2) is false at every
// aarch64 level.
enum class CpuIsa : int {
    kPortable = 0,
    kAvx2 = 1,
    kAvx2Vnni = 2,
    kAvx512 = 3,
    kAvx512Bf16 = 4,
    kAmx = 5,
    kNeon = 0x101,
    kNeonDotprod = 0x102,
    kNeonI8mm = 0x103,
};

// Every level, each ladder lowest first (portable, the x86-64 ones, the aarch64 ones).
inline constexpr CpuIsa kCpuIsas[] = {CpuIsa::kPortable, CpuIsa::kAvx2,       CpuIsa::kAvx2Vnni,
                                      CpuIsa::kAvx512,   CpuIsa::kAvx512Bf16, CpuIsa::kAmx,
                                      CpuIsa::kNeon,     CpuIsa::kNeonDotprod, CpuIsa::kNeonI8mm};

// 0: portable and the x86-64 levels, 1: the aarch64 ones. Rank: the position in the ladder.
constexpr int cpu_isa_arch(CpuIsa level) { return static_cast<int>(level) >> 8; }
constexpr int cpu_isa_rank(CpuIsa level) { return static_cast<int>(level) & 0xff; }

// `have` includes `want`: want is portable, or of have's architecture and no higher.
constexpr bool cpu_isa_covers(CpuIsa have, CpuIsa want) {
    return cpu_isa_rank(want) == 0 ||
           (cpu_isa_arch(have) == cpu_isa_arch(want) && cpu_isa_rank(have) >= cpu_isa_rank(want));
}

// No ordering but cpu_isa_covers: `level >= CpuIsa::kAvx2` would hold for neon.
bool operator<(CpuIsa, CpuIsa) = delete;
bool operator<=(CpuIsa, CpuIsa) = delete;
bool operator>(CpuIsa, CpuIsa) = delete;
bool operator>=(CpuIsa, CpuIsa) = delete;

CpuIsa cpu_isa_supported();  // the best level this CPU and OS can run
CpuIsa cpu_isa();            // the active level: cpu_isa_supported() unless set lower
// Process-wide, like the thread count: kernels called after it run at the best level this CPU
// has that `level` covers (a level of the other architecture gives portable). Returns the
// level now active.
CpuIsa set_cpu_isa(CpuIsa level);
// "portable", "avx2", "avx2_vnni", "avx512", "avx512_bf16", "amx", "neon", "neon_dotprod",
// "neon_i8mm"
const char* cpu_isa_name(CpuIsa level);

inline bool cpu_isa_at_least(CpuIsa level) { return cpu_isa_covers(cpu_isa(), level); }

}  // namespace pagedserve
