"""The families' transformers oracle with torch on its AVX2 paths (issue 24, issue 42).

On an AMD Zen 3 (AVX2 + FMA + F16C, no AVX-512) qwen3, gemma3_text and mistral with a window
were once seen to give other greedy tokens than transformers in float32 (issue 42 found that was
the checker's doing, not pagedserve's). Forcing a lower level on a larger CPU (`forced_cpu_isa`,
PAGEDSERVE_MAX_CPU_ISA) lowers only our kernels: torch, which computes transformers' side and
our fp32 layer ops, keeps its own AVX-512 paths. So this runs test_families.py's oracle for those
three families in a child process with torch capped too: ATen's kernels by
ATEN_CPU_CAPABILITY=avx2, oneDNN by ONEDNN_MAX_CPU_ISA=AVX2, MKL by MKL_ENABLE_INSTRUCTIONS=AVX2,
our kernels by PAGEDSERVE_MAX_CPU_ISA=avx2: the paths a Zen 3 takes, bar MKL's vendor-specific
dispatch and glibc's libm variants, which read CPUID themselves. (It ran under qemu-user's
EPYC-Milan before; on an AMX Xeon TCG made that over 540 s, and a native run proves the same
arithmetic in seconds.) On an AVX2-only host test_families.py is this run already: it skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.native.qemu_x86 import runs_natively

ROOT = Path(__file__).resolve().parents[3]
FAMILIES = "tests/core/models/test_families.py"
CASES = ["gemma3", "qwen3-window", "mistral-window"]
TESTS = (
    [f"{FAMILIES}::test_logits_match_transformers[{case}]" for case in CASES]
    + [f"{FAMILIES}::test_engine_greedy_matches_transformers[{case}]" for case in CASES]
    + [
        f"{FAMILIES}::test_engine_greedy_matches_transformers_other_weights[{case}-seed21]"
        for case in CASES
    ]
)
AVX2 = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "PAGEDSERVE_MAX_CPU_ISA": "avx2",
}
# Say which paths the child's torch and kernels take, then run the oracle tests.
RUNNER = """
import sys, pytest, torch
from pagedserve.core.ops.cpu_features import cpu_isa
print(f"capped: cpu isa {cpu_isa()}, torch {torch.backends.cpu.get_cpu_capability()}")
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
"""


@pytest.mark.skipif(
    runs_natively("avx2") is not None or sys.platform != "linux",
    reason=str(runs_natively("avx2")),
)
def test_families_match_transformers_with_torch_at_avx2() -> None:
    env = {**os.environ, **AVX2}
    run = subprocess.run(
        [sys.executable, "-c", RUNNER, *TESTS], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    # The paths a Zen 3 takes, or the run proved nothing about that CPU.
    assert "capped: cpu isa avx2, torch AVX2" in output, output
    assert f"{len(TESTS)} passed" in output, output
