#!/usr/bin/env bash
# One GPU check, for a lent NVIDIA machine with the repo copied and $OUT set: build pagedserve
# with its CUDA kernels (editable, against the CUDA torch already installed there; nothing is
# downloaded), run the CUDA tests, then the kernel benchmark (incl. decode bandwidth for
# 64 requests x 4k context vs the device peak), and TP=2 over NCCL when there are two GPUs.
# Everything lands under $OUT; the steps' time limits add up to under 10 minutes (90 s more
# for the TP step, which runs only with two GPUs).
#     OUT=/some/folder bench/gpu_check.sh [cuda arch, default 90]
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to an output folder}"
mkdir -p "$OUT"
arch="${1:-90}"
export PYTHONUNBUFFERED=1
status=0

step() {  # step NAME SECONDS CMD...: runs CMD with a time limit, logs to $OUT/NAME.log
    local name="$1" limit="$2"
    shift 2
    echo "== $name: $*"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc"
    tail -n 25 "$OUT/$name.log"
    [[ $rc -eq 0 ]] || status=1
    return $rc
}

{ nvidia-smi; python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())'; } \
    >"$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

step build 270 python3 -m pip install --no-build-isolation --no-deps -q \
    -Cbuild-dir=build/gpu -Ccmake.define.PAGEDSERVE_CUDA=ON \
    -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" -e . || exit 1

# --noconftest: the suite's conftest imports modules whose dependencies the GPU image may lack;
# the attention tests need none of it.
step pytest_cuda 150 python3 -m pytest -q -m cuda --noconftest -p no:cacheprovider \
    --junitxml="$OUT/pytest_cuda.xml" tests/core/attention

step bench_kernels 150 python3 -m bench.kernels.attention_kernels --device cuda --repeats 20 \
    --dtypes float32,bfloat16,float16
grep -v '^ ' "$OUT/bench_kernels.log" | grep '^{' >"$OUT/kernels_cuda.jsonl" || true

# Tensor parallel over NCCL (issue 14): TP=1 vs TP=2 on a random Llama, fp32, one GPU per rank,
# with the greedy tokens of both compared; it needs two GPUs.
num_gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [[ "$num_gpus" -ge 2 ]]; then
    step tp_nccl 90 python3 -m bench.engine.tp --device cuda --dtype float32 --repeats 1
else
    echo "== tp_nccl: skipped: $num_gpus GPU(s) here, TP=2 over NCCL needs 2" | tee "$OUT/tp_nccl.log"
fi
exit $status
