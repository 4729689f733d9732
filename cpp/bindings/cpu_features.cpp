// pybind11 glue for cpu_features.hpp: one dict of flags, read by
// pagedserve/core/ops/cpu_features.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <string>

#include "pagedserve/cpu_features.hpp"
#include "bindings.hpp"

namespace py = pybind11;

namespace {

std::map<std::string, bool> features() {
    const pagedserve::CpuFeatures& f = pagedserve::cpu_features();
    std::map<std::string, bool> d;
    d["avx512f"] = f.avx512f;
    d["avx512_bf16"] = f.avx512_bf16;
    d["avx512_vnni"] = f.avx512_vnni;
    d["amx_bf16"] = f.amx_bf16;
    d["amx_tile"] = f.amx_tile;
    d["amx_int8"] = f.amx_int8;
    d["amx_os_enabled"] = f.amx_os_enabled;
    d["amx_permitted"] = f.amx_permitted;
    return d;
}

}  // namespace

void bind_cpu_features(py::module_& m) {
    m.def("cpu_features", &features,
          "The CPU's AVX-512 / AMX flags (CPUID) and whether Linux granted AMX tile data.");
}
