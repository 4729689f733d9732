// The LoRA product's entry (lora.hpp): checks, the step's adapter rows grouped into blocks of one
// slot, and the ISA level's copy of the loops (kernels.hpp, levels.hpp).
#include <stdexcept>
#include <vector>

#include "cpu/arch.hpp"
#include "lora/levels.hpp"
#include "pagedserve/cpu_features.hpp"
#include "pagedserve/lora.hpp"

namespace pagedserve {
namespace {

void check(bool ok, const char* message) {
    if (!ok) throw std::invalid_argument(message);
}

bool float_or_bf16(DType d) { return d == DType::kFloat32 || d == DType::kBFloat16; }

void check_args(const LoraArgs& a) {
    const LoraStacks& s = a.stacks;
    check(s.num_parts >= 1 && s.num_parts <= kLoraMaxParts, "lora: num_parts must be 1..4");
    check(s.num_slots > 0 && s.k > 0 && s.max_rank > 0, "lora: sizes must be positive");
    for (int p = 0; p < s.num_parts; ++p) check(s.part_widths[p] > 0, "lora: empty part");
    for (std::int64_t slot = 0; s.ranks && slot < s.num_slots; ++slot) {
        check(s.ranks[slot] >= 0 && s.ranks[slot] <= s.max_rank,
              "lora: a slot's rank is not 0 .. max_rank");
    }
    check(s.a != nullptr && s.b != nullptr, "lora: null stacks");
    check(float_or_bf16(s.dtype) && float_or_bf16(a.x_dtype) && float_or_bf16(a.y_dtype),
          "lora: dtypes must be float32 or bfloat16");
    const LoraSegments& g = a.segments;
    check(g.num_segments >= 0, "lora: negative num_segments");
    if (g.num_segments == 0) return;
    check(g.starts != nullptr && g.slots != nullptr, "lora: null segments");
    check(g.starts[0] == 0, "lora: the first segment must start at row 0");
    for (std::int64_t i = 0; i < g.num_segments; ++i) {
        check(g.starts[i + 1] >= g.starts[i], "lora: segment starts must not decrease");
        check(g.slots[i] >= -1 && g.slots[i] < s.num_slots, "lora: a segment's slot is out of range");
    }
    if (g.starts[g.num_segments] == 0) return;
    check(a.x != nullptr && a.y != nullptr, "lora: null x or y");
    check(a.x_stride >= s.k && a.y_stride >= s.n(), "lora: row strides too short");
}

// The rows of every adapter segment, slot by slot (rows ascending within a slot), cut into
// blocks of up to kBlockRows; slots of rank 0 have none.
std::vector<lora::Block> blocks_of(const LoraArgs& a) {
    const LoraSegments& g = a.segments;
    std::vector<lora::Block> blocks;
    for (std::int64_t slot = 0; slot < a.stacks.num_slots; ++slot) {
        if (a.stacks.rank(slot) == 0) continue;  // an empty slot adds nothing
        lora::Block block;
        block.slot = static_cast<std::int32_t>(slot);
        for (std::int64_t i = 0; i < g.num_segments; ++i) {
            if (g.slots[i] != slot) continue;
            for (std::int64_t r = g.starts[i]; r < g.starts[i + 1]; ++r) {
                block.rows[block.num_rows++] = r;
                if (block.num_rows == lora::kBlockRows) {
                    blocks.push_back(block);
                    block.num_rows = 0;
                }
            }
        }
        if (block.num_rows > 0) blocks.push_back(block);
    }
    return blocks;
}

}  // namespace

std::int64_t LoraStacks::n() const {
    std::int64_t total = 0;
    for (int p = 0; p < num_parts; ++p) total += part_widths[p];
    return total;
}

void lora_add_cpu(const LoraArgs& args, int num_threads) {
    check_args(args);
    const std::vector<lora::Block> blocks = blocks_of(args);
    if (blocks.empty()) return;
#if PAGEDSERVE_X86
    switch (cpu_isa()) {
        case CpuIsa::kPortable: return lora_portable::add_blocks(args, blocks, num_threads);
        case CpuIsa::kAvx2:
        case CpuIsa::kAvx2Vnni: return lora_avx2::add_blocks(args, blocks, num_threads);
        default: return lora_avx512::add_blocks(args, blocks, num_threads);
    }
#else
    lora_portable::add_blocks(args, blocks, num_threads);
#endif
}

const char* lora_path() {
#if PAGEDSERVE_X86
    switch (cpu_isa()) {
        case CpuIsa::kPortable: return "portable";
        case CpuIsa::kAvx2:
        case CpuIsa::kAvx2Vnni: return "avx2";
        default: return "avx512";
    }
#else
    return "portable";
#endif
}

}  // namespace pagedserve
