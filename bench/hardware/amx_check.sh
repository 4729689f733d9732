#!/usr/bin/env bash
# The AMX check, for a session whose CPU has AMX-BF16 (issue 12): everything the tiles need
# measured or tested on hardware, in one run, logs under $OUT (default bench/amx-<date>).
#   1. the C++ linear tests under ASan/UBSan with the hardware tiles (not skipped here): the
#      AMX-BF16 path against the double reference, batch invariance, and the line saying how
#      many outputs the tiles give bit for bit as the SDM's pseudo-code (the emulation) and as
#      the AVX512-BF16 path; AMX-INT8 equal to VNNI bit for bit for every quantized type;
#   2. the Python tests of the tiles and the dispatch (op, engine, choice) and batch invariance;
#   3. bench/kernels/linear.py: torch vs native vs native on tiles per layer at 1-1,024 rows, and the
#      calibration --cpu-linear auto makes; the quantized kernels on VNNI vs AMX-INT8 tiles;
#   4. bench/hardware/cpu_linear.py: native / torch / auto / amx / auto-det through LLM.generate.
# Run it from the environment `./scripts/install.sh test` made (the editable build), on a
# quiet machine: the figures go into bench/RESULTS.md with the CPU model the logs print.
#     bench/hardware/amx_check.sh [--quick]      (--quick: fewer repeats, ~5 minutes instead of ~20)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-bench/amx-$(date +%Y%m%d-%H%M)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
repeats=20 engine_repeats=3
[[ "${1:-}" == "--quick" ]] && repeats=5 engine_repeats=1
status=0

step() {  # step NAME CMD...: runs CMD, logs to $OUT/NAME.log, shows its tail
    local name="$1"
    shift
    echo "== $name: $*"
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc"
    tail -n 30 "$OUT/$name.log"
    [[ $rc -eq 0 ]] || status=1
}

{ grep -m1 "model name" /proc/cpuinfo; grep -m1 -o "amx_bf16" /proc/cpuinfo || echo "no amx_bf16"; } \
    | tee "$OUT/cpu.txt"
grep -q amx_bf16 /proc/cpuinfo || echo "this CPU has no AMX-BF16: the hardware steps test nothing new"

build="$OUT/build-asan"
step cpp_tests bash -c "cmake -S . -B '$build' -DCMAKE_BUILD_TYPE=Debug -DPAGEDSERVE_BUILD_TESTS=ON \
    -DPAGEDSERVE_SANITIZE=ON -DPAGEDSERVE_BUILD_PYTHON=OFF -DPAGEDSERVE_CUDA=OFF \
    -DPAGEDSERVE_NATIVE_ARCH=ON >/dev/null && cmake --build '$build' -j \
    --target test_linear test_linear_quant >/dev/null && '$build/test_linear' \
    && '$build/test_linear_quant'"
rm -rf "$build"
step python_tests python -m pytest -q tests/core/models/test_linear_amx.py \
    tests/core/models/test_linear_dispatch.py tests/core/models/test_quantized.py \
    tests/core/test_batch_invariance.py
step linear python -m bench.kernels.linear --repeats "$repeats" --rows 1,16,64,256,1024
step linear_quantized python -m bench.kernels.linear --quantized Q4_1,Q8_0,Q4_K,Q6_K \
    --repeats "$repeats" --rows 1,16,64,256,1024
step cpu_linear python -m bench.hardware.cpu_linear --repeats "$engine_repeats"
echo "logs in $OUT; exit $status"
exit $status
