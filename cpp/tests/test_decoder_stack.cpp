// The bf16 decoder stack's plumbing: with zero projection weights every residual add is of zero,
// so the hidden rows come back unchanged, and the K/V written to the cache are the qkv bias (V
// as it is, K rotated: at position 0, cos = 1 and sin = 0, so also as it is) at each token's slot;
// bad step arguments are refused. Its numerics against the per-layer Python path are held equal,
// bit for bit, by tests/core/models/test_decoder_stack.py. Skips (passes) on a CPU without
// AVX512-BF16. Run under ASan/UBSan by tests/native/test_cpp_sanitized.py.
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "check.hpp"
#include "pagedserve/decoder_stack.hpp"
#include "pagedserve/linear.hpp"

using namespace pagedserve;

namespace {

constexpr std::int64_t kHidden = 64, kHeads = 4, kKvHeads = 2, kHeadSize = 16, kInter = 96;
constexpr std::int64_t kQkv = (kHeads + 2 * kKvHeads) * kHeadSize;
constexpr std::int64_t kPages = 8, kPageSize = 4, kLayers = 2;
constexpr std::uint16_t kOne = 0x3f80;  // 1.0 in bf16

std::uint16_t random_bf16(std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const float f = dist(rng);
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    return static_cast<std::uint16_t>(u >> 16);
}

struct Model {
    std::vector<std::uint16_t> norm, bias, qkv, o, gate_up, down;
    std::vector<std::vector<std::uint16_t>> caches;
    std::vector<DecoderLayerWeights> layers;

    explicit Model(std::mt19937& rng)
        : norm(kHidden, kOne), bias(kQkv), qkv(packed_linear_elements(kQkv, kHidden), 0),
          o(packed_linear_elements(kHidden, kHeads * kHeadSize), 0),
          gate_up(packed_linear_elements(gated_rows(kInter), kHidden), 0),
          down(packed_linear_elements(kHidden, kInter), 0) {
        for (auto& b : bias) b = random_bf16(rng);
        for (int l = 0; l < kLayers; ++l) {
            caches.emplace_back(2 * kPages * kKvHeads * kPageSize * kHeadSize, 0);
            layers.push_back({norm.data(), qkv.data(), bias.data(), o.data(), norm.data(),
                              gate_up.data(), down.data()});
        }
    }
};

DecoderShape shape() {
    DecoderShape s;
    s.hidden_size = kHidden, s.num_heads = kHeads, s.num_kv_heads = kKvHeads;
    s.head_size = kHeadSize, s.intermediate_size = kInter, s.rms_norm_eps = 1e-5f;
    s.scale = 0.25f;
    return s;
}

// Two one-token prefills at position 0: request r owns page 7 - r, its token goes to slot 0.
struct Step {
    std::vector<std::uint16_t> hidden, cos, sin;
    std::vector<std::int64_t> slots{7 * kPageSize, 6 * kPageSize};
    std::vector<std::int32_t> page_table{7, 0, 6, 0}, seq_lens{1, 1}, starts{0, 1, 2};
    DecoderStep args;

    Step(Model& model, std::mt19937& rng)
        : hidden(2 * kHidden), cos(2 * kHeadSize, kOne), sin(2 * kHeadSize, 0) {
        for (auto& h : hidden) h = random_bf16(rng);
        args.hidden = hidden.data(), args.cos = cos.data(), args.signed_sin = sin.data();
        args.rope_stride = kHeadSize;
        for (auto& c : model.caches) args.kv_caches.push_back(c.data());
        args.num_pages = kPages, args.page_size = kPageSize;
        args.slot_mapping = slots.data(), args.page_table = page_table.data();
        args.page_table_stride = 2, args.seq_lens = seq_lens.data();
        args.query_start_loc = starts.data(), args.num_reqs = 2, args.num_tokens = 2;
        args.max_query_len = 1, args.max_seq_len = 1;
    }
};

}  // namespace

TEST(decoder_stack_zero_projections_keep_hidden_and_cache_the_bias) {
    if (!linear_bf16_supported()) return;
    std::mt19937 rng(21);
    Model model(rng);
    DecoderStack stack(shape(), model.layers);
    CHECK(stack.num_layers() == kLayers);
    Step step(model, rng);
    const std::vector<std::uint16_t> before = step.hidden;
    stack.forward(step.args, 2);
    CHECK(step.hidden == before);
    const std::int64_t page_stride = kKvHeads * kPageSize * kHeadSize;
    const std::int64_t kv_stride = kPages * page_stride;
    for (const auto& cache : model.caches) {
        for (std::int64_t r = 0; r < 2; ++r) {
            const std::int64_t page = 7 - r;
            for (std::int64_t h = 0; h < kKvHeads; ++h) {
                const std::uint16_t* k = cache.data() + page * page_stride + h * kPageSize * kHeadSize;
                const std::uint16_t* v = k + kv_stride;
                const std::uint16_t* k_bias = model.bias.data() + (kHeads + h) * kHeadSize;
                const std::uint16_t* v_bias = k_bias + kKvHeads * kHeadSize;
                CHECK(std::memcmp(k, k_bias, 2 * kHeadSize) == 0);
                CHECK(std::memcmp(v, v_bias, 2 * kHeadSize) == 0);
            }
        }
    }
}

TEST(decoder_stack_refuses_bad_arguments) {
    if (!linear_bf16_supported()) return;
    std::mt19937 rng(22);
    Model model(rng);
    DecoderShape bad = shape();
    bad.num_kv_heads = 3;  // 4 heads are not a multiple of 3
    CHECK_THROWS(std::invalid_argument, DecoderStack(bad, model.layers));
    auto missing = model.layers;
    missing[1].down = nullptr;
    CHECK_THROWS(std::invalid_argument, DecoderStack(shape(), missing));

    DecoderStack stack(shape(), model.layers);
    Step step(model, rng);
    DecoderStep args = step.args;
    args.kv_caches.pop_back();  // one cache short
    CHECK_THROWS(std::invalid_argument, stack.forward(args, 1));
    args = step.args, args.rope_stride = kHeadSize - 1;
    CHECK_THROWS(std::invalid_argument, stack.forward(args, 1));
    step.slots[1] = kPages * kPageSize;  // one past the last slot: the cache write refuses it
    CHECK_THROWS(std::invalid_argument, stack.forward(step.args, 1));
    step.slots[1] = 6 * kPageSize, step.page_table[2] = kPages;  // a page id out of range
    CHECK_THROWS(std::invalid_argument, stack.forward(step.args, 1));
}

int main() {
    if (!linear_bf16_supported())  // the stack's products are the bf16 linear kernel's
        std::fprintf(stderr, "  (below level avx2, no bf16 linear: the decoder stack tests skip)\n");
    return check::run_all_tests();
}
