// Unit tests of the scheduler: chunked prefill, decode, sampling rows, prefix hits, preemption
// by recompute, abort/finish freeing pages, admission errors, the prefill cap while decoding.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "check.hpp"
#include "pagedserve/scheduler.hpp"

using pagedserve::AdmissionError;
using pagedserve::Scheduler;
using pagedserve::SchedulerConfig;
using pagedserve::StepPlan;

namespace {

std::vector<int32_t> iota_tokens(int32_t n, int32_t start = 1) {
    std::vector<int32_t> t(n);
    std::iota(t.begin(), t.end(), start);
    return t;
}

void add(Scheduler& s, int64_t id, const std::vector<int32_t>& prompt, int64_t max_tokens) {
    s.add_request(id, prompt.data(), static_cast<int32_t>(prompt.size()), max_tokens);
}

// Runs one step, sampling `token` for every request that samples.
const StepPlan& step(Scheduler& s, int32_t token = 7) {
    const StepPlan& p = s.schedule();
    std::vector<int32_t> sampled(p.num_sampled, token);
    s.update(p.step, sampled.data(), p.num_sampled);
    return p;
}

}  // namespace

TEST(chunked_prefill_then_decode) {
    Scheduler s(SchedulerConfig{16, 4, 4, 6, 64, false});
    add(s, 1, iota_tokens(10), 4);
    const StepPlan& p1 = s.schedule();
    CHECK(p1.num_reqs == 1 && p1.num_tokens == 6 && p1.num_sampled == 0);
    CHECK(p1.positions[5] == 5 && p1.input_ids[5] == 6);
    CHECK(p1.slot_mapping[5] == p1.page_table[1] * 4 + 1);
    CHECK(p1.max_pages == 2);
    s.update(p1.step, nullptr, 0);
    const StepPlan& p2 = s.schedule();
    CHECK(p2.num_tokens == 4 && p2.num_computed_tokens[0] == 6 && p2.seq_lens[0] == 10);
    CHECK(p2.num_sampled == 1 && p2.logits_indices[0] == 3 && p2.sample_seq_ids[0] == 1);
    int32_t token = 99;
    s.update(p2.step, &token, 1);
    const StepPlan& p3 = s.schedule();
    CHECK(p3.num_tokens == 1 && p3.input_ids[0] == 99 && p3.positions[0] == 10);
    CHECK(p3.num_sampled == 1);
}

TEST(decodes_first_then_waiting_fcfs) {
    Scheduler s(SchedulerConfig{32, 4, 4, 8, 64, false});
    add(s, 1, iota_tokens(5), 8);
    step(s);
    add(s, 2, iota_tokens(20), 8);
    add(s, 3, iota_tokens(3), 8);
    const StepPlan& p = s.schedule();
    CHECK(p.num_reqs == 2);  // request 1 decodes, request 2 gets the other 7 tokens
    CHECK(p.seq_ids[0] == 1 && p.num_scheduled_tokens[0] == 1);
    CHECK(p.seq_ids[1] == 2 && p.num_scheduled_tokens[1] == 7);
    CHECK(p.query_start_loc[2] == 8 && p.num_sampled == 1);
    CHECK(s.num_waiting() == 1 && s.num_running() == 2);
}

TEST(max_num_seqs_caps_running) {
    Scheduler s(SchedulerConfig{32, 4, 2, 64, 64, false});
    for (int64_t id = 0; id < 3; ++id) add(s, id, iota_tokens(3), 4);
    const StepPlan& p = s.schedule();
    CHECK(p.num_reqs == 2 && s.num_waiting() == 1);
}

TEST(prefix_hit_skips_cached_pages_but_computes_last_token) {
    Scheduler s(SchedulerConfig{16, 4, 4, 64, 64, true});
    const std::vector<int32_t> prompt = iota_tokens(8);
    add(s, 1, prompt, 2);
    step(s);
    s.finish(1);
    add(s, 2, prompt, 2);
    const StepPlan& p = s.schedule();
    // Both pages are cached, but the last prompt token must run: only page 0 is a hit.
    CHECK(p.num_computed_tokens[0] == 4 && p.num_scheduled_tokens[0] == 4);
    CHECK(s.num_cached_tokens(2) == 4);
    CHECK(s.stats().prefix_hit_tokens == 4 && s.stats().prefix_query_tokens == 16);
}

TEST(preemption_recomputes_newest_request) {
    // 4 pages of 2 tokens; two requests of 3 prompt tokens each take 2 pages; the first to
    // cross into a third page forces the newest one out.
    Scheduler s(SchedulerConfig{4, 2, 4, 64, 16, false});
    add(s, 1, iota_tokens(3), 6);
    add(s, 2, iota_tokens(3, 10), 6);
    step(s);  // prefill both: 4 pages used, 4 tokens each
    step(s);  // decode position 3 (still page 1): 5 tokens each
    const StepPlan& p = s.schedule();  // request 1 needs a 3rd page at position 4
    CHECK(p.preempted_seq_ids.size() == 1 && p.preempted_seq_ids[0] == 2);
    CHECK(p.num_reqs == 1 && p.seq_ids[0] == 1);
    CHECK(s.num_waiting() == 1 && s.stats().num_preemptions == 1);
    int32_t token = 5;
    s.update(p.step, &token, 1);
    s.abort(1);
    const StepPlan& q = s.schedule();  // request 2 recomputes prompt + its generated token
    CHECK(q.num_reqs == 1 && q.seq_ids[0] == 2 && q.num_scheduled_tokens[0] == 5);
    CHECK(q.input_ids[3] == 7 && q.input_ids[4] == 7 && q.num_sampled == 1);
}

TEST(abort_and_finish_free_pages) {
    Scheduler s(SchedulerConfig{8, 4, 4, 64, 32, false});
    add(s, 1, iota_tokens(9), 4);
    add(s, 2, iota_tokens(3), 4);
    step(s);
    CHECK(s.stats().num_used_pages == 4);
    s.abort(1);
    CHECK(s.stats().num_used_pages == 1);
    s.finish(2);
    CHECK(s.stats().num_free_pages == 8 && !s.has_unfinished());
    s.abort(12345);  // unknown: no-op
}

TEST(abort_between_schedule_and_update_is_safe) {
    Scheduler s(SchedulerConfig{8, 4, 4, 64, 32, false});
    add(s, 1, iota_tokens(3), 4);
    add(s, 2, iota_tokens(3), 4);
    const StepPlan& p = s.schedule();
    s.abort(1);
    std::vector<int32_t> sampled = {3, 4};
    s.update(p.step, sampled.data(), 2);
    CHECK(s.num_computed_tokens(2) == 3);
    CHECK_THROWS(std::invalid_argument, s.update(p.step, sampled.data(), 2));
}

TEST(admission_errors) {
    Scheduler s(SchedulerConfig{4, 4, 4, 64, 32, false});
    const std::vector<int32_t> prompt = iota_tokens(10);
    CHECK_THROWS(AdmissionError, s.add_request(1, prompt.data(), 0, 4));
    CHECK_THROWS(AdmissionError, s.add_request(1, prompt.data(), 10, 30));  // > max_model_len
    CHECK_THROWS(AdmissionError, s.add_request(1, prompt.data(), 10, 8));   // 17 tokens > 4 pages
    s.add_request(1, prompt.data(), 10, 7);  // 16 tokens of KV: exactly 4 pages
    CHECK_THROWS(std::invalid_argument, s.add_request(1, prompt.data(), 10, 1));
    CHECK_THROWS(std::invalid_argument, Scheduler(SchedulerConfig{0, 4, 4, 64, 32, false}));
}

TEST(length_done_request_is_not_scheduled) {
    Scheduler s(SchedulerConfig{8, 4, 4, 64, 32, false});
    add(s, 1, iota_tokens(3), 1);
    step(s);
    CHECK(s.schedule().num_reqs == 0);
    CHECK(s.has_unfinished());  // until the engine calls finish()
}

// Sum of the prefill rows' tokens of a plan (rows that do not sample, or sample after more than
// one token: prompt chunks); the decode rows are the one-token rows of `decoders`.
int32_t prefill_tokens(const StepPlan& p, const std::vector<int64_t>& decoders) {
    int32_t total = 0;
    for (int32_t row = 0; row < p.num_reqs; ++row) {
        const bool decoder = std::find(decoders.begin(), decoders.end(), p.seq_ids[row]) !=
                             decoders.end();
        if (!decoder) total += p.num_scheduled_tokens[row];
    }
    return total;
}

TEST(prefill_capped_while_decoding_full_chunk_otherwise) {
    // Budget 64, at most 8 prefill tokens in a step where a request decodes.
    Scheduler s(SchedulerConfig{64, 4, 4, 64, 128, false, 8});
    add(s, 1, iota_tokens(3), 40);
    add(s, 2, iota_tokens(5, 20), 40);
    step(s);  // nothing decodes yet: both prompts whole
    add(s, 3, iota_tokens(50, 100), 4);  // a long prompt arrives while 1 and 2 decode
    add(s, 4, iota_tokens(30, 200), 4);  // and a second one right behind it
    int32_t steps = 0;
    while (s.num_computed_tokens(3) < 50) {
        const StepPlan& p = step(s);
        ++steps;
        CHECK(p.num_reqs >= 3 && p.seq_ids[0] == 1 && p.seq_ids[1] == 2);
        CHECK(p.num_scheduled_tokens[0] == 1 && p.num_scheduled_tokens[1] == 1);
        CHECK(prefill_tokens(p, {1, 2}) == 8);  // both prompts share the 8
    }
    CHECK(steps == 7);  // 50 tokens in chunks of 8, the last one shared with request 4
    const StepPlan& p = step(s);  // 3 decodes now too; 4 still gets 8
    CHECK(p.num_reqs == 4 && prefill_tokens(p, {1, 2, 3}) == 8);
    s.finish(1);
    s.finish(2);
    s.finish(3);
    const StepPlan& q = s.schedule();  // nothing decodes: 4 takes its whole rest at once
    CHECK(q.num_reqs == 1 && q.seq_ids[0] == 4 && q.num_scheduled_tokens[0] == 30 - 14);
    Scheduler fresh(SchedulerConfig{64, 4, 4, 64, 128, false, 8});
    add(fresh, 3, iota_tokens(50, 100), 4);
    add(fresh, 4, iota_tokens(30, 200), 4);
    const StepPlan& r = fresh.schedule();  // no decode: the whole budget, FCFS
    CHECK(r.num_reqs == 2 && r.num_scheduled_tokens[0] == 50 && r.num_scheduled_tokens[1] == 14);
}

TEST(whole_spans_are_never_cut_by_a_chunk) {
    // Budget 6, page_size 4: a prompt of 14 whose tokens [4, 9) must be computed in one chunk.
    Scheduler s(SchedulerConfig{16, 4, 4, 6, 64, true});
    const std::vector<int32_t> prompt = iota_tokens(14);
    const int32_t spans[] = {4, 9};
    s.add_request(1, prompt.data(), 14, 2, true, 0, spans, 1);
    const StepPlan& p1 = step(s);
    CHECK(p1.num_tokens == 4);  // 6 would end inside [4, 9): cut back to its start
    const StepPlan& p2 = step(s);
    CHECK(p2.num_tokens == 6 && p2.num_computed_tokens[0] == 4);  // through the span
    const StepPlan& p3 = step(s);
    CHECK(p3.num_tokens == 4 && p3.num_sampled == 1);  // the rest of the prompt
    // A prompt of its first 10 tokens hits pages [0, 8): it starts inside the span (whose
    // first tokens' KV were computed with the whole span) and reaches its end.
    s.add_request(2, prompt.data(), 10, 2, true, 0, spans, 1);
    const StepPlan& p4 = step(s);
    CHECK(p4.num_reqs == 2 && p4.seq_ids[1] == 2 && p4.num_computed_tokens[1] == 8);
    CHECK(p4.num_scheduled_tokens[1] == 2);
    // A span that no budget holds is refused at admission, and so are unsorted ones.
    const int32_t long_span[] = {2, 9};
    CHECK_THROWS(AdmissionError, s.add_request(3, prompt.data(), 14, 2, true, 0, long_span, 1));
    const int32_t unsorted[] = {6, 8, 4, 5};
    CHECK_THROWS(std::invalid_argument,
                 s.add_request(3, prompt.data(), 14, 2, true, 0, unsorted, 2));
}

TEST(a_chunk_that_would_end_inside_a_span_waits) {
    // Prefill capped at 3 tokens while request 1 decodes.
    Scheduler s(SchedulerConfig{32, 4, 4, 8, 64, false, 3});
    add(s, 1, iota_tokens(3), 20);
    step(s);
    const std::vector<int32_t> prompt = iota_tokens(10, 50);
    const int32_t spans[] = {1, 4};
    s.add_request(2, prompt.data(), 10, 2, true, 0, spans, 1);
    const StepPlan& p1 = step(s);
    CHECK(p1.num_reqs == 2 && p1.num_scheduled_tokens[1] == 1);  // stops before the span
    const StepPlan& p2 = step(s);
    CHECK(p2.num_reqs == 2 && p2.num_scheduled_tokens[1] == 3);  // the span whole
    s.finish(2);
    const int32_t wide[] = {4, 8};  // 4 tokens > the cap of 3: only a step without decodes
    s.add_request(3, prompt.data(), 10, 2, true, 0, wide, 1);
    const StepPlan& p3 = step(s);
    CHECK(p3.num_reqs == 2 && p3.num_scheduled_tokens[1] == 3);
    const StepPlan& p4 = step(s);
    CHECK(p4.num_reqs == 2 && p4.num_scheduled_tokens[1] == 1);  // up to the span's start
    const StepPlan& p5 = step(s);
    CHECK(p5.num_reqs == 1 && p5.seq_ids[0] == 1);  // 3 waits while 1 decodes
    s.finish(1);
    const StepPlan& p6 = step(s);
    CHECK(p6.num_reqs == 1 && p6.seq_ids[0] == 3 && p6.num_scheduled_tokens[0] == 6);
}

TEST(prefill_cap_is_checked) {
    CHECK_THROWS(std::invalid_argument, Scheduler(SchedulerConfig{8, 4, 4, 64, 32, false, -1}));
}

TEST(verification_chunk_keeps_accepted_prefix_and_frees_rejected_pages) {
    // page_size 4: prompt of 3, one decode, then a draft of 5 that spills into two new pages.
    Scheduler s(SchedulerConfig{16, 4, 4, 32, 64, true});
    add(s, 1, iota_tokens(3), 20);
    step(s, 50);  // prompt; 50 sampled -> 4 tokens, 3 computed
    const std::vector<int32_t> draft{51, 52, 53, 54, 55};
    s.propose(1, draft.data(), 5);
    const StepPlan& p = s.schedule();
    CHECK(p.num_reqs == 1 && p.num_tokens == 6 && p.num_draft_tokens[0] == 5);
    CHECK(p.input_ids[0] == 50 && p.input_ids[1] == 51 && p.input_ids[5] == 55);
    CHECK(p.positions[5] == 8 && p.seq_lens[0] == 9 && p.max_pages == 3);
    CHECK(p.num_sampled == 6 && p.logits_indices[0] == 0 && p.logits_indices[5] == 5);
    CHECK(p.sample_seq_ids[5] == 1);
    // The target agrees with 51, 52, then says 90: two drafts kept, then 90.
    const std::vector<int32_t> sampled{51, 52, 90, 1, 2, 3};
    s.update(p.step, sampled.data(), 6);
    CHECK(s.num_computed_tokens(1) == 6);  // 3 prompt + 50, 51, 52
    CHECK(s.page_ids(1).size() == 2);     // the third page held only rejected drafts
    const StepPlan& q = s.schedule();      // a plain decode of 90 at position 6
    CHECK(q.num_tokens == 1 && q.input_ids[0] == 90 && q.positions[0] == 6);
    CHECK(q.num_draft_tokens[0] == 0 && q.num_sampled == 1);
    s.update(q.step, sampled.data(), 1);  // samples 51
    // Only the verified page (tokens 1, 2, 3, 50) is cached: a new request hits one page.
    std::vector<int32_t> prompt{1, 2, 3, 50, 51, 52, 90, 51, 7};
    add(s, 2, prompt, 1);
    const StepPlan& r = s.schedule();
    CHECK(s.num_cached_tokens(2) == 4);
    s.update(r.step, sampled.data(), r.num_sampled);
}

TEST(draft_is_cut_by_max_tokens_budget_and_explicit_acceptance) {
    Scheduler s(SchedulerConfig{16, 4, 4, 6, 64, false});
    add(s, 1, iota_tokens(3), 4);  // 4 tokens at most: after the first, 3 left
    add(s, 2, iota_tokens(2, 10), 10);
    step(s, 50);
    const std::vector<int32_t> draft{51, 52, 53, 54, 55};
    s.propose(1, draft.data(), 5);
    s.propose(2, draft.data(), 5);
    const StepPlan& p = s.schedule();
    // seq 1: max_tokens leaves 2 drafts (its own token is the third); seq 2: the budget of 6
    // leaves 6 - 3 - 1 = 2 after seq 1's chunk of 3 and its own token.
    CHECK(p.num_draft_tokens[0] == 2 && p.num_draft_tokens[1] == 2 && p.num_tokens == 6);
    CHECK(p.num_sampled == 6);
    const std::vector<int32_t> sampled{51, 52, 60, 51, 9, 9};
    const std::vector<int32_t> bad{2, 0};  // seq 1's samples match only 2 drafts: fine
    const std::vector<int32_t> too_many{2, 2};  // seq 2 matches 1
    CHECK_THROWS(std::invalid_argument, s.update(p.step, sampled.data(), 6, too_many.data()));
    s.update(p.step, sampled.data(), 6, bad.data());
    CHECK(s.num_computed_tokens(1) == 6 && s.num_computed_tokens(2) == 3);
    // A draft counts for the next schedule() only.
    s.propose(2, draft.data(), 5);
    const StepPlan& used = step(s);
    CHECK(used.num_reqs == 1 && used.num_draft_tokens[0] == 5);  // seq 1 is length-done
    const StepPlan& q = s.schedule();
    CHECK(q.num_reqs == 1 && q.num_draft_tokens[0] == 0);
}

int main() { return check::run_all_tests(); }
