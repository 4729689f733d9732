// The paths of the dense (bf16 / fp32) linear kernels, which dispatch.cpp chooses from by the
// active ISA level (linear.hpp's entries check the arguments first):
//   avx512_bf16 and up   avx512_bf16.cpp (VDPBF16PS; AMX-BF16 tiles from amx_from_rows, amx.hpp)
//   avx512               avx512.cpp      (bf16 widened to fp32 by shifts, fp32 FMA chains in 16
//                                         lanes: the AVX2 path's bits)
//   avx512 and up        avx512_f32.cpp  (the fp32 FMA chains in 16 lanes)
//   avx2 .. avx2_vnni    avx2.cpp        (bf16 widened to fp32 by shifts, fp32 FMA chains in 8
//                                         lanes; the fp32 kernel gives avx512_f32's bits)
//   below (portable, every aarch64 level): none, the layers run torch (linear_bf16_supported())
#pragma once

#include "cpu/arch.hpp"
#include "pagedserve/linear.hpp"

namespace pagedserve::linear_detail {

#if PAGEDSERVE_X86
void linear_bf16_avx512_bf16(const LinearArgs& args, int num_threads);
void linear_bf16_avx512(const LinearArgs& args, int num_threads);
void linear_f32_avx512(const LinearF32Args& args, int num_threads);
void linear_bf16_avx2(const LinearArgs& args, int num_threads);
void linear_f32_avx2(const LinearF32Args& args, int num_threads);
#endif

}  // namespace pagedserve::linear_detail
