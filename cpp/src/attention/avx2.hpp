// AVX2 micro-kernels of the CPU paged attention (included by attention/kernels.hpp only, in its
// AVX2 copy: PAGEDSERVE_ISA_AVX2) for head sizes known at compile time (64, 128): the score, value
// and softmax steps of loops.hpp on 8-lane registers. Compiled for AVX2, the loops' value step
// kept 4 query vectors x 64 columns of accumulators, twice AVX2's 16 registers, so every FMA
// went through the stack, and the softmax's exp stayed scalar (vfmadd...ss; objdump of the build
// before this file); the scores here measured 5-12 % faster than the loops' too. Element for
// element the same operations in the same order as the loops (std::fma is vfmadd, keys in
// order), so the same bits. Needs <immintrin.h>, included by kernels.hpp outside its namespace.

// scores_transposed's: kR query vectors (rows of q, stride kD) against kRegs x 8 transposed keys at
// a time (k_t: [kD][width]) into kR rows of s (stride width). Each score is one chain of kD
// dependent FMAs (over d in order: the bits of every level), so the kR x kRegs accumulators are
// what hides the FMA latency: a decode item's one to three vectors take 64 or 32 keys a pass.
template <int kD, int kR, int kRegs>
inline void score_pass_avx2(const float* q, const float* k_t, std::int64_t c, std::int64_t width,
                            float* s) {
    __m256 acc[kR][kRegs];
    for (int r = 0; r < kR; ++r)
        for (int x = 0; x < kRegs; ++x) acc[r][x] = _mm256_setzero_ps();
    for (int d = 0; d < kD; ++d) {
        const float* row = k_t + d * width + c;
        __m256 k[kRegs];
        for (int x = 0; x < kRegs; ++x) k[x] = _mm256_loadu_ps(row + 8 * x);
        for (int r = 0; r < kR; ++r) {
            const __m256 qd = _mm256_broadcast_ss(q + r * kD + d);
            for (int x = 0; x < kRegs; ++x) acc[r][x] = _mm256_fmadd_ps(qd, k[x], acc[r][x]);
        }
    }
    for (int r = 0; r < kR; ++r)
        for (int x = 0; x < kRegs; ++x) _mm256_storeu_ps(s + r * width + c + 8 * x, acc[r][x]);
}

template <int kD, int kR>
inline void scores_transposed_avx2(const float* q, const float* k_t, std::int64_t n,
                                   std::int64_t width, float* s) {
    // 8 or 12 accumulators; a wide pass may score keys past n up to width (stale lanes, which
    // the softmax never reads: it stops at n rounded up to 16, as the 16-key passes do).
    constexpr int kRegs = kR == 1 ? 8 : kR <= 3 ? 4 : 2;
    std::int64_t c = 0;
    for (; c < n && c + 8 * kRegs <= width; c += 8 * kRegs)
        score_pass_avx2<kD, kR, kRegs>(q, k_t, c, width, s);
    for (; c < n; c += kChunk) score_pass_avx2<kD, kR, 2>(q, k_t, c, width, s);
}

// The cache's row types (Int8Code, ...; row_stride, row_scale, widen): kernels.hpp.

// 8 floats from 8 values of a row whose scale is `scale` (all lanes).
template <typename V>
inline __m256 load_values8(const V* p, __m256 scale) {
    if constexpr (std::is_same_v<V, float>) {
        return _mm256_loadu_ps(p);
    } else if constexpr (std::is_same_v<V, Bf16> || std::is_same_v<V, Half>) {
        const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        if constexpr (std::is_same_v<V, Half>) return _mm256_cvtph_ps(bits);  // F16C
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    } else {
        const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
        if constexpr (std::is_same_v<V, Int8Code>) {
            return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), scale);
        } else {
            // A code is the fp16 of 2^-8 its value with its bits moved (the sign to bit 15, the
            // other seven to bits 13..7): F16C, then scale x 256 (a power of two away from scale:
            // the same exact product, so the scalar widening's rounding). 0x7f / 0xff: NaN.
            const __m128i wide = _mm_cvtepu8_epi16(codes), low7 = _mm_set1_epi16(0x7f);
            const __m128i magnitude = _mm_and_si128(wide, low7);
            __m128i half = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(wide, _mm_set1_epi16(0x80)), 8),
                                        _mm_slli_epi16(magnitude, 7));
            const __m128i nan = _mm_cmpeq_epi16(magnitude, low7);
            half = _mm_or_si128(half, _mm_and_si128(nan, _mm_set1_epi16(0x7e00)));
            return _mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_mul_ps(scale, _mm256_set1_ps(256.0f)));
        }
    }
}

// np rows of type V widened to fp32 rows of dst, d_len apart.
template <typename V>
inline void widen_rows_avx2(const V* rows, std::int64_t np, std::int64_t d_len, float* dst) {
    for (std::int64_t j = 0; j < np; ++j) {
        const V* row = rows + j * row_stride<V>(d_len);
        const float scale = row_scale(row, d_len);
        const __m256 scale8 = _mm256_set1_ps(scale);
        std::int64_t d = 0;
        for (; d + 8 <= d_len; d += 8) _mm256_storeu_ps(dst + j * d_len + d, load_values8(row + d, scale8));
        for (; d < d_len; ++d) dst[j * d_len + d] = widen(row[d], scale);
    }
}

// accumulate_values's: acc rows += weights . V over keys [0, n) for kR query vectors (rows of s,
// stride s_stride; rows of acc, stride kD), in slices of kCols columns: kR x kCols / 8
// accumulators in registers, each value register loaded once per key and slice (one vector:
// 64 columns, 8 chains; two or three: 32 columns, 8 or 12 chains).
//
// V is float (sc.v_pages: fp32 cache pages, or others widened once into scratch), or any other
// row type above (sc.v_raw: the cache pages themselves, each value register widened as it is
// loaded: a decode item's few vectors read each value once, so widening into scratch first only
// added a store and a load per register).
template <int kD, int kR, typename V = float>
inline void accumulate_values_avx2(const float* s, std::int64_t s_stride, std::int64_t n,
                                   const Scratch& sc, std::int64_t page_size, float* acc) {
    constexpr int kCols = kR == 1 && kD % 64 == 0 ? 64 : 32, kRegs = kCols / 8;
    static_assert(kD % 32 == 0 && kR <= 3, "32-column slices of at most 3 rows");
    for (int d0 = 0; d0 < kD; d0 += kCols) {
        __m256 a[kR][kRegs];
        for (int r = 0; r < kR; ++r)
            for (int x = 0; x < kRegs; ++x) a[r][x] = _mm256_loadu_ps(acc + r * kD + d0 + 8 * x);
        for (std::int64_t key0 = 0, p = 0; key0 < n; key0 += page_size, ++p) {
            const std::int64_t page_keys = std::min(page_size, n - key0);
            const V* page;
            if constexpr (std::is_same_v<V, float>) {
                page = sc.v_pages[p];
            } else {
                page = static_cast<const V*>(sc.v_raw[p]);
            }
            for (std::int64_t j = 0; j < page_keys; ++j) {
                const V* row = page + j * row_stride<V>(kD);
                const V* vr = row + d0;
                const __m256 scale = _mm256_set1_ps(row_scale(row, kD));
                // Each value register loaded once and kept (the empty asm): folded into each
                // row's FMA as a memory operand (GCC's choice), the loads doubled and 1,024-token
                // prefills ran 20 % slower.
                __m256 v[kRegs];
                for (int x = 0; x < kRegs; ++x) {
                    v[x] = load_values8(vr + 8 * x, scale);
                    asm("" : "+x"(v[x]));
                }
                for (int r = 0; r < kR; ++r) {
                    const __m256 pj = _mm256_broadcast_ss(s + r * s_stride + key0 + j);
                    for (int x = 0; x < kRegs; ++x) a[r][x] = _mm256_fmadd_ps(pj, v[x], a[r][x]);
                }
            }
        }
        for (int r = 0; r < kR; ++r)
            for (int x = 0; x < kRegs; ++x) _mm256_storeu_ps(acc + r * kD + d0 + 8 * x, a[r][x]);
    }
}

// load_block's transpose: keys [0, np) of one page (rows of k of any row type above, widened in
// registers) into columns [col, col + np) of k_t ([d_len][width]), 8 x 8 at a time by unpacks
// and lane permutes (the scalar loop stored one float per instruction); the last np % 8 keys, or
// a head size that is not a multiple of 8, one by one. The same bits as widening first.
template <typename K>
inline void transpose_keys_avx2(const K* k, std::int64_t np, std::int64_t d_len, float* k_t,
                                std::int64_t width, std::int64_t col) {
    const std::int64_t stride = row_stride<K>(d_len);
    std::int64_t j = 0;
    if (d_len % 8 == 0) {
        for (; j + 8 <= np; j += 8) {
            __m256 scale[8];
            for (int i = 0; i < 8; ++i) scale[i] = _mm256_set1_ps(row_scale(k + (j + i) * stride, d_len));
            for (std::int64_t d = 0; d < d_len; d += 8) {
                __m256 r[8], t[8];
                for (int i = 0; i < 8; ++i) r[i] = load_values8(k + (j + i) * stride + d, scale[i]);
                for (int i = 0; i < 8; i += 2) {
                    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
                }
                for (int i = 0; i < 8; i += 4) {
                    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
                    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
                }
                // r[0..3]: dims d + {0, 1, 2, 3} of keys j..j+3 (low lanes) and of dims d + 4..7
                // (high lanes); r[4..7] the same for keys j+4..j+7.
                for (int i = 0; i < 4; ++i) {
                    float* lo = k_t + (d + i) * width + col + j;
                    float* hi = k_t + (d + 4 + i) * width + col + j;
                    _mm256_storeu_ps(lo, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
                    _mm256_storeu_ps(hi, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
                }
            }
        }
    }
    for (; j < np; ++j) {
        const K* row = k + j * stride;
        const float scale = row_scale(row, d_len);
        for (std::int64_t d = 0; d < d_len; ++d) k_t[d * width + col + j] = widen(row[d], scale);
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
