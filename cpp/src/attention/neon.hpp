// NEON micro-kernels of the CPU paged attention (included by attention/kernels.hpp only, in its
// NEON copy: PAGEDSERVE_ISA_NEON, aarch64) for head sizes known at compile time (64, 128): the
// score, softmax and value steps of loops.hpp on 4-lane registers, as avx2.hpp has them on 8.
// Element for element the same operations in the same order as the loops (std::fma is FMLA /
// FMLS, vfmaq_f32 and vfmsq_f32 fuse exactly where the loops call std::fma; keys in order; a
// row's weights summed into sum16's 16 lanes), so the same bits: kernels.hpp compiles this copy
// with fp-contract off too, so nothing else fuses. Needs <arm_neon.h>, included by kernels.hpp
// outside its namespace.

// scores_transposed's: kR query vectors (rows of q, stride kD) against 16 transposed keys at a
// time (k_t: [kD][width]) into kR rows of s (stride width); kR x 4 accumulators (kR <= 4 keeps
// them, the 4 key registers and the query lane within NEON's 32).
template <int kD, int kR>
inline void scores_transposed_neon(const float* q, const float* k_t, std::int64_t n,
                                   std::int64_t width, float* s) {
    static_assert(kR <= 4, "at most 4 query vectors");
    for (std::int64_t c = 0; c < n; c += kChunk) {
        float32x4_t acc[kR][4];
        for (int r = 0; r < kR; ++r)
            for (int x = 0; x < 4; ++x) acc[r][x] = vdupq_n_f32(0.0f);
        for (int d = 0; d < kD; ++d) {
            const float* row = k_t + d * width + c;
            float32x4_t k[4];
            for (int x = 0; x < 4; ++x) k[x] = vld1q_f32(row + 4 * x);
            for (int r = 0; r < kR; ++r) {
                const float32x4_t qd = vdupq_n_f32(q[r * kD + d]);
                for (int x = 0; x < 4; ++x) acc[r][x] = vfmaq_f32(acc[r][x], qd, k[x]);
            }
        }
        for (int r = 0; r < kR; ++r)
            for (int x = 0; x < 4; ++x) vst1q_f32(s + r * width + c + 4 * x, acc[r][x]);
    }
}

// accumulate_values's: acc rows += weights . V over keys [0, n) for kR query vectors (rows of s,
// stride s_stride; rows of acc, stride kD), in slices of 16 columns: kR x 4 accumulators and the
// value row's 4 registers.
template <int kD, int kR>
inline void accumulate_values_neon(const float* s, std::int64_t s_stride, std::int64_t n,
                                   const Scratch& sc, std::int64_t page_size, float* acc) {
    static_assert(kD % 16 == 0 && kR <= 4, "16-column slices of at most 4 rows");
    for (int d0 = 0; d0 < kD; d0 += 16) {
        float32x4_t a[kR][4];
        for (int r = 0; r < kR; ++r)
            for (int x = 0; x < 4; ++x) a[r][x] = vld1q_f32(acc + r * kD + d0 + 4 * x);
        for (std::int64_t key0 = 0, p = 0; key0 < n; key0 += page_size, ++p) {
            const std::int64_t page_keys = std::min(page_size, n - key0);
            for (std::int64_t j = 0; j < page_keys; ++j) {
                const float* vr = sc.v_pages[p] + j * kD + d0;
                float32x4_t v[4];
                for (int x = 0; x < 4; ++x) v[x] = vld1q_f32(vr + 4 * x);
                for (int r = 0; r < kR; ++r) {
                    const float32x4_t pj = vdupq_n_f32(s[r * s_stride + key0 + j]);
                    for (int x = 0; x < 4; ++x) a[r][x] = vfmaq_f32(a[r][x], pj, v[x]);
                }
            }
        }
        for (int r = 0; r < kR; ++r)
            for (int x = 0; x < 4; ++x) vst1q_f32(acc + r * kD + d0 + 4 * x, a[r][x]);
    }
}

// exp_nonpositive on 4 lanes, step for step (the round-to-nearest of its 1.5 * 2^23 trick is
// FRINTN's: the same integer for the |t| < 2^22 it sees; vfmsq_f32(x, i, c) is fma(-i, c, x)).
inline float32x4_t exp_nonpositive4(float32x4_t x) {
    x = vmaxq_f32(x, vdupq_n_f32(-87.0f));
    const float32x4_t t = vmulq_f32(x, vdupq_n_f32(1.44269504088896341f));
    const float32x4_t i = vrndnq_f32(t);
    float32x4_t f = vfmsq_f32(x, i, vdupq_n_f32(0.693359375f));
    f = vfmaq_f32(f, i, vdupq_n_f32(2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.0f / 5040.0f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 720.0f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, f);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
    const int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(i), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(bits));
}

// soft_cap on 4 lanes: cap * tanh(s / cap), as soft_cap (copysign by the sign bit: t >= +0).
inline float32x4_t soft_cap4(float32x4_t s, float cap) {
    const float32x4_t x = vdivq_f32(s, vdupq_n_f32(cap));
    const float32x4_t e = exp_nonpositive4(vmulq_f32(vdupq_n_f32(-2.0f), vabsq_f32(x)));
    const float32x4_t one = vdupq_n_f32(1.0f);
    const float32x4_t t = vdivq_f32(vsubq_f32(one, e), vaddq_f32(one, e));
    const uint32x4_t sign = vdupq_n_u32(0x80000000u);
    return vmulq_f32(vdupq_n_f32(cap), vbslq_f32(sign, x, t));
}

// Lanes c .. c + 3 that fall in [lo, hi), as an all-ones / zero mask per lane.
inline uint32x4_t lanes_in4(std::int64_t c, std::int64_t lo, std::int64_t hi) {
    const int32_t offsets[4] = {0, 1, 2, 3};
    const int32x4_t j = vaddq_s32(vdupq_n_s32(static_cast<int>(c)), vld1q_s32(offsets));
    return vandq_u32(vcgeq_s32(j, vdupq_n_s32(static_cast<int>(lo))),
                     vcltq_s32(j, vdupq_n_s32(static_cast<int>(hi))));
}

// softmax_step's, 16 keys (four registers: lanes 0-3, 4-7, 8-11, 12-15 of sum16's lanes) at a
// time over the whole block [0, n) (s has room up to round_up(n)); keys outside [lo, hi) get
// weight 0 (a masked lane adds +0 to its sum, as the loops' chunks before lo and after hi add
// nothing).
template <int kD>
void softmax_step_neon(float* s, const Span& span, float& row_max, float& row_sum, float* acc) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const std::int64_t first = span.lo / kChunk * kChunk;  // the chunk holding key lo
    if (span.softcap > 0.0f) {
        for (std::int64_t c = first; c < span.hi; c += 4)
            vst1q_f32(s + c, soft_cap4(vld1q_f32(s + c), span.softcap));
    }
    float32x4_t mx = vdupq_n_f32(neg_inf);
    for (std::int64_t c = first; c < span.hi; c += 4)
        mx = vmaxq_f32(mx, vbslq_f32(lanes_in4(c, span.lo, span.hi), vld1q_f32(s + c),
                                     vdupq_n_f32(neg_inf)));
    const float tile_max = vmaxvq_f32(mx);  // exact in any order
    const float new_max = std::max(row_max, tile_max);
    // row_max == -inf only before the vector's first block, when acc and row_sum are still zero.
    const float alpha = row_max == neg_inf ? 0.0f : exp_nonpositive(row_max - new_max);
    const float32x4_t m = vdupq_n_f32(new_max);
    float32x4_t sum[4];
    for (int h = 0; h < 4; ++h) sum[h] = vdupq_n_f32(0.0f);
    for (std::int64_t c = 0; c < span.n; c += kChunk) {
        for (int h = 0; h < 4; ++h) {
            const std::int64_t at = c + 4 * h;
            const float32x4_t e = exp_nonpositive4(vsubq_f32(vld1q_f32(s + at), m));
            const float32x4_t w = vreinterpretq_f32_u32(
                vandq_u32(vreinterpretq_u32_f32(e), lanes_in4(at, span.lo, span.hi)));
            vst1q_f32(s + at, w);
            sum[h] = vaddq_f32(sum[h], w);
        }
    }
    float lanes[16];
    for (int h = 0; h < 4; ++h) vst1q_f32(lanes + 4 * h, sum[h]);
    row_sum = std::fma(row_sum, alpha, sum16(lanes));  // as softmax_step: the same bits
    row_max = new_max;
    if (alpha != 1.0f) {
        const float32x4_t a = vdupq_n_f32(alpha);
        for (int d = 0; d < kD; d += 4) vst1q_f32(acc + d, vmulq_f32(vld1q_f32(acc + d), a));
    }
}
