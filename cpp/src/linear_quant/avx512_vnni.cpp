// The AVX512-VNNI path of the quantized linear kernel (kernels.hpp has the table of paths): the
// packed blocks' u8 values times the int8 activations by vpdpbusd on the shared linear driver
// (linear/driver.hpp: threads over 32-column tiles, L2 panels, prefetch, the bias / residual /
// fp32-logits / SiLU-gated epilogue), or, from amx_from_rows rows, on AMX-INT8 tiles (amx.hpp).
// At ISA level avx512 (no AVX512-BF16) bf16 outputs are rounded by integer operations: the same
// bits as vcvtneps2bf16 at avx512_bf16, where the dequant-bf16 alternative also runs.
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // AVX-512 intrinsics: elsewhere quant_linear never takes this path
#include <cstring>

#include "linear/driver.hpp"
#include "linear_quant/amx.hpp"
#include "linear_quant/kernels.hpp"
#include "linear_quant/layout.hpp"

#define PAGEDSERVE_QUANT_TARGET \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni")))
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

// Rows row0 .. row0 + R - 1 times one tile, for either kernel G: accumulators zeroed, then per
// block (prefetching a block's worth of the next panel) and group, G::group over up to 4 rows at
// a time (so that each activation broadcast feeds both half tiles within the 32 registers).
template <typename G, int R, typename Args>
PAGEDSERVE_QUANT_TARGET PAGEDSERVE_QUANT_INLINE void sweep(const Args& a, std::int64_t row0, const std::uint8_t* w,
                                   Prefetch prefetch, __m512 (&acc)[R][2]) {
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const std::int64_t blocks = a.k / kBlockK, block_bytes = G::kFormat.block_bytes();
    std::int64_t line = 0;
    for (std::int64_t b = 0; b < blocks; ++b) {
        for (std::int64_t i = 0; i <= block_bytes / 64 && line < prefetch.lines; ++i, ++line)
            _mm_prefetch(prefetch.begin + 64 * line, _MM_HINT_T1);
        const std::uint8_t* block = w + b * block_bytes;
        for (std::int64_t g = 0; g < G::kFormat.groups(); ++g) {
            if constexpr (R > 4) {
                G::template group<4, R>(a, row0, 0, b, g, block, acc);
                G::template group<R - 4, R>(a, row0, 4, b, g, block, acc);
            } else {
                G::template group<R, R>(a, row0, 0, b, g, block, acc);
            }
        }
    }
}

// The measured alternative to int8 activations (bench/linear.py --quantized ... dequant-bf16):
// weights converted to bf16 in registers (exact: u < 256), AVX512-BF16 dot products with the bf16
// activations, then scale * dot + min * sum(x) per group. bf16 x only.
template <int kBits, int kGroup, bool kHalf>
struct QuantBf16 {
    static constexpr Format kFormat{kBits, kGroup, kHalf};

    // bf16 pairs of features (4s, 4s + 1) -> lo and (4s + 2, 4s + 3) -> hi of 16 columns, from
    // the u8 operand of one vpdpbusd step: u as float by the 2^23 trick, then its top half.
    PAGEDSERVE_QUANT_TARGET static void split(__m512i v, __m512bh& lo, __m512bh& hi) {
        const __m512i magic = _mm512_set1_epi32(0x4B000000), byte = _mm512_set1_epi32(0xFF);
        const __m512 bias = _mm512_set1_ps(8388608.0f);
        const __m512i top = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
        __m512i f[4];
        for (int j = 0; j < 4; ++j) {
            const __m512i u = _mm512_and_si512(_mm512_srli_epi32(v, 8 * j), byte);
            f[j] = _mm512_castps_si512(
                _mm512_sub_ps(_mm512_castsi512_ps(_mm512_or_si512(u, magic)), bias));
        }
        lo = reinterpret_cast<__m512bh>(
            _mm512_or_si512(_mm512_srli_epi32(f[0], 16), _mm512_and_si512(f[1], top)));
        hi = reinterpret_cast<__m512bh>(
            _mm512_or_si512(_mm512_srli_epi32(f[2], 16), _mm512_and_si512(f[3], top)));
    }

    template <int Q, int R, typename Args>
    PAGEDSERVE_QUANT_TARGET PAGEDSERVE_QUANT_INLINE static void group(const Args& a, std::int64_t row0, int r0,
                                              std::int64_t b, std::int64_t g,
                                              const std::uint8_t* block, __m512 (&acc)[R][2]) {
        __m512 dot[Q][2];
        for (int r = 0; r < Q; ++r) dot[r][0] = dot[r][1] = _mm512_setzero_ps();
        for (std::int64_t s = g * kGroup / 4; s < (g + 1) * kGroup / 4; ++s) {
            __m512bh lo[2], hi[2];
            for (int h = 0; h < 2; ++h) split(step_values<kBits>(block, s, h), lo[h], hi[h]);
            for (int r = 0; r < Q; ++r) {
                const auto* x = reinterpret_cast<const std::uint16_t*>(a.x) +
                                (row0 + r0 + r) * a.x_stride + kBlockK * b + 4 * s;
                std::int32_t p0, p1;
                std::memcpy(&p0, x, 4), std::memcpy(&p1, x + 2, 4);
                const __m512bh x0 = reinterpret_cast<__m512bh>(_mm512_set1_epi32(p0));
                const __m512bh x1 = reinterpret_cast<__m512bh>(_mm512_set1_epi32(p1));
                for (int h = 0; h < 2; ++h) {
                    dot[r][h] = _mm512_dpbf16_ps(dot[r][h], lo[h], x0);
                    dot[r][h] = _mm512_dpbf16_ps(dot[r][h], hi[h], x1);
                }
            }
        }
        for (int h = 0; h < 2; ++h) {
            const quant_detail::HalfScales sc = quant_detail::half_scales<kHalf>(kFormat, block, g, h);
            for (int r = 0; r < Q; ++r) {
                const auto* sums = reinterpret_cast<const float*>(
                    a.acts + (row0 + r0 + r) * a.act_row_bytes);  // per 16 features
                const float sum = kGroup == 16 ? sums[2 * b + g] : sums[2 * b] + sums[2 * b + 1];
                __m512& out = acc[r0 + r][h];
                out = _mm512_fmadd_ps(dot[r][h], sc.scale, out);
                out = _mm512_fmadd_ps(sc.min, _mm512_set1_ps(sum), out);
            }
        }
    }
};

// kHwBf16: bf16 outputs rounded by vcvtneps2bf16 (AVX512-BF16 CPUs), else by bf16_bits (the
// same bits).
template <typename T, int kBits, int kGroup, bool kHalf, bool kDequantBf16 = false,
          bool kHwBf16 = true>
struct QuantKernel {
    using Args = QuantArgs<T>;
    using Weight = std::uint8_t;
    static constexpr Format kFormat{kBits, kGroup, kHalf};
    static constexpr bool kDequant = kDequantBf16;
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
    PAGEDSERVE_QUANT_TARGET PAGEDSERVE_QUANT_INLINE static void group(const Args& a, std::int64_t row0, int r0,
                                              std::int64_t b, std::int64_t g,
                                              const std::uint8_t* block, __m512 (&acc)[R][2]) {
        const std::uint8_t* act[Q];
        for (int r = 0; r < Q; ++r) act[r] = a.acts + (row0 + r0 + r) * a.act_row_bytes;
        __m512i isum[Q][2];
        for (int r = 0; r < Q; ++r) isum[r][0] = isum[r][1] = _mm512_setzero_si512();
        for (std::int64_t s = g * kSteps; s < (g + 1) * kSteps; ++s) {
            const __m512i w0 = step_values<kBits>(block, s, 0);
            const __m512i w1 = step_values<kBits>(block, s, 1);
            for (int r = 0; r < Q; ++r) {
                std::int32_t x4;
                std::memcpy(&x4, act[r] + kBlockK * b + 4 * s, sizeof(x4));
                const __m512i xv = _mm512_set1_epi32(x4);
                isum[r][0] = _mm512_dpbusd_epi32(isum[r][0], w0, xv);
                isum[r][1] = _mm512_dpbusd_epi32(isum[r][1], w1, xv);
            }
        }
        for (int h = 0; h < 2; ++h) {
            const quant_detail::HalfScales sc = quant_detail::half_scales<kHalf>(kFormat, block, g, h);
            for (int r = 0; r < Q; ++r) {
                const ActivationRow row(act[r], a.k);
                acc[r0 + r][h] = quant_detail::fold_group(acc[r0 + r][h], isum[r][h], sc, row.d[b],
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
            __m256i bits;
            if constexpr (kHwBf16) {
                bits = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
            } else {
                bits = bf16_bits(v);
            }
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

// Kernel K on the VNNI micro-tiles, or on AMX-INT8 tiles (same bits: linear_quant/amx.hpp).
template <typename K>
void run_kernel(const typename K::Args& a, int num_threads, bool tiles) {
    if (!tiles) return run_linear<K>(a, num_threads);
    if constexpr (!K::kDequant) {
        if (amx_emulated.load(std::memory_order_relaxed))
            return run_linear<K, AmxQuantItems<K, SoftwareTiles>>(a, num_threads);
        run_linear<K, AmxQuantItems<K, HardwareTiles>>(a, num_threads);
    }
}

template <typename T, bool kBf16 = false, bool kHwBf16 = true>
void run_vnni(const QuantLinearArgs& a, const std::uint8_t* acts, std::int64_t row_bytes,
              int num_threads) {
    const QuantArgs<T> t = typed<T>(a, acts, row_bytes);
    const Format f = quant_detail::format_of(a.ggml_type);
    const bool tiles = !kBf16 && kHwBf16 && a.amx_from_rows > 0 && a.m >= a.amx_from_rows &&
                       amx_usable(true);
    if (f.bits == 4 && f.half_scales)  // Q4_0, Q4_1
        return run_kernel<QuantKernel<T, 4, 32, true, kBf16, kHwBf16>>(t, num_threads, tiles);
    if (f.bits == 4)  // Q4_K
        return run_kernel<QuantKernel<T, 4, 32, false, kBf16, kHwBf16>>(t, num_threads, tiles);
    if (f.half_scales)  // Q8_0
        return run_kernel<QuantKernel<T, 8, 32, true, kBf16, kHwBf16>>(t, num_threads, tiles);
    if (f.group_size == 32)  // Q5_K
        return run_kernel<QuantKernel<T, 8, 32, false, kBf16, kHwBf16>>(t, num_threads, tiles);
    run_kernel<QuantKernel<T, 8, 16, false, kBf16, kHwBf16>>(t, num_threads, tiles);  // Q6_K
}

// Per row, the fp32 sum of each 16 bf16 features, in order (dequant_bf16's min terms).
void sum_rows(const QuantLinearArgs& a, std::uint8_t* out, std::int64_t row_bytes) {
    const auto* x = static_cast<const std::uint16_t*>(a.x);
    for (std::int64_t r = 0; r < a.m; ++r) {
        auto* sums = reinterpret_cast<float*>(out + r * row_bytes);
        for (std::int64_t g = 0; g < a.k / 16; ++g) {
            float sum = 0.0f;
            for (std::int64_t i = 0; i < 16; ++i) {
                const std::uint32_t bits = static_cast<std::uint32_t>(x[r * a.x_stride + 16 * g + i])
                                           << 16;
                float v;
                std::memcpy(&v, &bits, sizeof(v));
                sum += v;
            }
            sums[g] = sum;
        }
    }
}

}  // namespace

void quant_linear_avx512_vnni(const QuantLinearArgs& args, const std::uint8_t* acts,
                              std::int64_t act_row_bytes, int num_threads, bool hardware_bf16) {
    if (args.float32) return run_vnni<float>(args, acts, act_row_bytes, num_threads);
    if (!hardware_bf16)
        return run_vnni<std::uint16_t, false, false>(args, acts, act_row_bytes, num_threads);
    run_vnni<std::uint16_t>(args, acts, act_row_bytes, num_threads);
}

void quant_linear_dequant_bf16(const QuantLinearArgs& args, std::uint8_t* scratch,
                               std::int64_t act_row_bytes, int num_threads) {
    sum_rows(args, scratch, act_row_bytes);
    run_vnni<std::uint16_t, true>(args, scratch, act_row_bytes, num_threads);
}

}  // namespace pagedserve::quant_detail
#endif  // PAGEDSERVE_X86
