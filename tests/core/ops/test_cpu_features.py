"""PAGEDSERVE_MAX_CPU_ISA: a process (and its children) that sees the CPU as one of a lower
level, so any machine can run the suite or a server as an AVX2-only CPU would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pagedserve.core.ops.cpu_features import CPU_ISAS, runnable_isas

PROBE = """
import json
from pagedserve.core.ops.cpu_features import cpu_features, cpu_isa, cpu_isa_supported, runnable_isas, set_cpu_isa
from pagedserve.core.ops.linear_quant import quant_linear_path
print(json.dumps({"active": cpu_isa(), "supported": cpu_isa_supported(), "runnable": runnable_isas(),
                  "int8": quant_linear_path(), "forced_amx": set_cpu_isa("amx"),
                  "describe": cpu_features().describe()}))
"""


def probe(cap: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PAGEDSERVE_MAX_CPU_ISA": cap}
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)


@pytest.mark.parametrize("cap", ["portable", "avx2"])
def test_the_cap_is_the_level_everywhere(cap: str) -> None:
    if cap not in runnable_isas():
        pytest.skip(f"this CPU does not run {cap}")
    done = probe(cap)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["active"] == got["supported"] == got["forced_amx"] == cap
    assert got["runnable"] == list(CPU_ISAS[: CPU_ISAS.index(cap) + 1])
    assert got["int8"] == cap  # the int8 kernel's path names the level: portable, avx2
    assert f"isa {cap} (PAGEDSERVE_MAX_CPU_ISA={cap})" in got["describe"]


def test_an_unknown_cap_is_refused_by_name() -> None:
    done = probe("avx9000")
    assert done.returncode != 0
    assert "PAGEDSERVE_MAX_CPU_ISA must be one of" in done.stderr


def test_the_other_architectures_levels_are_refused_by_name() -> None:
    other = "neon" if "avx2" in CPU_ISAS else "avx2"  # x86-64 (or portable-only) vs aarch64
    done = probe(other)
    assert done.returncode != 0
    assert "a level of the other CPU architecture" in done.stderr
