// The quantized linear kernel at ISA level avx512 on CPUs with AVX512-VNNI (Cascade Lake, Ice
// Lake: no AVX512-BF16; kernels.hpp): avx512_vnni.hpp's kernel compiled for that level's features
// and VNNI only, bf16 outputs rounded by integer operations (the bits of avx512_bf16.cpp's
// vcvtneps2bf16). No AVX512-BF16 or AMX instruction may reach this file's object: a CPU at this
// level would fault on it.
#include "cpu/arch.hpp"

#if PAGEDSERVE_X86  // AVX-512 intrinsics: elsewhere quant_linear never takes this path
// Before the driver (driver.hpp): level avx512's features; the kernel's add AVX512-VNNI.
#define PAGEDSERVE_LINEAR_TARGET PAGEDSERVE_AVX512_TARGET
#define PAGEDSERVE_QUANT_TARGET \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,avx512vnni")))
#define PAGEDSERVE_QUANT_HW_BF16 0
#include "linear_quant/avx512_vnni.hpp"

namespace pagedserve::quant_detail {
namespace {

template <typename T>
void run_products(const QuantLinearArgs& a, const std::uint8_t* acts, std::int64_t row_bytes,
                  int num_threads) {
    with_kernel<T>(a, [&](auto kernel) {
        run_linear<decltype(kernel)>(typed<T>(a, acts, row_bytes), num_threads);
    });
}

}  // namespace

void quant_linear_avx512_vnni(const QuantLinearArgs& args, const std::uint8_t* acts,
                              std::int64_t act_row_bytes, int num_threads) {
    if (args.float32) return run_products<float>(args, acts, act_row_bytes, num_threads);
    run_products<std::uint16_t>(args, acts, act_row_bytes, num_threads);
}

}  // namespace pagedserve::quant_detail
#endif  // PAGEDSERVE_X86
