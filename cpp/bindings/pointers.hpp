// Raw pointers as Python ints (torch's data_ptr()), shared by the pybind11 glue files.
#pragma once

#include <cstdint>

namespace pagedserve::bindings {

using Ptr = std::uintptr_t;

template <typename T>
T* pointer(Ptr p) {
    return reinterpret_cast<T*>(p);
}

}  // namespace pagedserve::bindings
