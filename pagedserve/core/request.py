"""Engine-side state of a request and of each of its n output sequences (stdlib only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedserve.core.lora_request import LoRARequest
from pagedserve.core.outputs import CompletionOutput, RequestMetrics, TokenLogprob
from pagedserve.core.pooling_params import PoolingParams
from pagedserve.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedserve.core.multimodal.inputs import MultiModalInputs
    from pagedserve.core.structured.state import CompiledGrammar, GrammarState
    from pagedserve.core.tokenizers.detokenizer import IncrementalDetokenizer


@dataclass
class Sequence:
    """One of a request's n outputs; the scheduler knows it by seq_id."""

    seq_id: int
    index: int
    request: Request
    detokenizer: IncrementalDetokenizer
    output_token_ids: list[int] = field(default_factory=list)
    grammar: GrammarState | None = None
    """GrammarState (core.structured) of a constrained output: every output token accepted."""
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    delta: CompletionOutput | None = None
    """What changed since the last RequestOutput was emitted."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def pending(self) -> CompletionOutput:
        if self.delta is None:
            want_logprobs = self.request.params.logprobs is not None
            self.delta = CompletionOutput(index=self.index, logprobs=[] if want_logprobs else None)
        return self.delta

    def take_delta(self) -> CompletionOutput | None:
        delta, self.delta = self.delta, None
        return delta


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int
    """params.max_tokens resolved against the context length."""
    metrics: RequestMetrics
    seqs: list[Sequence] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    prompt_logprobs_sent: bool = False
    num_children_added: int = 0
    """How many of the n sequences have been handed to the scheduler so far."""
    grammar: CompiledGrammar | None = None
    """The compiled grammar its outputs follow (params.structured), shared by the n outputs."""
    pooling: PoolingParams | None = None
    """Set for an embedding request: prefill only, `params` is a placeholder (one token)."""
    embedding: list[float] | None = None
    """An embedding request's vector, once its prompt has run."""
    lora_request: LoRARequest | None = None
    """The LoRA adapter its outputs run with (None: the base model)."""
    multimodal: MultiModalInputs | None = None
    """Its images; their tokens are placeholder ids (>= vocab_size) in prompt_token_ids."""
    text_prompt_ids: list[int] | None = None
    """With images: the prompt without the image tokens (what penalties and the detokenizer
    read); None: prompt_token_ids."""

    def text_ids(self) -> list[int]:
        """The prompt's token ids without image tokens (all of them for a text prompt)."""
        return self.prompt_token_ids if self.text_prompt_ids is None else self.text_prompt_ids

    @property
    def finished(self) -> bool:
        return len(self.seqs) == self.params.n and all(s.finished for s in self.seqs)
