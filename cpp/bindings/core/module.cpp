// pagedserve._core: the pybind11 module. Glue only; each bind_* lives beside it in this folder.
#include <pybind11/pybind11.h>

namespace py = pybind11;

void bind_cache(py::module_& m);    // cache.cpp: PageAllocator, Scheduler, StepPlan
void bind_kernels(py::module_& m);  // kernels.cpp: CPU paged-attention kernels

PYBIND11_MODULE(_core, m) {
    m.doc() = "pagedserve native core: page allocator, scheduler, CPU paged-attention kernels";
    bind_cache(m);
    bind_kernels(m);
}
