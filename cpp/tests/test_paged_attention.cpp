// The CPU paged-attention kernels against a naive double-precision loop, over a few shapes
// (GQA, page boundaries, mixed prefill chunks and decodes, scattered pages), in float32 and in
// bfloat16, with the cache in that dtype or in int8, plus the cache writes and input validation. Exits nonzero if any check failed; also
// run under ASan/UBSan (tests/native/test_cpp_sanitized.py), built with -march=native, so on an
// AVX-512 (BF16) machine the intrinsic paths run there too.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "pagedserve/cpu_features.hpp"
#include "pagedserve/paged_attention.hpp"
#include "pagedserve/rows.hpp"  // Bf16, load_row, store_row

using namespace pagedserve;

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "FAILED: %s\n", what);
        ++failures;
    }
}

struct Case {
    std::int64_t num_kv_heads, group, head_size, page_size;
    std::vector<std::int32_t> q_lens, seq_lens;
    DType dtype = DType::kFloat32;
    std::int64_t sliding_window = 0;  // AttentionArgs' per-call options
    float logit_softcap = 0.0f;
    bool batch_invariant = true;
};

// cache, query and out hold the values as floats (bf16-rounded for a bf16 case, so the naive
// loop sees exactly the kernel's inputs); the *16 vectors are what a bf16 kernel reads/writes.
struct Batch {
    Case c;
    std::int64_t num_pages, max_pages, num_tokens, num_heads;
    std::vector<float> cache, query, out;
    std::vector<std::int32_t> page_table, qsl;
    std::vector<Bf16> cache16, query16, out16;
    std::vector<std::int8_t> cache8;  // non-empty: the kernel reads this int8 cache (to_int8)
    std::vector<Half> cache_half;     // non-empty: the kernel reads this fp16 cache (to_fp16)
    std::vector<std::uint8_t> cache_fp8;  // non-empty: the kernel reads this e4m3 cache (to_fp8)
};

// Rounds v to bf16 in place and returns the bf16 copy.
std::vector<Bf16> to_bf16(std::vector<float>& v) {
    std::vector<Bf16> h(v.size());
    store_row(v.data(), h.data(), static_cast<std::int64_t>(v.size()));
    load_row(h.data(), v.data(), static_cast<std::int64_t>(v.size()));
    return h;
}

// Hands each request a scattered set of pages: a shuffle of twice the pages needed, so ids are
// neither consecutive nor ordered and half the pages belong to no request. Those pages and the
// slots past each request's seq_len hold NaN: a kernel that reads them poisons its output.
void assign_pages(Batch& b, std::mt19937& rng) {
    const Case& c = b.c;
    std::vector<std::int32_t> ids(2 * b.num_pages);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    b.num_pages *= 2;
    b.page_table.assign(c.seq_lens.size() * b.max_pages, 0);
    const KvCacheView v{nullptr, b.num_pages, c.num_kv_heads, c.page_size, c.head_size};
    b.cache.assign(2 * v.kv_stride(), std::nanf(""));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::size_t next = 0;
    for (std::size_t r = 0; r < c.seq_lens.size(); ++r) {
        for (std::int64_t key = 0; key < c.seq_lens[r]; ++key) {
            std::int32_t& page = b.page_table[r * b.max_pages + key / c.page_size];
            if (key % c.page_size == 0) page = ids[next++];
            for (std::int64_t i = 0; i < 2 * c.num_kv_heads; ++i) {  // i = kv * heads + head
                const std::int64_t kv = i / c.num_kv_heads, head = i % c.num_kv_heads;
                float* row = &b.cache[kv * v.kv_stride() + page * v.page_stride() +
                                      head * v.head_stride() + (key % c.page_size) * c.head_size];
                for (std::int64_t d = 0; d < c.head_size; ++d) row[d] = normal(rng);
            }
        }
    }
}

Batch make_batch(const Case& c, std::mt19937& rng) {
    Batch b{c, 0, 0, 0, c.num_kv_heads * c.group, {}, {}, {}, {}, {0}, {}, {}, {}};
    for (std::size_t r = 0; r < c.seq_lens.size(); ++r) {
        const std::int64_t pages = (c.seq_lens[r] + c.page_size - 1) / c.page_size;
        b.max_pages = std::max(b.max_pages, pages);
        b.num_pages += pages;
        b.qsl.push_back(b.qsl.back() + c.q_lens[r]);
    }
    b.num_tokens = b.qsl.back();
    assign_pages(b, rng);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    b.query.resize(b.num_tokens * b.num_heads * c.head_size);
    for (float& x : b.query) x = normal(rng);
    b.out.assign(b.query.size(), 0.0f);
    if (c.dtype == DType::kBFloat16) {
        b.cache16 = to_bf16(b.cache);
        b.query16 = to_bf16(b.query);
        b.out16.assign(b.out.size(), Bf16{0});
    }
    return b;
}

// One row quantized as the int8 layout of paged_attention.hpp says (scale = max|x| / 127,
// round-half-even of x / scale), written to dst (head_size values, then the scale's bytes); x
// becomes the widened values. A NaN row keeps a NaN scale, so a kernel that reads it is poisoned.
void quantize_row(float* x, std::int64_t head_size, std::int8_t* dst) {
    float amax = 0.0f;
    for (std::int64_t d = 0; d < head_size; ++d) amax = std::max(amax, std::fabs(x[d]));
    const float scale = std::isnan(x[0]) ? std::nanf("") : amax / 127.0f;
    for (std::int64_t d = 0; d < head_size; ++d) {
        const float q = std::isnan(x[d]) || scale == 0.0f ? 0.0f : std::nearbyint(x[d] / scale);
        dst[d] = static_cast<std::int8_t>(std::clamp(q, -127.0f, 127.0f));
        x[d] = static_cast<float>(dst[d]) * scale;
    }
    std::memcpy(dst + head_size, &scale, sizeof(scale));
}

// Gives b an int8 cache (b.cache8) and sets b.cache to its widened values: the naive loop then
// sees exactly what the kernel reads.
void to_int8(Batch& b) {
    const std::int64_t d = b.c.head_size, rows = static_cast<std::int64_t>(b.cache.size()) / d;
    b.cache8.assign(rows * (d + kKvScaleBytes), 0);
    for (std::int64_t r = 0; r < rows; ++r)
        quantize_row(&b.cache[r * d], d, &b.cache8[r * (d + kKvScaleBytes)]);
}

// One row in the 8-bit layout with e4m3 values (scale = max|x| / 448, float_to_e4m3 of
// x / scale), written to dst; x becomes the widened values (e4m3_to_float(code) x scale).
void quantize_row_fp8(float* x, std::int64_t head_size, std::uint8_t* dst) {
    float amax = 0.0f;
    for (std::int64_t d = 0; d < head_size; ++d) amax = std::max(amax, std::fabs(x[d]));
    const float scale = amax / 448.0f;
    for (std::int64_t d = 0; d < head_size; ++d) {
        dst[d] = scale > 0.0f ? float_to_e4m3(x[d] / scale) : 0;
        x[d] = e4m3_to_float(dst[d]) * scale;
    }
    std::memcpy(dst + head_size, &scale, sizeof(scale));
}

// Gives b an e4m3 cache (b.cache_fp8) and sets b.cache to its widened values.
void to_fp8(Batch& b) {
    const std::int64_t d = b.c.head_size, rows = static_cast<std::int64_t>(b.cache.size()) / d;
    b.cache_fp8.assign(rows * (d + kKvScaleBytes), 0);
    for (std::int64_t r = 0; r < rows; ++r)
        quantize_row_fp8(&b.cache[r * d], d, &b.cache_fp8[r * (d + kKvScaleBytes)]);
}

// Gives b an fp16 cache (b.cache_half) and sets b.cache to its widened values (NaN stays NaN).
void to_fp16(Batch& b) {
    const std::int64_t n = static_cast<std::int64_t>(b.cache.size());
    b.cache_half.resize(n);
    store_row(b.cache.data(), b.cache_half.data(), n);
    load_row(b.cache_half.data(), b.cache.data(), n);
}

AttentionArgs args_for(Batch& b, float scale) {
    const bool bf16 = b.c.dtype == DType::kBFloat16;
    AttentionArgs a;
    a.dtype = b.c.dtype;
    a.out = bf16 ? static_cast<void*>(b.out16.data()) : b.out.data();
    a.out_token_stride = b.num_heads * b.c.head_size;
    a.out_head_stride = b.c.head_size;
    const void* query = bf16 ? static_cast<const void*>(b.query16.data()) : b.query.data();
    a.query = {query, a.out_token_stride, a.out_head_stride};
    void* cache = bf16 ? static_cast<void*>(b.cache16.data()) : b.cache.data();
    a.cache = {cache, b.num_pages, b.c.num_kv_heads, b.c.page_size, b.c.head_size};
    if (!b.cache8.empty()) a.cache.data = b.cache8.data(), a.cache.quant = KvQuant::kInt8;
    if (!b.cache_half.empty()) a.cache.data = b.cache_half.data(), a.cache.quant = KvQuant::kFp16;
    if (!b.cache_fp8.empty()) a.cache.data = b.cache_fp8.data(), a.cache.quant = KvQuant::kFp8E4m3;
    a.page_table = b.page_table.data();
    a.page_table_stride = b.max_pages;
    a.seq_lens = b.c.seq_lens.data();
    a.query_start_loc = b.qsl.data();
    a.num_reqs = static_cast<std::int64_t>(b.c.seq_lens.size());
    a.num_tokens = b.num_tokens;
    a.num_heads = b.num_heads;
    for (std::size_t r = 0; r < b.c.seq_lens.size(); ++r) {
        a.max_query_len = std::max<std::int64_t>(a.max_query_len, b.c.q_lens[r]);
        a.max_seq_len = std::max<std::int64_t>(a.max_seq_len, b.c.seq_lens[r]);
    }
    a.scale = scale;
    a.sliding_window = b.c.sliding_window, a.logit_softcap = b.c.logit_softcap;
    a.batch_invariant = b.c.batch_invariant;
    return a;
}

// Runs the kernel and widens a bf16 output into b.out.
void run_kernel(Batch& b, float scale, int num_threads) {
    paged_attention_cpu(args_for(b, scale), num_threads);
    if (b.c.dtype == DType::kBFloat16)
        load_row(b.out16.data(), b.out.data(), static_cast<std::int64_t>(b.out.size()));
}

// The largest |naive - kernel| / (atol + rtol * |naive|) over every output element (NaN if the
// kernel wrote one): the case passes when this is at most 1.
double error_ratio(const Batch& b, float scale, double atol, double rtol) {
    const Case& c = b.c;
    const KvCacheView v{nullptr, b.num_pages, c.num_kv_heads, c.page_size, c.head_size};
    double worst = 0.0;
    for (std::size_t r = 0; r < c.seq_lens.size(); ++r) {
        for (std::int64_t i = 0; i < c.q_lens[r]; ++i) {
            const std::int64_t tok = b.qsl[r] + i, pos = c.seq_lens[r] - c.q_lens[r] + i;
            for (std::int64_t h = 0; h < b.num_heads; ++h) {
                const float* q = &b.query[(tok * b.num_heads + h) * c.head_size];
                std::vector<double> s(pos + 1), o(c.head_size, 0.0);
                // A window of w keys: positions pos - w + 1 .. pos (Hugging Face's convention).
                const std::int64_t first =
                    c.sliding_window > 0 ? std::max<std::int64_t>(0, pos - c.sliding_window + 1) : 0;
                double mx = -1e300, sum = 0.0;
                auto at = [&](std::int64_t kv, std::int64_t key) {
                    const std::int64_t page = b.page_table[r * b.max_pages + key / c.page_size];
                    return &b.cache[kv * v.kv_stride() + page * v.page_stride() +
                                    (h / c.group) * v.head_stride() +
                                    (key % c.page_size) * c.head_size];
                };
                for (std::int64_t k = first; k <= pos; ++k) {
                    double dot = 0.0;
                    for (std::int64_t d = 0; d < c.head_size; ++d) dot += q[d] * at(0, k)[d];
                    s[k] = dot * scale;
                    if (c.logit_softcap > 0) s[k] = c.logit_softcap * std::tanh(s[k] / c.logit_softcap);
                    mx = std::max(mx, s[k]);
                }
                for (std::int64_t k = first; k <= pos; ++k) {
                    const double p = std::exp(s[k] - mx);
                    sum += p;
                    for (std::int64_t d = 0; d < c.head_size; ++d) o[d] += p * at(1, k)[d];
                }
                const float* got = &b.out[(tok * b.num_heads + h) * c.head_size];
                for (std::int64_t d = 0; d < c.head_size; ++d) {
                    const double ref = o[d] / sum, err = std::fabs(ref - got[d]);
                    const double ratio = err / (atol + rtol * std::fabs(ref));
                    worst = std::isnan(ratio) ? ratio : std::max(worst, ratio);
                }
            }
        }
    }
    return worst;
}

void check_case(const Case& c, std::mt19937& rng, double atol, double rtol, const char* what,
                KvQuant stored = KvQuant::kNone) {
    Batch b = make_batch(c, rng);
    if (stored == KvQuant::kInt8) to_int8(b);
    if (stored == KvQuant::kFp16) to_fp16(b);
    if (stored == KvQuant::kFp8E4m3) to_fp8(b);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_size));
    run_kernel(b, scale, 2);
    const double err = error_ratio(b, scale, atol, rtol);
    if (!(err <= 1.0)) {
        std::fprintf(stderr, "error %g x tolerance (kv heads %ld, group %ld, head_size %ld)\n",
                     err, static_cast<long>(c.num_kv_heads), static_cast<long>(c.group),
                     static_cast<long>(c.head_size));
    }
    expect(err <= 1.0, what);
}

void test_attention_matches_naive() {
    std::mt19937 rng(7);
    const Case cases[] = {
        {1, 1, 64, 16, {1}, {1}},                     // a single token
        {3, 3, 64, 16, {1, 1, 1}, {17, 33, 1024}},    // decodes, SmolLM2 shape
        {2, 4, 128, 8, {40, 1, 7}, {40, 9, 100}},     // prefill, decode, chunk past boundaries
        {1, 1, 96, 32, {70}, {130}},                   // odd head size (generic path), long chunk
        {4, 1, 64, 16, {0, 3}, {5, 16}},               // an empty request in the batch
    };
    for (const Case& c : cases) check_case(c, rng, 1e-4, 0.0, "matches the naive loop (fp32)");
}

// bf16 inputs, fp32 math, bf16 output: the output's rounding (up to 2^-8 relative) dominates.
void test_attention_matches_naive_bf16() {
    std::mt19937 rng(11);
    const DType bf = DType::kBFloat16;
    const std::vector<std::int32_t> decodes = {1, 1, 1, 1}, contexts = {1, 15, 17, 130};
    const Case cases[] = {
        // Decodes with 3 query heads per KV head (fewer than 8 vectors: values read unwidened).
        {2, 3, 64, 16, decodes, contexts, bf},
        {2, 3, 128, 16, decodes, contexts, bf},
        // 8 query heads per KV head: 8 vectors per item widen bf16 values once per block.
        {1, 8, 64, 16, decodes, contexts, bf},
        {2, 8, 128, 16, decodes, contexts, bf},
        // A 37-token chunk at context 100; group 4 splits it into query blocks of 32 and 5.
        {2, 4, 64, 16, {37}, {100}, bf},
        {1, 3, 128, 16, {37}, {100}, bf},
        // Prefill chunks and decodes in one batch, 32-token pages.
        {2, 3, 128, 32, {37, 1, 5, 1, 1}, {100, 130, 17, 1, 15}, bf},
        // An odd head size takes the portable loops with bf16 storage.
        {1, 2, 96, 16, {1, 9}, {17, 40}, bf},
    };
    for (Case c : cases) {
        check_case(c, rng, 1e-4, 1e-2, "matches the naive loop (bf16)");
        c.batch_invariant = false;  // the decodes' per-key dot scoring
        check_case(c, rng, 1e-4, 1e-2, "fast decode scoring matches the naive loop (bf16)");
    }
}

// Sliding windows (smaller than a page, straddled by a chunk, past the context) and soft-capped
// scores, on both kernel paths (head sizes 64 and 96) and both dtypes.
void test_window_and_softcap_match_naive() {
    std::mt19937 rng(13);
    const std::vector<std::int32_t> q_lens = {1, 1, 37, 20}, seq_lens = {17, 130, 100, 20};
    for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        for (const std::int64_t head_size : {64, 96}) {
            for (const std::int64_t window : {0, 1, 5, 16, 40, 500}) {
                Case c{2, 3, head_size, 16, q_lens, seq_lens, dtype, window, 0.0f};
                c.logit_softcap = window % 2 == 0 ? 0.3f : 0.0f;  // small: the cap binds
                const double rtol = dtype == DType::kBFloat16 ? 1e-2 : 0.0;
                check_case(c, rng, 1e-4, rtol, "window and soft cap match the naive loop");
                c.batch_invariant = false;  // decodes scored by a dot per key
                check_case(c, rng, 1e-4, rtol, "fast decode scoring matches the naive loop");
            }
        }
    }
}

// An int8, fp8 or fp16 cache (fp32 or bf16 queries): the kernels widen its rows to exactly the
// values the naive loop sees (to_int8, to_fp8, to_fp16), so the fp32 and bf16 tolerances hold as
// they are; windows and soft caps too. head_sizes: all three (with and without a vector step),
// or fewer (the emulated run).
void test_stored_cache_matches_naive(KvQuant stored,
                                     const std::vector<std::int64_t>& head_sizes = {64, 128, 96}) {
    std::mt19937 rng(stored == KvQuant::kInt8 ? 17 : stored == KvQuant::kFp16 ? 23 : 29);
    const std::vector<std::int32_t> q_lens = {1, 1, 37, 20, 1}, seq_lens = {17, 130, 100, 20, 1};
    const char* name = stored == KvQuant::kInt8 ? "int8" : stored == KvQuant::kFp16 ? "fp16" : "fp8";
    const std::string exact = std::string(name) + " cache matches the naive loop";
    const std::string fast = std::string(name) + " cache, fast decode scoring";
    for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        for (const std::int64_t head_size : head_sizes) {
            for (const std::int64_t window : {0, 5, 40}) {
                Case c{2, 3, head_size, 16, q_lens, seq_lens, dtype, window, 0.0f};
                c.logit_softcap = window == 5 ? 0.3f : 0.0f;
                const double rtol = dtype == DType::kBFloat16 ? 1e-2 : 0.0;
                check_case(c, rng, 1e-4, rtol, exact.c_str(), stored);
                c.batch_invariant = false;
                check_case(c, rng, 1e-4, rtol, fast.c_str(), stored);
            }
        }
    }
}

// The rows and slots of a cache-write test.
struct CacheShape {
    std::int64_t kv_heads, d, pages, page_size;
    const std::int64_t* slots;
    std::int64_t tokens;
};

// Writes the tokens' rows of k and v (rounded to bf16 in place for a bf16 case) into a cache of
// Stored elements through reshape_and_cache_cpu; returns the cache's view.
template <typename Stored>
KvCacheView write_rows(std::vector<Stored>& cache, KvQuant quant, DType dtype, std::vector<float>& k,
                       std::vector<float>& v, const CacheShape& s) {
    std::vector<Bf16> k16, v16;
    const bool bf16 = dtype == DType::kBFloat16;
    if (bf16) k16 = to_bf16(k), v16 = to_bf16(v);
    CacheWriteArgs a;
    a.key = {bf16 ? static_cast<const void*>(k16.data()) : k.data(), s.kv_heads * s.d, s.d};
    a.value = {bf16 ? static_cast<const void*>(v16.data()) : v.data(), s.kv_heads * s.d, s.d};
    a.cache = {cache.data(), s.pages, s.kv_heads, s.page_size, s.d, quant};
    a.slot_mapping = s.slots, a.num_tokens = s.tokens, a.dtype = dtype;
    reshape_and_cache_cpu(a, 2);
    return a.cache;
}

// The cache write quantizes fp32 and bf16 rows exactly as `quantize` does (quantize_row for
// int8, quantize_row_fp8 for e4m3: the same bytes), an all-zero row to zeros and a zero scale;
// slot -1 writes nothing. d = 60 leaves the write a row that is not whole vectors.
template <typename Stored>
void test_8bit_cache_write(KvQuant quant, void (*quantize)(float*, std::int64_t, Stored*),
                           const std::string& name) {
    const std::int64_t kv_heads = 2, d = quant == KvQuant::kInt8 ? 64 : 60, page_size = 4;
    const std::int64_t pages = 3, tokens = 3, row = d + kKvScaleBytes;
    std::mt19937 rng(quant == KvQuant::kInt8 ? 5 : 31);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> key(tokens * kv_heads * d), value(key.size());
    for (std::size_t i = 0; i < key.size(); ++i) key[i] = normal(rng), value[i] = normal(rng);
    std::fill(key.begin() + kv_heads * d, key.begin() + kv_heads * d + d, 0.0f);  // token 1, head 0
    const std::int64_t slots[tokens] = {9, 2, -1};
    for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        std::vector<float> k = key, v = value;
        std::vector<Stored> cache(2 * pages * kv_heads * page_size * row, Stored{7});
        const CacheShape shape{kv_heads, d, pages, page_size, slots, tokens};
        const KvCacheView view = write_rows(cache, quant, dtype, k, v, shape);
        bool same = true;
        std::vector<Stored> want(2 * row);
        for (std::int64_t t = 0; t < 2; ++t) {
            for (std::int64_t h = 0; h < kv_heads; ++h) {
                const std::int64_t at = (slots[t] / page_size) * view.page_stride() +
                                        h * view.head_stride() + (slots[t] % page_size) * row;
                quantize(&k[(t * kv_heads + h) * d], d, want.data());
                quantize(&v[(t * kv_heads + h) * d], d, want.data() + row);
                same = same && std::memcmp(&cache[at], want.data(), row) == 0 &&
                       std::memcmp(&cache[view.kv_stride() + at], want.data() + row, row) == 0;
            }
        }
        expect(same, ("the " + name + " cache write quantizes as the layout says").c_str());
        float zero_scale = -1.0f;
        std::memcpy(&zero_scale, &cache[2 * row + d], sizeof(float));  // slot 2, head 0
        expect(zero_scale == 0.0f && cache[2 * row] == Stored{0},
               ("an all-zero " + name + " row has scale 0").c_str());
        expect(cache[3 * row] == Stored{7}, ("no slot, no " + name + " write").c_str());
    }
}

// rows.hpp's e4m3 conversions: every code widens to its value and rounds back to itself (the
// NaNs to a NaN), and a float rounds to the nearest e4m3, ties to the even one, saturating at
// +-448 (torch's float8_e4m3fn does the same).
void test_e4m3_conversions() {
    bool round_trips = true;
    for (std::uint32_t b = 0; b < 256u; ++b) {
        const float f = e4m3_to_float(static_cast<std::uint8_t>(b));
        const std::uint8_t back = float_to_e4m3(f);
        round_trips = round_trips && (std::isnan(f) ? (b & 0x7fu) == 0x7fu && back == b : back == b);
    }
    expect(round_trips, "every e4m3 code widens and rounds back to itself");
    expect(e4m3_to_float(0x01) == 0x1p-9f && e4m3_to_float(0x08) == 0x1p-6f &&
               e4m3_to_float(0x38) == 1.0f && e4m3_to_float(0xc0) == -2.0f &&
               e4m3_to_float(0x7e) == 448.0f && e4m3_to_float(0x07) == 7 * 0x1p-9f,
           "e4m3 codes widen to their values");
    std::mt19937 rng(4);
    std::uniform_int_distribution<std::uint32_t> bits(0u, 0x43dfffffu);  // |f| below 448
    bool nearest = true;
    for (int i = 0; i < 200000; ++i) {
        std::uint32_t u = bits(rng) | (i % 2 ? 0x80000000u : 0u);
        float f;
        std::memcpy(&f, &u, sizeof(f));
        const std::uint8_t q = float_to_e4m3(f);
        const double x = std::fabs(static_cast<double>(f)), got = std::fabs(e4m3_to_float(q));
        const std::uint8_t mag = q & 0x7fu;  // neighbours: one step down and up
        const double below = mag ? e4m3_to_float(static_cast<std::uint8_t>(mag - 1)) : -1.0;
        const double above = mag < 0x7eu ? e4m3_to_float(static_cast<std::uint8_t>(mag + 1)) : 1e9;
        const double err = std::fabs(x - got);
        const bool tie = err == std::fabs(x - below) || err == std::fabs(x - above);
        nearest = nearest && err <= std::fabs(x - below) && err <= std::fabs(x - above) &&
                  (!tie || (mag & 1u) == 0) && ((q & 0x80u) != 0) == std::signbit(f);
    }
    expect(nearest, "floats round to the nearest e4m3, ties to even");
    expect(float_to_e4m3(448.0f) == 0x7e && float_to_e4m3(470.0f) == 0x7e &&
               float_to_e4m3(-1e30f) == 0xfe && float_to_e4m3(0x1p-10f) == 0 &&
               float_to_e4m3(3 * 0x1p-10f) == 2 && float_to_e4m3(1.0f + 0x1p-4f) == 0x38 &&
               float_to_e4m3(15 * 0x1p-10f) == 0x08,
           "saturation, subnormal and tie corners of e4m3");
}

// rows.hpp's binary16 conversions: every half widens and rounds back to itself (NaNs to a NaN),
// and a float rounds to the nearest half, ties to the even one, past 65504 to inf at 65520.
void test_half_conversions() {
    bool round_trips = true;
    for (std::uint32_t h = 0; h < 0x10000u; ++h) {
        const float f = half_to_float(static_cast<std::uint16_t>(h));
        const std::uint16_t back = float_to_half(f);
        round_trips = round_trips && (std::isnan(f) ? std::isnan(half_to_float(back)) : back == h);
    }
    expect(round_trips, "every half widens and rounds back to itself");
    expect(half_to_float(0x0001) == 0x1p-24f && half_to_float(0x3c00) == 1.0f &&
               half_to_float(0xc000) == -2.0f && half_to_float(0x7bff) == 65504.0f,
           "halves widen to their values");
    std::mt19937 rng(3);
    std::uniform_int_distribution<std::uint32_t> bits(0u, 0x477fffffu);  // |f| below 65536
    bool nearest = true;
    for (int i = 0; i < 200000; ++i) {
        std::uint32_t u = bits(rng) | (i % 2 ? 0x80000000u : 0u);
        float f;
        std::memcpy(&f, &u, sizeof(f));
        const std::uint16_t h = float_to_half(f);
        const double x = std::fabs(static_cast<double>(f)), got = std::fabs(half_to_float(h));
        if (std::isinf(got)) {
            nearest = nearest && x >= 65520.0;
            continue;
        }
        const std::uint16_t mag = h & 0x7fffu;  // neighbours: one step down and up
        const double below = mag ? half_to_float(static_cast<std::uint16_t>(mag - 1)) : -1.0;
        const double above = mag < 0x7bffu ? half_to_float(static_cast<std::uint16_t>(mag + 1)) : 65520.0;
        const double err = std::fabs(x - got);
        const bool tie = err == std::fabs(x - below) || err == std::fabs(x - above);
        nearest = nearest && err <= std::fabs(x - below) && err <= std::fabs(x - above) &&
                  (!tie || (mag & 1u) == 0) && ((h & 0x8000u) != 0) == std::signbit(f);
    }
    expect(nearest, "floats round to the nearest half, ties to even");
    expect(float_to_half(65519.0f) == 0x7bff && float_to_half(65520.0f) == 0x7c00 &&
               float_to_half(-1e9f) == 0xfc00 && float_to_half(0x1p-25f) == 0 &&
               float_to_half(3 * 0x1p-25f) == 2 && float_to_half(1.0f + 0x1p-11f) == 0x3c00,
           "overflow, subnormal and tie corners");
}

// The cache write rounds fp32 and bf16 rows to fp16 as float_to_half does; slot -1 writes nothing.
void test_fp16_cache_write() {
    const std::int64_t kv_heads = 2, d = 64, page_size = 4, pages = 3, tokens = 3;
    std::mt19937 rng(9);
    std::normal_distribution<float> normal(0.0f, 300.0f);
    std::vector<float> key(tokens * kv_heads * d), value(key.size());
    for (std::size_t i = 0; i < key.size(); ++i) key[i] = normal(rng), value[i] = normal(rng);
    const std::int64_t slots[tokens] = {9, 2, -1};
    for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        std::vector<float> k = key, v = value;
        std::vector<Half> cache(2 * pages * kv_heads * page_size * d, Half{0x7777});
        const CacheShape shape{kv_heads, d, pages, page_size, slots, tokens};
        const KvCacheView view = write_rows(cache, KvQuant::kFp16, dtype, k, v, shape);
        bool same = true;
        for (std::int64_t t = 0; t < 2; ++t) {
            for (std::int64_t h = 0; h < kv_heads; ++h) {
                const std::int64_t at = (slots[t] / page_size) * view.page_stride() +
                                        h * view.head_stride() + (slots[t] % page_size) * d;
                for (std::int64_t i = 0; i < d; ++i) {
                    same = same && cache[at + i].bits == float_to_half(k[(t * kv_heads + h) * d + i]);
                    same = same && cache[view.kv_stride() + at + i].bits ==
                                       float_to_half(v[(t * kv_heads + h) * d + i]);
                }
            }
        }
        expect(same, "the fp16 cache write rounds each value");
        expect(cache[3 * d].bits == 0x7777, "no slot, no write");
    }
}

void test_cache_write_round_trip() {
    const std::int64_t kv_heads = 2, d = 8, page_size = 4, pages = 3, tokens = 3;
    std::vector<float> cache(2 * pages * kv_heads * page_size * d, -1.0f);
    std::vector<float> key(tokens * kv_heads * d), value(key.size());
    for (std::size_t i = 0; i < key.size(); ++i) key[i] = float(i), value[i] = -float(i);
    const std::int64_t slots[tokens] = {9, -1, 0};
    CacheWriteArgs a;
    a.key = {key.data(), kv_heads * d, d};
    a.value = {value.data(), kv_heads * d, d};
    a.cache = {cache.data(), pages, kv_heads, page_size, d};
    a.slot_mapping = slots;
    a.num_tokens = tokens;
    reshape_and_cache_cpu(a, 2);
    // slot 9 = page 2, offset 1; head 1, element 3 of token 0 is key[0 * 16 + 1 * 8 + 3].
    const std::int64_t at = 2 * a.cache.page_stride() + 1 * a.cache.head_stride() + 1 * d + 3;
    expect(cache[at] == key[11], "key lands at page 2, offset 1");
    expect(cache[a.cache.kv_stride() + at] == value[11], "value lands in the V half");
    expect(cache[a.cache.head_stride() + 3] == key[2 * 16 + 8 + 3], "token 2 lands in slot 0");
    expect(cache[1 * d] == -1.0f, "slot -1 writes nothing");
}

void test_bad_inputs_throw() {
    std::mt19937 rng(1);
    Batch b = make_batch({1, 1, 64, 16, {2}, {20}}, rng);
    AttentionArgs a = args_for(b, 1.0f);
    b.page_table[0] = 99;
    bool threw = false;
    try {
        paged_attention_cpu(a, 1);
    } catch (const std::invalid_argument&) {
        threw = true;
    }
    expect(threw, "a page id out of range throws");
    b.page_table[0] = 0;
    b.c.seq_lens[0] = 1;  // shorter than its query
    threw = false;
    try {
        paged_attention_cpu(args_for(b, 1.0f), 1);
    } catch (const std::invalid_argument&) {
        threw = true;
    }
    expect(threw, "seq_len < q_len throws");
}

// The active level's kernels give the portable loops' bits (issue 24: fp32 and widened bf16
// caches alike; dispatch.cpp): prefill chunks and decodes, GQA, windows, soft caps, head sizes
// with and without a vector step (64, 128; 96), 1 and 2 threads.
void test_level_equals_portable() {
    const CpuIsa level = cpu_isa();
    const std::vector<std::int32_t> q_lens = {1, 1, 37, 20, 1}, seq_lens = {17, 130, 100, 20, 1};
    int cases = 0;
    for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        for (const std::int64_t head_size : {64, 128, 96}) {
            for (const std::int64_t window : {0, 5, 40}) {
                for (const std::int64_t group : {1, 3}) {
                  for (const bool int8 : {false, true}) {  // the cache in the dtype, or int8
                    Case c{2, group, head_size, 16, q_lens, seq_lens, dtype, window, 0.0f};
                    c.logit_softcap = window == 5 ? 0.0f : 0.3f * (1 + window);
                    std::mt19937 rng(static_cast<unsigned>(29 + cases));
                    Batch want = make_batch(c, rng);
                    if (int8) to_int8(want);
                    Batch got = want;
                    const float scale = 1.0f / std::sqrt(static_cast<float>(head_size));
                    set_cpu_isa(CpuIsa::kPortable);
                    run_kernel(want, scale, 1 + cases % 2);
                    set_cpu_isa(level);
                    run_kernel(got, scale, 2 - cases % 2);
                    const bool same = std::memcmp(want.out.data(), got.out.data(),
                                                  sizeof(float) * want.out.size()) == 0;
                    if (!same)
                        std::fprintf(stderr, "%s differs from portable: dtype %d head_size %ld "
                                     "window %ld group %ld int8 %d\n", paged_attention_cpu_path(),
                                     static_cast<int>(dtype), static_cast<long>(head_size),
                                     static_cast<long>(window), static_cast<long>(group),
                                     static_cast<int>(int8));
                    expect(same, "the level's kernels give the portable bits");
                    ++cases;
                  }
                }
            }
        }
    }
}

}  // namespace

// f(), its wall time on stderr (where the run's time goes, under sanitizers or emulation).
template <typename F>
void timed(const char* name, F f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    std::fprintf(stderr, "    %s %.2f s\n", name, took.count());
}

// The part of the run a level belongs to: ctest runs the parts side by side (-j), each under its
// own timeout (the sanitized build's longest test; on an AVX-512 CPU the vector levels alone
// took over its 300 s under load when they were one part).
const char* part_of(CpuIsa level) {
    if (level == CpuIsa::kPortable) return "portable";
    return level == CpuIsa::kAvx512 ? "avx512" : "vector";
}

// Under an emulated CPU (tests/native/test_cpp_x86_64_qemu.py: qemu's TCG runs this test ~150x
// slower than a native run on some hosts) the CPU's best vector level alone, each cache kind
// once against the naive loop: what proves the build runs there; the native runs keep the rest.
int run_emulated_part() {
    const CpuIsa best = cpu_isa_supported();
    set_cpu_isa(best);
    std::printf("  %s kernels\n", paged_attention_cpu_path());
    timed("matches_naive", test_attention_matches_naive);
    timed("matches_naive_bf16", test_attention_matches_naive_bf16);
    for (const KvQuant stored : {KvQuant::kInt8, KvQuant::kFp16, KvQuant::kFp8E4m3})
        timed("stored_cache", [&] { test_stored_cache_matches_naive(stored, {64}); });
    if (failures == 0) std::puts("test_paged_attention: ok");
    return failures == 0 ? 0 : 1;
}

// Every test at every ISA level this CPU runs: each level has its own copy of the kernels
// (avx2_vnni runs avx2's, neon_dotprod neon's: not run twice here). One argument runs one part
// (part_of): `portable`, `vector` (avx2 or neon) or `avx512`; none runs them all; `emulated`
// runs run_emulated_part.
int main(int argc, char** argv) {
    const std::string part = argc > 1 ? argv[1] : "";
    if (part == "emulated") return run_emulated_part();
    if (!(part.empty() || part == "portable" || part == "vector" || part == "avx512")) {
        std::fprintf(stderr, "usage: test_paged_attention [portable|vector|avx512|emulated]\n");
        return 2;
    }
    const CpuIsa best = cpu_isa_supported();
    for (CpuIsa level : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kNeon}) {
        if (!cpu_isa_covers(best, level)) continue;
        if (!part.empty() && part != part_of(level)) continue;
        set_cpu_isa(level);
        std::printf("  %s kernels\n", paged_attention_cpu_path());
        // Each level its own copy: one that fell back to the portable loops would pass the rest.
        expect((level == CpuIsa::kPortable) == (std::strcmp(paged_attention_cpu_path(), "portable") == 0),
               "a vector level runs its own kernels");
        if (level == CpuIsa::kNeon)
            expect(std::strcmp(paged_attention_cpu_path(), "neon") == 0, "neon runs the NEON copy");
        timed("matches_naive", test_attention_matches_naive);
        timed("matches_naive_bf16", test_attention_matches_naive_bf16);
        timed("window_and_softcap", test_window_and_softcap_match_naive);
        timed("cache_write_round_trip", test_cache_write_round_trip);
        timed("int8_cache", [] { test_stored_cache_matches_naive(KvQuant::kInt8); });
        timed("int8_write", [] {
            test_8bit_cache_write<std::int8_t>(KvQuant::kInt8, quantize_row, "int8");
        });
        timed("fp16_cache", [] { test_stored_cache_matches_naive(KvQuant::kFp16); });
        timed("fp16_write", test_fp16_cache_write);
        timed("fp8_cache", [] { test_stored_cache_matches_naive(KvQuant::kFp8E4m3); });
        timed("fp8_write", [] {
            test_8bit_cache_write<std::uint8_t>(KvQuant::kFp8E4m3, quantize_row_fp8, "fp8");
        });
        timed("bad_inputs", test_bad_inputs_throw);
        if (level != CpuIsa::kPortable) timed("level_equals_portable", test_level_equals_portable);
    }
    test_half_conversions();
    test_e4m3_conversions();
#if defined(__aarch64__)
    expect(cpu_isa_covers(best, CpuIsa::kNeon), "every aarch64 CPU runs the neon kernels");
#endif
    set_cpu_isa(best);
    if (failures == 0) std::puts("test_paged_attention: ok");
    return failures == 0 ? 0 : 1;
}
