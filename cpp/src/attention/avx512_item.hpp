// AVX-512 work-item driver of the CPU paged attention: included by attention/kernels.hpp
// inside its anonymous namespace (AVX-512 copies only), after the portable kernels (whose Scratch, horizons, softmax_rows,
// load_queries and finish_item it shares) and the micro-kernels of attention/avx512.hpp.
//
// Keys are transposed in registers into sc.k_t once per block, then up to 4 query vectors x 64
// keys per micro-kernel call; each score is one lane's dot product summed over head_size in
// order, whatever the number of query vectors. So a query's output is bit-identical in a decode
// step and in any prefill chunk (batch invariance, issue 16): a per-key dot whose lanes are
// summed by a tree rounds differently. That per-key dot is still the decode path when the caller
// turns batch_invariant off: no transpose, each key row read once from the cache.

// The cache rows (of type K) of keys [key0, key0 + block_keys) below num_keys into sc.k_rows /
// sc.v_rows. Returns the number of keys in the block.
template <typename K, int kD>
std::int64_t gather_block(const AttentionArgs& a, const WorkItem& w, std::int64_t key0,
                          std::int64_t num_keys, Scratch& sc) {
    const KvCacheView& c = a.cache;
    std::int64_t n = 0;
    for (std::int64_t p = 0; p < sc.pages_per_block && key0 + n < num_keys; ++p) {
        const std::int64_t np = std::min(c.page_size, num_keys - key0 - n);
        const K* k = static_cast<const K*>(c.data) +
                     page_offset<K>(a, w, (key0 + n) / c.page_size, num_keys, sc);
        for (std::int64_t j = 0; j < np; ++j) {
            sc.k_rows[n + j] = k + j * row_stride<K>(kD);
            sc.v_rows[n + j] = k + c.kv_stride() + j * row_stride<K>(kD);
        }
        n += np;
    }
    return n;
}

// Transposes the block's n keys into sc.k_t: fp32 [kD][width], or with dpbf16 bf16 pairs
// [kD / 2][width] (32-bit elements). Key columns in [n, round_up(n)) are zero.
template <typename T, int kD, bool kDp>
void transpose_keys(Scratch& sc, std::int64_t n) {
    constexpr std::int64_t kCols = kDp ? kD / 2 : kD;
    auto* k_t = reinterpret_cast<std::uint32_t*>(sc.k_t.data());
    for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
        const std::uint32_t* rows[kChunk];
        for (int j = 0; j < kChunk; ++j) {
            const void* row = sc.zero.data();
            if (c0 + j < n && !std::is_same_v<T, float> && !kDp) {  // widen to fp32 first
                float* f = sc.k.data() + (c0 + j) * kD;
                const T* k = static_cast<const T*>(sc.k_rows[c0 + j]);
                const __m512 scale = _mm512_set1_ps(row_scale(k, kD));
                for (int d = 0; d < kD; d += 16) _mm512_storeu_ps(f + d, load16(k + d, scale));
                row = f;
            } else if (c0 + j < n) {
                row = sc.k_rows[c0 + j];
            }
            rows[j] = static_cast<const std::uint32_t*>(row);
        }
        transpose_rows(rows, kCols, k_t + c0, sc.width);
    }
}

// Scores of kR query vectors from m against transposed keys [c0, c0 + kC * 16).
template <int kD, bool kDp, int kR, int kC>
void scores_t(const AttentionArgs& a, Scratch& sc, std::int64_t m, std::int64_t c0) {
#if PAGEDSERVE_ISA_AVX512_BF16
    if constexpr (kDp) {
        const auto* q = reinterpret_cast<const std::uint32_t*>(sc.q_bf16.data() + m * kD);
        const auto* k_t = reinterpret_cast<const std::uint32_t*>(sc.k_t.data());
        return scores_t_bf16<kD, kR, kC>(q, k_t, sc.width, c0, a.scale, sc.s.data());
    }
#endif
    (void)a;
    scores_t_f32<kD, kR, kC>(sc.q.data() + m * kD, sc.k_t.data(), sc.width, c0, sc.s.data());
}

template <int kD, bool kDp, int kR>
void scores_t_block(const AttentionArgs& a, Scratch& sc, std::int64_t m, std::int64_t n) {
    for (std::int64_t c0 = 0; c0 < n; c0 += 4 * kChunk) {
        switch (std::min<std::int64_t>(4, (n - c0 + kChunk - 1) / kChunk)) {
            case 1: scores_t<kD, kDp, kR, 1>(a, sc, m, c0); break;
            case 2: scores_t<kD, kDp, kR, 2>(a, sc, m, c0); break;
            case 3: scores_t<kD, kDp, kR, 3>(a, sc, m, c0); break;
            default: scores_t<kD, kDp, kR, 4>(a, sc, m, c0); break;
        }
    }
}

template <typename T, int kD, int kR>
void pv_chunk(Scratch& sc, std::int64_t m, std::int64_t r, std::int64_t n) {
    const void* const* rows = sc.v_rows.data();
    pv_rows<T, kD, kR>(
        sc.s.data() + r * sc.width, sc.width, n,
        [rows](std::int64_t j) { return static_cast<const T*>(rows[j]); },
        sc.acc.data() + (m + r) * kD);
}

// acc rows m .. m + rows += weights (rows of sc.s) . V over the block's keys [0, n).
template <typename T, int kD>
void pv_block(Scratch& sc, std::int64_t m, std::int64_t rows, std::int64_t n) {
    // D = 64: 4 rows of 4 accumulator registers each; D = 128: 2 rows of 8.
    constexpr int kPv = kD <= 64 ? 4 : 2;
    for (std::int64_t r = 0; r < rows; r += kPv) {
        const std::int64_t left = std::min<std::int64_t>(kPv, rows - r);
        if (kPv == 4 && left == 4) pv_chunk<T, kD, 4>(sc, m, r, n);
        else if (kPv == 4 && left == 3) pv_chunk<T, kD, 3>(sc, m, r, n);
        else if (left == 2) pv_chunk<T, kD, 2>(sc, m, r, n);
        else pv_chunk<T, kD, 1>(sc, m, r, n);
    }
}

// Folds one key block [key0, key0 + n) into query vectors m .. m + kR (transposed keys in
// sc.k_t). Value rows are of type V (the cache's T, or float once widened).
template <typename T, typename V, int kD, bool kDp, int kR>
void attend_rows_avx512(const AttentionArgs& a, Scratch& sc, std::int64_t m, std::int64_t key0,
                        std::int64_t n, std::int64_t first_pos) {
    std::int64_t lo[kR], hi[kR];
    const std::int64_t n_max = horizons(a, m, kR, key0, n, first_pos, lo, hi);
    if (n_max <= 0) return;
    scores_t_block<kD, kDp, kR>(a, sc, m, n_max);
    softmax_rows<kD>(a, sc, m, kR, lo, hi, n_max, kD);
    pv_block<V, kD>(sc, m, kR, n_max);
}

// Query vectors [0, m_len) over the block: kGroupRows at a time, then the last 1 to 3 together.
template <typename T, typename V, int kD, bool kDp>
void attend_block_avx512(const AttentionArgs& a, Scratch& sc, std::int64_t m_len,
                         std::int64_t key0, std::int64_t n, std::int64_t first_pos) {
    static_assert(kGroupRows == 4, "the tail below takes 1 to 3 vectors");
    std::int64_t m = 0;
    for (; m + kGroupRows <= m_len; m += kGroupRows)
        attend_rows_avx512<T, V, kD, kDp, kGroupRows>(a, sc, m, key0, n, first_pos);
    switch (m_len - m) {
        case 3: return attend_rows_avx512<T, V, kD, kDp, 3>(a, sc, m, key0, n, first_pos);
        case 2: return attend_rows_avx512<T, V, kD, kDp, 2>(a, sc, m, key0, n, first_pos);
        case 1: return attend_rows_avx512<T, V, kD, kDp, 1>(a, sc, m, key0, n, first_pos);
        default: return;
    }
}

// Scores of query vector m against the block's keys [0, n) into s (16 keys per register): a dot
// per key from the cache rows as they are, lanes summed by hsum16 (batch_invariant = false).
template <typename T, int kD, bool kDp>
void scores_dot_avx512(const AttentionArgs& a, const Scratch& sc, std::int64_t m, std::int64_t n,
                       float* s) {
    __m512 q[kD / 16];
    for (int i = 0; i < (kDp ? kD / 32 : kD / 16); ++i) {
        q[i] = kDp ? _mm512_castsi512_ps(_mm512_loadu_si512(sc.q_bf16.data() + m * kD + 32 * i))
                   : _mm512_loadu_ps(sc.q.data() + m * kD + 16 * i);
    }
    for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
        const T* keys[kChunk];
        const int count = static_cast<int>(std::min<std::int64_t>(kChunk, n - c0));
        for (int j = 0; j < count; ++j) keys[j] = static_cast<const T*>(sc.k_rows[c0 + j]);
        __m512 v = dot16<T, kD, kDp>(q, keys, count);
        if (kDp) v = _mm512_mul_ps(v, _mm512_set1_ps(a.scale));  // raw bf16 query: unscaled
        _mm512_storeu_ps(s + c0, v);
    }
}

// The block for all m_len < kDotMaxRows query vectors at once, keys scored by scores_dot_avx512
// and values read straight from the cache.
template <typename T, int kD, bool kDp>
void attend_block_dot_avx512(const AttentionArgs& a, Scratch& sc, std::int64_t m_len,
                             std::int64_t key0, std::int64_t n, std::int64_t first_pos) {
    std::int64_t lo[kDotMaxRows], hi[kDotMaxRows];
    const std::int64_t n_max = horizons(a, 0, m_len, key0, n, first_pos, lo, hi);
    if (n_max <= 0) return;
    for (std::int64_t r = 0; r < m_len; ++r)
        scores_dot_avx512<T, kD, kDp>(a, sc, r, n_max, sc.s.data() + r * sc.width);
    softmax_rows<kD>(a, sc, 0, m_len, lo, hi, n_max, kD);
    pv_block<T, kD>(sc, 0, m_len, n_max);
}

template <typename T, int kD>
void load_raw_queries(const AttentionArgs& a, const WorkItem& w, Scratch& sc) {
    const std::int64_t group = a.num_heads / a.cache.num_kv_heads;
    const T* query = static_cast<const T*>(a.query.data);
    for (std::int64_t m = 0; m < w.rows * group; ++m) {
        const std::int64_t tok = a.query_start_loc[w.req] + w.row0 + m / group;
        const std::int64_t head = w.kv_head * group + m % group;
        std::memcpy(sc.q_bf16.data() + m * kD,
                    query + tok * a.query.token_stride + head * a.query.head_stride,
                    sizeof(T) * kD);
    }
}

// One work item: queries and outputs of type T (the activations'), key and value rows of type K
// (T's cache, or Half, Int8Code or E4m3Code: a quantized cache, widened in registers).
template <typename T, typename K, int kD>
void attend_item_avx512(const AttentionArgs& a, const WorkItem& w, Scratch& sc) {
    constexpr bool kDp = std::is_same_v<K, Bf16> && kHasDpbf16;
    const std::int64_t m_len = w.rows * (a.num_heads / a.cache.num_kv_heads);
    const std::int64_t q_len = a.query_start_loc[w.req + 1] - a.query_start_loc[w.req];
    const std::int64_t first_pos = a.seq_lens[w.req] - q_len + w.row0;  // position of row 0
    load_queries<T, kD>(a, w, sc);
    if constexpr (kDp) load_raw_queries<T, kD>(a, w, sc);
    const std::int64_t num_keys = first_pos + w.rows;  // the last row's causal horizon
    const bool dot = !a.batch_invariant && m_len < kDotMaxRows;
    for (std::int64_t key0 = first_block(a, first_pos, sc); key0 < num_keys;
         key0 += sc.block_keys) {
        const std::int64_t n = gather_block<K, kD>(a, w, key0, num_keys, sc);
        if (dot) {
            attend_block_dot_avx512<K, kD, kDp>(a, sc, m_len, key0, n, first_pos);
            continue;
        }
        transpose_keys<K, kD, kDp>(sc, n);
        if (m_len < kWidenMinRows) {  // few vectors (decode): values straight from the cache
            attend_block_avx512<K, K, kD, kDp>(a, sc, m_len, key0, n, first_pos);
            continue;
        }
        // Many row chunks share this block's values: widen bf16 or fp16 once, not once per
        // chunk (the same values either way, so the same sums).
        if constexpr (!std::is_same_v<K, float>) {
            for (std::int64_t j = 0; j < n; ++j) {
                const K* v = static_cast<const K*>(sc.v_rows[j]);
                const __m512 scale = _mm512_set1_ps(row_scale(v, kD));
                float* f = sc.v.data() + j * kD;
                for (int d = 0; d < kD; d += 16) _mm512_storeu_ps(f + d, load16(v + d, scale));
                sc.v_rows[j] = f;
            }
        }
        attend_block_avx512<K, float, kD, kDp>(a, sc, m_len, key0, n, first_pos);
    }
    finish_item<T, kD>(a, w, sc);
}
