"""Vectorized selection kernels over a step's rows: argmax, inverse-CDF draws, top-k, top-p.

On the CPU, `argmax`, `sort` and boolean masks over [64, 49152] are slow, while reductions over
fixed-size chunks and arithmetic with `threshold_` are fast (figures in bench/RESULTS.md). So
the kernels work per chunk of CHUNK tokens and filter by scaling each row so that its cut-off
becomes the scalar 1.0.

Every kernel treats rows independently and reduces each row in an order that does not depend on
the other rows, so a seeded row draws the same token whatever shares the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

CHUNK = 256
"""Tokens per chunk in the two-level reductions."""
BELOW_ONE = 1.0 - 2.0**-24
"""The float32 just below 1.0: `x > BELOW_ONE` is `x >= 1.0`, exactly."""
UniformSource = Callable[[torch.Tensor], torch.Tensor]
"""Positions of rows -> float64 uniforms in [0, 1), one per row, each from that row's RNG."""
TOP_K_CHUNK = 64
"""Tokens per chunk when narrowing top-k candidates by chunk maxima."""
MAX_NUCLEUS_ROUNDS = 32
"""Rejection rounds for top-p; each shrinks the rejected tail by a uniform factor on average."""


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, -1) (first maximum on ties), through per-chunk maxima: [n, v] -> [n]."""
    n, v = x.shape
    if v < 2 * CHUNK:
        return x.argmax(-1)
    chunk = _chunk_reduce(x, "amax").argmax(-1)
    cols, valid = _chunk_columns(chunk, v)
    inner = x.gather(1, cols).masked_fill_(~valid, float("-inf")).argmax(-1)
    return chunk * CHUNK + inner


def chunk_sums(q: torch.Tensor) -> torch.Tensor:
    """Per-chunk sums of q [n, v] in float64: [n, ceil(v / CHUNK)]."""
    return _chunk_reduce(q, "sum")


def sample_from(q: torch.Tensor, u: torch.Tensor, sums: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse-CDF draw per row from unnormalized weights q [n, v] >= 0 with uniforms u [n].

    Returns the first token whose cumulative weight exceeds u * total; a zero-weight token is
    never returned (except for an all-zero row, which returns its first positive chunk's token 0).
    """
    if sums is None:
        sums = chunk_sums(q)
    cum = sums.cumsum(-1)
    target = (u * cum[:, -1])[:, None]
    chunk = _first_above(cum, target)
    cols, valid = _chunk_columns(chunk, q.shape[1])
    weights = q.gather(1, cols).double() * valid
    rest = target - (cum - sums).gather(1, chunk[:, None])
    return chunk * CHUNK + _first_above(weights.cumsum(-1), rest)


def filter_below(q: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """q / floor with every entry below floor set to 0 (rows rescaled, in place): [n, v], [n]."""
    q.div_(floor[:, None])
    return torch.threshold_(q, BELOW_ONE, 0.0)


def sample_top_k(
    probs: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    u: torch.Tensor,
) -> torch.Tensor:
    """Draw among each row's top_k tokens that pass min_p, then top_p over that renormalized set.

    probs [n, v] (softmax after temperature); top_k [n] in [1, v]; top_p, min_p [n]; u [n].
    """
    vals, idx = top_k_candidates(probs, int(top_k.max()))  # sorted, most likely first
    floor = min_p * vals[:, 0]
    keep = torch.arange(vals.shape[1], device=vals.device) < top_k[:, None]
    keep &= vals >= floor[:, None]
    weights = vals.double() * keep
    cum = weights.cumsum(-1)  # sequential, so padding columns never change a row's sums
    keep &= (cum - weights) < top_p.double()[:, None] * cum[:, -1:]
    keep[:, 0] = True  # the most likely token, even when a tiny top_p rounds to 0 in float32
    weights *= keep
    cum = weights.cumsum(-1)
    pos = (cum <= (u * cum[:, -1])[:, None]).sum(-1)
    pos = torch.minimum(pos, keep.sum(-1) - 1)  # keep is a prefix of the sorted columns
    return idx.gather(1, pos[:, None]).squeeze(1)


def top_k_candidates(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x.topk(k) (values, indices), searched only in the k chunks with the largest maxima.

    Each of the k largest entries lies in one of those chunks: a chunk outside them has k
    chunks whose maxima (k other entries) are at least its own maximum.
    """
    n, v = x.shape
    num_chunks = -(-v // TOP_K_CHUNK)
    if 2 * k >= num_chunks:  # no saving: most of the vocabulary would be gathered
        return x.topk(k, dim=-1)
    maxima = _chunk_reduce(x, "amax", TOP_K_CHUNK)
    chunks = maxima.topk(k, dim=-1).indices
    cols = (chunks[:, :, None] * TOP_K_CHUNK + torch.arange(TOP_K_CHUNK, device=x.device)).flatten(
        1
    )
    valid = cols < v
    candidates = x.gather(1, cols.clamp_(max=v - 1)).masked_fill_(~valid, float("-inf"))
    vals, pos = candidates.topk(k, dim=-1)
    return vals, cols.gather(1, pos)


def sample_nucleus(q: torch.Tensor, top_p: torch.Tensor, draw: UniformSource) -> torch.Tensor:
    """Draw from q [n, v] >= 0 (overwritten) restricted to its top-p nucleus, by rejection.

    A token j is in the nucleus iff the weight of the tokens strictly more likely than j is
    < top_p * total. Draw from the current weights; accept if j is in the nucleus, otherwise
    drop every token no more likely than j and draw again. `draw(rows)` gives the uniforms of
    the given row positions (each row's own generator, so rows stay independent).
    """
    n = q.shape[0]
    tokens = torch.empty(n, dtype=torch.long, device=q.device)
    active = torch.arange(n, device=q.device)
    sums = chunk_sums(q)
    limit = top_p.double() * sums.sum(-1)
    scale = torch.ones(n, dtype=torch.float64, device=q.device)  # original q = current q * scale
    for _ in range(MAX_NUCLEUS_ROUNDS):
        picked = sample_from(q, draw(active), sums)
        value = q.gather(1, picked[:, None])
        # q / value > 1.0 exactly when q > value (no float32 quotient of q > value rounds to 1).
        above = torch.threshold_(q.div_(value), 1.0, 0.0)
        sums = chunk_sums(above)
        above_mass = sums.sum(-1)
        # Nothing strictly more likely: the row's top token, in every nucleus (also when a
        # tiny top_p rounded to 0 in float32 and the strict test below cannot pass).
        accepted = (above_mass * value[:, 0].double() * scale < limit) | (above_mass == 0)
        tokens[active[accepted]] = picked[accepted]
        rejected = (~accepted).nonzero()[:, 0]
        if rejected.numel() == 0:
            return tokens
        scale = scale[rejected] * value[rejected, 0].double()
        q = above.index_select(0, rejected)  # whole-row copies, unlike above[rejected]
        sums, limit, active = sums[rejected], limit[rejected], active[rejected]
    # Practically unreachable; the most likely remaining token is always in the nucleus.
    tokens[active] = argmax_rows(q)
    return tokens


def _chunk_reduce(x: torch.Tensor, op: str, size: int = CHUNK) -> torch.Tensor:
    n, v = x.shape
    full = v // size * size
    # torch's Tensor.unflatten carries no annotations.
    body = x[:, :full].unflatten(1, (full // size, size))  # type: ignore[no-untyped-call]
    parts = [_reduce(body, op)]
    if full < v:
        parts.append(_reduce(x[:, full:].unsqueeze(1), op))
    return torch.cat(parts, 1) if len(parts) > 1 else parts[0]


def _reduce(x: torch.Tensor, op: str) -> torch.Tensor:
    # float32 sums of CHUNK values are much faster than float64 accumulation, and precise enough
    return x.amax(-1) if op == "amax" else x.sum(-1).double()


def _chunk_columns(chunk: torch.Tensor, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns of each row's chosen chunk, clamped into range, and which of them are real."""
    cols = chunk[:, None] * CHUNK + torch.arange(CHUNK, device=chunk.device)
    valid = cols < v
    return cols.clamp_(max=v - 1), valid


def _first_above(cum: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose cumulative weight exceeds target [n, 1], clamped to the
    index where cum reaches its total (the last entry with weight), so a zero-weight entry is
    never picked even when rounding puts target at the total."""
    picked = torch.searchsorted(cum, target, right=True)
    last = torch.searchsorted(cum, cum[:, -1:].contiguous(), right=False)
    return torch.minimum(picked, last).squeeze(1)
