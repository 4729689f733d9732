// The fp32 linear kernel against a double-precision loop around the tile edges (bias, in-place
// residual, gated SiLU-and-mul, several threads), and the batch invariance it exists for: a row's
// output is bit-identical in calls of any row count. Skips (passes) on a CPU without the kernel.
// Run under ASan/UBSan by tests/native/test_cpp_sanitized.py.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "check.hpp"
#include "pagedserve/linear.hpp"

using namespace pagedserve;

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

}  // namespace

TEST(linear_f32_matches_reference_around_tile_edges) {
    if (!linear_bf16_supported()) return;
    std::mt19937 rng(5);
    for (std::int64_t m : {1, 7, 8, 9, 19})
        for (std::int64_t n : {1, 31, 32, 33, 70})
            for (std::int64_t k : {1, 2, 9, 64}) CHECK(matches(m, n, k, 1 + int(m % 2), rng));
    CHECK(matches(300, 200, 96, 2, rng));
    CHECK(matches(270, 100, 2100, 2, rng));  // several panels and row chunks
}

TEST(linear_f32_gated_matches_reference) {
    if (!linear_bf16_supported()) return;
    std::mt19937 rng(6);
    const std::int64_t m = 11, width = 40, k = 33;
    const auto w = random_floats(2 * width * k, rng), x = random_floats(m * k, rng);
    std::vector<float> packed(packed_linear_elements_f32(gated_rows(width), k)), out(m * width);
    pack_gated_weight_f32(w.data(), width, k, packed.data(), 1);
    LinearF32Args a;
    a.x = x.data(), a.x_stride = k, a.packed = packed.data(), a.out = out.data();
    a.out_stride = width, a.m = m, a.n = gated_rows(width), a.k = k, a.gated_width = width;
    linear_f32(a, 2);
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
}

TEST(linear_f32_rows_are_bit_identical_in_calls_of_any_size) {
    if (!linear_bf16_supported()) return;
    std::mt19937 rng(8);
    const Problem p(300, 70, 130, rng);
    std::vector<float> all(300 * p.out_stride);
    linear_f32(p.args(all.data(), 300), 2);
    for (std::int64_t rows : {1, 7, 64}) {
        for (std::int64_t row0 : {std::int64_t{0}, 300 - rows}) {
            std::vector<float> part(rows * p.out_stride);
            linear_f32(p.args(part.data(), rows, row0), 1);
            for (std::int64_t i = 0; i < rows; ++i)
                CHECK(std::memcmp(&part[i * p.out_stride], &all[(row0 + i) * p.out_stride],
                                  sizeof(float) * p.n) == 0);
        }
    }
}

TEST(linear_f32_refuses_bad_arguments) {
    if (!linear_bf16_supported()) return;
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
}

// Without AVX512-BF16 (older x86 CPUs, and every non-x86 one) the tests above skip; the entry
// refuses with std::runtime_error.
TEST(linear_f32_without_avx512_bf16_throws_runtime_error) {
    if (linear_bf16_supported()) return;
    std::fprintf(stderr, "  (no AVX512-BF16 on this CPU: the fp32 kernel tests skip)\n");
    std::mt19937 rng(10);
    const Problem p(2, 4, 8, rng);
    std::vector<float> out(2 * p.out_stride);
    CHECK_THROWS(std::runtime_error, linear_f32(p.args(out.data(), 2), 1));
}

int main() { return check::run_all_tests(); }
