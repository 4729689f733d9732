// Portable score, softmax and value kernels of the CPU paged attention: included by
// attention/kernels.hpp inside its anonymous namespace (after Scratch and
// exp_nonpositive), in every ISA level's copy.
// Plain loops the compiler vectorizes; kD = 0 takes the head size at run time. Their fused steps
// (std::fma) and sums are the AVX-512 kernels' (avx512.hpp), so every level gives the same bits.

// Scores of kR query vectors (rows of q) against the transposed keys k_t [head_size][width],
// 16 keys per register, into kR rows of s (stride width). The kR independent accumulators
// hide the FMA latency and share each loaded k_t row.
template <int kD, int kR>
void scores_transposed(const float* q, const float* k_t, std::int64_t n, std::int64_t width,
                       std::int64_t d_rt, float* s) {
    const std::int64_t d_len = kD ? kD : d_rt;
    for (std::int64_t c = 0; c < n; c += kChunk) {
        float part[kR][kChunk] = {};
        for (std::int64_t d = 0; d < d_len; ++d) {
            const float* row = k_t + d * width + c;
            for (int r = 0; r < kR; ++r) {
                const float qd = q[r * d_len + d];
#pragma omp simd
                for (int j = 0; j < kChunk; ++j) part[r][j] = std::fma(qd, row[j], part[r][j]);
            }
        }
        for (int r = 0; r < kR; ++r) std::memcpy(s + r * width + c, part[r], sizeof(part[r]));
    }
}

// Turns scores s[lo, hi) of one query vector (soft-capped first if asked) into weights against
// its running max (and zeroes the rest of s[0, n): keys outside its window or in its future),
// updates its running sum, rescales its acc.
template <int kD>
void softmax_step(float* s, const Span& span, std::int64_t d_rt, float& row_max, float& row_sum,
                  float* acc) {
    const std::int64_t d_len = kD ? kD : d_rt, lo = span.lo, hi = span.hi;
    if (span.softcap > 0.0f) {
#pragma omp simd
        for (std::int64_t j = lo; j < hi; ++j) s[j] = soft_cap(s[j], span.softcap);
    }
    float tile_max = s[lo];
#pragma omp simd reduction(max : tile_max)
    for (std::int64_t j = lo + 1; j < hi; ++j) tile_max = std::max(tile_max, s[j]);
    const float new_max = std::max(row_max, tile_max);
    // row_max == -inf only before the first block, when acc and row_sum are still zero.
    const float alpha = row_max == -std::numeric_limits<float>::infinity()
                            ? 0.0f : exp_nonpositive(row_max - new_max);
    // 16 keys at a time from the chunk holding lo, as a 16-lane register would (s has room up to
    // round_up(n)): key j adds to lane j % 16, keys outside [lo, hi) add weight 0.
    float lanes[kChunk] = {};
    for (std::int64_t c = lo / kChunk * kChunk; c < hi; c += kChunk) {
#pragma omp simd
        for (int l = 0; l < kChunk; ++l) {
            const std::int64_t j = c + l;
            const float e = exp_nonpositive(s[j] - new_max);
            s[j] = j >= lo && j < hi ? e : 0.0f;
            lanes[l] += s[j];
        }
    }
    std::fill(s, s + lo, 0.0f);
    std::fill(s + hi, s + span.n, 0.0f);
    row_sum = std::fma(row_sum, alpha, sum16(lanes));
    row_max = new_max;
    if (alpha != 1.0f) {
#pragma omp simd
        for (std::int64_t d = 0; d < d_len; ++d) acc[d] *= alpha;
    }
}

// acc rows += weights . V over keys [0, n) for kR query vectors (rows of s, stride s_stride;
// rows of acc): each loaded value row feeds kR accumulators held in registers.
template <int kD, int kR>
void accumulate_values(const float* s, std::int64_t s_stride, std::int64_t n, const Scratch& sc,
                       std::int64_t page_size, std::int64_t d_rt, float* acc) {
    const std::int64_t d_len = kD ? kD : d_rt;
    float a[kR][kD ? kD : 1];
    float* rows[kR];
    for (int r = 0; r < kR; ++r) {
        rows[r] = kD ? a[r] : acc + r * d_len;
        if (kD) std::memcpy(a[r], acc + r * d_len, sizeof(float) * d_len);
    }
    for (std::int64_t key0 = 0, p = 0; key0 < n; key0 += page_size, ++p) {
        const std::int64_t page_keys = std::min(page_size, n - key0);
        for (std::int64_t j = 0; j < page_keys; ++j) {
            const float* vr = sc.v_pages[p] + j * d_len;
            for (int r = 0; r < kR; ++r) {
                const float pj = s[r * s_stride + key0 + j];
                float* out = kD ? a[r] : rows[r];
#pragma omp simd
                for (std::int64_t d = 0; d < d_len; ++d) out[d] = std::fma(pj, vr[d], out[d]);
            }
        }
    }
    if (kD) {
        for (int r = 0; r < kR; ++r) std::memcpy(acc + r * d_len, a[r], sizeof(float) * d_len);
    }
}
