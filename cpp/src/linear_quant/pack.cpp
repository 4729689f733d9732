// Reading GGUF blocks (ggml's block layouts: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) and repacking
// them once into linear_quant/layout.hpp's tiles.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "linear_quant/layout.hpp"
#include "pagedserve/linear_quant.hpp"

namespace pagedserve {
namespace quant_detail {
namespace {

float half_at(const std::uint8_t* p) {  // IEEE binary16, little-endian
    return half_to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
}

// float -> IEEE binary16 bits, for a value that binary16 holds exactly (a format's own scale, or
// -8 / -128 times one); false otherwise (a scale past binary16's range).
bool exact_half(float v, std::uint16_t& out) {
    const std::uint16_t sign = std::signbit(v) ? 0x8000u : 0u;
    const float a = std::fabs(v);
    std::uint16_t h = 0;
    if (a != 0.0f) {
        int e = 0;
        const float m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): biased exponent e + 14
        if (e + 14 >= 1) {
            const auto fraction = static_cast<std::uint32_t>(std::ldexp(m, 11)) & 0x3ffu;
            h = static_cast<std::uint16_t>(((e + 14) << 10) | fraction);
        } else {  // subnormal: a / 2^-24
            h = static_cast<std::uint16_t>(std::ldexp(a, 24));
        }
    }
    out = static_cast<std::uint16_t>(h | sign);
    return half_to_float(out) == v;
}

// One packed block's source: 32 unsigned values and the scale/min of each 16-feature half.
struct Block32 {
    std::uint8_t u[kBlockK];
    float scale[2], min[2];
};

// ggml's get_scale_min_k4: 6-bit sub-block scale and min j (< 8) of a Q4_K / Q5_K block.
void scale_min_k4(int j, const std::uint8_t* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63, m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

void set_both(Block32& out, float scale, float min) {
    out.scale[0] = out.scale[1] = scale;
    out.min[0] = out.min[1] = min;
}

// Block b (32 features) of a row in a 32-feature format.
void read_small(int type, const std::uint8_t* row, std::int64_t b, Block32& out) {
    if (type == kGgmlQ8_0) {
        const std::uint8_t* p = row + 34 * b;
        const float d = half_at(p);
        for (int i = 0; i < 32; ++i) out.u[i] = static_cast<std::uint8_t>(p[2 + i] ^ 0x80u);
        return set_both(out, d, -128.0f * d);  // u = q + 128
    }
    const bool has_min = type == kGgmlQ4_1;
    const std::uint8_t* p = row + (has_min ? 20 : 18) * b;
    const float d = half_at(p);
    const std::uint8_t* qs = p + (has_min ? 4 : 2);
    for (int i = 0; i < 16; ++i) out.u[i] = qs[i] & 0xF, out.u[i + 16] = qs[i] >> 4;
    set_both(out, d, has_min ? half_at(p + 2) : -8.0f * d);
}

// Block b of a row in a K-quant (256-feature super-blocks).
void read_k(int type, const std::uint8_t* row, std::int64_t b, Block32& out) {
    const std::int64_t jb = b % 8;
    if (type == kGgmlQ6_K) {  // ql[128], qh[64], int8 scales[16], half d
        const std::uint8_t* p = row + 210 * (b / 8);
        const std::uint8_t* ql = p + 64 * (jb / 4);
        const std::uint8_t* qh = p + 128 + 32 * (jb / 4);
        const int quarter = static_cast<int>(jb % 4);
        const float d = half_at(p + 208);
        for (int l = 0; l < 32; ++l) {
            const std::uint8_t low = quarter & 1 ? ql[l + 32] : ql[l];
            const int lo = quarter < 2 ? (low & 0xF) : (low >> 4);
            out.u[l] = static_cast<std::uint8_t>(lo | (((qh[l] >> (2 * quarter)) & 3) << 4));
        }
        for (int h = 0; h < 2; ++h) {
            const float scale = d * static_cast<float>(static_cast<std::int8_t>(p[192 + 2 * jb + h]));
            out.scale[h] = scale, out.min[h] = -32.0f * scale;  // u = q + 32
        }
        return;
    }
    const bool five = type == kGgmlQ5_K;  // half d, half dmin, scales[12], (qh[32]), qs[128]
    const std::uint8_t* p = row + (five ? 176 : 144) * (b / 8);
    const float d = half_at(p), dmin = half_at(p + 2);
    const std::uint8_t* qs = p + (five ? 48 : 16) + 32 * (jb / 2);
    int sc = 0, m = 0;
    scale_min_k4(static_cast<int>(jb), p + 4, sc, m);
    for (int l = 0; l < 32; ++l) {
        int v = jb % 2 ? (qs[l] >> 4) : (qs[l] & 0xF);
        if (five && (p[16 + l] >> jb) & 1) v += 16;
        out.u[l] = static_cast<std::uint8_t>(v);
    }
    set_both(out, d * static_cast<float>(sc), -(dmin * static_cast<float>(m)));
}

void read_block(int type, const std::uint8_t* row, std::int64_t b, Block32& out) {
    if (row == nullptr) {
        std::memset(&out, 0, sizeof(out));
        return;
    }
    if (quant_block_features(type) == 32) return read_small(type, row, b, out);
    read_k(type, row, b, out);
}

// Writes the tile's block b: src[c] is column c's block. False where a scale or min has no
// exact fp16 for a format that stores them so.
bool write_block(const Format& f, const Block32 (&src)[kTileN], std::uint8_t* dst) {
    bool exact = true;
    for (std::int64_t c = 0; c < kTileN; ++c) {
        const std::int64_t h = c / 16, lane = c % 16;
        for (std::int64_t e = 0; e < kBlockK; ++e) {
            const std::int64_t s = e / 4, j = e % 4;
            if (f.bits == 8) {
                dst[((s * 2 + h) * 16 + lane) * 4 + j] = src[c].u[e];
            } else {
                const std::int64_t at = (((s % 4) * 2 + h) * 16 + lane) * 4 + j;
                dst[at] |= static_cast<std::uint8_t>(src[c].u[e] << (s < 4 ? 0 : 4));
            }
        }
    }
    for (std::int64_t g = 0; g < f.groups(); ++g) {  // 32-feature groups: both halves agree
        for (int which = 0; which < 2; ++which) {
            std::uint8_t* at = dst + f.scales_at(which, g);
            for (std::int64_t c = 0; c < kTileN; ++c) {
                const float v = which == 0 ? src[c].scale[g] : src[c].min[g];
                if (f.half_scales) {
                    std::uint16_t h = 0;
                    exact = exact_half(v, h) && exact;
                    std::memcpy(at + 2 * c, &h, sizeof(h));
                } else {
                    std::memcpy(at + 4 * c, &v, sizeof(v));
                }
            }
        }
    }
    return exact;
}

}  // namespace

Format format_of(int ggml_type) {
    switch (ggml_type) {
        case kGgmlQ4_0: case kGgmlQ4_1: return {4, 32, true};
        case kGgmlQ4_K: return {4, 32, false};
        case kGgmlQ8_0: return {8, 32, true};
        case kGgmlQ5_K: return {8, 32, false};
        case kGgmlQ6_K: return {8, 16, false};
        default: throw std::invalid_argument("no quantized kernel for ggml type " +
                                             std::to_string(ggml_type));
    }
}

}  // namespace quant_detail

using namespace quant_detail;

bool quant_type_supported(int ggml_type) {
    switch (ggml_type) {
        case kGgmlQ4_0: case kGgmlQ4_1: case kGgmlQ8_0:
        case kGgmlQ4_K: case kGgmlQ5_K: case kGgmlQ6_K: return true;
        default: return false;
    }
}

std::int64_t quant_block_features(int ggml_type) {
    format_of(ggml_type);  // throws for a type without a kernel
    return ggml_type >= kGgmlQ4_K ? 256 : 32;
}

std::int64_t quant_row_bytes(int ggml_type, std::int64_t k) {
    const std::int64_t blocks = k / quant_block_features(ggml_type);
    switch (ggml_type) {
        case kGgmlQ4_0: return 18 * blocks;
        case kGgmlQ4_1: return 20 * blocks;
        case kGgmlQ8_0: return 34 * blocks;
        case kGgmlQ4_K: return 144 * blocks;
        case kGgmlQ5_K: return 176 * blocks;
        default: return 210 * blocks;  // Q6_K
    }
}

std::int64_t packed_quant_bytes(int ggml_type, std::int64_t n, std::int64_t k) {
    return num_tiles(n) * tile_bytes(format_of(ggml_type), k);
}

void pack_quant_weight(int ggml_type, const std::int64_t* rows, std::int64_t n, std::int64_t k,
                       std::uint8_t* packed, int num_threads) {
    const Format f = format_of(ggml_type);
    if (n <= 0 || k <= 0 || k % quant_block_features(ggml_type) != 0)
        throw std::invalid_argument("pack_quant_weight: n must be > 0 and k a positive multiple "
                                    "of the type's block size");
    if (!rows || !packed) throw std::invalid_argument("pack_quant_weight: null rows or packed");
    const std::int64_t tiles = num_tiles(n), blocks = k / kBlockK;
    std::atomic<bool> exact{true};  // no exception may leave the parallel loop
#pragma omp parallel for num_threads(std::max(1, num_threads)) schedule(static)
    for (std::int64_t t = 0; t < tiles; ++t) {
        Block32 src[kTileN];
        for (std::int64_t b = 0; b < blocks; ++b) {
            for (std::int64_t c = 0; c < kTileN; ++c) {
                const std::int64_t col = t * kTileN + c;
                const auto* row = col < n ? reinterpret_cast<const std::uint8_t*>(rows[col])
                                          : nullptr;
                read_block(ggml_type, row, b, src[c]);
            }
            std::uint8_t* dst = packed + t * tile_bytes(f, k) + b * f.block_bytes();
            std::memset(dst, 0, f.quant_bytes());
            if (!write_block(f, src, dst)) exact.store(false, std::memory_order_relaxed);
        }
    }
    if (!exact.load())
        throw std::invalid_argument("pack_quant_weight: a block scale (or -8 / -128 times it) is "
                                    "not exact in fp16: the file's scales are out of range");
}

}  // namespace pagedserve
