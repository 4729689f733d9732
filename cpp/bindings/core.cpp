// pagedserve._core: one pybind11 module, its glue split by family (one file each, declared in
// bindings.hpp). Tensors never cross: pointers, sizes and strides do, named.
#include <pybind11/pybind11.h>

#include "bindings.hpp"

PYBIND11_MODULE(_core, m) {
    m.doc() = "pagedserve native core: page allocator, scheduler, CPU kernels";
    bind_page_allocator(m);
    bind_scheduler(m);
    bind_attention(m);
    bind_layer_ops(m);
    bind_linear(m);
    bind_linear_quant(m);
    bind_lora(m);
    bind_decoder_stack(m);
    bind_cpu_features(m);
}
