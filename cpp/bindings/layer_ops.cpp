// pybind11 glue for the fused layer ops (layer_ops.hpp). Each op takes its argument struct's
// fields as keyword arguments and builds the struct here: they run several times per layer and
// step, and setting a bound struct's attributes one by one from Python costs as much as the call.
// The GIL is released while they run. pagedserve/core/ops/layer_ops.py is the only caller.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "bindings.hpp"
#include "pagedserve/layer_ops.hpp"
#include "pointers.hpp"

namespace py = pybind11;
using pagedserve::bindings::pointer;
using pagedserve::bindings::Ptr;

void bind_layer_ops(py::module_& m) {
    using pagedserve::DType;
    using pagedserve::RowView;
    m.def(
        "rms_norm",
        [](Ptr out, int64_t out_stride, Ptr x, int64_t x_stride, Ptr weight, int64_t num_rows,
           int64_t hidden_size, float eps, DType dtype, int sum_lanes, int num_threads) {
            const pagedserve::RmsNormArgs args{{pointer<void>(out), out_stride},
                                               {pointer<void>(x), x_stride},
                                               pointer<const void>(weight),
                                               num_rows,
                                               hidden_size,
                                               eps,
                                               dtype,
                                               sum_lanes};
            pagedserve::rms_norm_cpu(args, num_threads);
        },
        py::kw_only(), py::arg("out"), py::arg("out_stride"), py::arg("x"), py::arg("x_stride"),
        py::arg("weight"), py::arg("num_rows"), py::arg("hidden_size"), py::arg("eps"),
        py::arg("dtype"), py::arg("sum_lanes"), py::arg("num_threads"),
        py::call_guard<py::gil_scoped_release>());
    m.def(
        "rotary",
        [](Ptr qk, int64_t token_stride, int64_t head_stride, Ptr cos, int64_t cos_stride,
           Ptr signed_sin, int64_t sin_stride, int64_t num_tokens, int64_t num_heads,
           int64_t head_size, DType dtype, int num_threads) {
            const pagedserve::RotaryArgs args{pointer<void>(qk),
                                              token_stride,
                                              head_stride,
                                              {pointer<void>(cos), cos_stride},
                                              {pointer<void>(signed_sin), sin_stride},
                                              num_tokens,
                                              num_heads,
                                              head_size,
                                              dtype};
            pagedserve::rotary_cpu(args, num_threads);
        },
        py::kw_only(), py::arg("qk"), py::arg("token_stride"), py::arg("head_stride"),
        py::arg("cos"), py::arg("cos_stride"), py::arg("signed_sin"),
        py::arg("signed_sin_stride"), py::arg("num_tokens"), py::arg("num_heads"),
        py::arg("head_size"), py::arg("dtype"), py::arg("num_threads"),
        py::call_guard<py::gil_scoped_release>());
    m.def(
        "silu_and_mul",
        [](Ptr out, int64_t out_stride, Ptr gate_up, int64_t gate_up_stride, int64_t num_rows,
           int64_t intermediate_size, DType dtype, int torch_lanes, int num_threads) {
            pagedserve::silu_and_mul_cpu({pointer<void>(out), out_stride},
                                         {pointer<void>(gate_up), gate_up_stride}, num_rows,
                                         intermediate_size, dtype, torch_lanes, num_threads);
        },
        py::kw_only(), py::arg("out"), py::arg("out_stride"), py::arg("gate_up"),
        py::arg("gate_up_stride"), py::arg("num_rows"), py::arg("intermediate_size"),
        py::arg("dtype"), py::arg("torch_lanes"), py::arg("num_threads"),
        py::call_guard<py::gil_scoped_release>());
}
