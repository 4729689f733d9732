// A Llama-family decoder stack run on the CPU in bf16 or fp32, layer after layer, without returning to
// Python between kernels. It calls the same kernels in the same order as models/llama.py's layers
// do one by one (RMSNorm, packed qkv projection, rotary, cache write, paged attention, o
// projection + residual, RMSNorm, gate_up with SiLU-and-mul, down + residual), so its results are
// those of the per-op path bit for bit. Why: the Python between a step's ~240 kernel calls took
// 1.35 s of a 9.4 s offline run (bench/RESULTS.md). models/decoder_stack/stack.py is the only caller.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedserve/lora.hpp"
#include "pagedserve/paged_attention.hpp"  // KvQuant

namespace pagedserve {

struct DecoderShape {
    std::int64_t hidden_size = 0;
    std::int64_t num_heads = 0;
    std::int64_t num_kv_heads = 0;
    std::int64_t head_size = 0;
    std::int64_t intermediate_size = 0;
    float rms_norm_eps = 0.0f;
    float scale = 0.0f;  // attention's softmax scale
    bool batch_invariant = true;  // AttentionArgs::batch_invariant for every layer
    // The dtype of the residual stream, the norms' weights, the qkv bias, the rotary tables, the
    // activations between kernels and an unquantized KV cache: bf16, or fp32 where every
    // projection is kept quantized (the packed bf16 ones take bf16 rows only).
    DType dtype = DType::kBFloat16;
};

// One layer's weights: norms [hidden_size] in the shape's dtype; projections packed by
// pack_linear_weight_bf16 or kept quantized.
struct DecoderLayerWeights {
    const void* input_norm = nullptr;
    const std::uint16_t* qkv = nullptr;       // [(heads + 2 kv_heads) head_size, hidden_size]
    const void* qkv_bias = nullptr;           // [(heads + 2 kv_heads) head_size], or null
    const std::uint16_t* o = nullptr;         // [hidden_size, heads head_size]
    const void* post_norm = nullptr;
    const std::uint16_t* gate_up = nullptr;   // gated: pack_gated_weight_bf16 (linear.hpp)
    const std::uint16_t* down = nullptr;      // [hidden_size, intermediate_size]
    // ggml type ids (linear_quant.hpp) of projections kept quantized, whose pointer above then
    // holds pack_quant_weight's bytes (gate_up: the gated row table's); 0: packed bf16.
    int qkv_type = 0, o_type = 0, gate_up_type = 0, down_type = 0;
    // The layer's attention options (AttentionArgs; 0 = off): local/global layers differ.
    std::int64_t sliding_window = 0;
    float logit_softcap = 0.0f;
};

// The LoRA adapters' stacks beside one layer's projections (lora.hpp; a null `a`: none there):
// qkv's three parts (q | k | v), o's one, gate_up's two (gate | up, added before the activation),
// down's one.
struct DecoderLayerLora {
    LoraStacks qkv, o, gate_up, down;
};

// One step's tokens and attention metadata, as paged_attention.hpp describes them.
struct DecoderStep {
    // In the shape's dtype:
    void* hidden = nullptr;            // [num_tokens, hidden_size] residual stream, in place
    const void* cos = nullptr;         // [num_tokens, head_size] rows, rope_stride apart
    const void* signed_sin = nullptr;  // likewise
    std::int64_t rope_stride = 0;
    std::vector<void*> kv_caches;  // per layer [2, num_pages, num_kv_heads, page_size, head_size]
    std::int64_t num_pages = 0;
    std::int64_t page_size = 0;
    KvQuant kv_quant = KvQuant::kNone;  // how every layer's cache stores K and V
    const std::int64_t* slot_mapping = nullptr;  // [num_tokens]
    const std::int32_t* page_table = nullptr;    // [num_reqs, page_table_stride]
    std::int64_t page_table_stride = 0;
    const std::int32_t* seq_lens = nullptr;         // [num_reqs]
    const std::int32_t* query_start_loc = nullptr;  // [num_reqs + 1]
    std::int64_t num_reqs = 0;
    std::int64_t num_tokens = 0;
    std::int64_t max_query_len = 0;
    std::int64_t max_seq_len = 0;
    std::int64_t amx_from_rows = 0;       // LinearArgs::amx_from_rows of every bf16 projection
    bool amx_tile_order = false;          // and their LinearArgs::tile_order
    std::int64_t amx_int8_from_rows = 0;  // QuantLinearArgs::amx_from_rows of the quantized
    bool quant_float_activations = false;  // QuantLinearArgs::float_activations of the same
    bool quant_int16_activations = false;  // QuantLinearArgs::int16_activations, likewise
    // The step's rows by adapter slot (lora.hpp; no segment, or every slot -1: base rows only).
    // Adapter rows add their adapter's product to every projection that has stacks (set_lora);
    // their gate | up is then a plain product, the adapters' added, SiLU-and-mul after
    // (silu_and_mul_cpu with torch_lanes), while base rows keep the gated kernel's epilogue:
    // a base row's bits do not depend on the adapters beside it.
    LoraSegments lora;
    int torch_lanes = 8;
};

class DecoderStack {
  public:
    // Throws std::invalid_argument on inconsistent sizes or a missing weight.
    DecoderStack(const DecoderShape& shape, std::vector<DecoderLayerWeights> layers);

    // Runs every layer over the step's tokens; step.hidden holds the last layer's output after.
    // Throws std::invalid_argument on bad step arguments (before touching any memory for the
    // sizes, and from the kernels' own checks of slots and page ids), std::runtime_error where a
    // kernel cannot run on this CPU.
    void forward(const DecoderStep& step, int num_threads);

    std::int64_t num_layers() const { return static_cast<std::int64_t>(layers_.size()); }

    // The adapters' stacks, one entry per layer (empty: none). Their weights are read at each
    // forward, so slots written or cleared in place need no new call. Throws
    // std::invalid_argument on sizes that do not match the layers.
    void set_lora(std::vector<DecoderLayerLora> lora);
    bool has_lora() const { return !lora_.empty(); }

  private:
    void layer(const DecoderLayerWeights& w, const DecoderLayerLora* lora, void* kv_cache,
               const DecoderStep& step, int num_threads);
    // The step's rows split into base and adapter rows (compact_ segments over the latter).
    void plan_lora(const DecoderStep& step);
    void gate_up(const DecoderLayerWeights& w, const DecoderLayerLora* lora,
                 const DecoderStep& step, int num_threads);

    DecoderShape shape_;
    std::vector<DecoderLayerWeights> layers_;
    // Activations of one layer in the shape's dtype, reused: x (normed hidden), qkv, attention
    // output, mlp (float elements: room for either dtype, aligned for both).
    std::vector<float> x_, qkv_, attn_, mlp_;
    std::vector<DecoderLayerLora> lora_;
    // A step with adapter rows: their indices and the base rows', the adapter rows' segments
    // once gathered (compact), and the gate_up scratch of either kind (same element rule).
    std::vector<std::int64_t> base_rows_, adapter_rows_, compact_starts_;
    std::vector<std::int32_t> compact_slots_;
    std::vector<float> rows_in_, product_, gate_up_, rows_out_;
};

}  // namespace pagedserve
