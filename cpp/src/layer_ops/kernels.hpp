// The fused layer ops (dispatch.cpp has the overview), included once per ISA level by that
// level's file (portable.cpp, avx2.cpp, avx512.cpp), each time in its own namespace
// (PAGEDSERVE_ISA_NS) under its own target (PAGEDSERVE_ISA_TARGET; undefined: portable): the same
// plain loops, vectorized for the level, the same float32 bits (no contraction, explicit std::fma
// where torch fuses). The headers come before the target pragma (see attention/kernels.hpp).
#pragma once

// GCC contracts a * b + c into an FMA under -std=gnu++17; torch's kernels round each step. Set
// before the includes, so that inline helpers share the option and can still be inlined.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cpu/arch.hpp"
#include "layer_ops/levels.hpp"
#include "pagedserve/cpu_features.hpp"
#include "pagedserve/layer_ops.hpp"
#include "pagedserve/rows.hpp"

#ifdef PAGEDSERVE_ISA_TARGET
#pragma GCC push_options
PAGEDSERVE_TARGET_PRAGMA(PAGEDSERVE_ISA_TARGET)
#endif

namespace pagedserve::PAGEDSERVE_ISA_NS {
namespace {

constexpr std::int64_t kMinParallelElements = 1 << 15;  // below this, one thread is faster

// The sum of v[0, n) in the order torch's CPU sum reduces one contiguous row, for torch's vector
// width L: vectors are dealt round robin to 4 accumulators, which cascade through 4 levels every
// 2^power vectors each; leftover vectors join accumulator 0; the accumulators fold into the
// first; the scalar tail is summed from zero, then the first accumulator's lanes add on in order.
template <int L>
float torch_order_sum(const float* v, std::int64_t n) {
    constexpr int kIlp = 4, kLevels = 4;
    const std::int64_t num_vecs = n / L, steps = num_vecs / kIlp;
    std::int64_t ceil_log2 = 1;
    while (steps > 2 && (std::int64_t{1} << ceil_log2) < steps) ++ceil_log2;
    const std::int64_t power = std::max<std::int64_t>(4, ceil_log2 / kLevels);
    const std::int64_t level_step = std::int64_t{1} << power, level_mask = level_step - 1;
    float acc[kLevels][kIlp][L] = {};
    auto add = [](float* dst, const float* src) {
#pragma omp simd
        for (int l = 0; l < L; ++l) dst[l] += src[l];
    };
    auto add_step = [&](std::int64_t i) {
        for (int k = 0; k < kIlp; ++k) add(acc[0][k], v + (i * kIlp + k) * L);
    };
    std::int64_t i = 0;
    while (i + level_step <= steps) {
        for (std::int64_t j = 0; j < level_step; ++j, ++i) add_step(i);
        for (int level = 1; level < kLevels; ++level) {
            for (int k = 0; k < kIlp; ++k) {
                add(acc[level][k], acc[level - 1][k]);
                std::fill_n(acc[level - 1][k], L, 0.0f);
            }
            if ((i & (level_mask << (level * power))) != 0) break;
        }
    }
    for (; i < steps; ++i) add_step(i);
    for (int level = 1; level < kLevels; ++level)
        for (int k = 0; k < kIlp; ++k) add(acc[0][k], acc[level][k]);
    for (std::int64_t vec = steps * kIlp; vec < num_vecs; ++vec) add(acc[0][0], v + vec * L);
    for (int k = 1; k < kIlp; ++k) add(acc[0][0], acc[0][k]);
    float total = 0.0f;
    for (std::int64_t e = num_vecs * L; e < n; ++e) total += v[e];
    for (int l = 0; l < L; ++l) total += acc[0][0][l];
    return total;
}

float sum_in_torch_order(const float* v, std::int64_t n, int lanes) {
    if (lanes == 16 && n >= 16) return torch_order_sum<16>(v, n);
    if (lanes == 8 && n >= 8) return torch_order_sum<8>(v, n);
    return torch_order_sum<1>(v, n);  // rows narrower than a vector: torch sums them as scalars
}

// row = row / sqrt(mean(row^2) + eps) * weight, all in fp32; `squares` is scratch.
void normalize_row(float* row, const float* weight, float* squares, std::int64_t n, float eps,
                   int lanes) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) squares[i] = row[i] * row[i];
    const float mean = sum_in_torch_order(squares, n, lanes) / static_cast<float>(n);
    const float inv_rms = 1.0f / std::sqrt(mean + eps);
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) row[i] = row[i] * inv_rms * weight[i];
}

struct NormShape {
    std::int64_t num_rows, hidden_size;
    float eps;
    int lanes, num_threads;
};

// For every row r: load(r, row) fills the fp32 row, which is normalized in place and
// handed to store(r, row). Each thread owns its scratch rows and a fp32 copy of the weight.
template <typename T, typename Load, typename Store>
void for_each_norm_row(const T* weight, const NormShape& s, Load load, Store store) {
    const bool parallel = s.num_threads > 1 && s.num_rows > 1 &&
                          s.num_rows * s.hidden_size >= kMinParallelElements;
#pragma omp parallel num_threads(s.num_threads) if (parallel)
    {
        std::vector<float> w(s.hidden_size), row(s.hidden_size), scratch(s.hidden_size);
        load_row(weight, w.data(), s.hidden_size);
#pragma omp for schedule(static)
        for (std::int64_t r = 0; r < s.num_rows; ++r) {
            load(r, row.data());
            normalize_row(row.data(), w.data(), scratch.data(), s.hidden_size, s.eps, s.lanes);
            store(r, row.data());
        }
    }
}

template <typename T>
void rms_norm_impl(RowView out, RowView x, const T* weight, const NormShape& s) {
    const std::int64_t n = s.hidden_size;
    auto load = [&](std::int64_t r, float* row) {
        load_row(static_cast<const T*>(x.data) + r * x.row_stride, row, n);
    };
    auto store = [&](std::int64_t r, const float* row) {
        store_row(row, static_cast<T*>(out.data) + r * out.row_stride, n);
    };
    for_each_norm_row(weight, s, load, store);
}

template <typename T>
void rotary_impl(const RotaryArgs& a, int num_threads) {
    const std::int64_t d = a.head_size, half = d / 2;
    const bool parallel = num_threads > 1 && a.num_tokens > 1 &&
                          a.num_tokens * a.num_heads * d >= kMinParallelElements;
#pragma omp parallel num_threads(num_threads) if (parallel)
    {
        std::vector<float> cos(d), sin(d), x(d), y(d);
#pragma omp for schedule(static)
        for (std::int64_t t = 0; t < a.num_tokens; ++t) {
            load_row(static_cast<const T*>(a.cos.data) + t * a.cos.row_stride, cos.data(), d);
            load_row(static_cast<const T*>(a.signed_sin.data) + t * a.signed_sin.row_stride,
                     sin.data(), d);
            for (std::int64_t h = 0; h < a.num_heads; ++h) {
                T* head = static_cast<T*>(a.qk) + t * a.token_stride + h * a.head_stride;
                load_row(head, x.data(), d);
                // roll(x, half) pairs dim i with i + half; signed_sin carries rotate-half's sign.
                // torch's addcmul is one FMA onto the rounded x * cos.
#pragma omp simd
                for (std::int64_t i = 0; i < half; ++i) {
                    y[i] = std::fma(x[i + half], sin[i], x[i] * cos[i]);
                    y[i + half] = std::fma(x[i], sin[i + half], x[i + half] * cos[i + half]);
                }
                store_row(y.data(), head, d);
            }
        }
    }
}

// e^d as SLEEF's expf (1-ulp variant) computes it, the exp of torch's vectorized CPU kernels:
// d = q ln2 + s with a two-part ln2, a degree-6 polynomial in s with FMAs, then 2^q applied in
// two halves so that q near the exponent limits neither overflows nor flushes early.
inline float vector_exp(float d) {
    const float q = (d * 1.442695040888963407359924681001892137f + 12582912.0f) - 12582912.0f;
    float s = std::fma(q, -0.693145751953125f, d);
    s = std::fma(q, -1.428606765330187045e-06f, s);
    float u = 0.000198527617612853646278381f;
    u = std::fma(u, s, 0.00139304355252534151077271f);
    u = std::fma(u, s, 0.00833336077630519866943359f);
    u = std::fma(u, s, 0.0416664853692054748535156f);
    u = std::fma(u, s, 0.166666671633720397949219f);
    u = std::fma(u, s, 0.5f);
    u = 1.0f + std::fma(s * s, u, s);
    const std::int32_t qi = static_cast<std::int32_t>(q), q1 = qi >> 1, q2 = qi - q1;
    const std::uint32_t b1 = static_cast<std::uint32_t>(q1 + 127) << 23;
    const std::uint32_t b2 = static_cast<std::uint32_t>(q2 + 127) << 23;
    float p1, p2;
    std::memcpy(&p1, &b1, sizeof(float));
    std::memcpy(&p2, &b2, sizeof(float));
    u = u * p1 * p2;
    u = d < -104.0f ? 0.0f : u;
    u = d > 100.0f ? INFINITY : u;
    return d != d ? d : u;
}

template <typename T>
void silu_and_mul_impl(RowView out, RowView gate_up, std::int64_t num_rows, std::int64_t n,
                       int torch_lanes, int num_threads) {
    // torch's vector loop covers each row in steps of two vectors (2 x 16 floats with its AVX512
    // kernels, 2 x 8 with AVX2) and leaves the rest to its scalar loop, whose exp is libm's; do
    // the same, for bit-equal results.
    const std::int64_t step = 2 * std::max(1, torch_lanes), vector_part = n / step * step;
    const bool parallel =
        num_threads > 1 && num_rows > 1 && num_rows * n >= kMinParallelElements / 2;
#pragma omp parallel num_threads(num_threads) if (parallel)
    {
        std::vector<float> gate(n), up(n);
#pragma omp for schedule(static)
        for (std::int64_t r = 0; r < num_rows; ++r) {
            const T* row = static_cast<const T*>(gate_up.data) + r * gate_up.row_stride;
            load_row(row, gate.data(), n);
            load_row(row + n, up.data(), n);
#pragma omp simd
            for (std::int64_t i = 0; i < vector_part; ++i)
                gate[i] = gate[i] / (1.0f + vector_exp(-gate[i])) * up[i];
            for (std::int64_t i = vector_part; i < n; ++i)
                gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
            store_row(gate.data(), static_cast<T*>(out.data) + r * out.row_stride, n);
        }
    }
}

// Calls op(T{}) with T the storage type of dtype.
template <typename Op>
void with_storage_type(DType dtype, Op op) {
    if (dtype == DType::kFloat32)
        op(float{});
    else if (dtype == DType::kBFloat16)
        op(Bf16{});
    else
        throw std::invalid_argument("layer ops on CPU support float32 and bfloat16 only");
}

}  // namespace

void rms_norm(const RmsNormArgs& a, int num_threads) {
    const NormShape s{a.num_rows, a.hidden_size, a.eps, a.sum_lanes, std::max(1, num_threads)};
    with_storage_type(a.dtype, [&](auto tag) {
        rms_norm_impl(a.out, a.x, static_cast<const decltype(tag)*>(a.weight), s);
    });
}

void rotary(const RotaryArgs& args, int num_threads) {
    if (args.head_size % 2 != 0) throw std::invalid_argument("rotary head_size must be even");
    with_storage_type(args.dtype, [&](auto tag) {
        rotary_impl<decltype(tag)>(args, std::max(1, num_threads));
    });
}

void silu_and_mul(RowView out, RowView gate_up, std::int64_t num_rows,
                  std::int64_t intermediate_size, DType dtype, int torch_lanes, int num_threads) {
    with_storage_type(dtype, [&](auto tag) {
        silu_and_mul_impl<decltype(tag)>(out, gate_up, num_rows, intermediate_size, torch_lanes,
                                         std::max(1, num_threads));
    });
}

}  // namespace pagedserve::PAGEDSERVE_ISA_NS

#ifdef PAGEDSERVE_ISA_TARGET
#pragma GCC pop_options
#endif
