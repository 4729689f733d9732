// Raw pointers as Python ints (torch's data_ptr()), shared by the pybind11 glue files.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

namespace pagedserve::bindings {

using Ptr = std::uintptr_t;

template <typename T>
T* pointer(Ptr p) {
    return reinterpret_cast<T*>(p);
}

// A pointer field of a bound argument struct, read and written from Python as an int.
template <typename Struct, typename Pointer>
void def_pointer(pybind11::class_<Struct>& cls, const char* name, Pointer Struct::*field) {
    cls.def_property(
        name, [field](const Struct& s) { return reinterpret_cast<Ptr>(s.*field); },
        [field](Struct& s, Ptr p) { s.*field = reinterpret_cast<Pointer>(p); });
}

}  // namespace pagedserve::bindings
