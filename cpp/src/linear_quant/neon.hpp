// The NEON paths of the quantized linear kernel (kernels.hpp has the table of paths): ISA levels
// neon (every aarch64 CPU), neon_dotprod (SDOT) and neon_i8mm (USMMLA). The portable path's
// packed blocks, int8 activations, per-group fold and epilogue in 4-lane registers: the same
// bits. Compiled three times: neon.cpp for plain Advanced SIMD, neon_dotprod.cpp for CPUs with
// the dot-product extension, neon_i8mm.cpp for those with the int8 matrix multiplies; each
// defines, before including this file, PAGEDSERVE_NEON_DOTPROD and PAGEDSERVE_NEON_I8MM (0 or 1),
// PAGEDSERVE_NEON_ENTRY (the entry's name, kernels.hpp) and, for the extensions,
// PAGEDSERVE_NEON_TARGET (the GCC target string).
//
// The weights are unsigned (4-bit 0..15, 8-bit 0..255) and the activations signed (|q| <= 127).
// SDOT and SMULL multiply s8 x s8: 4-bit values go in as they are, 8-bit ones as u - 128 (the
// byte XOR 0x80), and the group's int32 sum gets 128 * sum(q) back, so it is the exact sum of
// u * q that the portable loop takes; USMMLA multiplies u8 x s8, every value whole. The 32 bytes
// of one step (4 features) of a half tile are 4 vectors of 4 columns x 4 features:
//   neon_dotprod  SDOT against the step's 4 activation bytes, repeated: each column's 4
//                 products summed into its int32 lane.
//   neon_i8mm     USMMLA on 2 x 8 matrices: 2 columns x 8 features (two steps' vectors zipped
//                 by 32-bit lanes) against 2 rows x 8 features (their activation bytes as they
//                 lie), 2 x 2 exact int32 sums per instruction (twice SDOT's products).
//   neon          SMULL / SMLAL products in int16 lanes (a column's features j, pairs summed by
//                 SADDLP / SADALP into int32, columns by ADDP). No int16 sum can overflow:
//                 4-bit 15 x 127 over a group's 8 steps is 15,240; 8-bit values (<= 128 x 127)
//                 are summed two steps at a time (32,512) before they widen.
// int16 activation rows (QuantLinearArgs::int16_activations, layout.hpp: two int8 parts, hi and
// lo) go through the same sums one part at a time (half the rows a micro-tile), and the fold
// takes 255 isum(hi) + isum(lo), exact in int32 (|.| <= 32 x 255 x 32512 < 2^31).
// Then fold_group's two FMAs per group in order, and the driver's epilogue (linear/driver.hpp,
// cpu/kernel_math.hpp's twins: the exp polynomial, vcvtneps2bf16's rounding) by integer and
// fp32 lane operations that round as the scalar ones do.
//
// Threads take (256-row chunk, 32-column tile) items dynamically: a thread the OS preempts
// costs the step its own time only, and who computes an item never changes its bits. Within an
// item, R rows x one half tile (16 columns) keep their int sums in registers (dotprod and i8mm
// R = 4: 16 accumulators; neon R = 2: 16), each group's fold updating fp32 accumulators in L1.
#pragma once

#include "cpu/arch.hpp"
#include "linear_quant/kernels.hpp"

#if PAGEDSERVE_AARCH64  // NEON intrinsics: elsewhere quant_linear never takes this path
#include <arm_neon.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/kernel_math.hpp"
#include "linear_quant/layout.hpp"
#include "pagedserve/linear.hpp"

#ifndef PAGEDSERVE_NEON_I8MM
#define PAGEDSERVE_NEON_I8MM 0
#endif

// Everything this file needs is included above, so only its own functions (all in an anonymous
// namespace) are compiled for the extension's target: no inline library code built for it is
// shared, as one linker symbol, with a plain-NEON translation unit.
#ifdef PAGEDSERVE_NEON_TARGET
#pragma GCC push_options
PAGEDSERVE_TARGET_PRAGMA(PAGEDSERVE_NEON_TARGET)
#endif

namespace pagedserve::quant_detail {
namespace {

inline constexpr std::int64_t kChunkRows = 256;  // rows per work item (as linear/driver.hpp)
inline constexpr std::int64_t kMinParallelMacs = 1 << 18;  // below ~20 us of work, one thread

// ---- vector math, operation for operation avx2.hpp's (so kernel_math.hpp's bits) ----

// e^y as avx2.hpp's exp8: Cody-Waite by ln 2 (FRINTN rounds to nearest even), the Taylor
// polynomial by FMAs, 2^i as two normal powers of two.
inline float32x4_t exp4(float32x4_t y) {
    using namespace kernel_math;
    const float32x4_t i = vrndnq_f32(vmulq_f32(y, vdupq_n_f32(kLog2e)));
    float32x4_t f = vfmsq_f32(y, i, vdupq_n_f32(kLn2Hi));  // y - i * hi, one rounding
    f = vfmsq_f32(f, i, vdupq_n_f32(kLn2Lo));
    float32x4_t p = vdupq_n_f32(kExpTaylor[0]);
    for (int c = 1; c < 8; ++c) p = vfmaq_f32(vdupq_n_f32(kExpTaylor[c]), p, f);
    const float32x4_t clamped = vminq_f32(vmaxq_f32(i, vdupq_n_f32(-252.0f)), vdupq_n_f32(252.0f));
    const int32x4_t whole = vcvtq_s32_f32(clamped);  // NaN: 0, and p is NaN
    const int32x4_t half = vshrq_n_s32(whole, 1);     // floor(i / 2)
    const int32x4_t rest = vsubq_s32(whole, half);
    const int32x4_t bias = vdupq_n_s32(127);
    const float32x4_t p1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(half, bias), 23));
    const float32x4_t p2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(rest, bias), 23));
    return vmulq_f32(vmulq_f32(p, p1), p2);
}

inline float32x4_t silu_mul4(float32x4_t gate, float32x4_t up) {
    const float32x4_t e = exp4(vsubq_f32(vdupq_n_f32(0.0f), gate));
    return vdivq_f32(vmulq_f32(gate, up), vaddq_f32(vdupq_n_f32(1.0f), e));
}

// 4 fp32 lanes as 4 bf16 in vcvtneps2bf16's rounding (cpu/kernel_math.hpp).
inline uint16x4_t bf16_bits4(float32x4_t v) {
    const uint32x4_t u = vreinterpretq_u32_f32(v);
    const uint32x4_t top = vshrq_n_u32(u, 16);
    const uint32x4_t lsb = vandq_u32(top, vdupq_n_u32(1));
    uint32x4_t bits = vshrq_n_u32(vaddq_u32(u, vaddq_u32(lsb, vdupq_n_u32(0x7fff))), 16);
    const uint32x4_t magnitude = vandq_u32(u, vdupq_n_u32(0x7fffffff));
    const uint32x4_t nan = vcgtq_u32(magnitude, vdupq_n_u32(0x7f800000));
    const uint32x4_t tiny = vceqq_u32(vandq_u32(u, vdupq_n_u32(0x7f800000)), vdupq_n_u32(0));
    bits = vbslq_u32(nan, vorrq_u32(top, vdupq_n_u32(0x40)), bits);
    bits = vbslq_u32(tiny, vandq_u32(top, vdupq_n_u32(0x8000)), bits);
    return vmovn_u32(bits);
}

// 4 lanes of a bias or residual row (bf16 bits or fp32) from element i; zeros past count.
inline float32x4_t load_edge4(const void* p, bool float32, std::int64_t i, std::int64_t count) {
    if (count >= 4) {
        if (float32) return vld1q_f32(static_cast<const float*>(p) + i);
        const uint16x4_t h = vld1_u16(static_cast<const std::uint16_t*>(p) + i);
        return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
    }
    float lanes[4] = {};
    for (std::int64_t j = 0; j < count; ++j) {
        if (float32) {
            lanes[j] = static_cast<const float*>(p)[i + j];
        } else {
            const std::uint32_t bits =
                static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(p)[i + j]) << 16;
            std::memcpy(lanes + j, &bits, sizeof(float));
        }
    }
    return vld1q_f32(lanes);
}

// out's row `row`, columns [col, col + count) (count <= 4) from 4 fp32 lanes.
inline void store4(const QuantLinearArgs& q, std::int64_t row, std::int64_t col, float32x4_t v,
                   std::int64_t count) {
    if (q.float32 || q.out_float32) {
        float* out = static_cast<float*>(q.out) + row * q.out_stride + col;
        if (count == 4) return vst1q_f32(out, v);
        float lanes[4];
        vst1q_f32(lanes, v);
        std::copy(lanes, lanes + count, out);
        return;
    }
    auto* out = static_cast<std::uint16_t*>(q.out) + row * q.out_stride + col;
    const uint16x4_t bits = bf16_bits4(v);
    if (count == 4) return vst1_u16(out, bits);
    std::uint16_t lanes[4];
    vst1_u16(lanes, bits);
    std::copy(lanes, lanes + count, out);
}

// ---- the product ----

template <int kBits, int kGroup, bool kHalf, int kActParts = 1>
struct NeonKernel {
    static constexpr Format kFormat{kBits, kGroup, kHalf};
    static constexpr int kSteps = kGroup / 4;      // 4-feature steps per group
    // int16 rows (kActParts 2) run each int8 part through the same sums: half the rows, so the
    // same registers.
    static constexpr int kRows = (PAGEDSERVE_NEON_DOTPROD || PAGEDSERVE_NEON_I8MM ? 4 : 2) / kActParts;
    // 8-bit values go in as u - 128 (and the sum gets 128 * sum(q) back) for the s8 x s8 paths.
    static constexpr bool kBiased = kBits == 8 && !PAGEDSERVE_NEON_I8MM;

    // Step s of half tile h as 4 vectors (columns 4 v .. 4 v + 3, 4 features each): 4-bit
    // values as they are, 8-bit ones less 128 (kBiased; as signed bytes) or whole (as unsigned
    // ones, for USMMLA).
    static inline void weights(const std::uint8_t* block, int s, int h, int8x16_t (&w)[4]) {
        if constexpr (kBits == 8) {
            const std::uint8_t* at = block + (s * 2 + h) * 64;
            const uint8x16_t bias = vdupq_n_u8(kBiased ? 0x80 : 0);
            for (int v = 0; v < 4; ++v)
                w[v] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(at + 16 * v), bias));
        } else {
            const std::uint8_t* at = block + ((s % 4) * 2 + h) * 64;
            for (int v = 0; v < 4; ++v) {
                const uint8x16_t u = vld1q_u8(at + 16 * v);
                w[v] = vreinterpretq_s8_u8(s < 4 ? vandq_u8(u, vdupq_n_u8(0x0F)) : vshrq_n_u8(u, 4));
            }
        }
    }

    // The 4 activation bytes of step s (features 4 s .. 4 s + 3 of block b), in every lane.
    static inline int8x16_t step_x(const std::uint8_t* act, std::int64_t b, int s) {
        std::int32_t x4;
        std::memcpy(&x4, act + kBlockK * b + 4 * s, sizeof(x4));
        return vreinterpretq_s8_s32(vdupq_n_s32(x4));
    }

#if PAGEDSERVE_NEON_I8MM
    // isum[r][v]: the int32 sums of group g for rows act[r], columns 16 h + 4 v .. + 3. Rows go
    // by pairs (an odd last one paired with itself, its copy's sums dropped); acc[p][c] holds
    // column pair c's 2 x 2 sums [column 2c row 2p, 2c row 2p + 1, 2c + 1 row 2p, ...].
    template <int R>
    static inline void group_sums(const std::uint8_t* const (&act)[R], const std::uint8_t* block,
                                  std::int64_t b, int g, int h, int32x4_t (&isum)[R][4]) {
        constexpr int P = (R + 1) / 2;
        int32x4_t acc[P][8];
        for (int p = 0; p < P; ++p)
            for (int c = 0; c < 8; ++c) acc[p][c] = vdupq_n_s32(0);
        for (int s = g * kSteps; s < (g + 1) * kSteps; s += 2) {
            int8x16_t w0[4], w1[4];
            weights(block, s, h, w0);
            weights(block, s + 1, h, w1);
            uint8x16_t cols[8];  // 2 columns x features 4 s .. 4 s + 7
            for (int v = 0; v < 4; ++v) {
                const uint32x4_t a = vreinterpretq_u32_s8(w0[v]), c = vreinterpretq_u32_s8(w1[v]);
                cols[2 * v] = vreinterpretq_u8_u32(vzip1q_u32(a, c));
                cols[2 * v + 1] = vreinterpretq_u8_u32(vzip2q_u32(a, c));
            }
            for (int p = 0; p < P; ++p) {
                const std::int64_t at = kBlockK * b + 4 * s;
                const int8x16_t x = vcombine_s8(
                    vld1_s8(reinterpret_cast<const std::int8_t*>(act[2 * p]) + at),
                    vld1_s8(reinterpret_cast<const std::int8_t*>(act[std::min(2 * p + 1, R - 1)]) + at));
                for (int c = 0; c < 8; ++c) acc[p][c] = vusmmlaq_s32(acc[p][c], cols[c], x);
            }
        }
        for (int p = 0; p < P; ++p) {
            for (int v = 0; v < 4; ++v) {
                isum[2 * p][v] = vuzp1q_s32(acc[p][2 * v], acc[p][2 * v + 1]);
                if (2 * p + 1 < R) isum[2 * p + 1][v] = vuzp2q_s32(acc[p][2 * v], acc[p][2 * v + 1]);
            }
        }
    }
#elif PAGEDSERVE_NEON_DOTPROD
    // isum[r][v]: the int32 sums of group g for rows act[r], columns 16 h + 4 v .. + 3, of the
    // signed weights (8-bit: u - 128).
    template <int R>
    static inline void group_sums(const std::uint8_t* const (&act)[R], const std::uint8_t* block,
                                  std::int64_t b, int g, int h, int32x4_t (&isum)[R][4]) {
        for (int r = 0; r < R; ++r)
            for (int v = 0; v < 4; ++v) isum[r][v] = vdupq_n_s32(0);
        for (int s = g * kSteps; s < (g + 1) * kSteps; ++s) {
            int8x16_t w[4];
            weights(block, s, h, w);
            for (int r = 0; r < R; ++r) {
                const int8x16_t x = step_x(act[r], b, s);
                for (int v = 0; v < 4; ++v) isum[r][v] = vdotq_s32(isum[r][v], w[v], x);
            }
        }
    }
#else
    template <int R>
    static inline void group_sums(const std::uint8_t* const (&act)[R], const std::uint8_t* block,
                                  std::int64_t b, int g, int h, int32x4_t (&isum)[R][4]) {
        // Per row and vector: int16 products of columns 4 v, 4 v + 1 (lo) and 4 v + 2, 4 v + 3
        // (hi), each column's 4 features in 4 lanes.
        if constexpr (kBits == 4) {  // the whole group in int16 (<= 15,240), widened once
            int16x8_t p[R][4][2];
            for (int r = 0; r < R; ++r)
                for (int v = 0; v < 4; ++v) p[r][v][0] = p[r][v][1] = vdupq_n_s16(0);
            for (int s = g * kSteps; s < (g + 1) * kSteps; ++s) {
                int8x16_t w[4];
                weights(block, s, h, w);
                for (int r = 0; r < R; ++r) {
                    const int8x16_t x = step_x(act[r], b, s);
                    for (int v = 0; v < 4; ++v) {
                        p[r][v][0] = vmlal_s8(p[r][v][0], vget_low_s8(w[v]), vget_low_s8(x));
                        p[r][v][1] = vmlal_high_s8(p[r][v][1], w[v], x);
                    }
                }
            }
            for (int r = 0; r < R; ++r)
                for (int v = 0; v < 4; ++v)
                    isum[r][v] = vpaddq_s32(vpaddlq_s16(p[r][v][0]), vpaddlq_s16(p[r][v][1]));
        } else {  // two steps in int16 (<= 32,512), then into int32 pairs
            int32x4_t a[R][4][2];
            for (int r = 0; r < R; ++r)
                for (int v = 0; v < 4; ++v) a[r][v][0] = a[r][v][1] = vdupq_n_s32(0);
            for (int s = g * kSteps; s < (g + 1) * kSteps; s += 2) {
                int8x16_t w0[4], w1[4];
                weights(block, s, h, w0);
                weights(block, s + 1, h, w1);
                for (int r = 0; r < R; ++r) {
                    const int8x16_t x0 = step_x(act[r], b, s), x1 = step_x(act[r], b, s + 1);
                    for (int v = 0; v < 4; ++v) {
                        int16x8_t lo = vmull_s8(vget_low_s8(w0[v]), vget_low_s8(x0));
                        int16x8_t hi = vmull_high_s8(w0[v], x0);
                        lo = vmlal_s8(lo, vget_low_s8(w1[v]), vget_low_s8(x1));
                        hi = vmlal_high_s8(hi, w1[v], x1);
                        a[r][v][0] = vpadalq_s16(a[r][v][0], lo);
                        a[r][v][1] = vpadalq_s16(a[r][v][1], hi);
                    }
                }
            }
            for (int r = 0; r < R; ++r)
                for (int v = 0; v < 4; ++v) isum[r][v] = vpaddq_s32(a[r][v][0], a[r][v][1]);
        }
    }
#endif

    static inline float32x4_t load_scales4(const std::uint8_t* at, std::int64_t lane0) {
        if constexpr (kHalf) {
            std::uint16_t h[4];
            std::memcpy(h, at + 2 * lane0, sizeof(h));
            return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));  // exact, as half_to_float
        } else {
            float v[4];
            std::memcpy(v, at + 4 * lane0, sizeof(v));
            return vld1q_f32(v);
        }
    }

    // group_sums, and for the s8 x s8 paths' biased 8-bit values 128 * sum(q) over the group
    // added back: the exact int32 sums of u * q for int8 rows act[r].
    template <int R>
    static inline void part_sums(const std::uint8_t* const (&act)[R], const std::uint8_t* block,
                                 std::int64_t b, int g, int h, int32x4_t (&isum)[R][4]) {
        group_sums<R>(act, block, b, g, h, isum);
        if constexpr (kBiased) {  // u - 128 went in: add 128 * sum(q) over the group back
            for (int r = 0; r < R; ++r) {
                const std::int8_t* q = reinterpret_cast<const std::int8_t*>(act[r]) + kBlockK * b +
                                       kGroup * g;
                std::int32_t qsum = vaddlvq_s8(vld1q_s8(q));
                if constexpr (kGroup == 32) qsum += vaddlvq_s8(vld1q_s8(q + 16));
                const int32x4_t back = vdupq_n_s32(128 * qsum);
                for (int v = 0; v < 4; ++v) isum[r][v] = vaddq_s32(isum[r][v], back);
            }
        }
    }

    // acc[r][16 h .. 16 h + 16) += group g of block b (half tile h) for rows act[r] (int16 rows:
    // their hi parts, the lo parts k bytes on).
    template <int R>
    static inline void group(const std::uint8_t* const (&act)[R], std::int64_t k,
                             const std::uint8_t* block, std::int64_t b, int g, int h,
                             float (&acc)[R][32]) {
        int32x4_t isum[R][4];
        part_sums<R>(act, block, b, g, h, isum);
        if constexpr (kActParts == 2) {  // int16 rows: 255 isum(hi) + isum(lo), exact in int32
            const std::uint8_t* lo[R];
            for (int r = 0; r < R; ++r) lo[r] = act[r] + k;
            int32x4_t low[R][4];
            part_sums<R>(lo, block, b, g, h, low);
            for (int r = 0; r < R; ++r)
                for (int v = 0; v < 4; ++v) isum[r][v] = vmlaq_n_s32(low[r][v], isum[r][v], kInt16Radix);
        }
        for (int v = 0; v < 4; ++v) {
            const std::int64_t lane0 = 16 * h + 4 * v;
            const float32x4_t scale = load_scales4(block + kFormat.scales_at(0, g), lane0);
            const float32x4_t min = load_scales4(block + kFormat.scales_at(1, g), lane0);
            for (int r = 0; r < R; ++r) {
                const ActivationRow row(act[r], k, kActParts);
                // fold_group's operations (linear_quant/layout.hpp), so its bits.
                const float32x4_t sd = vmulq_f32(scale, vdupq_n_f32(row.d[b]));
                float* const at = acc[r] + lane0;
                float32x4_t out = vld1q_f32(at);
                out = vfmaq_f32(out, vcvtq_f32_s32(isum[r][v]), sd);
                out = vfmaq_f32(out, min, vdupq_n_f32(row.group_sum(kFormat, b, g)));
                vst1q_f32(at, out);
            }
        }
    }

    // Rows act[0 .. R) times one tile: acc[r][column] over every block and group in order.
    template <int R>
    static void product(const std::uint8_t* const (&act)[R], std::int64_t k, const std::uint8_t* w,
                        float (&acc)[R][32]) {
        for (int r = 0; r < R; ++r) std::fill(acc[r], acc[r] + 32, 0.0f);
        const std::int64_t blocks = k / kBlockK, block_bytes = kFormat.block_bytes();
        for (int h = 0; h < 2; ++h) {
            for (std::int64_t b = 0; b < blocks; ++b) {
                const std::uint8_t* block = w + b * block_bytes;
                for (int g = 0; g < kFormat.groups(); ++g) group<R>(act, k, block, b, g, h, acc);
            }
        }
    }
};

// acc + bias + residual, or a gated tile's silu(gate) * up (16 gate columns, then their 16 up
// columns), rounded once into out: the portable tile_row's epilogue, 4 lanes at a time.
template <int R>
void store_tile4(const QuantLinearArgs& q, std::int64_t row0, std::int64_t tile,
                 const float (&acc)[R][32]) {
    if (q.gated_width > 0) {
        const std::int64_t col0 = tile * kLinearGateCols;
        for (int r = 0; r < R; ++r) {
            for (int c = 0; c < 4; ++c) {
                const std::int64_t count = std::min<std::int64_t>(4, q.gated_width - col0 - 4 * c);
                if (count <= 0) break;
                const float32x4_t v = silu_mul4(vld1q_f32(acc[r] + 4 * c), vld1q_f32(acc[r] + 16 + 4 * c));
                store4(q, row0 + r, col0 + 4 * c, v, count);
            }
        }
        return;
    }
    const std::int64_t col0 = tile * kLinearTileN;
    for (int c = 0; c < 8; ++c) {
        const std::int64_t col = col0 + 4 * c, count = std::min<std::int64_t>(4, q.n - col);
        if (count <= 0) break;
        const float32x4_t bias = q.bias ? load_edge4(q.bias, q.float32, col, count) : vdupq_n_f32(0.0f);
        for (int r = 0; r < R; ++r) {
            float32x4_t v = vaddq_f32(vld1q_f32(acc[r] + 4 * c), bias);
            if (q.residual)
                v = vaddq_f32(v, load_edge4(q.residual, q.float32,
                                            (row0 + r) * q.residual_stride + col, count));
            store4(q, row0 + r, col, v, count);
        }
    }
}

// R rows from row0 times tile t.
template <typename K, int R>
void micro_tile(const QuantLinearArgs& q, const std::uint8_t* acts, std::int64_t act_row_bytes,
                std::int64_t row0, std::int64_t t) {
    const std::uint8_t* act[R];
    for (int r = 0; r < R; ++r) act[r] = acts + (row0 + r) * act_row_bytes;
    float acc[R][32];
    K::template product<R>(act, q.k, q.packed + t * tile_bytes(K::kFormat, q.k), acc);
    store_tile4<R>(q, row0, t, acc);
}

// Rows [row0, row0 + rows) x tile t: K::kRows at a time, then the last ones singly (a row's
// arithmetic is the same in a micro-tile of any height).
template <typename K>
void item(const QuantLinearArgs& q, const std::uint8_t* acts, std::int64_t act_row_bytes,
          std::int64_t row0, std::int64_t rows, std::int64_t t) {
    std::int64_t r = row0;
    for (; r + K::kRows <= row0 + rows; r += K::kRows)
        micro_tile<K, K::kRows>(q, acts, act_row_bytes, r, t);
    for (; r < row0 + rows; ++r) micro_tile<K, 1>(q, acts, act_row_bytes, r, t);
}

template <typename K>
void run(const QuantLinearArgs& q, const std::uint8_t* acts, std::int64_t act_row_bytes,
         int num_threads) {
    const std::int64_t tiles = num_tiles(q.n), chunks = (q.m + kChunkRows - 1) / kChunkRows;
    const std::int64_t items = tiles * chunks;
    const bool small = q.m * q.n * q.k < kMinParallelMacs;
    const int threads = small ? 1 : static_cast<int>(std::min<std::int64_t>(num_threads, items));
    // Runs of consecutive tiles per take (the weights stream in order), 16 takes per thread.
    const std::int64_t grain = std::max<std::int64_t>(1, items / (16 * threads));
#pragma omp parallel for num_threads(threads) schedule(dynamic, grain)
    for (std::int64_t i = 0; i < items; ++i) {
        const std::int64_t row0 = (i / tiles) * kChunkRows;
        item<K>(q, acts, act_row_bytes, row0, std::min(kChunkRows, q.m - row0), i % tiles);
    }
}

// The kernel of q's weight format, for int8 (P = 1) or int16 (2) activation rows.
template <int P>
void run_format(const QuantLinearArgs& q, const std::uint8_t* acts, std::int64_t act_row_bytes,
                int num_threads) {
    const Format f = format_of(q.ggml_type);
    if (f.bits == 4 && f.half_scales) return run<NeonKernel<4, 32, true, P>>(q, acts, act_row_bytes, num_threads);  // Q4_0/1
    if (f.bits == 4) return run<NeonKernel<4, 32, false, P>>(q, acts, act_row_bytes, num_threads);  // Q4_K
    if (f.half_scales) return run<NeonKernel<8, 32, true, P>>(q, acts, act_row_bytes, num_threads);  // Q8_0
    if (f.group_size == 32) return run<NeonKernel<8, 32, false, P>>(q, acts, act_row_bytes, num_threads);  // Q5_K
    run<NeonKernel<8, 16, false, P>>(q, acts, act_row_bytes, num_threads);  // Q6_K
}

}  // namespace

void PAGEDSERVE_NEON_ENTRY(const QuantLinearArgs& q, const std::uint8_t* acts,
                           std::int64_t act_row_bytes, int num_threads) {
    if (q.int16_activations) return run_format<2>(q, acts, act_row_bytes, num_threads);
    run_format<1>(q, acts, act_row_bytes, num_threads);
}

}  // namespace pagedserve::quant_detail

#ifdef PAGEDSERVE_NEON_TARGET
#pragma GCC pop_options
#endif
#endif  // PAGEDSERVE_AARCH64
