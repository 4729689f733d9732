// The prefix cache's change log for routers (vLLM's KV events): which page hashes entered and
// left the cache, in order, each with the salt its hash chain was seeded with (a LoRA adapter's
// id, 0 for the base model: vLLM's lora_id). The page allocator appends a record per page as it
// registers or drops one (only while enabled); the engine drains the log once per step and
// publishes it, so no Python runs per page.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pagedserve {

struct KvEventLog {
    static constexpr int8_t kStored = 0;   // a page's hash entered the cache
    static constexpr int8_t kRemoved = 1;  // a page's hash left it (evicted or taken over)

    bool enabled = false;
    std::vector<int8_t> kinds;            // one per record, in order
    std::vector<uint64_t> hashes;         // the page's chained hash, one per record
    std::vector<uint64_t> parent_hashes;  // stored records: the parent page's hash (else 0)
    std::vector<uint8_t> has_parent;      // stored records: 0 for a sequence's first page
    std::vector<uint64_t> salts;          // the page's chain seed (its root's salt; 0: none)
    std::vector<int32_t> token_ids;       // stored records only: page_size ids each, in order

    void stored(uint64_t hash, const uint64_t* parent_hash, uint64_t salt, const int32_t* tokens,
                int32_t page_size) {
        push(kStored, hash, salt);
        parent_hashes.push_back(parent_hash != nullptr ? *parent_hash : 0);
        has_parent.push_back(parent_hash != nullptr ? 1 : 0);
        token_ids.insert(token_ids.end(), tokens, tokens + page_size);
    }
    void removed(uint64_t hash, uint64_t salt) {
        push(kRemoved, hash, salt);
        parent_hashes.push_back(0);
        has_parent.push_back(0);
    }
    size_t size() const { return kinds.size(); }
    void clear() {
        kinds.clear();
        hashes.clear();
        parent_hashes.clear();
        has_parent.clear();
        salts.clear();
        token_ids.clear();
    }

  private:
    void push(int8_t kind, uint64_t hash, uint64_t salt) {
        kinds.push_back(kind);
        hashes.push_back(hash);
        salts.push_back(salt);
    }
};

}  // namespace pagedserve
