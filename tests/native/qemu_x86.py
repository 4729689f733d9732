"""Runs a program on an emulated x86-64 CPU: qemu-user (`qemu-x86_64 -cpu MODEL`) answers CPUID
for that model and faults on any instruction it lacks (its TCG has no AVX-512 at all), so our
kernels, torch and everything else pick the paths they pick on such a CPU."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

QEMU = "qemu-x86_64"
TIMED_OUT = 124  # as timeout(1) says it
TCG_WARNING = f"{QEMU}: warning: TCG doesn't support requested feature"


def qemu_missing() -> str | None:
    """Why programs cannot run on emulated x86-64 CPUs here, or None."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"emulates x86-64 CPU models: not an x86-64 machine ({platform.machine()})"
    if shutil.which(QEMU) is None:
        return f"needs {QEMU} (apt-get install qemu-user)"
    return None


def runs_natively(level: str) -> str | None:
    """Why emulating a CPU of ISA `level` proves nothing here, or None: this CPU's own best level
    (uncapped: PAGEDSERVE_MAX_CPU_ISA lowers our kernels, not what the CPU executes) is not above
    it, so no instruction of a higher level can leak past the dispatch, and the native runs of
    the same tests (the sanitized C++ tests, the whole suite) already cover the level, several
    times faster than qemu's TCG, which on an AVX2 host emulates AVX2 slowly."""
    from pagedserve.core.config import X86_ISAS
    from pagedserve.core.ops.native import core

    best = str(core.cpu_isa_supported())
    if best in X86_ISAS and X86_ISAS.index(best) > X86_ISAS.index(level):
        return None
    return f"this CPU's best level is {best}: the native tests run level {level} here"


def python_executable() -> str:
    """This interpreter for qemu to run: sys.executable as it is, not its realpath, so that a
    virtualenv's python (a symlink to the base interpreter, or a copy) still finds its
    pyvenv.cfg and the venv's packages. qemu-user follows the symlink to the ELF itself."""
    with open(os.path.realpath(sys.executable), "rb") as binary:
        assert binary.read(4) == b"\x7fELF", f"{sys.executable} is not an ELF program"
    return sys.executable


class Run(NamedTuple):
    rc: int
    output: str  # stdout + stderr, without qemu's notes on features its TCG lacks
    seconds: float

    @property
    def status(self) -> str:
        if self.rc < 0:  # qemu re-raises the guest's fatal signal: SIGILL, an instruction it lacks
            return f"was killed by {signal.Signals(-self.rc).name}"
        return "timed out" if self.rc == TIMED_OUT else f"exited {self.rc}"


def under_qemu(
    cpu: str, argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> Run:
    """argv[0] (an ELF: resolve launcher scripts and symlinks first) run on CPU model `cpu`."""
    start = time.monotonic()
    try:
        done = subprocess.run(
            [QEMU, "-cpu", cpu, *argv], cwd=cwd, env=env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        rc, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = TIMED_OUT, f"timed out after {e.timeout} s\n{e.stdout!r}\n{e.stderr!r}"
    kept = [line for line in out.splitlines(keepends=True) if not line.startswith(TCG_WARNING)]
    return Run(rc, "".join(kept), time.monotonic() - start)
