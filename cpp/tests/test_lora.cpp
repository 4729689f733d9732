// The LoRA product (lora.hpp) against a straightforward reference: per row, low = x a (fp32 FMAs
// over k in order), delta = low b (over the part's rank columns in order), y += delta. Bit for
// bit, at every ISA level this CPU runs (the levels share the order); close to an fp64 reference;
// a row's result the same alone and in a mixed step (batch invariance); bf16 rows and stacks;
// bad arguments refused. Run under ASan/UBSan by tests/native/test_cpp_sanitized.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "check.hpp"
#include "pagedserve/cpu_features.hpp"
#include "pagedserve/lora.hpp"

using namespace pagedserve;

namespace {

constexpr std::int64_t kSlots = 3;

// A projection's sizes: k, the rank, and the parts' output widths (at most 3 here).
struct Shape {
    std::int64_t k, rank;
    std::vector<std::int64_t> parts;
    std::int64_t n() const {
        std::int64_t total = 0;
        for (std::int64_t w : parts) total += w;
        return total;
    }
    std::int64_t cols() const { return static_cast<std::int64_t>(parts.size()) * rank; }
};

// The first is the small fused qkv the tests below use; the others cover the kernel's register
// tiles and every narrower width after them (columns 24 = 16 + 8, 3, 40 = 32 + 8, 70 output
// columns = 64 + 4 + 2, odd k) on every level's vector width, and the last is work enough for
// the threads to split the blocks.
const std::vector<Shape> kShapes = {{40, 4, {24, 8, 8}},
                                    {67, 8, {70, 16, 19}},
                                    {33, 3, {41}},
                                    {130, 20, {50, 37}},
                                    {401, 16, {256, 163}}};
const Shape& kSmall = kShapes[0];

float bf16_value(float f) {  // f rounded to bf16 (nearest even), as a float
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

std::uint16_t bf16_bits(float f) {
    std::uint32_t u;
    const float r = bf16_value(f);
    std::memcpy(&u, &r, sizeof(u));
    return static_cast<std::uint16_t>(u >> 16);
}

// Each slot's own rank: the full max_rank, one less, and 1 (the columns past it are zeros).
std::vector<std::int32_t> slot_ranks(const Shape& sh) {
    const auto r = static_cast<std::int32_t>(sh.rank);
    return {r, std::max(1, r - 1), 1};
}

struct Stacks {
    Shape shape;
    std::vector<std::int32_t> ranks;
    std::vector<float> a, b;  // [slots, k, cols], [slots, cols, n]: zero off each slot's blocks
    Stacks(std::mt19937& rng, const Shape& sh)
        : shape(sh), ranks(slot_ranks(sh)), a(kSlots * sh.k * sh.cols(), 0.0f),
          b(kSlots * sh.cols() * sh.n(), 0.0f) {
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        const std::int64_t cols = sh.cols(), n = sh.n();
        for (std::int64_t s = 0; s < kSlots; ++s) {
            std::int64_t j0 = 0;
            for (std::size_t p = 0; p < sh.parts.size(); ++p) {
                const std::int64_t c0 = p * sh.rank;
                for (std::int64_t c = c0; c < c0 + ranks[s]; ++c) {
                    // bf16 values: the bf16 run reads the same
                    for (std::int64_t i = 0; i < sh.k; ++i) {
                        a[(s * sh.k + i) * cols + c] = bf16_value(dist(rng));
                    }
                    for (std::int64_t j = j0; j < j0 + sh.parts[p]; ++j) {
                        b[(s * cols + c) * n + j] = bf16_value(dist(rng));
                    }
                }
                j0 += sh.parts[p];
            }
        }
    }
    LoraStacks view(DType dtype, const void* a_data, const void* b_data) const {
        LoraStacks s;
        s.a = a_data, s.b = b_data, s.ranks = ranks.data();
        s.num_slots = kSlots, s.k = shape.k, s.max_rank = shape.rank;
        s.num_parts = static_cast<int>(shape.parts.size()), s.dtype = dtype;
        for (int p = 0; p < s.num_parts; ++p) s.part_widths[p] = shape.parts[p];
        return s;
    }
};

// The reference: y[r] += (x[r] a[slot]) b[slot], in fp32 FMAs in the kernel's order, over the
// slot's own rank columns of each part.
void reference(const Stacks& w, const std::vector<float>& x, std::vector<float>& y,
               const std::vector<int>& row_slots) {
    const Shape& sh = w.shape;
    const std::int64_t k = sh.k, cols = sh.cols(), n = sh.n();
    for (std::size_t r = 0; r < row_slots.size(); ++r) {
        const int s = row_slots[r];
        if (s < 0) continue;
        std::vector<float> low(cols, 0.0f);
        std::int64_t j0 = 0;
        for (std::size_t p = 0; p < sh.parts.size(); ++p) {
            const std::int64_t c0 = p * sh.rank, c1 = c0 + w.ranks[s];
            for (std::int64_t i = 0; i < k; ++i) {
                for (std::int64_t c = c0; c < c1; ++c) {
                    low[c] = std::fma(x[r * k + i], w.a[(s * k + i) * cols + c], low[c]);
                }
            }
            for (std::int64_t j = j0; j < j0 + sh.parts[p]; ++j) {
                float acc = 0.0f;
                for (std::int64_t c = c0; c < c1; ++c) {
                    acc = std::fma(low[c], w.b[(s * cols + c) * n + j], acc);
                }
                y[r * n + j] += acc;
            }
            j0 += sh.parts[p];
        }
    }
}

// Segments of consecutive rows with one slot.
struct Segments {
    std::vector<std::int64_t> starts{0};
    std::vector<std::int32_t> slots;
    explicit Segments(const std::vector<int>& row_slots) {
        for (std::size_t r = 0; r < row_slots.size(); ++r) {
            if (r > 0 && row_slots[r] == slots.back()) {
                ++starts.back();
                continue;
            }
            slots.push_back(row_slots[r]);
            starts.push_back(static_cast<std::int64_t>(r) + 1);
        }
    }
    LoraSegments view() const {
        return {starts.data(), slots.data(), static_cast<std::int64_t>(slots.size())};
    }
};

std::vector<float> random_rows(std::mt19937& rng, std::int64_t n) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (float& f : v) f = bf16_value(dist(rng));
    return v;
}

std::vector<float> run_f32(const Stacks& w, const std::vector<float>& x, std::vector<float> y,
                           const std::vector<int>& row_slots, int threads) {
    const Segments seg(row_slots);
    LoraArgs a;
    a.x = x.data(), a.x_stride = w.shape.k, a.y = y.data(), a.y_stride = w.shape.n();
    a.stacks = w.view(DType::kFloat32, w.a.data(), w.b.data());
    a.segments = seg.view();
    lora_add_cpu(a, threads);
    return y;
}

// Levels this CPU runs, each set while body runs.
template <typename Body>
int on_each_level(Body body) {
    const CpuIsa best = cpu_isa_supported();
    int ran = 0;
    for (CpuIsa level : kCpuIsas) {
        if (!cpu_isa_covers(best, level) || set_cpu_isa(level) != level) continue;
        ++ran;
        body(lora_path());
    }
    set_cpu_isa(best);
    return ran;
}

// 21 rows: base rows, every slot, runs of one slot longer than a block, and short ones.
std::vector<int> mixed_slots() {
    std::vector<int> s = {-1, 0, 0, 2, -1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 0, -1, -1, 2, 1};
    return s;
}

}  // namespace

TEST(matches_the_reference_bit_for_bit_at_every_level) {
    std::mt19937 rng(1);
    bool ok = true;
    for (const Shape& shape : kShapes) {
        const Stacks w(rng, shape);
        const std::int64_t k = shape.k, n = shape.n();
        const std::vector<int> slots = mixed_slots();
        const std::int64_t m = static_cast<std::int64_t>(slots.size());
        const std::vector<float> x = random_rows(rng, m * k), y0 = random_rows(rng, m * n);
        std::vector<float> want = y0;
        reference(w, x, want, slots);
        const int ran = on_each_level([&](const char* path) {
            for (int threads : {1, 2}) {
                const std::vector<float> got = run_f32(w, x, y0, slots, threads);
                const bool same =
                    std::memcmp(got.data(), want.data(), sizeof(float) * got.size()) == 0;
                std::fprintf(stderr, "  k %lld, rank %lld, %zu parts: %s, %d threads: %s\n",
                             static_cast<long long>(k), static_cast<long long>(shape.rank),
                             shape.parts.size(), path, threads, same ? "same bits" : "DIFFER");
                ok = ok && same;
            }
        });
        CHECK(ran >= 1);
        // Base rows are untouched; the fp64 product is close.
        for (std::int64_t r = 0; r < m; ++r) {
            std::int64_t part = 0, part_end = shape.parts[0];
            for (std::int64_t j = 0; j < n; ++j) {
                if (j == part_end) part_end += shape.parts[++part];
                if (slots[r] < 0) {
                    CHECK(want[r * n + j] == y0[r * n + j]);
                    continue;
                }
                double delta = 0.0;
                for (std::int64_t c = part * shape.rank; c < (part + 1) * shape.rank; ++c) {
                    double low = 0.0;
                    for (std::int64_t i = 0; i < k; ++i) {
                        low += double(x[r * k + i]) * w.a[(slots[r] * k + i) * shape.cols() + c];
                    }
                    delta += low * w.b[(slots[r] * shape.cols() + c) * n + j];
                }
                const double error = std::fabs(want[r * n + j] - (y0[r * n + j] + delta));
                CHECK(error < 1e-4 * (1 + std::fabs(delta)));
            }
        }
    }
    CHECK(ok);
}

TEST(a_row_is_the_same_alone_and_in_a_mixed_step) {
    std::mt19937 rng(2);
    const Stacks w(rng, kShapes[1]);
    const std::int64_t k = w.shape.k, n = w.shape.n();
    const std::vector<int> slots = mixed_slots();
    const std::int64_t m = static_cast<std::int64_t>(slots.size());
    const std::vector<float> x = random_rows(rng, m * k), y0 = random_rows(rng, m * n);
    const std::vector<float> mixed = run_f32(w, x, y0, slots, 2);
    for (std::int64_t r = 0; r < m; ++r) {
        const std::vector<float> xr(x.begin() + r * k, x.begin() + (r + 1) * k);
        const std::vector<float> yr(y0.begin() + r * n, y0.begin() + (r + 1) * n);
        const std::vector<float> alone = run_f32(w, xr, yr, {slots[r]}, 1);
        CHECK(std::memcmp(alone.data(), mixed.data() + r * n, sizeof(float) * n) == 0);
    }
}

TEST(a_slot_of_rank_0_adds_nothing) {
    std::mt19937 rng(5);
    Stacks w(rng, kShapes[1]);
    const std::int64_t k = w.shape.k, n = w.shape.n();
    const std::vector<int> slots = mixed_slots();
    const std::int64_t m = static_cast<std::int64_t>(slots.size());
    const std::vector<float> x = random_rows(rng, m * k), y0 = random_rows(rng, m * n);
    w.ranks[1] = 0;  // slot 1 emptied (its weights stay: the rank alone says what is read)
    std::vector<float> want = y0;
    reference(w, x, want, slots);
    const std::vector<float> got = run_f32(w, x, y0, slots, 2);
    CHECK(std::memcmp(got.data(), want.data(), sizeof(float) * got.size()) == 0);
    for (std::int64_t r = 0; r < m; ++r) {
        if (slots[r] != 1) continue;
        CHECK(std::memcmp(got.data() + r * n, y0.data() + r * n, sizeof(float) * n) == 0);
    }
}

TEST(bf16_rows_and_stacks_round_once) {
    std::mt19937 rng(3);
    const Stacks w(rng, kShapes[3]);
    const std::int64_t k = w.shape.k, n = w.shape.n();
    const std::vector<int> slots = mixed_slots();
    const std::int64_t m = static_cast<std::int64_t>(slots.size());
    const std::vector<float> x = random_rows(rng, m * k), y0 = random_rows(rng, m * n);
    std::vector<std::uint16_t> a16, b16, x16, y16;
    for (float v : w.a) a16.push_back(bf16_bits(v));
    for (float v : w.b) b16.push_back(bf16_bits(v));
    for (float v : x) x16.push_back(bf16_bits(v));
    for (float v : y0) y16.push_back(bf16_bits(v));
    // The fp32 result of the same values, rounded once to bf16, is the bf16 run's.
    const std::vector<float> want = run_f32(w, x, y0, slots, 1);
    const Segments seg(slots);
    const int ran = on_each_level([&](const char*) {
        std::vector<std::uint16_t> y = y16;
        LoraArgs a;
        a.x = x16.data(), a.x_stride = k, a.x_dtype = DType::kBFloat16;
        a.y = y.data(), a.y_stride = n, a.y_dtype = DType::kBFloat16;
        a.stacks = w.view(DType::kBFloat16, a16.data(), b16.data());
        a.segments = seg.view();
        lora_add_cpu(a, 2);
        for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == bf16_bits(want[i]));
    });
    CHECK(ran >= 1);
}

TEST(bad_arguments_are_refused) {
    std::mt19937 rng(4);
    const Stacks w(rng, kSmall);
    const std::int64_t k = w.shape.k, n = w.shape.n();
    const std::vector<float> x = random_rows(rng, 2 * k);
    std::vector<float> y(2 * n);
    const auto refused = [&](auto edit) {
        const Segments seg({0, 1});
        LoraArgs a;
        a.x = x.data(), a.x_stride = k, a.y = y.data(), a.y_stride = n;
        a.stacks = w.view(DType::kFloat32, w.a.data(), w.b.data());
        a.segments = seg.view();
        std::vector<std::int64_t> starts = seg.starts;
        std::vector<std::int32_t> slots = seg.slots;
        a.segments.starts = starts.data(), a.segments.slots = slots.data();
        edit(a, starts, slots);
        try {
            lora_add_cpu(a, 1);
        } catch (const std::invalid_argument&) {
            return true;
        }
        return false;
    };
    using S = std::vector<std::int64_t>;
    using T = std::vector<std::int32_t>;
    CHECK(refused([](LoraArgs&, S&, T& slots) { slots[1] = kSlots; }));
    CHECK(refused([](LoraArgs&, S&, T& slots) { slots[0] = -2; }));
    CHECK(refused([](LoraArgs&, S& starts, T&) { starts[0] = 1; }));
    CHECK(refused([](LoraArgs&, S& starts, T&) { starts[1] = 3, starts[2] = 2; }));
    CHECK(refused([k](LoraArgs& a, S&, T&) { a.x_stride = k - 1; }));
    CHECK(refused([](LoraArgs& a, S&, T&) { a.stacks.num_parts = 5; }));
    CHECK(refused([](LoraArgs& a, S&, T&) { a.stacks.b = nullptr; }));
    CHECK(refused([](LoraArgs& a, S&, T&) { a.y_dtype = DType::kFloat16; }));
    const std::int32_t too_high[kSlots] = {1, static_cast<std::int32_t>(kSmall.rank) + 1, 1};
    CHECK(refused([&](LoraArgs& a, S&, T&) { a.stacks.ranks = too_high; }));
    CHECK(!refused([](LoraArgs&, S&, T&) {}));
}

int main() { return check::run_all_tests(); }
