// The bf16 / fp32 CPU decoder stack (see decoder_stack.hpp): models/llama.py's layer, kernel for kernel.
#include "pagedserve/decoder_stack.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "pagedserve/layer_ops.hpp"
#include "pagedserve/linear.hpp"
#include "pagedserve/linear_quant.hpp"
#include "pagedserve/lora.hpp"
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

// y += the adapters' product of x for the step's adapter rows, where the projection has stacks.
void add_lora(const LoraStacks& stacks, const LoraSegments& segments, DType dtype, const void* x,
              std::int64_t x_stride, void* y, std::int64_t y_stride, int num_threads) {
    if (stacks.a == nullptr) return;
    LoraArgs a;
    a.x = x, a.x_stride = x_stride, a.x_dtype = dtype;
    a.y = y, a.y_stride = y_stride, a.y_dtype = dtype;
    a.stacks = stacks, a.segments = segments;
    lora_add_cpu(a, num_threads);
}

// dst row i = src row rows[i] (width elements of dtype each; src rows src_stride apart).
void gather_rows(const void* src, std::int64_t src_stride, void* dst,
                 const std::vector<std::int64_t>& rows, std::int64_t width, DType dtype) {
    const std::size_t bytes = static_cast<std::size_t>(width) * dtype_size(dtype);
    for (std::size_t i = 0; i < rows.size(); ++i) {
        std::memcpy(advance(dst, static_cast<std::int64_t>(i) * width, dtype),
                    advance(src, rows[i] * src_stride, dtype), bytes);
    }
}

// dst row rows[i] = src row i.
void scatter_rows(const void* src, void* dst, const std::vector<std::int64_t>& rows,
                  std::int64_t width, DType dtype) {
    const std::size_t bytes = static_cast<std::size_t>(width) * dtype_size(dtype);
    for (std::size_t i = 0; i < rows.size(); ++i) {
        std::memcpy(advance(dst, rows[i] * width, dtype),
                    advance(src, static_cast<std::int64_t>(i) * width, dtype), bytes);
    }
}

// [m, gated_rows(width)] columns of a gated weight's plain product (16 gate columns, then their
// 16 up columns: kLinearGateCols) -> [m, 2 width], gate | up (dense.py's deinterleave_gated).
void deinterleave_gated(const void* product, void* out, std::int64_t m, std::int64_t width,
                        DType dtype) {
    const std::int64_t in_width = gated_rows(width), size = dtype_size(dtype);
    for (std::int64_t r = 0; r < m; ++r) {
        const void* row = advance(product, r * in_width, dtype);
        for (std::int64_t j = 0; j < width; j += 16) {
            const std::int64_t cols = std::min<std::int64_t>(16, width - j);
            for (std::int64_t half = 0; half < 2; ++half) {
                std::memcpy(advance(out, r * 2 * width + half * width + j, dtype),
                            advance(row, 2 * j + half * 16, dtype),
                            static_cast<std::size_t>(cols * size));
            }
        }
    }
}

void check_stacks(const LoraStacks& s, std::int64_t k, std::vector<std::int64_t> parts,
                  DType dtype) {
    if (s.a == nullptr) return;
    bool ok = s.b != nullptr && s.k == k && s.num_parts == static_cast<int>(parts.size()) &&
              s.dtype == dtype && s.num_slots > 0 && s.max_rank > 0;
    for (std::size_t p = 0; ok && p < parts.size(); ++p) ok = s.part_widths[p] == parts[p];
    check(ok, "DecoderStack: a layer's LoRA stacks do not match its projection");
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

void DecoderStack::set_lora(std::vector<DecoderLayerLora> lora) {
    const DecoderShape& s = shape_;
    check(lora.empty() || lora.size() == layers_.size(), "DecoderStack: one LoRA entry per layer");
    const std::int64_t q = s.num_heads * s.head_size, kv = s.num_kv_heads * s.head_size;
    for (const DecoderLayerLora& l : lora) {
        check_stacks(l.qkv, s.hidden_size, {q, kv, kv}, s.dtype);
        check_stacks(l.o, q, {s.hidden_size}, s.dtype);
        check_stacks(l.gate_up, s.hidden_size, {s.intermediate_size, s.intermediate_size},
                     s.dtype);
        check_stacks(l.down, s.intermediate_size, {s.hidden_size}, s.dtype);
    }
    lora_ = std::move(lora);
}

void DecoderStack::plan_lora(const DecoderStep& step) {
    base_rows_.clear(), adapter_rows_.clear(), compact_slots_.clear();
    compact_starts_.assign(1, 0);
    const LoraSegments& g = step.lora;
    if (g.num_segments == 0) return;
    check(g.starts && g.slots && g.starts[0] == 0 && g.starts[g.num_segments] == step.num_tokens,
          "DecoderStack: the LoRA segments must cover the step's rows");
    for (std::int64_t i = 0; i < g.num_segments; ++i) {
        const std::int64_t start = g.starts[i], end = g.starts[i + 1];
        check(end >= start, "DecoderStack: LoRA segment starts must not decrease");
        auto& rows = g.slots[i] >= 0 ? adapter_rows_ : base_rows_;
        for (std::int64_t r = start; r < end; ++r) rows.push_back(r);
        if (g.slots[i] >= 0 && end > start) {
            compact_slots_.push_back(g.slots[i]);
            compact_starts_.push_back(static_cast<std::int64_t>(adapter_rows_.size()));
        }
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
    plan_lora(step);
    const bool adapters = !adapter_rows_.empty() && !lora_.empty();
    if (adapters) {
        const std::int64_t m = static_cast<std::int64_t>(adapter_rows_.size());
        const std::int64_t inter = s.intermediate_size;
        room(rows_in_, n * s.hidden_size);
        room(product_, m * gated_rows(inter));
        room(gate_up_, m * 2 * inter);
        room(rows_out_, n * inter);
    }
    for (std::size_t l = 0; l < layers_.size(); ++l) {
        layer(layers_[l], adapters ? &lora_[l] : nullptr, step.kv_caches[l], step, num_threads);
    }
}

void DecoderStack::layer(const DecoderLayerWeights& w, const DecoderLayerLora* lora,
                         void* kv_cache, const DecoderStep& step, int num_threads) {
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
    if (lora) {
        add_lora(lora->qkv, step.lora, dtype, x_.data(), hidden, qkv_.data(), qkv_size,
                 num_threads);
    }

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
    if (lora) add_lora(lora->o, step.lora, dtype, attn_.data(), q_size, h, hidden, num_threads);
    rms_norm_cpu(norm_args(w.post_norm), num_threads);
    gate_up(w, lora, step, num_threads);
    project(w.down_type, dtype, mlp_.data(), inter, w.down, nullptr, h, h, hidden, n, 0, step,
            num_threads);
    if (lora) add_lora(lora->down, step.lora, dtype, mlp_.data(), inter, h, hidden, num_threads);
}

// mlp_ = silu(gate) * up of x_. Base rows take the gated kernel (SiLU-and-mul in its epilogue);
// adapter rows, where the layer's gate_up has stacks, a plain product of the same weight, gate |
// up deinterleaved, the adapters added, then silu_and_mul: models/linear's per-layer path.
void DecoderStack::gate_up(const DecoderLayerWeights& w, const DecoderLayerLora* lora,
                           const DecoderStep& step, int num_threads) {
    const DecoderShape& s = shape_;
    const DType dtype = s.dtype;
    const std::int64_t n = step.num_tokens, hidden = s.hidden_size, inter = s.intermediate_size;
    if (lora == nullptr || lora->gate_up.a == nullptr) {
        project(w.gate_up_type, dtype, x_.data(), hidden, w.gate_up, nullptr, nullptr,
                mlp_.data(), 0, n, inter, step, num_threads);
        return;
    }
    const std::int64_t num_base = static_cast<std::int64_t>(base_rows_.size());
    const std::int64_t m = static_cast<std::int64_t>(adapter_rows_.size());
    if (num_base > 0) {  // the base rows alone: the gated kernel's bits, whatever the batch
        gather_rows(x_.data(), hidden, rows_in_.data(), base_rows_, hidden, dtype);
        project(w.gate_up_type, dtype, rows_in_.data(), hidden, w.gate_up, nullptr, nullptr,
                rows_out_.data(), 0, num_base, inter, step, num_threads);
        scatter_rows(rows_out_.data(), mlp_.data(), base_rows_, inter, dtype);
    }
    const void* x = x_.data();
    if (num_base > 0) {
        gather_rows(x_.data(), hidden, rows_in_.data(), adapter_rows_, hidden, dtype);
        x = rows_in_.data();
    }
    const std::int64_t rows = gated_rows(inter);
    project(w.gate_up_type, dtype, x, hidden, w.gate_up, nullptr, nullptr, product_.data(), rows,
            m, 0, step, num_threads);
    deinterleave_gated(product_.data(), gate_up_.data(), m, inter, dtype);
    const LoraSegments compact{compact_starts_.data(), compact_slots_.data(),
                               static_cast<std::int64_t>(compact_slots_.size())};
    add_lora(lora->gate_up, compact, dtype, x, hidden, gate_up_.data(), 2 * inter, num_threads);
    void* out = num_base > 0 ? rows_out_.data() : mlp_.data();
    silu_and_mul_cpu({out, inter}, {gate_up_.data(), 2 * inter}, m, inter, dtype,
                     step.torch_lanes, num_threads);
    if (num_base > 0) scatter_rows(rows_out_.data(), mlp_.data(), adapter_rows_, inter, dtype);
}

}  // namespace pagedserve
