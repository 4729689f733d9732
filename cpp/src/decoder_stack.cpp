// The bf16 / fp32 CPU decoder stack (see decoder_stack.hpp): models/llama.py's layer, kernel for kernel.
#include "pagedserve/decoder_stack.hpp"

#include <stdexcept>
#include <type_traits>
#include <utility>

#include "pagedserve/layer_ops.hpp"
#include "pagedserve/linear.hpp"
#include "pagedserve/linear_quant.hpp"
#include "pagedserve/paged_attention.hpp"

namespace pagedserve {
namespace {

// The vector width of torch's CPU sum, whose order rms_norm_cpu reproduces (ops/layer_ops.py).
constexpr int kSumLanes = 8;

void check(bool ok, const char* message) {
    if (!ok) throw std::invalid_argument(message);
}

// `elements` elements of dtype past p.
template <typename T>
T* advance(T* p, std::int64_t elements, DType dtype) {
    using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
    return reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + elements * dtype_size(dtype));
}

// out = x W^T (+ bias) (+ residual, which may be out itself), all rows in dtype; gated_width > 0:
// out [m, gated_width] = silu(x W_gate^T) * (x W_up^T) from a gated weight. type 0: a packed bf16
// weight (linear.hpp; bf16 rows only), else the ggml type of a weight kept quantized
// (linear_quant.hpp).
void project(int type, DType dtype, const void* x, std::int64_t k, const std::uint16_t* packed,
             const void* bias, void* residual, void* out, std::int64_t n, std::int64_t m,
             std::int64_t gated_width, const DecoderStep& step, int num_threads) {
    const std::int64_t out_stride = gated_width > 0 ? gated_width : n;
    const std::int64_t rows = gated_width > 0 ? gated_rows(gated_width) : n;
    if (type != 0) {
        QuantLinearArgs a;
        a.ggml_type = type, a.x = x, a.x_stride = k;
        a.packed = reinterpret_cast<const std::uint8_t*>(packed), a.bias = bias;
        a.residual = residual, a.residual_stride = n;
        a.out = out, a.out_stride = out_stride, a.m = m, a.n = rows, a.k = k;
        a.gated_width = gated_width, a.amx_from_rows = step.amx_int8_from_rows;
        a.float_activations = step.quant_float_activations;
        a.int16_activations = step.quant_int16_activations;
        a.float32 = dtype == DType::kFloat32;
        return quant_linear(a, num_threads);
    }
    LinearArgs a;  // bf16 rows: the constructor checked dtype
    const auto bf16 = [](const void* p) { return static_cast<const std::uint16_t*>(p); };
    a.x = bf16(x), a.x_stride = k, a.packed = packed, a.bias = bf16(bias);
    a.residual = bf16(residual), a.residual_stride = n;
    a.out = out, a.out_stride = out_stride, a.m = m, a.n = rows, a.k = k;
    a.gated_width = gated_width, a.amx_from_rows = step.amx_from_rows;
    a.tile_order = step.amx_tile_order;
    linear_bf16(a, num_threads);
}

}  // namespace

DecoderStack::DecoderStack(const DecoderShape& shape, std::vector<DecoderLayerWeights> layers)
    : shape_(shape), layers_(std::move(layers)) {
    const DecoderShape& s = shape_;
    check(s.hidden_size > 0 && s.num_heads > 0 && s.num_kv_heads > 0 && s.head_size > 0 &&
              s.intermediate_size > 0,
          "DecoderStack: sizes must be positive");
    check(s.num_heads % s.num_kv_heads == 0, "DecoderStack: num_heads must be a multiple of kv");
    check(s.head_size % 2 == 0, "DecoderStack: head_size must be even (rotary)");
    check(s.dtype == DType::kBFloat16 || s.dtype == DType::kFloat32,
          "DecoderStack: dtype must be bfloat16 or float32");
    for (const DecoderLayerWeights& w : layers_) {
        check(w.input_norm && w.qkv && w.o && w.post_norm && w.gate_up && w.down,
              "DecoderStack: a layer is missing a weight");
        for (int type : {w.qkv_type, w.o_type, w.gate_up_type, w.down_type}) {
            check(type == 0 || quant_type_supported(type),
                  "DecoderStack: a projection's quantized type has no kernel");
            check(type != 0 || s.dtype == DType::kBFloat16,
                  "DecoderStack: float32 needs every projection kept quantized");
        }
        check(w.sliding_window >= 0 && w.logit_softcap >= 0.0f,
              "DecoderStack: a layer's sliding_window and logit_softcap must be >= 0");
    }
}

void DecoderStack::forward(const DecoderStep& step, int num_threads) {
    check(step.kv_caches.size() == layers_.size(), "DecoderStack: one kv cache per layer");
    check(step.num_tokens >= 0 && step.num_reqs >= 0, "DecoderStack: negative sizes");
    check(step.num_pages > 0 && step.page_size > 0, "DecoderStack: bad kv cache sizes");
    check(step.rope_stride >= shape_.head_size, "DecoderStack: rope rows too short");
    if (step.num_tokens == 0) return;
    check(step.hidden && step.cos && step.signed_sin && step.slot_mapping && step.page_table &&
              step.seq_lens && step.query_start_loc,
          "DecoderStack: null step argument");
    for (void* cache : step.kv_caches) check(cache != nullptr, "DecoderStack: null kv cache");
    const DecoderShape& s = shape_;
    const std::int64_t n = step.num_tokens;
    const std::int64_t qkv_size = (s.num_heads + 2 * s.num_kv_heads) * s.head_size;
    const std::size_t floats = s.dtype == DType::kFloat32 ? 1 : 2;  // elements per float
    const auto room = [&](std::vector<float>& buffer, std::int64_t elements) {
        buffer.resize((static_cast<std::size_t>(elements) + floats - 1) / floats);
    };
    room(x_, n * s.hidden_size);
    room(qkv_, n * qkv_size);
    room(attn_, n * s.num_heads * s.head_size);
    room(mlp_, n * s.intermediate_size);
    for (std::size_t l = 0; l < layers_.size(); ++l) {
        layer(layers_[l], step.kv_caches[l], step, num_threads);
    }
}

void DecoderStack::layer(const DecoderLayerWeights& w, void* kv_cache, const DecoderStep& step,
                         int num_threads) {
    const DecoderShape& s = shape_;
    const std::int64_t n = step.num_tokens, d = s.head_size, hidden = s.hidden_size;
    const std::int64_t q_size = s.num_heads * d, kv_size = s.num_kv_heads * d;
    const std::int64_t qkv_size = q_size + 2 * kv_size, inter = s.intermediate_size;
    const DType dtype = s.dtype;
    void* h = step.hidden;
    const auto norm_args = [&](const void* weight) {
        return RmsNormArgs{{x_.data(), hidden}, {h, hidden}, weight, n, hidden,
                           s.rms_norm_eps, dtype, kSumLanes};
    };

    rms_norm_cpu(norm_args(w.input_norm), num_threads);
    project(w.qkv_type, dtype, x_.data(), hidden, w.qkv, w.qkv_bias, nullptr, qkv_.data(),
            qkv_size, n, 0, step, num_threads);

    // q and k side by side: one rotary call over heads + kv_heads.
    RotaryArgs rotary;
    rotary.qk = qkv_.data(), rotary.token_stride = qkv_size, rotary.head_stride = d;
    rotary.cos = {const_cast<void*>(step.cos), step.rope_stride};
    rotary.signed_sin = {const_cast<void*>(step.signed_sin), step.rope_stride};
    rotary.num_tokens = n, rotary.num_heads = s.num_heads + s.num_kv_heads, rotary.head_size = d;
    rotary.dtype = dtype;
    rotary_cpu(rotary, num_threads);

    KvCacheView cache;
    cache.data = kv_cache, cache.num_pages = step.num_pages, cache.num_kv_heads = s.num_kv_heads;
    cache.page_size = step.page_size, cache.head_size = d, cache.quant = step.kv_quant;
    CacheWriteArgs write;
    const void* qkv = qkv_.data();
    write.key = {advance(qkv, q_size, dtype), qkv_size, d};
    write.value = {advance(qkv, q_size + kv_size, dtype), qkv_size, d};
    write.cache = cache, write.slot_mapping = step.slot_mapping, write.num_tokens = n;
    write.dtype = dtype;
    reshape_and_cache_cpu(write, num_threads);

    AttentionArgs attend;
    attend.out = attn_.data(), attend.out_token_stride = q_size, attend.out_head_stride = d;
    attend.query = {qkv_.data(), qkv_size, d};
    attend.cache = cache;
    attend.page_table = step.page_table, attend.page_table_stride = step.page_table_stride;
    attend.seq_lens = step.seq_lens, attend.query_start_loc = step.query_start_loc;
    attend.num_reqs = step.num_reqs, attend.num_tokens = n, attend.num_heads = s.num_heads;
    attend.max_query_len = step.max_query_len, attend.max_seq_len = step.max_seq_len;
    attend.scale = s.scale, attend.dtype = dtype;
    attend.batch_invariant = s.batch_invariant;
    attend.sliding_window = w.sliding_window, attend.logit_softcap = w.logit_softcap;
    paged_attention_cpu(attend, num_threads);

    project(w.o_type, dtype, attn_.data(), q_size, w.o, nullptr, h, h, hidden, n, 0, step,
            num_threads);
    rms_norm_cpu(norm_args(w.post_norm), num_threads);
    project(w.gate_up_type, dtype, x_.data(), hidden, w.gate_up, nullptr, nullptr, mlp_.data(), 0,
            n, inter, step, num_threads);
    project(w.down_type, dtype, mlp_.data(), inter, w.down, nullptr, h, h, hidden, n, 0, step,
            num_threads);
}

}  // namespace pagedserve
