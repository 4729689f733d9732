"""Fuzzing the native bindings: random operation sequences, valid or not, thrown at
PageAllocator and Scheduler for a bounded number of examples (hypothesis) and for a bounded time
(atheris, coverage-guided: fuzz_native_target.py).

Unlike tests/core/test_scheduler_properties.py (valid sequences checked against a shadow
model), arguments here are arbitrary: unknown and negative ids, out-of-range pages, double
releases, stale plans, wrong-length samples. Every call must either succeed or raise a Python
exception (a crash or a silent out-of-bounds read fails the run), and the page accounting must
stay consistent after each call.
"""

from __future__ import annotations

import re
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedserve.core.ops.native import core
from pagedserve.core.sched.scheduler import Scheduler

EXPECTED = (ValueError, IndexError, RuntimeError, TypeError, OverflowError)
FUZZ_SECONDS = 20  # CI's share; run the target by hand for longer
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
IDS = st.integers(-3, 12) | st.integers(-(2**62), 2**62)
TOKENS = st.lists(st.integers(0, 5), max_size=20).map(lambda t: np.array(t, dtype=np.int32))


def _call(fn: object, *args: object) -> object:
    try:
        return fn(*args)  # type: ignore[operator]
    except EXPECTED:
        return None


ALLOCATOR_OPS = st.one_of(
    st.tuples(st.just("allocate"), st.integers(-2, 8)),
    st.tuples(st.just("release"), IDS),
    st.tuples(st.just("incref"), IDS),
    st.tuples(st.just("register_page"), IDS, IDS, st.integers(0, 3), TOKENS),
    st.tuples(st.just("match_prefix"), TOKENS, st.integers(-2, 8)),
)


@SETTINGS
@given(
    num_pages=st.integers(1, 8),
    page_size=st.integers(1, 4),
    ops=st.lists(ALLOCATOR_OPS, max_size=40),
)
def test_page_allocator_random_calls(num_pages: int, page_size: int, ops: list) -> None:
    a = core.PageAllocator(num_pages, page_size, True)
    for name, *args in ops:
        _call(getattr(a, name), *args)
        assert a.num_free_pages + a.num_used_pages + a.num_cached_pages == num_pages
        assert 0 <= a.num_used_pages <= num_pages


@pytest.mark.parametrize("method", ["ref_count", "release", "incref"])
@pytest.mark.parametrize("page", [-1, 4, 1000, 2**40])
def test_page_allocator_refuses_out_of_range_pages(method: str, page: int) -> None:
    a = core.PageAllocator(4, 2, True)
    with pytest.raises((IndexError, TypeError)):  # TypeError: beyond the binding's int32
        getattr(a, method)(page)


@pytest.mark.parametrize("page", [4, 1000])
def test_page_allocator_generation_refuses_out_of_range_pages(page: int) -> None:
    with pytest.raises(IndexError):
        core.PageAllocator(4, 2, True).generation(page)


SCHEDULER_OPS = st.one_of(
    st.tuples(st.just("add"), IDS, st.lists(st.integers(0, 5), max_size=12), st.integers(-2, 9)),
    st.tuples(st.just("step"), st.integers(-1, 2), st.integers(0, 5)),
    st.tuples(st.just("finish"), IDS),
    st.tuples(st.just("abort"), IDS),
    st.tuples(st.just("peek"), IDS),
)


def _scheduler_op(s: Scheduler, op: tuple) -> None:
    name, *args = op
    if name == "add":
        seq_id, prompt, max_tokens = args
        _call(s.add_request, seq_id, prompt, max_tokens)
    elif name == "step":
        step_shift, extra = args  # a stale/future step id, or a wrong number of samples
        plan = s.schedule()
        sampled = np.zeros(len(plan.logits_indices) + (extra if extra > 3 else 0), np.int32)
        _call(s._native.update, plan.step + (step_shift if extra == 0 else 0), sampled)
    elif name == "peek":
        for fn in (s.page_ids, s.num_computed_tokens, s.num_cached_tokens, s.ref_count):
            _call(fn, args[0])
    else:
        _call(getattr(s, name), args[0])


@SETTINGS
@given(
    num_pages=st.integers(1, 10),
    page_size=st.integers(1, 4),
    max_num_seqs=st.integers(1, 4),
    budget=st.integers(1, 8),
    prefix=st.booleans(),
    ops=st.lists(SCHEDULER_OPS, max_size=40),
)
def test_scheduler_random_calls(
    num_pages: int, page_size: int, max_num_seqs: int, budget: int, prefix: bool, ops: list
) -> None:
    s = Scheduler(num_pages=num_pages, page_size=page_size, max_num_seqs=max_num_seqs,
                  max_num_batched_tokens=budget, max_model_len=16,
                  enable_prefix_caching=prefix)  # fmt: skip
    for op in ops:
        _scheduler_op(s, op)
        stats = s.stats()
        assert stats.num_free_pages + stats.num_used_pages + stats.num_cached_pages == num_pages
        assert s.num_running <= max_num_seqs
    for seq_id in range(-3, 13):
        s.abort(seq_id)
    for seq_id in [op[1] for op in ops if op[0] == "add"]:
        s.abort(seq_id)
    assert not s.has_unfinished and s.stats().num_used_pages == 0  # aborting frees everything


TARGET = Path(__file__).with_name("fuzz_native_target.py")


def test_coverage_guided_fuzz_of_the_bindings(tmp_path: Path) -> None:
    """atheris (libFuzzer's engine) drives fuzz_native_target.py for a bounded time; a crash, an
    unexpected exception or a broken invariant ends the run with a non-zero status and a
    crash-* file holding the input."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    # libFuzzer's RSS limit reads the peak RSS (getrusage), which Linux carries across fork and
    # exec: the child starts at this pytest process's peak, over 4 GB late in a whole suite (a
    # spurious "out-of-memory" at once). The limit is 4 GB above that.
    inherited_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    cmd = [sys.executable, str(TARGET), f"-max_total_time={FUZZ_SECONDS}",
           f"-artifact_prefix={tmp_path}/", f"-rss_limit_mb={inherited_mb + 4096}",
           str(corpus)]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert not list(tmp_path.glob("crash-*")), log[-4000:]
    runs = re.search(r"Done (\d+) runs", log)
    assert runs and int(runs.group(1)) > 1000, log[-2000:]
    assert len(list(corpus.iterdir())) > 10, "the fuzzer found no coverage to grow its corpus"
