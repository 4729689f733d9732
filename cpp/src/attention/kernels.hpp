// The CPU paged-attention kernels (dispatch.cpp has the overview), included once per ISA level
// by that level's file (portable.cpp, avx2.cpp, avx512.cpp, avx512_bf16.cpp; neon.cpp on
// aarch64), each time inside its
// own namespace and under its own `#pragma GCC target`, so that one build holds every level and
// dispatch.cpp picks one at run time. The including file defines:
//   PAGEDSERVE_ISA_NS            the namespace of this copy (attention_portable, ..._avx2, ...)
//   PAGEDSERVE_ISA_TARGET        the copy's GCC target string (undefined: the portable copy)
//   PAGEDSERVE_ISA_AVX2          1: the loops' score and value steps on AVX2 registers (avx2.hpp)
//   PAGEDSERVE_ISA_AVX512        1: the intrinsic item kernels of avx512.hpp and avx512_item.hpp
//   PAGEDSERVE_ISA_AVX512_BF16   1: their bf16 dot products (vdpbf16ps)
//   PAGEDSERVE_ISA_NEON          1: the loops' score, softmax and value steps on NEON registers
//                                (neon.hpp; aarch64 only; undefined: 0)
// The portable and AVX2 copies are the same plain loops (`omp simd`, loops.hpp), vectorized for
// the level; the AVX2 copy takes its score, softmax and value steps for head sizes 64 and 128
// from avx2.hpp. Everything the kernels need from the standard library and the project's headers is
// included before the target pragma, so no inline library code is compiled for one level and
// then, being one symbol for the linker, shared with another.
#pragma once

#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // the AVX2 and AVX-512 kernels' intrinsics
#include <immintrin.h>
#endif
#if PAGEDSERVE_AARCH64  // the NEON steps' intrinsics
#include <arm_neon.h>
#endif
#ifndef PAGEDSERVE_ISA_NEON
#define PAGEDSERVE_ISA_NEON 0
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention/levels.hpp"
#include "pagedserve/cpu_features.hpp"
#include "pagedserve/paged_attention.hpp"
#include "pagedserve/rows.hpp"  // Bf16, load_row, store_row

#ifdef PAGEDSERVE_ISA_TARGET
#pragma GCC push_options
PAGEDSERVE_TARGET_PRAGMA(PAGEDSERVE_ISA_TARGET)
#endif
// Every level rounds the same (issue 24): no multiply-add is fused unless the source says so
// (std::fma here, _mm512_fmadd_ps in avx512.hpp, at the same steps), so the portable, AVX2 and
// AVX-512 copies give the same bits for fp32 (and widened bf16) caches. The int8 activations of
// a quantized model would turn a last-bit difference here into different tokens.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

namespace pagedserve::PAGEDSERVE_ISA_NS {
namespace {
// e^x for x <= 0 (scores minus their running max), vectorizable: 2^i * e^f with i = round(x /
// ln 2) and |f| <= ln(2) / 2, where a degree-7 Taylor polynomial is good to ~1e-8 relative.
// Step for step what exp_nonpositive16 (avx512.hpp) does on 16 lanes, its fused steps as fma.
inline float exp_nonpositive(float x) {
    x = std::max(x, -87.0f);  // keeps 2^i a normal float; e^-87 is below fp32 resolution of 1
    const float t = x * 1.44269504088896341f;
    const float i = (t + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23 trick)
    float f = std::fma(-i, 0.693359375f, x);  // Cody-Waite: x - i ln 2, in two steps
    f = std::fma(i, 2.12194440e-4f, f);
    float p = 1.0f / 5040.0f;
    p = std::fma(p, f, 1.0f / 720.0f);
    p = std::fma(p, f, 1.0f / 120.0f);
    p = std::fma(p, f, 1.0f / 24.0f);
    p = std::fma(p, f, 1.0f / 6.0f);
    p = std::fma(p, f, 0.5f);
    p = std::fma(p, f, 1.0f);
    p = std::fma(p, f, 1.0f);
    const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(i) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    return p * scale;
}

// The sum of 16 lanes in one fixed tree (halves, then quarters, then pairs): every level's
// softmax sums a row's weights into 16 lanes (key j into lane j % 16) and folds them here, so
// the sum does not depend on the vector width.
inline float sum16(const float v[16]) {
    float h[8], q[4];
    for (int l = 0; l < 8; ++l) h[l] = v[l] + v[l + 8];
    for (int l = 0; l < 4; ++l) q[l] = h[l] + h[l + 4];
    return (q[0] + q[2]) + (q[1] + q[3]);
}

// The keys [lo, hi) a query vector sees in a key block of n (>= hi) scored keys, and the soft cap
// of its scores (0: none).
struct Span {
    std::int64_t lo, hi, n;
    float softcap;
};

// cap * tanh(s / cap), with tanh(x) = sign(x) (1 - e^-2|x|) / (1 + e^-2|x|) (Gemma 2's cap).
inline float soft_cap(float s, float cap) {
    const float x = s / cap;
    const float e = exp_nonpositive(-2.0f * std::fabs(x));
    return cap * std::copysign((1.0f - e) / (1.0f + e), x);
}

// Rows of a cache page: float, Bf16 or Half values (head_size apart), or the 8-bit layout of
// paged_attention.hpp (Int8Code or E4m3Code: head_size one-byte codes, then the row's float32
// scale). Every widening to fp32 is exact, or for 8-bit codes the one multiply by the row's scale
// that the loops' widening does (dequantize_rows, widen_e4m3_rows): the same bits either way.
struct Int8Code {
    std::int8_t bits;
};
struct E4m3Code {
    std::uint8_t bits;
};
template <typename V>
constexpr bool kScaledRows = std::is_same_v<V, Int8Code> || std::is_same_v<V, E4m3Code>;

// Elements from one row to the next.
template <typename V>
constexpr std::int64_t row_stride(std::int64_t d_len) {
    return kScaledRows<V> ? d_len + kKvScaleBytes : d_len;
}

// The row's scale (8-bit rows), else 1 (unused).
template <typename V>
inline float row_scale(const V* row, std::int64_t d_len) {
    float scale = 1.0f;
    if constexpr (kScaledRows<V>) std::memcpy(&scale, row + d_len, sizeof(scale));
    return scale;
}

inline float widen(float x, float) { return x; }
inline float widen(Bf16 x, float) {
    const std::uint32_t bits = static_cast<std::uint32_t>(x.bits) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
}
inline float widen(Half x, float) { return half_to_float(x.bits); }
inline float widen(Int8Code x, float scale) { return static_cast<float>(x.bits) * scale; }
inline float widen(E4m3Code x, float scale) { return e4m3_to_float(x.bits) * scale; }

#if PAGEDSERVE_ISA_AVX512
#include "attention/avx512.hpp"
#endif

constexpr int kChunk = 16;        // keys per vectorized score chunk (one AVX-512 register)
constexpr int kBlockKeys = 64;    // keys per softmax update: whole pages, at least one
constexpr int kTargetRows = 128;  // query vectors (rows x group heads) per work item
constexpr int kMinParallelWork = 1 << 15;  // (query vector, key) pairs: ~0.1 ms of work
constexpr int kGroupRows = 4;     // query vectors scored together (shared key loads)
constexpr int kWidenMinRows = 8;  // from this many query vectors, bf16 values are widened once
constexpr int kDotMaxRows = 8;    // below this many, a dot per key (batch_invariant = false)

struct WorkItem {
    std::int64_t req, kv_head, row0, rows;
};


std::int64_t round_up(std::int64_t n) { return (n + kChunk - 1) / kChunk * kChunk; }

// Per-thread buffers. A key block is pages_per_block whole pages.
struct Scratch {
    std::int64_t m, d, page_size, pages_per_block, block_keys, width;
    std::vector<float> q, acc, row_max, row_sum, k, k_t, v, s, zero;
    std::vector<const float*> k_pages, v_pages;
    std::vector<const void*> k_rows, v_rows;  // raw cache rows of the block's keys (AVX-512 path)
    std::vector<std::uint16_t> q_bf16;        // raw bf16 query rows (dpbf16 path)
    std::vector<const void*> v_raw;           // value pages left in the cache, not widened (AVX2)
    Scratch(std::int64_t m, std::int64_t d, std::int64_t page_size)
        : m(m), d(d), page_size(page_size), pages_per_block(std::max<std::int64_t>(1, kBlockKeys / page_size)),
          block_keys(pages_per_block * page_size), width(round_up(block_keys)), q(m * d),
          acc(m * d), row_max(m), row_sum(m), k(block_keys * d), k_t(d * width), v(block_keys * d),
          s(std::max(kGroupRows, kDotMaxRows) * width), zero(d), k_pages(pages_per_block),
          v_pages(pages_per_block), k_rows(block_keys), v_rows(block_keys), q_bf16(m * d),
          v_raw(pages_per_block) {}
};

// The calling thread's Scratch for these sizes, kept between calls (OpenMP reuses its threads):
// a model's layers all ask for the same sizes, so the hot path allocates nothing. Stale values
// from an earlier call reach only score lanes that the softmax masks out; `zero` stays zero.
Scratch& thread_scratch(std::int64_t m, std::int64_t d, std::int64_t page_size) {
    thread_local std::unique_ptr<Scratch> sc;
    if (!sc || sc->m != m || sc->d != d || sc->page_size != page_size)
        sc = std::make_unique<Scratch>(m, d, page_size);
    return *sc;
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

#include "attention/loops.hpp"
#if PAGEDSERVE_ISA_AVX2
#include "attention/avx2.hpp"
#endif
#if PAGEDSERVE_ISA_NEON
#include "attention/neon.hpp"
#endif

template <typename T>
void prefetch_tile(const T* p, std::int64_t elements) {
#if defined(__GNUC__)
    const char* bytes = reinterpret_cast<const char*>(p);
    for (std::int64_t i = 0; i < elements * static_cast<std::int64_t>(sizeof(T)); i += 64)
        __builtin_prefetch(bytes + i, 0, 2);  // into L2: L1 has too few miss buffers
#else
    (void)p;
    (void)elements;
#endif
}

// Element offset (in the K half) of the work item's key page `index`, keys below num_keys;
// prefetches the K and V pages a block ahead, since scattered pages defeat the HW prefetcher.
template <typename T>
std::int64_t page_offset(const AttentionArgs& a, const WorkItem& w, std::int64_t index,
                         std::int64_t num_keys, const Scratch& sc) {
    const KvCacheView& c = a.cache;
    const std::int32_t* row = a.page_table + w.req * a.page_table_stride;
    const std::int64_t ahead = index + sc.pages_per_block;
    if (ahead * c.page_size < num_keys) {
        const T* next = static_cast<const T*>(c.data) + row[ahead] * c.page_stride() +
                        w.kv_head * c.head_stride();
        prefetch_tile(next, c.head_stride());
        prefetch_tile(next + c.kv_stride(), c.head_stride());
    }
    return row[index] * c.page_stride() + w.kv_head * c.head_stride();
}

// The np fp32 key rows k (d_len apart) into columns n .. n + np of sc.k_t.
void transpose_page(const float* k, std::int64_t np, std::int64_t d_len, std::int64_t n,
                    Scratch& sc) {
#if PAGEDSERVE_ISA_AVX2
    transpose_keys_avx2(k, np, d_len, sc.k_t.data(), sc.width, n);
#else
    for (std::int64_t j = 0; j < np; ++j)
        for (std::int64_t d = 0; d < d_len; ++d) sc.k_t[d * sc.width + n + j] = k[j * d_len + d];
#endif
}

// Widens np int8 rows of one page's tile (head_size values, then their float32 scale: the 8-bit
// layout of paged_attention.hpp) to fp32 rows, d_len apart. One multiply per value, no fused
// step: every level gives the same bits.
void dequantize_rows(const std::int8_t* tile, std::int64_t np, std::int64_t row_size,
                     std::int64_t d_len, float* dst) {
    for (std::int64_t j = 0; j < np; ++j) {
        const std::int8_t* src = tile + j * row_size;
        float scale;
        std::memcpy(&scale, src + d_len, sizeof(scale));
        float* out = dst + j * d_len;
#pragma omp simd
        for (std::int64_t d = 0; d < d_len; ++d) out[d] = static_cast<float>(src[d]) * scale;
    }
}

// Widens np e4m3 rows of one page's tile (head_size codes, then their float32 scale: the 8-bit
// layout of paged_attention.hpp) to fp32 rows, d_len apart: e4m3_to_float(code) x scale. A code
// is the fp16 of 2^-8 its value with its bits moved (the sign to bit 15, the other seven to bits
// 13..7), so F16C and NEON widen 8 at a time and multiply by scale x 256 (a power of two away
// from scale: the same exact product, so the same rounding as the scalar loop); codes 0x7f and
// 0xff read as NaN at every level.
void widen_e4m3_rows(const std::uint8_t* tile, std::int64_t np, std::int64_t row_size,
                     std::int64_t d_len, float* dst) {
    for (std::int64_t j = 0; j < np; ++j) {
        const std::uint8_t* src = tile + j * row_size;
        float scale;
        std::memcpy(&scale, src + d_len, sizeof(scale));
        float* out = dst + j * d_len;
        std::int64_t d = 0;
#if PAGEDSERVE_ISA_AVX2 || PAGEDSERVE_ISA_AVX512
        const __m256 scaled = _mm256_set1_ps(scale * 256.0f);
        const __m128i low7 = _mm_set1_epi16(0x7f), sign = _mm_set1_epi16(0x80);
        for (; d + 8 <= d_len; d += 8) {
            const __m128i codes =
                _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + d)));
            const __m128i magnitude = _mm_and_si128(codes, low7);
            __m128i half = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(codes, sign), 8),
                                        _mm_slli_epi16(magnitude, 7));
            const __m128i nan = _mm_cmpeq_epi16(magnitude, low7);  // 0x3f80 | 0x7e00: a NaN half
            half = _mm_or_si128(half, _mm_and_si128(nan, _mm_set1_epi16(0x7e00)));
            _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_cvtph_ps(half), scaled));
        }
#elif PAGEDSERVE_ISA_NEON
        const float32x4_t scaled = vdupq_n_f32(scale * 256.0f);
        const uint16x8_t low7 = vdupq_n_u16(0x7f);
        for (; d + 8 <= d_len; d += 8) {
            const uint16x8_t codes = vmovl_u8(vld1_u8(src + d));
            const uint16x8_t magnitude = vandq_u16(codes, low7);
            uint16x8_t half = vorrq_u16(vshlq_n_u16(vandq_u16(codes, vdupq_n_u16(0x80)), 8),
                                        vshlq_n_u16(magnitude, 7));
            half = vorrq_u16(half, vandq_u16(vceqq_u16(magnitude, low7), vdupq_n_u16(0x7e00)));
            const float32x4_t lo = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(half)));
            const float32x4_t hi = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(half)));
            vst1q_f32(out + d, vmulq_f32(lo, scaled));
            vst1q_f32(out + d + 4, vmulq_f32(hi, scaled));
        }
#endif
        for (; d < d_len; ++d) out[d] = e4m3_to_float(src[d]) * scale;
    }
}

// Widens n fp16 values to fp32, exactly: F16C from level avx2 up, NEON's conversion from level
// neon, else rows.hpp's half_to_float (the same values).
void widen_halves(const Half* src, float* dst, std::int64_t n) {
    std::int64_t i = 0;
#if PAGEDSERVE_ISA_AVX2 || PAGEDSERVE_ISA_AVX512
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#elif PAGEDSERVE_ISA_NEON
    for (; i + 4 <= n; i += 4)
        vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(&src[i].bits))));
#endif
    for (; i < n; ++i) dst[i] = half_to_float(src[i].bits);
}

// Widens the first np keys and values of the work item's page `index` of a quantized cache
// (int8, fp8 or fp16: KvCacheView::quant) to fp32 rows k and v, d_len apart.
void widen_page(const AttentionArgs& a, const WorkItem& w, std::int64_t index, std::int64_t num_keys,
                std::int64_t np, std::int64_t d_len, float* k, float* v, const Scratch& sc) {
    const KvCacheView& c = a.cache;
    if (c.quant == KvQuant::kFp16) {
        const Half* halves = static_cast<const Half*>(c.data) + page_offset<Half>(a, w, index, num_keys, sc);
        widen_halves(halves, k, np * d_len);
        widen_halves(halves + c.kv_stride(), v, np * d_len);
        return;
    }
    const auto* bytes = static_cast<const std::uint8_t*>(c.data) +
                        page_offset<std::uint8_t>(a, w, index, num_keys, sc);
    for (const auto& [half, rows] : {std::pair{std::int64_t{0}, k}, std::pair{c.kv_stride(), v}}) {
        if (c.quant == KvQuant::kInt8)
            dequantize_rows(reinterpret_cast<const std::int8_t*>(bytes + half), np, c.row_size(),
                            d_len, rows);
        else
            widen_e4m3_rows(bytes + half, np, c.row_size(), d_len, rows);
    }
}

#if PAGEDSERVE_ISA_AVX2
// load_block's AVX2 step for a page of rows of type K (Bf16, Half, Int8Code, E4m3Code): its keys
// transposed into sc.k_t straight from the cache, its values left there (raw_values: sc.v_raw)
// or widened into sc.v.
template <typename K>
void load_page_avx2(const AttentionArgs& a, const WorkItem& w, std::int64_t index,
                    std::int64_t num_keys, std::int64_t np, std::int64_t n, std::int64_t p,
                    bool raw_values, Scratch& sc) {
    const KvCacheView& c = a.cache;
    const std::int64_t d_len = c.head_size;
    const K* keys = static_cast<const K*>(c.data) + page_offset<K>(a, w, index, num_keys, sc);
    transpose_keys_avx2(keys, np, d_len, sc.k_t.data(), sc.width, n);
    if (raw_values) {
        sc.v_raw[p] = keys + c.kv_stride();
    } else {
        widen_rows_avx2(keys + c.kv_stride(), np, d_len, sc.v.data() + n * d_len);
        sc.v_pages[p] = sc.v.data() + n * d_len;
    }
}
#endif

// Points at (fp32) or converts (bf16, int8, fp8, fp16) the pages of keys [key0, key0 + block_keys) below
// num_keys into sc.v_pages, and the transposed keys into sc.k_t. The AVX2 copy transposes bf16,
// fp16 and 8-bit keys straight from the cache (load_page_avx2) and, for fewer than
// kWidenMinRows query vectors (raw_values), leaves their values in the cache (sc.v_raw) for the
// value step to widen. Other levels widen an int8, fp8 or fp16 cache (KvCacheView::quant) to
// fp32 rows here, and from there take the fp32 path. Every widening is exact or one multiply by
// the row's scale, so the same bits at every level. Returns the number of keys in the block.
template <typename T>
std::int64_t load_block(const AttentionArgs& a, const WorkItem& w, std::int64_t key0,
                        std::int64_t num_keys, std::int64_t d_len, bool raw_values, Scratch& sc) {
    const KvCacheView& c = a.cache;
    const T* cache = static_cast<const T*>(c.data);
    (void)raw_values;  // read by the AVX2 copy only
    std::int64_t n = 0;
    for (std::int64_t p = 0; p < sc.pages_per_block && key0 + n < num_keys; ++p) {
        const std::int64_t np = std::min(c.page_size, num_keys - key0 - n);
#if PAGEDSERVE_ISA_AVX2
        if (c.quant != KvQuant::kNone || std::is_same_v<T, Bf16>) {  // widened in registers
            const std::int64_t index = (key0 + n) / c.page_size;
            switch (c.quant) {
                case KvQuant::kNone: load_page_avx2<T>(a, w, index, num_keys, np, n, p, raw_values, sc); break;
                case KvQuant::kFp16: load_page_avx2<Half>(a, w, index, num_keys, np, n, p, raw_values, sc); break;
                case KvQuant::kInt8: load_page_avx2<Int8Code>(a, w, index, num_keys, np, n, p, raw_values, sc); break;
                case KvQuant::kFp8E4m3: load_page_avx2<E4m3Code>(a, w, index, num_keys, np, n, p, raw_values, sc); break;
            }
            n += np;
            continue;
        }
#endif
        if (c.quant != KvQuant::kNone) {
            float* k = sc.k.data() + n * d_len;
            float* v = sc.v.data() + n * d_len;
            widen_page(a, w, (key0 + n) / c.page_size, num_keys, np, d_len, k, v, sc);
            sc.k_pages[p] = k;
            sc.v_pages[p] = v;
            transpose_page(k, np, d_len, n, sc);
            n += np;
            continue;
        }
        const std::int64_t off = page_offset<T>(a, w, (key0 + n) / c.page_size, num_keys, sc);
        if constexpr (std::is_same_v<T, float>) {
            sc.k_pages[p] = cache + off;
            sc.v_pages[p] = cache + c.kv_stride() + off;
        } else {
            load_row(cache + off, sc.k.data() + n * d_len, np * d_len);
            load_row(cache + c.kv_stride() + off, sc.v.data() + n * d_len, np * d_len);
            sc.k_pages[p] = sc.k.data() + n * d_len;
            sc.v_pages[p] = sc.v.data() + n * d_len;
        }
        transpose_page(sc.k_pages[p], np, d_len, n, sc);
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

// The first key position the query at `pos` sees (its sliding window's start, or 0).
std::int64_t window_start(const AttentionArgs& a, std::int64_t pos) {
    return a.sliding_window > 0 ? std::max<std::int64_t>(0, pos - a.sliding_window + 1) : 0;
}

// The first key block (a multiple of block_keys: blocks never depend on the chunking) holding a
// key the vector at first_pos sees; later vectors of an item see no earlier keys.
std::int64_t first_block(const AttentionArgs& a, std::int64_t first_pos, const Scratch& sc) {
    return window_start(a, first_pos) / sc.block_keys * sc.block_keys;
}

// The keys query vectors m .. m + rows see inside the key block [key0, key0 + n), in block
// coordinates [lo[r], hi[r]) (empty when hi <= lo: the block is wholly in the vector's future or
// before its window). Returns the largest hi of a non-empty span (<= 0: no vector sees any).
std::int64_t horizons(const AttentionArgs& a, std::int64_t m, std::int64_t rows, std::int64_t key0,
                      std::int64_t n, std::int64_t first_pos, std::int64_t* lo, std::int64_t* hi) {
    const std::int64_t group = a.num_heads / a.cache.num_kv_heads;
    std::int64_t n_max = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t pos = first_pos + (m + r) / group;
        hi[r] = std::min(n, pos - key0 + 1);
        lo[r] = std::max<std::int64_t>(0, window_start(a, pos) - key0);
        if (hi[r] > lo[r]) n_max = std::max(n_max, hi[r]);
    }
    return n_max;
}

// Softmax step of query vectors m .. m + rows over their score rows sc.s (stride width).
// A vector's keys outside its span get weight exactly 0; a vector that sees none of the block
// is left as it was (its weights zeroed for the shared value pass).
template <int kD>
void softmax_rows(const AttentionArgs& a, Scratch& sc, std::int64_t m, std::int64_t rows,
                  const std::int64_t* lo, const std::int64_t* hi, std::int64_t n_max,
                  std::int64_t d_len) {
    for (std::int64_t r = 0; r < rows; ++r) {
        float* sr = sc.s.data() + r * sc.width;
        const Span span{lo[r], hi[r], n_max, a.logit_softcap};
        if (hi[r] <= lo[r]) {
            std::fill(sr, sr + n_max, 0.0f);
        } else {
#if PAGEDSERVE_ISA_AVX2
            if constexpr (kD != 0) {
                softmax_step_avx2<kD>(sr, span, sc.row_max[m + r], sc.row_sum[m + r],
                                      sc.acc.data() + (m + r) * d_len);
                continue;
            }
#endif
#if PAGEDSERVE_ISA_NEON
            if constexpr (kD != 0) {
                softmax_step_neon<kD>(sr, span, sc.row_max[m + r], sc.row_sum[m + r],
                                      sc.acc.data() + (m + r) * d_len);
                continue;
            }
#endif
#if PAGEDSERVE_ISA_AVX512
            if constexpr (kD != 0) {
                softmax_step_avx512<kD>(sr, span, sc.row_max[m + r], sc.row_sum[m + r],
                                        sc.acc.data() + (m + r) * d_len);
                continue;
            }
#endif
            softmax_step<kD>(sr, span, d_len, sc.row_max[m + r], sc.row_sum[m + r],
                             sc.acc.data() + (m + r) * d_len);
        }
    }
}

// Folds one key block [key0, key0 + n) into query vectors m .. m + kR of the work item
// (raw_values: its bf16, fp16 or 8-bit values are still in the cache, sc.v_raw; the AVX2 copy
// only).
template <int kD, int kR>
void attend_rows(const AttentionArgs& a, Scratch& sc, std::int64_t m, std::int64_t key0,
                 std::int64_t n, std::int64_t first_pos, bool raw_values) {
    const std::int64_t d_len = kD ? kD : a.cache.head_size, ps = a.cache.page_size;
    std::int64_t lo[kR], hi[kR];
    const std::int64_t n_max = horizons(a, m, kR, key0, n, first_pos, lo, hi);
    if (n_max <= 0) return;
    float* s = sc.s.data();
    const float* q = sc.q.data() + m * d_len;
#if PAGEDSERVE_ISA_AVX2
    if constexpr (kD != 0) {
        scores_transposed_avx2<kD, kR>(q, sc.k_t.data(), n_max, sc.width, s);
        softmax_rows<kD>(a, sc, m, kR, lo, hi, n_max, d_len);
        constexpr int kPv = kR == 3 ? 3 : std::min(kR, 2);  // 8 or 12 value accumulators
        for (int r = 0; r < kR; r += kPv) {
            float* acc = sc.acc.data() + (m + r) * d_len;
            const float* sr = s + r * sc.width;
            switch (raw_values ? a.cache.quant : KvQuant::kNone) {  // values still in the cache?
                case KvQuant::kNone:
                    if (raw_values) accumulate_values_avx2<kD, kPv, Bf16>(sr, sc.width, n_max, sc, ps, acc);
                    else accumulate_values_avx2<kD, kPv>(sr, sc.width, n_max, sc, ps, acc);
                    break;
                case KvQuant::kFp16: accumulate_values_avx2<kD, kPv, Half>(sr, sc.width, n_max, sc, ps, acc); break;
                case KvQuant::kInt8: accumulate_values_avx2<kD, kPv, Int8Code>(sr, sc.width, n_max, sc, ps, acc); break;
                case KvQuant::kFp8E4m3: accumulate_values_avx2<kD, kPv, E4m3Code>(sr, sc.width, n_max, sc, ps, acc); break;
            }
        }
        return;
    }
#else
    (void)raw_values;
#endif
#if PAGEDSERVE_ISA_NEON
    if constexpr (kD != 0) {
        scores_transposed_neon<kD, kR>(q, sc.k_t.data(), n_max, sc.width, s);
        softmax_rows<kD>(a, sc, m, kR, lo, hi, n_max, d_len);
        accumulate_values_neon<kD, kR>(s, sc.width, n_max, sc, ps, sc.acc.data() + m * d_len);
        return;
    }
#endif
    scores_transposed<kD, kR>(q, sc.k_t.data(), n_max, sc.width, d_len, s);
    softmax_rows<kD>(a, sc, m, kR, lo, hi, n_max, d_len);
    // D = 64 keeps 4 accumulators of 4 registers each; D = 128 takes 2 at a time.
    constexpr int kPv = std::min(kR, kD == 0 ? 1 : (kD <= 64 ? 4 : 2));
    for (int r = 0; r < kR; r += kPv)
        accumulate_values<kD, kPv>(s + r * sc.width, sc.width, n_max, sc, ps, d_len,
                                   sc.acc.data() + (m + r) * d_len);
}

// Normalizes the work item's accumulators and stores them to the output rows.
template <typename T, int kD>
void finish_item(const AttentionArgs& a, const WorkItem& w, Scratch& sc) {
    const std::int64_t d_len = kD ? kD : a.cache.head_size;
    const std::int64_t group = a.num_heads / a.cache.num_kv_heads;
    T* out = static_cast<T*>(a.out);
    for (std::int64_t m = 0; m < w.rows * group; ++m) {
        const std::int64_t tok = a.query_start_loc[w.req] + w.row0 + m / group;
        const std::int64_t head = w.kv_head * group + m % group;
        float* acc = sc.acc.data() + m * d_len;
        const float inv = 1.0f / sc.row_sum[m];  // > 0: every row sees at least its own key
        for (std::int64_t d = 0; d < d_len; ++d) acc[d] *= inv;
        store_row(acc, out + tok * a.out_token_stride + head * a.out_head_stride, d_len);
    }
}

template <typename T, int kD>
void attend_item(const AttentionArgs& a, const WorkItem& w, Scratch& sc) {
    const KvCacheView& c = a.cache;
    const std::int64_t d_len = kD ? kD : c.head_size;
    const std::int64_t m_len = w.rows * (a.num_heads / c.num_kv_heads);
    const std::int64_t q_len = a.query_start_loc[w.req + 1] - a.query_start_loc[w.req];
    const std::int64_t first_pos = a.seq_lens[w.req] - q_len + w.row0;  // position of row 0
    load_queries<T, kD>(a, w, sc);
    const std::int64_t num_keys = first_pos + w.rows;  // the last row's causal horizon
    // A decode item's few vectors read each value of a bf16, fp16 or 8-bit cache once: the AVX2
    // value step widens them from the cache itself (its steps exist for head sizes known at
    // compile time).
    const bool raw_values = PAGEDSERVE_ISA_AVX2 && kD != 0 && m_len < kWidenMinRows &&
                            (std::is_same_v<T, Bf16> || c.quant != KvQuant::kNone);
    for (std::int64_t key0 = first_block(a, first_pos, sc); key0 < num_keys;
         key0 += sc.block_keys) {
        const std::int64_t n = load_block<T>(a, w, key0, num_keys, d_len, raw_values, sc);
        std::int64_t m = 0;
        for (; m + kGroupRows <= m_len; m += kGroupRows)
            attend_rows<kD, kGroupRows>(a, sc, m, key0, n, first_pos, raw_values);
        // The last 1 to 3 vectors together (a decode step's GQA group of 3 is one pass: three
        // vectors' chains in flight, not one): a vector's arithmetic is the same either way.
        static_assert(kGroupRows == 4, "the tail below takes 1 to 3 vectors");
        switch (m_len - m) {
            case 3: attend_rows<kD, 3>(a, sc, m, key0, n, first_pos, raw_values); break;
            case 2: attend_rows<kD, 2>(a, sc, m, key0, n, first_pos, raw_values); break;
            case 1: attend_rows<kD, 1>(a, sc, m, key0, n, first_pos, raw_values); break;
            default: break;
        }
    }
    finish_item<T, kD>(a, w, sc);
}

#if PAGEDSERVE_ISA_AVX512
#include "attention/avx512_item.hpp"
#endif

// The AVX-512 item kernels take head sizes that are multiples of 32, every cache kind (a quantized
// one widened in registers); other head sizes take the loops, compiled for the level.
template <typename T, int kD>
void attend(const AttentionArgs& a, const WorkItem& w, Scratch& sc) {
#if PAGEDSERVE_ISA_AVX512
    if constexpr (kD != 0 && kD % 32 == 0) {
        switch (a.cache.quant) {
            case KvQuant::kNone: return attend_item_avx512<T, T, kD>(a, w, sc);
            case KvQuant::kFp16: return attend_item_avx512<T, Half, kD>(a, w, sc);
            case KvQuant::kInt8: return attend_item_avx512<T, Int8Code, kD>(a, w, sc);
            case KvQuant::kFp8E4m3: return attend_item_avx512<T, E4m3Code, kD>(a, w, sc);
        }
    }
#endif
    attend_item<T, kD>(a, w, sc);
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
        const std::int64_t keys = a.seq_lens[w.req] - q_len + w.row0 + w.rows;
        work += w.rows * group * (a.sliding_window > 0 ? std::min(keys, a.sliding_window + w.rows)
                                                       : keys);
    }
    const int threads = work < kMinParallelWork ? 1 : std::min<std::int64_t>(num_threads, num_items);
#pragma omp parallel num_threads(threads)
    {
        Scratch& sc = thread_scratch(max_m, a.cache.head_size, a.cache.page_size);
#pragma omp for schedule(dynamic, 1)
        for (std::int64_t i = 0; i < num_items; ++i) attend<T, kD>(a, items[i], sc);
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

void attention(const AttentionArgs& args, int num_threads) {
    switch (args.dtype) {
        case DType::kFloat32: return run_attention_for_head_size<float>(args, num_threads);
        case DType::kBFloat16: return run_attention_for_head_size<Bf16>(args, num_threads);
        default: throw std::invalid_argument("CPU paged attention supports float32 and bfloat16");
    }
}

}  // namespace pagedserve::PAGEDSERVE_ISA_NS

#pragma GCC pop_options  // fp-contract
#ifdef PAGEDSERVE_ISA_TARGET
#pragma GCC pop_options
#endif
