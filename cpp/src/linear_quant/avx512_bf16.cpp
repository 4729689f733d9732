// The quantized linear kernel from ISA level avx512_bf16 up (kernels.hpp): avx512_vnni.hpp's
// kernel compiled with AVX512-BF16 and AVX512-VNNI, bf16 outputs by vcvtneps2bf16; from
// amx_from_rows rows on AMX-INT8 tiles (amx.hpp: level amx, or their emulation); and the
// measured alternative to int8 activations, dequant-bf16 (bench/linear.py --quantized ...
// dequant-bf16): weights converted to bf16 in registers, AVX512-BF16 dot products with bf16 x.
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // AVX-512 intrinsics: elsewhere quant_linear never takes this path
#include <cstring>

// The driver's own target (driver.hpp: AVX-512 F/BW/VL and AVX512-BF16); the kernel's adds VNNI.
#include "linear/driver.hpp"
#define PAGEDSERVE_QUANT_TARGET \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni")))
#define PAGEDSERVE_QUANT_HW_BF16 1
#include "linear_quant/amx.hpp"
#include "linear_quant/avx512_vnni.hpp"

namespace pagedserve::quant_detail {
namespace {

// dequant-bf16's groups: weights converted to bf16 in registers (exact: u < 256), AVX512-BF16
// dot products with the bf16 activations, then scale * dot + min * sum(x) per group. bf16 x only.
template <int kBits, int kGroup, bool kHalf>
struct QuantBf16 {
    static constexpr Format kFormat{kBits, kGroup, kHalf};
    static constexpr int kGroupRows = 4;  // rows per group call (sweep's groups)

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
    PAGEDSERVE_QUANT_TARGET PAGEDSERVE_QUANT_INLINE static void group(
        const Args& a, std::int64_t row0, int r0, std::int64_t b, std::int64_t g,
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
            const quant_detail::HalfScales sc =
                quant_detail::half_scales<kHalf>(kFormat, block, g, h);
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

template <typename T, bool kDequantBf16 = false>
void run_products(const QuantLinearArgs& a, const std::uint8_t* acts, std::int64_t row_bytes,
                  int num_threads) {
    const bool tiles = !kDequantBf16 && a.amx_from_rows > 0 && a.m >= a.amx_from_rows &&
                       amx_usable(true);
    with_kernel<T, kDequantBf16>(a, [&](auto kernel) {
        run_kernel<decltype(kernel)>(typed<T>(a, acts, row_bytes), num_threads, tiles);
    });
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

void quant_linear_avx512_bf16(const QuantLinearArgs& args, const std::uint8_t* acts,
                              std::int64_t act_row_bytes, int num_threads) {
    if (args.float32) return run_products<float>(args, acts, act_row_bytes, num_threads);
    run_products<std::uint16_t>(args, acts, act_row_bytes, num_threads);
}

void quant_linear_dequant_bf16(const QuantLinearArgs& args, std::uint8_t* scratch,
                               std::int64_t act_row_bytes, int num_threads) {
    sum_rows(args, scratch, act_row_bytes);
    run_products<std::uint16_t, true>(args, scratch, act_row_bytes, num_threads);
}

}  // namespace pagedserve::quant_detail
#endif  // PAGEDSERVE_X86
