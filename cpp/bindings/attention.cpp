// pybind11 glue for the CPU paged-attention kernels (paged_attention.hpp). The argument structs
// are bound here, once; pagedserve._cuda reuses these Python types (pybind11 shares registered
// types across modules). Pointers cross as ints; the GIL is released while a kernel runs.
// pagedserve/core/attention/ops.py is the only caller.
#include <pybind11/pybind11.h>

#include <cstddef>

#include "bindings.hpp"
#include "pagedserve/paged_attention.hpp"
#include "pointers.hpp"

namespace py = pybind11;

namespace {

using namespace pagedserve;
using bindings::def_pointer;

void bind_views(py::module_& m) {
    py::enum_<DType>(m, "DType")
        .value("float32", DType::kFloat32)
        .value("bfloat16", DType::kBFloat16)
        .value("float16", DType::kFloat16);
    py::enum_<KvQuant>(m, "KvQuant")
        .value("none", KvQuant::kNone)
        .value("int8", KvQuant::kInt8)
        .value("fp16", KvQuant::kFp16)
        .value("fp8_e4m3", KvQuant::kFp8E4m3);
    py::class_<KvCacheView> cache(m, "KvCacheView");
    cache.def(py::init<>())
        .def_readwrite("num_pages", &KvCacheView::num_pages)
        .def_readwrite("num_kv_heads", &KvCacheView::num_kv_heads)
        .def_readwrite("page_size", &KvCacheView::page_size)
        .def_readwrite("head_size", &KvCacheView::head_size)
        .def_readwrite("quant", &KvCacheView::quant);
    def_pointer(cache, "data", &KvCacheView::data);
    py::class_<TokenTensor> tokens(m, "TokenTensor");
    tokens.def(py::init<>())
        .def_readwrite("token_stride", &TokenTensor::token_stride)
        .def_readwrite("head_stride", &TokenTensor::head_stride);
    def_pointer(tokens, "data", &TokenTensor::data);
}

void bind_args(py::module_& m) {
    py::class_<CacheWriteArgs> write(m, "CacheWriteArgs");
    write.def(py::init<>())
        .def_readwrite("key", &CacheWriteArgs::key)
        .def_readwrite("value", &CacheWriteArgs::value)
        .def_readwrite("cache", &CacheWriteArgs::cache)
        .def_readwrite("num_tokens", &CacheWriteArgs::num_tokens)
        .def_readwrite("dtype", &CacheWriteArgs::dtype);
    def_pointer(write, "slot_mapping", &CacheWriteArgs::slot_mapping);
    py::class_<AttentionArgs> attn(m, "AttentionArgs");
    attn.def(py::init<>())
        .def_readwrite("out_token_stride", &AttentionArgs::out_token_stride)
        .def_readwrite("out_head_stride", &AttentionArgs::out_head_stride)
        .def_readwrite("query", &AttentionArgs::query)
        .def_readwrite("cache", &AttentionArgs::cache)
        .def_readwrite("page_table_stride", &AttentionArgs::page_table_stride)
        .def_readwrite("num_reqs", &AttentionArgs::num_reqs)
        .def_readwrite("num_tokens", &AttentionArgs::num_tokens)
        .def_readwrite("num_heads", &AttentionArgs::num_heads)
        .def_readwrite("max_query_len", &AttentionArgs::max_query_len)
        .def_readwrite("max_seq_len", &AttentionArgs::max_seq_len)
        .def_readwrite("scale", &AttentionArgs::scale)
        .def_readwrite("dtype", &AttentionArgs::dtype)
        .def_readwrite("sliding_window", &AttentionArgs::sliding_window)
        .def_readwrite("logit_softcap", &AttentionArgs::logit_softcap)
        .def_readwrite("batch_invariant", &AttentionArgs::batch_invariant);
    def_pointer(attn, "out", &AttentionArgs::out);
    def_pointer(attn, "page_table", &AttentionArgs::page_table);
    def_pointer(attn, "seq_lens", &AttentionArgs::seq_lens);
    def_pointer(attn, "query_start_loc", &AttentionArgs::query_start_loc);
}

}  // namespace

void bind_attention(py::module_& m) {
    py::tuple dims(kKvCacheDims.size());
    for (std::size_t i = 0; i < kKvCacheDims.size(); ++i) dims[i] = py::str(kKvCacheDims[i]);
    m.attr("KV_CACHE_DIMS") = dims;
    m.attr("KV_SCALE_BYTES") = kKvScaleBytes;
    bind_views(m);
    bind_args(m);
    m.def("reshape_and_cache", &reshape_and_cache_cpu, py::arg("args"), py::arg("num_threads"),
          py::call_guard<py::gil_scoped_release>());
    m.def("paged_attention_cpu_path", &paged_attention_cpu_path,
          "The CPU attention kernels of the active ISA level: portable, avx2, avx512 or "
          "avx512_bf16.");
    m.def("paged_attention", &paged_attention_cpu, py::arg("args"), py::arg("num_threads"),
          py::call_guard<py::gil_scoped_release>());
}
