// Continuous-batching scheduler over the page allocator: a per-step token budget, a cap on
// running requests, chunked prefill, prefix-cache lookup at admission and preemption by
// recompute. Stall-free batching (as Sarathi-Serve): the tokens of every decoding request are
// reserved first, and while any request decodes the step's prefill tokens (prompt chunks and
// recomputes, over all requests) are capped at max_prefill_tokens_while_decoding, which bounds
// the step time and so the decoders' inter-token latency; a step with no decode gives prefill
// the whole max_num_batched_tokens. schedule() fills preallocated plan buffers (no allocation
// per step once warm); update() advances the requests of the last plan. Single-threaded by
// contract.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "pagedserve/page_allocator.hpp"

namespace pagedserve {

// A request that can never fit (too long for max_model_len or for the whole page pool).
class AdmissionError : public std::invalid_argument {
  public:
    using std::invalid_argument::invalid_argument;
};

struct SchedulerConfig {
    int32_t num_pages = 0;
    int32_t page_size = 16;
    int32_t max_num_seqs = 64;
    int32_t max_num_batched_tokens = 512;
    int32_t max_model_len = 2048;
    bool enable_prefix_caching = true;
    // Prefill tokens of a step in which some request decodes; 0: no cap beyond the budget.
    int32_t max_prefill_tokens_while_decoding = 0;
};

struct Sequence;  // scheduler.cpp

// What one schedule() may still hand out: every token, prefill tokens, and the decodes not yet
// placed (one token each, reserved out of `tokens` so prefill never takes them).
struct StepBudget {
    int32_t tokens = 0;
    int32_t prefill = 0;
    int32_t decodes = 0;
    // Tokens a prefill may take now.
    int32_t prefill_room() const { return std::min(prefill, tokens - decodes); }
};

// The arrays of one step, in scheduler-owned buffers that stay valid until the next schedule().
// Sizes: num_reqs rows for per-request arrays, num_tokens for per-token ones.
struct StepPlan {
    int64_t step = 0;  // increases by one per schedule(); update() checks it
    int32_t num_reqs = 0;
    int32_t num_tokens = 0;
    int32_t num_sampled = 0;
    int32_t max_query_len = 0;
    int32_t max_seq_len = 0;
    int32_t max_pages = 0;  // page_table row length of this step
    std::vector<int64_t> seq_ids;
    std::vector<int32_t> num_scheduled_tokens;
    std::vector<int32_t> num_computed_tokens;
    std::vector<int32_t> seq_lens;
    std::vector<int32_t> query_start_loc;  // num_reqs + 1 entries
    std::vector<int32_t> input_ids;
    std::vector<int32_t> positions;
    std::vector<int64_t> slot_mapping;
    std::vector<int32_t> page_table;  // num_reqs x max_pages, row-major, unused entries 0
    std::vector<int32_t> num_draft_tokens;  // num_reqs: draft tokens at the end of each chunk
    // One entry per logits row: a sampling chunk's last known token, and after it each of its
    // draft tokens (a verification chunk of d drafts has d + 1 rows, for the same seq_id).
    std::vector<int32_t> logits_indices;
    std::vector<int64_t> sample_seq_ids;
    std::vector<int64_t> preempted_seq_ids;
};

struct SchedulerStats {
    int32_t num_pages, page_size, num_free_pages, num_cached_pages, num_used_pages;
    int64_t prefix_query_tokens, prefix_hit_tokens, num_preemptions;
};

class Scheduler {
  public:
    explicit Scheduler(const SchedulerConfig& config);
    ~Scheduler();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Throws AdmissionError when it can never run, std::invalid_argument for a duplicate id.
    // cache_salt: the prefix cache shares pages only between sequences of one salt (0: none).
    // whole_spans: num_whole_spans [start, end) pairs of prompt positions, sorted and disjoint,
    // that a prefill chunk never ends inside (an image whose tokens attend to each other both
    // ways must be computed in one chunk: the chunk that reaches into one reaches its end or
    // stops before it). Each must fit max_num_batched_tokens (else AdmissionError).
    void add_request(int64_t seq_id, const int32_t* prompt_token_ids, int32_t num_prompt_tokens,
                     int64_t max_tokens, bool use_prefix_cache = true, uint64_t cache_salt = 0,
                     const int32_t* whole_spans = nullptr, int32_t num_whole_spans = 0);
    // Draft tokens for the next schedule() only (then dropped); used if the sequence decodes
    // then, cut to what the budget, max_tokens (the target's own token stays) and pages allow.
    // Unknown id: no-op.
    void propose(int64_t seq_id, const int32_t* draft_token_ids, int32_t num_draft_tokens);
    const StepPlan& schedule();
    // sampled_token_ids: one per plan.logits_indices entry of the last plan, in that order.
    // num_accepted (num_reqs entries, or null): the draft tokens each row keeps, a prefix that
    // the sampled tokens must match (row j's sample equals draft j); null: the longest prefix
    // that matches. A verifying row appends its accepted drafts and then the sample after them.
    void update(int64_t step, const int32_t* sampled_token_ids, int32_t num_sampled,
                const int32_t* num_accepted = nullptr);
    void finish(int64_t seq_id);  // unknown id: no-op
    void abort(int64_t seq_id);   // unknown id: no-op

    int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
    int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
    bool has_unfinished() const { return !running_.empty() || !waiting_.empty(); }
    int32_t num_cached_tokens(int64_t seq_id) const;
    SchedulerStats stats() const;
    const StepPlan& last_plan() const { return plan_; }
    const SchedulerConfig& config() const { return config_; }
    const PageAllocator& allocator() const { return allocator_; }
    // Introspection for tests: the pages a request holds, in sequence order (empty if waiting).
    const std::vector<int32_t>& page_ids(int64_t seq_id) const;
    int32_t num_computed_tokens(int64_t seq_id) const;

  private:
    const Sequence& find(int64_t seq_id) const;
    void remove(int64_t seq_id);
    void reset_plan();
    StepBudget start_budget() const;
    void schedule_running(StepBudget& budget);
    void admit_waiting(StepBudget& budget);
    bool try_admit(Sequence& r, int32_t budget);
    bool ensure_pages(Sequence& r, int32_t num_tokens);
    Sequence* pick_victim();
    void preempt(Sequence& r);
    int32_t take_draft(Sequence& r, int32_t room);
    void emit(Sequence& r, int32_t num_new, int32_t num_draft);
    int32_t accept(Sequence& r, int32_t row, const int32_t* sampled, const int32_t* num_accepted);
    void trim_pages(Sequence& r);
    void finish_plan();
    void register_full_pages(Sequence& r);
    void release(Sequence& r);

    SchedulerConfig config_;
    PageAllocator allocator_;
    std::unordered_map<int64_t, std::unique_ptr<Sequence>> sequences_;
    std::vector<Sequence*> running_;       // admission order: back() is the newest
    std::deque<Sequence*> waiting_;        // FCFS; preempted requests go to the front
    std::vector<std::unique_ptr<Sequence>> retired_;  // aborted/finished, freed next schedule()
    std::vector<Sequence*> plan_sequences_;  // the requests of plan_, in row order
    StepPlan plan_;
    bool plan_pending_ = false;  // plan_ awaits its update()
    std::vector<int32_t> first_logits_, accepted_;  // update()'s scratch, per plan row
    int32_t max_pages_per_seq_;
    int64_t num_preemptions_ = 0;
};

}  // namespace pagedserve
