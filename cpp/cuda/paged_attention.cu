// CUDA paged attention: the cache write, a split-context decode (flash-decoding: each block
// takes one query row, one head and up to kCudaDecodeSplitLen keys, a second kernel merges the
// splits), and a tiled causal prefill over paged K/V. fp32 accumulation for fp32/bf16/fp16
// storage (K/V tiles through 16-byte loads) and for 8-bit pages (int8 or fp8 e4m3 codes with a
// float32 scale per row, paged_attention.hpp's layout: 4-byte loads, widened with the row's
// scale as the CPU kernels widen them). Same API as the CPU kernels, the per-call
// sliding_window (keys before position - window + 1 are skipped or masked) and logit_softcap
// (softcap * tanh(s / softcap) on the scaled scores) included.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "pagedserve/paged_attention.hpp"

namespace pagedserve {
namespace {

constexpr int kThreads = 128;  // 4 warps per block in every kernel
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ int64_t cmin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t cmax(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
    return __float2bfloat16(x);
}
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

// Loads 16 bytes (kVec elements) of T and widens them to fp32.
template <typename T>
struct Vec {
    static constexpr int kSize = 16 / sizeof(T);
    float x[kSize];
    __device__ __forceinline__ void load(const T* p) {
        const uint4 raw = *reinterpret_cast<const uint4*>(p);
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < kSize; ++i) x[i] = to_f(e[i]);
    }
};

// The 8-bit pages' codes (the storage type of a KvQuant::kInt8 / kFp8E4m3 cache).
struct E4m3 {
    std::uint8_t bits;
};

// e4m3 -> float, exactly (rows.hpp's e4m3_to_float): the code's bits moved into an fp16 that is
// 2^-8 its value (sign to bit 15, the other seven to bits 13..7; 0x7f / 0xff: NaN).
__device__ __forceinline__ float e4m3_to_f(std::uint32_t code) {
    const std::uint32_t magnitude = code & 0x7fu;
    std::uint16_t h = static_cast<std::uint16_t>(((code & 0x80u) << 8) | (magnitude << 7));
    if (magnitude == 0x7fu) h |= 0x7e00u;
    return __half2float(__ushort_as_half(h)) * 256.0f;
}

// A key or value row's kSize consecutive values from d0 on, widened to fp32: 16-byte loads of
// an unquantized row; 4-byte loads of an 8-bit row's codes (its rows are head_size + 4 bytes
// apart, so 4-byte aligned), each times the row's scale (after its head_size codes).
template <typename S>
struct RowLoad {
    static constexpr int kSize = Vec<S>::kSize;
    __device__ __forceinline__ static void load(const S* row, int d0, int, float* x) {
        Vec<S> v;
        v.load(row + d0);
#pragma unroll
        for (int i = 0; i < kSize; ++i) x[i] = v.x[i];
    }
};
template <typename S>
struct RowLoad8 {
    static constexpr int kSize = 8;
    __device__ __forceinline__ static void load(const S* row, int d0, int head_size, float* x) {
        const float scale = *reinterpret_cast<const float*>(row + head_size);
        const auto* words = reinterpret_cast<const std::uint32_t*>(row + d0);
#pragma unroll
        for (int w = 0; w < 2; ++w) {
            const std::uint32_t word = words[w];
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const std::uint32_t code = (word >> (8 * b)) & 0xffu;
                const float f = std::is_same_v<S, E4m3> ? e4m3_to_f(code)
                                                        : float(static_cast<std::int8_t>(code));
                x[4 * w + b] = __fmul_rn(f, scale);  // as the CPU's one multiply
            }
        }
    }
};
template <>
struct RowLoad<std::int8_t> : RowLoad8<std::int8_t> {};
template <>
struct RowLoad<E4m3> : RowLoad8<E4m3> {};

__device__ __forceinline__ float warp_max(float v, int width = 32) {
    for (int o = width / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v, int width = 32) {
    for (int o = width / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide reduction (max or sum) through shared scratch of kWarps floats.
template <bool kMax>
__device__ float block_reduce(float v, float* scratch) {
    v = kMax ? warp_max(v) : warp_sum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // scratch may still be read from a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[0];
    for (int w = 1; w < kWarps; ++w) v = kMax ? fmaxf(v, scratch[w]) : v + scratch[w];
    return v;
}

// The first key position the query at `pos` sees (its sliding window's start, or 0).
__device__ __forceinline__ int64_t window_start(const AttentionArgs& a, int64_t pos) {
    return a.sliding_window > 0 ? cmax(0, pos - a.sliding_window + 1) : 0;
}

// A scaled score after the optional soft cap.
__device__ __forceinline__ float soft_cap(const AttentionArgs& a, float s) {
    return a.logit_softcap > 0.0f ? a.logit_softcap * tanhf(s / a.logit_softcap) : s;
}

// The request owning query row `tok`: the last r with query_start_loc[r] <= tok.
__device__ int find_request(const int32_t* qsl, int num_reqs, int64_t tok) {
    int lo = 0, hi = num_reqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (qsl[mid] <= tok) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Element offset of key `pos` of KV head `kv_head` in the K half (add kv_stride for V).
__device__ __forceinline__ int64_t key_offset(const AttentionArgs& a, int r, int64_t pos,
                                              int kv_head) {
    const KvCacheView& c = a.cache;
    const int64_t page = a.page_table[r * a.page_table_stride + pos / c.page_size];
    return page * c.page_stride() + kv_head * c.head_stride() + (pos % c.page_size) * c.row_size();
}

// ---- cache write --------------------------------------------------------------------------
template <typename U>  // copy unit: uint4 when every row is 16-byte aligned, else the element
__global__ void cache_write_kernel(CacheWriteArgs a, int64_t elt) {
    const int64_t t = blockIdx.x;
    const int64_t slot = a.slot_mapping[t];
    if (slot < 0) return;
    const KvCacheView& c = a.cache;
    const int64_t units = c.head_size * elt / sizeof(U);
    const int64_t base = (slot / c.page_size) * c.page_stride() + (slot % c.page_size) * c.head_size;
    for (int64_t i = threadIdx.x; i < c.num_kv_heads * units; i += blockDim.x) {
        const int64_t h = i / units, u = i % units;
        const int64_t dst = (base + h * c.head_stride()) * elt / sizeof(U) + u;
        const auto* k = reinterpret_cast<const U*>(static_cast<const char*>(a.key.data) +
                                                   (t * a.key.token_stride + h * a.key.head_stride) * elt);
        const auto* v = reinterpret_cast<const U*>(static_cast<const char*>(a.value.data) +
                                                   (t * a.value.token_stride + h * a.value.head_stride) * elt);
        static_cast<U*>(c.data)[dst] = k[u];
        static_cast<U*>(c.data)[c.kv_stride() * elt / sizeof(U) + dst] = v[u];
    }
}

// The 8-bit cache write: one warp per (token, K or V, KV head) row: max |x| over the row, scale
// = max / 127 (int8) or / 448 (e4m3), then each value's code and the scale, as the CPU write and
// reference.quantize_rows do (correctly rounded division; int8 rounds half to even; e4m3 rounds
// to nearest even, saturating at 448).
template <typename T, typename S>
__global__ void cache_write_8bit_kernel(CacheWriteArgs a) {
    const int64_t t = blockIdx.x;
    const int64_t slot = a.slot_mapping[t];
    if (slot < 0) return;
    const KvCacheView& c = a.cache;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t base = (slot / c.page_size) * c.page_stride() + (slot % c.page_size) * c.row_size();
    for (int row = warp; row < 2 * c.num_kv_heads; row += kWarps) {
        const int h = row / 2, is_v = row % 2;
        const TokenTensor& src = is_v ? a.value : a.key;
        const T* x = static_cast<const T*>(src.data) + t * src.token_stride + h * src.head_stride;
        float amax = 0.0f;
        for (int64_t d = lane; d < c.head_size; d += 32) amax = fmaxf(amax, fabsf(to_f(x[d])));
        amax = warp_max(amax);
        const float scale = __fdiv_rn(amax, std::is_same_v<S, E4m3> ? 448.0f : 127.0f);
        auto* dst = static_cast<std::uint8_t*>(c.data) + is_v * c.kv_stride() + base + h * c.head_stride();
        for (int64_t d = lane; d < c.head_size; d += 32) {
            const float q = scale > 0.0f ? __fdiv_rn(to_f(x[d]), scale) : 0.0f;
            if constexpr (std::is_same_v<S, E4m3>) {
                dst[d] = static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
            } else {
                dst[d] = static_cast<std::uint8_t>(static_cast<std::int8_t>(fminf(fmaxf(rintf(q), -127.0f), 127.0f)));
            }
        }
        if (lane == 0) *reinterpret_cast<float*>(dst + c.head_size) = scale;
    }
}

// ---- decode: one (row, head, split) per block ----------------------------------------------
// T: the activations' dtype; S: the cache's storage (T, or int8_t / E4m3 codes).
template <typename T, typename S, int kD>
__global__ void decode_kernel(AttentionArgs a, float* workspace, int num_splits) {
    constexpr int kVec = RowLoad<S>::kSize, kGroupLanes = kD / kVec, kKeysPerWarp = 32 / kGroupLanes;
    constexpr int kRowsPerPass = kThreads / kGroupLanes;  // key rows summed at once in P.V
    __shared__ float q_s[kD];
    __shared__ float s_s[kCudaDecodeSplitLen];
    __shared__ float red[kRowsPerPass][kD];
    __shared__ float scratch[kWarps];
    const int64_t tok = blockIdx.x / a.num_heads;
    const int head = blockIdx.x % a.num_heads, split = blockIdx.y;
    const int kv_head = head / (a.num_heads / a.cache.num_kv_heads);
    const int r = find_request(a.query_start_loc, a.num_reqs, tok);
    const int64_t q_len = a.query_start_loc[r + 1] - a.query_start_loc[r];
    const int64_t num_keys = a.seq_lens[r] - q_len + (tok - a.query_start_loc[r]) + 1;
    // This split's keys: its share of [0, num_keys), less those before the window.
    const int64_t split0 = int64_t(split) * kCudaDecodeSplitLen;
    const int64_t begin = cmax(split0, window_start(a, num_keys - 1));
    const int n = int(cmax(0, cmin(split0 + kCudaDecodeSplitLen, num_keys) - begin));
    const T* q = static_cast<const T*>(a.query.data) + tok * a.query.token_stride +
                 head * a.query.head_stride;
    for (int d = threadIdx.x; d < kD; d += kThreads) q_s[d] = to_f(q[d]) * a.scale;
    __syncthreads();
    const S* cache = static_cast<const S*>(a.cache.data);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int sub = lane % kGroupLanes, d0 = sub * kVec;
    for (int j0 = warp * kKeysPerWarp; j0 < n; j0 += kWarps * kKeysPerWarp) {
        const int j = j0 + lane / kGroupLanes;
        float dot = 0.0f;
        if (j < n) {
            float k[kVec];
            RowLoad<S>::load(cache + key_offset(a, r, begin + j, kv_head), d0, kD, k);
#pragma unroll
            for (int i = 0; i < kVec; ++i) dot += q_s[d0 + i] * k[i];
        }
        dot = warp_sum(dot, kGroupLanes);  // lanes of one key are adjacent: xor stays inside
        if (j < n && sub == 0) s_s[j] = soft_cap(a, dot);
    }
    __syncthreads();
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += kThreads) m = fmaxf(m, s_s[j]);
    m = block_reduce<true>(m, scratch);
    float l = 0.0f;
    for (int j = threadIdx.x; j < n; j += kThreads) {
        s_s[j] = __expf(s_s[j] - m);
        l += s_s[j];
    }
    l = block_reduce<false>(l, scratch);  // its __syncthreads also publishes s_s
    float acc[kVec] = {};
    const int row = threadIdx.x / kGroupLanes;
    for (int j = row; j < n; j += kRowsPerPass) {
        float v[kVec];
        RowLoad<S>::load(cache + a.cache.kv_stride() + key_offset(a, r, begin + j, kv_head), d0, kD, v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[i] += s_s[j] * v[i];
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) red[row][d0 + i] = acc[i];
    __syncthreads();
    for (int d = threadIdx.x; d < kD; d += kThreads) {
        float o = 0.0f;
        for (int i = 0; i < kRowsPerPass; ++i) o += red[i][d];
        if (num_splits == 1) {
            T* out = static_cast<T*>(a.out) + tok * a.out_token_stride + head * a.out_head_stride;
            out[d] = from_f<T>(o / l);
        } else {  // partial: unnormalized acc, then max and sum; an empty split has sum 0
            float* part = workspace + ((tok * a.num_heads + head) * num_splits + split) * (kD + 2);
            part[d] = n > 0 ? o : 0.0f;
            if (d == 0) {
                part[kD] = m;
                part[kD + 1] = n > 0 ? l : 0.0f;
            }
        }
    }
}

template <typename T, int kD>
__global__ void merge_splits_kernel(AttentionArgs a, const float* workspace, int num_splits) {
    const int64_t tok = blockIdx.x / a.num_heads;
    const int head = blockIdx.x % a.num_heads;
    const float* parts = workspace + (tok * a.num_heads + head) * num_splits * (kD + 2);
    float m = -INFINITY;
    for (int s = 0; s < num_splits; ++s)
        if (parts[s * (kD + 2) + kD + 1] > 0.0f) m = fmaxf(m, parts[s * (kD + 2) + kD]);
    T* out = static_cast<T*>(a.out) + tok * a.out_token_stride + head * a.out_head_stride;
    for (int d = threadIdx.x; d < kD; d += blockDim.x) {
        float o = 0.0f, l = 0.0f;
        for (int s = 0; s < num_splits; ++s) {
            const float* p = parts + s * (kD + 2);
            if (p[kD + 1] == 0.0f) continue;  // split past this row's context
            const float w = __expf(p[kD] - m);
            o += w * p[d];
            l += w * p[kD + 1];
        }
        out[d] = from_f<T>(o / l);
    }
}

// ---- prefill: a tile of kRows query rows of one head per block, kKeys-key K/V tiles ---------
constexpr int kRows = 16, kKeys = 32, kRowsPerWarp = kRows / kWarps;

template <typename S, int kD>
__device__ void load_kv_tile(const AttentionArgs& a, int r, int kv_head, int64_t key0,
                             int64_t num_keys, float (*k_s)[kD + 1], float (*v_s)[kD]) {
    constexpr int kVec = RowLoad<S>::kSize, kChunks = kD / kVec;
    const S* cache = static_cast<const S*>(a.cache.data);
    for (int i = threadIdx.x; i < kKeys * kChunks; i += kThreads) {
        const int j = i / kChunks, d0 = (i % kChunks) * kVec;
        float k[kVec], v[kVec];
        if (key0 + j < num_keys) {
            const int64_t off = key_offset(a, r, key0 + j, kv_head);
            RowLoad<S>::load(cache + off, d0, kD, k);
            RowLoad<S>::load(cache + a.cache.kv_stride() + off, d0, kD, v);
        } else {
            for (int e = 0; e < kVec; ++e) k[e] = v[e] = 0.0f;
        }
        for (int e = 0; e < kVec; ++e) {
            k_s[j][d0 + e] = k[e];
            v_s[j][d0 + e] = v[e];
        }
    }
}

template <typename T, typename S, int kD>
__global__ void prefill_kernel(AttentionArgs a, int num_row_tiles) {
    constexpr int kDimsPerLane = kD / 32;
    __shared__ float q_s[kRows][kD];
    __shared__ float k_s[kKeys][kD + 1];  // +1: lane j reads row j without bank conflicts
    __shared__ float v_s[kKeys][kD];
    const int head = blockIdx.x % a.num_heads;
    const int tile = (blockIdx.x / a.num_heads) % num_row_tiles;
    const int r = blockIdx.x / (a.num_heads * num_row_tiles);
    const int64_t q_start = a.query_start_loc[r], q_len = a.query_start_loc[r + 1] - q_start;
    const int64_t row0 = int64_t(tile) * kRows;
    if (row0 >= q_len) return;  // whole block exits together: no barrier is skipped
    const int kv_head = head / (a.num_heads / a.cache.num_kv_heads);
    const int64_t first_pos = a.seq_lens[r] - q_len + row0;
    const int rows = int(cmin(kRows, q_len - row0));
    const T* query = static_cast<const T*>(a.query.data);
    for (int i = threadIdx.x; i < kRows * kD; i += kThreads) {
        const int row = i / kD, d = i % kD;
        q_s[row][d] = row < rows ? to_f(query[(q_start + row0 + row) * a.query.token_stride +
                                              head * a.query.head_stride + d]) * a.scale
                                 : 0.0f;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kDimsPerLane];
    for (int i = 0; i < kRowsPerWarp; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        for (int e = 0; e < kDimsPerLane; ++e) acc[i][e] = 0.0f;
    }
    const int64_t num_keys = first_pos + rows;  // the last row's causal horizon
    // From the tile holding the first row's window start: later rows see no earlier keys.
    for (int64_t key0 = window_start(a, first_pos) / kKeys * kKeys; key0 < num_keys;
         key0 += kKeys) {
        __syncthreads();  // the previous tile is fully consumed (and q_s is written)
        load_kv_tile<S, kD>(a, r, kv_head, key0, num_keys, k_s, v_s);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const int row = warp * kRowsPerWarp + i;
            const int64_t pos = first_pos + row;
            const int64_t lo = window_start(a, pos);
            if (row >= rows || key0 > pos || key0 + kKeys <= lo) continue;  // warp-uniform
            float s = 0.0f;
#pragma unroll 8
            for (int d = 0; d < kD; ++d) s += q_s[row][d] * k_s[lane][d];
            const bool valid = key0 + lane <= pos && key0 + lane >= lo;
            s = valid ? soft_cap(a, s) : -INFINITY;
            const float new_m = fmaxf(m[i], warp_max(s));
            const float p = valid ? __expf(s - new_m) : 0.0f;
            const float alpha = __expf(m[i] - new_m);  // 0 on the first tile (m = -inf)
            l[i] = l[i] * alpha + warp_sum(p);
            m[i] = new_m;
            for (int e = 0; e < kDimsPerLane; ++e) acc[i][e] *= alpha;
            for (int j = 0; j < kKeys; ++j) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
                for (int e = 0; e < kDimsPerLane; ++e) acc[i][e] += pj * v_s[j][lane + 32 * e];
            }
        }
    }
    T* out = static_cast<T*>(a.out);
    for (int i = 0; i < kRowsPerWarp; ++i) {
        const int row = warp * kRowsPerWarp + i;
        if (row >= rows) continue;
        T* o = out + (q_start + row0 + row) * a.out_token_stride + head * a.out_head_stride;
        for (int e = 0; e < kDimsPerLane; ++e) o[lane + 32 * e] = from_f<T>(acc[i][e] / l[i]);
    }
}

void check_launch(const char* what) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

template <typename T, typename S, int kD>
void launch_attention(const AttentionArgs& a, float* workspace, int splits, cudaStream_t stream) {
    if (a.max_query_len == 1) {
        const dim3 grid(static_cast<unsigned>(a.num_tokens * a.num_heads), splits);
        decode_kernel<T, S, kD><<<grid, kThreads, 0, stream>>>(a, workspace, splits);
        check_launch("decode_kernel");
        if (splits > 1) {
            merge_splits_kernel<T, kD><<<grid.x, kD, 0, stream>>>(a, workspace, splits);
            check_launch("merge_splits_kernel");
        }
        return;
    }
    const int row_tiles = static_cast<int>((a.max_query_len + kRows - 1) / kRows);
    const auto blocks = static_cast<unsigned>(a.num_reqs * row_tiles * a.num_heads);
    prefill_kernel<T, S, kD><<<blocks, kThreads, 0, stream>>>(a, row_tiles);
    check_launch("prefill_kernel");
}

template <typename T, typename S>
void launch_for_head_size(const AttentionArgs& a, float* workspace, int splits,
                          cudaStream_t stream) {
    switch (a.cache.head_size) {
        case 64: return launch_attention<T, S, 64>(a, workspace, splits, stream);
        case 128: return launch_attention<T, S, 128>(a, workspace, splits, stream);
        default: throw std::invalid_argument("CUDA paged attention supports head_size 64 and 128");
    }
}

// T's kernels over the cache's storage: T itself, or 8-bit codes.
template <typename T>
void launch_for_cache(const AttentionArgs& a, float* workspace, int splits, cudaStream_t stream) {
    switch (a.cache.quant) {
        case KvQuant::kNone: return launch_for_head_size<T, T>(a, workspace, splits, stream);
        case KvQuant::kInt8: return launch_for_head_size<T, std::int8_t>(a, workspace, splits, stream);
        case KvQuant::kFp8E4m3: return launch_for_head_size<T, E4m3>(a, workspace, splits, stream);
        case KvQuant::kFp16: break;
    }
    throw std::invalid_argument("the CUDA paged-attention kernels read fp16 KV pages under fp16 "
                                "activations only (KvQuant::kNone)");
}

template <typename T>
void launch_cache_write_8bit(const CacheWriteArgs& a, cudaStream_t stream) {
    const unsigned grid = static_cast<unsigned>(a.num_tokens);
    if (a.cache.quant == KvQuant::kInt8)
        cache_write_8bit_kernel<T, std::int8_t><<<grid, kThreads, 0, stream>>>(a);
    else
        cache_write_8bit_kernel<T, E4m3><<<grid, kThreads, 0, stream>>>(a);
}

}  // namespace

// The CUDA kernels read and write caches in the activations' dtype or 8-bit ones (int8, fp8
// e4m3); fp16 pages under other activations are the CPU's only (the Python side refuses them on
// CUDA at load; this is the last guard). 8-bit rows need 4-byte alignment and a head size that
// is a multiple of 8.
static void require_supported(const KvCacheView& cache) {
    if (cache.quant == KvQuant::kFp16)
        throw std::invalid_argument("the CUDA paged-attention kernels do not read fp16 KV pages "
                                    "under float32 or bfloat16 activations");
    if (is_8bit(cache.quant) && (cache.head_size % 8 != 0 ||
                                 reinterpret_cast<std::uintptr_t>(cache.data) % 4 != 0))
        throw std::invalid_argument("an 8-bit KV cache on CUDA needs head_size % 8 == 0 and a "
                                    "4-byte aligned cache");
}

void reshape_and_cache_cuda(const CacheWriteArgs& args, void* stream) {
    require_supported(args.cache);
    if (args.num_tokens == 0) return;
    const auto s = static_cast<cudaStream_t>(stream);
    if (is_8bit(args.cache.quant)) {
        switch (args.dtype) {
            case DType::kFloat32: launch_cache_write_8bit<float>(args, s); break;
            case DType::kBFloat16: launch_cache_write_8bit<__nv_bfloat16>(args, s); break;
            case DType::kFloat16: launch_cache_write_8bit<__half>(args, s); break;
        }
        check_launch("cache_write_8bit_kernel");
        return;
    }
    const int64_t elt = static_cast<int64_t>(dtype_size(args.dtype));
    const auto aligned = [&](const TokenTensor& t) {
        return reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0 &&
               (t.token_stride * elt) % 16 == 0 && (t.head_stride * elt) % 16 == 0;
    };
    const unsigned grid = static_cast<unsigned>(args.num_tokens);
    if ((args.cache.head_size * elt) % 16 == 0 && aligned(args.key) && aligned(args.value) &&
        reinterpret_cast<std::uintptr_t>(args.cache.data) % 16 == 0) {
        cache_write_kernel<uint4><<<grid, kThreads, 0, s>>>(args, elt);
    } else if (elt == 4) {
        cache_write_kernel<std::uint32_t><<<grid, kThreads, 0, s>>>(args, elt);
    } else {
        cache_write_kernel<std::uint16_t><<<grid, kThreads, 0, s>>>(args, elt);
    }
    check_launch("cache_write_kernel");
}

void paged_attention_cuda(const AttentionArgs& args, float* workspace, int max_splits,
                          void* stream) {
    require_supported(args.cache);
    if (args.num_tokens == 0) return;
    if (!is_8bit(args.cache.quant) && reinterpret_cast<std::uintptr_t>(args.cache.data) % 16 != 0)
        throw std::invalid_argument("kv_cache must be 16-byte aligned");
    if (max_splits < 1 || (max_splits > 1 && workspace == nullptr))
        throw std::invalid_argument("split decode needs max_splits >= 1 and a workspace");
    if (args.max_query_len == 1 &&
        args.max_seq_len > static_cast<int64_t>(max_splits) * kCudaDecodeSplitLen)
        throw std::invalid_argument("max_seq_len needs more decode splits than max_splits");
    const auto s = static_cast<cudaStream_t>(stream);
    switch (args.dtype) {
        case DType::kFloat32: return launch_for_cache<float>(args, workspace, max_splits, s);
        case DType::kBFloat16: return launch_for_cache<__nv_bfloat16>(args, workspace, max_splits, s);
        case DType::kFloat16: return launch_for_cache<__half>(args, workspace, max_splits, s);
    }
    throw std::invalid_argument("unknown dtype");
}

}  // namespace pagedserve
