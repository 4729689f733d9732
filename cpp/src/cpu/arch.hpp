// PAGEDSERVE_X86: 1 when compiling for x86-64, else 0. The x86 SIMD kernels (AVX2 / AVX-512
// intrinsics, `target` attributes and pragmas, CPUID, AMX tile instructions) exist only there.
// PAGEDSERVE_AARCH64: 1 when compiling for aarch64, else 0: the NEON kernels (arm_neon.h, the
// dot-product extension under a `+dotprod` target) and the HWCAP read-out exist only there.
// Elsewhere the library builds its portable paths only and cpu_isa() is portable.
#pragma once

#if defined(__x86_64__)
#define PAGEDSERVE_X86 1
#else
#define PAGEDSERVE_X86 0
#endif

#if defined(__aarch64__)
#define PAGEDSERVE_AARCH64 1
#else
#define PAGEDSERVE_AARCH64 0
#endif

// PAGEDSERVE_TARGET_PRAGMA("avx2,fma"): `#pragma GCC target("avx2,fma")` from a macro's string, so
// one kernels.hpp, included by a file per ISA level, can put itself under that level's target.
#define PAGEDSERVE_PRAGMA(x) _Pragma(#x)
#define PAGEDSERVE_TARGET_PRAGMA(isa) PAGEDSERVE_PRAGMA(GCC target(isa))

// ISA level avx512's features (AVX-512 F/BW/VL/DQ and the AVX2 + FMA below them) as a target
// attribute: what a kernel that runs from that level (no AVX512-BF16) compiles for.
#define PAGEDSERVE_AVX512_TARGET \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
