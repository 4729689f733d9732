// AVX2 micro-kernels of the CPU paged attention (included by attention/kernels.hpp only, in its
// AVX2 copy: PAGEDSERVE_ISA_AVX2) for head sizes known at compile time (64, 128): the score, value
// and softmax steps of loops.hpp on 8-lane registers. Compiled for AVX2, the loops' value step
// kept 4 query vectors x 64 columns of accumulators, twice AVX2's 16 registers, so every FMA
// went through the stack, and the softmax's exp stayed scalar (vfmadd...ss; objdump of the build
// before this file); the scores here measured 5-12 % faster than the loops' too. Element for
// element the same operations in the same order as the loops (std::fma is vfmadd, keys in
// order), so the same bits. Needs <immintrin.h>, included by kernels.hpp outside its namespace.

// scores_transposed's: kR query vectors (rows of q, stride kD) against 16 transposed keys at a
// time (k_t: [kD][width]) into kR rows of s (stride width); kR x 2 accumulators.
template <int kD, int kR>
inline void scores_transposed_avx2(const float* q, const float* k_t, std::int64_t n,
                                   std::int64_t width, float* s) {
    for (std::int64_t c = 0; c < n; c += kChunk) {
        __m256 acc[kR][2];
        for (int r = 0; r < kR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int d = 0; d < kD; ++d) {
            const float* row = k_t + d * width + c;
            const __m256 k0 = _mm256_loadu_ps(row), k1 = _mm256_loadu_ps(row + 8);
            for (int r = 0; r < kR; ++r) {
                const __m256 qd = _mm256_broadcast_ss(q + r * kD + d);
                acc[r][0] = _mm256_fmadd_ps(qd, k0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(qd, k1, acc[r][1]);
            }
        }
        for (int r = 0; r < kR; ++r) {
            _mm256_storeu_ps(s + r * width + c, acc[r][0]);
            _mm256_storeu_ps(s + r * width + c + 8, acc[r][1]);
        }
    }
}

// accumulate_values's: acc rows += weights . V over keys [0, n) for kR query vectors (rows of s,
// stride s_stride; rows of acc, stride kD), in slices of 32 columns: kR x 4 accumulators and
// the value row's 4 registers (kR <= 2 fits AVX2's 16).
template <int kD, int kR>
inline void accumulate_values_avx2(const float* s, std::int64_t s_stride, std::int64_t n,
                                   const Scratch& sc, std::int64_t page_size, float* acc) {
    static_assert(kD % 32 == 0 && kR <= 2, "32-column slices of at most 2 rows");
    for (int d0 = 0; d0 < kD; d0 += 32) {
        __m256 a[kR][4];
        for (int r = 0; r < kR; ++r)
            for (int x = 0; x < 4; ++x) a[r][x] = _mm256_loadu_ps(acc + r * kD + d0 + 8 * x);
        for (std::int64_t key0 = 0, p = 0; key0 < n; key0 += page_size, ++p) {
            const std::int64_t page_keys = std::min(page_size, n - key0);
            for (std::int64_t j = 0; j < page_keys; ++j) {
                const float* vr = sc.v_pages[p] + j * kD + d0;
                __m256 v[4];
                for (int x = 0; x < 4; ++x) v[x] = _mm256_loadu_ps(vr + 8 * x);
                for (int r = 0; r < kR; ++r) {
                    const __m256 pj = _mm256_broadcast_ss(s + r * s_stride + key0 + j);
                    for (int x = 0; x < 4; ++x) a[r][x] = _mm256_fmadd_ps(pj, v[x], a[r][x]);
                }
            }
        }
        for (int r = 0; r < kR; ++r)
            for (int x = 0; x < 4; ++x) _mm256_storeu_ps(acc + r * kD + d0 + 8 * x, a[r][x]);
    }
}

// exp_nonpositive on 8 lanes, step for step (the round-to-nearest of its 1.5 * 2^23 trick is
// vroundps's: the same integer for the |t| < 2^22 it sees).
inline __m256 exp_nonpositive8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
    const __m256 i = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(i, _mm256_set1_ps(0.693359375f), x);
    f = _mm256_fmadd_ps(i, _mm256_set1_ps(2.12194440e-4f), f);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(i), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// soft_cap on 8 lanes: cap * tanh(s / cap), as soft_cap.
inline __m256 soft_cap8(__m256 s, float cap) {
    const __m256 x = _mm256_div_ps(s, _mm256_set1_ps(cap));
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 e = exp_nonpositive8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, x)));
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    return _mm256_mul_ps(_mm256_set1_ps(cap), _mm256_or_ps(t, _mm256_and_ps(sign, x)));
}

// Lanes c .. c + 7 that fall in [lo, hi), as an all-ones / zero mask per lane.
inline __m256 lanes_in8(std::int64_t c, std::int64_t lo, std::int64_t hi) {
    const __m256i j = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(c)),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i at_lo = _mm256_cmpgt_epi32(j, _mm256_set1_epi32(static_cast<int>(lo) - 1));
    const __m256i below_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(hi)), j);
    return _mm256_castsi256_ps(_mm256_and_si256(at_lo, below_hi));
}

// softmax_step's, 16 keys (two registers: lanes 0-7 and 8-15 of sum16's lanes) at a time over
// the whole block [0, n) (s has room up to round_up(n)); keys outside [lo, hi) get weight 0.
template <int kD>
void softmax_step_avx2(float* s, const Span& span, float& row_max, float& row_sum, float* acc) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const std::int64_t first = span.lo / kChunk * kChunk;  // the chunk holding key lo
    if (span.softcap > 0.0f) {
        for (std::int64_t c = first; c < span.hi; c += 8)
            _mm256_storeu_ps(s + c, soft_cap8(_mm256_loadu_ps(s + c), span.softcap));
    }
    __m256 mx = _mm256_set1_ps(neg_inf);
    for (std::int64_t c = first; c < span.hi; c += 8)
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(_mm256_set1_ps(neg_inf), _mm256_loadu_ps(s + c),
                                                lanes_in8(c, span.lo, span.hi)));
    alignas(32) float m8[8];
    _mm256_store_ps(m8, mx);
    float tile_max = m8[0];
    for (int l = 1; l < 8; ++l) tile_max = std::max(tile_max, m8[l]);
    const float new_max = std::max(row_max, tile_max);
    // row_max == -inf only before the vector's first block, when acc and row_sum are still zero.
    const float alpha = row_max == neg_inf ? 0.0f : exp_nonpositive(row_max - new_max);
    const __m256 m = _mm256_set1_ps(new_max);
    __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (std::int64_t c = 0; c < span.n; c += kChunk) {
        for (int h = 0; h < 2; ++h) {
            const std::int64_t at = c + 8 * h;
            const __m256 e = _mm256_and_ps(exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(s + at), m)),
                                           lanes_in8(at, span.lo, span.hi));
            _mm256_storeu_ps(s + at, e);
            sum[h] = _mm256_add_ps(sum[h], e);
        }
    }
    alignas(32) float lanes[16];
    _mm256_store_ps(lanes, sum[0]);
    _mm256_store_ps(lanes + 8, sum[1]);
    row_sum = std::fma(row_sum, alpha, sum16(lanes));  // as softmax_step: the same bits
    row_max = new_max;
    if (alpha != 1.0f) {
        const __m256 a = _mm256_set1_ps(alpha);
        for (int d = 0; d < kD; d += 8) _mm256_storeu_ps(acc + d, _mm256_mul_ps(_mm256_loadu_ps(acc + d), a));
    }
}
