// CPU bf16 linear layers with AVX512-BF16 (see linear.hpp), on the shared driver of
// linear/driver.hpp: per pair of input features, 2 weight loads feed 16 dot-product
// instructions of an 8 x 32 micro-tile; bias, residual and output rows are bf16 (fp32 logits
// optional).
#include <cstring>
#include <stdexcept>

#include "cpu/arch.hpp"
#include "linear/amx.hpp"
#include "linear/driver.hpp"
#include "linear/kernels.hpp"
#include "pagedserve/linear.hpp"

namespace pagedserve {
namespace {

using namespace linear_detail;

constexpr std::int64_t kPairRow = 2 * kLinearTileN;  // packed elements per feature pair

std::int64_t num_pairs(std::int64_t k) { return (k + 1) / 2; }

// Packed elements per 32-column tile (Bf16Kernel::tile_elements; packed_linear_elements).
std::int64_t bf16_tile_elements(std::int64_t k) { return num_pairs(k) * kPairRow; }

#if PAGEDSERVE_X86  // AVX512-BF16 intrinsics: elsewhere linear_bf16 only throws
// The bf16 pair (x[i], x[i + 1]) as one 32-bit lane broadcast to all 16; past the end of an
// odd-length row the second half is zero (it meets the zero padding of the packed weight).
PAGEDSERVE_LINEAR_TARGET inline __m512bh broadcast_pair(const std::uint16_t* x, bool whole) {
    std::uint32_t pair = x[0];
    if (whole) std::memcpy(&pair, x, sizeof(pair));
    return reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
}

struct Bf16Kernel {
    using Args = LinearArgs;
    using Weight = std::uint16_t;

    static std::int64_t tile_elements(std::int64_t k) { return bf16_tile_elements(k); }

    template <int R>
    PAGEDSERVE_LINEAR_TARGET static void product(const LinearArgs& a, std::int64_t row0,
                                                 const std::uint16_t* w, Prefetch prefetch,
                                                 __m512 (&acc)[R][2]) {
        for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        if (a.tile_order) return accumulate<R, true>(a, row0, w, 0, prefetch, acc);
        accumulate<R>(a, row0, w, 0, prefetch, acc);
    }

    // acc += rows [row0, row0 + R) of x times the tile's columns, over the feature pairs from
    // `first` on, in order. A pair's two products are added in VDPBF16PS's order (odd feature
    // first) or, kTileOrder (LinearArgs::tile_order), in the SDM's TDPBF16PS order (even
    // first): two VDPBF16PS each with one feature of x, the other zero, so the first adds
    // 0 * w_odd (no change) then x_even * w_even, the second x_odd * w_odd then 0 * w_even,
    // each add rounded once with denormals flushed, as the tiles do (finite weights: 0 * inf
    // would be NaN). The AMX path's features past its last whole 32 run here in that order.
    template <int R, bool kTileOrder = false>
    PAGEDSERVE_LINEAR_TARGET static void accumulate(const LinearArgs& a, std::int64_t row0,
                                                    const std::uint16_t* w, std::int64_t first,
                                                    Prefetch prefetch, __m512 (&acc)[R][2]) {
        const std::uint16_t* x = a.x + row0 * a.x_stride;
        const std::int64_t pairs = num_pairs(a.k);
        const __m512i low = _mm512_set1_epi32(0xFFFF), high = _mm512_set1_epi32(~0xFFFF);
        for (std::int64_t p = first; p < pairs; ++p) {
            // One line per feature pair (16 dot products) keeps the requests spread out.
            const std::int64_t line = p - first;
            if (line < prefetch.lines) _mm_prefetch(prefetch.begin + 64 * line, _MM_HINT_T1);
            const bool whole = 2 * p + 1 < a.k;
            const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + p * kPairRow));
            const __m512bh w1 =
                reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + p * kPairRow + 32));
            for (int r = 0; r < R; ++r) {
                const __m512bh xr = broadcast_pair(x + r * a.x_stride + 2 * p, whole);
                if constexpr (kTileOrder) {
                    const __m512i both = reinterpret_cast<__m512i>(xr);
                    for (const __m512i half : {low, high}) {
                        const auto one = reinterpret_cast<__m512bh>(_mm512_and_si512(both, half));
                        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], one, w0);
                        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], one, w1);
                    }
                } else {
                    acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xr, w0);
                    acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xr, w1);
                }
            }
        }
    }

    PAGEDSERVE_LINEAR_TARGET static __m512 load(const std::uint16_t* p, __mmask16 mask) {
        const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
        return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
    }

    PAGEDSERVE_LINEAR_TARGET static void store_row(const LinearArgs& a, std::int64_t row,
                                                   std::int64_t col, __m512 v, __mmask16 mask) {
        if (a.out_float32) {
            _mm512_mask_storeu_ps(static_cast<float*>(a.out) + row * a.out_stride + col, mask, v);
        } else {
            const __m256i bits = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));  // nearest-even
            auto* out = static_cast<std::uint16_t*>(a.out) + row * a.out_stride + col;
            _mm256_mask_storeu_epi16(out, mask, bits);
        }
    }
};
#endif  // PAGEDSERVE_X86

}  // namespace

std::int64_t packed_linear_elements(std::int64_t n, std::int64_t k) {
    return num_tiles(n) * bf16_tile_elements(k);
}

void pack_linear_weight_bf16(const std::uint16_t* weight, std::int64_t n, std::int64_t k,
                             std::uint16_t* packed, int num_threads) {
    check_linear(n > 0 && k > 0, "pack_linear_weight_bf16: n and k must be positive");
    pack_rows<2>([&](std::int64_t col) { return weight + col * k; }, n, k, packed, num_threads);
}

void pack_gated_weight_bf16(const std::uint16_t* weight, std::int64_t width, std::int64_t k,
                            std::uint16_t* packed, int num_threads) {
    check_linear(width > 0 && k > 0, "pack_gated_weight_bf16: width and k must be positive");
    pack_rows<2>([&](std::int64_t col) { return gated_source_row(weight, width, k, col); },
                 gated_rows(width), k, packed, num_threads);
}

std::int64_t linear_items_taken_over() {
    return linear_detail::items_taken_over.load(std::memory_order_relaxed);
}

#if PAGEDSERVE_X86  // the kernel exists only there
// At ISA level avx512_bf16 and up, after dispatch.cpp's checks: AVX512-BF16 micro-tiles, or AMX
// tiles for calls of at least amx_from_rows rows where the CPU grants them.
void linear_detail::linear_bf16_avx512_bf16(const LinearArgs& args, int threads) {
    if (args.amx_from_rows == 0 || args.m < args.amx_from_rows || !linear_amx_supported())
        return run_linear<Bf16Kernel>(args, threads);
    if (amx_emulated.load(std::memory_order_relaxed))
        return run_linear<Bf16Kernel, AmxItems<Bf16Kernel, SoftwareTiles>>(args, threads);
    run_linear<Bf16Kernel, AmxItems<Bf16Kernel, HardwareTiles>>(args, threads);
}
#endif

// The tiles' epilogue and tails run on AVX512-BF16: below that level (the AVX2 path) no tiles.
bool linear_amx_supported() {
    return cpu_isa_at_least(CpuIsa::kAvx512Bf16) && amx_usable(false);
}

void linear_amx_emulation(bool on) { amx_emulated.store(on, std::memory_order_relaxed); }

std::int64_t linear_amx_items() { return amx_items_run.load(std::memory_order_relaxed); }

}  // namespace pagedserve
