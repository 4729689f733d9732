"""The linear layers whose outputs meet across tensor-parallel ranks (models/tensor_parallel.py
decides which layers they replace and cuts their weights): row-parallel (o_proj, down_proj:
partial sums all-reduced) and the vocabulary-parallel LM head (logit slices gathered on rank 0).
Column-parallel layers need no class: a plain Linear over this rank's slice of the outputs.

LoRA adapters sit on each as on the layer at one rank (lora/weights.py's grouped product), over
this rank's share of the adapter (lora/parallel.py): a row-parallel layer adds x_r A_r B to its
partial sum, and the one all-reduce sums them with the base's."""

from __future__ import annotations

from typing import Any

import torch

from pagedserve.core.distributed.group import TPGroup
from pagedserve.core.lora.weights import LoraBatch
from pagedserve.core.models.linear.dense import Linear


class RowParallelLinear(Linear):
    """x's slice of the input features times the matching weight columns, summed over ranks;
    the residual and bias enter on rank 0 only (so once)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, group: TPGroup) -> None:
        super().__init__(in_features, out_features, bias)
        self.group = group

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        *,
        out_dtype: torch.dtype | None = None,
        lora: LoraBatch | None = None,  # the step's adapter rows (None: base rows only)
    ) -> torch.Tensor:
        residual = residual if self.group.is_first else None
        partial = super().forward(x, residual, out_dtype=out_dtype, lora=lora)
        return self.group.all_reduce(partial)


class ParallelLMHead(Linear):
    """This rank's vocabulary slice of the logits, gathered into whole rows on rank 0."""

    def __init__(self, in_features: int, out_features: int, group: TPGroup) -> None:
        super().__init__(in_features, out_features)
        self.group = group

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        # [m, vocab] on rank 0, [m, vocab / tp] elsewhere; Linear.forward's arguments
        return self.group.gather_columns(super().forward(x, *args, **kwargs))
