// The paged-attention kernel API, shared by the CPU kernels (src/paged_attention_cpu.cpp) and the
// CUDA kernels (cuda/*.cu). Pointers, sizes and strides only: no torch anywhere.
//
// KV page layout (the one definition on the C++ side; mirrored in
// pagedserve/core/attention/base.py as KV_CACHE_DIMS, and a test checks that both agree):
//
//     kv_cache: [2, num_pages, num_kv_heads, page_size, row_size], contiguous (0 = K, 1 = V)
//
// row_size is head_size in the activations' dtype (KvQuant::kNone). An 8-bit cache
// (--kv-cache-dtype int8) stores each token's row of one KV head as head_size int8 values
// followed by their float32 scale (native byte order), so row_size = head_size + 4 bytes:
// x ~= q * scale, scale = max|x| / 127 over the row (0 for an all-zero row), q = round-to-even
// of x / scale, in [-127, 127]. Quantized as the rows are written (reshape_and_cache), widened
// back to fp32 as the kernels load them. An fp8 cache (--kv-cache-dtype fp8_e4m3,
// KvQuant::kFp8E4m3) has the same 8-bit layout with e4m3 values (rows.hpp): scale = max|x| /
// 448, values round-to-even(x / scale) as e4m3, saturating at +-448. An fp16 cache under fp32
// or bf16 activations
// (--kv-cache-dtype fp16, KvQuant::kFp16; CPU only) stores IEEE binary16 values, row_size =
// head_size: rounded to nearest even as written, widened exactly as loaded.
//
// Token slot s lives in page s / page_size at offset s % page_size; slot -1 means "skip".
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

// Helpers the CUDA kernels call on device too.
#if defined(__CUDACC__)
#define PAGEDSERVE_HOST_DEVICE __host__ __device__
#else
#define PAGEDSERVE_HOST_DEVICE
#endif

namespace pagedserve {

inline constexpr std::array<const char*, 5> kKvCacheDims = {
    "kv", "num_pages", "num_kv_heads", "page_size", "row_size"};

// Storage dtype of every tensor an op touches (query, key, value, out and kv_cache share it,
// unless the cache is quantized: KvCacheView::quant).
enum class DType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

inline std::size_t dtype_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// How the KV cache stores keys and values: in the activations' dtype, as int8 or e4m3 rows with
// a float32 scale per token and KV head, or as fp16 values (the layout above).
enum class KvQuant : int { kNone = 0, kInt8 = 1, kFp16 = 2, kFp8E4m3 = 3 };

// An 8-bit cache: head_size one-byte values and their scale per row.
PAGEDSERVE_HOST_DEVICE inline bool is_8bit(KvQuant quant) {
    return quant == KvQuant::kInt8 || quant == KvQuant::kFp8E4m3;
}

// Bytes of the scale after each 8-bit row.
inline constexpr std::int64_t kKvScaleBytes = 4;

struct KvCacheView {
    void* data = nullptr;
    std::int64_t num_pages = 0;
    std::int64_t num_kv_heads = 0;
    std::int64_t page_size = 0;
    std::int64_t head_size = 0;
    KvQuant quant = KvQuant::kNone;

    // Storage elements per token row: head_size, or head_size 8-bit values + their scale's bytes.
    // (Elements are the cache's own: 2 bytes for an fp16 cache, whatever the activations.)
    PAGEDSERVE_HOST_DEVICE std::int64_t row_size() const {
        return is_8bit(quant) ? head_size + kKvScaleBytes : head_size;
    }
    // Element offsets into the contiguous layout above (bytes for an 8-bit cache).
    PAGEDSERVE_HOST_DEVICE std::int64_t page_stride() const {
        return num_kv_heads * page_size * row_size();
    }
    PAGEDSERVE_HOST_DEVICE std::int64_t head_stride() const { return page_size * row_size(); }
    PAGEDSERVE_HOST_DEVICE std::int64_t kv_stride() const { return num_pages * page_stride(); }
};

// A [rows, heads, head_size] activation whose last dimension is contiguous; the two outer
// strides (in elements) are free, so views of a fused qkv projection need no copy.
struct TokenTensor {
    const void* data = nullptr;
    std::int64_t token_stride = 0;
    std::int64_t head_stride = 0;
};

struct CacheWriteArgs {
    TokenTensor key;    // [num_tokens, num_kv_heads, head_size]
    TokenTensor value;  // [num_tokens, num_kv_heads, head_size]
    KvCacheView cache;
    const std::int64_t* slot_mapping = nullptr;  // [num_tokens]
    std::int64_t num_tokens = 0;
    DType dtype = DType::kFloat32;
};

struct AttentionArgs {
    void* out = nullptr;  // [num_tokens, num_heads, head_size], strides as in out_*
    std::int64_t out_token_stride = 0;
    std::int64_t out_head_stride = 0;
    TokenTensor query;  // [num_tokens, num_heads, head_size]
    KvCacheView cache;
    const std::int32_t* page_table = nullptr;  // [num_reqs, page_table_stride]
    std::int64_t page_table_stride = 0;        // max pages per request
    const std::int32_t* seq_lens = nullptr;    // [num_reqs]
    const std::int32_t* query_start_loc = nullptr;  // [num_reqs + 1]
    std::int64_t num_reqs = 0;
    std::int64_t num_tokens = 0;
    std::int64_t num_heads = 0;
    std::int64_t max_query_len = 0;
    std::int64_t max_seq_len = 0;
    float scale = 1.0f;
    DType dtype = DType::kFloat32;
    // Per-call (per-layer) options, Hugging Face's conventions; 0 turns either off.
    // sliding_window > 0: the query at position i sees key j iff j <= i and i - j < window.
    std::int64_t sliding_window = 0;
    // logit_softcap > 0: scores = softcap * tanh(scores / softcap) after the scale (Gemma 2).
    float logit_softcap = 0.0f;
    // true: each query vector's arithmetic is fixed by its own position and keys alone, so its
    // output is bit-identical in a decode step and in any prefill chunk, next to any batch
    // (issue 16). false lets the CPU kernel score a decode step's few query vectors with a dot
    // per key summed by a lane tree (faster; rounds differently from the prefill path). CUDA
    // ignores it (its decode splits long contexts either way).
    bool batch_invariant = true;
};

// CPU kernels (OpenMP with num_threads threads). Both validate the integer inputs (slots, page
// ids, lengths) before touching memory and throw std::invalid_argument on bad ones.
void reshape_and_cache_cpu(const CacheWriteArgs& args, int num_threads);
void paged_attention_cpu(const AttentionArgs& args, int num_threads);

// The kernels paged_attention_cpu runs at the active ISA level (cpu_features.hpp): "portable",
// "avx2", "avx512" or "avx512_bf16".
const char* paged_attention_cpu_path();

// CUDA kernels, enqueued on `stream` (a cudaStream_t); pointers are device pointers. The
// workspace holds num_tokens * num_heads * max_splits * (head_size + 2) floats for split-context
// decode; max_splits = 1 needs none. No host-side validation of device data is possible.
void reshape_and_cache_cuda(const CacheWriteArgs& args, void* stream);
void paged_attention_cuda(const AttentionArgs& args, float* workspace, int max_splits,
                          void* stream);

// Keys per split of one decode request on CUDA (flash-decoding); the caller sizes the workspace.
inline constexpr int kCudaDecodeSplitLen = 512;

}  // namespace pagedserve
