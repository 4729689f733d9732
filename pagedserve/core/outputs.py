"""What the engine hands back (stdlib only).

Outputs are deltas: each RequestOutput carries only what is new since the previous one for
that request, so a lagging consumer can merge several (see `merge`). `LLM.generate` accumulates
them into whole completions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    """Speculative decoding's cumulative counters (vLLM's vllm:spec_decode_* series)."""

    num_drafts: int = 0
    """Verification chunks run (a sequence's draft of >= 1 token in a step)."""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    """[i]: drafts whose token at position i was accepted (num_speculative_tokens entries)."""


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    rank: int
    """1 = the most likely token."""
    top: list[tuple[int, float]] = field(default_factory=list)
    """The top-k alternatives as (token_id, logprob), most likely first."""


@dataclass
class CompletionOutput:
    index: int
    """Which of the n outputs this is."""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    """None while running; then 'stop', 'length', 'abort' or 'error'."""
    stop_reason: int | str | None = None
    """The stop string or stop token id that ended it, if any."""

    def merge(self, later: CompletionOutput) -> None:
        self.text += later.text
        self.token_ids.extend(later.token_ids)
        if later.logprobs is not None:
            self.logprobs = (self.logprobs or []) + later.logprobs
        self.finish_reason = later.finish_reason
        self.stop_reason = later.stop_reason


@dataclass
class RequestMetrics:
    arrival_time: float
    """time.monotonic() when the request was added."""
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""
    num_preemptions: int = 0
    inter_token_latencies: list[float] = field(default_factory=list)

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    """Deltas of the outputs that progressed (any subset of the n indices)."""
    finished: bool = False
    """True once every one of the n outputs has finished."""
    prompt_logprobs: list[TokenLogprob | None] | None = None
    """Set once, on the first output, when prompt_logprobs was asked (None for token 0)."""
    metrics: RequestMetrics | None = None
    error: str | None = None
    """Set when the engine failed the request (finish_reason 'error')."""
    embedding: list[float] | None = None
    """An embedding request's vector (on its one, finished output)."""

    def merge(self, later: RequestOutput) -> None:
        """Fold a later delta into this one (a consumer lagged behind the engine)."""
        by_index = {o.index: o for o in self.outputs}
        for out in later.outputs:
            if out.index in by_index:
                by_index[out.index].merge(out)
            else:
                self.outputs.append(out)
                by_index[out.index] = out
        self.outputs.sort(key=lambda o: o.index)
        self.finished = later.finished
        self.prompt_logprobs = self.prompt_logprobs or later.prompt_logprobs
        self.metrics = later.metrics or self.metrics
        self.error = later.error or self.error
        self.embedding = later.embedding or self.embedding


@dataclass
class EngineStats:
    """A snapshot for /metrics and /health."""

    num_running: int
    num_waiting: int
    num_pages: int
    page_size: int
    num_free_pages: int
    num_used_pages: int
    num_cached_pages: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    num_preemptions: int
    num_generated_tokens: int = 0
    """Every token sampled so far, aborted and failed requests' included."""
    finished_reasons: Mapping[str, int] = field(default_factory=dict)
    """Ended outputs (each of a request's n) by finish reason: stop, length, abort (its client
    left), error."""
    spec_decode: SpecDecodeStats | None = None
    """Speculative decoding's counters; None when it is off."""

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of pages held by requests (cached-but-free pages count as free)."""
        return self.num_used_pages / self.num_pages if self.num_pages else 0.0
