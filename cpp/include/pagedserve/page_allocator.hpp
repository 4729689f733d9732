// The KV page allocator: a fixed pool of pages with reference counts and an automatic prefix
// cache. Every per-page operation is O(1): a free stack, an intrusive LRU list of cached pages,
// and a hash map from chained page hash to page. Single-threaded by contract (the engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "pagedserve/kv_events.hpp"

namespace pagedserve {

// Chained hash of one full page: (parent page hash, page_size token ids). 0 is the root's hash.
uint64_t hash_page(uint64_t parent_hash, const int32_t* token_ids, int32_t page_size);
using PageHashFn = uint64_t (*)(uint64_t parent_hash, const int32_t* token_ids, int32_t page_size);

struct PrefixCacheCounters {
    int64_t query_tokens = 0;  // prompt tokens looked up in the prefix cache
    int64_t hit_tokens = 0;    // of those, tokens served from cached pages
};

class PageAllocator {
  public:
    static constexpr int32_t kNoPage = -1;

    // `hash` is replaceable so tests can force collisions; hits never depend on it being good.
    PageAllocator(int32_t num_pages, int32_t page_size, bool enable_prefix_caching,
                  PageHashFn hash = &hash_page);

    int32_t num_pages() const { return num_pages_; }
    int32_t page_size() const { return page_size_; }
    bool prefix_caching() const { return enable_prefix_caching_; }
    int32_t num_free_pages() const { return static_cast<int32_t>(free_stack_.size()); }
    int32_t num_cached_pages() const { return num_lru_; }  // ref 0 but still findable
    int32_t num_used_pages() const { return num_pages_ - num_free_pages() - num_cached_pages(); }
    // Pages a fresh allocation can get: free ones plus evictable (ref 0) cached ones.
    int32_t num_available_pages() const { return num_free_pages() + num_cached_pages(); }
    int32_t ref_count(int32_t page) const;
    const PrefixCacheCounters& counters() const { return counters_; }
    PrefixCacheCounters& counters() { return counters_; }

    // All or nothing: appends n fresh pages (ref 1) to out and returns true, or changes nothing
    // and returns false. Evicts least-recently-used cached pages when the free stack runs dry.
    bool allocate(int32_t n, std::vector<int32_t>& out);
    void incref(int32_t page);
    // Drops one reference. At zero a registered page stays findable (LRU tail), others are free.
    void release(int32_t page);
    // Releases pages in reverse so a request's tail pages are evicted before its prefix.
    void release_all(std::vector<int32_t>& pages);

    // Longest chain of cached pages holding token_ids[0 : max_pages * page_size]. Each hit is
    // confirmed against the stored token ids and the identity of its parent page, so a hash
    // collision can never hand out another prompt's pages. Hits are appended to out with a
    // reference taken. Returns the number of pages matched. `salt` (0: none) is the root's hash
    // in the chain, so pages registered under one salt are found only under it (a LoRA adapter's
    // KV is not the base model's).
    int32_t match_prefix(const int32_t* token_ids, int32_t max_pages, std::vector<int32_t>& out,
                         uint64_t salt = 0);

    // Registers a full page whose KV has been computed. `parent` is the canonical page of the
    // previous page in the sequence (kNoPage for the first) and `parent_generation` its
    // generation() when it became canonical. Returns the canonical page for this content: `page`
    // itself, or an already cached page with the same tokens and parent. Returns kNoPage when the
    // chain is broken (the parent left the cache, or another live page owns the hash: a
    // collision); the caller then stops registering that sequence.
    // `salt`: as match_prefix's (it matters for the first page; later ones inherit it through
    // their parent's identity, and the event log records the root's salt for every page).
    int32_t register_page(int32_t page, int32_t parent, uint32_t parent_generation,
                          const int32_t* token_ids, uint64_t salt = 0);
    bool is_registered(int32_t page) const { return pages_[page].registered; }
    uint64_t page_hash(int32_t page) const { return pages_[page].hash; }
    // Identity of a registered page's content: bumped whenever the page leaves the cache.
    uint32_t generation(int32_t page) const;  // range-checked, like ref_count
    // What entered and left the cache since the owner last drained it (KvEventLog::enabled
    // off: nothing is recorded). An outbox, not state: draining it changes no decision here.
    KvEventLog& events() const { return events_; }

  private:
    struct PageInfo {
        int32_t ref = 0;
        int32_t lru_prev = kNoPage;
        int32_t lru_next = kNoPage;
        int32_t parent = kNoPage;       // canonical parent page at registration
        uint32_t parent_generation = 0; // parent's generation at registration
        uint32_t generation = 0;
        uint64_t hash = 0;
        uint64_t salt = 0;  // its chain's seed: the root's cache salt (checked for roots)
        bool registered = false;
        bool in_lru = false;
    };

    void check_page(int32_t page) const;
    int32_t take_fresh_page();
    void evict(int32_t page);
    void lru_push_back(int32_t page);
    void lru_remove(int32_t page);
    bool confirms(int32_t page, int32_t parent, const int32_t* token_ids, uint64_t salt) const;
    bool parent_is_current(int32_t parent, uint32_t parent_generation) const;
    void unregister(int32_t page);
    const int32_t* stored_tokens(int32_t page) const {
        return token_store_.data() + static_cast<size_t>(page) * page_size_;
    }

    int32_t num_pages_;
    int32_t page_size_;
    bool enable_prefix_caching_;
    PageHashFn hash_;
    std::vector<PageInfo> pages_;
    std::vector<int32_t> free_stack_;
    std::vector<int32_t> token_store_;  // page_size token ids per registered page
    int32_t lru_head_ = kNoPage;        // least recently used, evicted first
    int32_t lru_tail_ = kNoPage;
    int32_t num_lru_ = 0;
    std::unordered_map<uint64_t, int32_t> cached_;  // page hash -> page
    PrefixCacheCounters counters_;
    mutable KvEventLog events_;
};

}  // namespace pagedserve
