// pybind11 glue for the bf16 / fp32 CPU decoder stack (decoder_stack.hpp): pointers as ints, each
// layer's weights a named struct (DecoderLayerWeights), the GIL released while a step runs.
// pagedserve/core/models/decoder_stack/ops.py is the only caller.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <vector>

#include "pagedserve/decoder_stack.hpp"
#include "bindings.hpp"
#include "pointers.hpp"

namespace py = pybind11;

namespace {

using pagedserve::DecoderLayerLora;
using pagedserve::DecoderLayerWeights;
using pagedserve::LoraStacks;
using pagedserve::bindings::def_pointer;
using pagedserve::bindings::pointer;
using pagedserve::bindings::Ptr;

void bind_layer_weights(py::module_& m) {
    py::class_<DecoderLayerWeights> cls(m, "DecoderLayerWeights");
    cls.def(py::init([](Ptr input_norm, Ptr qkv, Ptr qkv_bias, Ptr o, Ptr post_norm, Ptr gate_up,
                        Ptr down, std::int64_t sliding_window, float logit_softcap, int qkv_type,
                        int o_type, int gate_up_type, int down_type) {
                using W = const std::uint16_t;
                using V = const void;
                DecoderLayerWeights w{pointer<V>(input_norm), pointer<W>(qkv),
                                      pointer<V>(qkv_bias),   pointer<W>(o),
                                      pointer<V>(post_norm),  pointer<W>(gate_up),
                                      pointer<W>(down)};
                w.sliding_window = sliding_window;
                w.logit_softcap = logit_softcap;
                w.qkv_type = qkv_type, w.o_type = o_type;
                w.gate_up_type = gate_up_type, w.down_type = down_type;
                return w;
            }),
            py::kw_only(), py::arg("input_norm"), py::arg("qkv"), py::arg("qkv_bias"),
            py::arg("o"), py::arg("post_norm"), py::arg("gate_up"), py::arg("down"),
            py::arg("sliding_window") = 0, py::arg("logit_softcap") = 0.0f,
            py::arg("qkv_type") = 0, py::arg("o_type") = 0, py::arg("gate_up_type") = 0,
            py::arg("down_type") = 0);
    cls.def_readonly("sliding_window", &DecoderLayerWeights::sliding_window);
    cls.def_readonly("logit_softcap", &DecoderLayerWeights::logit_softcap);
    cls.def_readonly("qkv_type", &DecoderLayerWeights::qkv_type);
    cls.def_readonly("o_type", &DecoderLayerWeights::o_type);
    cls.def_readonly("gate_up_type", &DecoderLayerWeights::gate_up_type);
    cls.def_readonly("down_type", &DecoderLayerWeights::down_type);
    def_pointer(cls, "input_norm", &DecoderLayerWeights::input_norm);
    def_pointer(cls, "qkv", &DecoderLayerWeights::qkv);
    def_pointer(cls, "qkv_bias", &DecoderLayerWeights::qkv_bias);
    def_pointer(cls, "o", &DecoderLayerWeights::o);
    def_pointer(cls, "post_norm", &DecoderLayerWeights::post_norm);
    def_pointer(cls, "gate_up", &DecoderLayerWeights::gate_up);
    def_pointer(cls, "down", &DecoderLayerWeights::down);
}

// A layer's adapters' stacks; None: that projection has none.
DecoderLayerLora make_layer_lora(const LoraStacks* qkv, const LoraStacks* o,
                                 const LoraStacks* gate_up, const LoraStacks* down) {
    DecoderLayerLora l;
    if (qkv) l.qkv = *qkv;
    if (o) l.o = *o;
    if (gate_up) l.gate_up = *gate_up;
    if (down) l.down = *down;
    return l;
}

pagedserve::DecoderStack make_stack(std::int64_t hidden_size, std::int64_t num_heads,
                                    std::int64_t num_kv_heads, std::int64_t head_size,
                                    std::int64_t intermediate_size, float rms_norm_eps,
                                    float scale, std::vector<DecoderLayerWeights> layers,
                                    bool batch_invariant, bool float32) {
    pagedserve::DecoderShape shape;
    shape.hidden_size = hidden_size, shape.num_heads = num_heads;
    shape.num_kv_heads = num_kv_heads, shape.head_size = head_size;
    shape.intermediate_size = intermediate_size, shape.rms_norm_eps = rms_norm_eps;
    shape.scale = scale, shape.batch_invariant = batch_invariant;
    shape.dtype = float32 ? pagedserve::DType::kFloat32 : pagedserve::DType::kBFloat16;
    return pagedserve::DecoderStack(shape, std::move(layers));
}

void forward(pagedserve::DecoderStack& stack, Ptr hidden, Ptr cos, Ptr signed_sin,
             std::int64_t rope_stride, const std::vector<Ptr>& kv_caches, std::int64_t num_pages,
             std::int64_t page_size, Ptr slot_mapping, Ptr page_table,
             std::int64_t page_table_stride, Ptr seq_lens, Ptr query_start_loc,
             std::int64_t num_reqs, std::int64_t num_tokens, std::int64_t max_query_len,
             std::int64_t max_seq_len, int num_threads, std::int64_t amx_from_rows,
             std::int64_t amx_int8_from_rows, bool amx_tile_order,
             bool quant_float_activations, int kv_quant, bool quant_int16_activations,
             Ptr lora_starts, Ptr lora_slots, std::int64_t lora_num_segments, int torch_lanes) {
    pagedserve::DecoderStep s;
    s.hidden = pointer<void>(hidden);
    s.cos = pointer<const void>(cos);
    s.signed_sin = pointer<const void>(signed_sin);
    s.rope_stride = rope_stride;
    for (Ptr p : kv_caches) s.kv_caches.push_back(pointer<void>(p));
    s.num_pages = num_pages, s.page_size = page_size;
    s.kv_quant = static_cast<pagedserve::KvQuant>(kv_quant);  // checked by the cache write
    s.slot_mapping = pointer<const std::int64_t>(slot_mapping);
    s.page_table = pointer<const std::int32_t>(page_table);
    s.page_table_stride = page_table_stride;
    s.seq_lens = pointer<const std::int32_t>(seq_lens);
    s.query_start_loc = pointer<const std::int32_t>(query_start_loc);
    s.num_reqs = num_reqs, s.num_tokens = num_tokens;
    s.max_query_len = max_query_len, s.max_seq_len = max_seq_len;
    s.amx_from_rows = amx_from_rows, s.amx_int8_from_rows = amx_int8_from_rows;
    s.amx_tile_order = amx_tile_order;
    s.quant_float_activations = quant_float_activations;
    s.quant_int16_activations = quant_int16_activations;
    s.lora = {pointer<const std::int64_t>(lora_starts), pointer<const std::int32_t>(lora_slots),
              lora_num_segments};
    s.torch_lanes = torch_lanes;
    py::gil_scoped_release release;
    stack.forward(s, num_threads);
}

}  // namespace

void bind_decoder_stack(py::module_& m) {
    bind_layer_weights(m);
    py::class_<DecoderLayerLora>(m, "DecoderLayerLora")
        .def(py::init(&make_layer_lora), py::kw_only(), py::arg("qkv") = nullptr,
             py::arg("o") = nullptr, py::arg("gate_up") = nullptr, py::arg("down") = nullptr);
    py::class_<pagedserve::DecoderStack>(m, "DecoderStack")
        .def(py::init(&make_stack), py::arg("hidden_size"), py::arg("num_heads"),
             py::arg("num_kv_heads"), py::arg("head_size"), py::arg("intermediate_size"),
             py::arg("rms_norm_eps"), py::arg("scale"), py::arg("layers"),
             py::arg("batch_invariant") = true, py::arg("float32") = false)
        .def_property_readonly("num_layers", &pagedserve::DecoderStack::num_layers)
        .def_property_readonly("has_lora", &pagedserve::DecoderStack::has_lora)
        .def("set_lora", &pagedserve::DecoderStack::set_lora, py::arg("lora"))
        .def("forward", &forward, py::arg("hidden"), py::arg("cos"), py::arg("signed_sin"),
             py::arg("rope_stride"), py::arg("kv_caches"), py::arg("num_pages"),
             py::arg("page_size"), py::arg("slot_mapping"), py::arg("page_table"),
             py::arg("page_table_stride"), py::arg("seq_lens"), py::arg("query_start_loc"),
             py::arg("num_reqs"), py::arg("num_tokens"), py::arg("max_query_len"),
             py::arg("max_seq_len"), py::arg("num_threads"), py::arg("amx_from_rows") = 0,
             py::arg("amx_int8_from_rows") = 0, py::arg("amx_tile_order") = false,
             py::arg("quant_float_activations") = false, py::arg("kv_quant") = 0,
             py::arg("quant_int16_activations") = false, py::arg("lora_starts") = 0,
             py::arg("lora_slots") = 0, py::arg("lora_num_segments") = 0,
             py::arg("torch_lanes") = 8);
}
