"""Embeddings (stdlib only): how a model pools its hidden states, and what a request asks.

An embedding request is a prefill-only request: it runs through the same scheduler as any
other, its prompt's last chunk "samples" one placeholder token that is never kept, and the model
runner hands back the pooled hidden state instead (core/runner/pooler.py). Its KV pages are freed in
the same step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

POOLING_TYPES = ("last", "mean", "cls")
"""last: the final token's hidden state (Qwen3-Embedding, gte-Qwen2); mean: the average over
every prompt token; cls: the first token's."""


QWEN3_RERANKER_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
"""Qwen3-Reranker's prompt (its model card's, as vLLM's example formats it): the query comes
before the document, so every document of one query shares the prefix (and its cached pages)."""
QWEN3_RERANKER_INSTRUCTION = (
    "Given a web search query, retrieve relevant passages that answer the query"
)
_PLACEHOLDER = re.compile(r"\{(instruction|query|document)\}")


@dataclass(frozen=True)
class ScoreConfig:
    """How a decoder reranker scores a (query, document) pair: the prompt `template` ends where
    the model answers, and the score is softmax([logit(no), logit(yes)])[1] at its last
    position (read from the model's files: core/models/score_config.py)."""

    token_ids: tuple[int, int]
    """The ids of the "no" and the "yes" token."""
    tokens: tuple[str, str] = ("no", "yes")
    """The two tokens as spelled (vLLM's `classifier_from_token`: no first)."""
    template: str = QWEN3_RERANKER_TEMPLATE
    """The prompt, with {instruction}, {query} and {document} placeholders."""
    instruction: str = QWEN3_RERANKER_INSTRUCTION
    """What {instruction} becomes."""

    def __post_init__(self) -> None:
        if "{query}" not in self.template or "{document}" not in self.template:
            raise ValueError("score template must hold {query} and {document}")

    def render(self, query: str, document: str) -> str:
        """The template filled in one pass (a placeholder spelled inside the query or the
        document stays as it is)."""
        values = {"instruction": self.instruction, "query": query, "document": document}
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.template)


@dataclass(frozen=True)
class PoolerConfig:
    """How the model turns hidden states into one vector (read from sentence-transformers'
    files or GGUF metadata: core/models/pooling_config.py)."""

    pooling: str = "last"
    """One of POOLING_TYPES."""
    normalize: bool = True
    """L2-normalize each vector (sentence-transformers' Normalize module)."""
    dimensions: int = 0
    """Width of a full vector (the model's hidden size)."""
    matryoshka_dimensions: tuple[int, ...] | None = None
    """None: requests may not ask for fewer dimensions; (): any width in 1..dimensions
    (Matryoshka-trained); else only these widths."""
    prompts: Mapping[str, str] = field(default_factory=dict)
    """sentence-transformers' named prompts, prepended to text inputs."""
    default_prompt_name: str | None = None
    """The prompt applied when a request names none (sentence-transformers' default)."""
    score: ScoreConfig | None = None
    """Set for a reranker (task score): its "vector" is [the yes-probability] of the last
    position (pooling last, not normalized)."""

    @property
    def task(self) -> str:
        """ "score" for a reranker, else "embed"."""
        return "embed" if self.score is None else "score"

    def describe(self) -> str:
        """The start-up line's task part, e.g. "mean pooling, normalized, 384 dimensions"."""
        if self.score is not None:
            (no, yes), (no_id, yes_id) = self.score.tokens, self.score.token_ids
            return f"P({yes!r} [{yes_id}]) vs {no!r} [{no_id}] at the last position"
        normalized = ", normalized" if self.normalize else ""
        return f"{self.pooling} pooling{normalized}, {self.dimensions} dimensions"

    def __post_init__(self) -> None:
        if self.pooling not in POOLING_TYPES:
            raise ValueError(f"pooling must be one of {POOLING_TYPES}, got {self.pooling!r}")
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise ValueError(
                f"default_prompt_name {self.default_prompt_name!r} is not one of the prompts "
                f"{sorted(self.prompts)}"
            )
        if self.score is not None and (self.pooling != "last" or self.normalize):
            raise ValueError("a reranker's pooler pools the last token, not normalized")

    @property
    def uses_every_token(self) -> bool:
        """Mean and cls pooling need the hidden state of tokens a prefix-cache hit would skip."""
        return self.pooling != "last"

    def check_dimensions(self, dimensions: int | None) -> None:
        """ValueError (naming `dimensions`) unless the model gives vectors of this width."""
        if dimensions is None or dimensions == self.dimensions:
            return
        if self.matryoshka_dimensions is None:
            raise ValueError(
                f"dimensions: this model gives {self.dimensions}-dimensional embeddings and "
                "does not support fewer (it declares no Matryoshka training: is_matryoshka or "
                "matryoshka_dimensions in its config.json, or --matryoshka)"
            )
        allowed = self.matryoshka_dimensions
        if not 1 <= dimensions <= self.dimensions or (allowed and dimensions not in allowed):
            choices = list(allowed) if allowed else f"1..{self.dimensions}"
            raise ValueError(f"dimensions must be one of {choices}, got {dimensions}")


@dataclass(frozen=True)
class PoolingParams:
    """Per-request options of an embedding request."""

    dimensions: int | None = None
    """Matryoshka truncation: keep the first `dimensions` values, then renormalize (when the
    model normalizes); None: the full vector."""


@dataclass(frozen=True)
class PoolingSpec:
    """One embedding request's rows in a step (the engine builds it; the model runner pools)."""

    seq_id: int
    row_start: int
    """First token row of the request's chunk in the step's batch."""
    num_rows: int
    start: int
    """Prompt tokens computed before this chunk (0: the chunk starts the prompt)."""
    last: bool
    """The chunk ends the prompt: its vector is due this step."""
    dimensions: int | None = None
    """PoolingParams.dimensions."""
