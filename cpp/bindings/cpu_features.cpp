// pybind11 glue for cpu_features.hpp: one dict of flags and the ISA level, read (and lowered) by
// pagedserve/core/ops/cpu_features.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <stdexcept>
#include <string>

#include "pagedserve/cpu_features.hpp"
#include "bindings.hpp"

namespace py = pybind11;

namespace {

std::map<std::string, bool> features() {
    const pagedserve::CpuFeatures& f = pagedserve::cpu_features();
    return {
        {"avx2", f.avx2},
        {"fma", f.fma},
        {"f16c", f.f16c},
        {"avx_vnni", f.avx_vnni},
        {"avx512f", f.avx512f},
        {"avx512bw", f.avx512bw},
        {"avx512vl", f.avx512vl},
        {"avx512dq", f.avx512dq},
        {"avx512_bf16", f.avx512_bf16},
        {"avx512_vnni", f.avx512_vnni},
        {"amx_bf16", f.amx_bf16},
        {"amx_tile", f.amx_tile},
        {"amx_int8", f.amx_int8},
        {"amx_os_enabled", f.amx_os_enabled},
        {"amx_permitted", f.amx_permitted},
        {"neon", f.neon},
        {"neon_dotprod", f.neon_dotprod},
        {"i8mm", f.i8mm},
    };
}

pagedserve::CpuIsa level_named(const std::string& name) {
    for (const pagedserve::CpuIsa level : pagedserve::kCpuIsas) {
        if (name == pagedserve::cpu_isa_name(level)) return level;
    }
    throw std::invalid_argument("unknown CPU ISA level " + name);
}

}  // namespace

void bind_cpu_features(py::module_& m) {
    m.def("cpu_features", &features,
          "The CPU's AVX2 / AVX-512 / AMX flags (CPUID) and whether Linux granted AMX tile data; "
          "on aarch64 its NEON / dot-product / i8mm flags (Linux hwcaps).");
    m.def("cpu_isa_supported", [] { return pagedserve::cpu_isa_name(pagedserve::cpu_isa_supported()); },
          "The best ISA level this CPU runs: portable, avx2, avx2_vnni, avx512, avx512_bf16 or amx "
          "(x86-64); neon, neon_dotprod or neon_i8mm (aarch64).");
    m.def("cpu_isa", [] { return pagedserve::cpu_isa_name(pagedserve::cpu_isa()); },
          "The ISA level the kernels run at now.");
    m.def("set_cpu_isa",
          [](const std::string& name) {
              return pagedserve::cpu_isa_name(pagedserve::set_cpu_isa(level_named(name)));
          },
          py::arg("level"),
          "Lowers (or restores) the kernels' ISA level, capped at cpu_isa_supported(); returns "
          "the level now active.");
}
