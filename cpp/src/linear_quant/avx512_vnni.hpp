// The AVX512-VNNI kernel of the quantized linear layers (kernels.hpp has the table of paths): the
// packed blocks' u8 values times the int8 activations by vpdpbusd on the shared linear driver
// (linear/driver.hpp: threads over 32-column tiles, L2 panels, prefetch, the bias / residual /
// fp32-logits / SiLU-gated epilogue). Compiled twice, as avx2.hpp is: avx512_vnni.cpp for ISA
// level avx512 on CPUs with AVX512-VNNI (Cascade Lake, Ice Lake: no AVX512-BF16), bf16 outputs
// rounded by integer operations (bf16_bits); avx512_bf16.cpp from level avx512_bf16 up, bf16
// outputs by vcvtneps2bf16 (the same bits), with the dequant-bf16 alternative and AMX-INT8 tiles
// (amx.hpp). Each defines, before including this file:
//   PAGEDSERVE_LINEAR_TARGET  the driver's target attribute (driver.hpp): its level's features
//   PAGEDSERVE_QUANT_TARGET   the kernel's: the driver's features and avx512vnni
//   PAGEDSERVE_QUANT_HW_BF16  1: bf16 outputs by vcvtneps2bf16 (both targets have avx512bf16)
// so that no instruction beyond level avx512's reaches the copy a Cascade Lake runs (one would
// fault there). Everything below is in an anonymous namespace: each file has its own copy,
// compiled for its own target, and no inline function is one linker symbol for both. The
// always_inline functions (sweep, the groups, layout.hpp's avx512f helpers) are called only from
// functions whose target has all of theirs, as GCC requires.
#pragma once

#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // AVX-512 intrinsics: elsewhere quant_linear never takes this path
#if !defined(PAGEDSERVE_LINEAR_TARGET) || !defined(PAGEDSERVE_QUANT_TARGET) || \
    !defined(PAGEDSERVE_QUANT_HW_BF16)
#error "define PAGEDSERVE_LINEAR_TARGET, PAGEDSERVE_QUANT_TARGET and PAGEDSERVE_QUANT_HW_BF16 first"
#endif
#include <cstring>

#include "linear/driver.hpp"
#include "linear_quant/kernels.hpp"
#include "linear_quant/layout.hpp"

// The sweep and its groups must inline into the micro-tile (their accumulators stay in
// registers): with five formats x two dtypes GCC's unit-growth limit left some out of line, and
// a batched Q4_1 product ran 5-27 % slower through memory.
#define PAGEDSERVE_QUANT_INLINE inline __attribute__((always_inline))

namespace pagedserve::quant_detail {
namespace {

using namespace linear_detail;

// The driver's view of one product: x's dtype T (bf16 bits or fp32), weights of kBits bits in
// groups of kGroup features.
template <typename T>
struct QuantArgs {
    const T* x = nullptr;
    std::int64_t x_stride = 0;
    const std::uint8_t* packed = nullptr;
    const T* bias = nullptr;
    const T* residual = nullptr;
    std::int64_t residual_stride = 0;
    void* out = nullptr;
    std::int64_t out_stride = 0;
    bool out_float32 = false;
    std::int64_t m = 0, n = 0, k = 0, gated_width = 0;
    const std::uint8_t* acts = nullptr;  // quantize_activations of x (or dequant_bf16's sums)
    std::int64_t act_row_bytes = 0;
};

// The u8 values of step s (4 features x 16 columns) of half tile h of a packed block: vpdpbusd's
// unsigned operand.
template <int kBits>
PAGEDSERVE_QUANT_TARGET inline __m512i step_values(const std::uint8_t* block, std::int64_t s,
                                                   std::int64_t h) {
    if constexpr (kBits == 8) return _mm512_loadu_si512(block + (s * 2 + h) * 64);
    const __m512i v = _mm512_loadu_si512(block + ((s % 4) * 2 + h) * 64);
    return _mm512_and_si512(s < 4 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
}

// Group g of block b for rows R0 .. R - 1 of the micro-tile: G::group over up to G::kGroupRows
// rows at a time (4 int8 rows, 2 int16 ones: 8 int32 sums), so that each activation broadcast
// feeds both half tiles within the 32 registers.
template <typename G, int R, int R0 = 0, typename Args>
PAGEDSERVE_QUANT_TARGET PAGEDSERVE_QUANT_INLINE void groups(const Args& a, std::int64_t row0,
                                                            std::int64_t b, std::int64_t g,
                                                            const std::uint8_t* block,
                                                            __m512 (&acc)[R][2]) {
    constexpr int Q = R - R0 < G::kGroupRows ? R - R0 : G::kGroupRows;
    G::template group<Q, R>(a, row0, R0, b, g, block, acc);
    if constexpr (R0 + Q < R) groups<G, R, R0 + Q>(a, row0, b, g, block, acc);
}

// Rows row0 .. row0 + R - 1 times one tile, for either kernel G: accumulators zeroed, then per
// block (prefetching a block's worth of the next panel) and group, the groups above.
template <typename G, int R, typename Args>
PAGEDSERVE_QUANT_TARGET PAGEDSERVE_QUANT_INLINE void sweep(const Args& a, std::int64_t row0,
                                                           const std::uint8_t* w,
                                                           Prefetch prefetch, __m512 (&acc)[R][2]) {
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const std::int64_t blocks = a.k / kBlockK, block_bytes = G::kFormat.block_bytes();
    std::int64_t line = 0;
    for (std::int64_t b = 0; b < blocks; ++b) {
        for (std::int64_t i = 0; i <= block_bytes / 64 && line < prefetch.lines; ++i, ++line)
            _mm_prefetch(prefetch.begin + 64 * line, _MM_HINT_T1);
        const std::uint8_t* block = w + b * block_bytes;
        for (std::int64_t g = 0; g < G::kFormat.groups(); ++g) groups<G, R>(a, row0, b, g, block, acc);
    }
}

// The groups of the dequant-bf16 alternative (AVX512-BF16 dot products with bf16 x): defined by
// avx512_bf16.cpp, the only file that instantiates a kernel with kDequantBf16.
template <int kBits, int kGroup, bool kHalf>
struct QuantBf16;

// kActParts: 1 for int8 activation rows, 2 for int16 ones (QuantLinearArgs::int16_activations:
// each row's hi and lo int8 parts, q = 255 hi + lo, layout.hpp). A step's weight registers meet
// both parts, whose int32 sums are kept apart and folded as 255 isum(hi) + isum(lo), exact in
// int32 (|.| <= 255 x 32 x 255 x 127 < 2^31): the AVX2 kernel's int16 fold (avx2.hpp), so its
// bits (AMX-INT8 tiles: two tile products, folded alike; amx.hpp).
template <typename T, int kBits, int kGroup, bool kHalf, bool kDequantBf16 = false,
          int kActParts = 1>
struct QuantKernel {
    static_assert(!kDequantBf16 || PAGEDSERVE_QUANT_HW_BF16, "dequant-bf16 needs AVX512-BF16");
    static_assert(!kDequantBf16 || kActParts == 1, "dequant-bf16 takes bf16 x, not int16 rows");
    using Args = QuantArgs<T>;
    using Weight = std::uint8_t;
    static constexpr Format kFormat{kBits, kGroup, kHalf};
    static constexpr bool kDequant = kDequantBf16;
    static constexpr int kParts = kActParts;
    static constexpr int kGroupRows = 4 / kActParts;  // rows per group call: 8 int32 sums
    static constexpr std::int64_t kSteps = kGroup / 4;  // vpdpbusd steps per group

    static std::int64_t tile_elements(std::int64_t k) {
        return quant_detail::tile_bytes(kFormat, k);
    }

    // Rows row0 .. row0 + R - 1 times one tile: per block and group, up to 4 rows at a time
    // (each activation broadcast feeds both half tiles: 8 int32 sums, 16 fp32 accumulators and
    // the weights fit the 32 registers), the int32 sums then folded into the accumulators.
    template <int R>
    PAGEDSERVE_QUANT_TARGET static void product(const Args& a, std::int64_t row0,
                                                const std::uint8_t* w, Prefetch prefetch,
                                                __m512 (&acc)[R][2]) {
        if constexpr (kDequantBf16) {
            sweep<QuantBf16<kBits, kGroup, kHalf>, R>(a, row0, w, prefetch, acc);
        } else {
            sweep<QuantKernel, R>(a, row0, w, prefetch, acc);
        }
    }

    // acc[r] += scale * d * sum(u q) + min * d * sum(q) over group g of block b, for rows
    // r0 .. r0 + Q - 1 of the micro-tile, both half tiles.
    template <int Q, int R>
    PAGEDSERVE_QUANT_TARGET PAGEDSERVE_QUANT_INLINE static void group(
        const Args& a, std::int64_t row0, int r0, std::int64_t b, std::int64_t g,
        const std::uint8_t* block, __m512 (&acc)[R][2]) {
        constexpr int P = kActParts;
        const std::uint8_t* act[Q];
        for (int r = 0; r < Q; ++r) act[r] = a.acts + (row0 + r0 + r) * a.act_row_bytes;
        __m512i isum[Q][P][2];
        for (int r = 0; r < Q; ++r)
            for (int p = 0; p < P; ++p) isum[r][p][0] = isum[r][p][1] = _mm512_setzero_si512();
        for (std::int64_t s = g * kSteps; s < (g + 1) * kSteps; ++s) {
            const __m512i w0 = step_values<kBits>(block, s, 0);
            const __m512i w1 = step_values<kBits>(block, s, 1);
            for (int r = 0; r < Q; ++r) {
                for (int p = 0; p < P; ++p) {  // part p of row r: k bytes after part p - 1
                    std::int32_t x4;
                    std::memcpy(&x4, act[r] + p * a.k + kBlockK * b + 4 * s, sizeof(x4));
                    const __m512i xv = _mm512_set1_epi32(x4);
                    isum[r][p][0] = _mm512_dpbusd_epi32(isum[r][p][0], w0, xv);
                    isum[r][p][1] = _mm512_dpbusd_epi32(isum[r][p][1], w1, xv);
                }
            }
        }
        for (int h = 0; h < 2; ++h) {
            const quant_detail::HalfScales sc =
                quant_detail::half_scales<kHalf>(kFormat, block, g, h);
            for (int r = 0; r < Q; ++r) {
                __m512i sum = isum[r][0][h];
                if constexpr (P == 2) {  // 255 isum(hi) + isum(lo)
                    sum = _mm512_sub_epi32(_mm512_slli_epi32(sum, 8), sum);
                    sum = _mm512_add_epi32(sum, isum[r][P - 1][h]);
                }
                const ActivationRow row(act[r], a.k, P);
                acc[r0 + r][h] = quant_detail::fold_group(acc[r0 + r][h], sum, sc, row.d[b],
                                                          row.group_sum(kFormat, b, g));
            }
        }
    }

    PAGEDSERVE_LINEAR_TARGET static __m512 load(const T* p, __mmask16 mask) {
        if constexpr (sizeof(T) == 4) {
            return _mm512_maskz_loadu_ps(mask, p);
        } else {
            const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
            return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
        }
    }

    PAGEDSERVE_LINEAR_TARGET static void store_row(const Args& a, std::int64_t row,
                                                   std::int64_t col, __m512 v, __mmask16 mask) {
        if (sizeof(T) == 4 || a.out_float32) {
            _mm512_mask_storeu_ps(static_cast<float*>(a.out) + row * a.out_stride + col, mask, v);
        } else {
#if PAGEDSERVE_QUANT_HW_BF16
            const __m256i bits = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
#else
            const __m256i bits = bf16_bits(v);  // vcvtneps2bf16's bits by integer operations
#endif
            auto* out = static_cast<std::uint16_t*>(a.out) + row * a.out_stride + col;
            _mm256_mask_storeu_epi16(out, mask, bits);
        }
    }
};

template <typename T>
QuantArgs<T> typed(const QuantLinearArgs& a, const std::uint8_t* acts, std::int64_t row_bytes) {
    QuantArgs<T> t;
    t.x = static_cast<const T*>(a.x), t.x_stride = a.x_stride, t.packed = a.packed;
    t.bias = static_cast<const T*>(a.bias), t.residual = static_cast<const T*>(a.residual);
    t.residual_stride = a.residual_stride, t.out = a.out, t.out_stride = a.out_stride;
    t.out_float32 = a.out_float32, t.m = a.m, t.n = a.n, t.k = a.k;
    t.gated_width = a.gated_width, t.acts = acts, t.act_row_bytes = row_bytes;
    return t;
}

// run(K{}) for the kernel K of a's weight format, x of dtype T, P activation parts.
template <typename T, bool kDequantBf16 = false, int P = 1, typename Run>
void with_format(const QuantLinearArgs& a, Run run) {
    const Format f = quant_detail::format_of(a.ggml_type);
    if (f.bits == 4 && f.half_scales)  // Q4_0, Q4_1
        return run(QuantKernel<T, 4, 32, true, kDequantBf16, P>{});
    if (f.bits == 4)  // Q4_K
        return run(QuantKernel<T, 4, 32, false, kDequantBf16, P>{});
    if (f.half_scales)  // Q8_0
        return run(QuantKernel<T, 8, 32, true, kDequantBf16, P>{});
    if (f.group_size == 32)  // Q5_K
        return run(QuantKernel<T, 8, 32, false, kDequantBf16, P>{});
    run(QuantKernel<T, 8, 16, false, kDequantBf16, P>{});  // Q6_K
}

// with_format for a's activation rows: int8, or int16 (a.int16_activations; never dequant-bf16).
template <typename T, bool kDequantBf16 = false, typename Run>
void with_kernel(const QuantLinearArgs& a, Run run) {
    if constexpr (!kDequantBf16)
        if (a.int16_activations) return with_format<T, false, 2>(a, run);
    with_format<T, kDequantBf16>(a, run);
}

}  // namespace
}  // namespace pagedserve::quant_detail
#endif  // PAGEDSERVE_X86
