// The int16 activation rows of the quantized linear kernels (layout.hpp, issue 42 item 5): per 32
// features d = max|x| / 32512 and q = round-half-even(x * (32512 / max|x|)), stored as two int8
// parts hi = round(q / 255) and lo = q - 255 hi (|hi|, |lo| <= 127), so that every int8 kernel
// takes them as two int8 rows and sums u * q = 255 (u * hi) + u * lo exactly in int32. A 135M model
// (SmolLM2) does not survive int8 activations; 2^15 steps per 32 features it does (bench/RESULTS.md).
// One plain loop at every level: the bytes are the same on every CPU.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "linear_quant/layout.hpp"

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

template <typename T>
void quantize_rows16(const T* x, std::int64_t x_stride, std::int64_t m, std::int64_t k,
                     std::uint8_t* out, int threads) {
    const std::int64_t row_bytes = activation_row_bytes(k, 2);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::int64_t r = 0; r < m; ++r) quantize_row16(x + r * x_stride, k, out + r * row_bytes);
}

}  // namespace

void quantize_activations16(const void* x, bool float32, std::int64_t x_stride, std::int64_t m,
                            std::int64_t k, std::uint8_t* out, int num_threads) {
    const int threads = m * k < (1 << 18) ? 1 : std::max(1, num_threads);
    if (float32) return quantize_rows16(static_cast<const float*>(x), x_stride, m, k, out, threads);
    quantize_rows16(static_cast<const std::uint16_t*>(x), x_stride, m, k, out, threads);
}

}  // namespace pagedserve::quant_detail
