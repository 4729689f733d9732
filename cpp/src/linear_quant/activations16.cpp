// The int16 activation rows of the quantized linear kernels (layout.hpp, issue 42 item 5): per 32
// features d = max|x| / 32512 and q = round-half-even(x * (32512 / max|x|)), stored as two int8
// parts hi = round(q / 255) and lo = q - 255 hi (|hi|, |lo| <= 127), so that every int8 kernel
// takes them as two int8 rows and sums u * q = 255 (u * hi) + u * lo exactly in int32. A 135M model
// (SmolLM2) does not survive int8 activations; 2^15 steps per 32 features it does (bench/RESULTS.md).
// A plain loop, and from ISA level avx2 (x86) an AVX2 row that gives the same bytes (the same
// IEEE product and rounding, exact int arithmetic).
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // the AVX2 rows' intrinsics
#include <immintrin.h>
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

constexpr float kInt16Max = 32512.0f;  // 255 x 127 + 127: the largest q whose parts fit int8

template <typename T>
void quantize_row16(const T* x, std::int64_t k, std::uint8_t* out) {
    auto* hi = reinterpret_cast<std::int8_t*>(out);
    std::int8_t* lo = hi + k;
    float* d = reinterpret_cast<float*>(out + 2 * k);
    float* sum32 = d + k / kBlockK;
    float* sum16 = sum32 + k / kBlockK;
    for (std::int64_t b = 0; b < k / kBlockK; ++b) {
        float v[kBlockK], amax = 0.0f;
        for (int i = 0; i < kBlockK; ++i) {
            v[i] = to_float(x, kBlockK * b + i);
            amax = std::max(amax, std::fabs(v[i]));
        }
        const float scale = amax / kInt16Max, inv = amax > 0.0f ? kInt16Max / amax : 0.0f;
        int sums[2] = {0, 0};
        for (int i = 0; i < kBlockK; ++i) {
            // fmin / fmax: |q| <= 32512 even for a product rounded up (and NaN becomes a bound).
            const float r = std::fmin(std::fmax(std::nearbyint(v[i] * inv), -kInt16Max), kInt16Max);
            const int q = static_cast<int>(r);
            const int h = q >= 0 ? (q + 127) / kInt16Radix : -((127 - q) / kInt16Radix);
            hi[kBlockK * b + i] = static_cast<std::int8_t>(h);
            lo[kBlockK * b + i] = static_cast<std::int8_t>(q - kInt16Radix * h);
            sums[i / 16] += q;
        }
        d[b] = scale;
        sum16[2 * b] = scale * static_cast<float>(sums[0]);
        sum16[2 * b + 1] = scale * static_cast<float>(sums[1]);
        sum32[b] = scale * static_cast<float>(sums[0] + sums[1]);
    }
}

#if PAGEDSERVE_X86  // the vector row: elsewhere the plain loop alone
// quantize_row16 with AVX2, op for op: max|x| with the running max second (max_ps then keeps it
// where |x| is NaN, as std::max does), the same scalar scale and inverse, the product clamped in
// float before vcvtps2dq rounds it to nearest even (max_ps(NaN, -32512) is -32512, as fmax),
// hi = sign(q) floor((|q| + 127) / 255) by a multiply-shift (exact for every |q| + 127 <= 32639).
template <typename T>
PAGEDSERVE_ROWS_AVX2_TARGET void quantize_row16_avx2(const T* x, std::int64_t k, std::uint8_t* out) {
    auto* hi = reinterpret_cast<std::int8_t*>(out);
    std::int8_t* lo = hi + k;
    float* d = reinterpret_cast<float*>(out + 2 * k);
    float* sum32 = d + k / kBlockK;
    float* sum16 = sum32 + k / kBlockK;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 top = _mm256_set1_ps(kInt16Max), bottom = _mm256_set1_ps(-kInt16Max);
    for (std::int64_t b = 0; b < k / kBlockK; ++b) {
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int i = 0; i < 4; ++i) {
            v[i] = load8(x + kBlockK * b + 8 * i);
            amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), amax);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float max_abs = _mm_cvtss_f32(m4);
        const float scale = max_abs / kInt16Max, inv = max_abs > 0.0f ? kInt16Max / max_abs : 0.0f;
        __m256i q[4], h[4], l[4];
        for (int i = 0; i < 4; ++i) {
            const __m256 p = _mm256_mul_ps(v[i], _mm256_set1_ps(inv));
            q[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(p, bottom), top));
            const __m256i a = _mm256_add_epi32(_mm256_abs_epi32(q[i]), _mm256_set1_epi32(127));
            const __m256i floor = _mm256_srli_epi32(_mm256_mullo_epi32(a, _mm256_set1_epi32(32897)), 23);
            h[i] = _mm256_sign_epi32(floor, q[i]);
            l[i] = _mm256_sub_epi32(q[i], _mm256_sub_epi32(_mm256_slli_epi32(h[i], 8), h[i]));
        }
        store_bytes(h, hi + kBlockK * b);
        store_bytes(l, lo + kBlockK * b);
        const int low = sum8(_mm256_add_epi32(q[0], q[1])), high = sum8(_mm256_add_epi32(q[2], q[3]));
        d[b] = scale;
        sum16[2 * b] = scale * static_cast<float>(low);
        sum16[2 * b + 1] = scale * static_cast<float>(high);
        sum32[b] = scale * static_cast<float>(low + high);
    }
}
#endif  // PAGEDSERVE_X86

template <typename T>
void quantize_rows16(const T* x, std::int64_t x_stride, std::int64_t m, std::int64_t k,
                     std::uint8_t* out, int threads, [[maybe_unused]] bool vector) {
    const std::int64_t row_bytes = activation_row_bytes(k, 2);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::int64_t r = 0; r < m; ++r) {
#if PAGEDSERVE_X86  // the vector row exists only there
        if (vector) {
            quantize_row16_avx2(x + r * x_stride, k, out + r * row_bytes);
            continue;
        }
#endif
        quantize_row16(x + r * x_stride, k, out + r * row_bytes);
    }
}

}  // namespace

void quantize_activations16(const void* x, bool float32, std::int64_t x_stride, std::int64_t m,
                            std::int64_t k, std::uint8_t* out, int num_threads, bool portable) {
    const int threads = m * k < (1 << 18) ? 1 : std::max(1, num_threads);
    const bool vector = !portable && cpu_isa_at_least(CpuIsa::kAvx2);
    if (float32) return quantize_rows16(static_cast<const float*>(x), x_stride, m, k, out, threads, vector);
    quantize_rows16(static_cast<const std::uint16_t*>(x), x_stride, m, k, out, threads, vector);
}

}  // namespace pagedserve::quant_detail
