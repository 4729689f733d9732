// The bf16 linear kernel against a double-precision loop, on each path the CPU has (AVX2,
// AVX-512 without AVX512-BF16, AVX512-BF16: linear_levels.hpp; the first two also bit for bit): shapes around every tile edge (rows 1-19 around the 8-row
// and 5-row micro-tiles, columns around 32, odd k), bias, a residual that is the output itself,
// fp32 and bf16 output, several threads; a row's bits in calls of any size; and the argument
// checks. The AMX path likewise (rows around its 16- and 32-row blocks, k around its 32-feature
// steps, a gated product), on the tiles emulated in software on any CPU with AVX512-BF16 and on
// the hardware's where the CPU has AMX (else it says it skips them). Below level avx2 the entry
// throws. Run under ASan/UBSan by tests/native/test_cpp_sanitized.py.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#if defined(__x86_64__)  // VDPBF16PS, for the test of its order
#include <immintrin.h>
#endif

#include "check.hpp"
#include "linear_levels.hpp"
#include "pagedserve/linear.hpp"

using namespace pagedserve;
using linear_levels::has_avx512_bf16;
using linear_levels::on_each_path;

namespace {

std::uint16_t to_bf16(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float from_bf16(std::uint16_t b) {
    const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

#if defined(__x86_64__)  // an x86 instruction
// One lane of VDPBF16PS: acc + x[0] w[0] + x[1] w[1] in the instruction's own order.
__attribute__((target("avx512f,avx512bf16"))) float dpbf16_lane(float acc, const std::uint16_t (&x)[2],
                                                                 const std::uint16_t (&w)[2]) {
    std::uint32_t xp, wp;
    std::memcpy(&xp, x, 4), std::memcpy(&wp, w, 4);
    const __m512 r = _mm512_dpbf16_ps(_mm512_set1_ps(acc),
                                      reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(xp))),
                                      reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(wp))));
    return _mm512_cvtss_f32(r);
}
#endif

std::vector<std::uint16_t> random_bf16(std::size_t n, std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<std::uint16_t> v(n);
    for (auto& x : v) x = to_bf16(dist(rng));
    return v;
}

struct Shape {
    std::int64_t m, n, k;
    bool bias, residual, fp32;
    int threads;
    std::int64_t amx_from_rows = 0;  // LinearArgs::amx_from_rows
    bool tile_order = false;         // LinearArgs::tile_order
};

// One product checked element by element; the residual is the output buffer itself.
bool matches(const Shape& s, std::mt19937& rng) {
    const std::int64_t x_stride = s.k + 3, out_stride = s.n + 5;  // padded rows
    auto x = random_bf16(s.m * x_stride, rng), w = random_bf16(s.n * s.k, rng);
    auto bias = random_bf16(s.n, rng), start = random_bf16(s.m * out_stride, rng);
    std::vector<std::uint16_t> packed(packed_linear_elements(s.n, s.k));
    pack_linear_weight_bf16(w.data(), s.n, s.k, packed.data(), s.threads);
    std::vector<std::uint16_t> out16 = start;
    std::vector<float> out32(s.m * out_stride, 7.0f);
    LinearArgs a;
    a.x = x.data(), a.x_stride = x_stride, a.packed = packed.data();
    a.bias = s.bias ? bias.data() : nullptr;
    a.residual = s.residual && !s.fp32 ? out16.data() : nullptr;  // in place
    a.residual_stride = out_stride;
    a.out = s.fp32 ? static_cast<void*>(out32.data()) : static_cast<void*>(out16.data());
    a.out_stride = out_stride, a.out_float32 = s.fp32, a.m = s.m, a.n = s.n, a.k = s.k;
    a.amx_from_rows = s.amx_from_rows, a.tile_order = s.tile_order;
    linear_bf16(a, s.threads);
    for (std::int64_t i = 0; i < s.m; ++i) {
        for (std::int64_t j = 0; j < out_stride; ++j) {
            const std::int64_t at = i * out_stride + j;
            if (j >= s.n) {  // padding past n is never written
                if (s.fp32 ? out32[at] != 7.0f : out16[at] != start[at]) return false;
                continue;
            }
            double want = s.bias ? from_bf16(bias[j]) : 0.0;
            if (a.residual) want += from_bf16(start[at]);
            for (std::int64_t t = 0; t < s.k; ++t)
                want += double(from_bf16(x[i * x_stride + t])) * from_bf16(w[j * s.k + t]);
            const double got = s.fp32 ? out32[at] : from_bf16(out16[at]);
            const double tol = s.fp32 ? 1e-4 * (1 + std::fabs(want)) : 8e-3 * (1 + std::fabs(want));
            if (std::fabs(got - want) > tol) return false;
        }
    }
    return true;
}

TEST(linear_matches_reference_around_tile_edges) {
    on_each_path([&](const char*) {
        std::mt19937 rng(7);
        for (std::int64_t m : {1, 2, 3, 5, 7, 8, 9, 16, 19}) {
            for (std::int64_t n : {1, 31, 32, 33, 70}) {
                for (std::int64_t k : {1, 2, 9, 64}) {
                    const bool odd = (m + n + k) % 2 == 1;
                    CHECK(matches({m, n, k, odd, !odd, false, 1 + int(m % 2)}, rng));
                    CHECK(matches({m, n, k, !odd, false, true, 2}, rng));
                }
            }
        }
    });
}

TEST(linear_large_enough_to_run_threaded) {
    on_each_path([&](const char*) {
        std::mt19937 rng(11);
        CHECK(matches({300, 200, 96, true, true, false, 3}, rng));
        CHECK(matches({64, 576, 130, false, false, true, 2}, rng));
    });
}

// Long rows make panels of one to three tiles: the growing panel sizes, the prefetch of each
// next panel and the wrap to a share's first panel for the next chunk of rows all run.
TEST(linear_many_panels_and_row_chunks) {
    on_each_path([&](const char*) {
        std::mt19937 rng(12);
        CHECK(matches({270, 100, 2100, true, false, true, 2}, rng));
        CHECK(matches({20, 288, 1100, false, true, false, 1}, rng));
        CHECK(matches({13, 40, 1101, true, true, false, 2}, rng));  // odd k, several panels
    });
}

// Four threads per core: the OS preempts some mid-product and the others run the items of
// their shares they had not started. Whoever runs an item, the output is bit-identical to one
// thread's. Repeated until a take-over has happened (the first call nearly always has one).
TEST(linear_take_over_of_a_preempted_share_is_bit_identical) {
    on_each_path([&](const char*) {
        std::mt19937 rng(13);
        const std::int64_t m = 600, n = 2048, k = 320;  // 3 chunks of rows x 64 tiles
        const int threads = static_cast<int>(
            std::min<unsigned>(64, 4 * std::max(1u, std::thread::hardware_concurrency())));
        auto x = random_bf16(m * k, rng), w = random_bf16(n * k, rng);
        std::vector<std::uint16_t> packed(packed_linear_elements(n, k));
        pack_linear_weight_bf16(w.data(), n, k, packed.data(), 1);
        const auto run = [&](int threads) {
            std::vector<std::uint16_t> out(m * n);
            LinearArgs a;
            a.x = x.data(), a.x_stride = k, a.packed = packed.data(), a.out = out.data();
            a.out_stride = n, a.m = m, a.n = n, a.k = k;
            linear_bf16(a, threads);
            return out;
        };
        const auto one = run(1);
        const std::int64_t before = linear_items_taken_over();
        for (int attempt = 0; attempt < 200 && linear_items_taken_over() == before; ++attempt)
            CHECK(run(threads) == one);
        CHECK(linear_items_taken_over() > before);
    });
}

// Batch invariance on every path: a row's outputs (fp32, so every last bit shows; bf16 with a
// bias and residual; gated) are the same bits in calls of 1 .. 300 rows, on 1 or 3 threads, at
// any offset of the call's first row (micro-tiles of 8 and 5 rows, the 256-row chunks).
TEST(linear_rows_are_bit_identical_in_calls_of_any_size) {
    on_each_path([&](const char* path) {
        std::mt19937 rng(14);
        const std::int64_t m = 300, n = 70, k = 131, width = 24;
        auto x = random_bf16(m * k, rng), w = random_bf16(n * k, rng), bias = random_bf16(n, rng);
        auto residual = random_bf16(m * n, rng), wg = random_bf16(2 * width * k, rng);
        std::vector<std::uint16_t> packed(packed_linear_elements(n, k));
        std::vector<std::uint16_t> packed_gated(packed_linear_elements(gated_rows(width), k));
        pack_linear_weight_bf16(w.data(), n, k, packed.data(), 1);
        pack_gated_weight_bf16(wg.data(), width, k, packed_gated.data(), 1);
        // Rows [row0, row0 + rows): fp32 out, bf16 out with bias and residual, gated bf16 out.
        const auto run = [&](std::int64_t row0, std::int64_t rows, int threads) {
            std::vector<float> f32(rows * n);
            std::vector<std::uint16_t> b16(rows * n), gated(rows * width);
            LinearArgs a;
            a.x = x.data() + row0 * k, a.x_stride = k, a.packed = packed.data();
            a.m = rows, a.n = n, a.k = k, a.out = f32.data(), a.out_stride = n;
            a.out_float32 = true;
            linear_bf16(a, threads);
            a.out = b16.data(), a.out_float32 = false, a.bias = bias.data();
            a.residual = residual.data() + row0 * n, a.residual_stride = n;
            linear_bf16(a, threads);
            LinearArgs g;
            g.x = a.x, g.x_stride = k, g.packed = packed_gated.data(), g.m = rows;
            g.n = gated_rows(width), g.k = k, g.gated_width = width, g.out = gated.data();
            g.out_stride = width;
            linear_bf16(g, threads);
            return std::make_tuple(f32, b16, gated);
        };
        const auto [all32, all16, all_gated] = run(0, m, 2);
        for (std::int64_t rows : {1, 4, 5, 7, 8, 64, 257}) {
            for (std::int64_t row0 : {std::int64_t{0}, std::int64_t{3}, m - rows}) {
                for (int threads : {1, 3}) {
                    const auto [f32, b16, gated] = run(row0, rows, threads);
                    CHECK(std::equal(f32.begin(), f32.end(), all32.begin() + row0 * n));
                    CHECK(std::equal(b16.begin(), b16.end(), all16.begin() + row0 * n));
                    CHECK(std::equal(gated.begin(), gated.end(), all_gated.begin() + row0 * width));
                }
            }
        }
        std::fprintf(stderr, "  %s: rows bit-identical in calls of 1 .. 300\n", path);
    });
}

// The bf16 path at avx512 (pairs widened by shifts, 16 lanes) gives the AVX2 path's bits: fp32
// out, bf16 out with bias and an in-place residual, gated (gates up to ~+-200: exp's underflow
// and overflow), rows around both paths' micro-tiles (8 and 5), odd k, several threads.
TEST(linear_bf16_avx512_equals_avx2_bit_for_bit) {
    if (!linear_levels::has_level(CpuIsa::kAvx512)) {
        std::fprintf(stderr, "  (no AVX-512 on this CPU: only the AVX2 path, nothing to compare)\n");
        return;
    }
    const CpuIsa best = cpu_isa_supported();
    for (auto [m, n, k] : {std::array<std::int64_t, 3>{1, 70, 64}, {7, 33, 9}, {19, 200, 131},
                           {300, 100, 577}, {13, 1, 1}}) {
        std::mt19937 rng(m + n + k);
        const auto x = random_bf16(m * k, rng), w = random_bf16(n * k, rng);
        const auto bias = random_bf16(n, rng), start = random_bf16(m * n, rng);
        const std::int64_t width = 24;
        auto wg = random_bf16(2 * width * k, rng);
        for (auto& v : wg) v = to_bf16(30.0f * from_bf16(v));  // |gate| up to ~200
        std::vector<std::uint16_t> packed(packed_linear_elements(n, k));
        std::vector<std::uint16_t> packed_gated(packed_linear_elements(gated_rows(width), k));
        pack_linear_weight_bf16(w.data(), n, k, packed.data(), 1);
        pack_gated_weight_bf16(wg.data(), width, k, packed_gated.data(), 1);
        const auto run = [&](CpuIsa level) {
            set_cpu_isa(level);
            std::vector<float> f32(m * n);
            std::vector<std::uint16_t> fused = start, gated(m * width);
            LinearArgs a;
            a.x = x.data(), a.x_stride = k, a.packed = packed.data(), a.m = m, a.n = n, a.k = k;
            a.out = f32.data(), a.out_stride = n, a.out_float32 = true;
            linear_bf16(a, 2);
            a.out = fused.data(), a.out_float32 = false, a.bias = bias.data();
            a.residual = fused.data(), a.residual_stride = n;
            linear_bf16(a, 3);
            LinearArgs g;
            g.x = x.data(), g.x_stride = k, g.packed = packed_gated.data(), g.m = m;
            g.n = gated_rows(width), g.k = k, g.gated_width = width, g.out = gated.data();
            g.out_stride = width;
            linear_bf16(g, 2);
            const std::string path = linear_path();
            set_cpu_isa(best);
            return std::make_tuple(path, f32, fused, gated);
        };
        const auto avx2 = run(CpuIsa::kAvx2), avx512 = run(CpuIsa::kAvx512);
        CHECK(std::get<0>(avx2) == "avx2" && std::get<0>(avx512) == "avx512");
        CHECK(std::get<1>(avx2) == std::get<1>(avx512) && std::get<2>(avx2) == std::get<2>(avx512) &&
              std::get<3>(avx2) == std::get<3>(avx512));
    }
}

TEST(linear_refuses_bad_arguments) {
    on_each_path([&](const char*) {
        std::vector<std::uint16_t> x(64), packed(packed_linear_elements(4, 8)), out(64);
        LinearArgs a;
        a.x = x.data(), a.x_stride = 8, a.packed = packed.data(), a.out = out.data();
        a.out_stride = 4, a.m = 2, a.n = 4, a.k = 8;
        linear_bf16(a, 1);  // valid
        LinearArgs bad = a;
        bad.x_stride = 7;
        CHECK_THROWS(std::invalid_argument, linear_bf16(bad, 1));
        bad = a, bad.out_stride = 3;
        CHECK_THROWS(std::invalid_argument, linear_bf16(bad, 1));
        bad = a, bad.k = 0;
        CHECK_THROWS(std::invalid_argument, linear_bf16(bad, 1));
        bad = a, bad.packed = nullptr;
        CHECK_THROWS(std::invalid_argument, linear_bf16(bad, 1));
        CHECK_THROWS(std::invalid_argument,
                     pack_linear_weight_bf16(x.data(), 0, 8, packed.data(), 1));
        // No rows: nothing is touched, and torch's empty tensors carry null pointers.
        LinearArgs empty = a;
        empty.m = 0, empty.x = nullptr, empty.out = nullptr;
        linear_bf16(empty, 1);
    });
}

// Below level avx2 (portable on x86; every aarch64 level) there is no path: the entry refuses
// with std::runtime_error, linear_path() says "none", and packing (ISA-free) still works.
TEST(linear_below_avx2_throws_runtime_error) {
    const CpuIsa best = cpu_isa_supported();
    set_cpu_isa(CpuIsa::kPortable);
    CHECK(!linear_bf16_supported() && std::strcmp(linear_path(), "none") == 0);
    std::vector<std::uint16_t> x(64, 0x3f80), w(4 * 8, 0x3f80), out(64);
    std::vector<std::uint16_t> packed(packed_linear_elements(4, 8));
    CHECK(packed.size() == 4 * 2 * kLinearTileN);  // 4 feature pairs x 32 columns
    pack_linear_weight_bf16(w.data(), 4, 8, packed.data(), 1);
    CHECK(packed[0] == 0x3f80 && packed[2 * 4] == 0);  // column 4 of 4 is padding
    LinearArgs a;
    a.x = x.data(), a.x_stride = 8, a.packed = packed.data(), a.out = out.data();
    a.out_stride = 4, a.m = 2, a.n = 4, a.k = 8;
    CHECK_THROWS(std::runtime_error, linear_bf16(a, 1));
    CHECK(!linear_amx_supported());
    set_cpu_isa(best);
    // Each level's path by name (the AVX2 one also at avx2_vnni).
    for (CpuIsa level : {CpuIsa::kAvx2, CpuIsa::kAvx2Vnni, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
        if (!cpu_isa_covers(best, level) || !linear_bf16_supported()) continue;
        set_cpu_isa(level);
        const char* want = cpu_isa_at_least(CpuIsa::kAvx512Bf16) ? "avx512_bf16"
                           : cpu_isa_at_least(CpuIsa::kAvx512)   ? "avx512"
                                                                 : "avx2";
        CHECK(std::strcmp(linear_path(), want) == 0);
        CHECK(cpu_isa_at_least(CpuIsa::kAvx512Bf16) || !linear_amx_supported());
    }
    set_cpu_isa(best);
}

// --- AMX ---------------------------------------------------------------------------------------

// Runs `body` on the emulated tiles, then on the CPU's own where it has them.
template <typename Body>
void on_each_amx(Body body) {
    linear_amx_emulation(true);
    body();
    linear_amx_emulation(false);
    if (!linear_amx_supported()) {
        std::fprintf(stderr, "  (no AMX-BF16 on this CPU, or not granted: hardware tiles skipped)\n");
        return;
    }
    body();
}

// x W^T of m random rows (row i's values the same whatever m), fp32 out (not rounded to bf16:
// every difference in the sums shows).
std::vector<float> product(std::int64_t m, std::int64_t n, std::int64_t k,
                           std::int64_t amx_from_rows, int threads, bool tile_order = false) {
    std::mt19937 rng(21);
    const auto w = random_bf16(n * k, rng), x = random_bf16(m * k, rng);
    std::vector<std::uint16_t> packed(packed_linear_elements(n, k));
    std::vector<float> out(m * n);
    pack_linear_weight_bf16(w.data(), n, k, packed.data(), 1);
    LinearArgs a;
    a.x = x.data(), a.x_stride = k, a.packed = packed.data(), a.out = out.data();
    a.out_float32 = true, a.out_stride = n, a.m = m, a.n = n, a.k = k;
    a.amx_from_rows = amx_from_rows, a.tile_order = tile_order;
    linear_bf16(a, threads);
    return out;
}

TEST(linear_amx_matches_reference_around_block_edges) {
    if (!has_avx512_bf16()) return;
    on_each_amx([&] {
        std::mt19937 rng(17);
        for (std::int64_t m : {1, 9, 16, 17, 31, 32, 33, 50}) {
            for (std::int64_t n : {31, 32, 70}) {
                for (std::int64_t k : {9, 32, 33, 64, 100}) {  // none, whole and tail steps
                    const bool odd = (m + n + k) % 2 == 1;
                    CHECK(matches({m, n, k, odd, !odd, false, 1 + int(m % 2), 1}, rng));
                    CHECK(matches({m, n, k, !odd, false, true, 2, 1}, rng));
                }
            }
        }
        CHECK(matches({300, 200, 96, true, true, false, 3, 1}, rng));  // chunks, threads
        CHECK(matches({70, 100, 1100, false, true, true, 2, 1}, rng));  // panels of few tiles
    });
}

TEST(linear_amx_gated_matches_reference) {
    if (!has_avx512_bf16()) return;
    on_each_amx([&] {
        std::mt19937 rng(19);
        const std::int64_t m = 37, width = 40, k = 72;  // a partial block, tile, gate and step
        auto w = random_bf16(2 * width * k, rng), x = random_bf16(m * k, rng);
        std::vector<std::uint16_t> packed(packed_linear_elements(gated_rows(width), k));
        std::vector<std::uint16_t> out(m * width);
        pack_gated_weight_bf16(w.data(), width, k, packed.data(), 1);
        LinearArgs a;
        a.x = x.data(), a.x_stride = k, a.packed = packed.data(), a.out = out.data();
        a.out_stride = width, a.m = m, a.n = gated_rows(width), a.k = k, a.gated_width = width;
        a.amx_from_rows = 1;
        linear_bf16(a, 2);
        for (std::int64_t i = 0; i < m; ++i) {
            for (std::int64_t j = 0; j < width; ++j) {
                double gate = 0, up = 0;
                for (std::int64_t t = 0; t < k; ++t) {
                    const double xv = from_bf16(x[i * k + t]);
                    gate += xv * from_bf16(w[j * k + t]);
                    up += xv * from_bf16(w[(width + j) * k + t]);
                }
                const double want = gate / (1 + std::exp(-gate)) * up;
                CHECK(std::fabs(from_bf16(out[i * width + j]) - want) <= 8e-3 * (1 + std::fabs(want)));
            }
        }
    });
}

// amx_from_rows = 1: every call on the tiles, so a row's output is bit-identical whatever the
// rows around it (blocks of 32, of 17 .. 31 and of 1 .. 16 rows).
TEST(linear_amx_rows_are_bit_identical_in_calls_of_any_size) {
    if (!has_avx512_bf16()) return;
    on_each_amx([&] {
        const std::int64_t n = 64, k = 80;
        const auto all = product(70, n, k, 1, 2);
        for (std::int64_t m : {1, 5, 16, 17, 32, 33, 69}) {
            const auto some = product(m, n, k, 1, 1);
            CHECK(std::equal(some.begin(), some.end(), all.begin()));
        }
    });
}

// Below amx_from_rows a call is the AVX512-BF16 path's, bit for bit; 0 is never. The emulated
// tiles add a pair's products in the SDM's order (even feature first), VDPBF16PS in the other:
// some of the sums differ, which shows the tiles ran.
TEST(linear_amx_threshold_picks_the_path_by_rows) {
    if (!has_avx512_bf16()) return;
    on_each_amx([&] {
        for (std::int64_t m : {8, 40}) {
            CHECK(product(m, 64, 96, 41, 1) == product(m, 64, 96, 0, 1));
            CHECK(product(m, 64, 96, m, 1) == product(m, 64, 96, 1, 1));
        }
    });
    linear_amx_emulation(true);
    const std::int64_t items = linear_amx_items();
    CHECK(product(40, 64, 576, 1, 1) != product(40, 64, 576, 0, 1));
    CHECK(linear_amx_items() > items);  // its items ran on tiles
    linear_amx_emulation(false);
    LinearArgs bad;
    std::vector<std::uint16_t> x(64), packed(packed_linear_elements(4, 8)), out(64);
    bad.x = x.data(), bad.x_stride = 8, bad.packed = packed.data(), bad.out = out.data();
    bad.out_stride = 4, bad.m = 2, bad.n = 4, bad.k = 8, bad.amx_from_rows = -1;
    CHECK_THROWS(std::invalid_argument, linear_bf16(bad, 1));
}

// Rows summed in the tiles' order on AVX-512 (tile_order, below the threshold) equal the
// emulated tiles bit for bit: k with and without a tail, bias and residual, bf16 and fp32 out,
// gated; and they stay within the reference's tolerance.
TEST(linear_tile_order_equals_the_emulated_tiles) {
    if (!has_avx512_bf16()) return;
    linear_amx_emulation(true);
    for (std::int64_t k : {32, 72, 576, 33}) {
        for (std::int64_t m : {1, 9, 40}) {
            CHECK(product(m, 70, k, 0, 2, true) == product(m, 70, k, 1, 2));
            CHECK(product(m, 70, k, 1000, 1, true) == product(m, 70, k, m, 1, true));
        }
    }
    for (bool fp32 : {false, true}) {  // bias, an in-place residual; bf16 or fp32 out
        std::vector<std::uint16_t> outs16[2];
        std::vector<float> outs32[2];
        for (int tiles = 0; tiles < 2; ++tiles) {
            std::mt19937 rng(31);
            const std::int64_t m = 21, n = 50, k = 100;
            auto x = random_bf16(m * k, rng), w = random_bf16(n * k, rng);
            auto bias = random_bf16(n, rng);
            outs16[tiles] = random_bf16(m * n, rng);
            outs32[tiles].assign(m * n, 0.0f);
            std::vector<std::uint16_t> packed(packed_linear_elements(n, k));
            pack_linear_weight_bf16(w.data(), n, k, packed.data(), 1);
            LinearArgs a;
            a.x = x.data(), a.x_stride = k, a.packed = packed.data(), a.bias = bias.data();
            a.residual = fp32 ? nullptr : outs16[tiles].data(), a.residual_stride = n;
            a.out = fp32 ? static_cast<void*>(outs32[tiles].data())
                         : static_cast<void*>(outs16[tiles].data());
            a.out_float32 = fp32, a.out_stride = n, a.m = m, a.n = n, a.k = k;
            a.tile_order = true, a.amx_from_rows = tiles ? 1 : 0;
            linear_bf16(a, 2);
        }
        CHECK(outs16[0] == outs16[1] && outs32[0] == outs32[1]);
    }
    {  // gated
        std::vector<std::uint16_t> outs[2];
        for (int tiles = 0; tiles < 2; ++tiles) {
            std::mt19937 rng(37);
            const std::int64_t m = 19, width = 40, k = 72;
            auto w = random_bf16(2 * width * k, rng), x = random_bf16(m * k, rng);
            std::vector<std::uint16_t> packed(packed_linear_elements(gated_rows(width), k));
            outs[tiles].assign(m * width, 0);
            pack_gated_weight_bf16(w.data(), width, k, packed.data(), 1);
            LinearArgs a;
            a.x = x.data(), a.x_stride = k, a.packed = packed.data(), a.out = outs[tiles].data();
            a.out_stride = width, a.m = m, a.n = gated_rows(width), a.k = k;
            a.gated_width = width, a.tile_order = true, a.amx_from_rows = tiles ? 1 : 0;
            linear_bf16(a, 2);
        }
        CHECK(outs[0] == outs[1]);
    }
    {  // denormals: bf16 inputs below 2^-126 read as zero, sums below it flushed
        const std::int64_t m = 2, n = 32, k = 64;
        std::vector<std::uint16_t> x(m * k, to_bf16(1e-20f)), w(n * k, to_bf16(1e-20f));
        x[1] = 0x0003, w[1] = 0x3f80, x[k + 5] = to_bf16(1.0f), w[5] = to_bf16(2e-38f);
        std::vector<std::uint16_t> packed(packed_linear_elements(n, k));
        pack_linear_weight_bf16(w.data(), n, k, packed.data(), 1);
        std::vector<float> outs[2];
        for (int tiles = 0; tiles < 2; ++tiles) {
            outs[tiles].assign(m * n, -1.0f);
            LinearArgs a;
            a.x = x.data(), a.x_stride = k, a.packed = packed.data(), a.out = outs[tiles].data();
            a.out_float32 = true, a.out_stride = n, a.m = m, a.n = n, a.k = k;
            a.tile_order = true, a.amx_from_rows = tiles ? 1 : 0;
            linear_bf16(a, 1);
        }
        CHECK(outs[0] == outs[1]);
        CHECK(outs[0][0] == 0.0f);  // 64 products of 1e-40 each: every partial sum flushed
    }
    linear_amx_emulation(false);
    std::mt19937 rng(41);
    for (std::int64_t k : {9, 64, 100})
        CHECK(matches({23, 70, k, true, true, false, 2, 0, true}, rng));
}

// VDPBF16PS adds a pair's odd feature first and rounds after each add (the SDM's pseudo-code),
// which the AMX emulation's order is the mirror of and LinearArgs::tile_order relies on: over
// random accumulators and pairs spanning 2^-12 .. 2^12, every result equals that sequence.
TEST(vdpbf16ps_adds_odd_feature_first_rounding_each_add) {
#if !defined(__x86_64__)  // dpbf16_lane is x86 only
    std::fprintf(stderr, "  (not x86-64: no VDPBF16PS, skipped)\n");
#else
    if (!has_avx512_bf16()) return;
    std::mt19937 rng(43);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::uniform_int_distribution<int> scale(-12, 12);
    const auto draw = [&] { return unit(rng) * std::ldexp(1.0f, scale(rng)); };
    std::int64_t equal = 0, even_first = 0;
    const std::int64_t cases = 20000;
    for (std::int64_t i = 0; i < cases; ++i) {
        const float acc = draw();
        const std::uint16_t x[2] = {to_bf16(draw()), to_bf16(draw())};
        const std::uint16_t w[2] = {to_bf16(unit(rng)), to_bf16(unit(rng))};
        const float got = dpbf16_lane(acc, x, w);
        volatile float p0 = from_bf16(x[0]) * from_bf16(w[0]), p1 = from_bf16(x[1]) * from_bf16(w[1]);
        volatile float odd = acc + p1, even = acc + p0;
        equal += got == odd + p0;
        even_first += got == even + p1;
    }
    CHECK(equal == cases);
    CHECK(even_first < cases);  // the order shows: the mirror order differs somewhere
#endif
}

// Whether the CPU's tiles round as the SDM's pseudo-code (the emulation) and as each AVX-512
// order is printed for bench/amx_check.sh (it decides --deterministic's thresholds); asserted:
// every output within fp32 reordering of the other paths.
TEST(linear_amx_hardware_against_emulation_and_avx512) {
    if (!has_avx512_bf16() || !linear_amx_supported()) return;
    const std::int64_t m = 64, n = 256, k = 576;
    const auto hardware = product(m, n, k, 1, 2), avx512 = product(m, n, k, 0, 2);
    const auto tile_order = product(m, n, k, 0, 2, true);
    linear_amx_emulation(true);
    const auto emulated = product(m, n, k, 1, 2);
    linear_amx_emulation(false);
    const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
        std::int64_t equal = 0;
        for (std::size_t i = 0; i < a.size(); ++i) equal += a[i] == b[i];
        return equal;
    };
    std::fprintf(stderr,
                 "  AMX tiles vs emulation: %lld of %lld outputs equal; vs AVX512-BF16: %lld; "
                 "vs AVX-512 in the tiles' order: %lld\n",
                 static_cast<long long>(same(hardware, emulated)), static_cast<long long>(m * n),
                 static_cast<long long>(same(hardware, avx512)),
                 static_cast<long long>(same(hardware, tile_order)));
    for (std::size_t i = 0; i < hardware.size(); ++i) {
        for (const auto* other : {&emulated, &avx512, &tile_order})
            CHECK(std::fabs(hardware[i] - (*other)[i]) <= 1e-5f * (1.0f + std::fabs(hardware[i])));
    }
}

}  // namespace

int main() { return check::run_all_tests(); }
