// CPU bf16 linear layers with AVX512-BF16 (see linear.hpp). Each thread owns an equal run of
// 32-column weight tiles and walks it in L2-sized panels: for every 8 rows of a chunk of up to
// kChunkRows rows it sweeps the panel, so the panel is read from memory once per chunk and each
// output row is written in one contiguous run, while the next panel is prefetched into L2.
// Within an item, a micro-tile of 8 rows x 32 columns keeps 16 fp32 accumulators in registers:
// per pair of input features, 2 weight loads feed 16 dot-product instructions. The epilogue adds
// bias and residual, or for a gated product applies SiLU-and-mul to the tile's gate and up halves.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "pagedserve/linear.hpp"

#define PAGEDSERVE_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace pagedserve {
namespace {

constexpr std::int64_t kRows = 8;          // rows per micro-tile (2 x 8 accumulators)
constexpr std::int64_t kChunkRows = 256;   // rows per work item
constexpr std::int64_t kPanelBytes = 256 << 10;  // packed weights per work item: L2-resident
constexpr std::int64_t kPairRow = 2 * kLinearTileN;  // packed elements per feature pair
constexpr std::int64_t kMinParallelMacs = 1 << 18;   // below ~20 us of work, one thread

std::int64_t num_pairs(std::int64_t k) { return (k + 1) / 2; }
std::int64_t num_tiles(std::int64_t n) { return (n + kLinearTileN - 1) / kLinearTileN; }

PAGEDSERVE_BF16_TARGET inline __mmask16 lanes(std::int64_t count) {
    if (count >= 16) return 0xffff;
    return count <= 0 ? 0 : static_cast<__mmask16>((1u << count) - 1);
}

PAGEDSERVE_BF16_TARGET inline __m512 load_bf16(const std::uint16_t* p, __mmask16 mask) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// The bf16 pair (x[i], x[i + 1]) as one 32-bit lane broadcast to all 16; past the end of an
// odd-length row the second half is zero (it meets the zero padding of the packed weight).
PAGEDSERVE_BF16_TARGET inline __m512bh broadcast_pair(const std::uint16_t* x, bool whole) {
    std::uint32_t pair = x[0];
    if (whole) std::memcpy(&pair, x, sizeof(pair));
    return reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
}

// Cache lines of the weights to bring into L2 while a micro-tile computes (see run_item).
struct Prefetch {
    const char* begin = nullptr;
    std::int64_t lines = 0;
};

template <int R>
PAGEDSERVE_BF16_TARGET void tile_product(const LinearArgs& a, std::int64_t row0,
                                         const std::uint16_t* w, Prefetch prefetch,
                                         __m512 (&acc)[R][2]) {
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const std::uint16_t* x = a.x + row0 * a.x_stride;
    const std::int64_t pairs = num_pairs(a.k);
    for (std::int64_t p = 0; p < pairs; ++p) {
        // One line per feature pair (16 dot products) keeps the requests spread out.
        if (p < prefetch.lines) _mm_prefetch(prefetch.begin + 64 * p, _MM_HINT_T1);
        const bool whole = 2 * p + 1 < a.k;
        const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + p * kPairRow));
        const __m512bh w1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + p * kPairRow + 32));
        for (int r = 0; r < R; ++r) {
            const __m512bh xr = broadcast_pair(x + r * a.x_stride + 2 * p, whole);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xr, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xr, w1);
        }
    }
}

PAGEDSERVE_BF16_TARGET inline void store(const LinearArgs& a, std::int64_t row, std::int64_t col,
                                         __m512 v, __mmask16 mask) {
    if (a.out_float32) {
        _mm512_mask_storeu_ps(static_cast<float*>(a.out) + row * a.out_stride + col, mask, v);
    } else {
        const __m256i bits = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));  // nearest-even
        auto* out = static_cast<std::uint16_t*>(a.out) + row * a.out_stride + col;
        _mm256_mask_storeu_epi16(out, mask, bits);
    }
}

// e^y for every float y: Cody-Waite reduction by ln 2, a degree-7 Taylor polynomial on
// |f| <= ln(2) / 2 (~1e-7 relative), and scalef for the power of two (so huge |y| gives 0 or
// inf, not garbage). NaN stays NaN.
PAGEDSERVE_BF16_TARGET inline __m512 exp_ps(__m512 y) {
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
PAGEDSERVE_BF16_TARGET inline __m512 silu_mul(__m512 gate, __m512 up) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), gate));
    return _mm512_div_ps(_mm512_mul_ps(gate, up), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

// A gated tile holds 16 gate columns and their 16 up columns: out columns 16t .. 16t + 15.
template <int R>
PAGEDSERVE_BF16_TARGET void store_gated_tile(const LinearArgs& a, std::int64_t row0,
                                             std::int64_t tile, __m512 (&acc)[R][2]) {
    const std::int64_t col = tile * kLinearGateCols;
    const __mmask16 mask = lanes(a.gated_width - col);
    for (int r = 0; r < R; ++r) store(a, row0 + r, col, silu_mul(acc[r][0], acc[r][1]), mask);
}

// acc + bias + residual, rounded once into out's dtype; columns past n are masked off.
template <int R>
PAGEDSERVE_BF16_TARGET void store_tile(const LinearArgs& a, std::int64_t row0, std::int64_t tile,
                                       __m512 (&acc)[R][2]) {
    if (a.gated_width > 0) return store_gated_tile<R>(a, row0, tile, acc);
    const std::int64_t col0 = tile * kLinearTileN;
    const __mmask16 mask[2] = {lanes(a.n - col0), lanes(a.n - col0 - 16)};
    for (int h = 0; h < 2; ++h) {
        const std::int64_t col = col0 + 16 * h;
        const __m512 bias = a.bias ? load_bf16(a.bias + col, mask[h]) : _mm512_setzero_ps();
        for (int r = 0; r < R; ++r) {
            __m512 v = _mm512_add_ps(acc[r][h], bias);
            if (a.residual) {
                const std::uint16_t* res = a.residual + (row0 + r) * a.residual_stride + col;
                v = _mm512_add_ps(v, load_bf16(res, mask[h]));
            }
            store(a, row0 + r, col, v, mask[h]);
        }
    }
}

const std::uint16_t* tile_weights(const LinearArgs& a, std::int64_t tile) {
    return a.packed + tile * num_pairs(a.k) * kPairRow;
}

// The next panel's weights, split evenly over the micro-tiles that sweep this one.
struct PanelPrefetch {
    const char* next = nullptr;
    std::int64_t lines = 0, parts = 1;

    Prefetch part(std::int64_t i) const {
        const std::int64_t first = lines * i / parts, last = lines * (i + 1) / parts;
        return {next + 64 * first, last - first};
    }
};

template <int R>
PAGEDSERVE_BF16_TARGET void row_block(const LinearArgs& a, std::int64_t row0, std::int64_t tile0,
                                      std::int64_t tile_end, const PanelPrefetch& prefetch,
                                      std::int64_t& part) {
    for (std::int64_t t = tile0; t < tile_end; ++t) {
        __m512 acc[R][2];
        tile_product<R>(a, row0, tile_weights(a, t), prefetch.part(part++), acc);
        store_tile<R>(a, row0, t, acc);
    }
}

// Rows [row0, row0 + rows) x tiles [tile0, tile_end): 8 rows at a time across the whole panel,
// so the panel's weights stay in L2 and each output row is written in one contiguous run.
// Meanwhile the thread's next panel, tiles [next0, next_end), is fetched into L2 a line at a
// time: without it each panel's first sweep waits on memory (~10% of a decode step's products,
// whose weights never fit in the L3).
PAGEDSERVE_BF16_TARGET void run_item(const LinearArgs& a, std::int64_t row0, std::int64_t rows,
                                     std::int64_t tile0, std::int64_t tile_end, std::int64_t next0,
                                     std::int64_t next_end) {
    const std::int64_t blocks = (rows + kRows - 1) / kRows;
    const std::int64_t next_bytes = (tile_weights(a, next_end) - tile_weights(a, next0)) * 2;
    const PanelPrefetch prefetch{reinterpret_cast<const char*>(tile_weights(a, next0)),
                                 next_bytes / 64, blocks * (tile_end - tile0)};
    std::int64_t part = 0;
    std::int64_t r = row0;
    for (; r + kRows <= row0 + rows; r += kRows) {
        row_block<kRows>(a, r, tile0, tile_end, prefetch, part);
    }
    switch (row0 + rows - r) {  // the last rows of the chunk, fewer than kRows
        case 7: return row_block<7>(a, r, tile0, tile_end, prefetch, part);
        case 6: return row_block<6>(a, r, tile0, tile_end, prefetch, part);
        case 5: return row_block<5>(a, r, tile0, tile_end, prefetch, part);
        case 4: return row_block<4>(a, r, tile0, tile_end, prefetch, part);
        case 3: return row_block<3>(a, r, tile0, tile_end, prefetch, part);
        case 2: return row_block<2>(a, r, tile0, tile_end, prefetch, part);
        case 1: return row_block<1>(a, r, tile0, tile_end, prefetch, part);
        default: return;
    }
}

PAGEDSERVE_BF16_TARGET void run_linear(const LinearArgs& a, int num_threads) {
    const std::int64_t tiles = num_tiles(a.n);
    const bool small = a.m * a.n * a.k < kMinParallelMacs;
    const int threads = small ? 1 : static_cast<int>(std::min<std::int64_t>(num_threads, tiles));
    // Each thread owns an equal share of the tiles (never a whole panel more than another) and
    // walks it in panels of up to as many tiles as fit kPanelBytes, for every chunk of rows.
    const std::int64_t tile_bytes = num_pairs(a.k) * kPairRow * 2;
    const std::int64_t per_panel = std::max<std::int64_t>(1, kPanelBytes / tile_bytes);
#pragma omp parallel num_threads(threads)
    {
        const std::int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
        const std::int64_t begin = tiles * t / count, end = tiles * (t + 1) / count;
        // Panels of 1, 1, 2, 4, ... tiles up to per_panel: only the first is waited for (its
        // first sweep reads memory), each next one is prefetched while the one before computes.
        const auto panel_end = [&](std::int64_t tile0) {
            return std::min(end, tile0 + std::clamp<std::int64_t>(tile0 - begin, 1, per_panel));
        };
        for (std::int64_t row0 = 0; row0 < a.m; row0 += kChunkRows) {
            const std::int64_t rows = std::min(kChunkRows, a.m - row0);
            const bool more_rows = row0 + kChunkRows < a.m;
            for (std::int64_t tile0 = begin, tile_end; tile0 < end; tile0 = tile_end) {
                tile_end = panel_end(tile0);
                // After the share's last panel, its first again for the next chunk of rows.
                const std::int64_t next0 = tile_end < end ? tile_end : (more_rows ? begin : end);
                run_item(a, row0, rows, tile0, tile_end, next0, next0 < end ? panel_end(next0) : end);
            }
        }
    }
}

void check(bool ok, const char* message) {
    if (!ok) throw std::invalid_argument(message);
}

}  // namespace

std::int64_t packed_linear_elements(std::int64_t n, std::int64_t k) {
    return num_tiles(n) * num_pairs(k) * kPairRow;
}

namespace {

// Packs n weight rows, row `col` of the packed weight read from source_row(col) (null: zeros).
template <typename SourceRow>
void pack_rows(SourceRow source_row, std::int64_t n, std::int64_t k, std::uint16_t* packed,
               int num_threads) {
    const std::int64_t tiles = num_tiles(n), pairs = num_pairs(k);
#pragma omp parallel for num_threads(std::max(1, num_threads)) schedule(static)
    for (std::int64_t t = 0; t < tiles; ++t) {
        std::uint16_t* out = packed + t * pairs * kPairRow;
        for (std::int64_t p = 0; p < pairs; ++p) {
            for (std::int64_t j = 0; j < kLinearTileN; ++j) {
                const std::int64_t col = t * kLinearTileN + j;
                const std::uint16_t* row = col < n ? source_row(col) : nullptr;
                for (std::int64_t h = 0; h < 2; ++h) {
                    const std::int64_t feature = 2 * p + h;
                    out[p * kPairRow + 2 * j + h] = row && feature < k ? row[feature] : 0;
                }
            }
        }
    }
}

}  // namespace

void pack_linear_weight_bf16(const std::uint16_t* weight, std::int64_t n, std::int64_t k,
                             std::uint16_t* packed, int num_threads) {
    check(n > 0 && k > 0, "pack_linear_weight_bf16: n and k must be positive");
    pack_rows([&](std::int64_t col) { return weight + col * k; }, n, k, packed, num_threads);
}

void pack_gated_weight_bf16(const std::uint16_t* weight, std::int64_t width, std::int64_t k,
                            std::uint16_t* packed, int num_threads) {
    check(width > 0 && k > 0, "pack_gated_weight_bf16: width and k must be positive");
    const auto source_row = [&](std::int64_t col) -> const std::uint16_t* {
        const std::int64_t block = col / kLinearTileN, lane = col % kLinearTileN;
        const bool up = lane >= kLinearGateCols;
        const std::int64_t out_col = block * kLinearGateCols + lane % kLinearGateCols;
        if (out_col >= width) return nullptr;
        return weight + ((up ? width : 0) + out_col) * k;
    };
    pack_rows(source_row, gated_rows(width), k, packed, num_threads);
}

bool linear_bf16_supported() {
    // Once per process: linear_bf16 asks on every call, several times per layer and step.
    static const bool supported = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
    }();
    return supported;
}

void linear_bf16(const LinearArgs& args, int num_threads) {
    if (!linear_bf16_supported()) throw std::runtime_error("this CPU has no AVX512-BF16");
    check(args.m >= 0 && args.n > 0 && args.k > 0, "linear_bf16: bad m, n or k");
    // No rows is a valid product with nothing to read or write: torch gives an empty tensor a
    // null data pointer (e.g. the logits of a step whose prefill chunks all end mid-prompt).
    if (args.m == 0) return;
    check(args.x && args.packed && args.out, "linear_bf16: null x, packed weight or out");
    check(args.x_stride >= args.k && (args.gated_width > 0 || args.out_stride >= args.n),
          "linear_bf16: row stride too small");
    check(!args.residual || args.residual_stride >= args.n, "linear_bf16: residual stride too small");
    if (args.gated_width > 0) {
        check(args.n == gated_rows(args.gated_width) && !args.bias && !args.residual,
              "linear_bf16: a gated product takes gated_rows(gated_width) weight rows and no "
              "bias or residual");
        check(args.out_stride >= args.gated_width, "linear_bf16: row stride too small");
    }
    run_linear(args, std::max(1, num_threads));
}

}  // namespace pagedserve
