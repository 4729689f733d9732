// CPU paged attention: OpenMP over (request, KV head, query block) work items, one pass over the
// request's pages per item with a streaming (online) softmax in fp32. All query heads of a GQA
// group share an item, so each K/V page tile is loaded (and converted from bf16) once per group.
// Inner loops are plain loops over head_size or a 16-key chunk, written so the compiler
// vectorizes them (-O3 -march=native; `omp simd`); no intrinsics, so it builds anywhere.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "pagedserve/paged_attention.hpp"

namespace pagedserve {
namespace {

// bf16 storage: the top 16 bits of an IEEE float.
struct Bf16 {
    std::uint16_t bits;
};

// e^x for x <= 0 (scores minus their running max), vectorizable: 2^i * e^f with i = round(x /
// ln 2) and |f| <= ln(2) / 2, where a degree-7 Taylor polynomial is good to ~1e-8 relative.
inline float exp_nonpositive(float x) {
    x = std::max(x, -87.0f);  // keeps 2^i a normal float; e^-87 is below fp32 resolution of 1
    const float t = x * 1.44269504088896341f;
    const float i = (t + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23 trick)
    const float f = (x - i * 0.693359375f) + i * 2.12194440e-4f;  // Cody-Waite: exact i * hi
    float p = 1.0f / 5040.0f;
    p = p * f + 1.0f / 720.0f;
    p = p * f + 1.0f / 120.0f;
    p = p * f + 1.0f / 24.0f;
    p = p * f + 1.0f / 6.0f;
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(i) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    return p * scale;
}

inline void load_row(const float* src, float* dst, std::int64_t n) {
    std::memcpy(dst, src, sizeof(float) * n);
}

inline void load_row(const Bf16* src, float* dst, std::int64_t n) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
        const std::uint32_t bits = static_cast<std::uint32_t>(src[i].bits) << 16;
        std::memcpy(dst + i, &bits, sizeof(float));
    }
}

inline void store_row(const float* src, float* dst, std::int64_t n) {
    std::memcpy(dst, src, sizeof(float) * n);
}

// Round to nearest even; NaN stays NaN (quieted).
inline void store_row(const float* src, Bf16* dst, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) {
        std::uint32_t u;
        std::memcpy(&u, src + i, sizeof(u));
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            dst[i].bits = static_cast<std::uint16_t>((u >> 16) | 0x40u);
        } else {
            dst[i].bits = static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        }
    }
}

constexpr int kChunk = 16;        // keys per vectorized score chunk (one AVX-512 register)
constexpr int kBlockKeys = 64;    // keys per softmax update: whole pages, at least one
constexpr int kTargetRows = 128;  // query vectors (rows x group heads) per work item
constexpr int kMinParallelWork = 1 << 15;  // (query vector, key) pairs: ~0.1 ms of work
constexpr int kGroupRows = 4;     // query vectors scored together (shared key loads)
constexpr int kDotMaxRows = 8;    // below this many query vectors, a dot per key beats transposing

struct WorkItem {
    std::int64_t req, kv_head, row0, rows;
};

std::int64_t round_up(std::int64_t n) { return (n + kChunk - 1) / kChunk * kChunk; }

// Per-thread buffers, sized once per call. A key block is pages_per_block whole pages.
struct Scratch {
    std::int64_t pages_per_block, block_keys, width;
    std::vector<float> q, acc, row_max, row_sum, k, k_t, v, s;
    std::vector<const float*> k_pages, v_pages;
    Scratch(std::int64_t m, std::int64_t d, std::int64_t page_size)
        : pages_per_block(std::max<std::int64_t>(1, kBlockKeys / page_size)),
          block_keys(pages_per_block * page_size), width(round_up(block_keys)), q(m * d),
          acc(m * d), row_max(m), row_sum(m), k(block_keys * d), k_t(d * width),
          v(block_keys * d), s(kGroupRows * width), k_pages(pages_per_block), v_pages(pages_per_block) {}
};

void check(bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument(message);
}

void validate(const AttentionArgs& a) {
    check(a.num_heads % a.cache.num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
    check(a.query_start_loc[0] == 0, "query_start_loc[0] must be 0");
    check(a.query_start_loc[a.num_reqs] == a.num_tokens,
          "query_start_loc[-1] must equal the number of query tokens");
    const std::int64_t capacity = a.page_table_stride * a.cache.page_size;
    for (std::int64_t r = 0; r < a.num_reqs; ++r) {
        const std::int64_t q_len = a.query_start_loc[r + 1] - a.query_start_loc[r];
        const std::int64_t seq_len = a.seq_lens[r];
        check(q_len >= 0, "query_start_loc must be non-decreasing");
        check(q_len <= seq_len, "seq_lens[r] must be >= the request's query length");
        check(q_len <= a.max_query_len, "max_query_len is smaller than a request's query length");
        check(seq_len <= a.max_seq_len, "max_seq_len is smaller than a seq_lens entry");
        check(seq_len <= capacity, "seq_lens[r] exceeds the page_table row's capacity");
        const std::int64_t used = (seq_len + a.cache.page_size - 1) / a.cache.page_size;
        for (std::int64_t t = 0; t < used; ++t) {
            const std::int32_t page = a.page_table[r * a.page_table_stride + t];
            check(page >= 0 && page < a.cache.num_pages, "page_table holds a page id out of range");
        }
    }
}

std::vector<WorkItem> make_work(const AttentionArgs& a) {
    const std::int64_t group = a.num_heads / a.cache.num_kv_heads;
    const std::int64_t block = std::max<std::int64_t>(1, kTargetRows / group);
    std::vector<WorkItem> items;
    for (std::int64_t r = 0; r < a.num_reqs; ++r) {
        const std::int64_t q_len = a.query_start_loc[r + 1] - a.query_start_loc[r];
        // Later query blocks see more keys: list them first so dynamic scheduling balances.
        for (std::int64_t row0 = q_len > 0 ? (q_len - 1) / block * block : -1; row0 >= 0;
             row0 -= block) {
            for (std::int64_t g = 0; g < a.cache.num_kv_heads; ++g) {
                items.push_back({r, g, row0, std::min(block, q_len - row0)});
            }
        }
    }
    return items;
}

// Scores of query vector q against keys [0, n) stored as rows (k: [n][head_size]).
template <int kD>
void scores_dot(const float* q, const float* k, std::int64_t n, std::int64_t d_rt, float* s) {
    const std::int64_t d_len = kD ? kD : d_rt;
    for (std::int64_t j = 0; j < n; ++j) {
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (std::int64_t d = 0; d < d_len; ++d) sum += q[d] * k[j * d_len + d];
        s[j] = sum;
    }
}

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
                for (int j = 0; j < kChunk; ++j) part[r][j] += qd * row[j];
            }
        }
        for (int r = 0; r < kR; ++r) std::memcpy(s + r * width + c, part[r], sizeof(part[r]));
    }
}

// Turns scores s[0, valid) of one query vector into weights against its running max (and
// zeroes s[valid, n), keys in the row's future), updates its running sum, rescales its acc.
template <int kD>
void softmax_step(float* s, std::int64_t valid, std::int64_t n, std::int64_t d_rt,
                  float& row_max, float& row_sum, float* acc) {
    const std::int64_t d_len = kD ? kD : d_rt;
    float tile_max = s[0];
#pragma omp simd reduction(max : tile_max)
    for (std::int64_t j = 1; j < valid; ++j) tile_max = std::max(tile_max, s[j]);
    const float new_max = std::max(row_max, tile_max);
    // row_max == -inf only before the first block, when acc and row_sum are still zero.
    const float alpha = row_max == -std::numeric_limits<float>::infinity()
                            ? 0.0f : exp_nonpositive(row_max - new_max);
    float tile_sum = 0.0f;
#pragma omp simd reduction(+ : tile_sum)
    for (std::int64_t j = 0; j < valid; ++j) {
        s[j] = exp_nonpositive(s[j] - new_max);
        tile_sum += s[j];
    }
    std::fill(s + valid, s + n, 0.0f);
    row_sum = row_sum * alpha + tile_sum;
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
                for (std::int64_t d = 0; d < d_len; ++d) out[d] += pj * vr[d];
            }
        }
    }
    if (kD) {
        for (int r = 0; r < kR; ++r) std::memcpy(acc + r * d_len, a[r], sizeof(float) * d_len);
    }
}

template <typename T>
void prefetch_tile(const T* p, std::int64_t elements) {
#if defined(__GNUC__)
    const char* bytes = reinterpret_cast<const char*>(p);
    for (std::int64_t i = 0; i < elements * static_cast<std::int64_t>(sizeof(T)); i += 64)
        __builtin_prefetch(bytes + i);
#else
    (void)p;
    (void)elements;
#endif
}

// Points at (fp32) or converts (bf16) the pages of keys [key0, key0 + block_keys) below
// num_keys into sc.k_pages / sc.v_pages, and the transposed keys into sc.k_t when asked.
// Returns the number of keys in the block.
template <typename T>
std::int64_t load_block(const AttentionArgs& a, const WorkItem& w, std::int64_t key0,
                        std::int64_t num_keys, std::int64_t d_len, bool transpose, Scratch& sc) {
    const KvCacheView& c = a.cache;
    const T* cache = static_cast<const T*>(c.data);
    const std::int32_t* row = a.page_table + w.req * a.page_table_stride;
    std::int64_t n = 0;
    for (std::int64_t p = 0; p < sc.pages_per_block && key0 + n < num_keys; ++p) {
        const std::int64_t np = std::min(c.page_size, num_keys - key0 - n);
        const std::int64_t index = (key0 + n) / c.page_size;
        const std::int64_t off = row[index] * c.page_stride() + w.kv_head * c.head_stride();
        const std::int64_t ahead = index + sc.pages_per_block;  // scattered pages: no HW prefetch
        if (ahead * c.page_size < num_keys) {
            const std::int64_t next = row[ahead] * c.page_stride() + w.kv_head * c.head_stride();
            prefetch_tile(cache + next, c.head_stride());
            prefetch_tile(cache + c.kv_stride() + next, c.head_stride());
        }
        if constexpr (std::is_same_v<T, float>) {
            sc.k_pages[p] = cache + off;
            sc.v_pages[p] = cache + c.kv_stride() + off;
        } else {
            load_row(cache + off, sc.k.data() + n * d_len, np * d_len);
            load_row(cache + c.kv_stride() + off, sc.v.data() + n * d_len, np * d_len);
            sc.k_pages[p] = sc.k.data() + n * d_len;
            sc.v_pages[p] = sc.v.data() + n * d_len;
        }
        if (transpose) {
            const float* k = sc.k_pages[p];
            for (std::int64_t j = 0; j < np; ++j)
                for (std::int64_t d = 0; d < d_len; ++d) sc.k_t[d * sc.width + n + j] = k[j * d_len + d];
        }
        n += np;
    }
    return n;
}

template <typename T, int kD>
void load_queries(const AttentionArgs& a, const WorkItem& w, Scratch& sc) {
    const std::int64_t d_len = kD ? kD : a.cache.head_size;
    const std::int64_t group = a.num_heads / a.cache.num_kv_heads;
    const T* query = static_cast<const T*>(a.query.data);
    for (std::int64_t m = 0; m < w.rows * group; ++m) {  // m = row * group + head in group
        const std::int64_t tok = a.query_start_loc[w.req] + w.row0 + m / group;
        const std::int64_t head = w.kv_head * group + m % group;
        float* q = sc.q.data() + m * d_len;
        load_row(query + tok * a.query.token_stride + head * a.query.head_stride, q, d_len);
        for (std::int64_t d = 0; d < d_len; ++d) q[d] *= a.scale;
        std::fill(sc.acc.begin() + m * d_len, sc.acc.begin() + (m + 1) * d_len, 0.0f);
        sc.row_max[m] = -std::numeric_limits<float>::infinity();
        sc.row_sum[m] = 0.0f;
    }
}

// Folds one key block [key0, key0 + n) into query vectors m .. m + kR of the work item.
template <int kD, int kR>
void attend_rows(const AttentionArgs& a, Scratch& sc, std::int64_t m, std::int64_t key0,
                 std::int64_t n, std::int64_t first_pos, bool transpose) {
    const std::int64_t d_len = kD ? kD : a.cache.head_size, ps = a.cache.page_size;
    const std::int64_t group = a.num_heads / a.cache.num_kv_heads;
    std::int64_t valid[kR], n_max = 0;
    for (int r = 0; r < kR; ++r) {  // each vector's causal horizon inside this block
        valid[r] = std::min(n, first_pos + (m + r) / group - key0 + 1);
        n_max = std::max(n_max, valid[r]);
    }
    if (n_max <= 0) return;  // the block lies wholly in these rows' future
    float* s = sc.s.data();
    const float* q = sc.q.data() + m * d_len;
    if (transpose) {
        scores_transposed<kD, kR>(q, sc.k_t.data(), n_max, sc.width, d_len, s);
    } else {
        for (int r = 0; r < kR; ++r)
            for (std::int64_t p = 0; p * ps < n_max; ++p)
                scores_dot<kD>(q + r * d_len, sc.k_pages[p], std::min(ps, n_max - p * ps), d_len,
                               s + r * sc.width + p * ps);
    }
    for (int r = 0; r < kR; ++r) {
        float* sr = s + r * sc.width;
        if (valid[r] <= 0) {
            std::fill(sr, sr + n_max, 0.0f);
        } else {
            softmax_step<kD>(sr, valid[r], n_max, d_len, sc.row_max[m + r], sc.row_sum[m + r],
                             sc.acc.data() + (m + r) * d_len);
        }
    }
    // D = 64 keeps 4 accumulators of 4 registers each; D = 128 takes 2 at a time.
    constexpr int kPv = std::min(kR, kD == 0 ? 1 : (kD <= 64 ? 4 : 2));
    for (int r = 0; r < kR; r += kPv)
        accumulate_values<kD, kPv>(s + r * sc.width, sc.width, n_max, sc, ps, d_len,
                                   sc.acc.data() + (m + r) * d_len);
}

template <typename T, int kD>
void attend_item(const AttentionArgs& a, const WorkItem& w, Scratch& sc) {
    const KvCacheView& c = a.cache;
    const std::int64_t d_len = kD ? kD : c.head_size;
    const std::int64_t group = a.num_heads / c.num_kv_heads;
    const std::int64_t m_len = w.rows * group;
    const std::int64_t q_len = a.query_start_loc[w.req + 1] - a.query_start_loc[w.req];
    const std::int64_t first_pos = a.seq_lens[w.req] - q_len + w.row0;  // position of row 0
    load_queries<T, kD>(a, w, sc);
    const bool transpose = m_len >= kDotMaxRows;
    const std::int64_t num_keys = first_pos + w.rows;  // the last row's causal horizon
    for (std::int64_t key0 = 0; key0 < num_keys; key0 += sc.block_keys) {
        const std::int64_t n = load_block<T>(a, w, key0, num_keys, d_len, transpose, sc);
        std::int64_t m = 0;
        if (transpose) {
            for (; m + kGroupRows <= m_len; m += kGroupRows)
                attend_rows<kD, kGroupRows>(a, sc, m, key0, n, first_pos, transpose);
        }
        for (; m < m_len; ++m) attend_rows<kD, 1>(a, sc, m, key0, n, first_pos, transpose);
    }
    T* out = static_cast<T*>(a.out);
    for (std::int64_t m = 0; m < m_len; ++m) {
        const std::int64_t tok = a.query_start_loc[w.req] + w.row0 + m / group;
        const std::int64_t head = w.kv_head * group + m % group;
        float* acc = sc.acc.data() + m * d_len;
        const float inv = 1.0f / sc.row_sum[m];  // > 0: every row sees at least key 0
        for (std::int64_t d = 0; d < d_len; ++d) acc[d] *= inv;
        store_row(acc, out + tok * a.out_token_stride + head * a.out_head_stride, d_len);
    }
}

template <typename T, int kD>
void run_attention(const AttentionArgs& a, int num_threads) {
    const std::vector<WorkItem> items = make_work(a);
    const std::int64_t group = a.num_heads / a.cache.num_kv_heads;
    const std::int64_t max_m = std::max<std::int64_t>(1, kTargetRows / group) * group;
    const std::int64_t num_items = static_cast<std::int64_t>(items.size());
    // Waking a thread team costs microseconds (far more on a busy machine): small steps stay
    // on the calling thread. Work counts (query vector, key) pairs.
    std::int64_t work = 0;
    for (const WorkItem& w : items) {
        const std::int64_t q_len = a.query_start_loc[w.req + 1] - a.query_start_loc[w.req];
        work += w.rows * group * (a.seq_lens[w.req] - q_len + w.row0 + w.rows);
    }
    const int threads = work < kMinParallelWork ? 1 : std::min<std::int64_t>(num_threads, num_items);
#pragma omp parallel num_threads(threads)
    {
        Scratch sc(max_m, a.cache.head_size, a.cache.page_size);
#pragma omp for schedule(dynamic, 1)
        for (std::int64_t i = 0; i < num_items; ++i) attend_item<T, kD>(a, items[i], sc);
    }
}

template <typename T>
void run_attention_for_head_size(const AttentionArgs& a, int num_threads) {
    switch (a.cache.head_size) {
        case 64: return run_attention<T, 64>(a, num_threads);
        case 128: return run_attention<T, 128>(a, num_threads);
        default: return run_attention<T, 0>(a, num_threads);
    }
}

}  // namespace

void paged_attention_cpu(const AttentionArgs& args, int num_threads) {
    validate(args);
    if (args.num_tokens == 0) return;
    num_threads = std::max(1, num_threads);
    switch (args.dtype) {
        case DType::kFloat32: return run_attention_for_head_size<float>(args, num_threads);
        case DType::kBFloat16: return run_attention_for_head_size<Bf16>(args, num_threads);
        default: throw std::invalid_argument("CPU paged attention supports float32 and bfloat16");
    }
}

void reshape_and_cache_cpu(const CacheWriteArgs& args, int num_threads) {
    const KvCacheView& c = args.cache;
    const std::int64_t num_slots = c.num_pages * c.page_size;
    for (std::int64_t t = 0; t < args.num_tokens; ++t) {
        const std::int64_t slot = args.slot_mapping[t];
        check(slot >= -1 && slot < num_slots, "slot_mapping holds a slot out of range");
    }
    const std::size_t elt = dtype_size(args.dtype);
    const std::size_t row_bytes = c.head_size * elt;
    auto* cache = static_cast<char*>(c.data);
    // Parallel only when there is enough to copy; a decode step writes a handful of rows.
    const int threads = args.num_tokens >= 256 ? std::max(1, num_threads) : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::int64_t t = 0; t < args.num_tokens; ++t) {
        const std::int64_t slot = args.slot_mapping[t];
        if (slot < 0) continue;
        const std::int64_t base = (slot / c.page_size) * c.page_stride() +
                                  (slot % c.page_size) * c.head_size;
        for (std::int64_t h = 0; h < c.num_kv_heads; ++h) {
            const std::int64_t dst = base + h * c.head_stride();
            const auto* k = static_cast<const char*>(args.key.data) +
                            (t * args.key.token_stride + h * args.key.head_stride) * elt;
            const auto* v = static_cast<const char*>(args.value.data) +
                            (t * args.value.token_stride + h * args.value.head_stride) * elt;
            std::memcpy(cache + dst * elt, k, row_bytes);
            std::memcpy(cache + (c.kv_stride() + dst) * elt, v, row_bytes);
        }
    }
}

}  // namespace pagedserve
