// The dense bf16 linear kernel at ISA level avx512: AVX-512 F/BW/VL/DQ without AVX512-BF16
// (Skylake-SP, Cascade Lake and Ice Lake Xeons, Tiger Lake), on the shared driver's 8 x 32
// micro-tiles (linear/driver.hpp), reading avx512_bf16.cpp's packed weights unchanged.
//
// A pair row of the packed weight (32 columns' features 2p, 2p + 1 as one dword each) splits into
// the even feature (dword << 16) and the odd one (dword & 0xffff0000), both exact fp32; x's rows
// are widened likewise, once per micro-tile. Then one fp32 FMA chain per output over the k
// features in order, from +0, even feature first: the AVX2 path's operations (linear/avx2.cpp)
// in 16 lanes, and the same epilogue (+0 or bias, + residual, or silu(gate) * up; bf16 rounded
// as vcvtneps2bf16 rounds, by integer operations), so the same bits (tests compare the two
// levels). The fp32 kernel at this level is avx512_f32.cpp's, compiled for it likewise.
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // AVX-512 intrinsics: elsewhere dispatch.cpp never takes this path
#include <immintrin.h>

#include <vector>

// Before the driver: its micro-tiles compile for this level's features only (driver.hpp).
#define PAGEDSERVE_LINEAR_TARGET PAGEDSERVE_AVX512_TARGET
#include "linear/driver.hpp"
#include "linear/kernels.hpp"
#include "pagedserve/linear.hpp"

// Every FMA is written out (_mm512_fmadd_ps) and no other multiply-add is fused, as in avx2.cpp:
// the two paths' bits are the same only if neither compiler output fuses more.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

namespace pagedserve::linear_detail {
namespace {

constexpr std::int64_t kPairRow = 2 * kLinearTileN;  // packed elements per feature pair

// 16 bf16 as fp32 (exact: the bits shifted into the top half), lanes past `mask` zero.
PAGEDSERVE_LINEAR_TARGET inline __m512 widen(const std::uint16_t* p, __mmask16 mask) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

struct Bf16Kernel {
    using Args = LinearArgs;
    using Weight = std::uint16_t;

    static std::int64_t tile_elements(std::int64_t k) {
        return packed_linear_elements(kLinearTileN, k);  // one tile's
    }

    // acc = rows [row0, row0 + R) of x times the tile's 32 columns.
    template <int R>
    PAGEDSERVE_LINEAR_TARGET static void product(const LinearArgs& a, std::int64_t row0,
                                                 const std::uint16_t* w, Prefetch prefetch,
                                                 __m512 (&acc)[R][2]) {
        // x's rows as fp32 (k floats each, one row after another) in this thread's buffer: the
        // FMAs below then take x as a broadcast memory operand. About 1 / 32 of the FMAs' count.
        thread_local std::vector<float> buffer;
        buffer.resize(static_cast<std::size_t>(R * a.k));
        float* xf = buffer.data();
        for (int r = 0; r < R; ++r) {
            const std::uint16_t* in = a.x + (row0 + r) * a.x_stride;
            for (std::int64_t i = 0; i < a.k; i += 16) {
                const __mmask16 mask = lanes(a.k - i);
                _mm512_mask_storeu_ps(xf + r * a.k + i, mask, widen(in + i, mask));
            }
        }
        // Local sums, copied out at the end: a vector type may alias the floats of xf, so sums
        // kept in `acc` itself would be stored after every FMA (objdump: 2.4x the time).
        __m512 sum[R][2];
        for (int r = 0; r < R; ++r) sum[r][0] = sum[r][1] = _mm512_setzero_ps();
        const std::int64_t whole = a.k / 2;
        for (std::int64_t p = 0; p < whole; ++p) {
            // One line per feature pair (32 FMAs a row), as avx512_bf16.cpp spreads them.
            if (p < prefetch.lines) _mm_prefetch(prefetch.begin + 64 * p, _MM_HINT_T1);
            pair<R, true>(a, xf, w + p * kPairRow, 2 * p, sum);
        }
        if (a.k % 2) pair<R, false>(a, xf, w + whole * kPairRow, 2 * whole, sum);
        for (int r = 0; r < R; ++r) acc[r][0] = sum[r][0], acc[r][1] = sum[r][1];
    }

    // acc += feature f (and, kOdd, then f + 1) of the rows times the pair row's 32 columns.
    template <int R, bool kOdd>
    PAGEDSERVE_LINEAR_TARGET inline __attribute__((always_inline)) static void pair(
        const LinearArgs& a, const float* xf, const std::uint16_t* w, std::int64_t f,
        __m512 (&acc)[R][2]) {
        const __m512i odd_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
        __m512 even[2], odd[2];
        for (int h = 0; h < 2; ++h) {  // columns 16 h .. 16 h + 15
            const __m512i v = _mm512_loadu_si512(w + 32 * h);
            even[h] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            odd[h] = _mm512_castsi512_ps(_mm512_and_si512(v, odd_mask));
        }
        for (int r = 0; r < R; ++r) {
            const float* x = xf + r * a.k + f;
            const __m512 xe = _mm512_set1_ps(x[0]);
            for (int h = 0; h < 2; ++h) acc[r][h] = _mm512_fmadd_ps(xe, even[h], acc[r][h]);
            if constexpr (!kOdd) continue;
            const __m512 xo = _mm512_set1_ps(x[1]);
            for (int h = 0; h < 2; ++h) acc[r][h] = _mm512_fmadd_ps(xo, odd[h], acc[r][h]);
        }
    }

    PAGEDSERVE_LINEAR_TARGET static __m512 load(const std::uint16_t* p, __mmask16 mask) {
        return widen(p, mask);
    }

    PAGEDSERVE_LINEAR_TARGET static void store_row(const LinearArgs& a, std::int64_t row,
                                                   std::int64_t col, __m512 v, __mmask16 mask) {
        if (a.out_float32) {
            _mm512_mask_storeu_ps(static_cast<float*>(a.out) + row * a.out_stride + col, mask, v);
        } else {
            auto* out = static_cast<std::uint16_t*>(a.out) + row * a.out_stride + col;
            _mm256_mask_storeu_epi16(out, mask, bf16_bits(v));
        }
    }
};

}  // namespace

// At ISA level avx512 (below avx512_bf16), after dispatch.cpp's checks. No tiles below
// avx512_bf16, so amx_from_rows and tile_order have no effect (as on the AVX2 path, whose
// order, even feature first with each add rounded once, is the SDM tiles' but for their
// denormal flushing).
void linear_bf16_avx512(const LinearArgs& args, int num_threads) {
    run_linear<Bf16Kernel>(args, num_threads);
}

}  // namespace pagedserve::linear_detail

#pragma GCC pop_options  // fp-contract
#endif  // PAGEDSERVE_X86
