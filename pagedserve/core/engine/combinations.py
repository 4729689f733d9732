"""What runs with what: the feature combinations the engine refuses at start-up, in one place.

Each check names the features and the one that would have to give way, so that a user who asks
for two things that do not yet run together reads why before any weights load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedserve.core.config import EngineConfig
from pagedserve.core.pooling_params import PoolerConfig

if TYPE_CHECKING:  # annotations only: the models package loads torch
    from pagedserve.core.models.arch import ArchConfig
    from pagedserve.core.models.resolve import ResolvedModel


def refuse_unsupported(
    config: EngineConfig, resolved: ResolvedModel, arch: ArchConfig, pooler: PoolerConfig | None
) -> None:
    """Raise ValueError naming the first combination of config's features that cannot run."""
    tp = config.parallel.tensor_parallel_size > 1
    draft = config.speculative.speculative_method == "draft"
    if tp:
        for feature, wanted in (
            (f"task {pooler.task if pooler else ''} runs", pooler is not None),
            ("speculative_method draft runs", draft),
        ):
            if wanted:
                raise ValueError(f"{feature} at tensor_parallel_size 1")
    if arch.vision is not None:
        name = f"{arch.architecture} (images)"
        if tp:
            raise ValueError(f"{name} runs at tensor_parallel_size 1")
        if pooler is not None:
            raise ValueError(f"{name} serves task generate, not {pooler.task}")
        if draft:
            raise ValueError(f"{name} does not take speculative_method draft")
        _refuse_split_images(config, name, arch.vision.tokens_per_image)


def _refuse_split_images(config: EngineConfig, name: str, num_tokens: int) -> None:
    """An image whose tokens attend to each other both ways (Gemma 3: num_tokens each) is
    computed in one chunk, so the step budgets must hold one (else it could wait forever)."""
    sched = config.scheduler
    for field, budget in (("max_num_batched_tokens", sched.max_num_batched_tokens),
                          ("max_prefill_tokens_while_decoding",
                           sched.max_prefill_tokens_while_decoding)):  # fmt: skip
        if num_tokens > budget:
            raise ValueError(
                f"{name}: an image's {num_tokens} tokens are computed in one chunk, so "
                f"{field} ({budget}) must be at least {num_tokens}"
            )
