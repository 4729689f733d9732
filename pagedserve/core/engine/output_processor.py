"""OutputProcessor: a step's sampled tokens -> request state -> RequestOutputs (no tensors).

For each sampled token: append it, detokenize, check the stops (EOS, stop token ids, stop
strings, length), and emit one delta per touched request. A verification chunk (speculative
decoding) brings its kept drafts and the target's token after them: they are appended one by
one the same way, so a stop among them ends the output there and the rest are dropped. It owns the table of live requests
and their sequences; finishing a sequence frees its pages in the scheduler and its state in the
model runner (`release`). An embedding request finishes when its prompt has run: its vector
comes with the step's result instead of a token. n > 1: when output 0 has its first token (its prompt pages are then
filled and cached), the other outputs are queued here and the engine adds them at the start of
its next step, so this phase never re-enters admission.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pagedserve.core.outputs import RequestOutput, TokenLogprob
from pagedserve.core.request import Request, Sequence

if TYPE_CHECKING:
    from pagedserve.core.runner.step_result import StepResult
    from pagedserve.core.sched.scheduler import Scheduler, StepPlan


class OutputProcessor:
    def __init__(
        self,
        scheduler: Scheduler,
        *,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        release: Callable[[int], None],
        observe: Callable[[int, int, int], None] | None = None,
    ) -> None:
        """`observe(seq_id, num_draft, num_accepted)`: told of each verification chunk."""
        self.scheduler = scheduler
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self._release = release
        self._observe = observe
        self.requests: dict[str, Request] = {}
        """Live requests by id; a request leaves when its last output is emitted."""
        self.seqs: dict[int, Sequence] = {}
        """Live sequences by seq_id (the scheduler's id); one leaves when it finishes."""
        self._queued_children: list[Request] = []
        self.num_generated_tokens = 0
        """Tokens appended since start, every request's (for /metrics)."""
        self.finished_reasons: collections.Counter[str] = collections.Counter()
        """Ended outputs by finish reason; the engine adds its own (abort, error)."""

    @property
    def num_queued_children(self) -> int:
        """Outputs of n > 1 requests queued here, not yet in the scheduler (they wait)."""
        return sum(r.params.n - r.num_children_added for r in self._queued_children)

    def take_queued_children(self) -> list[Request]:
        """Requests whose outputs 1..n-1 are due to join the scheduler (see the module doc)."""
        queued, self._queued_children = self._queued_children, []
        return queued

    def process(self, plan: StepPlan, result: StepResult) -> list[RequestOutput]:
        sampled = result.token_ids.tolist()
        self.scheduler.update(plan, result.token_ids, result.num_accepted)
        for seq_id, logprobs in result.prompt_logprobs.items():
            request = self.seqs[seq_id].request
            if request.prompt_logprobs is not None:
                request.prompt_logprobs.extend(logprobs)
        touched: dict[str, Request] = {}
        seq_ids = plan.sample_seq_ids.tolist()
        i = 0
        while i < len(seq_ids):
            seq = self.seqs[seq_ids[i]]
            embedding = result.embeddings.get(seq.seq_id)
            num_draft, num_kept = result.verified.get(i, (0, 0))
            if embedding is not None:
                seq.request.embedding = embedding
                self._finish(seq, "stop", None, flush=False)
            else:
                for j in range(i, i + num_kept + 1):
                    logprob = result.logprobs[j] if result.logprobs else None
                    self._append_token(seq, sampled[j], logprob)
                    if seq.finished:  # a stop or the length: the rest are dropped
                        break
            if num_draft and self._observe is not None:
                self._observe(seq.seq_id, num_draft, num_kept)
            touched[seq.request.request_id] = seq.request
            i += num_draft + 1
        return [self._emit(request) for request in touched.values()]

    def _append_token(self, seq: Sequence, token: int, logprob: TokenLogprob | None) -> None:
        request, params = seq.request, seq.request.params
        self._record_token_time(request)
        seq.output_token_ids.append(token)
        grammar_ended = seq.grammar is not None and seq.grammar.advance(token)
        delta = seq.pending()
        delta.token_ids.append(token)
        if logprob is not None and delta.logprobs is not None:
            delta.logprobs.append(logprob)
        if len(seq.output_token_ids) == 1 and seq.index == 0:
            self._queue_remaining_children(request)
        if token in self.eos_token_ids and not params.ignore_eos:
            return self._finish(seq, "stop", None, flush=True)
        if token in params.stop_token_ids:
            return self._finish(seq, "stop", token, flush=True)
        if grammar_ended:  # only EOS ends a grammar, and ignore_eos kept it: it is still the end
            return self._finish(seq, "stop", None, flush=True)
        delta.text += seq.detokenizer.add([token])
        if seq.detokenizer.stop_hit is not None:
            return self._finish(seq, "stop", seq.detokenizer.stop_hit, flush=False)
        num_tokens = len(request.prompt_token_ids) + len(seq.output_token_ids)
        if len(seq.output_token_ids) >= request.max_tokens or num_tokens >= self.max_model_len:
            self._finish(seq, "length", None, flush=True)

    def _queue_remaining_children(self, request: Request) -> None:
        if request.num_children_added < request.params.n:
            self._queued_children.append(request)

    def _record_token_time(self, request: Request) -> None:
        metrics, now = request.metrics, time.monotonic()
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        elif metrics.last_token_time is not None:
            metrics.inter_token_latencies.append(now - metrics.last_token_time)
        metrics.last_token_time = now
        metrics.num_generated_tokens += 1
        self.num_generated_tokens += 1

    def _finish(
        self, seq: Sequence, reason: str, stop_reason: int | str | None, flush: bool
    ) -> None:
        delta = seq.pending()
        if flush:
            delta.text += seq.detokenizer.flush()
        seq.finish_reason = delta.finish_reason = reason
        seq.stop_reason = delta.stop_reason = stop_reason
        self.finished_reasons[reason] += 1
        self.scheduler.finish(seq.seq_id)
        self._release(seq.seq_id)
        self.seqs.pop(seq.seq_id, None)

    def _emit(self, request: Request) -> RequestOutput:
        deltas = [d for d in (seq.take_delta() for seq in request.seqs) if d is not None]
        output = RequestOutput(request.request_id, request.prompt_token_ids, deltas)
        if request.prompt_logprobs is not None and not request.prompt_logprobs_sent:
            output.prompt_logprobs = [None, *request.prompt_logprobs]
            request.prompt_logprobs_sent = True
        if request.finished:
            output.finished = True
            output.embedding = request.embedding
            request.metrics.finished_time = time.monotonic()
            output.metrics = request.metrics
            self.requests.pop(request.request_id, None)
        return output
