// The float-activation path of the quantized linear kernel (QuantLinearArgs::float_activations,
// kernels.hpp) at ISA level avx2 and every x86 level above it: AVX2 + FMA + F16C only, so it runs
// on every CPU from that level (no AVX-512 instruction may reach this file's object).
//
// x rows come as fp32 (dispatch.cpp widens bf16). Per 4-feature step the packed bytes of 8
// columns are one 32-byte load (layout.hpp: lane = column, byte = feature); each feature's
// values are a shift and mask of it, converted (vcvtdq2ps) and dequantized in the register,
// w = fma(float(u), scale, min) (exact: linear_quant.hpp), then every row of the micro-tile takes
// acc = fma(broadcast x[e], w, acc). The weight is dequantized once per micro-tile and used by
// its R rows; one call's rows go R at a time over an L2-resident panel of tiles (the shared
// driver, linear/driver.hpp), the weights streamed from memory once per 256-row chunk.
//
// Micro-tiles: kRows (4) rows x 16 columns (two passes over a tile), 8 accumulators; a call's last
// 1-2 rows take the whole 32 columns in one pass (4 or 8 accumulators: at 1 row the 4 chains and
// the dequantization keep the FMA units busy while the weight streams).
//
// Batch invariance: every output element is one fp32 FMA chain over the k features in order,
// the same operations whatever R, the column pass or the thread: a row's bits do not depend on
// the call's other rows. The epilogue is the int8 path's (avx2_epilogue.hpp).
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // AVX2 intrinsics: elsewhere quant_linear never takes this path
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#define PAGEDSERVE_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#include "linear/driver.hpp"
#include "linear_quant/avx2_epilogue.hpp"
#include "linear_quant/kernels.hpp"
#include "linear_quant/layout.hpp"

#define PAGEDSERVE_FLOAT_INLINE inline __attribute__((always_inline))

namespace pagedserve::quant_detail {
namespace {

using linear_detail::Prefetch;

// The driver's view of one product (linear/driver.hpp's K::Args).
struct FloatArgs {
    const QuantLinearArgs* q = nullptr;
    const std::uint8_t* packed = nullptr;
    std::int64_t m = 0, n = 0, k = 0;
    const float* x = nullptr;  // fp32 rows, x_stride elements apart
    std::int64_t x_stride = 0;
};

template <int kBits, int kGroup, bool kHalf>
struct FloatKernel {
    using Args = FloatArgs;
    using Weight = std::uint8_t;
    static constexpr Format kFormat{kBits, kGroup, kHalf};
    static constexpr int kRows = 4;  // micro-tile rows at 16 columns: 8 accumulators
    static_assert(kBits == 8 || kGroup == kBlockK, "4-bit formats have one group per block");

    static std::int64_t tile_elements(std::int64_t k) { return tile_bytes(kFormat, k); }

    // Columns per micro-tile, in 8-lane vectors: the whole tile for 1-2 rows, else half.
    static constexpr int columns(int rows) { return rows <= 2 ? 4 : 2; }

    PAGEDSERVE_AVX2_TARGET PAGEDSERVE_FLOAT_INLINE static __m256 scales8(const std::uint8_t* at,
                                                                        std::int64_t lane0) {
        if constexpr (kHalf) {
            return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 2 * lane0)));
        } else {
            return _mm256_loadu_ps(reinterpret_cast<const float*>(at) + lane0);
        }
    }

    // Feature e (of the call) for rows x[r]: vectors' values u = (raw >> shift) & mask,
    // dequantized, then one FMA per row and vector.
    template <int R, int C, int kShift>
    PAGEDSERVE_AVX2_TARGET PAGEDSERVE_FLOAT_INLINE static void feature(
        const float* const (&x)[R], std::int64_t e, const __m256i (&raw)[C],
        const __m256 (&scale)[C], const __m256 (&min)[C], __m256 (&acc)[R][C]) {
        __m256 w[C];
        for (int c = 0; c < C; ++c) {
            __m256i u = kShift ? _mm256_srli_epi32(raw[c], kShift) : raw[c];
            if constexpr (kShift + kBits < 32)
                u = _mm256_and_si256(u, _mm256_set1_epi32((1 << kBits) - 1));
            w[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), scale[c], min[c]);
        }
        for (int r = 0; r < R; ++r) {
            const __m256 xv = _mm256_broadcast_ss(x[r] + e);
            for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, w[c], acc[r][c]);
        }
    }

    // The 4 features of step s (bytes j = 0..3 of each lane, at bit offset `nibble`).
    template <int R, int C, int kNibble>
    PAGEDSERVE_AVX2_TARGET PAGEDSERVE_FLOAT_INLINE static void step(
        const float* const (&x)[R], std::int64_t e0, const std::uint8_t* block, int s, int v0,
        const __m256 (&scale)[C], const __m256 (&min)[C], __m256 (&acc)[R][C]) {
        __m256i raw[C];
        for (int c = 0; c < C; ++c) {
            const int v = v0 + c;  // 8-column vector v: half tile v / 2, its columns 8 (v % 2) ..
            raw[c] = _mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(block + (s * 2 + v / 2) * 64 + 32 * (v % 2)));
        }
        feature<R, C, kNibble>(x, e0, raw, scale, min, acc);
        feature<R, C, kNibble + 8>(x, e0 + 1, raw, scale, min, acc);
        feature<R, C, kNibble + 16>(x, e0 + 2, raw, scale, min, acc);
        feature<R, C, kNibble + 24>(x, e0 + 3, raw, scale, min, acc);
    }

    // Group g of block b (features 32 b + ...) in order, vectors v0 .. v0 + C - 1.
    template <int R, int C>
    PAGEDSERVE_AVX2_TARGET PAGEDSERVE_FLOAT_INLINE static void group(
        const float* const (&x)[R], const std::uint8_t* block, std::int64_t b, int g, int v0,
        __m256 (&acc)[R][C]) {
        __m256 scale[C], min[C];
        for (int c = 0; c < C; ++c) {
            scale[c] = scales8(block + kFormat.scales_at(0, g), 8 * (v0 + c));
            min[c] = scales8(block + kFormat.scales_at(1, g), 8 * (v0 + c));
        }
        const std::int64_t e = kBlockK * b;
        if constexpr (kBits == 4) {  // low nibbles: features 4 s + j, high: 16 + 4 s + j
#pragma GCC unroll 4
            for (int s = 0; s < 4; ++s) step<R, C, 0>(x, e + 4 * s, block, s, v0, scale, min, acc);
#pragma GCC unroll 4
            for (int s = 0; s < 4; ++s)
                step<R, C, 4>(x, e + 16 + 4 * s, block, s, v0, scale, min, acc);
        } else {
#pragma GCC unroll 8
            for (int s = g * kGroup / 4; s < (g + 1) * kGroup / 4; ++s)
                step<R, C, 0>(x, e + 4 * s, block, s, v0, scale, min, acc);
        }
    }

    // Rows row0 .. row0 + R - 1 times one tile: out[r][column] over every feature in order.
    template <int R>
    PAGEDSERVE_AVX2_TARGET static void product(const Args& a, std::int64_t row0,
                                               const std::uint8_t* w, Prefetch prefetch,
                                               float (&out)[R][32]) {
        constexpr int C = columns(R);
        const float* x[R];
        for (int r = 0; r < R; ++r) x[r] = a.x + (row0 + r) * a.x_stride;
        const std::int64_t blocks = a.k / kBlockK, block_bytes = kFormat.block_bytes();
        constexpr int passes = 4 / C;
        for (int p = 0; p < passes; ++p) {
            __m256 acc[R][C];
            for (int r = 0; r < R; ++r)
                for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
            std::int64_t line = p * prefetch.lines / passes;
            const std::int64_t lines_end = (p + 1) * prefetch.lines / passes;
            for (std::int64_t b = 0; b < blocks; ++b) {
                for (std::int64_t i = 0; i <= block_bytes / 128 && line < lines_end; ++i, ++line)
                    _mm_prefetch(prefetch.begin + 64 * line, _MM_HINT_T1);
                const std::uint8_t* block = w + b * block_bytes;
                for (int g = 0; g < kFormat.groups(); ++g) group<R, C>(x, block, b, g, C * p, acc);
            }
            for (int r = 0; r < R; ++r)
                for (int c = 0; c < C; ++c) _mm256_storeu_ps(out[r] + 8 * (C * p + c), acc[r][c]);
        }
    }
};

template <typename K>
void run(const FloatArgs& a, int num_threads) {
    linear_detail::run_linear<K, Avx2Items<K>>(a, num_threads);  // avx2_epilogue.hpp
}

}  // namespace

void quant_linear_float_avx2(const QuantLinearArgs& q, const float* x, std::int64_t x_stride,
                             int num_threads) {
    FloatArgs a;
    a.q = &q, a.packed = q.packed, a.m = q.m, a.n = q.n, a.k = q.k;
    a.x = x, a.x_stride = x_stride;
    const Format f = format_of(q.ggml_type);
    if (f.bits == 4 && f.half_scales) return run<FloatKernel<4, 32, true>>(a, num_threads);  // Q4_0/1
    if (f.bits == 4) return run<FloatKernel<4, 32, false>>(a, num_threads);                   // Q4_K
    if (f.half_scales) return run<FloatKernel<8, 32, true>>(a, num_threads);                  // Q8_0
    if (f.group_size == 32) return run<FloatKernel<8, 32, false>>(a, num_threads);            // Q5_K
    run<FloatKernel<8, 16, false>>(a, num_threads);                                            // Q6_K
}

}  // namespace pagedserve::quant_detail
#endif  // PAGEDSERVE_X86
