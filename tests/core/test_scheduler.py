"""Hand-worked step plans of the scheduler wrapper (pagedserve/core/sched/scheduler.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pagedserve.core.sched.scheduler import AdmissionError, Scheduler, StepPlan


def make(**overrides: int | bool) -> Scheduler:
    kwargs: dict = dict(
        num_pages=16,
        page_size=4,
        max_num_seqs=4,
        max_num_batched_tokens=8,
        max_model_len=64,
        enable_prefix_caching=True,
    )
    kwargs.update(overrides)
    return Scheduler(**kwargs)


def step(s: Scheduler, token: int = 7) -> StepPlan:
    plan = s.schedule()
    s.update(plan, np.full(len(plan.logits_indices), token, dtype=np.int32))
    return plan


def test_chunked_prefill_plan_contents() -> None:
    s = make(max_num_batched_tokens=6)
    s.add_request(1, list(range(100, 110)), max_tokens=3)
    p = s.schedule()
    assert p.num_reqs == 1 and p.num_tokens == 6 and p.max_query_len == 6 and p.max_seq_len == 6
    assert p.input_ids.tolist() == list(range(100, 106))
    assert p.positions.tolist() == list(range(6))
    pages = p.page_table[0].tolist()
    assert p.page_table.shape == (1, 2)
    assert p.slot_mapping.tolist() == [pages[i // 4] * 4 + i % 4 for i in range(6)]
    assert p.logits_indices.size == 0 and p.sample_seq_ids.size == 0
    assert p.seq_ids.dtype == np.int64 and p.slot_mapping.dtype == np.int64
    assert p.input_ids.dtype == np.int32 and not p.input_ids.flags.writeable
    s.update(p, np.zeros(0, dtype=np.int32))

    p = s.schedule()
    assert p.num_computed_tokens.tolist() == [6] and p.num_scheduled_tokens.tolist() == [4]
    assert p.seq_lens.tolist() == [10] and p.query_start_loc.tolist() == [0, 4]
    assert p.positions.tolist() == [6, 7, 8, 9]
    assert p.logits_indices.tolist() == [3] and p.sample_seq_ids.tolist() == [1]
    assert p.page_table.shape == (1, 3) and p.page_table[0, :2].tolist() == pages
    s.update(p, np.array([55], dtype=np.int32))

    p = s.schedule()  # decode: the sampled token goes in at position 10
    assert p.input_ids.tolist() == [55] and p.positions.tolist() == [10]
    assert p.logits_indices.tolist() == [0]


def test_decode_before_prefill_and_page_table_padding() -> None:
    s = make()
    s.add_request(1, [1, 2, 3], max_tokens=8)
    step(s)
    s.add_request(2, list(range(1, 21)), max_tokens=8)
    p = s.schedule()
    assert p.seq_ids.tolist() == [1, 2] and p.num_scheduled_tokens.tolist() == [1, 7]
    assert p.query_start_loc.tolist() == [0, 1, 8]
    assert p.sample_seq_ids.tolist() == [1] and p.logits_indices.tolist() == [0]
    assert p.page_table.shape == (2, 2) and p.page_table[0, 1] == 0  # unused entry


def test_prefix_hit_reuses_pages_and_counts_tokens() -> None:
    s = make(max_num_batched_tokens=64)
    prompt = list(range(1, 14))  # 13 tokens: 3 full pages
    s.add_request(1, prompt, max_tokens=2)
    step(s)
    first = s.page_ids(1)
    s.finish(1)
    assert s.stats().num_cached_pages == 3
    s.add_request(2, prompt + [99], max_tokens=2)
    p = s.schedule()
    assert s.num_cached_tokens(2) == 12
    assert p.num_computed_tokens.tolist() == [12] and p.input_ids.tolist() == [13, 99]
    assert s.page_ids(2)[:3] == first[:3]
    st = s.stats()
    assert (st.prefix_query_tokens, st.prefix_hit_tokens) == (13 + 14, 12)


def test_prefix_cache_off_per_request_and_globally() -> None:
    for scheduler, use in ((make(), False), (make(enable_prefix_caching=False), True)):
        scheduler.add_request(1, list(range(1, 10)), max_tokens=2, use_prefix_cache=use)
        step(scheduler)
        scheduler.finish(1)
        scheduler.add_request(2, list(range(1, 10)), max_tokens=2)
        scheduler.schedule()
        assert scheduler.num_cached_tokens(2) == 0


def test_preemption_puts_newest_back_first_and_recomputes() -> None:
    s = make(num_pages=4, page_size=2, max_model_len=16, max_num_batched_tokens=64)
    s.add_request(1, [1, 2, 3], max_tokens=6)
    s.add_request(2, [4, 5, 6], max_tokens=6)
    step(s, token=8)
    step(s, token=9)
    p = s.schedule()
    assert p.preempted_seq_ids.tolist() == [2] and p.seq_ids.tolist() == [1]
    assert s.num_waiting == 1 and s.stats().num_preemptions == 1
    s.update(p, np.array([10], dtype=np.int32))
    s.abort(1)
    p = s.schedule()  # its first page [4, 5] stayed in the prefix cache: only the rest runs
    assert p.seq_ids.tolist() == [2] and p.input_ids.tolist() == [6, 8, 9]
    assert p.num_computed_tokens.tolist() == [2] and p.sample_seq_ids.tolist() == [2]
    assert s.num_cached_tokens(2) == 0  # reported for the first admission only


def test_abort_and_finish_free_pages_at_once() -> None:
    s = make(enable_prefix_caching=False, max_num_batched_tokens=11)
    s.add_request(1, list(range(1, 10)), max_tokens=4)
    s.add_request(2, [1, 2], max_tokens=4)
    s.add_request(3, [1, 2], max_tokens=4)  # still waiting (budget spent)
    step(s)
    assert s.stats().num_used_pages == 3 + 1 and s.num_waiting == 1
    s.abort(3)
    s.abort(1)
    assert s.stats().num_used_pages == 1
    s.finish(2)
    s.abort(42)  # unknown: a no-op
    st = s.stats()
    assert st.num_free_pages == st.num_pages and not s.has_unfinished


def test_admission_errors() -> None:
    s = make(num_pages=4, page_size=4, max_model_len=32)
    with pytest.raises(AdmissionError, match="empty"):
        s.add_request(1, [], max_tokens=4)
    with pytest.raises(AdmissionError, match="max_model_len"):
        s.add_request(1, list(range(10)), max_tokens=30)
    with pytest.raises(AdmissionError, match="KV pages"):
        s.add_request(1, list(range(10)), max_tokens=8)
    assert issubclass(AdmissionError, ValueError)
    s.add_request(1, np.arange(10, dtype=np.int64), max_tokens=7)
    with pytest.raises(ValueError, match="already in use"):
        s.add_request(1, [1], max_tokens=1)


def test_update_checks_its_plan() -> None:
    s = make()
    s.add_request(1, [1, 2], max_tokens=4)
    p = s.schedule()
    with pytest.raises(ValueError, match="entries"):
        s.update(p, np.zeros(2, dtype=np.int32))
    s.update(p, np.zeros(1, dtype=np.int32))
    with pytest.raises(ValueError, match="last schedule"):
        s.update(p, np.zeros(1, dtype=np.int32))


def test_native_page_allocator_binding() -> None:
    from pagedserve.core.ops.native import core

    a = core.PageAllocator(4, 2, True)
    pages = a.allocate(2)
    assert pages is not None and a.allocate(3) is None and a.num_used_pages == 2
    tokens = np.array([3, 4, 5, 6], dtype=np.int32)
    root = a.register_page(pages[0], -1, 0, tokens[:2])
    child = a.register_page(pages[1], root, a.generation(root), tokens[2:])
    assert (root, child) == (pages[0], pages[1])
    for page in reversed(pages):
        a.release(page)
    assert a.num_cached_pages == 2
    assert a.match_prefix(tokens, 2) == pages and a.ref_count(pages[1]) == 1
    assert a.match_prefix(np.array([3, 4, 9, 9], dtype=np.int32), 2) == pages[:1]
    with pytest.raises(ValueError, match="token_ids"):
        a.match_prefix(tokens[:2], 2)
