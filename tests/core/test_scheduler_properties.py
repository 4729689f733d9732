"""Random add/schedule/update/abort/finish sequences against a shadow model of the KV pages.

The shadow records, for every KV slot the scheduler told the model to write, the token prefix
whose KV it holds. Each step checks that every request's context (including prefix-cache hits)
sits in slots holding exactly its own prefix, and that pages are neither leaked nor shared
without a reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pagedserve.core.sched.scheduler import AdmissionError, Scheduler, StepPlan

TOKENS = st.integers(0, 2)  # a tiny vocabulary so that prompts share prefixes often
MAX_MODEL_LEN = 24


@dataclass
class ShadowRequest:
    token_ids: list[int]
    num_prompt_tokens: int
    max_tokens: int
    num_computed: int = 0
    admitted: bool = False


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        num_pages=st.integers(3, 24),
        page_size=st.sampled_from([1, 2, 4]),
        max_num_seqs=st.integers(1, 4),
        budget=st.integers(1, 12),
        prefix=st.booleans(),
        cap=st.integers(0, 12),
    )
    def setup(
        self,
        num_pages: int,
        page_size: int,
        max_num_seqs: int,
        budget: int,
        prefix: bool,
        cap: int,
    ) -> None:
        self.s = Scheduler(
            num_pages=num_pages,
            page_size=page_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=MAX_MODEL_LEN,
            enable_prefix_caching=prefix,
            max_prefill_tokens_while_decoding=cap or None,  # 0: no cap
        )
        self.cap = cap or budget
        self.page_size, self.num_pages = page_size, num_pages
        self.max_num_seqs, self.budget = max_num_seqs, budget
        self.requests: dict[int, ShadowRequest] = {}
        self.kv: dict[int, tuple[int, ...]] = {}  # slot -> token prefix whose KV it holds
        self.next_id = 0

    @rule(prompt=st.lists(TOKENS, max_size=14), max_tokens=st.integers(1, 12))
    def add(self, prompt: list[int], max_tokens: int) -> None:
        seq_id, self.next_id = self.next_id, self.next_id + 1
        total = len(prompt) + max_tokens
        fits = -(-(total - 1) // self.page_size) <= self.num_pages
        if not prompt or total > MAX_MODEL_LEN or not fits:
            try:
                self.s.add_request(seq_id, prompt, max_tokens)
            except AdmissionError:
                return
            raise AssertionError("an impossible request was admitted")
        self.s.add_request(seq_id, np.array(prompt, dtype=np.int32), max_tokens)
        self.requests[seq_id] = ShadowRequest(list(prompt), len(prompt), max_tokens)

    @rule(pick=st.integers(0, 1000), finish=st.booleans())
    def abort_or_finish(self, pick: int, finish: bool) -> None:
        if not self.requests:
            self.s.abort(10**9)  # unknown: a no-op
            return
        seq_id = sorted(self.requests)[pick % len(self.requests)]
        (self.s.finish if finish else self.s.abort)(seq_id)
        del self.requests[seq_id]

    @rule()
    def step(self) -> None:
        plan = self.s.schedule()
        self.check_plan(plan)
        sampled = np.array(
            [(sid * 7 + len(self.requests[sid].token_ids)) % 3 for sid in plan.sample_seq_ids],
            dtype=np.int32,
        )
        self.s.update(plan, sampled)
        for sid, n in zip(plan.seq_ids.tolist(), plan.num_scheduled_tokens.tolist(), strict=True):
            self.requests[sid].num_computed += n
        for sid, token in zip(plan.sample_seq_ids.tolist(), sampled.tolist(), strict=True):
            r = self.requests[sid]
            r.token_ids.append(token)
            if len(r.token_ids) - r.num_prompt_tokens == r.max_tokens:  # the engine's length stop
                self.s.finish(sid)
                del self.requests[sid]

    def check_plan(self, plan: StepPlan) -> None:
        assert plan.num_tokens <= self.budget and plan.num_reqs <= self.max_num_seqs
        for sid in plan.preempted_seq_ids.tolist():
            self.requests[sid].num_computed = 0
        sampled = set(plan.sample_seq_ids.tolist())
        assert plan.query_start_loc[-1] == plan.num_tokens
        decodes = prefill = 0
        for row, sid in enumerate(plan.seq_ids.tolist()):
            r = self.requests[sid]
            computed, n = int(plan.num_computed_tokens[row]), int(plan.num_scheduled_tokens[row])
            # A decode: a running request's one token after its last sampled one.
            last = len(r.token_ids) - 1
            if n == 1 and computed == last == r.num_computed and last >= r.num_prompt_tokens:
                decodes += 1
            else:
                prefill += n
            if not r.admitted:  # first admission: prefix hits are whole pages
                assert computed == self.s.num_cached_tokens(sid)
                r.admitted = True
            elif computed != r.num_computed:  # re-admitted after preemption, maybe with hits
                assert r.num_computed == 0 and computed % self.page_size == 0
            r.num_computed = computed
            assert 0 < n and computed + n <= len(r.token_ids)
            assert (computed + n == len(r.token_ids)) == (sid in sampled)
            self.check_row(plan, row, r)
        assert decodes == 0 or prefill <= self.cap, "prefill over the cap next to decodes"

    def check_row(self, plan: StepPlan, row: int, r: ShadowRequest) -> None:
        pages = plan.page_table[row]
        start, end = plan.query_start_loc[row], plan.query_start_loc[row + 1]
        computed = int(plan.num_computed_tokens[row])
        for pos in range(computed):  # the context must be this request's own KV
            slot = int(pages[pos // self.page_size]) * self.page_size + pos % self.page_size
            assert self.kv.get(slot) == tuple(r.token_ids[: pos + 1]), "wrong KV in context"
        for i in range(start, end):
            pos = int(plan.positions[i])
            assert pos == computed + i - start and plan.input_ids[i] == r.token_ids[pos]
            slot = int(pages[pos // self.page_size]) * self.page_size + pos % self.page_size
            assert plan.slot_mapping[i] == slot
            self.kv[slot] = tuple(r.token_ids[: pos + 1])

    @invariant()
    def pages_are_accounted(self) -> None:
        if not hasattr(self, "s"):
            return
        owners: dict[int, int] = {}
        for sid in self.requests:
            held = self.s.page_ids(sid)
            assert len(held) == len(set(held)), "a request holds a page twice"
            for page in held:
                owners[page] = owners.get(page, 0) + 1
        for page in range(self.num_pages):
            assert self.s.ref_count(page) == owners.get(page, 0)
        stats = self.s.stats()
        assert stats.num_used_pages == len(owners)
        assert (
            stats.num_free_pages + stats.num_cached_pages + stats.num_used_pages == self.num_pages
        )
        assert self.s.num_running <= self.max_num_seqs
        assert self.s.num_running + self.s.num_waiting == len(self.requests)

    def teardown(self) -> None:
        if not hasattr(self, "s"):
            return
        for _ in range(2000):  # every admitted request finishes when we keep stepping
            if not self.s.has_unfinished:
                break
            self.step()
            self.pages_are_accounted()
        assert not self.s.has_unfinished and not self.requests
        assert self.s.stats().num_used_pages == 0


SchedulerMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_scheduler_state_machine = SchedulerMachine.TestCase
