#include "pagedserve/scheduler.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace pagedserve {

namespace {

int32_t ceil_div(int64_t a, int64_t b) { return static_cast<int32_t>((a + b - 1) / b); }

void require_positive(int32_t value, const char* field) {
    if (value < 1)
        throw std::invalid_argument(std::string(field) + " must be >= 1, got " +
                                    std::to_string(value));
}

}  // namespace

enum class Status { kWaiting, kRunning, kDone };

struct Sequence {
    int64_t seq_id = 0;
    std::vector<int32_t> token_ids;  // prompt, then every generated token
    int32_t num_prompt_tokens = 0;
    int32_t max_tokens = 0;
    int32_t num_computed = 0;  // tokens whose KV is in this request's pages
    int32_t num_cached_tokens = -1;  // prompt tokens hit at first admission (-1: not yet)
    bool use_prefix_cache = true;
    uint64_t cache_salt = 0;  // folded into the first page's hash (PageAllocator::match_prefix)
    Status status = Status::kWaiting;
    std::vector<int32_t> pages;
    // Prefix-cache registration: pages [0, num_registered) are in the cache; reg_parent is the
    // canonical page of the last one. reg_broken stops registration (opted out, or a collision).
    int32_t num_registered = 0;
    int32_t reg_parent = PageAllocator::kNoPage;
    uint32_t reg_parent_generation = 0;
    bool reg_broken = false;
    // Speculative decoding: draft tokens proposed for the plan of step draft_step only.
    std::vector<int32_t> draft;
    int64_t draft_step = -1;
    // [start, end) pairs of prompt positions no prefill chunk ends inside (add_request).
    std::vector<int32_t> whole_spans;

    int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
    // All max_tokens are out: it waits for the engine's finish() and is never scheduled again.
    bool length_done() const { return num_tokens() - num_prompt_tokens >= max_tokens; }
    // Its next step computes exactly the token it sampled last (not a prompt or recompute chunk).
    bool decoding() const {
        return !length_done() && num_tokens() > num_prompt_tokens &&
               num_tokens() - num_computed == 1;
    }
    // A chunk of num_new tokens from `computed`, cut back to the start of a whole span it would
    // end inside (0 when it starts inside that span: it waits for a budget that reaches the end).
    int32_t whole_chunk(int32_t computed, int32_t num_new) const {
        const int32_t end = computed + num_new;
        for (size_t i = 0; i < whole_spans.size(); i += 2)
            if (whole_spans[i] < end && end < whole_spans[i + 1])
                return std::max(0, whole_spans[i] - computed);
        return num_new;
    }
};

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config),
      allocator_((require_positive(config.num_pages, "num_pages"),
                  require_positive(config.page_size, "page_size"), config.num_pages),
                 config.page_size, config.enable_prefix_caching) {
    require_positive(config.max_num_seqs, "max_num_seqs");
    require_positive(config.max_num_batched_tokens, "max_num_batched_tokens");
    require_positive(config.max_model_len, "max_model_len");
    if (config.max_prefill_tokens_while_decoding < 0)
        throw std::invalid_argument("max_prefill_tokens_while_decoding must be >= 0, got " +
                                    std::to_string(config.max_prefill_tokens_while_decoding));
    max_pages_per_seq_ = std::min(ceil_div(config.max_model_len, config.page_size),
                                  config.num_pages);
    const size_t seqs = static_cast<size_t>(config.max_num_seqs);
    const size_t tokens = static_cast<size_t>(config.max_num_batched_tokens);
    plan_.seq_ids.resize(seqs);
    plan_.num_scheduled_tokens.resize(seqs);
    plan_.num_computed_tokens.resize(seqs);
    plan_.seq_lens.resize(seqs);
    plan_.query_start_loc.resize(seqs + 1);
    plan_.num_draft_tokens.resize(seqs);
    // Verification chunks sample at every draft position: up to one logits row per token.
    plan_.logits_indices.resize(std::max(seqs, tokens));
    plan_.sample_seq_ids.resize(std::max(seqs, tokens));
    plan_.input_ids.resize(tokens);
    plan_.positions.resize(tokens);
    plan_.slot_mapping.resize(tokens);
    plan_.preempted_seq_ids.reserve(seqs);
    plan_sequences_.reserve(seqs);
    running_.reserve(seqs);
}

Scheduler::~Scheduler() = default;

void Scheduler::add_request(int64_t seq_id, const int32_t* prompt_token_ids,
                            int32_t num_prompt_tokens, int64_t max_tokens,
                            bool use_prefix_cache, uint64_t cache_salt,
                            const int32_t* whole_spans, int32_t num_whole_spans) {
    if (sequences_.count(seq_id))
        throw std::invalid_argument("seq_id " + std::to_string(seq_id) + " is already in use");
    if (num_prompt_tokens < 1) throw AdmissionError("prompt_token_ids is empty");
    if (max_tokens < 1)
        throw AdmissionError("max_tokens must be >= 1, got " + std::to_string(max_tokens));
    const int64_t total = num_prompt_tokens + max_tokens;
    if (total > config_.max_model_len)
        throw AdmissionError("prompt (" + std::to_string(num_prompt_tokens) +
                             " tokens) + max_tokens (" + std::to_string(max_tokens) + ") = " +
                             std::to_string(total) + " exceeds max_model_len (" +
                             std::to_string(config_.max_model_len) + ")");
    // The last sampled token never needs KV, so total - 1 tokens must fit in the pool.
    const int32_t pages = ceil_div(total - 1, config_.page_size);
    if (pages > config_.num_pages)
        throw AdmissionError("the request needs " + std::to_string(pages) +
                             " KV pages but the cache has only " +
                             std::to_string(config_.num_pages));
    for (int32_t i = 0; i < num_prompt_tokens; ++i)
        if (prompt_token_ids[i] < 0)
            throw std::invalid_argument("prompt_token_ids must be >= 0");
    int32_t last_end = 0;
    for (int32_t i = 0; i < num_whole_spans; ++i) {
        const int32_t start = whole_spans[2 * i], end = whole_spans[2 * i + 1];
        if (start < last_end || end <= start || end > num_prompt_tokens)
            throw std::invalid_argument(
                "whole_spans must be sorted, disjoint, non-empty spans of the prompt");
        if (end - start > config_.max_num_batched_tokens)
            throw AdmissionError("a span of " + std::to_string(end - start) +
                                 " tokens that must be computed in one chunk exceeds "
                                 "max_num_batched_tokens (" +
                                 std::to_string(config_.max_num_batched_tokens) + ")");
        last_end = end;
    }
    auto r = std::make_unique<Sequence>();
    r->seq_id = seq_id;
    r->token_ids.reserve(static_cast<size_t>(total));
    r->token_ids.assign(prompt_token_ids, prompt_token_ids + num_prompt_tokens);
    r->num_prompt_tokens = num_prompt_tokens;
    r->max_tokens = static_cast<int32_t>(max_tokens);
    r->use_prefix_cache = use_prefix_cache;
    r->cache_salt = cache_salt;
    if (num_whole_spans > 0) r->whole_spans.assign(whole_spans, whole_spans + 2 * num_whole_spans);
    waiting_.push_back(r.get());
    sequences_.emplace(seq_id, std::move(r));
}

const Sequence& Scheduler::find(int64_t seq_id) const {
    auto it = sequences_.find(seq_id);
    if (it == sequences_.end())
        throw std::out_of_range("unknown seq_id " + std::to_string(seq_id));
    return *it->second;
}

int32_t Scheduler::num_cached_tokens(int64_t seq_id) const {
    return std::max(find(seq_id).num_cached_tokens, 0);
}

const std::vector<int32_t>& Scheduler::page_ids(int64_t seq_id) const {
    return find(seq_id).pages;
}

int32_t Scheduler::num_computed_tokens(int64_t seq_id) const {
    return find(seq_id).num_computed;
}

SchedulerStats Scheduler::stats() const {
    const PrefixCacheCounters& c = allocator_.counters();
    return SchedulerStats{allocator_.num_pages(),        allocator_.page_size(),
                          allocator_.num_free_pages(),   allocator_.num_cached_pages(),
                          allocator_.num_used_pages(),   c.query_tokens,
                          c.hit_tokens,                  num_preemptions_};
}

void Scheduler::propose(int64_t seq_id, const int32_t* draft_token_ids,
                        int32_t num_draft_tokens) {
    auto it = sequences_.find(seq_id);
    if (it == sequences_.end()) return;
    for (int32_t i = 0; i < num_draft_tokens; ++i)
        if (draft_token_ids[i] < 0) throw std::invalid_argument("draft_token_ids must be >= 0");
    Sequence& r = *it->second;
    r.draft.assign(draft_token_ids, draft_token_ids + std::max(num_draft_tokens, 0));
    r.draft_step = plan_.step + 1;
}

void Scheduler::finish(int64_t seq_id) { remove(seq_id); }

void Scheduler::abort(int64_t seq_id) { remove(seq_id); }

void Scheduler::remove(int64_t seq_id) {
    auto it = sequences_.find(seq_id);
    if (it == sequences_.end()) return;
    Sequence* r = it->second.get();
    if (r->status == Status::kRunning) {
        running_.erase(std::find(running_.begin(), running_.end(), r));
    } else {
        waiting_.erase(std::find(waiting_.begin(), waiting_.end(), r));
    }
    release(*r);
    r->status = Status::kDone;
    // Kept alive until the next schedule(): the pending plan may still point at it.
    retired_.push_back(std::move(it->second));
    sequences_.erase(it);
}

void Scheduler::release(Sequence& r) {
    allocator_.release_all(r.pages);
    r.num_computed = 0;
    r.num_registered = 0;
    r.reg_parent = PageAllocator::kNoPage;
    r.reg_broken = false;
}

// --- one step ------------------------------------------------------------------------------------

const StepPlan& Scheduler::schedule() {
    // A plan that never got its update() is dropped: its requests did not advance, so the same
    // tokens are scheduled again (the pages they were given stay with them).
    retired_.clear();
    reset_plan();
    StepBudget budget = start_budget();
    schedule_running(budget);
    // A step that had to preempt is short of pages: admitting now would only thrash.
    if (plan_.preempted_seq_ids.empty()) admit_waiting(budget);
    finish_plan();
    plan_pending_ = true;
    return plan_;
}

void Scheduler::reset_plan() {
    ++plan_.step;
    plan_.num_reqs = plan_.num_tokens = plan_.num_sampled = 0;
    plan_.max_query_len = plan_.max_seq_len = plan_.max_pages = 0;
    plan_.query_start_loc[0] = 0;
    plan_.preempted_seq_ids.clear();
    plan_sequences_.clear();
}

StepBudget Scheduler::start_budget() const {
    StepBudget budget;
    budget.tokens = budget.prefill = config_.max_num_batched_tokens;
    for (const Sequence* r : running_) budget.decodes += r->decoding() ? 1 : 0;
    const int32_t cap = config_.max_prefill_tokens_while_decoding;
    if (budget.decodes > 0 && cap > 0) budget.prefill = std::min(budget.prefill, cap);
    return budget;
}

void Scheduler::schedule_running(StepBudget& budget) {
    // Admission order, decodes never starved: a prefill takes only what is left once every
    // decode after it has its token.
    for (size_t i = 0; i < running_.size() && budget.tokens > 0; ++i) {
        Sequence& r = *running_[i];
        const bool decode = r.decoding();
        if (decode) --budget.decodes;  // its reserved token is its own now
        const int32_t room = decode ? budget.tokens : budget.prefill_room();
        int32_t num_new = std::min(r.num_tokens() - r.num_computed, room);
        if (!decode) num_new = r.whole_chunk(r.num_computed, num_new);
        if (r.length_done() || num_new <= 0) continue;
        // Only requests after i (not yet in the plan) or r itself can be preempted here.
        if (!ensure_pages(r, r.num_computed + num_new)) break;
        // Drafts take only what no later decode has reserved.
        const int32_t num_draft = decode ? take_draft(r, budget.tokens - 1 - budget.decodes) : 0;
        emit(r, num_new, num_draft);
        budget.tokens -= num_new + num_draft;
        if (!decode) budget.prefill -= num_new;
    }
}

bool Scheduler::ensure_pages(Sequence& r, int32_t num_tokens) {
    const int32_t need = ceil_div(num_tokens, config_.page_size) -
                         static_cast<int32_t>(r.pages.size());
    if (need <= 0) return true;
    while (need > allocator_.num_available_pages()) {
        Sequence* victim = pick_victim();
        preempt(*victim);
        if (victim == &r) return false;
    }
    allocator_.allocate(need, r.pages);
    return true;
}

Sequence* Scheduler::pick_victim() {
    // The newest running request that still computes; the caller itself is always a candidate.
    for (auto it = running_.rbegin(); it != running_.rend(); ++it)
        if (!(*it)->length_done()) return *it;
    return nullptr;  // unreachable: the caller is running and not length_done
}

void Scheduler::preempt(Sequence& r) {
    running_.erase(std::find(running_.begin(), running_.end(), &r));
    release(r);
    r.status = Status::kWaiting;
    waiting_.push_front(&r);
    plan_.preempted_seq_ids.push_back(r.seq_id);
    ++num_preemptions_;
}

void Scheduler::admit_waiting(StepBudget& budget) {
    while (!waiting_.empty() && budget.prefill_room() > 0 &&
           static_cast<int32_t>(running_.size()) < config_.max_num_seqs) {
        Sequence& r = *waiting_.front();
        if (!try_admit(r, budget.prefill_room())) break;
        waiting_.pop_front();
        r.status = Status::kRunning;
        running_.push_back(&r);
        const int32_t num_new = plan_.num_scheduled_tokens[plan_.num_reqs - 1];
        budget.tokens -= num_new;
        budget.prefill -= num_new;
    }
}

bool Scheduler::try_admit(Sequence& r, int32_t budget) {
    const int32_t page_size = config_.page_size;
    const bool use_cache = allocator_.prefix_caching() && r.use_prefix_cache;
    int32_t hits = 0;
    if (use_cache) {
        // The last token is always computed: its logits are needed to sample.
        hits = allocator_.match_prefix(r.token_ids.data(), (r.num_tokens() - 1) / page_size,
                                       r.pages, r.cache_salt);
    }
    const int32_t computed = hits * page_size;
    const int32_t num_new = r.whole_chunk(computed, std::min(r.num_tokens() - computed, budget));
    const int32_t need = ceil_div(computed + num_new, page_size) - hits;
    if (num_new <= 0 || !allocator_.allocate(need, r.pages)) {
        allocator_.release_all(r.pages);  // give the hits back; retry next step
        return false;
    }
    if (use_cache) {
        allocator_.counters().query_tokens += r.num_tokens();
        allocator_.counters().hit_tokens += computed;
    }
    if (r.num_cached_tokens < 0) r.num_cached_tokens = computed;
    r.num_computed = computed;
    r.num_registered = hits;
    r.reg_broken = !use_cache;
    if (hits > 0) {
        r.reg_parent = r.pages[hits - 1];
        r.reg_parent_generation = allocator_.generation(r.reg_parent);
    }
    emit(r, num_new, 0);
    return true;
}

int32_t Scheduler::take_draft(Sequence& r, int32_t room) {
    if (r.draft_step != plan_.step || r.draft.empty()) return 0;
    const int32_t page_size = config_.page_size;
    // The target's own token after the accepted drafts must still fit in max_tokens.
    const int32_t left = r.max_tokens - (r.num_tokens() - r.num_prompt_tokens) - 1;
    int32_t n = std::min({static_cast<int32_t>(r.draft.size()), left, room});
    if (n <= 0) return 0;
    // Pages for the drafts come only from what is available: a draft never preempts.
    const int32_t held = static_cast<int32_t>(r.pages.size());
    const int32_t most = (held + allocator_.num_available_pages()) * page_size;
    n = std::min(n, most - r.num_tokens());
    if (n <= 0) return 0;
    const int32_t need = ceil_div(r.num_tokens() + n, page_size) - held;
    if (need > 0 && !allocator_.allocate(need, r.pages)) return 0;
    return n;
}

void Scheduler::emit(Sequence& r, int32_t num_new, int32_t num_draft) {
    StepPlan& p = plan_;
    const int32_t row = p.num_reqs++;
    const int32_t computed = r.num_computed;
    const int32_t page_size = config_.page_size;
    plan_sequences_.push_back(&r);
    p.seq_ids[row] = r.seq_id;
    p.num_draft_tokens[row] = num_draft;
    num_new += num_draft;  // the drafts follow the known tokens (the chunk reaches their end)
    p.num_scheduled_tokens[row] = num_new;
    p.num_computed_tokens[row] = computed;
    p.seq_lens[row] = computed + num_new;
    int32_t* ids = p.input_ids.data() + p.num_tokens;
    int32_t* pos = p.positions.data() + p.num_tokens;
    int64_t* slots = p.slot_mapping.data() + p.num_tokens;
    const int32_t* pages = r.pages.data();
    for (int32_t j = 0; j < num_new; ++j) {
        const int32_t position = computed + j;
        ids[j] = position < r.num_tokens() ? r.token_ids[position]
                                           : r.draft[position - r.num_tokens()];
        pos[j] = position;
        slots[j] = static_cast<int64_t>(pages[position / page_size]) * page_size +
                   position % page_size;
    }
    p.num_tokens += num_new;
    p.query_start_loc[row + 1] = p.num_tokens;
    if (computed + num_new == r.num_tokens() + num_draft) {  // it reaches the known end
        for (int32_t j = num_draft; j >= 0; --j) {  // the last known token, then each draft
            p.logits_indices[p.num_sampled] = p.num_tokens - 1 - j;
            p.sample_seq_ids[p.num_sampled] = r.seq_id;
            ++p.num_sampled;
        }
    }
    p.max_query_len = std::max(p.max_query_len, num_new);
    p.max_seq_len = std::max(p.max_seq_len, computed + num_new);
    p.max_pages = std::max(p.max_pages, static_cast<int32_t>(r.pages.size()));
}

void Scheduler::finish_plan() {
    StepPlan& p = plan_;
    const size_t width = static_cast<size_t>(p.max_pages);
    const size_t cells = static_cast<size_t>(p.num_reqs) * width;
    if (p.page_table.size() < cells) p.page_table.resize(cells);  // grows only: no churn
    if (cells > 0) std::memset(p.page_table.data(), 0, cells * sizeof(int32_t));
    for (int32_t row = 0; row < p.num_reqs; ++row) {
        const std::vector<int32_t>& pages = plan_sequences_[row]->pages;
        std::memcpy(p.page_table.data() + row * width, pages.data(),
                    pages.size() * sizeof(int32_t));
    }
}

void Scheduler::update(int64_t step, const int32_t* sampled_token_ids, int32_t num_sampled,
                       const int32_t* num_accepted) {
    if (!plan_pending_ || step != plan_.step)
        throw std::invalid_argument("update() takes the plan of the last schedule(), once");
    if (num_sampled != plan_.num_sampled)
        throw std::invalid_argument("sampled_token_ids has " + std::to_string(num_sampled) +
                                    " entries, the plan samples " +
                                    std::to_string(plan_.num_sampled));
    for (int32_t k = 0; k < num_sampled; ++k)
        if (sampled_token_ids[k] < 0) throw std::invalid_argument("sampled_token_ids must be >= 0");
    // First every row's first logits entry and accepted drafts (-1: it does not sample), so
    // that a bad num_accepted throws before anything changes.
    first_logits_.assign(static_cast<size_t>(plan_.num_reqs), -1);
    accepted_.assign(static_cast<size_t>(plan_.num_reqs), 0);
    int32_t k = 0;  // index into the sampled tokens, in row order like logits_indices
    for (int32_t row = 0; row < plan_.num_reqs; ++row) {
        const int32_t last = k + plan_.num_draft_tokens[row];  // the row's last logits entry
        if (last >= num_sampled || plan_.logits_indices[last] != plan_.query_start_loc[row + 1] - 1)
            continue;
        first_logits_[row] = k;
        accepted_[row] = accept(*plan_sequences_[row], row, sampled_token_ids + k, num_accepted);
        k = last + 1;
    }
    plan_pending_ = false;
    for (int32_t row = 0; row < plan_.num_reqs; ++row) {
        Sequence& r = *plan_sequences_[row];
        if (r.status != Status::kRunning) continue;  // finished or aborted since schedule()
        if (first_logits_[row] < 0) {
            r.num_computed += plan_.num_scheduled_tokens[row];
        } else {
            const int32_t* sampled = sampled_token_ids + first_logits_[row];
            const int32_t accepted = accepted_[row];
            const int32_t rejected = plan_.num_draft_tokens[row] - accepted;
            r.num_computed += plan_.num_scheduled_tokens[row] - rejected;
            r.token_ids.insert(r.token_ids.end(), sampled, sampled + accepted + 1);
            if (rejected > 0) trim_pages(r);
        }
        register_full_pages(r);
    }
}

int32_t Scheduler::accept(Sequence& r, int32_t row, const int32_t* sampled,
                          const int32_t* num_accepted) {
    const int32_t num_draft = plan_.num_draft_tokens[row];
    const int32_t* draft = plan_.input_ids.data() + plan_.query_start_loc[row + 1] - num_draft;
    int32_t matching = 0;
    while (matching < num_draft && sampled[matching] == draft[matching]) ++matching;
    if (num_accepted == nullptr) return matching;
    const int32_t accepted = num_accepted[row];
    if (accepted < 0 || accepted > matching)
        throw std::invalid_argument("num_accepted[" + std::to_string(row) + "] = " +
                                    std::to_string(accepted) + " for seq_id " +
                                    std::to_string(r.seq_id) + ": only " +
                                    std::to_string(matching) + " drafts match the samples");
    return accepted;
}

void Scheduler::trim_pages(Sequence& r) {
    // Pages past the verified tokens held only rejected drafts' KV: back to the allocator.
    const size_t keep = static_cast<size_t>(ceil_div(r.num_computed, config_.page_size));
    while (r.pages.size() > keep) {
        allocator_.release(r.pages.back());
        r.pages.pop_back();
    }
}

void Scheduler::register_full_pages(Sequence& r) {
    const int32_t page_size = config_.page_size;
    const int32_t num_full = r.num_computed / page_size;
    while (!r.reg_broken && r.num_registered < num_full) {
        const int32_t index = r.num_registered;
        const int32_t canonical = allocator_.register_page(
            r.pages[index], r.reg_parent, r.reg_parent_generation,
            r.token_ids.data() + static_cast<size_t>(index) * page_size, r.cache_salt);
        if (canonical == PageAllocator::kNoPage) {
            r.reg_broken = true;
            break;
        }
        r.reg_parent = canonical;
        r.reg_parent_generation = allocator_.generation(canonical);
        ++r.num_registered;
    }
}

}  // namespace pagedserve
