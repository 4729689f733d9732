"""The CPU's vector and matrix features as read at run time by pagedserve._core
(cpp/src/cpu_features.cpp): CPUID bits, the OS's saved register state and, on Linux, whether the
kernel granted this process AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM); and the ISA level
the native kernels run at.

    features = cpu_features()          # read once
    features.describe()                # "isa avx512: avx2, avx512_vnni, ..." (start-up line)
    cpu_model()                        # "AMD EPYC ..." from /proc/cpuinfo, "" elsewhere
    cpu_isa(), cpu_isa_supported()     # "avx512": the level now, the best this CPU runs
    set_cpu_isa("avx2")                # lower it (--cpu-isa, tests): capped, process-wide
    runnable_isas()                    # every level this CPU can run, lowest first

PAGEDSERVE_MAX_CPU_ISA=avx2 (environment) caps the level for the whole process and its children:
the CPU then looks like one of that level to everything here (the kernels, --cpu-isa auto,
--dtype auto, the tests' levels), so `PAGEDSERVE_MAX_CPU_ISA=avx2 pytest` runs the suite as an
AVX2-only CPU would, servers included; torch's own kernels still take the real CPU's paths.

Levels (CPU_ISAS: this machine's architecture's ladder), each the one before plus. x86-64
(config.X86_ISAS): avx2 = AVX2 + FMA + F16C; avx2_vnni = AVX-VNNI for the int8 kernel (an extension more
than a level: AVX-512 CPUs may lack it, so from this level up it is used where the CPU has it,
and on a CPU without it the level is avx2); avx512 = AVX-512 F/BW/VL/DQ (the int8 kernels also
want VNNI); avx512_bf16 = AVX512-BF16; amx = AMX-BF16 and AMX-INT8 tiles granted by Linux.
aarch64 (config.ARM_ISAS): neon = Advanced SIMD (every aarch64 CPU); neon_dotprod = the SDOT / UDOT
dot products (Linux hwcap ASIMDDP); neon_i8mm = the int8 matrix multiplies (hwcap2 I8MM, for the
int8 kernel). The ladders share only portable: the other architecture's
levels are refused by name, and no aarch64 level is "at least" an x86 one. Each kernel family
runs its best path at or below the level.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

from pagedserve.core import config
from pagedserve.core.config import ARM_ISAS, X86_ISAS
from pagedserve.core.ops.native import core

CPU_ISAS = ARM_ISAS if str(core.cpu_isa_supported()) in ARM_ISAS[1:] else X86_ISAS
"""This machine's ISA levels, lowest first (cpu_features.hpp's CpuIsa: aarch64's where the
native library reports one, x86-64's elsewhere, where a CPU without AVX2 runs portable only)."""
MAX_CPU_ISA_ENV = "PAGEDSERVE_MAX_CPU_ISA"


def _check_level(name: str, level: str) -> None:
    if level not in CPU_ISAS:
        other = " (a level of the other CPU architecture)" if level in config.CPU_ISAS else ""
        raise ValueError(f"{name} must be one of {CPU_ISAS}, got {level!r}{other}")


@dataclass(frozen=True)
class CpuFeatures:
    avx2: bool
    fma: bool
    f16c: bool
    avx_vnni: bool
    avx512f: bool
    avx512bw: bool
    avx512vl: bool
    avx512dq: bool
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
    neon: bool
    """aarch64 Advanced SIMD (Linux hwcap ASIMD)."""
    neon_dotprod: bool
    """aarch64 SDOT / UDOT (hwcap ASIMDDP: the int8 kernel's neon_dotprod path)."""
    i8mm: bool
    """aarch64 int8 matrix multiplies (hwcap2 I8MM: the int8 kernel's neon_i8mm path)."""

    @property
    def amx_usable(self) -> bool:
        """AMX-BF16 tiles may run in this process (torch's oneDNN uses them for bf16 matmuls)."""
        return self.amx_bf16 and self.amx_permitted

    def describe(self) -> str:
        """The start-up line's CPU part, e.g. "isa avx512: avx2, avx512_vnni, no avx512_bf16,
        no amx" (with "(cpu up to ...)" where --cpu-isa lowered the level)."""
        level, best = cpu_isa(), cpu_isa_supported()
        head = f"isa {level}" + ("" if level == best else f" (cpu up to {best})")
        if max_cpu_isa():
            head += f" ({MAX_CPU_ISA_ENV}={max_cpu_isa()})"
        if self.neon:  # aarch64
            names = ["neon", *(n for n in ("neon_dotprod", "i8mm") if getattr(self, n))]
            if not self.neon_dotprod:
                names.append("no neon_dotprod")
            return f"{head}: {', '.join(names)}"
        names = [
            n
            for n in ("avx2", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")
            if getattr(self, n)
        ]
        if self.avx512f and not self.avx512_bf16:
            names.append("no avx512_bf16")
        if not self.amx_tile:
            names.append("no amx")
        elif not self.amx_permitted:
            names.append("amx not granted by the kernel")
        return f"{head}: {', '.join(names)}"


@cache
def cpu_features() -> CpuFeatures:
    flags = core.cpu_features()
    return CpuFeatures(**{f.name: bool(flags[f.name]) for f in fields(CpuFeatures)})


def cpu_isa() -> str:
    """The level the native kernels run at now (CPU_ISAS)."""
    return str(core.cpu_isa())


@cache
def max_cpu_isa() -> str:
    """PAGEDSERVE_MAX_CPU_ISA's level ("" when unset)."""
    cap = os.environ.get(MAX_CPU_ISA_ENV, "")
    if cap:
        _check_level(MAX_CPU_ISA_ENV, cap)
    return cap


def _capped(level: str) -> str:
    cap = max_cpu_isa()
    return cap if cap and CPU_ISAS.index(cap) < CPU_ISAS.index(level) else level


def cpu_isa_supported() -> str:
    """The best level this CPU and OS run (at most PAGEDSERVE_MAX_CPU_ISA's)."""
    best = str(core.cpu_isa_supported())
    level = _capped(best)
    if level == "avx2_vnni" and not cpu_features().avx_vnni:
        return "avx2"  # as set_cpu_isa gives there
    return level


def set_cpu_isa(level: str) -> str:
    """Runs the native kernels at `level` or, where the CPU lacks it (or PAGEDSERVE_MAX_CPU_ISA
    caps it), at the best it has; returns the level now active. Process-wide: every kernel
    called after it."""
    _check_level("cpu_isa", level)
    return str(core.set_cpu_isa(_capped(level)))


def isa_at_least(level: str) -> bool:
    """The active level is `level` or above (never for the other architecture's levels)."""
    if level not in CPU_ISAS:  # the other architecture's level (an unknown name is refused)
        if level not in config.CPU_ISAS:
            _check_level("level", level)
        return False
    return CPU_ISAS.index(cpu_isa()) >= CPU_ISAS.index(level)


def runnable_isas() -> tuple[str, ...]:
    """Every level this CPU can run, lowest first (avx2_vnni only where the CPU has AVX-VNNI:
    elsewhere it is avx2)."""
    levels = CPU_ISAS[: CPU_ISAS.index(cpu_isa_supported()) + 1]
    return tuple(lv for lv in levels if lv != "avx2_vnni" or cpu_features().avx_vnni)


@contextmanager
def forced_cpu_isa(level: str) -> Iterator[str]:
    """The kernels at `level` (capped) inside the block, the level before it after."""
    before = cpu_isa()
    try:
        yield set_cpu_isa(level)
    finally:
        set_cpu_isa(before)


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


if max_cpu_isa():  # the kernels called before any set_cpu_isa run at the cap too
    set_cpu_isa(cpu_isa_supported())
