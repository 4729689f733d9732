// pagedserve._cuda: the pybind11 module for the CUDA kernels. Glue only: the argument types are
// the ones pagedserve._core binds (imported first, shared through pybind11's type registry);
// pointers and the cudaStream_t cross as ints; the GIL is released while kernels are enqueued.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "pagedserve/paged_attention.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_cuda, m) {
    using namespace pagedserve;
    m.doc() = "pagedserve CUDA paged-attention kernels (raw device pointers, caller's stream)";
    py::module_::import("pagedserve._core");  // registers CacheWriteArgs and AttentionArgs
    m.attr("DECODE_SPLIT_LEN") = kCudaDecodeSplitLen;
    m.def(
        "reshape_and_cache",
        [](const CacheWriteArgs& args, std::uintptr_t stream) {
            reshape_and_cache_cuda(args, reinterpret_cast<void*>(stream));
        },
        py::arg("args"), py::arg("stream"), py::call_guard<py::gil_scoped_release>());
    m.def(
        "paged_attention",
        [](const AttentionArgs& args, std::uintptr_t workspace, int max_splits,
           std::uintptr_t stream) {
            paged_attention_cuda(args, reinterpret_cast<float*>(workspace), max_splits,
                                 reinterpret_cast<void*>(stream));
        },
        py::arg("args"), py::arg("workspace"), py::arg("max_splits"), py::arg("stream"),
        py::call_guard<py::gil_scoped_release>());
}
