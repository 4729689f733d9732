// The per-row int8 activations of the quantized linear kernels (linear_quant/layout.hpp): per 32
// features d = max|x| / 127 and q = round-half-even(x * (127 / max|x|)), with the fp32 sums
// d * sum(q) per 16 and per 32 features. AVX-512, AVX2 and NEON paths (by the ISA level) and a
// plain loop elsewhere give the same bytes (IEEE division and product, the same rounding, exact
// int sums).
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // the AVX-512 and AVX2 rows' intrinsics
#include <immintrin.h>
#endif
#if PAGEDSERVE_AARCH64  // the NEON rows' intrinsics
#include <arm_neon.h>
#endif
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "linear_quant/layout.hpp"
#include "linear_quant/rows_avx2.hpp"
#include "pagedserve/cpu_features.hpp"

namespace pagedserve::quant_detail {
namespace {

// One block's outputs from its int sums.
void store_sums(float scale, int low, int high, std::int64_t b, float* d, float* sum32,
                float* sum16) {
    d[b] = scale;
    sum16[2 * b] = scale * static_cast<float>(low);
    sum16[2 * b + 1] = scale * static_cast<float>(high);
    sum32[b] = scale * static_cast<float>(low + high);
}

template <typename T>
void quantize_row(const T* x, std::int64_t k, std::uint8_t* out) {
    auto* q = reinterpret_cast<std::int8_t*>(out);
    float* d = reinterpret_cast<float*>(out + k);
    for (std::int64_t b = 0; b < k / kBlockK; ++b) {
        float v[kBlockK], amax = 0.0f;
        for (int i = 0; i < kBlockK; ++i) {
            v[i] = to_float(x, kBlockK * b + i);
            amax = std::max(amax, std::fabs(v[i]));
        }
        const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sums[2] = {0, 0};
        for (int i = 0; i < kBlockK; ++i) {
            const int qi = static_cast<int>(std::nearbyint(v[i] * inv));  // |qi| <= 127
            q[kBlockK * b + i] = static_cast<std::int8_t>(qi);
            sums[i / 16] += qi;
        }
        store_sums(scale, sums[0], sums[1], b, d, d + k / kBlockK, d + 2 * (k / kBlockK));
    }
}

#if PAGEDSERVE_X86  // the vector rows: elsewhere the plain loop alone
#define PAGEDSERVE_ACT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))

template <typename T>
PAGEDSERVE_ACT_TARGET __m512 load16(const T* x) {
    if constexpr (sizeof(T) == 4) {
        return _mm512_loadu_ps(x);
    } else {
        const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    }
}

// quantize_row with AVX-512: max|x| by a max reduction (exact), the same scalar scale and inverse,
// x * inv rounded by vcvtps2dq under the default round-to-nearest-even (as nearbyint).
template <typename T>
PAGEDSERVE_ACT_TARGET void quantize_row_avx512(const T* x, std::int64_t k, std::uint8_t* out) {
    auto* q = reinterpret_cast<std::int8_t*>(out);
    float* d = reinterpret_cast<float*>(out + k);
    for (std::int64_t b = 0; b < k / kBlockK; ++b) {
        const __m512 v0 = load16(x + kBlockK * b), v1 = load16(x + kBlockK * b + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(inv)));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(inv)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + kBlockK * b), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + kBlockK * b + 16), _mm512_cvtsepi32_epi8(q1));
        store_sums(scale, _mm512_reduce_add_epi32(q0), _mm512_reduce_add_epi32(q1), b, d,
                   d + k / kBlockK, d + 2 * (k / kBlockK));
    }
}

// quantize_row with AVX2, as the AVX-512 one: an exact max reduction, the same scalar scale and
// inverse, vcvtps2dq's round-to-nearest-even, exact int sums.
template <typename T>
PAGEDSERVE_ROWS_AVX2_TARGET void quantize_row_avx2(const T* x, std::int64_t k, std::uint8_t* out) {
    auto* q = reinterpret_cast<std::int8_t*>(out);
    float* d = reinterpret_cast<float*>(out + k);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (std::int64_t b = 0; b < k / kBlockK; ++b) {
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int i = 0; i < 4; ++i) {
            v[i] = load8(x + kBlockK * b + 8 * i);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float max_abs = _mm_cvtss_f32(m4);
        const float scale = max_abs / 127.0f, inv = max_abs > 0.0f ? 127.0f / max_abs : 0.0f;
        __m256i qi[4];
        for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));
        store_bytes(qi, q + kBlockK * b);  // |q| <= 127
        store_sums(scale, sum8(_mm256_add_epi32(qi[0], qi[1])), sum8(_mm256_add_epi32(qi[2], qi[3])),
                   b, d, d + k / kBlockK, d + 2 * (k / kBlockK));
    }
}
#endif  // PAGEDSERVE_X86

#if PAGEDSERVE_AARCH64  // the NEON rows (Advanced SIMD: every aarch64 CPU)
template <typename T>
float32x4_t load4(const T* x) {
    if constexpr (sizeof(T) == 4) {
        return vld1q_f32(x);
    } else {
        return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(x), 16));
    }
}

// quantize_row with NEON: max|x| by FMAXNM (exact, and like std::max it keeps the number where a
// lane is NaN), the same scalar scale and inverse, x * inv rounded by FCVTNS (to nearest even,
// as nearbyint), exact int sums; |q| <= 127, so the narrowing never saturates.
template <typename T>
void quantize_row_neon(const T* x, std::int64_t k, std::uint8_t* out) {
    auto* q = reinterpret_cast<std::int8_t*>(out);
    float* d = reinterpret_cast<float*>(out + k);
    for (std::int64_t b = 0; b < k / kBlockK; ++b) {
        float32x4_t v[8], amax = vdupq_n_f32(0.0f);
        for (int i = 0; i < 8; ++i) {
            v[i] = load4(x + kBlockK * b + 4 * i);
            amax = vmaxnmq_f32(amax, vabsq_f32(v[i]));
        }
        const float max_abs = vmaxnmvq_f32(amax);
        const float scale = max_abs / 127.0f, inv = max_abs > 0.0f ? 127.0f / max_abs : 0.0f;
        int32x4_t qi[8];
        for (int i = 0; i < 8; ++i) qi[i] = vcvtnq_s32_f32(vmulq_f32(v[i], vdupq_n_f32(inv)));
        for (int h = 0; h < 2; ++h) {  // 16 features: int32 -> int16 -> int8
            const int16x8_t lo = vcombine_s16(vqmovn_s32(qi[4 * h]), vqmovn_s32(qi[4 * h + 1]));
            const int16x8_t hi = vcombine_s16(vqmovn_s32(qi[4 * h + 2]), vqmovn_s32(qi[4 * h + 3]));
            vst1q_s8(q + kBlockK * b + 16 * h, vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)));
        }
        const int low = vaddvq_s32(vaddq_s32(vaddq_s32(qi[0], qi[1]), vaddq_s32(qi[2], qi[3])));
        const int high = vaddvq_s32(vaddq_s32(vaddq_s32(qi[4], qi[5]), vaddq_s32(qi[6], qi[7])));
        store_sums(scale, low, high, b, d, d + k / kBlockK, d + 2 * (k / kBlockK));
    }
}
#endif  // PAGEDSERVE_AARCH64

template <typename T>
void quantize_rows(const T* x, std::int64_t x_stride, std::int64_t m, std::int64_t k,
                   std::uint8_t* out, int threads, [[maybe_unused]] CpuIsa isa) {
    const std::int64_t row_bytes = activation_row_bytes(k);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::int64_t r = 0; r < m; ++r) {
#if PAGEDSERVE_X86  // the vector rows exist only there
        if (cpu_isa_covers(isa, CpuIsa::kAvx512)) {
            quantize_row_avx512(x + r * x_stride, k, out + r * row_bytes);
        } else if (cpu_isa_covers(isa, CpuIsa::kAvx2)) {
            quantize_row_avx2(x + r * x_stride, k, out + r * row_bytes);
        } else {
            quantize_row(x + r * x_stride, k, out + r * row_bytes);
        }
#elif PAGEDSERVE_AARCH64  // the NEON rows from level neon
        if (cpu_isa_covers(isa, CpuIsa::kNeon)) {
            quantize_row_neon(x + r * x_stride, k, out + r * row_bytes);
        } else {
            quantize_row(x + r * x_stride, k, out + r * row_bytes);
        }
#else
        quantize_row(x + r * x_stride, k, out + r * row_bytes);
#endif
    }
}

}  // namespace

void quantize_activations(const void* x, bool float32, std::int64_t x_stride, std::int64_t m,
                          std::int64_t k, std::uint8_t* out, int num_threads, bool portable) {
    const int threads = m * k < (1 << 18) ? 1 : std::max(1, num_threads);
    const CpuIsa isa = portable ? CpuIsa::kPortable : cpu_isa();
    if (float32) return quantize_rows(static_cast<const float*>(x), x_stride, m, k, out, threads, isa);
    quantize_rows(static_cast<const std::uint16_t*>(x), x_stride, m, k, out, threads, isa);
}

}  // namespace pagedserve::quant_detail
