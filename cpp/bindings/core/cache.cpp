// pybind11 glue for PageAllocator and Scheduler. The step plan crosses as read-only numpy views
// into the scheduler's buffers (base object: the Python Scheduler, which keeps them alive).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "pagedserve/page_allocator.hpp"
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

void bind_cache(py::module_& m) {
    py::register_exception<pagedserve::AdmissionError>(m, "AdmissionError", PyExc_ValueError);
    bind_page_allocator(m);
    bind_scheduler(m);
}
