// CPU paged attention: OpenMP over (request, KV head, query block) work items, one pass over the
// request's pages per item with a streaming (online) softmax in fp32. All query heads of a GQA
// group share an item, so each K/V page tile is loaded once per group.
// The kernels (kernels.hpp) are compiled once per ISA level (a file per level, levels.hpp) and
// chosen at run time by cpu_isa() (cpu_features.hpp): at avx512 and up, with a head size that is
// a multiple of 32, items run the intrinsic kernels of avx512.hpp and avx512_item.hpp (with
// vdpbf16ps at avx512_bf16); everywhere else the portable loops serve: plain loops over head_size or a
// 16-key chunk that the compiler vectorizes (`omp simd`) for AVX2, or leaves to SSE2 at the
// portable level, with the score, softmax and value steps of head sizes 64 and 128 on AVX2
// (avx2.hpp) or, on aarch64 from level neon, NEON registers (neon.hpp). All keep fp32 scores,
// softmax and accumulators, and all but vdpbf16ps give the portable loops' bits.
//
// Batch invariance (issue 16): a query vector's arithmetic depends only on its own position and
// keys, never on how many vectors share its work item, where its prefill chunk starts, the other
// requests of the call or the thread count. Keys are always scored transposed (each score summed
// over head_size in order), key blocks start at multiples of block_keys from position 0, a
// block's keys past a vector's horizon get weight exactly 0, and items never split a context.
//
// Per-call options (AttentionArgs): sliding_window masks keys older than position - window + 1
// (blocks wholly before every vector's window are skipped, the others masked per vector) and
// logit_softcap caps the scaled scores with softcap * tanh(s / softcap) before the softmax.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attention/levels.hpp"
#include "cpu/arch.hpp"
#include "pagedserve/cpu_features.hpp"
#include "pagedserve/paged_attention.hpp"
#include "pagedserve/rows.hpp"  // Bf16, load_row

namespace pagedserve {
namespace {

void check(bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument(message);
}

void check_quant(const KvCacheView& c) {
    check(c.quant == KvQuant::kNone || c.quant == KvQuant::kInt8 || c.quant == KvQuant::kFp16 ||
              c.quant == KvQuant::kFp8E4m3,
          "unknown KV cache quantization");
}

void validate(const AttentionArgs& a) {
    check_quant(a.cache);
    check(a.num_heads % a.cache.num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
    check(a.query_start_loc[0] == 0, "query_start_loc[0] must be 0");
    check(a.sliding_window >= 0, "sliding_window must be >= 0");
    check(std::isfinite(a.logit_softcap) && a.logit_softcap >= 0.0f,
          "logit_softcap must be finite and >= 0");
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

}  // namespace

void paged_attention_cpu(const AttentionArgs& args, int num_threads) {
    validate(args);
    if (args.num_tokens == 0) return;
    num_threads = std::max(1, num_threads);
#if PAGEDSERVE_X86  // the x86 levels' copies exist only there
    switch (cpu_isa()) {
        case CpuIsa::kPortable: return attention_portable::attention(args, num_threads);
        case CpuIsa::kAvx2:
        case CpuIsa::kAvx2Vnni: return attention_avx2::attention(args, num_threads);
        case CpuIsa::kAvx512: return attention_avx512::attention(args, num_threads);
        default: return attention_avx512_bf16::attention(args, num_threads);
    }
#elif PAGEDSERVE_AARCH64  // every neon level: one copy (no int8 products in fp32 attention)
    if (cpu_isa_at_least(CpuIsa::kNeon)) return attention_neon::attention(args, num_threads);
    attention_portable::attention(args, num_threads);
#else
    attention_portable::attention(args, num_threads);
#endif
}

const char* paged_attention_cpu_path() {
    if (cpu_isa_at_least(CpuIsa::kNeon)) return "neon";
    switch (cpu_isa()) {
        case CpuIsa::kPortable: return "portable";
        case CpuIsa::kAvx2:
        case CpuIsa::kAvx2Vnni: return "avx2";
        case CpuIsa::kAvx512: return "avx512";
        default: return "avx512_bf16";
    }
}

namespace {

// One row into fp32 scratch; returns its largest magnitude (what an 8-bit row's scale maps to
// its largest code).
template <typename T>
float load_amax(const T* src, float* row, std::int64_t head_size) {
    load_row(src, row, head_size);
    float amax = 0.0f;
    for (std::int64_t d = 0; d < head_size; ++d) amax = std::max(amax, std::fabs(row[d]));
    return amax;
}

// One token's row of one KV head into the 8-bit layout (paged_attention.hpp): scale = max|x| /
// 127, values round-to-even(x / scale), then the scale's bytes. `row` is head_size floats of
// scratch. pagedserve/core/attention/reference.py quantizes the same way, to the bit.
template <typename T>
void quantize_row(const T* src, std::int8_t* dst, std::int64_t head_size, float* row) {
    const float scale = load_amax(src, row, head_size) / 127.0f;
    for (std::int64_t d = 0; d < head_size; ++d) {
        const float q = scale > 0.0f ? std::nearbyint(row[d] / scale) : 0.0f;
        dst[d] = static_cast<std::int8_t>(std::clamp(q, -127.0f, 127.0f));
    }
    std::memcpy(dst + head_size, &scale, sizeof(scale));
}

// One token's row of one KV head into the 8-bit layout with e4m3 values: scale = max|x| / 448,
// values float_to_e4m3(x / scale) (round to nearest even), then the scale's bytes.
// reference.py quantizes the same way (torch's float8_e4m3fn), to the bit.
template <typename T>
void quantize_row_e4m3(const T* src, std::uint8_t* dst, std::int64_t head_size, float* row) {
    const float scale = load_amax(src, row, head_size) / 448.0f;
    for (std::int64_t d = 0; d < head_size; ++d)
        dst[d] = scale > 0.0f ? float_to_e4m3(row[d] / scale) : 0;
    std::memcpy(dst + head_size, &scale, sizeof(scale));
}

// One token's row of one KV head into an fp16 cache: rounded to nearest even (reference.py's
// rows.to(torch.float16), to the bit).
template <typename T>
void half_row(const T* src, Half* dst, std::int64_t head_size, float* row) {
    load_row(src, row, head_size);
    store_row(row, dst, head_size);
}

// One row into a cache of Stored elements: quantize_row (int8), quantize_row_e4m3 (fp8, as
// bytes) or half_row (fp16).
template <typename Stored, typename T>
void store_converted(const T* src, Stored* dst, std::int64_t head_size, float* row) {
    if constexpr (std::is_same_v<Stored, Half>) {
        half_row(src, dst, head_size, row);
    } else if constexpr (std::is_same_v<Stored, std::uint8_t>) {
        quantize_row_e4m3(src, dst, head_size, row);
    } else {
        quantize_row(src, dst, head_size, row);
    }
}

// Every token's K and V rows of every KV head, T rows, into a cache of Stored elements.
template <typename Stored, typename T>
void write_converted(const CacheWriteArgs& args, int threads) {
    const KvCacheView& c = args.cache;
    auto* cache = static_cast<Stored*>(c.data);
    const auto* key = static_cast<const T*>(args.key.data);
    const auto* value = static_cast<const T*>(args.value.data);
#pragma omp parallel num_threads(threads)
    {
        std::vector<float> row(c.head_size);
#pragma omp for schedule(static)
        for (std::int64_t t = 0; t < args.num_tokens; ++t) {
            const std::int64_t slot = args.slot_mapping[t];
            if (slot < 0) continue;
            const std::int64_t base = (slot / c.page_size) * c.page_stride() +
                                      (slot % c.page_size) * c.row_size();
            for (std::int64_t h = 0; h < c.num_kv_heads; ++h) {
                Stored* dst = cache + base + h * c.head_stride();
                store_converted(key + t * args.key.token_stride + h * args.key.head_stride, dst,
                                c.head_size, row.data());
                store_converted(value + t * args.value.token_stride + h * args.value.head_stride,
                                dst + c.kv_stride(), c.head_size, row.data());
            }
        }
    }
}

// The cache write of an int8, fp8 or fp16 cache (`what`), from float32 or bfloat16 rows.
template <typename Stored>
void write_converted(const CacheWriteArgs& args, int threads, const char* what) {
    switch (args.dtype) {
        case DType::kFloat32: return write_converted<Stored, float>(args, threads);
        case DType::kBFloat16: return write_converted<Stored, Bf16>(args, threads);
        default:
            throw std::invalid_argument(std::string(what) + " KV caches take float32 or bfloat16 rows");
    }
}

}  // namespace

void reshape_and_cache_cpu(const CacheWriteArgs& args, int num_threads) {
    const KvCacheView& c = args.cache;
    check_quant(c);
    const std::int64_t num_slots = c.num_pages * c.page_size;
    for (std::int64_t t = 0; t < args.num_tokens; ++t) {
        const std::int64_t slot = args.slot_mapping[t];
        check(slot >= -1 && slot < num_slots, "slot_mapping holds a slot out of range");
    }
    // Parallel only when there is enough to copy; a decode step writes a handful of rows.
    const int threads = args.num_tokens >= 256 ? std::max(1, num_threads) : 1;
    if (c.quant == KvQuant::kInt8) return write_converted<std::int8_t>(args, threads, "int8");
    if (c.quant == KvQuant::kFp16) return write_converted<Half>(args, threads, "fp16");
    if (c.quant == KvQuant::kFp8E4m3) return write_converted<std::uint8_t>(args, threads, "fp8_e4m3");
    const std::size_t elt = dtype_size(args.dtype);
    const std::size_t row_bytes = c.head_size * elt;
    auto* cache = static_cast<char*>(c.data);
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
