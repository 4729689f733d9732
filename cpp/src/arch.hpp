// PAGEDSERVE_X86: 1 when compiling for x86-64, else 0. The SIMD kernels (AVX2 / AVX-512
// intrinsics, `target` attributes and pragmas, CPUID, AMX tile instructions) exist only there;
// elsewhere (aarch64) the library builds its portable paths only and cpu_isa() is portable.
#pragma once

#if defined(__x86_64__)
#define PAGEDSERVE_X86 1
#else
#define PAGEDSERVE_X86 0
#endif
