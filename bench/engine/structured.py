"""Constrained decoding costs (issue 13), on the default model, offline engine:

    python -m bench.engine.structured [--repeats 3] [--batch 32] [--max-tokens 64]

1. c=32 output tok/s, every sequence under a json_schema vs the same run unconstrained,
   alternated A/B and repeated (medians). The schema's one string cannot close within
   max_tokens (minLength 4000) and both runs ignore EOS, so both generate exactly
   batch x max_tokens tokens: the ratio is the cost of the masks and matchers alone.
2. Grammar compile time for 50-property schemas (each one new to the LRU; the first compile also
   builds xgrammar's view of the 49k-token vocabulary, reported apart).
3. The mask's cost per step: fill + apply over `batch` constrained rows of [batch, vocab] logits.

Prints a markdown table with the CPU model; paste it into bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from pagedserve import LLM, SamplingParams
from pagedserve.core.ops.cpu_features import cpu_model
from pagedserve.core.sampling_params import StructuredOutputs
from pagedserve.core.structured import GrammarCache, GrammarState
from pagedserve.core.structured.bitmask import GrammarMasker

OPEN_STRING = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 4000}},
    "required": ["story"],
}


def fifty_properties(tag: int) -> dict:
    kinds = [{"type": "string", "maxLength": 16}, {"type": "integer"}, {"type": "boolean"},
             {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
             {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}]  # fmt: skip
    props = {f"field_{tag}_{i}": kinds[i % len(kinds)] for i in range(50)}
    return {"type": "object", "properties": props, "required": list(props)[:25]}


def throughput(llm: LLM, batch: int, max_tokens: int, repeats: int) -> dict[str, list[float]]:
    prompts = [f"Write a short story number {i} as JSON:" for i in range(batch)]
    spec = StructuredOutputs("json_schema", json.dumps(OPEN_STRING))
    runs = {
        "unconstrained": SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
        "json_schema": SamplingParams(
            temperature=0, max_tokens=max_tokens, ignore_eos=True, structured=spec
        ),
    }
    llm.generate(prompts[:2], runs["json_schema"])  # warm: compile, first steps
    rates: dict[str, list[float]] = {f"{name} {clock}": [] for name in runs for clock in CLOCKS}
    for _ in range(repeats):
        for name, params in runs.items():
            start = {clock: fn() for clock, fn in CLOCKS.items()}
            outs = llm.generate(prompts, params)
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            assert tokens == batch * max_tokens, (name, tokens)
            for clock, fn in CLOCKS.items():
                rates[f"{name} {clock}"].append(tokens / (fn() - start[clock]))
    return rates


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
"""Wall time, and this process's CPU time (all threads): on a machine shared with other jobs
the CPU-time rate is the steadier A/B comparison."""


def compile_times(llm: LLM, count: int) -> tuple[float, list[float]]:
    cache = GrammarCache(llm.engine.tokenizer)
    start = time.perf_counter()
    cache.compile(StructuredOutputs("json_object"))  # builds the vocabulary view once
    first = time.perf_counter() - start
    times = []
    for tag in range(count):
        spec = StructuredOutputs("json_schema", json.dumps(fifty_properties(tag)))
        start = time.perf_counter()
        cache.compile(spec)
        times.append(time.perf_counter() - start)
    return first, times


def mask_cost(llm: LLM, batch: int, steps: int) -> tuple[list[float], list[float]]:
    tokenizer = llm.engine.tokenizer
    compiled = llm.engine.grammars.compile(
        StructuredOutputs("json_schema", json.dumps(OPEN_STRING))
    )
    states = [GrammarState(compiled) for _ in range(batch)]
    prefix = tokenizer.encode('{"story": "Once upon a time', add_special_tokens=False)
    for i, state in enumerate(states):  # rows at different places in the grammar
        for token in prefix[: 1 + i % len(prefix)]:
            state.advance(token)
    masker = GrammarMasker()
    rows = list(range(batch))
    logits = torch.randn(batch, tokenizer.vocab_size)
    times, accepts = [], []
    for _ in range(steps):
        scratch = logits.clone()
        start = time.perf_counter()
        masker.apply(scratch, rows, states)
        times.append(time.perf_counter() - start)
        picked = scratch.argmax(-1).tolist()  # an allowed token per row, as the sampler would
        start = time.perf_counter()
        for state, token in zip(states, picked, strict=True):
            state.advance(token)
        accepts.append(time.perf_counter() - start)
    return times, accepts


def fill_vs_apply(llm: LLM, batch: int, steps: int) -> dict[str, list[float]]:
    """The two halves of the mask, apart: filling with 1 and 2 threads (interleaved), applying."""
    import xgrammar

    compiled = llm.engine.grammars.compile(
        StructuredOutputs("json_schema", json.dumps(OPEN_STRING))
    )
    matchers = [GrammarState(compiled).matcher for _ in range(batch)]
    vocab = llm.engine.tokenizer.vocab_size
    bitmask = xgrammar.allocate_token_bitmask(batch, vocab)
    fillers = {n: xgrammar.BatchGrammarMatcher(max_threads=n) for n in (1, 2)}
    logits = torch.randn(batch, vocab)
    times: dict[str, list[float]] = {"fill 1 thread": [], "fill 2 threads": [], "apply": []}
    for _ in range(steps):
        for n, filler in fillers.items():
            start = time.perf_counter()
            filler.batch_fill_next_token_bitmask(matchers, bitmask)
            times[f"fill {n} thread{'s' if n > 1 else ''}"].append(time.perf_counter() - start)
        start = time.perf_counter()
        xgrammar.apply_token_bitmask_inplace(
            logits, bitmask, vocab_size=vocab, indices=list(range(batch))
        )
        times["apply"].append(time.perf_counter() - start)
    return times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3, help="A/B rounds (0: component costs only)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    llm = LLM("", max_model_len=512, num_pages=1024, max_num_seqs=args.batch)
    rates = throughput(llm, args.batch, args.max_tokens, args.repeats) if args.repeats else {}
    first, compiles = compile_times(llm, 5)
    masks, accepts = mask_cost(llm, args.batch, 40)
    halves = fill_vs_apply(llm, args.batch, 40)
    print(f"CPU: {cpu_model()}, torch threads {torch.get_num_threads()}\n")
    print("| measure | value |\n|---|---|")
    for clock in CLOCKS if rates else ():
        free = statistics.median(rates[f"unconstrained {clock}"])
        constrained = statistics.median(rates[f"json_schema {clock}"])
        unit = "tok/s" if clock == "wall" else "tok per CPU-s"
        print(f"| c={args.batch} output {unit}, unconstrained / json_schema (median of "
              f"{args.repeats}) | {free:.1f} / {constrained:.1f}: overhead "
              f"{100 * (1 - constrained / free):.1f}% |")  # fmt: skip
        print(f"| runs ({clock}) | free {[round(r, 1) for r in rates[f'unconstrained {clock}']]}, "
              f"json {[round(r, 1) for r in rates[f'json_schema {clock}']]} |")  # fmt: skip
    print(f"| first compile (vocabulary view + json_object) | {first * 1e3:.0f} ms |")
    print(f"| 50-property schema compile, median of {len(compiles)} | "
          f"{statistics.median(compiles) * 1e3:.1f} ms (max {max(compiles) * 1e3:.1f}) |")  # fmt: skip
    print(f"| mask per step, {args.batch} constrained rows (fill + apply), median | "
          f"{statistics.median(masks) * 1e3:.2f} ms ({statistics.median(masks) / args.batch * 1e6:.0f} us/row) |")  # fmt: skip
    for name, values in halves.items():
        print(f"| {name}, {args.batch} rows, median (min) | "
              f"{statistics.median(values) * 1e3:.3f} ms ({min(values) * 1e3:.3f}) |")  # fmt: skip
    print(f"| matcher advance per step, {args.batch} rows, median | "
          f"{statistics.median(accepts) * 1e3:.2f} ms |")  # fmt: skip


if __name__ == "__main__":
    main()
