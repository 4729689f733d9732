// CPU fp32 linear layers with AVX-512 (see linear.hpp), on the shared driver of
// linear/driver.hpp: per input feature, 2 weight loads feed 16 FMAs of an 8 x 32 micro-tile,
// each output one FMA chain over k in order (batch invariance, issue 16); every row is fp32.
// Runs from ISA level avx512: compiled for that level's features only (no AVX512-BF16).
#include "cpu/arch.hpp"
// Before the driver: its micro-tiles compile for this kernel's target (driver.hpp).
#define PAGEDSERVE_LINEAR_TARGET PAGEDSERVE_AVX512_TARGET
#include "linear/driver.hpp"
#include "linear/kernels.hpp"
#include "pagedserve/linear.hpp"

namespace pagedserve {
namespace {

using namespace linear_detail;

// Packed elements per 32-column tile (F32Kernel::tile_elements; packed_linear_elements_f32).
std::int64_t f32_tile_elements(std::int64_t k) { return k * kLinearTileN; }

#if PAGEDSERVE_X86  // AVX-512 intrinsics: elsewhere linear_f32 only throws (dispatch.cpp)
struct F32Kernel {
    using Args = LinearF32Args;
    using Weight = float;

    static std::int64_t tile_elements(std::int64_t k) { return f32_tile_elements(k); }

    template <int R>
    PAGEDSERVE_LINEAR_TARGET static void product(const LinearF32Args& a, std::int64_t row0,
                                                 const float* w, Prefetch prefetch,
                                                 __m512 (&acc)[R][2]) {
        for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        const float* x = a.x + row0 * a.x_stride;
        for (std::int64_t p = 0; p < a.k; ++p) {
            // Two lines per feature, as many as the 32 columns' weights take.
            for (std::int64_t line = 2 * p; line < std::min(2 * p + 2, prefetch.lines); ++line)
                _mm_prefetch(prefetch.begin + 64 * line, _MM_HINT_T1);
            const __m512 w0 = _mm512_loadu_ps(w + p * kLinearTileN);
            const __m512 w1 = _mm512_loadu_ps(w + p * kLinearTileN + 16);
            for (int r = 0; r < R; ++r) {
                const __m512 xr = _mm512_set1_ps(x[r * a.x_stride + p]);
                acc[r][0] = _mm512_fmadd_ps(xr, w0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(xr, w1, acc[r][1]);
            }
        }
    }

    PAGEDSERVE_LINEAR_TARGET static __m512 load(const float* p, __mmask16 mask) {
        return _mm512_maskz_loadu_ps(mask, p);
    }

    PAGEDSERVE_LINEAR_TARGET static void store_row(const LinearF32Args& a, std::int64_t row,
                                                   std::int64_t col, __m512 v, __mmask16 mask) {
        _mm512_mask_storeu_ps(a.out + row * a.out_stride + col, mask, v);
    }
};
#endif  // PAGEDSERVE_X86

}  // namespace

std::int64_t packed_linear_elements_f32(std::int64_t n, std::int64_t k) {
    return num_tiles(n) * f32_tile_elements(k);
}

void pack_linear_weight_f32(const float* weight, std::int64_t n, std::int64_t k, float* packed,
                            int num_threads) {
    check_linear(n > 0 && k > 0, "pack_linear_weight_f32: n and k must be positive");
    pack_rows<1>([&](std::int64_t col) { return weight + col * k; }, n, k, packed, num_threads);
}

void pack_gated_weight_f32(const float* weight, std::int64_t width, std::int64_t k,
                           float* packed, int num_threads) {
    check_linear(width > 0 && k > 0, "pack_gated_weight_f32: width and k must be positive");
    pack_rows<1>([&](std::int64_t col) { return gated_source_row(weight, width, k, col); },
                 gated_rows(width), k, packed, num_threads);
}

#if PAGEDSERVE_X86  // the kernel exists only there
// At ISA level avx512 and up, after dispatch.cpp's checks.
void linear_detail::linear_f32_avx512(const LinearF32Args& args, int threads) {
    run_linear<F32Kernel>(args, threads);
}
#endif

}  // namespace pagedserve
