// pybind11 glue for the PageAllocator (page_allocator.hpp): tests and introspection; the
// scheduler owns the allocator the engine uses.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "pagedserve/page_allocator.hpp"

namespace py = pybind11;
using pagedserve::KvEventLog;
using pagedserve::PageAllocator;

namespace {

using IntArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

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

template <typename T>
py::array_t<T> copy_out(const std::vector<T>& v) {
    py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
    std::copy(v.begin(), v.end(), a.mutable_data());
    return a;
}

// The log's records as numpy copies (kinds, hashes, parent_hashes, has_parent, salts,
// token_ids [num_stored, page_size]), then empty.
py::tuple drain(KvEventLog& log, int32_t page_size) {
    const py::ssize_t width = page_size;
    const py::ssize_t num_stored = static_cast<py::ssize_t>(log.token_ids.size()) / width;
    py::array_t<int32_t> tokens = copy_out(log.token_ids);
    py::tuple out = py::make_tuple(copy_out(log.kinds), copy_out(log.hashes),
                                   copy_out(log.parent_hashes), copy_out(log.has_parent),
                                   copy_out(log.salts), tokens.reshape({num_stored, width}));
    log.clear();
    return out;
}

void bind_kv_event_log(py::module_& m) {
    py::class_<KvEventLog>(m, "KvEventLog")
        .def_readwrite("enabled", &KvEventLog::enabled)
        .def("__len__", &KvEventLog::size)
        .def("drain", &drain, py::arg("page_size"),
             "(kinds, hashes, parent_hashes, has_parent, salts, token_ids), oldest first; "
             "empties it");
}

}  // namespace

void bind_page_allocator(py::module_& m) {
    bind_kv_event_log(m);
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
        .def_property_readonly("kv_events", &PageAllocator::events,
                               py::return_value_policy::reference_internal)
        .def(
            "match_prefix",
            [](PageAllocator& a, const IntArray& tokens, int32_t max_pages, uint64_t salt) {
                check_page_tokens(tokens, static_cast<py::ssize_t>(max_pages) * a.page_size());
                std::vector<int32_t> pages;
                a.match_prefix(tokens.data(), max_pages, pages, salt);
                return pages;
            },
            py::arg("token_ids"), py::arg("max_pages"), py::arg("salt") = 0)
        .def(
            "register_page",
            [](PageAllocator& a, int32_t page, int32_t parent, uint32_t generation,
               const IntArray& tokens, uint64_t salt) {
                check_page_tokens(tokens, a.page_size());
                if (parent != PageAllocator::kNoPage) a.ref_count(parent);  // range check
                return a.register_page(page, parent, generation, tokens.data(), salt);
            },
            py::arg("page"), py::arg("parent"), py::arg("parent_generation"),
            py::arg("token_ids"), py::arg("salt") = 0);
}

