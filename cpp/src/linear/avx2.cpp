// The dense linear kernels at ISA levels avx2, avx2_vnni and avx512 (CPUs without AVX512-BF16:
// Zen 1-3, Intel client CPUs, Skylake-X), on the shared driver (linear/driver.hpp: shares,
// take-over, panels, prefetch) with 8-lane micro-tiles of their own, reading the packed weights
// of the AVX-512 paths unchanged.
//
// fp32: every output is one fp32 FMA chain over the k features in order, from +0, then + bias
// (+0 without one), + residual, or silu(gate) * up (cpu/avx2_math.hpp): operation for operation
// avx512_f32.cpp's, so the same bits (tests compare the two where the CPU has both).
// bf16: a pair row of the packed weight (8 columns' features 2p, 2p + 1 as one dword each) splits
// into the even feature (dword << 16) and the odd one (dword & 0xffff0000), both exact fp32; x's
// rows are widened likewise once per micro-tile of rows. Then the fp32 kernel's FMA chain over k
// in order: each bf16 product is exact in fp32, so every add rounds once, as in a sum over k of
// exact products. VDPBF16PS (avx512_bf16.cpp) adds a pair's products odd first and flushes
// denormals, so the two paths differ in the last bits; this one is batch-invariant all the same
// (threads split columns, never k).
//
// A micro-tile is R rows (6 fp32, 5 bf16) x half a tile (16 columns, 2 registers a row), so the
// accumulators, the weight registers (twice as many for bf16's even and odd features) and x's
// broadcast fit in AVX2's 16 registers; 1 or 2 rows take the whole tile at once (4 FMA chains a
// row hide the FMA's latency). Once all 32 columns are summed the epilogue runs on them (a gated
// tile's 16 gate columns meet their 16 up columns there).
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // AVX2 intrinsics: elsewhere dispatch.cpp never takes this path
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/avx2_math.hpp"
#include "linear/driver.hpp"
#include "linear/kernels.hpp"
#include "pagedserve/linear.hpp"

// AVX2 + FMA (level avx2 guarantees F16C too, but the bf16 widening is shifts and the kernel
// converts no fp16).
#define PAGEDSERVE_LINEAR_AVX2 __attribute__((target("avx2,fma")))
#define PAGEDSERVE_AVX2_ALWAYS_INLINE inline __attribute__((always_inline))

// Every FMA is written out (_mm256_fmadd_ps), and no other multiply-add is fused: the AVX-512
// paths' intrinsics leave the compiler none to fuse either.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

namespace pagedserve::linear_detail {
namespace {

using avx2_math::bf16_bits8;
using avx2_math::silu_mul8;
using avx2_math::widen_bf16x8;

constexpr std::int64_t kHalfCols = kLinearTileN / 2;  // columns per micro-tile

// `count` (<= 8) floats from p as 8 lanes, zeros past them (no read past the row's end).
PAGEDSERVE_LINEAR_AVX2 inline __m256 load_f32(const float* p, std::int64_t count) {
    if (count >= 8) return _mm256_loadu_ps(p);
    float lanes[8] = {};
    std::copy(p, p + count, lanes);
    return _mm256_loadu_ps(lanes);
}

PAGEDSERVE_LINEAR_AVX2 inline __m256 load_bf16(const std::uint16_t* p, std::int64_t count) {
    if (count >= 8) return widen_bf16x8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    std::uint16_t lanes[8] = {};
    std::copy(p, p + count, lanes);
    return widen_bf16x8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lanes)));
}

PAGEDSERVE_LINEAR_AVX2 inline void store_f32(float* out, __m256 v, std::int64_t count) {
    if (count >= 8) return _mm256_storeu_ps(out, v);
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    std::copy(lanes, lanes + count, out);
}

PAGEDSERVE_LINEAR_AVX2 inline void store_bf16(std::uint16_t* out, __m256 v, std::int64_t count) {
    const __m128i bits = bf16_bits8(v);  // vcvtneps2bf16's rounding, as avx512_bf16.cpp
    if (count >= 8) return _mm_storeu_si128(reinterpret_cast<__m128i*>(out), bits);
    std::uint16_t lanes[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lanes), bits);
    std::copy(lanes, lanes + count, out);
}

// Issues line i of `lines`, a micro-tile's share of the next panel's lines (one per feature, or
// feature pair, that it steps through: about the weights it reads itself).
PAGEDSERVE_LINEAR_AVX2 inline void prefetch_line(const Prefetch& lines, std::int64_t i) {
    if (i < lines.lines) _mm_prefetch(lines.begin + 64 * i, _MM_HINT_T1);
}

// Rows of x as fp32 for a micro-tile: fp32 x in place; bf16 x widened into a per-thread buffer.
template <int R>
struct Rows {
    const float* row[R];
};

struct F32Kernel {
    using Args = LinearF32Args;
    using Weight = float;
    static constexpr int kRows = 6;  // 12 accumulators + 2 weights + a broadcast

    static std::int64_t tile_elements(std::int64_t k) { return k * kLinearTileN; }

    template <int R>
    static Rows<R> rows(const Args& a, std::int64_t row0) {
        Rows<R> x;
        for (int r = 0; r < R; ++r) x.row[r] = a.x + (row0 + r) * a.x_stride;
        return x;
    }

    // acc[r][8 c0 .. 8 (c0 + V)) = rows' x times those columns of the tile: one FMA chain each.
    template <int R, int V>
    PAGEDSERVE_LINEAR_AVX2 static void columns(const Args& a, const Rows<R>& x, const float* w,
                                               int c0, const Prefetch& lines,
                                               float (&acc)[R][32]) {
        __m256 sum[R][V];
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < V; ++c) sum[r][c] = _mm256_setzero_ps();
        for (std::int64_t p = 0; p < a.k; ++p) {
            prefetch_line(lines, p);
            __m256 wc[V];  // V weights + R x V sums + a broadcast: 13 or 15 registers
            for (int c = 0; c < V; ++c)
                wc[c] = _mm256_loadu_ps(w + p * kLinearTileN + 8 * (c0 + c));
            for (int r = 0; r < R; ++r) {
                const __m256 xr = _mm256_broadcast_ss(x.row[r] + p);
                for (int c = 0; c < V; ++c) sum[r][c] = _mm256_fmadd_ps(xr, wc[c], sum[r][c]);
            }
        }
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < V; ++c) _mm256_storeu_ps(acc[r] + 8 * (c0 + c), sum[r][c]);
    }

    PAGEDSERVE_LINEAR_AVX2 static __m256 load(const float* p, std::int64_t count) {
        return load_f32(p, count);
    }

    PAGEDSERVE_LINEAR_AVX2 static void store(const Args& a, std::int64_t row, std::int64_t col,
                                             __m256 v, std::int64_t count) {
        store_f32(a.out + row * a.out_stride + col, v, count);
    }
};

struct Bf16Kernel {
    using Args = LinearArgs;
    using Weight = std::uint16_t;
    static constexpr int kRows = 5;  // 10 accumulators + 4 weight halves + a broadcast

    static std::int64_t tile_elements(std::int64_t k) { return (k + 1) / 2 * 2 * kLinearTileN; }

    // Rows row0 .. row0 + R - 1 of x widened to fp32 (k floats each) in this thread's buffer,
    // valid until its next call.
    template <int R>
    PAGEDSERVE_LINEAR_AVX2 static Rows<R> rows(const Args& a, std::int64_t row0) {
        thread_local std::vector<float> buffer;
        buffer.resize(static_cast<std::size_t>(R * a.k));
        Rows<R> x;
        for (int r = 0; r < R; ++r) {
            const std::uint16_t* in = a.x + (row0 + r) * a.x_stride;
            float* out = buffer.data() + r * a.k;
            std::int64_t i = 0;
            for (; i + 8 <= a.k; i += 8)
                _mm256_storeu_ps(out + i, load_bf16(in + i, 8));
            store_f32(out + i, load_bf16(in + i, a.k - i), a.k - i);
            x.row[r] = out;
        }
        return x;
    }

    // As F32Kernel::columns, over the pairs: features 2p then 2p + 1 (the last pair of an odd k
    // has only its even one).
    template <int R, int V>
    PAGEDSERVE_LINEAR_AVX2 static void columns(const Args& a, const Rows<R>& x,
                                               const std::uint16_t* w, int c0,
                                               const Prefetch& lines, float (&acc)[R][32]) {
        __m256 sum[R][V];
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < V; ++c) sum[r][c] = _mm256_setzero_ps();
        const std::int64_t whole = a.k / 2;
        for (std::int64_t p = 0; p < whole; ++p) {
            prefetch_line(lines, p);
            pair<R, V, true>(x, w, c0, p, sum);
        }
        if (a.k % 2) pair<R, V, false>(x, w, c0, whole, sum);
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < V; ++c) _mm256_storeu_ps(acc[r] + 8 * (c0 + c), sum[r][c]);
    }

    // sum += feature 2p (and, kOdd, then 2p + 1) of the rows times the V column groups from c0.
    template <int R, int V, bool kOdd>
    PAGEDSERVE_LINEAR_AVX2 PAGEDSERVE_AVX2_ALWAYS_INLINE static void pair(
        const Rows<R>& x, const std::uint16_t* w, int c0, std::int64_t p, __m256 (&sum)[R][V]) {
        const auto* at = reinterpret_cast<const __m256i*>(w + p * 2 * kLinearTileN + 16 * c0);
        const __m256i odd_mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
        // 8 columns' features 2p (the dwords' low halves) and 2p + 1 (the high ones) as fp32.
        __m256 even[V], odd[V];
        const auto widen = [&](int c) PAGEDSERVE_LINEAR_AVX2 {
            const __m256i v = _mm256_loadu_si256(at + c);
            even[c] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            odd[c] = _mm256_castsi256_ps(_mm256_and_si256(v, odd_mask));
        };
        if constexpr (V == 4) {  // x's 2 R values held, a column group at a time: 15 registers
            __m256 xe[R], xo[R];
            for (int r = 0; r < R; ++r) {
                xe[r] = _mm256_broadcast_ss(x.row[r] + 2 * p);
                if constexpr (kOdd) xo[r] = _mm256_broadcast_ss(x.row[r] + 2 * p + 1);
            }
            for (int c = 0; c < V; ++c) {
                widen(c);
                for (int r = 0; r < R; ++r) {
                    sum[r][c] = _mm256_fmadd_ps(xe[r], even[c], sum[r][c]);
                    if constexpr (kOdd) sum[r][c] = _mm256_fmadd_ps(xo[r], odd[c], sum[r][c]);
                }
            }
        } else {  // the 2 V weights held, a row at a time: 2 V + R V + 1 registers
            for (int c = 0; c < V; ++c) widen(c);
            for (int r = 0; r < R; ++r) {
                const __m256 xe = _mm256_broadcast_ss(x.row[r] + 2 * p);
                for (int c = 0; c < V; ++c) sum[r][c] = _mm256_fmadd_ps(xe, even[c], sum[r][c]);
                if constexpr (!kOdd) continue;
                const __m256 xo = _mm256_broadcast_ss(x.row[r] + 2 * p + 1);
                for (int c = 0; c < V; ++c) sum[r][c] = _mm256_fmadd_ps(xo, odd[c], sum[r][c]);
            }
        }
    }

    PAGEDSERVE_LINEAR_AVX2 static __m256 load(const std::uint16_t* p, std::int64_t count) {
        return load_bf16(p, count);
    }

    PAGEDSERVE_LINEAR_AVX2 static void store(const Args& a, std::int64_t row, std::int64_t col,
                                             __m256 v, std::int64_t count) {
        if (a.out_float32)
            return store_f32(static_cast<float*>(a.out) + row * a.out_stride + col, v, count);
        store_bf16(static_cast<std::uint16_t*>(a.out) + row * a.out_stride + col, v, count);
    }
};

// The driver's store_tile in 8 lanes: acc + bias (+0 without one, as the AVX-512 paths add) +
// residual, or a gated tile's silu(gate) * up, rounded once into out; columns past n untouched.
template <typename K, int R>
PAGEDSERVE_LINEAR_AVX2 void store_tile(const typename K::Args& a, std::int64_t row0,
                                       std::int64_t tile, const float (&acc)[R][32]) {
    if (a.gated_width > 0) {
        const std::int64_t col0 = tile * kLinearGateCols;
        for (int c = 0; c < 2; ++c) {
            const std::int64_t count = std::min<std::int64_t>(8, a.gated_width - col0 - 8 * c);
            if (count <= 0) break;
            for (int r = 0; r < R; ++r) {
                const __m256 v = silu_mul8(_mm256_loadu_ps(acc[r] + 8 * c),
                                           _mm256_loadu_ps(acc[r] + kHalfCols + 8 * c));
                K::store(a, row0 + r, col0 + 8 * c, v, count);
            }
        }
        return;
    }
    const std::int64_t col0 = tile * kLinearTileN;
    for (int c = 0; c < 4; ++c) {
        const std::int64_t col = col0 + 8 * c, count = std::min<std::int64_t>(8, a.n - col);
        if (count <= 0) break;
        const __m256 bias = a.bias ? K::load(a.bias + col, count) : _mm256_setzero_ps();
        for (int r = 0; r < R; ++r) {
            __m256 v = _mm256_add_ps(_mm256_loadu_ps(acc[r] + 8 * c), bias);
            if (a.residual)
                v = _mm256_add_ps(v, K::load(a.residual + (row0 + r) * a.residual_stride + col,
                                             count));
            K::store(a, row0 + r, col, v, count);
        }
    }
}

// Rows [row0, row0 + R) across the panel's tiles [tile0, tile_end), x's rows made fp32 once.
template <typename K, int R>
PAGEDSERVE_LINEAR_AVX2 void sweep_panel(const typename K::Args& a, std::int64_t row0,
                                        std::int64_t tile0, std::int64_t tile_end,
                                        const PanelPrefetch& prefetch, std::int64_t& part) {
    // A whole tile (4 registers a row) for up to 2 rows: 4 FMA chains a row keep the FMA units
    // busy at one row (a decode step) where 2 would wait on the FMA's latency; half tiles for
    // more rows, so R rows' accumulators fit the 16 registers.
    constexpr int V = R <= 2 ? 4 : 2;
    const Rows<R> x = K::template rows<R>(a, row0);
    for (std::int64_t t = tile0; t < tile_end; ++t) {
        float acc[R][32];
        const Prefetch next = prefetch.part(part++);
        for (int c0 = 0; c0 < 4; c0 += V) {  // each takes its share of the next lines
            const std::int64_t first = next.lines * c0 / 4, last = next.lines * (c0 + V) / 4;
            const Prefetch lines{next.begin + 64 * first, last - first};
            K::template columns<R, V>(a, x, tile_weights<K>(a, t), c0, lines, acc);
        }
        store_tile<K, R>(a, row0, t, acc);
    }
}

// One driver item: rows [row0, row0 + rows) x tiles [tile0, tile_end), K::kRows rows at a time
// across the whole panel (so it stays in L2), prefetching the next panel meanwhile.
template <typename K>
struct Avx2Items {
    PAGEDSERVE_LINEAR_AVX2 static void run(const typename K::Args& a, std::int64_t row0,
                                           std::int64_t rows, std::int64_t tile0,
                                           std::int64_t tile_end, std::int64_t next0,
                                           std::int64_t next_end) {
        constexpr int R = K::kRows;
        const std::int64_t blocks = (rows + R - 1) / R;
        const PanelPrefetch prefetch =
            panel_prefetch<K>(a, next0, next_end, blocks * (tile_end - tile0));
        std::int64_t part = 0, r = row0;
        for (; r + R <= row0 + rows; r += R)
            sweep_panel<K, R>(a, r, tile0, tile_end, prefetch, part);
        with_rows(row0 + rows - r, [&](auto count) {
            if constexpr (decltype(count)::value < R)
                sweep_panel<K, decltype(count)::value>(a, r, tile0, tile_end, prefetch, part);
        });
    }
};

}  // namespace

void linear_bf16_avx2(const LinearArgs& args, int num_threads) {
    run_linear<Bf16Kernel, Avx2Items<Bf16Kernel>>(args, num_threads);
}

void linear_f32_avx2(const LinearF32Args& args, int num_threads) {
    run_linear<F32Kernel, Avx2Items<F32Kernel>>(args, num_threads);
}

}  // namespace pagedserve::linear_detail

#pragma GCC pop_options  // fp-contract
#endif  // PAGEDSERVE_X86
