"""Pooler: a step's hidden states -> one vector per finished embedding request.

Owned by the model runner (only it touches tensors). A prompt may arrive in several chunks
(chunked prefill), so mean and cls pooling keep a running fp32 sum / the first token's state per
sequence between steps; `release` drops it (finished, aborted). A chunk that starts at token 0
starts afresh, which is what a preempted (recomputed) request needs.

A reranker (task score, PoolerConfig.score) "pools" its last position through the LM head: the
score is softmax([logit(no), logit(yes)])[1], in fp32, one row per finished request, all of a
step's rows in one call of the head (its own kernels: packed, quantized, softcapped as it
generates), of which only the two columns are kept.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pagedserve.core.pooling_params import PoolerConfig, PoolingSpec


class Pooler:
    def __init__(
        self,
        config: PoolerConfig,
        head: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """`head`: the model's compute_logits ([n, hidden] -> [n, vocab] fp32), which a
        reranker's scores need."""
        assert config.score is None or head is not None, "a reranker scores through its head"
        self.config = config
        self.head = head
        self._partial: dict[int, torch.Tensor] = {}
        """seq_id -> fp32 [hidden]: the sum so far (mean) or the first token's state (cls)."""

    def __call__(self, hidden: torch.Tensor, specs: list[PoolingSpec]) -> dict[int, list[float]]:
        """hidden: [num_tokens, hidden_size] (the model's final-norm output) -> seq_id -> the
        vector of every spec whose prompt ends this step, as plain floats (a reranker's:
        [score])."""
        if self.config.score is not None:
            return self._score(hidden, specs)
        done: dict[int, list[float]] = {}
        for spec in specs:
            rows = hidden[spec.row_start : spec.row_start + spec.num_rows]
            vector = self._accumulate(spec, rows)
            if spec.last:
                self._partial.pop(spec.seq_id, None)
                done[spec.seq_id] = self._finish(vector, spec).tolist()
        return done

    def _score(self, hidden: torch.Tensor, specs: list[PoolingSpec]) -> dict[int, list[float]]:
        score, head = self.config.score, self.head
        assert score is not None and head is not None
        finished = [spec for spec in specs if spec.last]
        if not finished:
            return {}
        rows = torch.tensor([s.row_start + s.num_rows - 1 for s in finished], device=hidden.device)
        logits = head(hidden[rows])[:, list(score.token_ids)]  # [n, 2] fp32: no, yes
        yes = torch.softmax(logits.float(), dim=-1)[:, 1].cpu().tolist()
        return {spec.seq_id: [p] for spec, p in zip(finished, yes, strict=True)}

    def _accumulate(self, spec: PoolingSpec, rows: torch.Tensor) -> torch.Tensor:
        pooling = self.config.pooling
        if pooling == "last":
            return rows[-1].float()
        if pooling == "cls":
            if spec.start == 0:
                self._partial[spec.seq_id] = rows[0].float()
            return self._partial[spec.seq_id]
        total = rows.float().sum(dim=0)  # mean
        if spec.start > 0:
            total = total + self._partial[spec.seq_id]
        self._partial[spec.seq_id] = total
        return total / (spec.start + spec.num_rows)

    def _finish(self, vector: torch.Tensor, spec: PoolingSpec) -> torch.Tensor:
        if spec.dimensions is not None:
            vector = vector[: spec.dimensions]  # Matryoshka: the leading dimensions
        if self.config.normalize:
            vector = torch.nn.functional.normalize(vector, p=2.0, dim=0)
        return vector.cpu()

    def release(self, seq_id: int) -> None:
        self._partial.pop(seq_id, None)
