// The quantized linear kernel (linear_quant.hpp): Q8_0 and Q4_1 rows built here against a
// double-precision oracle (weights decoded from the block layout, activations rounded to int8 per
// 32 features as the kernel does); every type (K-quants from random blocks) on the VNNI path
// (and every AVX2 / NEON path) equal to the portable path bit for bit, around tile edges, threaded, past a 256-row chunk,
// with bias, an in-place residual, fp32 / bf16 output and the gated epilogue; argument checks.
// The AMX-INT8 path equal to the VNNI path bit for bit for every type, on the emulated tiles
// everywhere and on the CPU's where it has AMX. Run under ASan/UBSan by
// tests/native/test_cpp_sanitized.py.
// float_activations (x kept in fp32): every type at every level this CPU runs against a double
// reference of the dequantized weight, bias / residual / gated, bf16 and fp32; batch invariance.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "check.hpp"
#include "pagedserve/cpu_features.hpp"
#include "pagedserve/linear.hpp"
#include "pagedserve/linear_quant.hpp"

using namespace pagedserve;

namespace {

// A random normal fp16 scale in [2^-9, 2^-5): its bits and its exact value.
std::uint16_t random_half(std::mt19937& rng, float& value) {
    const int exp = 6 + static_cast<int>(rng() % 4), mant = static_cast<int>(rng() % 1024);
    value = std::ldexp(1.0f + mant / 1024.0f, exp - 15);
    return static_cast<std::uint16_t>((exp << 10) | mant);
}

void put_half(std::uint8_t* p, std::uint16_t h) { p[0] = h & 0xff, p[1] = h >> 8; }

// n rows of k features in `type`, and (Q8_0 / Q4_1) their decoded values.
std::vector<std::uint8_t> make_rows(int type, std::int64_t n, std::int64_t k, std::mt19937& rng,
                                    std::vector<double>& w) {
    const std::int64_t row_bytes = quant_row_bytes(type, k);
    std::vector<std::uint8_t> rows(n * row_bytes);
    for (auto& b : rows) b = static_cast<std::uint8_t>(rng());
    w.assign(n * k, 0.0);
    const std::int64_t block = quant_block_features(type);
    const std::int64_t block_bytes = row_bytes / (k / block);
    for (std::int64_t r = 0; r < n; ++r) {
        for (std::int64_t b = 0; b < k / block; ++b) {
            std::uint8_t* p = rows.data() + r * row_bytes + b * block_bytes;
            float d = 0, m = 0;
            if (type == kGgmlQ6_K) {
                put_half(p + 208, random_half(rng, d));
                continue;
            }
            put_half(p, random_half(rng, d));
            if (type == kGgmlQ4_1 || type == kGgmlQ4_K || type == kGgmlQ5_K)
                put_half(p + 2, random_half(rng, m));
            double* out = w.data() + r * k + b * block;
            for (int i = 0; i < 32 && type == kGgmlQ8_0; ++i)
                out[i] = double(d) * static_cast<std::int8_t>(p[2 + i]);
            for (int i = 0; i < 16 && type == kGgmlQ4_1; ++i) {
                out[i] = double(d) * (p[4 + i] & 0xF) + m;
                out[i + 16] = double(d) * (p[4 + i] >> 4) + m;
            }
        }
    }
    return rows;
}

std::vector<std::uint8_t> pack(int type, const std::vector<std::uint8_t>& rows, std::int64_t n,
                               std::int64_t k) {
    std::vector<std::int64_t> table(n);
    for (std::int64_t r = 0; r < n; ++r)
        table[r] = reinterpret_cast<std::int64_t>(rows.data() + r * quant_row_bytes(type, k));
    std::vector<std::uint8_t> packed(packed_quant_bytes(type, n, k));
    pack_quant_weight(type, table.data(), n, k, packed.data(), 2);
    return packed;
}

// x rounded as the kernel rounds it: per 32 features d = max|x| / 127, q = round(x * 127 / max).
std::vector<double> int8_rows(const std::vector<float>& x, std::int64_t m, std::int64_t k) {
    std::vector<double> out(m * k);
    for (std::int64_t b = 0; b < m * k / 32; ++b) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[32 * b + i]));
        const float d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        for (int i = 0; i < 32; ++i) out[32 * b + i] = double(d) * std::nearbyint(x[32 * b + i] * inv);
    }
    return out;
}

QuantLinearArgs args_for(int type, const std::vector<float>& x, const std::vector<std::uint8_t>& packed,
                         std::vector<float>& out, std::int64_t m, std::int64_t n, std::int64_t k) {
    QuantLinearArgs a;
    a.ggml_type = type, a.x = x.data(), a.x_stride = k, a.float32 = true;
    a.packed = packed.data(), a.out = out.data(), a.out_stride = n;
    a.m = m, a.n = n, a.k = k;
    return a;
}

bool matches_oracle(int type, std::int64_t m, std::int64_t n, std::int64_t k, std::mt19937& rng,
                    bool portable) {
    std::vector<double> w;
    const auto rows = make_rows(type, n, k, rng, w);
    const auto packed = pack(type, rows, n, k);
    std::normal_distribution<float> dist;
    std::vector<float> x(m * k), out(m * n);
    for (auto& v : x) v = dist(rng);
    quant_linear(args_for(type, x, packed, out, m, n, k), 2, portable);
    const auto xq = int8_rows(x, m, k);
    for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
            double want = 0, scale = 0;
            for (std::int64_t t = 0; t < k; ++t) {
                want += xq[i * k + t] * w[j * k + t];
                scale += std::fabs(xq[i * k + t] * w[j * k + t]);
            }
            if (std::fabs(out[i * n + j] - want) > 1e-5 * scale + 1e-6) return false;
        }
    }
    return true;
}

// One product run twice on the same inputs (bias and an in-place residual with `extras`), the
// second run's arguments and path changed by `second(args)`, which returns whether it runs the
// portable path. Both outputs.
template <typename Second>
std::array<std::vector<float>, 2> run_twice(int type, std::int64_t m, std::int64_t n,
                                            std::int64_t k, bool extras, std::int64_t gated_width,
                                            std::mt19937& rng, Second second) {
    std::vector<double> w;
    const auto rows = make_rows(type, n, k, rng, w);
    const auto packed = pack(type, rows, n, k);
    std::normal_distribution<float> dist;
    std::vector<float> x(m * k), bias(n), start(m * n);
    for (auto* v : {&x, &bias, &start})
        for (auto& e : *v) e = dist(rng);
    std::array<std::vector<float>, 2> outs = {start, start};
    for (int p = 0; p < 2; ++p) {
        QuantLinearArgs a = args_for(type, x, packed, outs[p], m, n, k);
        a.gated_width = gated_width;
        if (gated_width) a.out_stride = gated_width;
        if (extras && !gated_width) a.bias = bias.data(), a.residual = outs[p].data(), a.residual_stride = n;
        const bool portable = p == 1 && second(a);
        quant_linear(a, 2 - p, portable);  // the first run threaded, the second on one thread
    }
    return outs;
}

// The active ISA level's path and the portable one: bit for bit, gated products too (the same
// exp polynomial, kernel_math.hpp).
bool paths_agree(int type, std::int64_t m, std::int64_t n, std::int64_t k, bool extras,
                 std::int64_t gated_width, std::mt19937& rng) {
    const auto outs = run_twice(type, m, n, k, extras, gated_width, rng,
                                [](QuantLinearArgs&) { return true; });
    return outs[0] == outs[1];
}

// The VNNI path and AMX-INT8 tiles (amx_from_rows 1): equal bit for bit, gated too.
bool tiles_agree(int type, std::int64_t m, std::int64_t n, std::int64_t k, bool extras,
                 std::int64_t gated_width, std::mt19937& rng) {
    const auto outs = run_twice(type, m, n, k, extras, gated_width, rng, [](QuantLinearArgs& a) {
        a.amx_from_rows = 1;
        return false;
    });
    return outs[0] == outs[1];
}

// int16 activation rows (QuantLinearArgs::int16_activations) on the active level's path and the
// portable one, bit for bit, gated too. fill >= 0: every 8-bit value byte of the weight set to it
// and rows of +-1 (q = +-32512): the largest sums of the paths' int32 lanes (AVX2's wide 8-bit
// path: 16 pairs of 255 x 32512 products a group).
bool int16_paths_agree(int type, std::int64_t m, std::int64_t n, std::int64_t k,
                       std::int64_t gated_width, std::mt19937& rng, int fill = -1) {
    std::vector<double> w;
    auto rows = make_rows(type, n, k, rng, w);
    if (fill >= 0) {
        const std::int64_t block_bytes = quant_row_bytes(type, k) / (k / 32);
        const std::int64_t first = type == kGgmlQ8_0 ? 2 : 4;  // past d (and m)
        for (std::int64_t b = 0; b < n * k / 32; ++b)
            for (std::int64_t i = first; i < block_bytes; ++i) rows[b * block_bytes + i] = fill;
    }
    const auto packed = pack(type, rows, n, k);
    std::normal_distribution<float> dist;
    std::vector<float> x(m * k);
    for (std::int64_t i = 0; i < m * k; ++i) x[i] = fill >= 0 ? ((i / k) % 2 ? -1.0f : 1.0f) : dist(rng);
    const std::int64_t width = gated_width ? gated_width : n;
    std::array<std::vector<float>, 2> outs = {std::vector<float>(m * width), std::vector<float>(m * width)};
    for (int p = 0; p < 2; ++p) {
        QuantLinearArgs a = args_for(type, x, packed, outs[p], m, n, k);
        a.int16_activations = true;
        a.gated_width = gated_width;
        a.out_stride = width;
        quant_linear(a, 2 - p, p == 1);  // the first run threaded, the second on one thread
    }
    return outs[0] == outs[1];
}

// The largest int products the vector paths sum in narrow lanes: every 8-bit weight 0 (Q8_0's
// q = -128: u - 128 = -128 on NEON) or every 4-bit one 15, times activations of +-127 (x = +-1),
// against the portable path, bit for bit. A row of +1s then one of -1s, so both signs reach
// every sum; gated and plain.
bool extremes_agree() {
    const std::int64_t m = 5, n = 64, k = 64;
    std::mt19937 rng(17);
    for (int type : {kGgmlQ8_0, kGgmlQ4_1}) {
        std::vector<double> w;
        auto rows = make_rows(type, n, k, rng, w);
        const std::int64_t block_bytes = quant_row_bytes(type, k) / (k / 32);
        const std::int64_t first = type == kGgmlQ8_0 ? 2 : 4;  // past d (and m)
        for (std::int64_t b = 0; b < n * k / 32; ++b)
            for (std::int64_t i = first; i < block_bytes; ++i)
                rows[b * block_bytes + i] = type == kGgmlQ8_0 ? 0x80 : 0xFF;
        const auto packed = pack(type, rows, n, k);
        std::vector<float> x(m * k);
        for (std::int64_t i = 0; i < m * k; ++i) x[i] = (i / k) % 2 ? -1.0f : 1.0f;
        for (std::int64_t gated : {0, 32}) {
            std::array<std::vector<float>, 2> outs = {std::vector<float>(m * n), std::vector<float>(m * n)};
            for (int p = 0; p < 2; ++p) {
                QuantLinearArgs a = args_for(type, x, packed, outs[p], m, n, k);
                a.gated_width = gated;
                if (gated) a.out_stride = gated;
                quant_linear(a, 1, p == 1);
            }
            if (outs[0] != outs[1]) return false;
        }
    }
    return true;
}

// bf16 x, bias and in-place residual, bf16 out (rounded by the vector path's own integer ops or
// vcvtneps2bf16) or fp32 out, gated too: the active path and the portable one, bit for bit.
bool bf16_paths_agree(int type, std::int64_t m, std::int64_t n, std::int64_t k, bool out_float32,
                      std::int64_t gated_width, std::mt19937& rng) {
    std::vector<double> w;
    const auto rows = make_rows(type, n, k, rng, w);
    const auto packed = pack(type, rows, n, k);
    std::normal_distribution<float> dist;
    const auto bf16 = [&](std::size_t count) {
        std::vector<std::uint16_t> v(count);
        for (auto& e : v) {
            const float f = dist(rng);
            std::uint32_t bits;
            std::memcpy(&bits, &f, sizeof(bits));
            e = static_cast<std::uint16_t>(bits >> 16);
        }
        return v;
    };
    const auto x = bf16(m * k), bias = bf16(n), start = bf16(m * n);
    std::array<std::vector<std::uint16_t>, 2> outs = {start, start};
    std::array<std::vector<float>, 2> outs32 = {std::vector<float>(m * n), std::vector<float>(m * n)};
    for (int p = 0; p < 2; ++p) {
        QuantLinearArgs a;
        a.ggml_type = type, a.x = x.data(), a.x_stride = k, a.packed = packed.data();
        a.m = m, a.n = n, a.k = k, a.out_float32 = out_float32;
        a.out = out_float32 ? static_cast<void*>(outs32[p].data()) : outs[p].data();
        a.out_stride = gated_width ? gated_width : n, a.gated_width = gated_width;
        if (!gated_width) {
            a.bias = bias.data();
            a.residual = outs[p].data(), a.residual_stride = n;  // in place when out is bf16
        }
        quant_linear(a, 2, p == 1);
    }
    return out_float32 ? outs32[0] == outs32[1] : outs[0] == outs[1];
}

// bf16 outputs at the edges of vcvtneps2bf16's rounding (kernel_math.hpp), reached through the
// epilogue: x = 0 (so the products are +0), out = bias + residual with both bf16, whose sums
// fall on ties (1 + 2^-8 and its odd neighbour, both signs), on denormals (flushed to a signed
// zero), on infinities and NaN (quieted). The active path and the portable one, bit for bit.
bool bf16_rounding_edges_agree() {
    const std::int64_t m = 2, n = 40, k = 32;
    std::mt19937 rng(31);
    std::vector<double> w;
    const auto packed = pack(kGgmlQ8_0, make_rows(kGgmlQ8_0, n, k, rng, w), n, k);
    const std::uint16_t bias_bits[] = {0x3f80, 0xbf80, 0x3f81, 0xbf81, 0x0001, 0x8001, 0x0080,
                                       0x7f80, 0xff80, 0x7fc1, 0x7f81, 0x0000, 0x8000, 0x4000};
    const std::uint16_t residual_bits[] = {0x3b80, 0xbb80, 0x3b80, 0xbb80, 0x0001, 0x0002,
                                           0x8080, 0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x8000, 0x8000,
                                           0x3880};
    std::vector<std::uint16_t> x(m * k, 0), bias(n), start(m * n);
    for (std::int64_t j = 0; j < n; ++j) bias[j] = bias_bits[j % 14];
    for (std::int64_t i = 0; i < m * n; ++i) start[i] = residual_bits[(i + i / n) % 14];
    std::array<std::vector<std::uint16_t>, 2> outs = {start, start};
    for (int p = 0; p < 2; ++p) {
        QuantLinearArgs a;
        a.ggml_type = kGgmlQ8_0, a.x = x.data(), a.x_stride = k, a.packed = packed.data();
        a.m = m, a.n = n, a.k = k, a.out = outs[p].data(), a.out_stride = n;
        a.bias = bias.data(), a.residual = outs[p].data(), a.residual_stride = n;
        quant_linear(a, 1, p == 1);
    }
    return outs[0] == outs[1] && outs[0][0] == 0x3f80;  // 1 + 2^-8: a tie, to even (1)
}

constexpr int kTypes[] = {kGgmlQ4_0, kGgmlQ4_1, kGgmlQ8_0, kGgmlQ4_K, kGgmlQ5_K, kGgmlQ6_K};

// ---- float activations (QuantLinearArgs::float_activations) ----

// The packed weight decoded in double by layout.hpp's documented bytes: w[col k + e] = scale * u +
// min, independently of the kernels' arithmetic (Q8_0 / Q4_1 also checked against make_rows').
std::vector<double> decode_packed(int type, const std::vector<std::uint8_t>& packed, std::int64_t n,
                                  std::int64_t k) {
    const int bits = type == kGgmlQ4_0 || type == kGgmlQ4_1 || type == kGgmlQ4_K ? 4 : 8;
    const int group = type == kGgmlQ6_K ? 16 : 32;
    const int scale_bytes = type == kGgmlQ4_0 || type == kGgmlQ4_1 || type == kGgmlQ8_0 ? 2 : 4;
    const std::int64_t quant_bytes = 32 * 32 * bits / 8, groups = 32 / group;
    const std::int64_t block_bytes = quant_bytes + 2 * groups * 32 * scale_bytes;
    const auto scale_at = [&](const std::uint8_t* block, int which, std::int64_t g, std::int64_t c) {
        const std::uint8_t* at = block + quant_bytes + ((which * groups + g) * 32 + c) * scale_bytes;
        if (scale_bytes == 4) {
            float v;
            std::memcpy(&v, at, sizeof(v));
            return double(v);
        }
        const int h = at[0] | (at[1] << 8), exp = (h >> 10) & 31, mant = h & 1023;
        const double mag = exp ? std::ldexp(1024.0 + mant, exp - 25) : std::ldexp(double(mant), -24);
        return (h & 0x8000) ? -mag : mag;
    };
    std::vector<double> w(n * k);
    for (std::int64_t col = 0; col < n; ++col) {
        const std::int64_t c = col % 32, h = c / 16, lane = c % 16;
        for (std::int64_t b = 0; b < k / 32; ++b) {
            const std::uint8_t* block = packed.data() + ((col / 32) * (k / 32) + b) * block_bytes;
            for (std::int64_t e = 0; e < 32; ++e) {
                const std::int64_t st = e / 4, j = e % 4;
                int u;
                if (bits == 8) {
                    u = block[((st * 2 + h) * 16 + lane) * 4 + j];
                } else {
                    const int byte = block[(((st % 4) * 2 + h) * 16 + lane) * 4 + j];
                    u = st < 4 ? (byte & 0xF) : (byte >> 4);
                }
                w[col * k + 32 * b + e] =
                    scale_at(block, 0, e / group, c) * u + scale_at(block, 1, e / group, c);
            }
        }
    }
    return w;
}

float bf16_value(std::uint16_t bits) {
    const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &wide, sizeof(f));
    return f;
}

std::uint16_t bf16_truncated(float f) {
    std::uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    return static_cast<std::uint16_t>(bits >> 16);
}

// One float-activation product's inputs and outputs; x, bias and the residual in bf16 or fp32,
// out bf16 (bf16 x) or fp32. run() calls quant_linear on rows [row0, row0 + m) of x.
struct FloatCase {
    int type;
    std::int64_t n, k, gated_width;
    bool bf16, extras;
    std::vector<std::uint8_t> packed;
    std::vector<double> w;  // decoded weight [n, k]
    std::vector<float> x, bias, start;  // x [rows, k]; start: out before the call (the residual)

    FloatCase(int type_, std::int64_t rows, std::int64_t n_, std::int64_t k_, std::int64_t gated,
              bool bf16_, bool extras_, std::mt19937& rng)
        : type(type_), n(n_), k(k_), gated_width(gated), bf16(bf16_), extras(extras_ && !gated) {
        std::vector<double> source;
        packed = pack(type, make_rows(type, n, k, rng, source), n, k);
        w = decode_packed(type, packed, n, k);
        if (type == kGgmlQ8_0 || type == kGgmlQ4_1) {
            for (std::int64_t i = 0; i < n * k; ++i)
                if (w[i] != source[i]) throw std::logic_error("decode_packed disagrees with make_rows");
        }
        std::normal_distribution<float> dist;
        for (auto* v : {&x, &bias, &start}) {
            v->resize(v == &x ? rows * k : v == &bias ? n : rows * out_cols());
            for (auto& e : *v) e = bf16 ? bf16_value(bf16_truncated(dist(rng))) : dist(rng);
        }
    }

    std::int64_t out_cols() const { return gated_width ? gated_width : n; }

    // out rows [row0, row0 + m) as fp32 (bf16 outputs widened), threaded `threads`.
    std::vector<float> run(std::int64_t row0, std::int64_t m, int threads, bool portable) const {
        const std::int64_t cols = out_cols();
        std::vector<float> out32(start.begin() + row0 * cols, start.begin() + (row0 + m) * cols);
        std::vector<std::uint16_t> x16(m * k), bias16(n), out16(m * cols);
        QuantLinearArgs a;
        a.ggml_type = type, a.packed = packed.data(), a.m = m, a.n = n, a.k = k;
        a.x_stride = k, a.out_stride = cols, a.gated_width = gated_width;
        a.float_activations = true, a.float32 = !bf16;
        if (bf16) {
            for (std::int64_t i = 0; i < m * k; ++i) x16[i] = bf16_truncated(x[row0 * k + i]);
            for (std::int64_t i = 0; i < n; ++i) bias16[i] = bf16_truncated(bias[i]);
            for (std::int64_t i = 0; i < m * cols; ++i) out16[i] = bf16_truncated(out32[i]);
            a.x = x16.data(), a.out = out16.data(), a.bias = bias16.data();
        } else {
            a.x = x.data() + row0 * k, a.out = out32.data(), a.bias = bias.data();
        }
        if (extras) {
            a.residual = a.out, a.residual_stride = cols;  // in place
        } else {
            a.bias = nullptr;
        }
        quant_linear(a, threads, portable);
        if (bf16)
            for (std::int64_t i = 0; i < m * cols; ++i) out32[i] = bf16_value(out16[i]);
        return out32;
    }

    // The double reference of row i: sum over k of x w (and sum |x w|) for packed column j.
    double dot(std::int64_t i, std::int64_t j, double& size) const {
        double sum = 0;
        size = 0;
        for (std::int64_t e = 0; e < k; ++e) {
            sum += double(x[i * k + e]) * w[j * k + e];
            size += std::fabs(double(x[i * k + e]) * w[j * k + e]);
        }
        return sum;
    }

    // got (rows [row0, row0 + m)) within the stated tolerance of the double reference: an fp32
    // FMA chain over k features errs by at most (k + 1) 2^-24 sum |x w|; the epilogue adds a few
    // fp32 roundings (1e-6 relative: SiLU's polynomial and division), bf16 out half a bf16 ulp.
    bool matches(const std::vector<float>& got, std::int64_t row0, std::int64_t m) const {
        const double gamma = (k + 1) * std::ldexp(1.0, -24);
        const double out_ulp = bf16 ? std::ldexp(1.0, -8) : 0.0;
        const std::int64_t cols = out_cols();
        for (std::int64_t i = row0; i < row0 + m; ++i) {
            for (std::int64_t o = 0; o < cols; ++o) {
                double want, tol;
                if (gated_width) {
                    double sg, su;
                    const std::int64_t col = (o / 16) * 32 + o % 16;
                    const double g = dot(i, col, sg), u = dot(i, col + 16, su);
                    const double silu = g / (1 + std::exp(-g));
                    want = silu * u;
                    tol = 1.1 * gamma * sg * std::fabs(u) + std::fabs(silu) * gamma * su;
                } else {
                    double size;
                    want = dot(i, o, size);
                    tol = gamma * size;
                    if (extras) {
                        want += double(bias[o]) + double(start[i * cols + o]);
                        tol += 1e-6 * (std::fabs(double(bias[o])) + std::fabs(double(start[i * cols + o])));
                    }
                }
                tol += (1e-6 + out_ulp) * std::fabs(want) + 1e-30;
                const double err = std::fabs(double(got[(i - row0) * cols + o]) - want);
                if (!(err <= tol)) {
                    std::fprintf(stderr, "  type %d row %lld col %lld: got %.9g want %.9g tol %.3g\n",
                                 type, static_cast<long long>(i), static_cast<long long>(o),
                                 double(got[(i - row0) * cols + o]), want, tol);
                    return false;
                }
            }
        }
        return true;
    }
};

// The float-activation paths a test runs: the portable loops (forced: the path of every level
// below avx2 and of every aarch64 level, whose std::fma is a software routine on x86 CPUs without
// FMA, slow under qemu: the tests give it fewer shapes), then each x86 level from avx2 up that this
// CPU runs (all on the AVX2 path).
template <typename F>
void each_float_level(F f) {
    const CpuIsa best = cpu_isa_supported();
    f("forced portable", true);
    for (CpuIsa level : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16, CpuIsa::kAmx}) {
        if (!cpu_isa_covers(best, level) || set_cpu_isa(level) != level) continue;
        f(cpu_isa_name(level), false);
    }
    set_cpu_isa(best);
}

}  // namespace

TEST(quant_q8_0_and_q4_1_match_the_int8_oracle_on_both_paths) {
    std::mt19937 rng(3);
    for (int type : {kGgmlQ8_0, kGgmlQ4_1}) {
        for (bool portable : {false, true}) {
            CHECK(matches_oracle(type, 1, 33, 96, rng, portable));
            CHECK(matches_oracle(type, 9, 70, 64, rng, portable));
            CHECK(matches_oracle(type, 3, 32, 32, rng, portable));
        }
    }
}

// Every vector path this CPU runs (AVX2, AVX-VNNI, AVX512-VNNI with or without hardware bf16
// rounding; NEON, NEON with SDOT, with USMMLA) equals the portable one. Each level must run its own
// path: a vector level that fell back to the portable loops would pass the comparison.
TEST(quant_every_isa_path_equals_portable_for_every_type) {
    const CpuIsa best = cpu_isa_supported();
    int vector_levels = 0;
    for (CpuIsa level : {CpuIsa::kAvx2, CpuIsa::kAvx2Vnni, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16,
                         CpuIsa::kNeon, CpuIsa::kNeonDotprod, CpuIsa::kNeonI8mm}) {
        if (!cpu_isa_covers(best, level)) continue;
        if (set_cpu_isa(level) != level) continue;  // avx2_vnni without AVX-VNNI: avx2 again
        ++vector_levels;
        std::fprintf(stderr, "  %s: %s path\n", cpu_isa_name(level), quant_linear_path());
        CHECK(std::strcmp(quant_linear_path(), "portable") != 0);
        if (level == CpuIsa::kNeon) CHECK(std::strcmp(quant_linear_path(), "neon") == 0);
        if (level == CpuIsa::kNeonDotprod)
            CHECK(std::strcmp(quant_linear_path(), "neon-dotprod") == 0);
        if (level == CpuIsa::kNeonI8mm) CHECK(std::strcmp(quant_linear_path(), "neon-i8mm") == 0);
        std::mt19937 rng(5);
        for (int type : kTypes) {
            const std::int64_t k = quant_block_features(type) == 256 ? 256 : 96;
            for (std::int64_t m : {1, 2, 3, 4, 5, 8, 11}) {
                for (std::int64_t n : {1, 31, 33})
                    CHECK(paths_agree(type, m, n, k, (m + n) % 2, 0, rng));
            }
            CHECK(paths_agree(type, 7, 64, k, false, 20, rng));  // gated: 2 x 20 columns padded
            CHECK(paths_agree(type, 300, 40, k, true, 0, rng));  // past a 256-row chunk, threaded
        }
        CHECK(extremes_agree());
        CHECK(bf16_rounding_edges_agree());
        std::mt19937 rng16(7);
        for (int type : kTypes) {
            const std::int64_t k = quant_block_features(type) == 256 ? 256 : 64;
            for (bool out_float32 : {false, true}) {
                CHECK(bf16_paths_agree(type, 5, 37, k, out_float32, 0, rng16));
                CHECK(bf16_paths_agree(type, 3, 64, k, out_float32, 27, rng16));  // gated
            }
        }
    }
    set_cpu_isa(best);
    if (vector_levels == 0) std::fprintf(stderr, "  (no vector level on this CPU: only the portable path)\n");
#if defined(__aarch64__)
    CHECK(vector_levels > 0);  // neon on every aarch64 CPU
#endif
}

// The int16 rows on every vector path this CPU runs, as the portable loops give them (the
// Python tests hold the same at every level; here under the sanitizers too).
TEST(quant_int16_activations_every_isa_path_equals_portable) {
    const CpuIsa best = cpu_isa_supported();
    for (CpuIsa level : {CpuIsa::kAvx2, CpuIsa::kAvx2Vnni, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16,
                         CpuIsa::kNeon, CpuIsa::kNeonDotprod, CpuIsa::kNeonI8mm}) {
        if (!cpu_isa_covers(best, level) || set_cpu_isa(level) != level) continue;
        std::fprintf(stderr, "  %s: %s int16 path\n", cpu_isa_name(level), quant_linear_int16_path());
        CHECK(std::strcmp(quant_linear_int16_path(), "portable") != 0);  // a vector path to compare
        std::mt19937 rng(11);
        for (int type : kTypes) {  // few shapes: this test runs under qemu's TCG too
            const std::int64_t k = quant_block_features(type) == 256 ? 256 : 96;
            for (std::int64_t m : {1, 2, 3, 5}) CHECK(int16_paths_agree(type, m, 33, k, 0, rng));
            CHECK(int16_paths_agree(type, 7, 64, k, 20, rng));  // gated: 2 x 20 columns padded
        }
        CHECK(int16_paths_agree(kGgmlQ8_0, 260, 17, 64, 0, rng));  // past a 256-row chunk, threaded
        for (int fill : {0x7F, 0x80})  // Q8_0 values +127 (u = 255) and -128 (u = 0)
            for (std::int64_t gated : {0, 32}) CHECK(int16_paths_agree(kGgmlQ8_0, 5, 64, 64, gated, rng, fill));
        CHECK(int16_paths_agree(kGgmlQ4_1, 5, 64, 64, 0, rng, 0xFF));  // every nibble 15
    }
    set_cpu_isa(best);
}

// Q4_0 / Q4_1 / Q8_0 keep the file's fp16 scales (exact), the K-quants fp32 (d x sub-scale):
// bytes per 32 columns x 32 features.
TEST(quant_packed_sizes) {
    CHECK(packed_quant_bytes(kGgmlQ4_1, 32, 32) == 512 + 2 * 32 * 2);
    CHECK(packed_quant_bytes(kGgmlQ4_0, 32, 32) == 512 + 2 * 32 * 2);
    CHECK(packed_quant_bytes(kGgmlQ8_0, 32, 32) == 1024 + 2 * 32 * 2);
    CHECK(packed_quant_bytes(kGgmlQ4_K, 32, 256) == 8 * (512 + 2 * 32 * 4));
    CHECK(packed_quant_bytes(kGgmlQ6_K, 32, 256) == 8 * (1024 + 2 * 2 * 32 * 4));
}

TEST(quant_bf16_activations_and_output) {
    std::mt19937 rng(9);
    std::vector<double> w;
    const std::int64_t m = 3, n = 40, k = 64;
    const auto rows = make_rows(kGgmlQ8_0, n, k, rng, w);
    const auto packed = pack(kGgmlQ8_0, rows, n, k);
    std::vector<std::uint16_t> x(m * k, 0x3f80), out(m * n);  // x = 1.0 everywhere
    QuantLinearArgs a;
    a.ggml_type = kGgmlQ8_0, a.x = x.data(), a.x_stride = k, a.packed = packed.data();
    a.out = out.data(), a.out_stride = n, a.m = m, a.n = n, a.k = k;
    quant_linear(a, 1);
    for (std::int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (std::int64_t t = 0; t < k; ++t) want += w[j * k + t];
        const std::uint32_t bits = static_cast<std::uint32_t>(out[2 * n + j]) << 16;
        float got;
        std::memcpy(&got, &bits, sizeof(got));
        CHECK(std::fabs(got - want) <= 1e-2 * (1 + std::fabs(want)));
    }
}

TEST(quant_refuses_bad_arguments) {
    std::mt19937 rng(1);
    std::vector<double> w;
    const auto rows = make_rows(kGgmlQ4_1, 4, 64, rng, w);
    const auto packed = pack(kGgmlQ4_1, rows, 4, 64);
    std::vector<float> x(2 * 64), out(2 * 4);
    QuantLinearArgs a = args_for(kGgmlQ4_1, x, packed, out, 2, 4, 64);
    quant_linear(a, 1);  // valid
    QuantLinearArgs bad = a;
    bad.k = 48;
    CHECK_THROWS(std::invalid_argument, quant_linear(bad, 1));
    bad = a, bad.ggml_type = 6;  // Q5_0: no kernel
    CHECK_THROWS(std::invalid_argument, quant_linear(bad, 1));
    bad = a, bad.out_stride = 3;
    CHECK_THROWS(std::invalid_argument, quant_linear(bad, 1));
    std::int64_t table[4] = {0, 0, 0, 0};
    std::vector<std::uint8_t> dst(packed_quant_bytes(kGgmlQ4_K, 4, 256));
    CHECK_THROWS(std::invalid_argument, pack_quant_weight(kGgmlQ4_K, table, 4, 96, dst.data(), 1));
    // Q8_0's packed min is -128 d in fp16: a d of 1024 has none (-131072 > 65504).
    std::vector<std::uint8_t> q8(quant_row_bytes(kGgmlQ8_0, 32), 1);
    put_half(q8.data(), 0x6400);  // 1024
    const std::int64_t q8_row[1] = {static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(q8.data()))};
    std::vector<std::uint8_t> q8_dst(packed_quant_bytes(kGgmlQ8_0, 1, 32));
    CHECK_THROWS(std::invalid_argument, pack_quant_weight(kGgmlQ8_0, q8_row, 1, 32, q8_dst.data(), 1));
    QuantLinearArgs empty = a;
    empty.m = 0, empty.x = nullptr, empty.out = nullptr;
    quant_linear(empty, 1);
}

TEST(quant_amx_tiles_equal_vnni_for_every_type) {
    if (std::strcmp(quant_linear_path(), "portable") == 0) return;  // the tiles fold as VNNI does
    const auto each = [&](const char* tiles) {
        std::mt19937 rng(23);
        const std::int64_t before = linear_amx_items();
        for (int type : kTypes) {
            const std::int64_t k = quant_block_features(type) == 256 ? 256 : 96;
            for (std::int64_t m : {1, 15, 17, 32, 50}) {
                for (std::int64_t n : {31, 64}) {
                    const bool ok = tiles_agree(type, m, n, k, (m + n) % 2, 0, rng);
                    if (!ok) std::fprintf(stderr, "  %s tiles: type %d m %lld n %lld\n", tiles, type,
                                          static_cast<long long>(m), static_cast<long long>(n));
                    CHECK(ok);
                }
            }
            CHECK(tiles_agree(type, 37, 64, k, false, 20, rng));  // gated
            CHECK(tiles_agree(type, 300, 40, k, true, 0, rng));  // past a 256-row chunk
        }
        CHECK(linear_amx_items() > before);  // the tiles ran
    };
    // The tiles run inside the AVX512-VNNI kernel's avx512_bf16 copy (its epilogue rounds by
    // vcvtneps2bf16): not on an AVX2-only CPU, where linear_bf16_supported() is true too.
    if (!(cpu_isa_at_least(CpuIsa::kAvx512Bf16) && cpu_features().avx512_vnni)) {
        std::fprintf(stderr, "  (no AVX512-BF16 + VNNI at this level: AMX-INT8 tiles skipped)\n");
        return;
    }
    linear_amx_emulation(true);
    CHECK(quant_linear_amx_supported());
    each("emulated");
    linear_amx_emulation(false);
    if (!quant_linear_amx_supported()) {
        std::fprintf(stderr, "  (no AMX-INT8 on this CPU, or not granted: hardware tiles skipped)\n");
        return;
    }
    each("hardware");
}

// float_activations, every type, at every level this CPU runs: fp32 and bf16 x, plain, bias +
// in-place residual, gated (2 x 20 and 2 x 40 columns padded), against the double reference of the
// dequantized weight; around tile edges and micro-tile heights, threaded and past a 256-row chunk.
TEST(quant_float_activations_match_the_double_reference_at_every_level) {
    each_float_level([&](const char* level, bool portable) {
        const char* path = portable ? "portable" : quant_linear_float_path();
        std::fprintf(stderr, "  %s: float-activation path %s\n", level, path);
        if (!portable) CHECK(std::strcmp(path, "avx2") == 0);
        std::mt19937 rng(41);
        for (int type : kTypes) {
            const std::int64_t k = quant_block_features(type) == 256 ? 256 : 96;
            for (std::int64_t m : {1, 2, 3, 4, 5, 9}) {
                if (portable && m % 2 == 0) continue;  // one row loop: fewer heights
                for (std::int64_t n : {1, 33, 70}) {
                    if (portable && n == 1) continue;
                    const bool bf16 = (m + n) % 2, extras = m % 2;
                    const FloatCase c(type, m, n, k, 0, bf16, extras, rng);
                    CHECK(c.matches(c.run(0, m, 2, portable), 0, m));
                }
            }
            for (bool bf16 : {false, true}) {
                const FloatCase gated(type, 7, 64, k, 20, bf16, false, rng);
                CHECK(gated.matches(gated.run(0, 7, 2, portable), 0, 7));
                const FloatCase wide(type, 3, 96, k, 40, bf16, false, rng);
                CHECK(wide.matches(wide.run(0, 3, 1, portable), 0, 3));
            }
            if (!portable && (type == kGgmlQ4_1 || type == kGgmlQ6_K)) {  // two row chunks
                const FloatCase big(type, 260, 40, k, 0, true, true, rng);
                CHECK(big.matches(big.run(0, 260, 2, portable), 0, 260));
            }
        }
    });
}

// Below avx2 and on aarch64 every level takes the portable loops.
TEST(quant_float_activation_path_follows_the_level) {
    const CpuIsa best = cpu_isa_supported();
    for (CpuIsa level : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx2Vnni, CpuIsa::kAvx512,
                         CpuIsa::kAvx512Bf16, CpuIsa::kAmx, CpuIsa::kNeon, CpuIsa::kNeonDotprod,
                         CpuIsa::kNeonI8mm}) {
        if (!cpu_isa_covers(best, level) || set_cpu_isa(level) != level) continue;
        const bool vector = cpu_isa_at_least(CpuIsa::kAvx2);
        CHECK(std::strcmp(quant_linear_float_path(), vector ? "avx2" : "portable") == 0);
    }
    set_cpu_isa(best);
}

// float_activations is batch-invariant at every level: a row's output (fp32 or bf16, plain, with
// bias and residual, gated) is bit-identical in calls of 1 .. 13 rows at any offset, on 1 or 2
// threads, and inside a 300-row call (two row chunks).
TEST(quant_float_activations_are_batch_invariant) {
    each_float_level([&](const char*, bool portable) {
        std::mt19937 rng(43);
        const std::int64_t rows = portable ? 5 : 13;  // the portable loops: one row at a time
        for (int type : kTypes) {
            const std::int64_t k = quant_block_features(type) == 256 ? 256 : 64;
            for (int kind = portable ? 1 : 0; kind < 3; ++kind) {  // fp32, bf16 + extras, gated
                const FloatCase c(type, rows, kind == 2 ? 64 : 70, k, kind == 2 ? 24 : 0, kind > 0,
                                  kind == 1, rng);
                const auto full = c.run(0, rows, 2, portable);
                const std::int64_t cols = c.out_cols();
                for (std::int64_t m = 1; m <= rows; ++m) {
                    for (std::int64_t row0 : {std::int64_t{0}, rows - m, (rows - m) / 2}) {
                        const auto part = c.run(row0, m, 1 + m % 2, portable);
                        CHECK(std::equal(part.begin(), part.end(), full.begin() + row0 * cols));
                    }
                }
            }
        }
        if (portable) return;
        const FloatCase big(kGgmlQ4_1, 300, 40, 64, 0, true, false, rng);  // two row chunks
        const auto full = big.run(0, 300, 2, portable);
        for (std::int64_t row0 : {0, 7, 255, 299}) {
            const auto one = big.run(row0, 1, 1, portable);
            CHECK(std::equal(one.begin(), one.end(), full.begin() + row0 * 40));
        }
    });
}

TEST(quant_float_activations_refuse_dequant_bf16) {
    std::mt19937 rng(1);
    std::vector<double> w;
    const auto packed = pack(kGgmlQ4_1, make_rows(kGgmlQ4_1, 4, 64, rng, w), 4, 64);
    std::vector<float> x(2 * 64), out(2 * 4);
    QuantLinearArgs a = args_for(kGgmlQ4_1, x, packed, out, 2, 4, 64);
    a.float_activations = true, a.dequant_bf16 = true;
    CHECK_THROWS(std::invalid_argument, quant_linear(a, 1));
}

int main() { return check::run_all_tests(); }
