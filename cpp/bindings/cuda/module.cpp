// pagedserve._cuda: the pybind11 module for the CUDA kernels. Glue only.
#include <pybind11/pybind11.h>

namespace py = pybind11;

PYBIND11_MODULE(_cuda, m) {
    m.doc() = "pagedserve CUDA paged-attention kernels (raw device pointers, caller's stream)";
}
