"""The CPU's matrix features as read at run time by pagedserve._core (cpp/src/cpu_features.cpp):
CPUID bits, the OS's saved register state and, on Linux, whether the kernel granted this
process AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM).

    features = cpu_features()          # read once
    features.describe()                # "avx512_bf16 avx512_vnni, no amx" (the start-up line)
    cpu_model()                        # "AMD EPYC ..." from /proc/cpuinfo, "" elsewhere
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

from pagedserve.core.ops.native import core


@dataclass(frozen=True)
class CpuFeatures:
    avx512f: bool
    avx512_bf16: bool
    """AVX-512 bf16 dot products (the native packed linear kernel)."""
    avx512_vnni: bool
    """AVX-512 int8 dot products (the kept-quantized GGUF kernels)."""
    amx_bf16: bool
    amx_tile: bool
    amx_int8: bool
    amx_os_enabled: bool
    """The OS saves the tile registers (XCR0 bits 17 and 18)."""
    amx_permitted: bool
    """Linux granted this process AMX tile data: AMX code may run."""

    @property
    def amx_usable(self) -> bool:
        """AMX-BF16 tiles may run in this process (torch's oneDNN uses them for bf16 matmuls)."""
        return self.amx_bf16 and self.amx_permitted

    def describe(self) -> str:
        names = [
            n for n in ("avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8") if getattr(self, n)
        ]
        if not self.amx_tile:
            names.append("no amx")
        elif not self.amx_permitted:
            names.append("amx not granted by the kernel")
        return ", ".join(names) if names else "no avx512_bf16, no amx"


@cache
def cpu_features() -> CpuFeatures:
    flags = core.cpu_features()
    return CpuFeatures(**{f.name: bool(flags[f.name]) for f in fields(CpuFeatures)})


@cache
def cpu_model() -> str:
    """The first "model name" of /proc/cpuinfo ("" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
