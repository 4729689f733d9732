"""The families' transformers oracle on an emulated AVX2-only CPU (issue 24).

On an AMD Zen 3 (AVX2 + FMA + F16C, no AVX-512) qwen3, gemma3_text and mistral with a window
were once seen to give other greedy tokens than transformers in float32. Forcing a lower level on
this machine (`forced_cpu_isa`, PAGEDSERVE_MAX_CPU_ISA) lowers only our kernels: torch, which
computes transformers' side and our fp32 linears, still takes the real CPU's AVX-512 paths (ATen's
capability, MKL, oneDNN read CPUID themselves). So the oracle runs here under qemu-user's model of
that CPU (`qemu-x86_64 -cpu EPYC-Milan`), where CPUID says what a Zen 3 says and every library
picks the path it picks there: our kernels at level avx2, torch at AVX2. qemu's floating point is
IEEE to the bit (its FMA is a single rounding), so the tokens are the ones a Zen 3 gives.

The logits per step (atol 1e-4) and the engine's greedy tokens (chunked prefill, a mixed batch, a
prefix-cache hit, prompts past the window) of those three families, on test_families.py's weights
and on one more draw each (about 90 s: qemu runs torch and transformers some 20x slower, their
import alone takes ~45 s; 70 more draws of the three agreed when this was written, bench/RESULTS.md).
Skips, saying why, off x86-64 or without qemu-x86_64 (scripts/install.sh test installs qemu-user
as root on Debian).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.native.qemu_x86 import (
    QEMU,
    python_executable,
    qemu_missing,
    runs_natively,
    under_qemu,
)  # fmt: skip

ROOT = Path(__file__).resolve().parents[3]
CPU_MODEL = "EPYC-Milan"  # AMD Zen 3: AVX2, FMA, F16C; no AVX-512, no AVX-VNNI
FAMILIES = "tests/core/models/test_families.py"
CASES = ["gemma3", "qwen3-window", "mistral-window"]  # about 5 s each under qemu
TESTS = (
    [f"{FAMILIES}::test_logits_match_transformers[{case}]" for case in CASES]
    + [f"{FAMILIES}::test_engine_greedy_matches_transformers[{case}]" for case in CASES]
    + [
        f"{FAMILIES}::test_engine_greedy_matches_transformers_other_weights[{case}-seed21]"
        for case in CASES
    ]
)
# Run inside the emulated CPU: say which paths this CPU model makes our kernels and torch take,
# then the oracle tests.
RUNNER = """
import sys, pytest, torch
from pagedserve.core.ops.cpu_features import cpu_isa_supported
print(f"emulated: cpu isa {cpu_isa_supported()}, torch {torch.backends.cpu.get_cpu_capability()}")
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
"""


def _skip() -> str | None:
    return qemu_missing() or runs_natively("avx2")  # on an AVX2-only host test_families.py is it


@pytest.mark.skipif(_skip() is not None, reason=_skip() or "")
def test_families_match_transformers_on_emulated_zen3() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PAGEDSERVE_MAX_CPU_ISA"}  # the CPU's level
    run = under_qemu(CPU_MODEL, [python_executable(), "-c", RUNNER, *TESTS], ROOT, env, timeout=540)
    assert run.rc == 0, f"under {QEMU} -cpu {CPU_MODEL} {run.status}:\n{run.output}"
    # The paths a Zen 3 takes, or the run proved nothing about that CPU.
    assert "emulated: cpu isa avx2, torch AVX2" in run.output, run.output
    assert f"{3 * len(CASES)} passed" in run.output, run.output
