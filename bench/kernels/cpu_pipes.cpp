// How many of the AVX2 int8 kernel's instructions this CPU retires a cycle (issue 24): the
// clock (a chain of dependent adds), then the throughput of each instruction the quantized
// kernel's inner loop and fold use, alone and in pairs: a pair that sums to the pipes of one
// shares them. Built and run by bench/kernels/cpu_pipes.py, which prints the table.
//
// Each loop keeps 12 (or 8 + 4) independent accumulators, so latency never limits it, and an
// empty asm per result keeps the compiler from folding the loop away.
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kLoops = 50'000'000;

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

// 8 dependent 1-cycle adds a loop: cycles per second.
double clock_hz() {
    std::uint64_t x = 0;
    const auto t = Clock::now();
    for (std::uint64_t i = 0; i < 4 * kLoops; ++i)
        asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
                     "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
                     : "+r"(x));
    return 8.0 * 4 * kLoops / seconds_since(t);
}

template <typename V>
__attribute__((always_inline)) inline void keep(V& v) {
    asm volatile("" : "+x"(v));
}

// Instructions per second of `kA` op A and `kB` op B per loop, all independent.
template <int kA, int kB, typename A, typename B>
double rate(A op_a, B op_b) {
    __m256i ia[kA ? kA : 1] = {};
    __m256 fb[kB ? kB : 1] = {};
    const auto t = Clock::now();
    for (std::uint64_t i = 0; i < kLoops; ++i) {
#pragma GCC unroll 16
        for (int k = 0; k < kA; ++k) {
            ia[k] = op_a(ia[k]);
            keep(ia[k]);
        }
#pragma GCC unroll 16
        for (int k = 0; k < kB; ++k) {
            fb[k] = op_b(fb[k]);
            keep(fb[k]);
        }
    }
    return static_cast<double>(kA + kB) * kLoops / seconds_since(t);
}

}  // namespace

int main() {
    const __m256i s8 = _mm256_set1_epi8(-5);
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m256 x = _mm256_set1_ps(1.0001f), y = _mm256_set1_ps(0.9999f);
    // Integer ops take their accumulator as an operand so that each depends only on itself.
    auto maddubs = [&](__m256i a) { return _mm256_maddubs_epi16(a, s8); };
    auto maddubs_add16 = [&](__m256i a) { return _mm256_add_epi16(a, _mm256_maddubs_epi16(a, s8)); };
    auto madd16 = [&](__m256i a) { return _mm256_madd_epi16(a, ones16); };
    auto add32 = [&](__m256i a) { return _mm256_add_epi32(a, ones16); };
    auto fma = [&](__m256 a) { return _mm256_fmadd_ps(x, y, a); };
    auto mul = [&](__m256 a) { return _mm256_mul_ps(a, y); };
    auto cvt = [&](__m256 a) {
        return _mm256_cvtepi32_ps(_mm256_castps_si256(a));
    };
    auto none_i = [](__m256i a) { return a; };
    auto none_f = [](__m256 a) { return a; };

    const double hz = clock_hz();
    std::printf("{\"clock_ghz\": %.3f", hz / 1e9);
    auto row = [&](const char* name, double per_s) { std::printf(", \"%s\": %.3f", name, per_s / hz); };
    row("vpmaddubsw", rate<12, 0>(maddubs, none_f));
    row("vpmaddubsw + vpaddw pairs", rate<12, 0>(maddubs_add16, none_f));
    row("vpmaddwd", rate<12, 0>(madd16, none_f));
    row("vpaddd", rate<12, 0>(add32, none_f));
    row("vfmadd", rate<0, 12>(none_i, fma));
    row("vmulps", rate<0, 12>(none_i, mul));
    row("vcvtdq2ps", rate<0, 12>(none_i, cvt));
    row("8 vpmaddubsw + 4 vfmadd", rate<8, 4>(maddubs, fma));
    row("8 vpmaddwd + 4 vfmadd", rate<8, 4>(madd16, fma));
    row("8 vpmaddwd + 4 vcvtdq2ps", rate<8, 4>(madd16, cvt));
    std::printf("}\n");
    return 0;
}
