"""Embeddings (stdlib only): how a model pools its hidden states, and what a request asks.

An embedding request is a prefill-only request: it runs through the same scheduler as any
other, its prompt's last chunk "samples" one placeholder token that is never kept, and the model
runner hands back the pooled hidden state instead (core/runner/pooler.py). Its KV pages are freed in
the same step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

POOLING_TYPES = ("last", "mean", "cls")
"""last: the final token's hidden state (Qwen3-Embedding, gte-Qwen2); mean: the average over
every prompt token; cls: the first token's."""


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

    def describe(self) -> str:
        """The start-up line's task part, e.g. "mean pooling, normalized, 384 dimensions"."""
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
