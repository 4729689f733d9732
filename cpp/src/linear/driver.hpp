// The shared driver of the CPU linear kernels (linear/avx512_bf16.cpp: bf16, linear/avx512_f32.cpp: fp32;
// see linear.hpp). Each thread owns an equal run of 32-column weight tiles and walks it in
// L2-sized panels: for every 8 rows of a chunk of up to kChunkRows rows it sweeps the panel, so
// the panel is read from memory once per chunk and each output row is written in one contiguous
// run, while the next panel is prefetched into L2. Within an item, a micro-tile of 8 rows x 32
// columns keeps 16 fp32 accumulators in registers.
//
// Batch invariance (issue 16): threads split columns, never k, and every output element is one
// fp32 accumulator taking the k features in order, whatever the row count, the micro-tile height
// or the thread count; so a row's output is bit-identical in calls of any size.
//
// A kernel K supplies: `Args` (x, packed, out pointers, m, n, k, ...), `Weight` (the packed
// element type), `tile_elements(k)` (packed elements per 32-column tile), the template
// `product<R>(args, row0, tile weights, Prefetch, acc)`, `load(p, mask)` (16 lanes of a bias or
// residual row as fp32) and `store_row(args, row, col, v, mask)` (16 fp32 lanes into out).
// run_linear's `Item` computes one item (rows x a panel of tiles): MicroTiles, the 8-row
// micro-tiles above, unless the call runs on AMX tiles (linear/amx.hpp's AmxItems).
#pragma once

#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // the micro-tile driver's AVX-512 intrinsics
#include <immintrin.h>
#endif
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "pagedserve/linear.hpp"

// The features the driver's micro-tiles compile for, those of the kernel that includes it (the
// kernel's product inlines into them): AVX512-BF16 by default (avx512_bf16.cpp, amx.hpp,
// linear_quant/avx512_bf16.cpp); a kernel that runs from ISA level avx512 (avx512.cpp,
// avx512_f32.cpp, linear_quant/avx512_vnni.cpp) defines it as PAGEDSERVE_AVX512_TARGET
// (cpu/arch.hpp) before the include, so that no instruction beyond that level's can reach
// them. The driver's functions that carry it are templates on the kernel type or `static`
// (each translation unit its own copy, for its own target).
#ifndef PAGEDSERVE_LINEAR_TARGET
#define PAGEDSERVE_LINEAR_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#endif

namespace pagedserve::linear_detail {

inline constexpr std::int64_t kRows = 8;          // rows per micro-tile (2 x 8 accumulators)
inline constexpr std::int64_t kChunkRows = 256;   // rows per work item
inline constexpr std::int64_t kPanelBytes = 256 << 10;  // packed weights per work item: L2-resident
inline constexpr std::int64_t kMinParallelMacs = 1 << 18;  // below ~20 us of work, one thread

inline std::atomic<std::int64_t> items_taken_over{0};  // see linear_items_taken_over()

inline std::int64_t num_tiles(std::int64_t n) { return (n + kLinearTileN - 1) / kLinearTileN; }

// The driver proper (micro-tiles in AVX-512 registers, shares, panels, prefetch) exists only on
// x86: elsewhere linear_bf16 / linear_f32 throw (linear_bf16_supported() is false), quant_linear
// runs its portable loops, and only the ISA-free packing and argument checks below are built.
#if PAGEDSERVE_X86
PAGEDSERVE_LINEAR_TARGET static inline __mmask16 lanes(std::int64_t count) {
    if (count >= 16) return 0xffff;
    return count <= 0 ? 0 : static_cast<__mmask16>((1u << count) - 1);
}

// e^y for every float y: Cody-Waite reduction by ln 2, a degree-7 Taylor polynomial on
// |f| <= ln(2) / 2 (~1e-7 relative), and scalef for the power of two (so huge |y| gives 0 or
// inf, not garbage). NaN stays NaN.
PAGEDSERVE_LINEAR_TARGET static inline __m512 exp_ps(__m512 y) {
    const __m512 i = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_fnmadd_ps(i, _mm512_set1_ps(0.693359375f), y);  // y - i ln2 (hi, exact)
    f = _mm512_fnmadd_ps(i, _mm512_set1_ps(-2.12194440e-4f), f);      // ... - i ln2 (lo)
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f,
                          1.0f}) {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    return _mm512_scalef_ps(p, i);
}

// silu(gate) * up = gate * up / (1 + e^-gate).
PAGEDSERVE_LINEAR_TARGET static inline __m512 silu_mul(__m512 gate, __m512 up) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), gate));
    return _mm512_div_ps(_mm512_mul_ps(gate, up), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

// vcvtneps2bf16 by integer operations, as the SDM's pseudo-code has it (the same bits, for CPUs
// with AVX-512 but no AVX512-BF16): round to nearest even, zero and denormals to a signed zero,
// NaN quieted.
PAGEDSERVE_LINEAR_TARGET static inline __m256i bf16_bits(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i top = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(top, _mm512_set1_epi32(1));
    __m512i bits = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i magnitude = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7f800000));
    const __mmask16 tiny = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000));
    bits = _mm512_mask_or_epi32(bits, nan, top, _mm512_set1_epi32(0x40));
    bits = _mm512_mask_and_epi32(bits, tiny, top, _mm512_set1_epi32(0x8000));
    return _mm512_cvtepi32_epi16(bits);
}

// Cache lines of the weights to bring into L2 while a micro-tile computes (see run_item).
struct Prefetch {
    const char* begin = nullptr;
    std::int64_t lines = 0;
};

// The next panel's weights, split evenly over the micro-tiles that sweep this one.
struct PanelPrefetch {
    const char* next = nullptr;
    std::int64_t lines = 0, parts = 1;

    Prefetch part(std::int64_t i) const {
        const std::int64_t first = lines * i / parts, last = lines * (i + 1) / parts;
        return {next + 64 * first, last - first};
    }
};

template <typename K>
const typename K::Weight* tile_weights(const typename K::Args& a, std::int64_t tile) {
    return a.packed + tile * K::tile_elements(a.k);
}

// acc + bias + residual, rounded once into out's dtype; columns past n are masked off. A gated
// tile holds 16 gate columns and their 16 up columns: out columns 16t .. 16t + 15 get
// silu(gate) * up.
template <typename K, int R>
PAGEDSERVE_LINEAR_TARGET void store_tile(const typename K::Args& a, std::int64_t row0,
                                         std::int64_t tile, __m512 (&acc)[R][2]) {
    if (a.gated_width > 0) {
        const std::int64_t col = tile * kLinearGateCols;
        const __mmask16 mask = lanes(a.gated_width - col);
        for (int r = 0; r < R; ++r)
            K::store_row(a, row0 + r, col, silu_mul(acc[r][0], acc[r][1]), mask);
        return;
    }
    const std::int64_t col0 = tile * kLinearTileN;
    const __mmask16 mask[2] = {lanes(a.n - col0), lanes(a.n - col0 - 16)};
    for (int h = 0; h < 2; ++h) {
        const std::int64_t col = col0 + 16 * h;
        const __m512 bias = a.bias ? K::load(a.bias + col, mask[h]) : _mm512_setzero_ps();
        for (int r = 0; r < R; ++r) {
            __m512 v = _mm512_add_ps(acc[r][h], bias);
            if (a.residual)
                v = _mm512_add_ps(v, K::load(a.residual + (row0 + r) * a.residual_stride + col,
                                             mask[h]));
            K::store_row(a, row0 + r, col, v, mask[h]);
        }
    }
}

template <typename K, int R>
PAGEDSERVE_LINEAR_TARGET void row_block(const typename K::Args& a, std::int64_t row0,
                                        std::int64_t tile0, std::int64_t tile_end,
                                        const PanelPrefetch& prefetch, std::int64_t& part) {
    for (std::int64_t t = tile0; t < tile_end; ++t) {
        __m512 acc[R][2];
        K::template product<R>(a, row0, tile_weights<K>(a, t), prefetch.part(part++), acc);
        store_tile<K, R>(a, row0, t, acc);
    }
}

// f(std::integral_constant<int, count>{}) for a count of 1 .. kRows - 1 known only at run time
// (micro-tile heights are template arguments); nothing for 0.
template <typename F>
void with_rows(std::int64_t count, F f) {
    switch (count) {
        case 7: return f(std::integral_constant<int, 7>{});
        case 6: return f(std::integral_constant<int, 6>{});
        case 5: return f(std::integral_constant<int, 5>{});
        case 4: return f(std::integral_constant<int, 4>{});
        case 3: return f(std::integral_constant<int, 3>{});
        case 2: return f(std::integral_constant<int, 2>{});
        case 1: return f(std::integral_constant<int, 1>{});
        default: return;
    }
}

// The next panel's weights (tiles [next0, next_end)) in cache lines, spread over `parts` sweeps.
template <typename K>
PanelPrefetch panel_prefetch(const typename K::Args& a, std::int64_t next0, std::int64_t next_end,
                             std::int64_t parts) {
    const auto* next = tile_weights<K>(a, next0);
    const std::int64_t next_bytes = (tile_weights<K>(a, next_end) - next) * sizeof(*next);
    return {reinterpret_cast<const char*>(next), next_bytes / 64, parts};
}

// Rows [row0, row0 + rows) x tiles [tile0, tile_end): 8 rows at a time across the whole panel,
// so the panel's weights stay in L2 and each output row is written in one contiguous run.
// Meanwhile the thread's next panel, tiles [next0, next_end), is fetched into L2 a line at a
// time: without it each panel's first sweep waits on memory (~10% of a decode step's products,
// whose weights never fit in the L3).
template <typename K>
PAGEDSERVE_LINEAR_TARGET void run_item(const typename K::Args& a, std::int64_t row0,
                                       std::int64_t rows, std::int64_t tile0,
                                       std::int64_t tile_end, std::int64_t next0,
                                       std::int64_t next_end) {
    const std::int64_t blocks = (rows + kRows - 1) / kRows;
    const PanelPrefetch prefetch =
        panel_prefetch<K>(a, next0, next_end, blocks * (tile_end - tile0));
    std::int64_t part = 0;
    std::int64_t r = row0;
    for (; r + kRows <= row0 + rows; r += kRows) {
        row_block<K, kRows>(a, r, tile0, tile_end, prefetch, part);
    }
    with_rows(row0 + rows - r, [&](auto count) {  // the last rows of the chunk, fewer than kRows
        row_block<K, decltype(count)::value>(a, r, tile0, tile_end, prefetch, part);
    });
}

// How an item's rows x tiles are computed: MicroTiles, 8 rows at a time in vector registers
// (run_item above); the AMX kernel brings its own (linear/amx.hpp).
template <typename K>
struct MicroTiles {
    PAGEDSERVE_LINEAR_TARGET static void run(const typename K::Args& a, std::int64_t row0,
                                             std::int64_t rows, std::int64_t tile0,
                                             std::int64_t tile_end, std::int64_t next0,
                                             std::int64_t next_end) {
        run_item<K>(a, row0, rows, tile0, tile_end, next0, next_end);
    }
};

// Where panel p of a share starts, in tiles from the share's first: panels of 1, 1, 2, 4, ...
// tiles up to per_panel, then per_panel each. Only the first is waited for (its first sweep
// reads memory); each next one is prefetched while the one before computes.
inline std::int64_t panel_offset(std::int64_t p, std::int64_t per_panel) {
    std::int64_t offset = 0;
    for (; p > 0 && offset < per_panel; --p) offset += std::max<std::int64_t>(offset, 1);
    return offset + p * per_panel;
}

// One thread's share of the work: the tiles [begin, end) in panels, swept for every chunk of
// rows. Item i is panel i % panels of row chunk i / panels; `next` hands the items out in that
// order, to the owner first and then to any thread that has finished its own share.
struct alignas(64) Share {
    std::int64_t begin = 0, end = 0, per_panel = 1, panels = 0, items = 0;
    std::atomic<std::int64_t> next{0};

    void plan(std::int64_t first, std::int64_t last, std::int64_t panel_tiles,
              std::int64_t row_chunks) {
        begin = first;
        end = last;
        per_panel = panel_tiles;
        for (panels = 0; panel_start(panels) < end;) ++panels;
        items = panels * row_chunks;
        next.store(0, std::memory_order_relaxed);
    }
    std::int64_t panel_start(std::int64_t p) const {
        return std::min(end, begin + panel_offset(p, per_panel));
    }
};

// Runs item i of a share: its rows x its panel, prefetching the item after it (the share's
// next panel, or its first panel again for the next chunk of rows).
// No target attribute from here on: the scheduling is ISA-free, and Item::run (compiled for its
// own ISA) is a call per item, not inlined (the AVX2 kernel shares it: linear_quant_avx2.cpp).
template <typename K, typename Item>
void run_share_item(const typename K::Args& a, const Share& s,
                                             std::int64_t i) {
    const std::int64_t chunk = i / s.panels, p = i % s.panels;
    const std::int64_t row0 = chunk * kChunkRows, rows = std::min(kChunkRows, a.m - row0);
    const bool more = i + 1 < s.items;
    const std::int64_t q = (p + 1) % s.panels;
    Item::run(a, row0, rows, s.panel_start(p), s.panel_start(p + 1),
              more ? s.panel_start(q) : s.end, more ? s.panel_start(q + 1) : s.end);
}

template <typename K, typename Item = MicroTiles<K>>
void run_linear(const typename K::Args& a, int num_threads) {
    const std::int64_t tiles = num_tiles(a.n);
    const bool small = a.m * a.n * a.k < kMinParallelMacs;
    const int threads = small ? 1 : static_cast<int>(std::min<std::int64_t>(num_threads, tiles));
    // Each thread owns an equal share of the tiles (never a whole panel more than another). A
    // thread that finishes its share takes the items its peers have not started: a thread the
    // OS preempts (the server's event loop, the tokenizer, another process on the same cores)
    // then costs the step its own lost time, not that time twice (its peers idling at the
    // barrier). Who computes an item never changes its result: every output element is one
    // accumulator over k in order.
    const std::int64_t tile_bytes = K::tile_elements(a.k) * sizeof(typename K::Weight);
    const std::int64_t per_panel = std::max<std::int64_t>(1, kPanelBytes / tile_bytes);
    const std::int64_t row_chunks = (a.m + kChunkRows - 1) / kChunkRows;
    std::vector<Share> shares(threads);
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), count = omp_get_num_threads();
        shares[t].plan(tiles * t / count, tiles * (t + 1) / count, per_panel, row_chunks);
#pragma omp barrier
        for (int k = 0; k < count; ++k) {  // its own share first, then the others' leftovers
            Share& s = shares[(t + k) % count];
            for (std::int64_t i; (i = s.next.fetch_add(1, std::memory_order_relaxed)) < s.items;) {
                run_share_item<K, Item>(a, s, i);
                if (k > 0) items_taken_over.fetch_add(1, std::memory_order_relaxed);
            }
        }
    }
}
#endif  // PAGEDSERVE_X86

// Packs n weight rows of k features into tiles of 32 columns, kFeatures consecutive features
// of a column side by side (2: AVX512-BF16's pairs, 1: fp32): packed element
// [tile][step][column][feature] = row (32 tile + column)'s feature (kFeatures step + feature),
// read from source_row(col) (null: zeros), zero-padded.
template <int kFeatures, typename T, typename SourceRow>
void pack_rows(SourceRow source_row, std::int64_t n, std::int64_t k, T* packed, int num_threads) {
    const std::int64_t tiles = num_tiles(n), steps = (k + kFeatures - 1) / kFeatures;
    const std::int64_t step_elements = kFeatures * kLinearTileN;
#pragma omp parallel for num_threads(std::max(1, num_threads)) schedule(static)
    for (std::int64_t t = 0; t < tiles; ++t) {
        T* out = packed + t * steps * step_elements;
        for (std::int64_t p = 0; p < steps; ++p) {
            for (std::int64_t j = 0; j < kLinearTileN; ++j) {
                const std::int64_t col = t * kLinearTileN + j;
                const T* row = col < n ? source_row(col) : nullptr;
                for (std::int64_t h = 0; h < kFeatures; ++h) {
                    const std::int64_t feature = kFeatures * p + h;
                    out[p * step_elements + kFeatures * j + h] = row && feature < k ? row[feature] : T{0};
                }
            }
        }
    }
}

// Gated weights (gate rows then up rows, [2 width, k]): source row of packed column col, so that
// every tile holds 16 gate columns and their 16 up columns (see kLinearGateCols).
template <typename T>
const T* gated_source_row(const T* weight, std::int64_t width, std::int64_t k, std::int64_t col) {
    const std::int64_t block = col / kLinearTileN, lane = col % kLinearTileN;
    const bool up = lane >= kLinearGateCols;
    const std::int64_t out_col = block * kLinearGateCols + lane % kLinearGateCols;
    if (out_col >= width) return nullptr;
    return weight + ((up ? width : 0) + out_col) * k;
}

inline void check_linear(bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument(message);
}

// The checks every product's arguments pass (`name`: the entry point, for the messages); false
// when there is nothing to do (no rows: torch gives an empty tensor a null data pointer).
template <typename Args>
bool check_linear_args(const Args& a, const std::string& name) {
    check_linear(a.m >= 0 && a.n > 0 && a.k > 0, name + ": bad m, n or k");
    if (a.m == 0) return false;
    check_linear(a.x && a.packed && a.out, name + ": null x, packed weight or out");
    check_linear(a.x_stride >= a.k && (a.gated_width > 0 || a.out_stride >= a.n),
                 name + ": row stride too small");
    check_linear(!a.residual || a.residual_stride >= a.n, name + ": residual stride too small");
    if (a.gated_width > 0) {
        check_linear(a.n == gated_rows(a.gated_width) && !a.bias && !a.residual,
                     name + ": a gated product takes gated_rows(gated_width) weight rows and no "
                            "bias or residual");
        check_linear(a.out_stride >= a.gated_width, name + ": row stride too small");
    }
    return true;
}

}  // namespace pagedserve::linear_detail
