// pybind11 glue for the bf16 CPU decoder stack (decoder_stack.hpp): pointers as ints, the GIL
// released while a step runs. pagedserve/core/models/decoder_stack.py is the only caller.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pagedserve/decoder_stack.hpp"
#include "pointers.hpp"

namespace py = pybind11;

namespace {

using pagedserve::bindings::pointer;
using pagedserve::bindings::Ptr;

// (input_norm, qkv, qkv_bias, o, post_norm, gate_up, down) packed-weight pointers per layer.
using LayerPointers = std::vector<Ptr>;

pagedserve::DecoderStack make_stack(std::int64_t hidden_size, std::int64_t num_heads,
                                    std::int64_t num_kv_heads, std::int64_t head_size,
                                    std::int64_t intermediate_size, float rms_norm_eps,
                                    float scale, const std::vector<LayerPointers>& layers,
                                    const std::vector<std::int64_t>& sliding_windows,
                                    const std::vector<float>& logit_softcaps) {
    pagedserve::DecoderShape shape;
    shape.hidden_size = hidden_size, shape.num_heads = num_heads;
    shape.num_kv_heads = num_kv_heads, shape.head_size = head_size;
    shape.intermediate_size = intermediate_size, shape.rms_norm_eps = rms_norm_eps;
    shape.scale = scale;
    const auto per_layer = [&](std::size_t size, const char* name) {
        if (size != 0 && size != layers.size())
            throw py::value_error(std::string(name) + ": one value per layer, or none");
    };
    per_layer(sliding_windows.size(), "sliding_windows");
    per_layer(logit_softcaps.size(), "logit_softcaps");
    std::vector<pagedserve::DecoderLayerWeights> weights;
    for (const LayerPointers& p : layers) {
        if (p.size() != 7) throw py::value_error("each layer takes 7 weight pointers");
        pagedserve::DecoderLayerWeights w;
        const std::size_t i = weights.size();
        if (!sliding_windows.empty()) w.sliding_window = sliding_windows[i];
        if (!logit_softcaps.empty()) w.logit_softcap = logit_softcaps[i];
        w.input_norm = pointer<const std::uint16_t>(p[0]);
        w.qkv = pointer<const std::uint16_t>(p[1]);
        w.qkv_bias = pointer<const std::uint16_t>(p[2]);
        w.o = pointer<const std::uint16_t>(p[3]);
        w.post_norm = pointer<const std::uint16_t>(p[4]);
        w.gate_up = pointer<const std::uint16_t>(p[5]);
        w.down = pointer<const std::uint16_t>(p[6]);
        weights.push_back(w);
    }
    return pagedserve::DecoderStack(shape, std::move(weights));
}

void forward(pagedserve::DecoderStack& stack, Ptr hidden, Ptr cos, Ptr signed_sin,
             std::int64_t rope_stride, const std::vector<Ptr>& kv_caches, std::int64_t num_pages,
             std::int64_t page_size, Ptr slot_mapping, Ptr page_table,
             std::int64_t page_table_stride, Ptr seq_lens, Ptr query_start_loc,
             std::int64_t num_reqs, std::int64_t num_tokens, std::int64_t max_query_len,
             std::int64_t max_seq_len, int num_threads) {
    pagedserve::DecoderStep s;
    s.hidden = pointer<std::uint16_t>(hidden);
    s.cos = pointer<const std::uint16_t>(cos);
    s.signed_sin = pointer<const std::uint16_t>(signed_sin);
    s.rope_stride = rope_stride;
    for (Ptr p : kv_caches) s.kv_caches.push_back(pointer<void>(p));
    s.num_pages = num_pages, s.page_size = page_size;
    s.slot_mapping = pointer<const std::int64_t>(slot_mapping);
    s.page_table = pointer<const std::int32_t>(page_table);
    s.page_table_stride = page_table_stride;
    s.seq_lens = pointer<const std::int32_t>(seq_lens);
    s.query_start_loc = pointer<const std::int32_t>(query_start_loc);
    s.num_reqs = num_reqs, s.num_tokens = num_tokens;
    s.max_query_len = max_query_len, s.max_seq_len = max_seq_len;
    py::gil_scoped_release release;
    stack.forward(s, num_threads);
}

}  // namespace

void bind_decoder_stack(py::module_& m) {
    py::class_<pagedserve::DecoderStack>(m, "DecoderStack")
        .def(py::init(&make_stack), py::arg("hidden_size"), py::arg("num_heads"),
             py::arg("num_kv_heads"), py::arg("head_size"), py::arg("intermediate_size"),
             py::arg("rms_norm_eps"), py::arg("scale"), py::arg("layers"),
             py::arg("sliding_windows") = std::vector<std::int64_t>{},
             py::arg("logit_softcaps") = std::vector<float>{})
        .def_property_readonly("num_layers", &pagedserve::DecoderStack::num_layers)
        .def("forward", &forward, py::arg("hidden"), py::arg("cos"), py::arg("signed_sin"),
             py::arg("rope_stride"), py::arg("kv_caches"), py::arg("num_pages"),
             py::arg("page_size"), py::arg("slot_mapping"), py::arg("page_table"),
             py::arg("page_table_stride"), py::arg("seq_lens"), py::arg("query_start_loc"),
             py::arg("num_reqs"), py::arg("num_tokens"), py::arg("max_query_len"),
             py::arg("max_seq_len"), py::arg("num_threads"));
}
