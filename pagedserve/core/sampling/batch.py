"""One step's sampling controls, gathered from the rows into tensors once per step.

Python walks the rows once here to read their parameters; everything after that (the
Sampler) is vectorized. Penalties, logit_bias and min_tokens are kept sparse: as flat indices
`row * vocab_size + token` into the step's logits, because they touch few tokens per row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedserve.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedserve.core.structured.state import GrammarState

GREEDY_TEMPERATURE = 1e-5
"""Temperatures below this sample greedily (dividing by them would overflow float32 logits)."""


@dataclass
class SamplingRow:
    """One row of the step's logits: one output sequence that samples a token now."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    """Generated so far (for penalties and min_tokens)."""
    generator: torch.Generator | None = None
    """The sequence's own RNG (seeded from params.seed); None: the global RNG."""
    grammar: GrammarState | None = None
    """The sequence's GrammarState (core.structured) when its output is constrained."""
    grammar_prefix: Sequence[int] = ()
    """Tokens the grammar takes as produced before this row's position (a verification
    chunk's drafts; its state itself stays as it is)."""


@dataclass
class LogitEdits:
    """Sparse edits of the logits, applied in this order (vLLM's): bias, bans, penalties."""

    bias_index: torch.Tensor
    bias: torch.Tensor
    ban_index: torch.Tensor
    """min_tokens not reached yet: EOS and stop token ids go to -inf."""
    repetition_index: torch.Tensor
    """Tokens seen in the prompt or the output (each once per row)."""
    repetition: torch.Tensor
    output_index: torch.Tensor
    """Tokens seen in the output (each once per row)."""
    frequency: torch.Tensor
    """frequency_penalty * the token's count in the output."""
    presence: torch.Tensor


@dataclass
class RandomRows:
    """The rows that sample (temperature > 0) and their controls, aligned with `rows`."""

    rows: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    """In [1, vocab_size]; vocab_size when off."""
    top_p: torch.Tensor
    min_p: torch.Tensor
    generators: list[torch.Generator | None]
    shared_generator: torch.Generator | None = None
    """Draws for the rows without their own generator (the engine's, seeded once from
    --seed); None: torch's global RNG."""


@dataclass
class SamplingBatch:
    num_rows: int
    vocab_size: int
    greedy_rows: torch.Tensor
    random: RandomRows | None
    edits: LogitEdits | None
    logprob_rows: list[int]
    logprob_ks: list[int]
    grammar_rows: list[int] = field(default_factory=list)
    """Rows whose output is constrained; `grammars` holds their states, aligned."""
    grammars: list[GrammarState] = field(default_factory=list)
    grammar_prefixes: list[Sequence[int]] = field(default_factory=list)
    """Aligned with `grammars`: SamplingRow.grammar_prefix."""

    @property
    def argmax_only(self) -> bool:
        """All rows greedy with nothing that changes or reports logits: just argmax."""
        return self.random is None and self.edits is None and not self.logprob_rows

    @classmethod
    def build(
        cls,
        rows: Sequence[SamplingRow],
        *,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        device: torch.device,
        shared_generator: torch.Generator | None = None,
    ) -> SamplingBatch:
        greedy = [i for i, r in enumerate(rows) if _is_greedy(r.params)]
        random = [i for i, r in enumerate(rows) if not _is_greedy(r.params)]
        asked = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        constrained = [i for i, r in enumerate(rows) if r.grammar is not None]
        return cls(
            num_rows=len(rows),
            vocab_size=vocab_size,
            greedy_rows=torch.tensor(greedy, dtype=torch.long, device=device),
            random=_random_rows(rows, random, vocab_size, device, shared_generator)
            if random
            else None,
            edits=_edits(rows, vocab_size, eos_token_ids, device),
            logprob_rows=asked,
            logprob_ks=[rows[i].params.logprobs or 0 for i in asked],
            grammar_rows=constrained,
            grammars=[g for g in (r.grammar for r in rows) if g is not None],
            grammar_prefixes=[r.grammar_prefix for r in rows if r.grammar is not None],
        )


def _is_greedy(params: SamplingParams) -> bool:
    return params.temperature < GREEDY_TEMPERATURE


def _random_rows(
    rows: Sequence[SamplingRow],
    picked: list[int],
    vocab_size: int,
    device: torch.device,
    shared_generator: torch.Generator | None,
) -> RandomRows:
    params = [rows[i].params for i in picked]
    top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
    return RandomRows(
        rows=torch.tensor(picked, dtype=torch.long, device=device),
        temperature=_floats([p.temperature for p in params], device),
        top_k=torch.tensor(top_k, dtype=torch.long, device=device),
        top_p=_floats([p.top_p for p in params], device),
        min_p=_floats([p.min_p for p in params], device),
        generators=[rows[i].generator for i in picked],
        shared_generator=shared_generator,
    )


def _edits(
    rows: Sequence[SamplingRow],
    vocab_size: int,
    eos_token_ids: frozenset[int],
    device: torch.device,
) -> LogitEdits | None:
    bias_index, bias = _bias(rows, vocab_size)
    ban_index = _bans(rows, vocab_size, eos_token_ids)
    rep_index, rep, out_index, freq, pres = _penalties(rows, vocab_size)
    if not (bias_index.size or ban_index.size or rep_index.size or out_index.size):
        return None
    return LogitEdits(
        bias_index=_longs(bias_index, device),
        bias=_floats(bias, device),
        ban_index=_longs(ban_index, device),
        repetition_index=_longs(rep_index, device),
        repetition=_floats(rep, device),
        output_index=_longs(out_index, device),
        frequency=_floats(freq, device),
        presence=_floats(pres, device),
    )


def _bias(rows: Sequence[SamplingRow], vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    index: list[int] = []
    values: list[float] = []
    for i, row in enumerate(rows):
        for token, value in row.params.logit_bias.items():
            if 0 <= token < vocab_size:  # the server refuses others; ignore them here
                index.append(i * vocab_size + token)
                values.append(value)
    return np.array(index, dtype=np.int64), np.array(values, dtype=np.float32)


def _bans(
    rows: Sequence[SamplingRow], vocab_size: int, eos_token_ids: frozenset[int]
) -> np.ndarray:
    index: list[int] = []
    for i, row in enumerate(rows):
        # A grammar decides itself when EOS may come; banning it could leave no token allowed.
        if row.grammar is None and len(row.output_token_ids) < row.params.min_tokens:
            banned = eos_token_ids.union(row.params.stop_token_ids)
            index.extend(i * vocab_size + t for t in sorted(banned) if 0 <= t < vocab_size)
    return np.array(index, dtype=np.int64)


def _penalties(
    rows: Sequence[SamplingRow], vocab_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unique (row, token) flat indices and per-index values for the three penalties."""
    rep_rows = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
    out_rows = [
        i
        for i, r in enumerate(rows)
        if r.params.frequency_penalty != 0.0 or r.params.presence_penalty != 0.0
    ]
    if not rep_rows and not out_rows:  # the common step: no penalties, nothing to build
        none, no_values = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        return none, no_values, none, no_values, no_values
    seen = _flat_tokens(
        rows, rep_rows, vocab_size, lambda r: (r.prompt_token_ids, r.output_token_ids)
    )
    rep_index = np.unique(seen)
    rep = _per_row(rows, rep_index // vocab_size, lambda p: p.repetition_penalty)
    emitted = _flat_tokens(rows, out_rows, vocab_size, lambda r: (r.output_token_ids,))
    out_index, counts = np.unique(emitted, return_counts=True)
    row_of = out_index // vocab_size
    freq = _per_row(rows, row_of, lambda p: p.frequency_penalty) * counts.astype(np.float32)
    pres = _per_row(rows, row_of, lambda p: p.presence_penalty)
    return rep_index, rep, out_index, freq, pres


def _flat_tokens(
    rows: Sequence[SamplingRow],
    picked: list[int],
    vocab_size: int,
    token_lists: Callable[[SamplingRow], tuple[Sequence[int], ...]],
) -> np.ndarray:
    parts = [np.zeros(0, dtype=np.int64)]
    for i in picked:
        for ids in token_lists(rows[i]):
            tokens = np.asarray(ids, dtype=np.int64)
            tokens = tokens[(tokens >= 0) & (tokens < vocab_size)]
            parts.append(tokens + i * vocab_size)
    return np.concatenate(parts)


def _per_row(
    rows: Sequence[SamplingRow], row_of: np.ndarray, value: Callable[[SamplingParams], float]
) -> np.ndarray:
    per_row = _to_float32([value(r.params) for r in rows])
    return per_row[row_of] if row_of.size else np.zeros(0, dtype=np.float32)


def _to_float32(values: Iterable[float] | np.ndarray) -> np.ndarray:
    """Saturating: a valid value beyond float32's range becomes its largest finite float, not
    inf (the kernels clamp what must not be 0 or inf)."""
    wide = np.asarray(values, dtype=np.float64)
    limit = np.finfo(np.float32).max
    return np.clip(wide, -limit, limit).astype(np.float32)


def _floats(values: Iterable[float] | np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(_to_float32(values)).to(device)


def _longs(values: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(values).to(device)
