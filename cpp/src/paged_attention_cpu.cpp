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
constexpr int kTargetRows = 64;   // query vectors (rows x group heads) per work item
constexpr int kDotMaxRows = 8;    // below this many query vectors, a dot per key beats transposing

struct WorkItem {
    std::int64_t req, kv_head, row0, rows;
};

// Per-thread buffers, sized once per call.
struct Scratch {
    std::vector<float> q, acc, row_max, row_sum, k, k_t, v, p;
    Scratch(std::int64_t m, std::int64_t d, std::int64_t page_size)
        : q(m * d), acc(m * d), row_max(m), row_sum(m), k(page_size * d),
          k_t(d * round_up(page_size)), v(page_size * d), p(round_up(page_size)) {}
    static std::int64_t round_up(std::int64_t n) { return (n + kChunk - 1) / kChunk * kChunk; }
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
        for (std::int64_t row0 = (q_len - 1) / block * block; row0 >= 0; row0 -= block) {
            for (std::int64_t g = 0; g < a.cache.num_kv_heads; ++g) {
                items.push_back({r, g, row0, std::min(block, q_len - row0)});
            }
        }
    }
    return items;
}

// Scores of query vector q against keys [0, n) of a tile.
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

// Same scores from the transposed tile k_t [head_size][width], 16 keys per register.
template <int kD>
void scores_transposed(const float* q, const float* k_t, std::int64_t n, std::int64_t width,
                       std::int64_t d_rt, float* s) {
    const std::int64_t d_len = kD ? kD : d_rt;
    for (std::int64_t c = 0; c < n; c += kChunk) {
        // Four partial sums break the FMA latency chain along head_size.
        float part[4][kChunk] = {};
        std::int64_t d = 0;
        for (; d + 4 <= d_len; d += 4) {
            for (int u = 0; u < 4; ++u) {
                const float qd = q[d + u];
                const float* row = k_t + (d + u) * width + c;
#pragma omp simd
                for (int j = 0; j < kChunk; ++j) part[u][j] += qd * row[j];
            }
        }
        for (; d < d_len; ++d) {
            const float* row = k_t + d * width + c;
            for (int j = 0; j < kChunk; ++j) part[0][j] += q[d] * row[j];
        }
#pragma omp simd
        for (int j = 0; j < kChunk; ++j) s[c + j] = (part[0][j] + part[1][j]) + (part[2][j] + part[3][j]);
    }
}

// Folds `valid` scores s[0, valid) of one query vector into its running max, sum and acc.
template <int kD>
void online_softmax_update(float* s, std::int64_t valid, const float* v, std::int64_t d_rt,
                           float& row_max, float& row_sum, float* acc) {
    const std::int64_t d_len = kD ? kD : d_rt;
    float tile_max = s[0];
#pragma omp simd reduction(max : tile_max)
    for (std::int64_t j = 1; j < valid; ++j) tile_max = std::max(tile_max, s[j]);
    const float new_max = std::max(row_max, tile_max);
    // row_max == -inf only before the first tile, when acc and row_sum are still zero.
    const float alpha = row_max == -std::numeric_limits<float>::infinity()
                            ? 0.0f : exp_nonpositive(row_max - new_max);
    float tile_sum = 0.0f;
#pragma omp simd reduction(+ : tile_sum)
    for (std::int64_t j = 0; j < valid; ++j) {
        s[j] = exp_nonpositive(s[j] - new_max);
        tile_sum += s[j];
    }
    row_sum = row_sum * alpha + tile_sum;
    row_max = new_max;
    float a[kD ? kD : 1];
    float* out = kD ? a : acc;  // a register-sized copy when head_size is known
#pragma omp simd
    for (std::int64_t d = 0; d < d_len; ++d) out[d] = acc[d] * alpha;
    for (std::int64_t j = 0; j < valid; ++j) {
        const float pj = s[j];
        const float* vr = v + j * d_len;
#pragma omp simd
        for (std::int64_t d = 0; d < d_len; ++d) out[d] += pj * vr[d];
    }
    if (kD) std::memcpy(acc, a, sizeof(float) * d_len);
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

// Converts (bf16) or points at (fp32) the first n keys and values of one page and KV head.
template <typename T>
void load_tile(const T* k_src, const T* v_src, std::int64_t n, std::int64_t d_len,
               bool transpose, Scratch& sc, const float*& k, const float*& v) {
    if constexpr (std::is_same_v<T, float>) {
        k = k_src;
        v = v_src;
    } else {
        load_row(k_src, sc.k.data(), n * d_len);
        load_row(v_src, sc.v.data(), n * d_len);
        k = sc.k.data();
        v = sc.v.data();
    }
    if (transpose) {
        const std::int64_t width = static_cast<std::int64_t>(sc.p.size());
        for (std::int64_t j = 0; j < n; ++j)
            for (std::int64_t d = 0; d < d_len; ++d) sc.k_t[d * width + j] = k[j * d_len + d];
    }
}

template <typename T, int kD>
void attend_item(const AttentionArgs& a, const WorkItem& w, Scratch& sc) {
    const KvCacheView& c = a.cache;
    const std::int64_t d_len = kD ? kD : c.head_size;
    const std::int64_t group = a.num_heads / c.num_kv_heads;
    const std::int64_t m_len = w.rows * group;  // query vectors: m = row * group + head
    const std::int64_t q_start = a.query_start_loc[w.req];
    const std::int64_t q_len = a.query_start_loc[w.req + 1] - q_start;
    const std::int64_t first_pos = a.seq_lens[w.req] - q_len + w.row0;  // position of row 0
    const T* query = static_cast<const T*>(a.query.data);
    for (std::int64_t m = 0; m < m_len; ++m) {
        const std::int64_t tok = q_start + w.row0 + m / group;
        const std::int64_t head = w.kv_head * group + m % group;
        load_row(query + tok * a.query.token_stride + head * a.query.head_stride,
                 sc.q.data() + m * d_len, d_len);
        for (std::int64_t d = 0; d < d_len; ++d) sc.q[m * d_len + d] *= a.scale;
    }
    std::fill(sc.acc.begin(), sc.acc.begin() + m_len * d_len, 0.0f);
    std::fill(sc.row_max.begin(), sc.row_max.end(), -std::numeric_limits<float>::infinity());
    std::fill(sc.row_sum.begin(), sc.row_sum.end(), 0.0f);
    const bool transpose = m_len >= kDotMaxRows;
    const std::int64_t num_keys = first_pos + w.rows;  // the last row's causal horizon
    const T* cache = static_cast<const T*>(c.data);
    for (std::int64_t key0 = 0; key0 < num_keys; key0 += c.page_size) {
        const std::int64_t n = std::min(c.page_size, num_keys - key0);
        const std::int64_t page = a.page_table[w.req * a.page_table_stride + key0 / c.page_size];
        const std::int64_t off = page * c.page_stride() + w.kv_head * c.head_stride();
        if (key0 + c.page_size < num_keys) {  // pages are scattered: hardware prefetch can't guess
            const std::int64_t next = a.page_table[w.req * a.page_table_stride +
                                                   key0 / c.page_size + 1];
            const std::int64_t next_off = next * c.page_stride() + w.kv_head * c.head_stride();
            prefetch_tile(cache + next_off, c.head_stride());
            prefetch_tile(cache + c.kv_stride() + next_off, c.head_stride());
        }
        const float *k = nullptr, *v = nullptr;
        load_tile(cache + off, cache + c.kv_stride() + off, n, d_len, transpose, sc, k, v);
        for (std::int64_t m = 0; m < m_len; ++m) {
            const std::int64_t valid = std::min(n, first_pos + m / group - key0 + 1);
            if (valid <= 0) continue;  // this tile lies wholly in the row's future
            const float* q = sc.q.data() + m * d_len;
            if (transpose) {
                scores_transposed<kD>(q, sc.k_t.data(), n, sc.p.size(), d_len, sc.p.data());
            } else {
                scores_dot<kD>(q, k, valid, d_len, sc.p.data());
            }
            online_softmax_update<kD>(sc.p.data(), valid, v, d_len, sc.row_max[m], sc.row_sum[m],
                                      sc.acc.data() + m * d_len);
        }
    }
    T* out = static_cast<T*>(a.out);
    for (std::int64_t m = 0; m < m_len; ++m) {
        const std::int64_t tok = q_start + w.row0 + m / group;
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
#pragma omp parallel num_threads(num_threads)
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
