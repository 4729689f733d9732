// Unit tests of the page allocator: all-or-nothing allocation, reference counts, the prefix
// cache (chained hashes, confirmation against stored tokens, LRU eviction of ref-0 pages).
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "check.hpp"
#include "pagedserve/page_allocator.hpp"

using pagedserve::PageAllocator;

namespace {

std::vector<int32_t> iota_tokens(int32_t n, int32_t start) {
    std::vector<int32_t> t(n);
    std::iota(t.begin(), t.end(), start);
    return t;
}

// Registers pages[i] as the i-th page of `tokens`, chaining parents; returns the canonical pages.
std::vector<int32_t> register_chain(PageAllocator& a, const std::vector<int32_t>& pages,
                                    const std::vector<int32_t>& tokens) {
    std::vector<int32_t> canonical;
    int32_t parent = PageAllocator::kNoPage;
    for (size_t i = 0; i < pages.size(); ++i) {
        const uint32_t gen = parent == PageAllocator::kNoPage ? 0 : a.generation(parent);
        parent = a.register_page(pages[i], parent, gen, tokens.data() + i * a.page_size());
        canonical.push_back(parent);
    }
    return canonical;
}

}  // namespace

TEST(allocate_is_all_or_nothing) {
    PageAllocator a(4, 2, false);
    std::vector<int32_t> pages;
    CHECK(a.allocate(3, pages));
    CHECK(pages.size() == 3);
    CHECK(!a.allocate(2, pages));
    CHECK(pages.size() == 3);
    CHECK(a.num_free_pages() == 1);
    CHECK(a.num_used_pages() == 3);
    for (int32_t p : pages) CHECK(a.ref_count(p) == 1);
    a.release_all(pages);
    CHECK(pages.empty());
    CHECK(a.num_free_pages() == 4);
}

TEST(refcounts_share_and_release) {
    PageAllocator a(2, 4, false);
    std::vector<int32_t> pages;
    CHECK(a.allocate(1, pages));
    a.incref(pages[0]);
    CHECK(a.ref_count(pages[0]) == 2);
    a.release(pages[0]);
    CHECK(a.num_free_pages() == 1);
    a.release(pages[0]);
    CHECK(a.num_free_pages() == 2);
    CHECK_THROWS(std::logic_error, a.release(pages[0]));
    CHECK_THROWS(std::logic_error, a.incref(pages[0]));
    CHECK_THROWS(std::out_of_range, a.ref_count(7));
}

TEST(prefix_hit_after_release_and_miss_on_other_tokens) {
    PageAllocator a(8, 4, true);
    const std::vector<int32_t> tokens = iota_tokens(12, 100);
    std::vector<int32_t> pages;
    CHECK(a.allocate(3, pages));
    const std::vector<int32_t> canonical = register_chain(a, pages, tokens);
    CHECK(canonical == pages);
    a.release_all(pages);
    CHECK(a.num_cached_pages() == 3);
    CHECK(a.num_free_pages() == 5);

    std::vector<int32_t> hits;
    CHECK(a.match_prefix(tokens.data(), 3, hits) == 3);
    CHECK(hits == canonical);
    CHECK(a.num_cached_pages() == 0);
    for (int32_t p : hits) CHECK(a.ref_count(p) == 1);
    a.release_all(hits);

    std::vector<int32_t> other = tokens;
    other[5] = 7;  // second page differs: only the first page matches
    CHECK(a.match_prefix(other.data(), 3, hits) == 1);
    CHECK(hits.size() == 1 && hits[0] == canonical[0]);
    a.release_all(hits);
}

TEST(same_page_content_under_another_parent_misses) {
    PageAllocator a(8, 2, true);
    const std::vector<int32_t> first = {1, 2, 3, 4};
    const std::vector<int32_t> second = {9, 9, 3, 4};  // page 1 equal, page 0 not
    std::vector<int32_t> pages;
    CHECK(a.allocate(2, pages));
    register_chain(a, pages, first);
    std::vector<int32_t> hits;
    CHECK(a.match_prefix(second.data(), 2, hits) == 0);
    CHECK(hits.empty());
    a.release_all(pages);
}

TEST(lru_evicts_oldest_cached_page_and_children_become_unreachable) {
    PageAllocator a(3, 2, true);
    const std::vector<int32_t> tokens = {1, 2, 3, 4};
    std::vector<int32_t> pages;
    CHECK(a.allocate(2, pages));
    const std::vector<int32_t> canonical = register_chain(a, pages, tokens);
    a.release_all(pages);  // reverse order: the child (page 2 of the chain) is older in the LRU
    std::vector<int32_t> fresh;
    CHECK(a.allocate(2, fresh));  // the free page, then the LRU head (the child)
    CHECK(fresh[1] == canonical[1]);
    CHECK(a.num_cached_pages() == 1);
    std::vector<int32_t> hits;
    CHECK(a.match_prefix(tokens.data(), 2, hits) == 1);
    CHECK(hits[0] == canonical[0]);
    a.release_all(hits);
    a.release_all(fresh);
    // Evict the root too: its old child must not match even if re-registered content collides.
    CHECK(a.allocate(3, fresh));
    CHECK(a.match_prefix(tokens.data(), 2, hits) == 0);
    a.release_all(fresh);
}

TEST(duplicate_registration_returns_the_cached_page) {
    PageAllocator a(4, 2, true);
    const std::vector<int32_t> tokens = {5, 6, 7, 8};
    std::vector<int32_t> p1, p2;
    CHECK(a.allocate(2, p1));
    CHECK(a.allocate(2, p2));
    const std::vector<int32_t> c1 = register_chain(a, p1, tokens);
    const std::vector<int32_t> c2 = register_chain(a, p2, tokens);
    CHECK(c1 == p1);
    CHECK(c2 == p1);  // the second copy is not registered: the first stays canonical
    a.release_all(p2);
    CHECK(a.num_free_pages() == 2);  // unregistered duplicates go straight back to free
    a.release_all(p1);
    CHECK(a.num_cached_pages() == 2);
}

TEST(disabled_prefix_cache_never_hits) {
    PageAllocator a(4, 2, false);
    const std::vector<int32_t> tokens = {1, 2};
    std::vector<int32_t> pages;
    CHECK(a.allocate(1, pages));
    CHECK(a.register_page(pages[0], PageAllocator::kNoPage, 0, tokens.data()) ==
          PageAllocator::kNoPage);
    a.release_all(pages);
    std::vector<int32_t> hits;
    CHECK(a.match_prefix(tokens.data(), 1, hits) == 0);
    CHECK(a.num_free_pages() == 4);
}

TEST(hash_depends_on_parent_and_every_token) {
    const std::vector<int32_t> t = {1, 2, 3, 4};
    std::vector<int32_t> u = t;
    u[3] = 5;
    CHECK(pagedserve::hash_page(0, t.data(), 4) != pagedserve::hash_page(0, u.data(), 4));
    CHECK(pagedserve::hash_page(0, t.data(), 4) != pagedserve::hash_page(1, t.data(), 4));
    CHECK(pagedserve::hash_page(7, t.data(), 4) == pagedserve::hash_page(7, t.data(), 4));
}

uint64_t constant_hash(uint64_t, const int32_t*, int32_t) { return 42; }

TEST(forced_hash_collisions_never_hand_out_other_tokens) {
    // Every page hashes alike (a crafted collision): hits must still be exact.
    PageAllocator a(8, 2, true, &constant_hash);
    const std::vector<int32_t> mine = {1, 2, 3, 4};
    const std::vector<int32_t> theirs = {1, 2, 9, 9};
    std::vector<int32_t> pages;
    CHECK(a.allocate(2, pages));
    const std::vector<int32_t> canonical = register_chain(a, pages, mine);
    CHECK(canonical[0] == pages[0]);
    CHECK(canonical[1] == PageAllocator::kNoPage);  // the hash is taken by a live page
    std::vector<int32_t> hits;
    CHECK(a.match_prefix(theirs.data(), 2, hits) == 1);  // page 0 equal, page 1 confirmed not
    a.release_all(hits);
    const std::vector<int32_t> stranger = {7, 7, 3, 4};
    CHECK(a.match_prefix(stranger.data(), 2, hits) == 0);
    a.release_all(pages);
}

TEST(event_log_records_stores_and_evictions_in_order) {
    PageAllocator a(3, 2, true);
    const std::vector<int32_t> tokens = {1, 2, 3, 4};
    std::vector<int32_t> pages, dup;
    CHECK(a.allocate(2, pages));
    register_chain(a, pages, tokens);
    CHECK(a.events().size() == 0);  // off until enabled
    a.release_all(pages);
    a.events().enabled = true;
    CHECK(a.allocate(2, pages));  // the free page, then the LRU head: the chain's child
    CHECK(a.allocate(1, dup));    // the root
    pagedserve::KvEventLog& log = a.events();
    CHECK(log.kinds == std::vector<int8_t>({pagedserve::KvEventLog::kRemoved,
                                            pagedserve::KvEventLog::kRemoved}));
    const uint64_t root = pagedserve::hash_page(0, tokens.data(), 2);
    const uint64_t child = pagedserve::hash_page(root, tokens.data() + 2, 2);
    CHECK(log.hashes == std::vector<uint64_t>({child, root}));
    log.clear();
    a.release_all(dup);
    register_chain(a, pages, tokens);  // stored again: root, then its child
    CHECK(log.kinds == std::vector<int8_t>({pagedserve::KvEventLog::kStored,
                                            pagedserve::KvEventLog::kStored}));
    CHECK(log.hashes[0] == root && log.has_parent[0] == 0);
    CHECK(log.parent_hashes[1] == root && log.has_parent[1] == 1);
    CHECK(log.token_ids == tokens);
    register_chain(a, pages, tokens);  // already registered: nothing new
    CHECK(log.size() == 2);
    a.release_all(pages);
}

TEST(event_log_records_each_pages_chain_salt) {
    // The same tokens cached for adapter 7 and for the base: two roots whose tokens alone do not
    // tell them apart. Each record carries its chain's seed, the child too (registered here with
    // another salt: a child's salt is its root's), and so does each removal.
    PageAllocator a(4, 2, true);
    a.events().enabled = true;
    const std::vector<int32_t> tokens = {1, 2, 3, 4};
    std::vector<int32_t> adapter, base;
    CHECK(a.allocate(2, adapter));
    CHECK(a.allocate(2, base));
    CHECK(a.register_page(adapter[0], PageAllocator::kNoPage, 0, tokens.data(), 7) == adapter[0]);
    CHECK(a.register_page(adapter[1], adapter[0], a.generation(adapter[0]), tokens.data() + 2, 0) ==
          adapter[1]);
    CHECK(register_chain(a, base, tokens) == base);
    pagedserve::KvEventLog& log = a.events();
    CHECK(log.size() == 4 && log.salts.size() == 4 && log.token_ids.size() == 8);
    CHECK(log.salts == std::vector<uint64_t>({7, 7, 0, 0}));
    const uint64_t root7 = pagedserve::hash_page(7, tokens.data(), 2);
    const uint64_t root0 = pagedserve::hash_page(0, tokens.data(), 2);
    CHECK(log.hashes[0] == root7 && log.hashes[2] == root0 && root7 != root0);
    CHECK(log.parent_hashes[1] == root7 && log.parent_hashes[3] == root0);
    log.clear();
    CHECK(log.size() == 0 && log.salts.empty() && log.token_ids.empty());
    // Each chain is found under its own salt (the child's 0 at registration changed nothing).
    std::vector<int32_t> hits;
    CHECK(a.match_prefix(tokens.data(), 2, hits, 7) == 2 && hits == adapter);
    a.release_all(hits);
    CHECK(a.match_prefix(tokens.data(), 2, hits, 0) == 2 && hits == base);
    a.release_all(hits);
    a.release_all(adapter);
    a.release_all(base);
    std::vector<int32_t> fresh;
    CHECK(a.allocate(4, fresh));  // evicts all four, least recently used first
    CHECK(log.kinds == std::vector<int8_t>(4, pagedserve::KvEventLog::kRemoved));
    CHECK(log.salts.size() == 4 && log.token_ids.empty());
    const uint64_t child7 = pagedserve::hash_page(root7, tokens.data() + 2, 2);
    int32_t num_adapters = 0;
    for (size_t i = 0; i < log.size(); ++i) {
        const bool adapters = log.hashes[i] == root7 || log.hashes[i] == child7;
        CHECK(log.salts[i] == (adapters ? 7u : 0u));
        num_adapters += adapters ? 1 : 0;
    }
    CHECK(num_adapters == 2);
    a.release_all(fresh);
}

int main() { return check::run_all_tests(); }
