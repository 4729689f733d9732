// The bind_* functions of the pybind11 glue files, one per family; cpp/bindings/core.cpp calls
// them all into pagedserve._core.
#pragma once

#include <pybind11/pybind11.h>

void bind_page_allocator(pybind11::module_& m);  // page_allocator.cpp
void bind_scheduler(pybind11::module_& m);       // scheduler.cpp
void bind_attention(pybind11::module_& m);       // attention.cpp
void bind_layer_ops(pybind11::module_& m);       // layer_ops.cpp
void bind_linear(pybind11::module_& m);          // linear.cpp
void bind_decoder_stack(pybind11::module_& m);   // decoder_stack.cpp
void bind_linear_quant(pybind11::module_& m);    // linear_quant.cpp
void bind_cpu_features(pybind11::module_& m);      // cpu_features.cpp
void bind_lora(pybind11::module_& m);            // lora.cpp
