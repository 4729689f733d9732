"""The batched sampler: every row of a step's logits, all controls, in one vectorized pass.

Per step: the engine builds a SamplingBatch from its SamplingRows, then calls
`Sampler()(logits, batch)`. Order of work for the rows:

1. logprobs (rows that asked): log_softmax of the raw logits, before any control (vLLM).
   Then grammar masks: one pass over the constrained rows (core.structured), -inf for every
   token their grammar forbids; unconstrained rows are not touched.
2. logit_bias, min_tokens bans, repetition / frequency / presence penalties (sparse edits).
3. greedy rows (temperature 0): argmax of the edited logits.
4. sampling rows: logits / temperature -> softmax -> min_p and top_k keep the intersection of
   their sets -> top_p over that renormalized set -> one draw.

Randomness: each draw takes a uniform from the row's own torch.Generator, so a seeded row gets
the same token whatever else is in the batch and in whichever order; rows without one share a
draw from the global RNG. Rows with top_k pick among torch.topk candidates; the others draw
from the whole vocabulary by inverse CDF, with top_p by rejection (no sort of the vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.core.outputs import TokenLogprob
from pagedserve.core.sampling import kernels
from pagedserve.core.sampling.batch import RandomRows, SamplingBatch, SamplingRow
from pagedserve.core.sampling.logits import apply_edits
from pagedserve.core.sampling.logprobs import prompt_logprobs, token_logprobs
from pagedserve.core.structured.bitmask import GrammarMasker

__all__ = [
    "Sampler",
    "SamplerOutput",
    "SamplingBatch",
    "SamplingRow",
    "apply_edits",
    "prompt_logprobs",
]


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor
    """int64 [N], on the CPU."""
    logprobs: list[TokenLogprob | None] | None
    """Per row when any row asked (None for the rows that did not); None otherwise."""


class Sampler:
    """One instance serves every step; its only state is the grammar bitmask buffer."""

    def __init__(self) -> None:
        self._masker = GrammarMasker()

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """Sample one token per row of logits [N, vocab] (float32; overwritten as scratch)."""
        if logits.shape != (batch.num_rows, batch.vocab_size):
            raise ValueError(
                f"logits: shape {tuple(logits.shape)}, expected "
                f"({batch.num_rows}, {batch.vocab_size}) for this batch"
            )
        logits = logits.float().contiguous()
        raw_logprobs = _raw_logprobs(logits, batch.logprob_rows) if batch.logprob_rows else None
        if batch.grammar_rows:
            self._masker.apply(logits, batch.grammar_rows, batch.grammars, batch.grammar_prefixes)
        if batch.argmax_only:
            return SamplerOutput(kernels.argmax_rows(logits).cpu(), None)
        if batch.edits is not None:
            apply_edits(logits, batch.edits)
        tokens = torch.empty(batch.num_rows, dtype=torch.long, device=logits.device)
        if batch.greedy_rows.numel():
            tokens[batch.greedy_rows] = kernels.argmax_rows(_take(logits, batch.greedy_rows))
        if batch.random is not None:
            tokens[batch.random.rows] = _sample(logits, batch.random)
        return SamplerOutput(tokens.cpu(), _logprobs(raw_logprobs, tokens, batch))


def _sample(logits: torch.Tensor, random: RandomRows) -> torch.Tensor:
    """Tokens for the sampling rows, aligned with random.rows."""
    x = _take(logits, random.rows)  # scratch: the step's logits, or these rows' copy
    probs = torch.softmax(x.div_(random.temperature[:, None]), dim=-1, out=_scratch(x))
    draw = _UniformDraw(random.generators, probs.device, random.shared_generator)
    tokens = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    with_k = random.top_k < probs.shape[1]
    if bool(with_k.any()):
        sel = with_k.nonzero()[:, 0]
        tokens[sel] = kernels.sample_top_k(
            _take(probs, sel), random.top_k[sel], random.top_p[sel], random.min_p[sel], draw(sel)
        )
    if not bool(with_k.all()):
        sel = (~with_k).nonzero()[:, 0]
        q = _take(probs, sel)
        tokens[sel] = _sample_vocabulary(q, random.top_p[sel], random.min_p[sel], draw, sel)
    return tokens


def _sample_vocabulary(
    q: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    draw: _UniformDraw,
    rows: torch.Tensor,
) -> torch.Tensor:
    """Draw from whole-vocabulary rows q (owned here, filtered in place) after min_p, top_p."""
    with_min_p = min_p > 0
    if bool(with_min_p.any()):
        sel = with_min_p.nonzero()[:, 0]
        floor = min_p[sel] * q.amax(-1)[sel]
        if sel.numel() == q.shape[0]:
            kernels.filter_below(q, floor)
        else:
            q.index_copy_(0, sel, kernels.filter_below(q.index_select(0, sel), floor))
    tokens = torch.empty(q.shape[0], dtype=torch.long, device=q.device)
    with_p = top_p < 1.0
    if not bool(with_p.all()):
        sel = (~with_p).nonzero()[:, 0]
        tokens[sel] = kernels.sample_from(_take(q, sel), draw(rows[sel]))
    if bool(with_p.any()):
        sel = with_p.nonzero()[:, 0]
        nucleus_rows = rows[sel]
        tokens[sel] = kernels.sample_nucleus(
            _take(q, sel), top_p[sel], lambda positions: draw(nucleus_rows[positions])
        )
    return tokens


def _raw_logprobs(logits: torch.Tensor, logprob_rows: list[int]) -> torch.Tensor:
    """log_softmax of the raw logits of the rows that asked (sorted row indices): one new
    [rows, vocab] tensor, the rows' copy itself when only some asked (the logits stay intact
    for the controls and the draws)."""
    if len(logprob_rows) == logits.shape[0]:
        return torch.log_softmax(logits, dim=-1)
    picked = logits.index_select(0, torch.tensor(logprob_rows, device=logits.device))
    return torch.log_softmax(picked, dim=-1, out=_scratch(picked))


def _scratch(x: torch.Tensor) -> torch.Tensor | None:
    """x as the `out` of a softmax or log_softmax of x, on the CPU: one [rows, vocab] tensor
    fewer per step, with the same bits (the CPU kernels read each element before writing it;
    tests/core/test_sampler.py checks it). None (a new tensor) elsewhere, until checked there."""
    return x if x.device.type == "cpu" else None


def _take(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x[rows], without the copy when rows (sorted, unique) is every row: x itself.

    index_select copies whole rows; x[rows] (aten::index) is much slower on the CPU."""
    return x if rows.numel() == x.shape[0] else x.index_select(0, rows)


class _UniformDraw:
    """Uniforms in [0, 1) (float64) for rows given by position among the sampling rows."""

    def __init__(
        self,
        generators: list[torch.Generator | None],
        device: torch.device,
        shared: torch.Generator | None = None,
    ) -> None:
        self._generators = generators
        self._device = device
        self._shared = shared

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        picked = [self._generators[i] for i in rows.tolist()]
        shared = [i for i, g in enumerate(picked) if g is None]
        u = torch.empty(len(picked), dtype=torch.float64, device=self._device)
        if shared:
            u[shared] = torch.rand(
                len(shared), dtype=torch.float64, device=self._device, generator=self._shared
            )
        for i, g in enumerate(picked):
            if g is not None:  # per-row draws: the only Python loop over rows
                u[i] = torch.rand(1, dtype=torch.float64, generator=g, device=g.device)[0].to(
                    u.device
                )
        return u


def _logprobs(
    raw_logprobs: torch.Tensor | None, tokens: torch.Tensor, batch: SamplingBatch
) -> list[TokenLogprob | None] | None:
    if raw_logprobs is None:
        return None
    rows = torch.tensor(batch.logprob_rows, device=tokens.device)
    found = token_logprobs(raw_logprobs, tokens[rows], batch.logprob_ks)
    out: list[TokenLogprob | None] = [None] * batch.num_rows
    for row, logprob in zip(batch.logprob_rows, found, strict=True):
        out[row] = logprob
    return out
