// The fp32 linear kernel, on each path the CPU has (AVX2, AVX-512: linear_levels.hpp), against a
// double-precision loop around the tile edges (bias, in-place residual, gated SiLU-and-mul,
// several threads), and the batch invariance it exists for: a row's output is bit-identical in
// calls of any row count. The AVX2 path gives the AVX-512 one's bits where the CPU has both.
// Below level avx2 the entry throws. Run under ASan/UBSan by tests/native/test_cpp_sanitized.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <array>
#include <vector>

#include "check.hpp"
#include "linear_levels.hpp"
#include "pagedserve/linear.hpp"

using namespace pagedserve;
using linear_levels::has_avx512_bf16;
using linear_levels::on_each_path;

namespace {

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

struct Problem {
    std::int64_t m, n, k, x_stride, out_stride;
    std::vector<float> x, w, bias, packed;
    Problem(std::int64_t m, std::int64_t n, std::int64_t k, std::mt19937& rng)
        : m(m), n(n), k(k), x_stride(k + 3), out_stride(n + 5), x(random_floats(m * x_stride, rng)),
          w(random_floats(n * k, rng)), bias(random_floats(n, rng)),
          packed(packed_linear_elements_f32(n, k)) {
        pack_linear_weight_f32(w.data(), n, k, packed.data(), 2);
    }

    LinearF32Args args(float* out, std::int64_t rows, std::int64_t row0 = 0) const {
        LinearF32Args a;
        a.x = x.data() + row0 * x_stride, a.x_stride = x_stride, a.packed = packed.data();
        a.out = out, a.out_stride = out_stride, a.m = rows, a.n = n, a.k = k;
        return a;
    }

    double want(std::int64_t i, std::int64_t j) const {
        double sum = 0.0;
        for (std::int64_t t = 0; t < k; ++t) sum += double(x[i * x_stride + t]) * w[j * k + t];
        return sum;
    }
};

// fp32 sums of up to ~2000 terms of magnitude <= 1, against double precision.
bool close(double got, double want) { return std::fabs(got - want) <= 1e-4 * (1 + std::fabs(want)); }

// out = x W^T + bias + out (in place), checked element by element; padding is never written.
bool matches(std::int64_t m, std::int64_t n, std::int64_t k, int threads, std::mt19937& rng) {
    const Problem p(m, n, k, rng);
    std::vector<float> start = random_floats(m * p.out_stride, rng), out = start;
    LinearF32Args a = p.args(out.data(), m);
    a.bias = p.bias.data(), a.residual = out.data(), a.residual_stride = p.out_stride;
    linear_f32(a, threads);
    for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < p.out_stride; ++j) {
            const std::int64_t at = i * p.out_stride + j;
            if (j >= n ? out[at] != start[at] : !close(out[at], p.want(i, j) + p.bias[j] + start[at]))
                return false;
        }
    }
    return true;
}

TEST(linear_f32_matches_reference_around_tile_edges) {
    on_each_path([&](const char*) {
        std::mt19937 rng(5);
        for (std::int64_t m : {1, 2, 3, 6, 7, 8, 9, 19})
            for (std::int64_t n : {1, 31, 32, 33, 70})
                for (std::int64_t k : {1, 2, 9, 64}) CHECK(matches(m, n, k, 1 + int(m % 2), rng));
        CHECK(matches(300, 200, 96, 2, rng));
        CHECK(matches(270, 100, 2100, 2, rng));  // several panels and row chunks
    });
}

// out [m, width] = silu(x W_gate^T) * (x W_up^T) of a random gated product, `scale` on x.
std::vector<float> gated_product(std::int64_t m, std::int64_t width, std::int64_t k, float scale,
                                 std::vector<float>& x, std::vector<float>& w, std::mt19937& rng) {
    w = random_floats(2 * width * k, rng), x = random_floats(m * k, rng);
    for (float& v : x) v *= scale;
    std::vector<float> packed(packed_linear_elements_f32(gated_rows(width), k)), out(m * width);
    pack_gated_weight_f32(w.data(), width, k, packed.data(), 1);
    LinearF32Args a;
    a.x = x.data(), a.x_stride = k, a.packed = packed.data(), a.out = out.data();
    a.out_stride = width, a.m = m, a.n = gated_rows(width), a.k = k, a.gated_width = width;
    linear_f32(a, 2);
    return out;
}

TEST(linear_f32_gated_matches_reference) {
    on_each_path([&](const char*) {
        std::mt19937 rng(6);
        const std::int64_t m = 11, width = 40, k = 33;
        std::vector<float> x, w;
        const auto out = gated_product(m, width, k, 1.0f, x, w, rng);
        for (std::int64_t i = 0; i < m; ++i) {
            for (std::int64_t j = 0; j < width; ++j) {
                double gate = 0.0, up = 0.0;
                for (std::int64_t t = 0; t < k; ++t) {
                    gate += double(x[i * k + t]) * w[j * k + t];
                    up += double(x[i * k + t]) * w[(width + j) * k + t];
                }
                CHECK(close(out[i * width + j], gate / (1 + std::exp(-gate)) * up));
            }
        }
    });
}

TEST(linear_f32_rows_are_bit_identical_in_calls_of_any_size) {
    on_each_path([&](const char*) {
        std::mt19937 rng(8);
        const Problem p(300, 70, 130, rng);
        std::vector<float> all(300 * p.out_stride);
        linear_f32(p.args(all.data(), 300), 2);
        for (std::int64_t rows : {1, 2, 5, 6, 7, 64}) {
            for (std::int64_t row0 : {std::int64_t{0}, 300 - rows}) {
                std::vector<float> part(rows * p.out_stride);
                linear_f32(p.args(part.data(), rows, row0), 1);
                for (std::int64_t i = 0; i < rows; ++i)
                    CHECK(std::memcmp(&part[i * p.out_stride], &all[(row0 + i) * p.out_stride],
                                      sizeof(float) * p.n) == 0);
            }
        }
    });
}

// The AVX2 path and the AVX-512 one give the same bits: plain, with bias and an in-place
// residual, gated (gates up to +-200: exp's underflow and overflow), over micro-tile, tile and
// panel edges and several threads.
TEST(linear_f32_avx2_equals_avx512_bit_for_bit) {
    if (!linear_levels::has_level(CpuIsa::kAvx512)) {
        std::fprintf(stderr, "  (no AVX-512 on this CPU: only the AVX2 path, nothing to compare)\n");
        return;
    }
    const CpuIsa best = cpu_isa_supported();
    const auto on = [&](CpuIsa level, auto run) {
        set_cpu_isa(level);
        auto out = run();
        set_cpu_isa(best);
        return out;
    };
    // The AVX-512 kernel at avx512, and at avx512_bf16 where the CPU has it, against AVX2's bits.
    const auto same_bits = [&](auto run) {
        const auto avx2 = on(CpuIsa::kAvx2, run);
        return avx2 == on(CpuIsa::kAvx512, run) &&
               (!has_avx512_bf16() || avx2 == on(CpuIsa::kAvx512Bf16, run));
    };
    for (auto [m, n, k] : {std::array<std::int64_t, 3>{1, 70, 64}, {7, 33, 9}, {19, 200, 96},
                           {300, 100, 2100}, {13, 1, 1}}) {
        std::mt19937 rng(m + n + k);
        const Problem p(m, n, k, rng);
        const auto start = random_floats(m * p.out_stride, rng);
        const auto run = [&] {
            std::vector<float> plain(m * p.out_stride, 3.0f), fused = start;
            linear_f32(p.args(plain.data(), m), 2);
            LinearF32Args a = p.args(fused.data(), m);
            a.bias = p.bias.data(), a.residual = fused.data(), a.residual_stride = p.out_stride;
            linear_f32(a, 2);
            plain.insert(plain.end(), fused.begin(), fused.end());
            return plain;
        };
        CHECK(same_bits(run));
    }
    for (float scale : {1.0f, 30.0f}) {  // 30: |gate| up to ~200
        const auto run = [&] {
            std::mt19937 rng(17);
            std::vector<float> x, w;
            return gated_product(23, 40, 57, scale, x, w, rng);
        };
        CHECK(same_bits(run));
    }
}

TEST(linear_f32_refuses_bad_arguments) {
    on_each_path([&](const char*) {
        std::mt19937 rng(9);
        const Problem p(2, 4, 8, rng);
        std::vector<float> out(2 * p.out_stride);
        LinearF32Args bad = p.args(out.data(), 2);
        bad.x_stride = 7;
        CHECK_THROWS(std::invalid_argument, linear_f32(bad, 1));
        bad = p.args(out.data(), 2), bad.packed = nullptr;
        CHECK_THROWS(std::invalid_argument, linear_f32(bad, 1));
        CHECK_THROWS(std::invalid_argument,
                     pack_linear_weight_f32(p.w.data(), 0, 8, out.data(), 1));
    });
}

// Below level avx2 (portable on x86; every aarch64 level) the entry refuses with
// std::runtime_error.
TEST(linear_f32_below_avx2_throws_runtime_error) {
    const CpuIsa best = cpu_isa_supported();
    set_cpu_isa(CpuIsa::kPortable);
    std::mt19937 rng(10);
    const Problem p(2, 4, 8, rng);
    std::vector<float> out(2 * p.out_stride);
    CHECK_THROWS(std::runtime_error, linear_f32(p.args(out.data(), 2), 1));
    set_cpu_isa(best);
}

}  // namespace

int main() { return check::run_all_tests(); }
