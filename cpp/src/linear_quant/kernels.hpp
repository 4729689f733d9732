// The quantized linear kernel's paths, one file per ISA level, all on the same packed blocks
// (layout.hpp, pack.cpp) and int8 activation rows (activations.cpp), and all giving the same bits
// (int32 group sums, then fp32 FMAs over the groups in order; epilogue rounding from
// cpu/kernel_math.hpp). dispatch.cpp (quant_linear, linear_quant.hpp) picks one by cpu_isa():
//
//   level                     file              how the int8 dot products are summed
//   portable                  portable.cpp      plain loops
//   avx2 (or avx512, no VNNI) avx2.cpp          vpmaddubsw pairs in int16, vpmaddwd to int32
//                                               (8-bit: u - 128 by the sign trick, + 128 sum x)
//   avx2_vnni (AVX-VNNI)      avx2_vnni.cpp     VEX vpdpbusd on 256-bit registers (avx2.hpp's
//                                               kernel, as avx2.cpp, compiled for AVX-VNNI)
//   avx512 + AVX512-VNNI      avx512_vnni.cpp   vpdpbusd; bf16 outputs rounded by integer ops
//                                               (avx512_vnni.hpp's kernel, compiled without
//                                               AVX512-BF16)
//   avx512_bf16 (+ VNNI)      avx512_bf16.cpp   vpdpbusd; vcvtneps2bf16 (avx512_vnni.hpp's, for
//                                               AVX512-BF16); the dequant-bf16 option
//   amx                       amx.hpp           AMX-INT8 tiles (from amx_from_rows rows; run by
//                                               avx512_bf16.cpp)
//   neon (aarch64)            neon.cpp          SMULL / SMLAL in int16, SADALP to int32
//   neon_dotprod (SDOT)       neon_dotprod.cpp  SDOT (neon.hpp's kernel, as neon.cpp, compiled
//                                               for armv8.2-a+dotprod)
//   neon_i8mm (USMMLA)        neon_i8mm.cpp     USMMLA 2 x 2 blocks (neon.hpp's, for +i8mm)
//
// int16 activation rows (two int8 parts, layout.hpp) run on the int8 kernels' products, each
// part's sums kept apart: the VNNI kernel from level avx512 on CPUs with AVX512-VNNI (and its
// AMX-INT8 tiles, two products a group), else the AVX2 kernel from level avx2 (its AVX-VNNI copy
// at avx2_vnni; plain AVX2 takes 8-bit values on q whole instead, by vpmaddwd: half the sign
// trick's instructions), the NEON kernels from level neon on aarch64, else the portable loops;
// the same bits on every path.
//
// With float_activations (linear_quant.hpp) no int8 rows: x as fp32, weights dequantized in
// registers, one fp32 FMA chain over k per output:
//   portable (every CPU)      portable.cpp      std::fma loops (quant_linear_float_portable)
//   avx2 and every x86 level  avx2_float.cpp    8-lane FMAs, R rows x 16 or 32 columns a time
//   above it
//
// A new ISA level adds a file here with one entry below and one line in dispatch.cpp.
#pragma once

#include <cstdint>

#include "pagedserve/linear_quant.hpp"

namespace pagedserve::quant_detail {

// Each takes the int8 activation rows of quantize_activations (act_row_bytes apart) and writes
// args.out. The x86 vector entries are defined on x86 only, the NEON ones on aarch64 only.
void quant_linear_portable(const QuantLinearArgs& args, const std::uint8_t* acts,
                           std::int64_t act_row_bytes, int num_threads);
void quant_linear_avx2(const QuantLinearArgs& args, const std::uint8_t* acts,
                       std::int64_t act_row_bytes, int num_threads);
void quant_linear_avx2_vnni(const QuantLinearArgs& args, const std::uint8_t* acts,
                            std::int64_t act_row_bytes, int num_threads);
void quant_linear_neon(const QuantLinearArgs& args, const std::uint8_t* acts,
                       std::int64_t act_row_bytes, int num_threads);
void quant_linear_neon_dotprod(const QuantLinearArgs& args, const std::uint8_t* acts,
                               std::int64_t act_row_bytes, int num_threads);
void quant_linear_neon_i8mm(const QuantLinearArgs& args, const std::uint8_t* acts,
                            std::int64_t act_row_bytes, int num_threads);
void quant_linear_avx512_vnni(const QuantLinearArgs& args, const std::uint8_t* acts,
                              std::int64_t act_row_bytes, int num_threads);
// From level avx512_bf16: bf16 outputs by vcvtneps2bf16, AMX-INT8 tiles where amx_usable(true).
void quant_linear_avx512_bf16(const QuantLinearArgs& args, const std::uint8_t* acts,
                              std::int64_t act_row_bytes, int num_threads);
// float_activations: x as fp32 rows (bf16 widened by the caller), x_stride elements apart.
void quant_linear_float_portable(const QuantLinearArgs& args, const float* x,
                                 std::int64_t x_stride, int num_threads);
void quant_linear_float_avx2(const QuantLinearArgs& args, const float* x, std::int64_t x_stride,
                             int num_threads);
// The measured alternative to int8 activations: weights widened to bf16 in registers, AVX512-BF16
// dot products with bf16 x (sums: the per-row scratch, act_row_bytes apart).
void quant_linear_dequant_bf16(const QuantLinearArgs& args, std::uint8_t* scratch,
                               std::int64_t act_row_bytes, int num_threads);

}  // namespace pagedserve::quant_detail
