// The AVX2 epilogue of the quantized linear kernels (bias, residual, SiLU-gated, bf16 or fp32
// out) from a tile's fp32 sums, and the driver items that feed it (Avx2Items), shared by the int8 path (avx2.hpp) and the float-activation path
// (avx2_float.cpp). The includer defines PAGEDSERVE_AVX2_TARGET (its target attribute: AVX2 + FMA
// at least) first; every function here is in an anonymous namespace, each translation unit's own
// copy for its own target.
#pragma once

#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // AVX2 intrinsics
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/avx2_math.hpp"
#include "linear/driver.hpp"
#include "pagedserve/linear.hpp"
#include "pagedserve/linear_quant.hpp"

namespace pagedserve::quant_detail {
namespace {

// The epilogue's vector math, operation for operation the AVX-512 driver's (cpu/avx2_math.hpp).
using avx2_math::bf16_bits8;
using avx2_math::silu_mul8;
using avx2_math::widen_bf16x8;

// Under avx2_math's own fp-contract setting: GCC inlines no function whose optimize options
// differ from its caller's, so otherwise bf16_bits8, silu_mul8 and widen_bf16x8 were calls (every
// live ymm register is caller-saved). Nothing here multiplies and adds, so no bits change.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

PAGEDSERVE_AVX2_TARGET inline __m256 load8(const void* p, bool float32, std::int64_t i) {
    if (float32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
    return widen_bf16x8(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(p) + i)));
}

// out's row `row`, columns [col, col + count) (count <= 8) from 8 fp32 lanes.
PAGEDSERVE_AVX2_TARGET inline void store8(const QuantLinearArgs& q, std::int64_t row,
                                          std::int64_t col, __m256 v, std::int64_t count) {
    if (q.float32 || q.out_float32) {
        float* out = static_cast<float*>(q.out) + row * q.out_stride + col;
        if (count == 8) return _mm256_storeu_ps(out, v);
        float lanes[8];
        _mm256_storeu_ps(lanes, v);
        std::copy(lanes, lanes + count, out);
        return;
    }
    auto* out = static_cast<std::uint16_t*>(q.out) + row * q.out_stride + col;
    const __m128i bits = bf16_bits8(v);
    if (count == 8) return _mm_storeu_si128(reinterpret_cast<__m128i*>(out), bits);
    std::uint16_t lanes[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lanes), bits);
    std::copy(lanes, lanes + count, out);
}

// 8 lanes of a bias or residual row from column col (zeros past n).
PAGEDSERVE_AVX2_TARGET inline __m256 load_edge(const void* p, bool float32, std::int64_t i,
                                               std::int64_t count) {
    if (count >= 8) return load8(p, float32, i);
    float lanes[8] = {};
    for (std::int64_t j = 0; j < count; ++j) {
        if (float32) {
            lanes[j] = static_cast<const float*>(p)[i + j];
        } else {
            const std::uint32_t bits =
                static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(p)[i + j]) << 16;
            std::memcpy(lanes + j, &bits, sizeof(float));
        }
    }
    return _mm256_loadu_ps(lanes);
}

// The driver's store_tile for 8-lane registers: acc + bias + residual, or a gated tile's
// silu(gate) * up (16 gate columns, then their 16 up columns), rounded once into out.
template <int R>
PAGEDSERVE_AVX2_TARGET void store_tile8(const QuantLinearArgs& q, std::int64_t row0,
                                        std::int64_t tile, const float (&acc)[R][32]) {
    if (q.gated_width > 0) {
        const std::int64_t col0 = tile * kLinearGateCols;
        for (int r = 0; r < R; ++r) {
            for (int c = 0; c < 2; ++c) {
                const std::int64_t count = std::min<std::int64_t>(8, q.gated_width - col0 - 8 * c);
                if (count <= 0) break;
                const __m256 v = silu_mul8(_mm256_loadu_ps(acc[r] + 8 * c),
                                           _mm256_loadu_ps(acc[r] + 16 + 8 * c));
                store8(q, row0 + r, col0 + 8 * c, v, count);
            }
        }
        return;
    }
    const std::int64_t col0 = tile * kLinearTileN;
    for (int c = 0; c < 4; ++c) {
        const std::int64_t col = col0 + 8 * c, count = std::min<std::int64_t>(8, q.n - col);
        if (count <= 0) break;
        const __m256 bias = q.bias ? load_edge(q.bias, q.float32, col, count) : _mm256_setzero_ps();
        for (int r = 0; r < R; ++r) {
            __m256 v = _mm256_add_ps(_mm256_loadu_ps(acc[r] + 8 * c), bias);
            if (q.residual)
                v = _mm256_add_ps(v, load_edge(q.residual, q.float32,
                                               (row0 + r) * q.residual_stride + col, count));
            store8(q, row0 + r, col, v, count);
        }
    }
}
#pragma GCC pop_options  // fp-contract

// The driver's items for an 8-lane kernel K (K::Args has `q`, the call's QuantLinearArgs, and
// `packed`; K::product<R> fills float acc[R][32] for rows row0 .. row0 + R - 1 and one tile).
template <typename K, int R>
PAGEDSERVE_AVX2_TARGET void sweep_panel(const typename K::Args& a, std::int64_t row0,
                                        std::int64_t tile0, std::int64_t tile_end,
                                        const linear_detail::PanelPrefetch& prefetch,
                                        std::int64_t& part) {
    for (std::int64_t t = tile0; t < tile_end; ++t) {
        float acc[R][32];
        K::template product<R>(a, row0, a.packed + t * K::tile_elements(a.k),
                               prefetch.part(part++), acc);
        store_tile8<R>(*a.q, row0, t, acc);
    }
}

// One driver item: rows [row0, row0 + rows) x tiles [tile0, tile_end), K::kRows rows at a time
// across the whole panel (so it stays in L2), prefetching the next panel meanwhile.
template <typename K>
struct Avx2Items {
    PAGEDSERVE_AVX2_TARGET static void run(const typename K::Args& a, std::int64_t row0,
                                           std::int64_t rows, std::int64_t tile0,
                                           std::int64_t tile_end, std::int64_t next0,
                                           std::int64_t next_end) {
        constexpr int R = K::kRows;
        const std::int64_t blocks = (rows + R - 1) / R;
        const linear_detail::PanelPrefetch prefetch =
            linear_detail::panel_prefetch<K>(a, next0, next_end, blocks * (tile_end - tile0));
        std::int64_t part = 0, r = row0;
        for (; r + R <= row0 + rows; r += R) sweep_panel<K, R>(a, r, tile0, tile_end, prefetch, part);
        linear_detail::with_rows(row0 + rows - r, [&](auto count) {
            if constexpr (decltype(count)::value < R)
                sweep_panel<K, decltype(count)::value>(a, r, tile0, tile_end, prefetch, part);
        });
    }
};

}  // namespace
}  // namespace pagedserve::quant_detail
#endif  // PAGEDSERVE_X86
