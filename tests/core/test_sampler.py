"""The batched sampler against slow, obvious per-row references."""

from __future__ import annotations

import dataclasses
import math
import os
import random
import subprocess
import sys

import pytest
import torch

from pagedserve.core.outputs import TokenLogprob
from pagedserve.core.sampling import kernels
from pagedserve.core.sampling.sampler import (
    Sampler,
    SamplingBatch,
    SamplingRow,
    apply_edits,
    prompt_logprobs,
)
from pagedserve.core.sampling_params import SamplingParams

V = 700  # > 2 chunks of kernels.CHUNK, with a partial last chunk
EOS = frozenset({0, 3})
CPU = torch.device("cpu")


def build(rows: list[SamplingRow], vocab_size: int = V) -> SamplingBatch:
    return SamplingBatch.build(rows, vocab_size=vocab_size, eos_token_ids=EOS, device=CPU)


def row(params: SamplingParams, prompt=(1, 2), output=(), seed: int | None = None) -> SamplingRow:
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return SamplingRow(params, list(prompt), list(output), generator)


def sample(logits: torch.Tensor, rows: list[SamplingRow]):
    return Sampler()(logits.clone(), build(rows, logits.shape[1]))


# ---- slow references ------------------------------------------------------------------------


def reference_edit(x: torch.Tensor, r: SamplingRow) -> torch.Tensor:
    """The documented formulas, token by token, on one row of float32 logits."""
    x = x.clone()
    p = r.params
    for token, bias in p.logit_bias.items():
        if 0 <= token < x.shape[0]:
            x[token] += bias
    if len(r.output_token_ids) < p.min_tokens:
        for token in EOS | set(p.stop_token_ids):
            if token < x.shape[0]:
                x[token] = float("-inf")
    for token in set(r.prompt_token_ids) | set(r.output_token_ids):
        rp = torch.tensor(p.repetition_penalty, dtype=torch.float32)
        x[token] = x[token] / rp if x[token] > 0 else x[token] * rp
    for token in set(r.output_token_ids):
        count = r.output_token_ids.count(token)
        x[token] = x[token] - torch.tensor(p.frequency_penalty) * count
        x[token] = x[token] - torch.tensor(p.presence_penalty)
    return x


def reference_distribution(x: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, then min_p and top_k, then top_p (sorted, per row)."""
    probs = torch.softmax(x / torch.tensor(p.temperature), dim=-1)
    order = sorted(range(probs.shape[0]), key=lambda t: -probs[t].item())
    k = p.top_k if p.top_k > 0 else probs.shape[0]
    floor = torch.tensor(p.min_p) * probs.max()
    kept = [t for t in order[:k] if probs[t] >= floor]
    total = sum(probs[t].item() for t in kept)
    nucleus, cum = [], 0.0
    for t in kept:  # smallest prefix whose mass reaches top_p of the kept mass
        if cum >= p.top_p * total:
            break
        nucleus.append(t)
        cum += probs[t].item()
    out = torch.zeros_like(probs, dtype=torch.float64)
    for t in nucleus:
        out[t] = probs[t].item()
    return out / out.sum()


def assert_matches(counts: torch.Tensor, expected: torch.Tensor) -> None:
    """Sampled tokens lie in the support, and a chi-square test accepts the frequencies."""
    draws = int(counts.sum())
    outside = counts[expected == 0].sum().item()
    assert outside == 0, f"{outside} draws outside the allowed set"
    big = expected * draws >= 5  # merge the rare tokens into one bin
    obs = torch.cat([counts[big].double(), counts[~big].sum().double()[None]])
    exp = torch.cat([expected[big] * draws, (expected[~big].sum() * draws)[None]])
    mask = exp > 0
    chi2 = (((obs - exp) ** 2)[mask] / exp[mask]).sum().item()
    df = max(int(mask.sum()) - 1, 1)
    assert chi2 < df + 6 * math.sqrt(2 * df), f"chi2 {chi2:.1f} with {df} degrees of freedom"


def draw_counts(x: torch.Tensor, params: SamplingParams, draws: int) -> torch.Tensor:
    logits = x.expand(draws, -1).contiguous()
    tokens = sample(logits, [row(params) for _ in range(draws)]).token_ids
    return torch.bincount(tokens, minlength=x.shape[0])


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(1234)
    random.seed(1234)


def peaked_logits(vocab: int = V) -> torch.Tensor:
    """A distribution with a head of a few dozen likely tokens and a long tail."""
    return torch.randn(vocab) * 2.5


# ---- greedy ---------------------------------------------------------------------------------


def test_greedy_is_argmax_with_first_index_on_ties() -> None:
    logits = torch.randn(9, V)
    logits[1, [5, 400, 690]] = 50.0  # ties across chunks and in the partial last chunk
    logits[2, [699, 698]] = 50.0
    logits[3] = 0.0
    out = sample(logits, [row(SamplingParams(temperature=0)) for _ in range(9)])
    assert out.token_ids.dtype == torch.int64 and out.token_ids.device.type == "cpu"
    assert torch.equal(out.token_ids, logits.argmax(-1))
    assert out.logprobs is None


def test_argmax_rows_matches_torch_for_many_shapes() -> None:
    for vocab in (3, 511, 512, 513, 1000, 4096):
        x = torch.randint(-3, 3, (7, vocab)).float()  # many ties
        assert torch.equal(kernels.argmax_rows(x), x.argmax(-1)), vocab


def test_argmax_only_fast_path_is_taken_only_without_controls() -> None:
    assert build([row(SamplingParams(temperature=0))]).argmax_only
    for params in (
        SamplingParams(temperature=0, logprobs=0),
        SamplingParams(temperature=0, presence_penalty=0.5),
        SamplingParams(temperature=0, logit_bias={7: 1.0}),
        SamplingParams(temperature=0, min_tokens=2),
        SamplingParams(temperature=0.5),
    ):
        assert not build([row(params, output=[7])]).argmax_only, params


def test_greedy_uses_edited_logits() -> None:
    logits = torch.randn(2, V)
    params = SamplingParams(temperature=0, logit_bias={42: 100.0})
    out = sample(logits, [row(params), row(SamplingParams(temperature=0))])
    assert out.token_ids.tolist() == [42, logits[1].argmax().item()]


# ---- sampling controls against the reference distribution ----------------------------------


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.6),
        SamplingParams(temperature=1.3, top_k=12),
        SamplingParams(temperature=0.9, top_p=0.6),
        SamplingParams(temperature=1.0, top_p=0.15),
        SamplingParams(temperature=1.0, min_p=0.08),
        SamplingParams(temperature=0.8, top_k=30, top_p=0.7, min_p=0.02),
        SamplingParams(temperature=1.2, top_p=0.8, min_p=0.05),
        SamplingParams(temperature=1.0, top_k=1),
    ],
    ids=["t1", "t0.6", "top_k", "top_p", "top_p_small", "min_p", "k_p_minp", "p_minp", "k1"],
)
def test_distribution_matches_reference(params: SamplingParams) -> None:
    x = peaked_logits()
    counts = draw_counts(x, params, draws=3000)
    assert_matches(counts, reference_distribution(x, params))


def test_min_p_one_keeps_exactly_the_most_likely_tokens() -> None:
    x = peaked_logits()
    x[[10, 650]] = x.max() + 1.0  # a tie for the top, in different chunks
    for top_k in (0, 50):  # the whole-vocabulary path and the top-k path
        counts = draw_counts(x, SamplingParams(min_p=1.0, top_k=top_k), draws=400)
        assert set(counts.nonzero()[:, 0].tolist()) == {10, 650}, top_k


@pytest.mark.parametrize("top_k", [0, 50])  # the whole-vocabulary path and the top-k path
def test_top_p_below_float32_range_keeps_the_most_likely_token(top_k: int) -> None:
    """top_p = 3.75e-216 is valid (> 0) but 0 in float32: the nucleus is still the top token
    (found by bench/serving/fuzz_long.py as a 500: nothing was kept and the draw indexed column -1)."""
    x = peaked_logits()
    top = int(x.argmax())
    counts = draw_counts(x, SamplingParams(top_p=3.75e-216, top_k=top_k), draws=200)
    assert counts.nonzero()[:, 0].tolist() == [top]


@pytest.mark.parametrize("penalty", [5.08e-114, 1e-40, 1e300])
def test_repetition_penalty_beyond_float32_range_stays_finite(penalty: float) -> None:
    """Valid (> 0) penalties that round to 0 or inf in float32 (the fuzz found a 500 at
    5.08e-114): no NaN reaches the softmax; a tiny penalty makes a seen token with a positive
    logit the only choice, a huge one never picks a seen token over the rest."""
    x = torch.full((V,), -1.0)
    x[5], x[9], x[20] = 2.0, 1.0, 1.5  # 5 and 9 are in the prompt below, 20 is not
    params = SamplingParams(repetition_penalty=penalty, seed=3)
    tokens = [sample(x[None, :], [row(params, prompt=(5, 9), seed=i)]).token_ids[0].item()
              for i in range(20)]  # fmt: skip
    if penalty < 1:
        assert set(tokens) == {5}
    else:
        assert not {5, 9} & set(tokens)


def test_nucleus_by_rejection_over_a_flat_tail() -> None:
    # A head of 3 tokens holding 30% and a flat tail: top_p 0.3 forces many rejections.
    x = torch.zeros(V)
    x[:3] = torch.tensor([6.2, 6.0, 5.8])
    params = SamplingParams(top_p=0.3)
    counts = draw_counts(x, params, draws=2000)
    expected = reference_distribution(x, params)
    assert int((expected > 0).sum()) >= 2
    assert_matches(counts, expected)


def test_sample_from_never_picks_zero_weight_tokens() -> None:
    q = torch.zeros(4, V)
    q[0, 0] = 1.0
    q[1, V - 1] = 1.0
    q[2, [300, 301]] = torch.tensor([1e-30, 1.0])
    q[3, ::7] = 1.0
    for u in (0.0, 0.5, 1.0 - 1e-16, 1.0):  # 1.0: the top edge that rounding can reach
        picked = kernels.sample_from(q, torch.full((4,), u, dtype=torch.float64))
        assert (q.gather(1, picked[:, None]) > 0).all(), (u, picked)


def test_mixed_batch_each_row_keeps_its_own_controls() -> None:
    x = peaked_logits()
    allowed = {
        "k": SamplingParams(top_k=5),
        "p": SamplingParams(top_p=0.4),
        "m": SamplingParams(min_p=0.3),
        "g": SamplingParams(temperature=0),
    }
    names = [random.choice(list(allowed)) for _ in range(400)]
    out = sample(x.expand(len(names), -1).contiguous(), [row(allowed[n]) for n in names])
    support = {n: reference_distribution(x, p) > 0 for n, p in allowed.items() if n != "g"}
    for name, token in zip(names, out.token_ids.tolist(), strict=True):
        if name == "g":
            assert token == x.argmax().item()
        else:
            assert support[name][token], (name, token)


# ---- seeds ----------------------------------------------------------------------------------


SEEDED = [
    SamplingParams(seed=1, temperature=0.9),
    SamplingParams(seed=2, top_k=20),
    SamplingParams(seed=3, top_p=0.5),
    SamplingParams(seed=4, min_p=0.05, top_p=0.9),
]


def run_seeded(target: SamplingParams, x: torch.Tensor, others: int, position: int) -> list[int]:
    generator = torch.Generator().manual_seed(target.seed or 0)
    tokens = []
    for _ in range(5):  # several steps: the generator's state carries over
        rows = [
            row(SamplingParams(temperature=1.0, top_k=random.choice([0, 5]))) for _ in range(others)
        ]
        logits = [torch.randn(V) for _ in range(others)]
        rows.insert(position, SamplingRow(target, [1], [], generator))
        logits.insert(position, x)
        tokens.append(sample(torch.stack(logits), rows).token_ids[position].item())
    return tokens


@pytest.mark.parametrize("params", SEEDED, ids=["temp", "top_k", "top_p", "min_p"])
def test_seeded_row_ignores_the_rest_of_the_batch(params: SamplingParams) -> None:
    x = peaked_logits()
    alone = run_seeded(params, x, others=0, position=0)
    assert run_seeded(params, x, others=6, position=3) == alone
    assert run_seeded(params, x, others=3, position=3) == alone
    assert len(set(run_seeded(SamplingParams(seed=99, temperature=1.5), x, 2, 1))) > 1


# ---- logits edits ---------------------------------------------------------------------------


def test_edits_follow_the_formulas_exactly() -> None:
    rows = [
        row(SamplingParams(repetition_penalty=1.3), prompt=[5, 6, 5], output=[7, 6]),
        row(SamplingParams(frequency_penalty=0.7, presence_penalty=-0.4), output=[9, 9, 9, 10]),
        row(
            SamplingParams(
                repetition_penalty=0.8,
                frequency_penalty=-1.1,
                presence_penalty=1.5,
                logit_bias={11: 2.5, 12: -100.0, 5000: 1.0, -2: 3.0},
            ),
            prompt=[11, 12, 13],
            output=[13, 14, 14],
        ),
        row(SamplingParams(min_tokens=3, stop_token_ids=(20, 9999)), output=[1, 2]),
        row(SamplingParams(min_tokens=2, stop_token_ids=(20,)), output=[1, 2]),
        row(SamplingParams(ignore_eos=True)),
    ]
    logits = torch.randn(len(rows), V) * 3
    edited = logits.clone()
    batch = build(rows)
    assert batch.edits is not None
    apply_edits(edited, batch.edits)
    for i, r in enumerate(rows):
        assert torch.equal(edited[i], reference_edit(logits[i], r)), i
    assert torch.isinf(edited[3, [0, 3, 20]]).all() and not torch.isinf(edited[4]).any()


def test_out_of_vocabulary_ids_are_ignored() -> None:
    r = row(
        SamplingParams(repetition_penalty=2.0, presence_penalty=1.0, logit_bias={V: 5.0}),
        prompt=[V, V + 5, -1],
        output=[V + 1],
    )
    batch = build([r])
    assert batch.edits is None


def test_min_tokens_bans_eos_and_stop_ids_until_reached() -> None:
    x = torch.full((V,), -5.0)
    x[[0, 3, 20]] = 10.0  # EOS ids and a stop id dominate
    params = SamplingParams(min_tokens=2, stop_token_ids=(20,))
    early = sample(x.expand(200, -1).contiguous(), [row(params, output=[4]) for _ in range(200)])
    assert not set(early.token_ids.tolist()) & {0, 3, 20}
    late = sample(x.expand(200, -1).contiguous(), [row(params, output=[4, 4]) for _ in range(200)])
    assert set(late.token_ids.tolist()) <= {0, 3, 20}
    greedy = SamplingParams(temperature=0, min_tokens=1, ignore_eos=True)
    assert sample(x[None], [row(greedy)]).token_ids.item() not in {0, 3}


# ---- logprobs -------------------------------------------------------------------------------


def reference_logprob(x: torch.Tensor, token: int, k: int) -> TokenLogprob:
    lp = torch.log_softmax(x, dim=-1)
    order = sorted(range(x.shape[0]), key=lambda t: -lp[t].item())
    rank = 1 + sum(1 for t in range(x.shape[0]) if lp[t] > lp[token])
    return TokenLogprob(token, lp[token].item(), rank, [(t, lp[t].item()) for t in order[:k]])


def test_logprobs_are_raw_log_softmax_with_rank_and_top_k() -> None:
    logits = torch.randn(5, V) * 2
    rows = [
        row(SamplingParams(temperature=0, logprobs=3)),
        row(SamplingParams(temperature=0.7, top_k=4, logprobs=5, presence_penalty=2.0), output=[1]),
        row(SamplingParams(temperature=1.0)),
        row(SamplingParams(temperature=1.0, logprobs=0, logit_bias={8: 30.0})),
        row(SamplingParams(temperature=0, repetition_penalty=3.0, logprobs=20), output=[2]),
    ]
    out = sample(logits, rows)
    assert out.logprobs is not None and out.logprobs[2] is None
    assert out.token_ids[3].item() == 8  # the bias steers the draw, not the reported logprob
    for i in (0, 1, 3, 4):
        got = out.logprobs[i]
        assert got is not None
        want = reference_logprob(logits[i], int(out.token_ids[i]), rows[i].params.logprobs or 0)
        assert (got.token_id, got.rank) == (want.token_id, want.rank)
        assert got.logprob == pytest.approx(want.logprob, abs=1e-5)
        assert [t for t, _ in got.top] == [t for t, _ in want.top]
        assert [v for _, v in got.top] == pytest.approx([v for _, v in want.top], abs=1e-5)


def test_prompt_logprobs_match_manual_computation() -> None:
    logits = torch.randn(300, 50)  # more rows than one internal chunk
    next_ids = torch.randint(0, 50, (300,))
    got = prompt_logprobs(logits, next_ids, k=2)
    assert len(got) == 300
    for i in (0, 1, 255, 256, 299):
        want = reference_logprob(logits[i], int(next_ids[i]), 2)
        assert (got[i].token_id, got[i].rank) == (want.token_id, want.rank)
        assert got[i].logprob == pytest.approx(want.logprob, abs=1e-5)
        assert [t for t, _ in got[i].top] == [t for t, _ in want.top]
    with pytest.raises(ValueError, match="next_token_ids"):
        prompt_logprobs(logits, next_ids[:-1], k=0)


def test_wrong_logits_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="logits"):
        Sampler()(torch.randn(2, V), build([row(SamplingParams())]))


def test_rank_with_masked_vocabulary_entries() -> None:
    logits = torch.randn(2, 60)
    logits[:, 50:] = float("-inf")  # padded vocabulary rows, as some models emit
    got = prompt_logprobs(logits, torch.tensor([55, 7]), k=1)
    assert got[0].logprob == float("-inf") and got[0].rank == 51
    assert got[1].rank == reference_logprob(logits[1], 7, 1).rank


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rows_match_their_controls_and_seeds() -> None:
    device = torch.device("cuda")
    x = peaked_logits()
    params = [
        SamplingParams(temperature=0, logprobs=2),
        SamplingParams(top_k=5, seed=7),
        SamplingParams(top_p=0.4, min_p=0.01, seed=8, presence_penalty=1.0),
        SamplingParams(min_p=0.3, logit_bias={1: -5.0}),
    ]

    def run() -> list[int]:
        rows = [
            SamplingRow(p, [1], [2], torch.Generator(device).manual_seed(p.seed))
            if p.seed is not None
            else SamplingRow(p, [1], [2])
            for p in params * 50
        ]
        batch = SamplingBatch.build(rows, vocab_size=V, eos_token_ids=EOS, device=device)
        logits = x.to(device).expand(len(rows), -1).contiguous()
        out = Sampler()(logits, batch)
        assert out.token_ids.device.type == "cpu" and out.logprobs is not None
        return out.token_ids.tolist()

    tokens = run()
    for i, token in enumerate(tokens):
        p = params[i % 4]
        if p.greedy:
            assert token == x.argmax().item()
        else:
            assert reference_distribution(reference_edit(x, row(p, [1], [2])), p)[token] > 0
    again = run()
    seeded = [i for i in range(len(tokens)) if params[i % 4].seed is not None]
    assert [again[i] for i in seeded] == [tokens[i] for i in seeded]


def test_top_k_candidates_match_topk() -> None:
    for vocab, k in ((V, 1), (V, 3), (4099, 20), (4099, 40), (100, 7)):
        x = torch.randn(5, vocab)
        x[0, -1] = 99.0  # in the partial last chunk
        vals, idx = kernels.top_k_candidates(x, k)
        want_vals, want_idx = x.topk(k, dim=-1)
        assert torch.equal(vals, want_vals) and torch.equal(idx, want_idx), (vocab, k)


# ---- memory: no [rows, vocab] copies beyond the one a step needs ----------------------------


_IN_PLACE_CHECK = """
import torch
for op in (torch.softmax, torch.log_softmax):
    for n, v in [(1, 5), (3, 700), (32, 4097), (7, 49152), (2, 151_936)]:
        x = torch.randn(n, v) * 8
        x[0, : v // 3] = float("-inf")
        want = op(x, dim=-1)
        got = op(x, dim=-1, out=x)
        assert got.data_ptr() == x.data_ptr()
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (op, n, v)
print(torch.backends.cpu.get_cpu_capability())
"""


@pytest.mark.parametrize("capability", ["", "avx2", "default"])
def test_softmax_in_place_has_the_bits_of_a_new_tensor(capability: str) -> None:
    """The sampler writes softmax / log_softmax over their own input (out=x) on the CPU; that
    must give exactly the bits of the out-of-place op (for any vocabulary length, -inf too), in
    each of torch's CPU kernels the sampler may run: this CPU's own (""), and capped at AVX2
    (an AVX2-only CPU's) and at none. A child per capability (torch reads it at start), started
    from sys.executable so a virtualenv's packages stay visible."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    if not capability:
        env.pop("ATEN_CPU_CAPABILITY")
    done = subprocess.run([sys.executable, "-c", _IN_PLACE_CHECK], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    if capability:  # the cap took effect (a CPU without AVX2 would report below it)
        assert done.stdout.strip() in (capability.upper(), "DEFAULT"), done.stdout


def _rows_by_vocab_allocations(logits: torch.Tensor, rows: list[SamplingRow]) -> int:
    """How many tensors of at least one float32 vocabulary row one Sampler call allocates."""
    from torch.profiler import ProfilerActivity, profile

    batch = build(rows, logits.shape[1])
    sampler = Sampler()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        sampler(logits, batch)
    size = logits.shape[1] * logits.element_size()
    return sum(1 for e in prof.events() if e.self_cpu_memory_usage >= size)


@pytest.mark.parametrize(
    ("params", "logprob_rows", "allowed"),
    [
        (SamplingParams(temperature=0, presence_penalty=0.5, repetition_penalty=1.2), 0, 0),
        (SamplingParams(temperature=0.8, top_p=0.9), 0, 0),  # softmax in place
        (SamplingParams(temperature=0.8, top_k=20, min_p=0.05), 0, 0),
        (SamplingParams(temperature=0.8, min_p=0.05), 0, 0),
        (SamplingParams(temperature=0, logprobs=3), 8, 1),  # the log_softmax, no copy first
        (SamplingParams(temperature=0.8, top_p=0.9, logprobs=3), 8, 1),
        (SamplingParams(temperature=0, logprobs=3), 3, 1),  # the rows' copy, log_softmax in it
    ],
)
def test_a_step_makes_no_rows_by_vocab_copies_beyond_the_logprobs(
    params: SamplingParams, logprob_rows: int, allowed: int
) -> None:
    """Issue 42 item 4: the step's logits are the sampler's scratch; the only [rows, vocab]
    tensor it allocates is the log-probabilities of the rows that asked for them (ranks are
    counted in it)."""
    n, v = 8, 49_152  # the default model's vocabulary
    rows = [
        row(
            dataclasses.replace(params, logprobs=params.logprobs if i < logprob_rows else None),
            output=[i],
        )  # fmt: skip
        for i in range(n)
    ]
    assert _rows_by_vocab_allocations(torch.randn(n, v) * 3, rows) == allowed
