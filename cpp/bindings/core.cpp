// pagedserve._core: pybind11 glue only. First the page allocator and scheduler, then the CPU
// kernels.
//
// pybind11 glue for PageAllocator and Scheduler. The step plan crosses as read-only numpy views
// into the scheduler's buffers (base object: the Python Scheduler, which keeps them alive).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>

#include "pagedserve/layer_ops.hpp"
#include "pagedserve/page_allocator.hpp"
#include "pagedserve/paged_attention.hpp"
#include "pagedserve/scheduler.hpp"

namespace py = pybind11;
using pagedserve::PageAllocator;
using pagedserve::Scheduler;
using pagedserve::SchedulerConfig;
using pagedserve::StepPlan;

namespace {

using IntArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

template <typename T>
py::array view(const T* data, std::vector<py::ssize_t> shape, const py::handle& base) {
    std::vector<py::ssize_t> strides(shape.size(), sizeof(T));
    if (shape.size() == 2) strides[0] = shape[1] * static_cast<py::ssize_t>(sizeof(T));
    py::array a(py::dtype::of<T>(), std::move(shape), std::move(strides), data, base);
    py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    return a;
}

// (step, arrays in StepPlan field order, then the four scalars); see pagedserve/core/scheduler.py.
py::tuple plan_tuple(const StepPlan& p, const py::handle& base) {
    const py::ssize_t r = p.num_reqs, t = p.num_tokens, s = p.num_sampled;
    const py::ssize_t np = static_cast<py::ssize_t>(p.preempted_seq_ids.size());
    return py::make_tuple(
        p.step, view(p.seq_ids.data(), {r}, base), view(p.num_scheduled_tokens.data(), {r}, base),
        view(p.num_computed_tokens.data(), {r}, base), view(p.seq_lens.data(), {r}, base),
        view(p.query_start_loc.data(), {r + 1}, base), view(p.input_ids.data(), {t}, base),
        view(p.positions.data(), {t}, base), view(p.slot_mapping.data(), {t}, base),
        view(p.page_table.data(), {r, static_cast<py::ssize_t>(p.max_pages)}, base),
        view(p.logits_indices.data(), {s}, base), view(p.sample_seq_ids.data(), {s}, base),
        view(p.preempted_seq_ids.data(), {np}, base), p.num_reqs, p.num_tokens, p.max_query_len,
        p.max_seq_len);
}

std::optional<std::vector<int32_t>> allocate(PageAllocator& a, int32_t n) {
    std::vector<int32_t> pages;
    if (!a.allocate(n, pages)) return std::nullopt;
    return pages;
}

void check_page_tokens(const IntArray& tokens, py::ssize_t min_size) {
    if (tokens.ndim() != 1 || tokens.shape(0) < min_size)
        throw py::value_error("token_ids must be 1-D with at least " + std::to_string(min_size) +
                              " entries");
}

void bind_page_allocator(py::module_& m) {
    py::class_<PageAllocator>(m, "PageAllocator")
        .def(py::init<int32_t, int32_t, bool>(), py::arg("num_pages"), py::arg("page_size"),
             py::arg("enable_prefix_caching") = true)
        .def_property_readonly("num_pages", &PageAllocator::num_pages)
        .def_property_readonly("page_size", &PageAllocator::page_size)
        .def_property_readonly("num_free_pages", &PageAllocator::num_free_pages)
        .def_property_readonly("num_cached_pages", &PageAllocator::num_cached_pages)
        .def_property_readonly("num_used_pages", &PageAllocator::num_used_pages)
        .def("allocate", &allocate, py::arg("n"), "n fresh pages, or None (all or nothing)")
        .def("incref", &PageAllocator::incref, py::arg("page"))
        .def("release", &PageAllocator::release, py::arg("page"))
        .def("ref_count", &PageAllocator::ref_count, py::arg("page"))
        .def("generation", &PageAllocator::generation, py::arg("page"))
        .def(
            "match_prefix",
            [](PageAllocator& a, const IntArray& tokens, int32_t max_pages) {
                check_page_tokens(tokens, static_cast<py::ssize_t>(max_pages) * a.page_size());
                std::vector<int32_t> pages;
                a.match_prefix(tokens.data(), max_pages, pages);
                return pages;
            },
            py::arg("token_ids"), py::arg("max_pages"))
        .def(
            "register_page",
            [](PageAllocator& a, int32_t page, int32_t parent, uint32_t generation,
               const IntArray& tokens) {
                check_page_tokens(tokens, a.page_size());
                if (parent != PageAllocator::kNoPage) a.ref_count(parent);  // range check
                return a.register_page(page, parent, generation, tokens.data());
            },
            py::arg("page"), py::arg("parent"), py::arg("parent_generation"),
            py::arg("token_ids"));
}

void bind_scheduler(py::module_& m) {
    py::class_<Scheduler>(m, "Scheduler")
        .def(py::init([](int32_t num_pages, int32_t page_size, int32_t max_num_seqs,
                         int32_t max_num_batched_tokens, int32_t max_model_len, bool prefix) {
                 return new Scheduler(SchedulerConfig{num_pages, page_size, max_num_seqs,
                                                      max_num_batched_tokens, max_model_len,
                                                      prefix});
             }),
             py::kw_only(), py::arg("num_pages"), py::arg("page_size"), py::arg("max_num_seqs"),
             py::arg("max_num_batched_tokens"), py::arg("max_model_len"),
             py::arg("enable_prefix_caching"))
        .def(
            "add_request",
            [](Scheduler& s, int64_t seq_id, const IntArray& prompt, int64_t max_tokens,
               bool use_prefix_cache) {
                if (prompt.ndim() != 1) throw py::value_error("prompt_token_ids must be 1-D");
                s.add_request(seq_id, prompt.data(), static_cast<int32_t>(prompt.shape(0)),
                              max_tokens, use_prefix_cache);
            },
            py::arg("seq_id"), py::arg("prompt_token_ids"), py::arg("max_tokens"),
            py::arg("use_prefix_cache") = true)
        .def("schedule",
             [](py::object self) { return plan_tuple(self.cast<Scheduler&>().schedule(), self); })
        .def(
            "update",
            [](Scheduler& s, int64_t step, const IntArray& sampled) {
                if (sampled.ndim() != 1) throw py::value_error("sampled_token_ids must be 1-D");
                s.update(step, sampled.data(), static_cast<int32_t>(sampled.shape(0)));
            },
            py::arg("step"), py::arg("sampled_token_ids"))
        .def("finish", &Scheduler::finish, py::arg("seq_id"))
        .def("abort", &Scheduler::abort, py::arg("seq_id"))
        .def_property_readonly("num_running", &Scheduler::num_running)
        .def_property_readonly("num_waiting", &Scheduler::num_waiting)
        .def_property_readonly("has_unfinished", &Scheduler::has_unfinished)
        .def("num_cached_tokens", &Scheduler::num_cached_tokens, py::arg("seq_id"))
        .def("num_computed_tokens", &Scheduler::num_computed_tokens, py::arg("seq_id"))
        .def("page_ids", &Scheduler::page_ids, py::arg("seq_id"))
        .def("ref_count",
             [](const Scheduler& s, int32_t page) { return s.allocator().ref_count(page); })
        .def("stats", [](const Scheduler& s) {
            const pagedserve::SchedulerStats st = s.stats();
            return py::make_tuple(st.num_pages, st.page_size, st.num_free_pages,
                                  st.num_cached_pages, st.num_used_pages, st.prefix_query_tokens,
                                  st.prefix_hit_tokens, st.num_preemptions);
        });
}

}  // namespace

static void bind_cache(py::module_& m) {
    py::register_exception<pagedserve::AdmissionError>(m, "AdmissionError", PyExc_ValueError);
    bind_page_allocator(m);
    bind_scheduler(m);
}

// pybind11 glue for the CPU paged-attention kernels. The argument structs of
// paged_attention.hpp are bound here, once; pagedserve._cuda reuses these Python types (pybind11
// shares registered types across modules). Pointers cross as ints; the GIL is released while a
// kernel runs. pagedserve/core/attention/ops.py is the only caller.


namespace {

using namespace pagedserve;

template <typename Struct, typename Pointer>
void def_pointer(py::class_<Struct>& cls, const char* name, Pointer Struct::*field) {
    cls.def_property(
        name, [field](const Struct& s) { return reinterpret_cast<std::uintptr_t>(s.*field); },
        [field](Struct& s, std::uintptr_t p) { s.*field = reinterpret_cast<Pointer>(p); });
}

void bind_views(py::module_& m) {
    py::enum_<DType>(m, "DType")
        .value("float32", DType::kFloat32)
        .value("bfloat16", DType::kBFloat16)
        .value("float16", DType::kFloat16);
    py::class_<KvCacheView> cache(m, "KvCacheView");
    cache.def(py::init<>())
        .def_readwrite("num_pages", &KvCacheView::num_pages)
        .def_readwrite("num_kv_heads", &KvCacheView::num_kv_heads)
        .def_readwrite("page_size", &KvCacheView::page_size)
        .def_readwrite("head_size", &KvCacheView::head_size);
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
        .def_readwrite("logit_softcap", &AttentionArgs::logit_softcap);
    def_pointer(attn, "out", &AttentionArgs::out);
    def_pointer(attn, "page_table", &AttentionArgs::page_table);
    def_pointer(attn, "seq_lens", &AttentionArgs::seq_lens);
    def_pointer(attn, "query_start_loc", &AttentionArgs::query_start_loc);
}

}  // namespace

static void bind_kernels(py::module_& m) {
    py::tuple dims(kKvCacheDims.size());
    for (std::size_t i = 0; i < kKvCacheDims.size(); ++i) dims[i] = py::str(kKvCacheDims[i]);
    m.attr("KV_CACHE_DIMS") = dims;
    bind_views(m);
    bind_args(m);
    m.def("reshape_and_cache", &reshape_and_cache_cpu, py::arg("args"), py::arg("num_threads"),
          py::call_guard<py::gil_scoped_release>());
    m.def("paged_attention", &paged_attention_cpu, py::arg("args"), py::arg("num_threads"),
          py::call_guard<py::gil_scoped_release>());
}

// pybind11 glue for the fused layer ops (layer_ops.hpp): plain arguments rather than argument
// structs, because these run several times per layer and step and each attribute set from Python
// costs as much as the call. pagedserve/core/models/layer_ops.py is the only caller.
namespace {

using Ptr = std::uintptr_t;

void* ptr(Ptr p) { return reinterpret_cast<void*>(p); }

void bind_layer_ops(py::module_& m) {
    using pagedserve::DType;
    using pagedserve::RowView;
    m.def(
        "rms_norm",
        [](Ptr out, int64_t out_stride, Ptr x, int64_t x_stride, Ptr weight, int64_t num_rows,
           int64_t hidden_size, float eps, DType dtype, int sum_lanes, int num_threads) {
            pagedserve::rms_norm_cpu({ptr(out), out_stride}, {ptr(x), x_stride}, ptr(weight),
                                     num_rows, hidden_size, eps, dtype, sum_lanes, num_threads);
        },
        py::call_guard<py::gil_scoped_release>());
    m.def(
        "rotary",
        [](Ptr qk, int64_t token_stride, int64_t head_stride, Ptr cos, int64_t cos_stride,
           Ptr signed_sin, int64_t sin_stride, int64_t num_tokens, int64_t num_heads,
           int64_t head_size, DType dtype, int num_threads) {
            const pagedserve::RotaryArgs args{ptr(qk), token_stride, head_stride,
                                              {ptr(cos), cos_stride}, {ptr(signed_sin), sin_stride},
                                              num_tokens, num_heads, head_size, dtype};
            pagedserve::rotary_cpu(args, num_threads);
        },
        py::call_guard<py::gil_scoped_release>());
    m.def(
        "silu_and_mul",
        [](Ptr out, int64_t out_stride, Ptr gate_up, int64_t gate_up_stride, int64_t num_rows,
           int64_t intermediate_size, DType dtype, int num_threads) {
            pagedserve::silu_and_mul_cpu({ptr(out), out_stride}, {ptr(gate_up), gate_up_stride},
                                         num_rows, intermediate_size, dtype, num_threads);
        },
        py::call_guard<py::gil_scoped_release>());
}

}  // namespace

void bind_linear(py::module_& m);         // cpp/bindings/linear.cpp
void bind_decoder_stack(py::module_& m);  // cpp/bindings/decoder_stack.cpp

PYBIND11_MODULE(_core, m) {
    m.doc() = "pagedserve native core: page allocator, scheduler, CPU kernels";
    bind_cache(m);
    bind_kernels(m);
    bind_layer_ops(m);
    bind_linear(m);
    bind_decoder_stack(m);
}
