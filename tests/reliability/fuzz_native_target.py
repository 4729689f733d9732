"""A coverage-guided fuzz target (atheris, libFuzzer's engine) for the native bindings.

Each input is decoded into a PageAllocator or Scheduler configuration and a sequence of calls
with arbitrary arguments: unknown, negative and huge ids, out-of-range pages, double releases,
bogus parents, stale or future step ids, wrong-length samples. Every call must return or raise
one of the binding's Python exceptions; the page accounting must stay consistent after each
call; aborting every request must free every page. Anything else (a crash, a sanitizer report,
an unexpected exception, a broken invariant) is a finding: atheris stops and writes the input.

Coverage comes from this decoder and the Python wrapper (instrumented); the C++ is built with GCC here,
which has no libFuzzer instrumentation, so the native side is explored through the wrapper and
the decoded call sequences. Run it by hand for longer than CI does:

    python tests/reliability/fuzz_native_target.py -max_total_time=600 corpus/
"""

from __future__ import annotations

import sys

import atheris
import numpy as np

with atheris.instrument_imports():
    from pagedserve.core.ops.native import core
    from pagedserve.core.sched.scheduler import Scheduler

EXPECTED = (ValueError, IndexError, RuntimeError, TypeError, OverflowError)
INT32 = 2**31


def _call(fn: object, *args: object) -> object:
    try:
        return fn(*args)  # type: ignore[operator]
    except EXPECTED:
        return None


def _id(fdp: atheris.FuzzedDataProvider) -> int:
    """Mostly small ids (they collide with real ones), sometimes anything in int64."""
    if fdp.ConsumeBool():
        return fdp.ConsumeIntInRange(-3, 12)
    return fdp.ConsumeIntInRange(-(2**63), 2**63 - 1)


def _tokens(fdp: atheris.FuzzedDataProvider, max_len: int) -> np.ndarray:
    n = fdp.ConsumeIntInRange(0, max_len)
    return np.array([fdp.ConsumeIntInRange(0, 5) for _ in range(n)], dtype=np.int32)


@atheris.instrument_func
def fuzz_allocator(fdp: atheris.FuzzedDataProvider) -> None:
    num_pages = fdp.ConsumeIntInRange(1, 8)
    a = core.PageAllocator(num_pages, fdp.ConsumeIntInRange(1, 4), fdp.ConsumeBool())
    while fdp.remaining_bytes():
        op = fdp.ConsumeIntInRange(0, 6)
        if op == 0:
            _call(a.allocate, fdp.ConsumeIntInRange(-2, 9))
        elif op in (1, 2, 3, 4):
            method = (a.release, a.incref, a.ref_count, a.generation)[op - 1]
            _call(method, _id(fdp))
        elif op == 5:
            page, parent = _id(fdp), _id(fdp)
            generation = fdp.ConsumeIntInRange(0, 2**32 - 1)
            _call(a.register_page, page, parent, generation, _tokens(fdp, 6))
        else:
            _call(a.match_prefix, _tokens(fdp, 20), fdp.ConsumeIntInRange(-2, 9))
        used, free, cached = a.num_used_pages, a.num_free_pages, a.num_cached_pages
        if used + free + cached != num_pages or not 0 <= used <= num_pages:
            raise AssertionError(f"accounting broken: {used} + {free} + {cached} != {num_pages}")


@atheris.instrument_func
def _scheduler_step(s: Scheduler, fdp: atheris.FuzzedDataProvider) -> None:
    plan = s.schedule()
    step = plan.step + (fdp.ConsumeIntInRange(-2, 2) if fdp.ConsumeBool() else 0)
    extra = fdp.ConsumeIntInRange(-2, 3) if fdp.ConsumeBool() else 0
    count = max(0, len(plan.logits_indices) + extra)
    sampled = np.array([fdp.ConsumeIntInRange(0, 7) for _ in range(count)], dtype=np.int32)
    _call(s._native.update, step, sampled)


@atheris.instrument_func
def fuzz_scheduler(fdp: atheris.FuzzedDataProvider) -> None:
    num_pages, max_num_seqs = fdp.ConsumeIntInRange(1, 10), fdp.ConsumeIntInRange(1, 4)
    s = Scheduler(num_pages=num_pages, page_size=fdp.ConsumeIntInRange(1, 4),
                  max_num_seqs=max_num_seqs, max_num_batched_tokens=fdp.ConsumeIntInRange(1, 8),
                  max_model_len=16, enable_prefix_caching=fdp.ConsumeBool())  # fmt: skip
    added: list[int] = []
    while fdp.remaining_bytes():
        op = fdp.ConsumeIntInRange(0, 4)
        if op == 0:
            added.append(_id(fdp))
            max_tokens = fdp.ConsumeIntInRange(-2, 9)
            _call(s.add_request, added[-1], _tokens(fdp, 12), max_tokens, fdp.ConsumeBool())
        elif op == 1:
            _scheduler_step(s, fdp)
        elif op == 2:
            _call(s.finish, _id(fdp))
        elif op == 3:
            _call(s.abort, _id(fdp))
        else:
            seq_id = _id(fdp)
            for fn in (s.page_ids, s.num_computed_tokens, s.num_cached_tokens, s.ref_count):
                _call(fn, seq_id)
        st = s.stats()
        if st.num_free_pages + st.num_used_pages + st.num_cached_pages != num_pages:
            raise AssertionError(f"accounting broken: {st}")
        if s.num_running > max_num_seqs:
            raise AssertionError(f"{s.num_running} running > max_num_seqs {max_num_seqs}")
    for seq_id in [*range(-3, 13), *added]:
        s.abort(seq_id)
    if s.has_unfinished or s.stats().num_used_pages:
        raise AssertionError(f"aborting every request left pages in use: {s.stats()}")


@atheris.instrument_func
def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        fuzz_allocator(fdp)
    else:
        fuzz_scheduler(fdp)


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
