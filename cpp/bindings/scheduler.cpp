// pybind11 glue for the Scheduler (scheduler.hpp). The step plan and the stats cross as bound
// structs with named fields; the plan's arrays are read-only numpy views into the scheduler's
// buffers (valid until the next schedule()), each keeping the plan, and so the scheduler, alive.
// pagedserve/core/sched/scheduler.py is the only caller.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "pagedserve/scheduler.hpp"

namespace py = pybind11;
using pagedserve::Scheduler;
using pagedserve::SchedulerConfig;
using pagedserve::SchedulerStats;
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

// A read-only property `name` viewing `field` of the plan, of `rows(plan)` entries.
template <typename T, typename Rows>
void def_array(py::class_<StepPlan>& cls, const char* name, std::vector<T> StepPlan::*field,
               Rows rows) {
    cls.def_property_readonly(name, [field, rows](py::object self) {
        const StepPlan& p = self.cast<const StepPlan&>();
        return view((p.*field).data(), {static_cast<py::ssize_t>(rows(p))}, self);
    });
}

void bind_step_plan(py::module_& m) {
    py::class_<StepPlan> plan(m, "StepPlan");
    plan.def_readonly("step", &StepPlan::step)
        .def_readonly("num_reqs", &StepPlan::num_reqs)
        .def_readonly("num_tokens", &StepPlan::num_tokens)
        .def_readonly("num_sampled", &StepPlan::num_sampled)
        .def_readonly("max_query_len", &StepPlan::max_query_len)
        .def_readonly("max_seq_len", &StepPlan::max_seq_len)
        .def_readonly("max_pages", &StepPlan::max_pages);
    const auto reqs = [](const StepPlan& p) { return p.num_reqs; };
    const auto tokens = [](const StepPlan& p) { return p.num_tokens; };
    const auto sampled = [](const StepPlan& p) { return p.num_sampled; };
    def_array(plan, "seq_ids", &StepPlan::seq_ids, reqs);
    def_array(plan, "num_scheduled_tokens", &StepPlan::num_scheduled_tokens, reqs);
    def_array(plan, "num_computed_tokens", &StepPlan::num_computed_tokens, reqs);
    def_array(plan, "seq_lens", &StepPlan::seq_lens, reqs);
    def_array(plan, "query_start_loc", &StepPlan::query_start_loc,
              [](const StepPlan& p) { return p.num_reqs + 1; });
    def_array(plan, "input_ids", &StepPlan::input_ids, tokens);
    def_array(plan, "positions", &StepPlan::positions, tokens);
    def_array(plan, "slot_mapping", &StepPlan::slot_mapping, tokens);
def_array(plan, "num_draft_tokens", &StepPlan::num_draft_tokens, reqs);
    def_array(plan, "logits_indices", &StepPlan::logits_indices, sampled);
    def_array(plan, "sample_seq_ids", &StepPlan::sample_seq_ids, sampled);
    def_array(plan, "preempted_seq_ids", &StepPlan::preempted_seq_ids,
              [](const StepPlan& p) { return p.preempted_seq_ids.size(); });
    plan.def_property_readonly("page_table", [](py::object self) {
        const StepPlan& p = self.cast<const StepPlan&>();
        return view(p.page_table.data(), {p.num_reqs, p.max_pages}, self);
    });
}

void bind_stats(py::module_& m) {
    py::class_<SchedulerStats>(m, "SchedulerStats")
        .def_readonly("num_pages", &SchedulerStats::num_pages)
        .def_readonly("page_size", &SchedulerStats::page_size)
        .def_readonly("num_free_pages", &SchedulerStats::num_free_pages)
        .def_readonly("num_cached_pages", &SchedulerStats::num_cached_pages)
        .def_readonly("num_used_pages", &SchedulerStats::num_used_pages)
        .def_readonly("prefix_query_tokens", &SchedulerStats::prefix_query_tokens)
        .def_readonly("prefix_hit_tokens", &SchedulerStats::prefix_hit_tokens)
        .def_readonly("num_preemptions", &SchedulerStats::num_preemptions);
}

}  // namespace

void bind_scheduler(py::module_& m) {
    py::register_exception<pagedserve::AdmissionError>(m, "AdmissionError", PyExc_ValueError);
    bind_step_plan(m);
    bind_stats(m);
    py::class_<Scheduler>(m, "Scheduler")
        .def(py::init([](int32_t num_pages, int32_t page_size, int32_t max_num_seqs,
                         int32_t max_num_batched_tokens, int32_t max_model_len, bool prefix,
                         int32_t max_prefill_tokens_while_decoding) {
                 return new Scheduler(SchedulerConfig{
                     num_pages, page_size, max_num_seqs, max_num_batched_tokens, max_model_len,
                     prefix, max_prefill_tokens_while_decoding});
             }),
             py::kw_only(), py::arg("num_pages"), py::arg("page_size"), py::arg("max_num_seqs"),
             py::arg("max_num_batched_tokens"), py::arg("max_model_len"),
             py::arg("enable_prefix_caching"), py::arg("max_prefill_tokens_while_decoding") = 0)
        .def(
            "add_request",
            [](Scheduler& s, int64_t seq_id, const IntArray& prompt, int64_t max_tokens,
               bool use_prefix_cache, uint64_t cache_salt,
               const std::optional<IntArray>& whole_spans) {
                if (prompt.ndim() != 1) throw py::value_error("prompt_token_ids must be 1-D");
                const int32_t* spans = nullptr;
                int32_t num_spans = 0;
                if (whole_spans.has_value()) {
                    if (whole_spans->ndim() != 2 || whole_spans->shape(1) != 2)
                        throw py::value_error("whole_spans must be [n, 2]");
                    spans = whole_spans->data();
                    num_spans = static_cast<int32_t>(whole_spans->shape(0));
                }
                s.add_request(seq_id, prompt.data(), static_cast<int32_t>(prompt.shape(0)),
                              max_tokens, use_prefix_cache, cache_salt, spans, num_spans);
            },
            py::arg("seq_id"), py::arg("prompt_token_ids"), py::arg("max_tokens"),
            py::arg("use_prefix_cache") = true, py::arg("cache_salt") = 0,
            py::arg("whole_spans") = py::none())
        .def("schedule", &Scheduler::schedule, py::return_value_policy::reference_internal,
             "The next step's plan: a view of the scheduler's buffers, valid until the next "
             "schedule()")
        .def(
            "propose",
            [](Scheduler& s, int64_t seq_id, const IntArray& draft) {
                if (draft.ndim() != 1) throw py::value_error("draft_token_ids must be 1-D");
                s.propose(seq_id, draft.data(), static_cast<int32_t>(draft.shape(0)));
            },
            py::arg("seq_id"), py::arg("draft_token_ids"),
            "Draft tokens of a decoding sequence for the next schedule() only")
        .def(
            "update",
            [](Scheduler& s, int64_t step, const IntArray& sampled,
               const std::optional<IntArray>& accepted) {
                if (sampled.ndim() != 1) throw py::value_error("sampled_token_ids must be 1-D");
                const int32_t* counts = nullptr;
                if (accepted.has_value()) {
                    if (accepted->ndim() != 1 || accepted->shape(0) != s.last_plan().num_reqs)
                        throw py::value_error("num_accepted must have one entry per plan row");
                    counts = accepted->data();
                }
                s.update(step, sampled.data(), static_cast<int32_t>(sampled.shape(0)), counts);
            },
            py::arg("step"), py::arg("sampled_token_ids"), py::arg("num_accepted") = py::none())
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
        .def_property_readonly(
            "kv_events", [](const Scheduler& s) -> pagedserve::KvEventLog& {
                return s.allocator().events();
            },
            py::return_value_policy::reference_internal)
        .def("cached_page_hashes",
             [](const Scheduler& s) {
                 // The hash of every page in the prefix cache (tests check the KV events with it).
                 const pagedserve::PageAllocator& a = s.allocator();
                 std::vector<uint64_t> hashes;
                 for (int32_t p = 0; p < a.num_pages(); ++p)
                     if (a.is_registered(p)) hashes.push_back(a.page_hash(p));
                 return hashes;
             })
        .def("stats", &Scheduler::stats);
}

