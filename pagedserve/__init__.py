"""pagedserve: an OpenAI-compatible LLM server over a paged KV cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from pagedserve.core.engine.llm import LLM
    from pagedserve.core.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    # Lazy, so `import pagedserve` (e.g. by the CLI's --help) does not load torch.
    if name == "LLM":
        from pagedserve.core.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from pagedserve.core.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
