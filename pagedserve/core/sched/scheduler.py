"""Typed wrapper over the native continuous-batching scheduler (cpp/src/scheduler.cpp).

The scheduler deals in integers only (no torch). Each step the engine calls `schedule()`, runs
the model on the returned `StepPlan`, then `update(plan, sampled_token_ids)`. The plan's arrays
are read-only numpy views into scheduler-owned buffers: valid until the next `schedule()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from pagedserve.core.config import EngineConfig
from pagedserve.core.ops.native import core as _native

AdmissionError: type[ValueError] = _native.AdmissionError
"""A request that can never run: empty prompt, longer than max_model_len, or more KV pages than
the whole cache holds. A ValueError, so callers answer it as bad input."""


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one step computes. Rows are requests, in the order the model sees them."""

    step: int
    """Sequence number of the schedule() that made this plan (update() checks it)."""
    seq_ids: np.ndarray  # int64 [num_reqs]
    num_scheduled_tokens: np.ndarray  # int32 [num_reqs]
    num_computed_tokens: np.ndarray  # int32 [num_reqs]: context already in the cache
    seq_lens: np.ndarray  # int32 [num_reqs] = computed + scheduled
    query_start_loc: np.ndarray  # int32 [num_reqs + 1] cumulative scheduled tokens
    input_ids: np.ndarray  # int32 [num_tokens]
    positions: np.ndarray  # int32 [num_tokens]
    slot_mapping: np.ndarray  # int64 [num_tokens] page_id * page_size + offset
    page_table: np.ndarray  # int32 [num_reqs, max_pages_in_this_batch], unused entries 0
    num_draft_tokens: np.ndarray  # int32 [num_reqs] draft tokens ending each row's chunk
    # int32 [num_sampled] token row of each logits entry: a sampling row's last known token,
    # then (a verification chunk) each of its drafts
    logits_indices: np.ndarray
    sample_seq_ids: np.ndarray  # int64 [num_sampled] same order as logits_indices
    preempted_seq_ids: np.ndarray  # int64: preempted by this schedule(), back in waiting
    num_reqs: int
    num_tokens: int
    max_query_len: int
    max_seq_len: int


@dataclass(frozen=True)
class SchedulerStats:
    num_pages: int
    page_size: int
    num_free_pages: int
    num_cached_pages: int
    """Pages no request holds that still serve prefix-cache hits (evicted LRU first)."""
    num_used_pages: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    num_preemptions: int
    """Cumulative."""


_PLAN_FIELDS = tuple(f.name for f in fields(StepPlan))
_STATS_FIELDS = tuple(f.name for f in fields(SchedulerStats))


class Scheduler:
    """Continuous batching over a paged KV cache with chunked prefill and prefix caching.

    Policy (stall-free batching, as Sarathi-Serve): running requests first in admission order
    (decode 1 token, or the next prefill chunk), then waiting requests FCFS into the rest of the
    `max_num_batched_tokens` budget, at most `max_num_seqs` running. Every decode's token is
    reserved before any prefill chunk takes the rest, and while a request decodes the step's
    prefill tokens (all prompts and recomputes together) stay within
    `max_prefill_tokens_while_decoding` (None: no cap), bounding the decoders' inter-token
    latency; a step with no decode gives prefill the whole budget. Out of pages, the newest
    running request is preempted (recomputed later).
    """

    @classmethod
    def for_engine(cls, config: EngineConfig, num_pages: int, max_model_len: int) -> Scheduler:
        """The engine's scheduler: EngineConfig's scheduler and cache settings over the pages
        the KV cache was sized to."""
        sc, cc = config.scheduler, config.cache
        return cls(
            num_pages=num_pages,
            page_size=cc.page_size,
            max_num_seqs=sc.max_num_seqs,
            max_num_batched_tokens=sc.max_num_batched_tokens,
            max_prefill_tokens_while_decoding=sc.max_prefill_tokens_while_decoding,
            max_model_len=max_model_len,
            enable_prefix_caching=cc.enable_prefix_caching,
        )

    def __init__(
        self,
        *,
        num_pages: int,
        page_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_prefix_caching: bool,
        max_prefill_tokens_while_decoding: int | None = None,
    ) -> None:
        self._native = _native.Scheduler(
            num_pages=num_pages,
            page_size=page_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            max_prefill_tokens_while_decoding=max_prefill_tokens_while_decoding or 0,
        )

    def add_request(
        self,
        seq_id: int,
        prompt_token_ids: Sequence[int] | np.ndarray,
        max_tokens: int,
        use_prefix_cache: bool = True,
        cache_salt: int = 0,
        whole_spans: Sequence[tuple[int, int]] = (),
    ) -> None:
        """Queue a request. AdmissionError if it can never fit; ValueError for a duplicate id.
        cache_salt: prefix-cache pages are shared only between requests of one salt (0: none;
        a LoRA adapter's id, so an adapter never reads another's or the base model's KV).
        whole_spans: sorted, disjoint [start, end) prompt spans that no prefill chunk ends
        inside (an image whose tokens attend to each other both ways, Gemma 3's); each must
        fit max_num_batched_tokens (else AdmissionError)."""
        spans = np.asarray(whole_spans, dtype=np.int32).reshape(-1, 2) if whole_spans else None
        self._native.add_request(seq_id, prompt_token_ids, max_tokens, use_prefix_cache,
                                 cache_salt, spans)  # fmt: skip

    def schedule(self) -> StepPlan:
        plan = self._native.schedule()  # the bound C++ StepPlan: named fields, numpy views
        return StepPlan(**{name: getattr(plan, name) for name in _PLAN_FIELDS})

    def propose(self, seq_id: int, draft_token_ids: Sequence[int]) -> None:
        """Draft tokens (speculative decoding) for the next schedule() only: planned after the
        sequence's last token if it decodes then, cut to what the token budget, max_tokens
        and the free pages allow (drafts never preempt). Unknown ids are ignored."""
        self._native.propose(seq_id, np.asarray(draft_token_ids, dtype=np.int32))

    def update(
        self,
        plan: StepPlan,
        sampled_token_ids: np.ndarray,
        num_accepted: np.ndarray | None = None,
    ) -> None:
        """Advance every request of `plan` (the last one scheduled) and append its samples.

        `sampled_token_ids` holds one token per entry of `plan.logits_indices`, in that order.
        `num_accepted` (int32 per plan row; None: the longest prefix that matches): the drafts
        each verification chunk keeps, which its samples must match; the row appends them and
        the sample after them, and gives back the KV slots and pages of the rest.
        """
        self._native.update(plan.step, sampled_token_ids, num_accepted)

    def finish(self, seq_id: int) -> None:
        """The engine is done with it (stop or length): its pages are freed now."""
        self._native.finish(seq_id)

    def abort(self, seq_id: int) -> None:
        """Drop a waiting or running request and free its pages; unknown ids are ignored."""
        self._native.abort(seq_id)

    @property
    def num_running(self) -> int:
        return int(self._native.num_running)

    @property
    def num_waiting(self) -> int:
        return int(self._native.num_waiting)

    @property
    def has_unfinished(self) -> bool:
        return bool(self._native.has_unfinished)

    def num_cached_tokens(self, seq_id: int) -> int:
        """Prompt tokens served from the prefix cache when the request was first admitted."""
        return int(self._native.num_cached_tokens(seq_id))

    def stats(self) -> SchedulerStats:
        stats = self._native.stats()
        return SchedulerStats(**{name: getattr(stats, name) for name in _STATS_FIELDS})

    # Introspection (tests, debugging): not needed by the engine.
    def page_ids(self, seq_id: int) -> list[int]:
        """The pages a live request holds, in sequence order (empty while waiting)."""
        return list(self._native.page_ids(seq_id))

    def num_computed_tokens(self, seq_id: int) -> int:
        return int(self._native.num_computed_tokens(seq_id))

    def ref_count(self, page: int) -> int:
        return int(self._native.ref_count(page))

    def cached_page_hashes(self) -> list[int]:
        """The hash of every page in the prefix cache (what KV events describe)."""
        return [int(h) for h in self._native.cached_page_hashes()]

    # KV events (`engine/kv_events.py`): the prefix cache's changes, drained once per step.
    def enable_kv_events(self) -> None:
        """From now on the page allocator logs each page hash entering or leaving its cache."""
        self._native.kv_events.enabled = True

    def drain_kv_events(self, page_size: int) -> KvEventRecords | None:
        """What the log holds, oldest first, and empty it; None when nothing changed."""
        log = self._native.kv_events
        if not len(log):
            return None
        return KvEventRecords(*log.drain(page_size))


@dataclass(frozen=True, slots=True)
class KvEventRecords:
    """The prefix cache's changes since the last drain, one record per page, in order."""

    STORED: ClassVar[int] = 0
    REMOVED: ClassVar[int] = 1
    kinds: np.ndarray  # int8 [n]: STORED or REMOVED
    hashes: np.ndarray  # uint64 [n]: the page's chained hash
    parent_hashes: np.ndarray  # uint64 [n]: stored records: the parent page's hash
    has_parent: np.ndarray  # uint8 [n]: stored records: 0 for a sequence's first page
    salts: np.ndarray  # uint64 [n]: the salt the page's chain was seeded with (its LoRA
    # adapter's id, 0 for the base model)
    token_ids: np.ndarray  # int32 [number of stored records, page_size], in their order
