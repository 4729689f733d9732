// The AVX2 path of the quantized linear kernel (kernels.hpp has the table of paths): ISA level
// avx2, or avx512 on a CPU without AVX512-VNNI (Zen 1-3, Intel client CPUs, Skylake-X). The VNNI
// kernel's packed blocks, int8 activations, per-group fold and epilogue, in 8-lane registers:
// the same bits. Compiled twice: avx2.cpp for plain AVX2, avx2_vnni.cpp for CPUs with AVX-VNNI;
// each defines, before including this file, PAGEDSERVE_AVX2_TARGET (its target attribute),
// PAGEDSERVE_AVX2_VNNI (0 or 1) and PAGEDSERVE_AVX2_ENTRY (the entry's name, kernels.hpp).
//
// Plain AVX2: u8 x s8 products by vpmaddubsw, a pair of products per int16 lane: the exact int32
// sums vpdpbusd gives. 4-bit values sum over a group's steps in int16 (a value times |q| <= 127,
// two per lane, over at most 8 steps is <= 30,480), then vpmaddwd widens them. 8-bit values go in
// as s = u - 128 by the sign trick (vpmaddubsw of |s| and sign(x, s): a pair is at most 32,512),
// widened by vpmaddwd each step, and the group gets 128 sum(x) back once (the x rows' int8 sum);
// that is one vpmaddubsw per 32 products where the two nibbles of u took two, and 4 rows a
// micro-tile instead of 2. AVX-VNNI: vpdpbusd sums four products into int32 lanes, 8-bit whole.
//
// int16 activations (QuantLinearArgs::int16_activations, kActParts = 2): each row is two int8
// rows, hi and lo (q = 255 hi + lo, layout.hpp); a step's weight registers meet both, the sums
// of each part kept apart (R = 2 rows a micro-tile, so still 8 sums), and the fold takes
// 255 isum(hi) + isum(lo), exact in int32 (|.| <= 32 x 255 x 32512 < 2^31), in place of isum.
// 8-bit values without VNNI (kWide) take q whole instead: the rows put back together once a call
// (whole_int16_rows), the values zero-extended to int16, vpmaddwd; the same int32 sums, with half
// the instructions of the sign trick on both parts (Q8_0 1.8x at 32 rows, 1.25x at one).
//
// Work items come from the shared driver (linear/driver.hpp: shares, take-over, panels);
// within an item, R rows x one half tile (16 columns) at a time keep the int16 sums in registers
// (R = 4: 8 sums), each group's fold updating fp32 accumulators in
// L1, and the epilogue (bias, residual, SiLU-gated, bf16 or fp32) runs once per tile and row.
#pragma once

#include "cpu/arch.hpp"
#include "linear_quant/kernels.hpp"

#if PAGEDSERVE_X86  // AVX2 intrinsics: elsewhere quant_linear never takes this path
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "linear/driver.hpp"
#include "linear_quant/avx2_epilogue.hpp"
#include "linear_quant/layout.hpp"
#include "pagedserve/linear.hpp"

#define PAGEDSERVE_AVX2_INLINE inline __attribute__((always_inline))

namespace pagedserve::quant_detail {
namespace {

using linear_detail::Prefetch;

// The driver's view of one product (linear/driver.hpp's K::Args).
struct Avx2Args {
    const QuantLinearArgs* q = nullptr;
    const std::uint8_t* packed = nullptr;
    std::int64_t m = 0, n = 0, k = 0;
    const std::uint8_t* acts = nullptr;  // quantize_activations of x
    std::int64_t act_row_bytes = 0;
    const std::int16_t* q16 = nullptr;  // kWide: each int16 row's q = 255 hi + lo, k apart
};

// ---- the product ----

// An empty asm that takes v in a register and may change it: the sums are added in program
// order. Without it GCC reassociates a group's unrolled int16 sums, computing every product
// first and spilling them to the stack (objdump: 64 vpmaddubsw, 56 stores per group).
PAGEDSERVE_AVX2_TARGET PAGEDSERVE_AVX2_INLINE void in_register(__m256i& v) { asm("" : "+x"(v)); }

template <int kBits, int kGroup, bool kHalf, int kActParts = 1>
struct Avx2Kernel {
    using Args = Avx2Args;
    using Weight = std::uint8_t;
    static constexpr Format kFormat{kBits, kGroup, kHalf};
    static constexpr bool kVnni = PAGEDSERVE_AVX2_VNNI;
    static constexpr int kSteps = kGroup / 4;  // 4-feature steps per group
    // 8-bit values without VNNI go in signed (s = u - 128) by the sign trick, two operands per
    // column vector: s for the signs, |s| as vpmaddubsw's u8 operand.
    static constexpr bool kSigned = kBits == 8 && !kVnni;
    static constexpr int kParts = kSigned ? 2 : 1;
    // int16 rows on 8-bit values without VNNI: vpmaddwd of the values widened to int16 and q
    // whole, two features a lane, in place of each part's sign trick: 4 instructions per 32
    // products, not 8 (group_wide).
    static constexpr bool kWide = kBits == 8 && kActParts == 2 && !kVnni;
    // Micro-tile rows: 8 sums in registers (kWide: 3 rows measured no faster than 2).
    static constexpr int kRows = 4 / kActParts;
    static_assert(kBits == 8 || kGroup == kBlockK, "4-bit formats have one group per block");

    static std::int64_t tile_elements(std::int64_t k) { return tile_bytes(kFormat, k); }

    // The operands of step s, half tile h, columns 8 c .. 8 c + 7 (c < 2): 4-bit values, 8-bit
    // ones whole (VNNI), or s = u - 128 (part 0) and |s| (part 1).
    PAGEDSERVE_AVX2_TARGET PAGEDSERVE_AVX2_INLINE static void values(const std::uint8_t* block,
                                                                       int s, int h, int c,
                                                                       __m256i (&v)[kParts]) {
        if constexpr (kBits == 8) {
            const __m256i w = _mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(block + (s * 2 + h) * 64 + 32 * c));
            if constexpr (kSigned) {
                v[0] = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
                v[kParts - 1] = _mm256_abs_epi8(v[0]);  // -128 -> 0x80: 128 as a u8
            } else {
                v[0] = w;
            }
        } else {
            const __m256i w = _mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(block + ((s % 4) * 2 + h) * 64 + 32 * c));
            v[0] = _mm256_and_si256(s < 4 ? w : _mm256_srli_epi16(w, 4), _mm256_set1_epi8(0x0F));
        }
    }

    // 128 x the sum of row act's int8 over group g of block b: what the signed products lack
    // (sum u x = sum s x + 128 sum x), exact in int32.
    PAGEDSERVE_AVX2_TARGET PAGEDSERVE_AVX2_INLINE static std::int32_t offset_sum(
        const std::uint8_t* act, std::int64_t b, int g) {
        const std::uint8_t* q = act + kBlockK * b + kGroup * g;
        __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
        __m128i pairs = _mm_maddubs_epi16(_mm_set1_epi8(1), x);
        if constexpr (kGroup == 32) {
            x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16));
            pairs = _mm_add_epi16(pairs, _mm_maddubs_epi16(_mm_set1_epi8(1), x));  // |.| <= 4064
        }
        __m128i sums = _mm_madd_epi16(pairs, _mm_set1_epi16(1));
        sums = _mm_add_epi32(sums, _mm_shuffle_epi32(sums, 0x4E));
        sums = _mm_add_epi32(sums, _mm_shuffle_epi32(sums, 0xB1));
        return 128 * _mm_cvtsi128_si32(sums);
    }

    // acc[r][16 h .. 16 h + 16) += group g of block b (half tile h) for rows row0 + r, r < R.
    template <int R>
    PAGEDSERVE_AVX2_TARGET PAGEDSERVE_AVX2_INLINE static void group(const Args& a,
                                                                      std::int64_t row0,
                                                                      const std::uint8_t* block,
                                                                      std::int64_t b, int g, int h,
                                                                      float (&acc)[R][32]) {
        if constexpr (kWide) return group_wide<R>(a, row0, block, b, g, h, acc);
        constexpr int P = kActParts;
        const std::uint8_t* act[R][P];  // part p of row r: its int8 values, k bytes apart
        for (int r = 0; r < R; ++r)
            for (int p = 0; p < P; ++p) act[r][p] = a.acts + (row0 + r) * a.act_row_bytes + p * a.k;
        // int16 pair sums over the group (4-bit), or int32 sums (VNNI; 8-bit signed: a pair of
        // products |s| sign(x, s) is at most 2 x 128 x 127 = 32,512, so each is widened at once).
        __m256i sum[R][P][2];
        for (int r = 0; r < R; ++r)
            for (int p = 0; p < P; ++p) sum[r][p][0] = sum[r][p][1] = _mm256_setzero_si256();
        [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);
        // Unrolled whole, so every step's offsets and nibble are constants and the sums stay
        // in registers (as a loop GCC kept three of the eight on the stack).
#pragma GCC unroll 8
        for (int i = 0; i < kSteps; ++i) {
            const int s = kBits == 4 ? i : g * kSteps + i;  // 4-bit: one group per block
            __m256i v[2][kParts];
            values(block, s, h, 0, v[0]);
            values(block, s, h, 1, v[1]);
#pragma GCC unroll 8
            for (int rp = 0; rp < R * P; ++rp) {
                const int r = rp / P, p = rp % P;
                std::int32_t x4;
                std::memcpy(&x4, act[r][p] + kBlockK * b + 4 * s, sizeof(x4));
                const __m256i x = _mm256_set1_epi32(x4);
#pragma GCC unroll 2
                for (int c = 0; c < 2; ++c) {
                    __m256i& to = sum[r][p][c];
#if PAGEDSERVE_AVX2_VNNI
                    to = _mm256_dpbusd_avx_epi32(to, v[c][0], x);
#else
                    if constexpr (kSigned) {
                        const __m256i pairs = _mm256_maddubs_epi16(
                            v[c][kParts - 1], _mm256_sign_epi8(x, v[c][0]));
                        const __m256i quads = _mm256_madd_epi16(pairs, ones);
                        to = i == 0 ? quads : _mm256_add_epi32(to, quads);
                    } else {
                        const __m256i product = _mm256_maddubs_epi16(v[c][0], x);
                        to = i == 0 ? product : _mm256_add_epi16(to, product);
                    }
#endif
                    in_register(to);
                }
            }
        }
        __m256i offset[R][P] = {};  // kSigned: each row's 128 sum(x), shared by both column vectors
        if constexpr (kSigned)
            for (int r = 0; r < R; ++r)
                for (int p = 0; p < P; ++p)
                    offset[r][p] = _mm256_set1_epi32(offset_sum(act[r][p], b, g));
        for (int c = 0; c < 2; ++c) {
            const std::int64_t lane0 = 16 * h + 8 * c;
            const __m256 scale = load_scales8(block + kFormat.scales_at(0, g), lane0);
            const __m256 min = load_scales8(block + kFormat.scales_at(1, g), lane0);
            for (int r = 0; r < R; ++r) {
                __m256i isum = int32_sum(sum[r][0][c], offset[r][0]);
                if constexpr (P == 2) {  // 255 isum(hi) + isum(lo)
                    isum = _mm256_sub_epi32(_mm256_slli_epi32(isum, 8), isum);
                    isum = _mm256_add_epi32(isum, int32_sum(sum[r][1][c], offset[r][1]));
                }
                fold(acc[r] + lane0, isum, scale, min, ActivationRow(act[r][0], a.k, P), b, g);
            }
        }
    }

    // group's kWide path, the same exact int32 sum u * q per column (so the same bits): the 8-bit
    // values u (stored unsigned) of a step's 8 columns x 4 features zero-extended into two
    // registers of int16 (columns 0-3 and 4-7, a column's 4 features adjacent), each met by
    // vpmaddwd with the row's 4 q broadcast (a lane: 2 features of one column; a pair of
    // products is at most 2 x 255 x 32512, a group's 16 pairs < 2^31). The fold adds a column's
    // two lanes (vphaddd, then the lanes put back in column order).
    template <int R>
    PAGEDSERVE_AVX2_TARGET PAGEDSERVE_AVX2_INLINE static void group_wide(
        const Args& a, std::int64_t row0, const std::uint8_t* block, std::int64_t b, int g, int h,
        float (&acc)[R][32]) {
        const std::int16_t* x[R];
        for (int r = 0; r < R; ++r) x[r] = a.q16 + (row0 + r) * a.k + kBlockK * b;
        __m256i sum[R][2][2];  // row, column vector c, its columns 0-3 / 4-7
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < 2; ++c) sum[r][c][0] = sum[r][c][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int i = 0; i < kSteps; ++i) {
            const int s = g * kSteps + i;
            const std::uint8_t* at = block + (s * 2 + h) * 64;
#pragma GCC unroll 2
            for (int c = 0; c < 2; ++c) {
                __m256i v[2];
                for (int q = 0; q < 2; ++q)
                    v[q] = _mm256_cvtepu8_epi16(
                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 32 * c + 16 * q)));
#pragma GCC unroll 4
                for (int r = 0; r < R; ++r) {
                    std::int64_t x4;
                    std::memcpy(&x4, x[r] + 4 * s, sizeof(x4));
                    const __m256i xq = _mm256_set1_epi64x(x4);
                    for (int q = 0; q < 2; ++q) {
                        __m256i& to = sum[r][c][q];
                        to = _mm256_add_epi32(to, _mm256_madd_epi16(v[q], xq));
                        in_register(to);
                    }
                }
            }
        }
        for (int c = 0; c < 2; ++c) {
            const std::int64_t lane0 = 16 * h + 8 * c;
            const __m256 scale = load_scales8(block + kFormat.scales_at(0, g), lane0);
            const __m256 min = load_scales8(block + kFormat.scales_at(1, g), lane0);
            for (int r = 0; r < R; ++r) {
                // vphaddd: columns 0, 1, 4, 5 | 2, 3, 6, 7; the 64-bit pairs back in order.
                const __m256i isum = _mm256_permute4x64_epi64(
                    _mm256_hadd_epi32(sum[r][c][0], sum[r][c][1]), 0xD8);
                const ActivationRow row(a.acts + (row0 + r) * a.act_row_bytes, a.k, kActParts);
                fold(acc[r] + lane0, isum, scale, min, row, b, g);
            }
        }
    }

    // to[0, 8) += isum x (scale x d) + min x the row's group sum: fold_group's operations
    // (linear_quant/layout.hpp), so its bits.
    PAGEDSERVE_AVX2_TARGET PAGEDSERVE_AVX2_INLINE static void fold(float* to, __m256i isum,
                                                                  __m256 scale, __m256 min,
                                                                  const ActivationRow& row,
                                                                  std::int64_t b, int g) {
        const __m256 sd = _mm256_mul_ps(scale, _mm256_set1_ps(row.d[b]));
        __m256 out = _mm256_loadu_ps(to);
        out = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), sd, out);
        out = _mm256_fmadd_ps(min, _mm256_set1_ps(row.group_sum(kFormat, b, g)), out);
        _mm256_storeu_ps(to, out);
    }

    // One part's exact int32 sums from its registers: + 128 sum(x) (signed 8-bit), or the
    // int16 pair sums widened (4-bit without VNNI).
    PAGEDSERVE_AVX2_TARGET PAGEDSERVE_AVX2_INLINE static __m256i int32_sum(__m256i sum,
                                                                         [[maybe_unused]] __m256i offset) {
        if constexpr (kSigned) {
            return _mm256_add_epi32(sum, offset);
        } else if constexpr (!kVnni) {
            return _mm256_madd_epi16(sum, _mm256_set1_epi16(1));
        } else {
            return sum;
        }
    }

    PAGEDSERVE_AVX2_TARGET PAGEDSERVE_AVX2_INLINE static __m256 load_scales8(
        const std::uint8_t* at, std::int64_t lane0) {
        if constexpr (kHalf) {
            return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 2 * lane0)));
        } else {
            return _mm256_loadu_ps(reinterpret_cast<const float*>(at) + lane0);
        }
    }

    // Rows row0 .. row0 + R - 1 times one tile: acc[r][column] over every block and group.
    template <int R>
    PAGEDSERVE_AVX2_TARGET static void product(const Args& a, std::int64_t row0,
                                               const std::uint8_t* w, Prefetch prefetch,
                                               float (&acc)[R][32]) {
        for (int r = 0; r < R; ++r) std::fill(acc[r], acc[r] + 32, 0.0f);
        const std::int64_t blocks = a.k / kBlockK, block_bytes = kFormat.block_bytes();
        for (int h = 0; h < 2; ++h) {
            std::int64_t line = h * prefetch.lines / 2;
            const std::int64_t lines_end = (h + 1) * prefetch.lines / 2;
            for (std::int64_t b = 0; b < blocks; ++b) {
                for (std::int64_t i = 0; i <= block_bytes / 128 && line < lines_end; ++i, ++line)
                    _mm_prefetch(prefetch.begin + 64 * line, _MM_HINT_T1);
                const std::uint8_t* block = w + b * block_bytes;
                for (int g = 0; g < kFormat.groups(); ++g) group<R>(a, row0, block, b, g, h, acc);
            }
        }
    }
};

// The items (R rows over a panel, each tile's sums through the epilogue): avx2_epilogue.hpp's
// Avx2Items, shared with the float-activation path (avx2_float.cpp).
template <typename K>
void run(const Avx2Args& a, int num_threads) {
    linear_detail::run_linear<K, Avx2Items<K>>(a, num_threads);
}

// The int16 rows of kWide: q = 255 hi + lo of each row's two int8 parts (exact in int16), in a
// buffer of the calling thread kept for its next call.
PAGEDSERVE_AVX2_TARGET const std::int16_t* whole_int16_rows(const Avx2Args& a) {
    thread_local std::vector<std::int16_t> rows;
    if (rows.size() < static_cast<std::size_t>(a.m * a.k)) rows.resize(a.m * a.k);
    const __m256i radix = _mm256_set1_epi16(kInt16Radix);
    for (std::int64_t r = 0; r < a.m; ++r) {
        const std::uint8_t* hi = a.acts + r * a.act_row_bytes;
        for (std::int64_t i = 0; i < a.k; i += 16) {
            const __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hi + i)));
            const __m256i l = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hi + a.k + i)));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(rows.data() + r * a.k + i),
                                _mm256_add_epi16(_mm256_mullo_epi16(h, radix), l));
        }
    }
    return rows.data();
}

// The kernel of a's weight format, for int8 (P = 1) or int16 (2) activation rows.
template <int P>
void run_format(Avx2Args& a, int num_threads) {
    const Format f = format_of(a.q->ggml_type);
    if constexpr (Avx2Kernel<8, 32, true, P>::kWide)
        if (f.bits == 8) a.q16 = whole_int16_rows(a);
    if (f.bits == 4 && f.half_scales) return run<Avx2Kernel<4, 32, true, P>>(a, num_threads);  // Q4_0/1
    if (f.bits == 4) return run<Avx2Kernel<4, 32, false, P>>(a, num_threads);                   // Q4_K
    if (f.half_scales) return run<Avx2Kernel<8, 32, true, P>>(a, num_threads);                  // Q8_0
    if (f.group_size == 32) return run<Avx2Kernel<8, 32, false, P>>(a, num_threads);            // Q5_K
    run<Avx2Kernel<8, 16, false, P>>(a, num_threads);                                            // Q6_K
}

}  // namespace

void PAGEDSERVE_AVX2_ENTRY(const QuantLinearArgs& q, const std::uint8_t* acts,
                           std::int64_t act_row_bytes, int num_threads) {
    Avx2Args a;
    a.q = &q, a.packed = q.packed, a.m = q.m, a.n = q.n, a.k = q.k;
    a.acts = acts, a.act_row_bytes = act_row_bytes;
    if (q.int16_activations) return run_format<2>(a, num_threads);
    run_format<1>(a, num_threads);
}

}  // namespace pagedserve::quant_detail
#endif  // PAGEDSERVE_X86
