#include "pagedserve/page_allocator.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace pagedserve {

namespace {

uint64_t finalize(uint64_t h) {  // splitmix64's finalizer: every input bit reaches every output bit
    h ^= h >> 30;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 27;
    h *= 0x94D049BB133111EBULL;
    return h ^ (h >> 31);
}

}  // namespace

uint64_t hash_page(uint64_t parent_hash, const int32_t* token_ids, int32_t page_size) {
    uint64_t h = finalize(parent_hash + 0x9E3779B97F4A7C15ULL);
    for (int32_t i = 0; i < page_size; ++i) {
        h = (h ^ static_cast<uint32_t>(token_ids[i])) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    return finalize(h);
}

PageAllocator::PageAllocator(int32_t num_pages, int32_t page_size, bool enable_prefix_caching,
                             PageHashFn hash)
    : num_pages_(num_pages),
      page_size_(page_size),
      enable_prefix_caching_(enable_prefix_caching),
      hash_(hash) {
    if (num_pages < 1) throw std::invalid_argument("num_pages must be >= 1");
    if (page_size < 1) throw std::invalid_argument("page_size must be >= 1");
    pages_.resize(num_pages);
    free_stack_.reserve(num_pages);
    // Popped from the back: page 0 is handed out first, which keeps small tests readable.
    for (int32_t p = num_pages - 1; p >= 0; --p) free_stack_.push_back(p);
    if (enable_prefix_caching) {
        token_store_.assign(static_cast<size_t>(num_pages) * page_size, 0);
        cached_.reserve(static_cast<size_t>(num_pages));
    }
}

void PageAllocator::check_page(int32_t page) const {
    if (page < 0 || page >= num_pages_)
        throw std::out_of_range("page " + std::to_string(page) + " is not in [0, num_pages)");
}

int32_t PageAllocator::ref_count(int32_t page) const {
    check_page(page);
    return pages_[page].ref;
}

uint32_t PageAllocator::generation(int32_t page) const {
    check_page(page);
    return pages_[page].generation;
}

bool PageAllocator::allocate(int32_t n, std::vector<int32_t>& out) {
    if (n < 0) throw std::invalid_argument("cannot allocate a negative number of pages");
    if (n > num_available_pages()) return false;
    for (int32_t i = 0; i < n; ++i) out.push_back(take_fresh_page());
    return true;
}

int32_t PageAllocator::take_fresh_page() {
    int32_t page;
    if (!free_stack_.empty()) {
        page = free_stack_.back();
        free_stack_.pop_back();
    } else {
        page = lru_head_;  // the caller checked num_available_pages()
        lru_remove(page);
        unregister(page);
    }
    pages_[page].ref = 1;
    return page;
}

void PageAllocator::incref(int32_t page) {
    check_page(page);
    PageInfo& info = pages_[page];
    if (info.ref == 0) {
        // Only a cached page may be revived; a free page has no content worth sharing.
        if (!info.in_lru) throw std::logic_error("incref on a free page");
        lru_remove(page);
    }
    ++info.ref;
}

void PageAllocator::release(int32_t page) {
    check_page(page);
    PageInfo& info = pages_[page];
    if (info.ref <= 0) throw std::logic_error("release of a page nobody holds");
    if (--info.ref > 0) return;
    if (info.registered) {
        lru_push_back(page);
    } else {
        free_stack_.push_back(page);
    }
}

void PageAllocator::release_all(std::vector<int32_t>& pages) {
    for (auto it = pages.rbegin(); it != pages.rend(); ++it) release(*it);
    pages.clear();
}

void PageAllocator::lru_push_back(int32_t page) {
    PageInfo& info = pages_[page];
    info.lru_prev = lru_tail_;
    info.lru_next = kNoPage;
    if (lru_tail_ != kNoPage) {
        pages_[lru_tail_].lru_next = page;
    } else {
        lru_head_ = page;
    }
    lru_tail_ = page;
    info.in_lru = true;
    ++num_lru_;
}

void PageAllocator::lru_remove(int32_t page) {
    PageInfo& info = pages_[page];
    if (info.lru_prev != kNoPage) {
        pages_[info.lru_prev].lru_next = info.lru_next;
    } else {
        lru_head_ = info.lru_next;
    }
    if (info.lru_next != kNoPage) {
        pages_[info.lru_next].lru_prev = info.lru_prev;
    } else {
        lru_tail_ = info.lru_prev;
    }
    info.lru_prev = info.lru_next = kNoPage;
    info.in_lru = false;
    --num_lru_;
}

void PageAllocator::unregister(int32_t page) {
    PageInfo& info = pages_[page];
    if (!info.registered) return;
    auto it = cached_.find(info.hash);
    if (it != cached_.end() && it->second == page) {
        cached_.erase(it);
        if (events_.enabled) events_.removed(info.hash, info.salt);
    }
    info.registered = false;
    ++info.generation;  // children that named this page as parent no longer match
}

bool PageAllocator::parent_is_current(int32_t parent, uint32_t parent_generation) const {
    return parent == kNoPage ||
           (pages_[parent].registered && pages_[parent].generation == parent_generation);
}

bool PageAllocator::confirms(int32_t page, int32_t parent, const int32_t* token_ids,
                             uint64_t salt) const {
    const PageInfo& info = pages_[page];
    if (info.parent != parent) return false;
    if (parent == kNoPage && info.salt != salt) return false;
    if (!parent_is_current(parent, info.parent_generation)) return false;
    return std::memcmp(stored_tokens(page), token_ids, sizeof(int32_t) * page_size_) == 0;
}

int32_t PageAllocator::match_prefix(const int32_t* token_ids, int32_t max_pages,
                                    std::vector<int32_t>& out, uint64_t salt) {
    if (!enable_prefix_caching_) return 0;
    int32_t parent = kNoPage;
    uint64_t parent_hash = salt;
    int32_t matched = 0;
    for (; matched < max_pages; ++matched) {
        const int32_t* tokens = token_ids + static_cast<size_t>(matched) * page_size_;
        const uint64_t h = hash_(parent_hash, tokens, page_size_);
        auto it = cached_.find(h);
        if (it == cached_.end() || !confirms(it->second, parent, tokens, salt)) break;
        parent = it->second;
        parent_hash = h;
        incref(parent);
        out.push_back(parent);
    }
    return matched;
}

int32_t PageAllocator::register_page(int32_t page, int32_t parent, uint32_t parent_generation,
                                     const int32_t* token_ids, uint64_t salt) {
    check_page(page);
    if (!enable_prefix_caching_) return kNoPage;
    if (pages_[page].registered) return page;
    if (!parent_is_current(parent, parent_generation)) return kNoPage;
    const uint64_t h = hash_(parent == kNoPage ? salt : pages_[parent].hash, token_ids, page_size_);
    auto it = cached_.find(h);
    if (it != cached_.end()) {
        const int32_t owner = it->second;
        if (confirms(owner, parent, token_ids, salt)) return owner;  // same KV computed twice
        const PageInfo& o = pages_[owner];
        if (parent_is_current(o.parent, o.parent_generation)) return kNoPage;  // live collision
        // The owner's parent left the cache, so the owner is unreachable: take its hash.
        unregister(owner);
        if (o.in_lru) {
            lru_remove(owner);
            free_stack_.push_back(owner);
        }
    }
    PageInfo& info = pages_[page];
    std::memcpy(token_store_.data() + static_cast<size_t>(page) * page_size_, token_ids,
                sizeof(int32_t) * page_size_);
    info.parent = parent;
    info.parent_generation = parent_generation;
    info.hash = h;
    info.salt = parent == kNoPage ? salt : pages_[parent].salt;  // the chain's seed
    info.registered = true;
    cached_.emplace(h, page);
    if (events_.enabled)
        events_.stored(h, parent == kNoPage ? nullptr : &pages_[parent].hash, info.salt,
                       token_ids, page_size_);
    return page;
}

}  // namespace pagedserve
