"""Long jobs that tests wait for, run in the background from the end of collection.

A few tests spend minutes in one outside program each: mypy over the package (single-threaded),
the C++ tests' builds (ASan, aarch64) and the programs under qemu. Most of the rest of the
suite keeps one of the two cores busy at a time. So each such test's work is a `Job`, declared
in its module; the conftest starts every job whose tests were collected and not skipped as soon
as collection ends, in a thread whose programs run at the lowest CPU priority (`nice -n 19`:
they take the core the tests leave idle and yield it back at once), and the test waits for the
job's result where it used to compute it, then asserts on it. A job's exception (a
`pytest.fail` from a failed build included) is raised again in the test that waits for it.

Run alone (a test selected by hand), a test starts its job itself and simply waits for it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_RUNNING: set[subprocess.Popen[str]] = set()
_LOCK = threading.Lock()
_FOLDER: Path | None = None


def folder() -> Path:
    """A folder the jobs of this session build in (removed by `stop_all`)."""
    global _FOLDER
    with _LOCK:
        if _FOLDER is None:
            _FOLDER = Path(tempfile.mkdtemp(prefix="pagedserve-jobs-"))
        return _FOLDER


def run(
    cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
    timeout: float = 900,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """subprocess.run(cmd, capture_output=True, text=True) at the lowest CPU priority, in a
    process group of its own (so `stop_all` ends the whole tree: cmake, ninja, the compilers)."""
    niced = ["nice", "-n", "19", *cmd] if shutil.which("nice") else cmd
    process = subprocess.Popen(
        niced, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    with _LOCK:
        _RUNNING.add(process)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(process)
        stdout, stderr = process.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr) from None
    finally:
        with _LOCK:
            _RUNNING.discard(process)
    return subprocess.CompletedProcess(cmd, process.returncode, stdout, stderr)


class Job:
    """fn() computed once, in a thread of its own, from the first `start` or `result`."""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.name = name
        self._fn = fn
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()
        self._value: Any = None
        self._error: BaseException | None = None
        self.seconds = 0.0  # how long fn ran, once done

    def start(self) -> None:
        with self._starting:  # the thread is started before any caller can join it
            if self._thread is None:
                self._thread = threading.Thread(target=self._body, name=self.name, daemon=True)
                self._thread.start()

    def _body(self) -> None:
        began = time.monotonic()
        try:
            self._value = self._fn()
        except BaseException as error:  # pytest's Failed and Skipped derive from BaseException
            self._error = error
        self.seconds = time.monotonic() - began

    def result(self) -> Any:
        """fn()'s value once it is done (started here if it was not), or its exception."""
        self.start()
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def stop_all() -> None:
    """End the programs still running (a session cut short) and remove the jobs' folder."""
    global _FOLDER
    with _LOCK:
        running = list(_RUNNING)
        _RUNNING.clear()
        build, _FOLDER = _FOLDER, None
    for process in running:
        _kill(process)
    if build is not None:
        shutil.rmtree(build, ignore_errors=True)


def _kill(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
