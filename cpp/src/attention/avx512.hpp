// AVX-512 micro-kernels of the CPU paged attention (included by attention/kernels.hpp
// only, in its AVX-512 copies: PAGEDSERVE_ISA_AVX512). Head sizes are
// compile-time multiples of 32 here; everything else keeps the portable loops.
//
// - transpose16: register-only transposes of 16 vectors; hsum16: 16 horizontal sums at once
//   (the decode scoring of batch_invariant = false).
// - Key rows are read straight from the cache in its own dtype. With AVX512-BF16
//   (PAGEDSERVE_ISA_AVX512_BF16), bf16 scores are
//   _mm512_dpbf16_ps of raw bf16 query and key (exact products, fp32 sums) times `scale`;
//   without it, bf16 rows are widened in registers (bf16 is the top half of an fp32).
// Needs <immintrin.h>, included by the .cpp outside its namespace.

#if PAGEDSERVE_ISA_AVX512_BF16
inline constexpr bool kHasDpbf16 = true;
#else
inline constexpr bool kHasDpbf16 = false;
#endif

// In-register transpose of 16 rows of 16 32-bit elements: r[i][j] -> r[j][i].
inline void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // u[4i + k], lane L: rows 4i .. 4i+3 of column 4L + k
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; ++k) {
        const __m512i a = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44);
        const __m512i b = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xEE);
        const __m512i c = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44);
        const __m512i d = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xEE);
        r[k] = _mm512_shuffle_i32x4(a, c, 0x88);
        r[k + 4] = _mm512_shuffle_i32x4(a, c, 0xDD);
        r[k + 8] = _mm512_shuffle_i32x4(b, d, 0x88);
        r[k + 12] = _mm512_shuffle_i32x4(b, d, 0xDD);
    }
}

// Writes columns [0, cols) of 16 rows of 32-bit elements transposed: dst[c * stride + j] =
// rows[j][c]. cols is a multiple of 16.
inline void transpose_rows(const std::uint32_t* const rows[16], std::int64_t cols, std::uint32_t* dst,
                           std::int64_t stride) {
    for (std::int64_t c0 = 0; c0 < cols; c0 += 16) {
        __m512i r[16];
        for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512(rows[j] + c0);
        transpose16(r);
        for (int c = 0; c < 16; ++c) _mm512_storeu_si512(dst + (c0 + c) * stride, r[c]);
    }
}

// 16 floats from 16 values of a row of any of kernels.hpp's row types whose scale (8-bit rows)
// is `scale` in every lane: exact, or the loops' one multiply by the scale.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const Half* p) {  // maskz: GCC 12 warns on the undefined
    return _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const Int8Code* p, __m512 scale) {
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)), scale);
}
inline __m512 load16(const E4m3Code* p, __m512 scale) {  // as widen_e4m3_rows, 16 at a time
    const __m256i wide = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i low7 = _mm256_set1_epi16(0x7f), magnitude = _mm256_and_si256(wide, low7);
    __m256i half = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(wide, _mm256_set1_epi16(0x80)), 8),
                                   _mm256_slli_epi16(magnitude, 7));
    const __m256i nan = _mm256_cmpeq_epi16(magnitude, low7);
    half = _mm256_or_si256(half, _mm256_and_si256(nan, _mm256_set1_epi16(0x7e00)));
    return _mm512_mul_ps(_mm512_maskz_cvtph_ps(0xffff, half), _mm512_mul_ps(scale, _mm512_set1_ps(256.0f)));
}
inline __m512 load16(const Bf16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
template <typename V>  // unscaled rows: the scale is not read
inline __m512 load16(const V* p, __m512) {
    return load16(p);
}

// Lane j of the result = the sum of the 16 lanes of v[j] (a transpose-add tree: 45 shuffles and
// adds for 16 sums instead of 16 separate horizontal reductions).
inline __m512 hsum16(const __m512 v[16]) {
    __m512 a[8], b[4];
    for (int i = 0; i < 8; ++i)  // 128-bit lane L: [v2i, v2i+1, v2i, v2i+1] partial sums
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {  // lane L: partial sums of v4i .. v4i+3 over lane L's floats
        const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    // Transpose-add the 4x4 grid of 128-bit lanes: lane k of the result sums b[k]'s lanes.
    const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88),
                                    _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
    const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88),
                                    _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xDD));
}

// One key row's partial dot products with the query (lane sums give the score), in registers.
// q: kD / 16 fp32 vectors (scaled query), or with dpbf16 kD / 32 raw bf16 pair vectors.
template <typename T, int kD, bool kDp>
inline __m512 row_dot(const __m512* q, const T* k) {
    __m512 acc = _mm512_setzero_ps();
    if constexpr (kDp) {
#if PAGEDSERVE_ISA_AVX512_BF16
        for (int i = 0; i < kD / 32; ++i)
            acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(k + 32 * i), (__m512bh)q[i]);
#endif
    } else {
        const __m512 scale = _mm512_set1_ps(row_scale(k, kD));
        for (int i = 0; i < kD / 16; ++i) acc = _mm512_fmadd_ps(q[i], load16(k + 16 * i, scale), acc);
    }
    return acc;
}

// Scores of one query vector against `count` <= 16 key rows, lane j for keys[j].
template <typename T, int kD, bool kDp>
inline __m512 dot16(const __m512* q, const T* const keys[16], int count) {
    __m512 acc[16];
    if (count == 16) {  // the common case, without a branch per key
        for (int j = 0; j < 16; ++j) acc[j] = row_dot<T, kD, kDp>(q, keys[j]);
    } else {
        for (int j = 0; j < 16; ++j)
            acc[j] = j < count ? row_dot<T, kD, kDp>(q, keys[j]) : _mm512_setzero_ps();
    }
    return hsum16(acc);
}

// Scores of kR query vectors (fp32 rows of q, stride kD) against kC * 16 transposed fp32 keys
// (k_t: [kD][width], from column c0) into rows of s (stride width).
template <int kD, int kR, int kC>
inline void scores_t_f32(const float* q, const float* k_t, std::int64_t width, std::int64_t c0,
                         float* s) {
    __m512 acc[kR][kC];
    for (int r = 0; r < kR; ++r)
        for (int c = 0; c < kC; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int d = 0; d < kD; ++d) {
        __m512 k[kC];
        for (int c = 0; c < kC; ++c) k[c] = _mm512_loadu_ps(k_t + d * width + c0 + 16 * c);
        for (int r = 0; r < kR; ++r) {
            const __m512 qd = _mm512_set1_ps(q[r * kD + d]);
            for (int c = 0; c < kC; ++c) acc[r][c] = _mm512_fmadd_ps(qd, k[c], acc[r][c]);
        }
    }
    for (int r = 0; r < kR; ++r)
        for (int c = 0; c < kC; ++c) _mm512_storeu_ps(s + r * width + c0 + 16 * c, acc[r][c]);
}

#if PAGEDSERVE_ISA_AVX512_BF16
// As scores_t_f32 for raw bf16 query rows (as bf16 pairs, stride kD / 2) against keys stored as
// transposed bf16 pairs (k_t: [kD / 2][width] of 32-bit pairs); scores are scaled here.
template <int kD, int kR, int kC>
inline void scores_t_bf16(const std::uint32_t* q, const std::uint32_t* k_t, std::int64_t width,
                          std::int64_t c0, float scale, float* s) {
    __m512 acc[kR][kC];
    for (int r = 0; r < kR; ++r)
        for (int c = 0; c < kC; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int i = 0; i < kD / 2; ++i) {
        __m512bh k[kC];
        for (int c = 0; c < kC; ++c)
            k[c] = (__m512bh)_mm512_loadu_si512(k_t + i * width + c0 + 16 * c);
        for (int r = 0; r < kR; ++r) {
            const __m512bh qi = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[r * kD / 2 + i]));
            for (int c = 0; c < kC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], k[c], qi);
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int r = 0; r < kR; ++r)
        for (int c = 0; c < kC; ++c)
            _mm512_storeu_ps(s + r * width + c0 + 16 * c, _mm512_mul_ps(acc[r][c], sc));
}
#endif

// acc rows += weights . V for kR query vectors (rows of s, stride s_stride; rows of acc, stride
// kD) over keys [0, n), key j's value row at v(j): every value row feeds kR accumulator rows
// held in registers.
template <typename T, int kD, int kR, typename RowFn>
inline void pv_rows(const float* s, std::int64_t s_stride, std::int64_t n, RowFn v, float* acc) {
    constexpr int kV = kD / 16;
    __m512 a[kR][kV];
    for (int r = 0; r < kR; ++r)
        for (int x = 0; x < kV; ++x) a[r][x] = _mm512_loadu_ps(acc + r * kD + 16 * x);
    for (std::int64_t j = 0; j < n; ++j) {
        const T* row = v(j);
        const __m512 scale = _mm512_set1_ps(row_scale(row, kD));
        __m512 vr[kV];
        for (int x = 0; x < kV; ++x) vr[x] = load16(row + 16 * x, scale);
        for (int r = 0; r < kR; ++r) {
            const __m512 p = _mm512_set1_ps(s[r * s_stride + j]);
            for (int x = 0; x < kV; ++x) a[r][x] = _mm512_fmadd_ps(p, vr[x], a[r][x]);
        }
    }
    for (int r = 0; r < kR; ++r)
        for (int x = 0; x < kV; ++x) _mm512_storeu_ps(acc + r * kD + 16 * x, a[r][x]);
}

// exp_nonpositive on 16 lanes, step for step.
inline __m512 exp_nonpositive16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 i = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_fnmadd_ps(i, _mm512_set1_ps(0.693359375f), x);
    f = _mm512_fmadd_ps(i, _mm512_set1_ps(2.12194440e-4f), f);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    const __m512i bits = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(i), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

inline __mmask16 lanes_below(std::int64_t count) {
    return count >= 16 ? static_cast<__mmask16>(0xFFFF)
                       : static_cast<__mmask16>((1u << std::max<std::int64_t>(count, 0)) - 1);
}

// Lanes c .. c + 15 that fall in [lo, hi).
inline __mmask16 lanes_in(std::int64_t c, std::int64_t lo, std::int64_t hi) {
    return static_cast<__mmask16>(lanes_below(hi - c) & ~lanes_below(lo - c));
}

// soft_cap on 16 lanes: cap * tanh(s / cap), tanh from exp_nonpositive16 as in soft_cap.
inline __m512 soft_cap16(__m512 s, float cap) {
    const __m512 x = _mm512_div_ps(s, _mm512_set1_ps(cap));
    const __m512 e = exp_nonpositive16(_mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(-2.0f)));
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
    const __m512 signed_t = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));
    return _mm512_mul_ps(_mm512_set1_ps(cap), signed_t);
}

// softmax_step on 16 lanes at a time: s has room for whole registers up to round_up(n).
template <int kD>
void softmax_step_avx512(float* s, const Span& span, float& row_max, float& row_sum, float* acc) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const std::int64_t first = span.lo / 16 * 16;  // the register holding key lo
    if (span.softcap > 0.0f) {
        for (std::int64_t c = first; c < span.hi; c += 16)
            _mm512_storeu_ps(s + c, soft_cap16(_mm512_loadu_ps(s + c), span.softcap));
    }
    __m512 mx = _mm512_set1_ps(neg_inf);
    for (std::int64_t c = first; c < span.hi; c += 16)
        mx = _mm512_mask_max_ps(mx, lanes_in(c, span.lo, span.hi), mx, _mm512_loadu_ps(s + c));
    const float new_max = std::max(row_max, _mm512_reduce_max_ps(mx));
    // row_max == -inf only before the vector's first block, when acc and row_sum are still zero.
    const float alpha = row_max == neg_inf ? 0.0f : exp_nonpositive(row_max - new_max);
    const __m512 m = _mm512_set1_ps(new_max);
    __m512 sum = _mm512_setzero_ps();
    for (std::int64_t c = 0; c < span.n; c += 16) {  // keys outside [lo, hi) get weight 0
        const __m512 e = _mm512_maskz_mov_ps(
            lanes_in(c, span.lo, span.hi),
            exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(s + c), m)));
        _mm512_storeu_ps(s + c, e);
        sum = _mm512_add_ps(sum, e);
    }
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sum);
    row_sum = std::fma(row_sum, alpha, sum16(lanes));  // as softmax_step: the same bits
    row_max = new_max;
    if (alpha != 1.0f) {
        const __m512 a = _mm512_set1_ps(alpha);
        for (int d = 0; d < kD; d += 16) _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), a));
    }
}
