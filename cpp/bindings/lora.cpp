// pybind11 glue for the LoRA product (lora.hpp): a projection's stacks as a named struct
// (LoraStacks), the step's segments and the rows as pointers, the GIL released while it runs.
// pagedserve/core/lora/native.py is the only caller (the decoder stack's glue takes LoraStacks).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "bindings.hpp"
#include "pagedserve/lora.hpp"
#include "pointers.hpp"

namespace py = pybind11;

namespace {

using pagedserve::DType;
using pagedserve::LoraStacks;
using pagedserve::bindings::pointer;
using pagedserve::bindings::Ptr;

DType dtype_of(bool float32) { return float32 ? DType::kFloat32 : DType::kBFloat16; }

LoraStacks make_stacks(Ptr a, Ptr b, Ptr ranks, std::int64_t num_slots, std::int64_t k,
                       std::int64_t max_rank, const std::vector<std::int64_t>& part_widths,
                       bool float32) {
    if (part_widths.empty() || part_widths.size() > pagedserve::kLoraMaxParts) {
        throw std::invalid_argument("LoraStacks: 1 to 4 part widths");
    }
    LoraStacks s;
    s.a = pointer<const void>(a), s.b = pointer<const void>(b);
    s.ranks = pointer<const std::int32_t>(ranks);
    s.num_slots = num_slots, s.k = k, s.max_rank = max_rank;
    s.num_parts = static_cast<int>(part_widths.size());
    for (std::size_t p = 0; p < part_widths.size(); ++p) s.part_widths[p] = part_widths[p];
    s.dtype = dtype_of(float32);
    return s;
}

void lora_add(Ptr x, std::int64_t x_stride, bool x_float32, Ptr y, std::int64_t y_stride,
              bool y_float32, const LoraStacks& stacks, Ptr starts, Ptr slots,
              std::int64_t num_segments, int num_threads) {
    pagedserve::LoraArgs a;
    a.x = pointer<const void>(x), a.x_stride = x_stride, a.x_dtype = dtype_of(x_float32);
    a.y = pointer<void>(y), a.y_stride = y_stride, a.y_dtype = dtype_of(y_float32);
    a.stacks = stacks;
    a.segments = {pointer<const std::int64_t>(starts), pointer<const std::int32_t>(slots),
                  num_segments};
    py::gil_scoped_release release;
    pagedserve::lora_add_cpu(a, num_threads);
}

}  // namespace

void bind_lora(py::module_& m) {
    py::class_<LoraStacks>(m, "LoraStacks")
        .def(py::init(&make_stacks), py::kw_only(), py::arg("a"), py::arg("b"),
             py::arg("ranks"), py::arg("num_slots"), py::arg("k"), py::arg("max_rank"),
             py::arg("part_widths"), py::arg("float32"))
        .def_readonly("num_slots", &LoraStacks::num_slots)
        .def_readonly("k", &LoraStacks::k)
        .def_readonly("max_rank", &LoraStacks::max_rank)
        .def_property_readonly("n", &LoraStacks::n);
    m.def("lora_add", &lora_add, py::kw_only(), py::arg("x"), py::arg("x_stride"),
          py::arg("x_float32"), py::arg("y"), py::arg("y_stride"), py::arg("y_float32"),
          py::arg("stacks"), py::arg("starts"), py::arg("slots"), py::arg("num_segments"),
          py::arg("num_threads"));
    m.def("lora_path", &pagedserve::lora_path);
}
