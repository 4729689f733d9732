// pybind11 glue for the bf16 linear kernel (linear.hpp). Plain arguments, pointers as ints, the
// GIL released while it runs: it is called several times per layer and step.
// pagedserve/core/ops/linear.py is the only caller.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "pagedserve/linear.hpp"
#include "bindings.hpp"
#include "pointers.hpp"

namespace py = pybind11;

namespace {

using pagedserve::bindings::pointer;
using pagedserve::bindings::Ptr;

void linear(Ptr x, std::int64_t x_stride, Ptr packed, Ptr bias, Ptr residual,
            std::int64_t residual_stride, Ptr out, std::int64_t out_stride, bool out_float32,
            std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t gated_width,
            int num_threads, std::int64_t amx_from_rows, bool tile_order) {
    pagedserve::LinearArgs a;
    a.x = pointer<const std::uint16_t>(x), a.x_stride = x_stride;
    a.packed = pointer<const std::uint16_t>(packed);
    a.bias = pointer<const std::uint16_t>(bias);
    a.residual = pointer<const std::uint16_t>(residual), a.residual_stride = residual_stride;
    a.out = pointer<void>(out), a.out_stride = out_stride, a.out_float32 = out_float32;
    a.m = m, a.n = n, a.k = k, a.gated_width = gated_width, a.amx_from_rows = amx_from_rows;
    a.tile_order = tile_order;
    pagedserve::linear_bf16(a, num_threads);
}

void pack(Ptr weight, std::int64_t n, std::int64_t k, Ptr packed, int num_threads) {
    pagedserve::pack_linear_weight_bf16(pointer<const std::uint16_t>(weight), n, k,
                                        pointer<std::uint16_t>(packed), num_threads);
}

void pack_gated(Ptr weight, std::int64_t width, std::int64_t k, Ptr packed, int num_threads) {
    pagedserve::pack_gated_weight_bf16(pointer<const std::uint16_t>(weight), width, k,
                                       pointer<std::uint16_t>(packed), num_threads);
}

void linear_f32(Ptr x, std::int64_t x_stride, Ptr packed, Ptr bias, Ptr residual,
                std::int64_t residual_stride, Ptr out, std::int64_t out_stride, std::int64_t m,
                std::int64_t n, std::int64_t k, std::int64_t gated_width, int num_threads) {
    pagedserve::LinearF32Args a;
    a.x = pointer<const float>(x), a.x_stride = x_stride;
    a.packed = pointer<const float>(packed), a.bias = pointer<const float>(bias);
    a.residual = pointer<const float>(residual), a.residual_stride = residual_stride;
    a.out = pointer<float>(out), a.out_stride = out_stride;
    a.m = m, a.n = n, a.k = k, a.gated_width = gated_width;
    pagedserve::linear_f32(a, num_threads);
}

void pack_f32(Ptr weight, std::int64_t n, std::int64_t k, Ptr packed, int num_threads) {
    pagedserve::pack_linear_weight_f32(pointer<const float>(weight), n, k, pointer<float>(packed),
                                       num_threads);
}

void pack_gated_f32(Ptr weight, std::int64_t width, std::int64_t k, Ptr packed, int num_threads) {
    pagedserve::pack_gated_weight_f32(pointer<const float>(weight), width, k,
                                      pointer<float>(packed), num_threads);
}

}  // namespace

void bind_linear(py::module_& m) {
    m.def("linear_bf16_supported", &pagedserve::linear_bf16_supported);
    m.def("linear_path", &pagedserve::linear_path);
    m.def("linear_items_taken_over", &pagedserve::linear_items_taken_over);
    m.def("linear_amx_supported", &pagedserve::linear_amx_supported);
    m.def("linear_amx_emulation", &pagedserve::linear_amx_emulation, py::arg("on"));
    m.def("linear_amx_items", &pagedserve::linear_amx_items);
    m.def("packed_linear_elements", &pagedserve::packed_linear_elements, py::arg("n"),
          py::arg("k"));
    m.def("pack_linear_weight_bf16", &pack, py::arg("weight"), py::arg("n"), py::arg("k"),
          py::arg("packed"), py::arg("num_threads"), py::call_guard<py::gil_scoped_release>());
    m.def("gated_rows", &pagedserve::gated_rows, py::arg("width"));
    m.def("pack_gated_weight_bf16", &pack_gated, py::arg("weight"), py::arg("width"),
          py::arg("k"), py::arg("packed"), py::arg("num_threads"),
          py::call_guard<py::gil_scoped_release>());
    m.def("linear_bf16", &linear, py::arg("x"), py::arg("x_stride"), py::arg("packed"),
          py::arg("bias"), py::arg("residual"), py::arg("residual_stride"), py::arg("out"),
          py::arg("out_stride"), py::arg("out_float32"), py::arg("m"), py::arg("n"), py::arg("k"),
          py::arg("gated_width"), py::arg("num_threads"), py::arg("amx_from_rows") = 0,
          py::arg("tile_order") = false, py::call_guard<py::gil_scoped_release>());
    // fp32 (the float32 model; batch-invariant where torch's matmul is not).
    m.def("packed_linear_elements_f32", &pagedserve::packed_linear_elements_f32, py::arg("n"),
          py::arg("k"));
    m.def("pack_linear_weight_f32", &pack_f32, py::arg("weight"), py::arg("n"), py::arg("k"),
          py::arg("packed"), py::arg("num_threads"), py::call_guard<py::gil_scoped_release>());
    m.def("pack_gated_weight_f32", &pack_gated_f32, py::arg("weight"), py::arg("width"),
          py::arg("k"), py::arg("packed"), py::arg("num_threads"),
          py::call_guard<py::gil_scoped_release>());
    m.def("linear_f32", &linear_f32, py::arg("x"), py::arg("x_stride"), py::arg("packed"),
          py::arg("bias"), py::arg("residual"), py::arg("residual_stride"), py::arg("out"),
          py::arg("out_stride"), py::arg("m"), py::arg("n"), py::arg("k"),
          py::arg("gated_width"), py::arg("num_threads"), py::call_guard<py::gil_scoped_release>());
}
