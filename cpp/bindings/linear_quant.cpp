// pybind11 glue for the quantized linear kernel (linear_quant.hpp). Plain arguments, pointers as
// ints, the GIL released while it runs. pagedserve/core/ops/linear_quant.py is the only caller.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "bindings.hpp"
#include "pagedserve/linear_quant.hpp"
#include "pointers.hpp"

namespace py = pybind11;

namespace {

using pagedserve::bindings::pointer;
using pagedserve::bindings::Ptr;

void quant_linear(int ggml_type, Ptr x, std::int64_t x_stride, bool float32, Ptr packed, Ptr bias,
                  Ptr residual, std::int64_t residual_stride, Ptr out, std::int64_t out_stride,
                  bool out_float32, std::int64_t m, std::int64_t n, std::int64_t k,
                  std::int64_t gated_width, int num_threads, bool force_portable,
                  bool dequant_bf16, std::int64_t amx_from_rows, bool float_activations,
                  bool int16_activations) {
    pagedserve::QuantLinearArgs a;
    a.ggml_type = ggml_type, a.x = pointer<const void>(x), a.x_stride = x_stride;
    a.float32 = float32, a.packed = pointer<const std::uint8_t>(packed);
    a.bias = pointer<const void>(bias), a.residual = pointer<const void>(residual);
    a.residual_stride = residual_stride, a.out = pointer<void>(out), a.out_stride = out_stride;
    a.out_float32 = out_float32, a.m = m, a.n = n, a.k = k, a.gated_width = gated_width;
    a.dequant_bf16 = dequant_bf16, a.amx_from_rows = amx_from_rows;
    a.float_activations = float_activations, a.int16_activations = int16_activations;
    pagedserve::quant_linear(a, num_threads, force_portable);
}

void pack(int ggml_type, Ptr rows, std::int64_t n, std::int64_t k, Ptr packed, int num_threads) {
    pagedserve::pack_quant_weight(ggml_type, pointer<const std::int64_t>(rows), n, k,
                                  pointer<std::uint8_t>(packed), num_threads);
}

}  // namespace

void bind_linear_quant(py::module_& m) {
    m.def("quant_type_supported", &pagedserve::quant_type_supported, py::arg("ggml_type"));
    m.def("quant_block_features", &pagedserve::quant_block_features, py::arg("ggml_type"));
    m.def("quant_row_bytes", &pagedserve::quant_row_bytes, py::arg("ggml_type"), py::arg("k"));
    m.def("packed_quant_bytes", &pagedserve::packed_quant_bytes, py::arg("ggml_type"),
          py::arg("n"), py::arg("k"));
    m.def("quant_linear_path", &pagedserve::quant_linear_path);
    m.def("quant_linear_float_path", &pagedserve::quant_linear_float_path);
    m.def("quant_linear_int16_path", &pagedserve::quant_linear_int16_path);
    m.def("quant_linear_amx_supported", &pagedserve::quant_linear_amx_supported);
    m.def("pack_quant_weight", &pack, py::arg("ggml_type"), py::arg("rows"), py::arg("n"),
          py::arg("k"), py::arg("packed"), py::arg("num_threads"),
          py::call_guard<py::gil_scoped_release>());
    m.def("quant_linear", &quant_linear, py::arg("ggml_type"), py::arg("x"), py::arg("x_stride"),
          py::arg("float32"), py::arg("packed"), py::arg("bias"), py::arg("residual"),
          py::arg("residual_stride"), py::arg("out"), py::arg("out_stride"),
          py::arg("out_float32"), py::arg("m"), py::arg("n"), py::arg("k"),
          py::arg("gated_width"), py::arg("num_threads"), py::arg("force_portable") = false,
          py::arg("dequant_bf16") = false, py::arg("amx_from_rows") = 0,
          py::arg("float_activations") = false, py::arg("int16_activations") = false,
          py::call_guard<py::gil_scoped_release>());
}
