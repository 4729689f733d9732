"""Rerank documents per second, pagedserve vs transformers, on the same random weights.

A Qwen3-shaped reranker (hidden 1024, 8 layers, 16 query / 8 KV heads of 128, intermediate 3072:
Qwen3-Reranker-0.6B's widths, 8 of its 28 layers; the tiny BPE vocabulary of
bench/common/tiny_rerankers.py, so its LM head is small where the real one has 151k rows) with
random weights is written to a temporary folder; both libraries load it in one process, in the
same dtype. Every pair is Qwen3-Reranker's template around a query and a document (~230-260
tokens here), scored as its model card does: softmax([logit(no), logit(yes)])[1] at the last
position. Ours: `LLM.score(query, documents)` (tokenization included; the documents run as one
batch of prefill-only requests, and the prefix cache serves the template and query they share).
Transformers: the same prompts tokenized and left-padded into one batch, `forward` under
inference_mode with logits_to_keep=1. Batch 1: one document per call; batch 32: 32 documents of
one query per call. Every timed call has a query of its own (the system part of the template is
all one call shares with an earlier one, as between real requests). Each figure is the median
of `--repeats` calls after one warm-up, ours and theirs alternating; the scores of the two are
checked to agree first.

    flock /tmp/pagedserve-bench.lock python -m bench.engine.rerank --repeats 3
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.common.tiny_rerankers import write_tiny_reranker
from bench.common.tiny_tokenizers import TRAINING_CORPUS
from bench.engine.embeddings import SHAPE, median_seconds
from pagedserve import LLM
from pagedserve.core.ops.cpu_features import cpu_isa, cpu_model
from pagedserve.core.pooling_params import ScoreConfig

SENTENCES = sorted(set(TRAINING_CORPUS))


def documents(batch: int, call: int) -> list[str]:
    return [f"{SENTENCES[(call + i) % len(SENTENCES)]} (item {call}.{i})" for i in range(batch)]


def query(call: int) -> str:
    return f"Query {call}: what does the scheduler do with requests?"


class Transformers:
    """Qwen3-Reranker's model-card recipe: left-padded batch, the last position's two logits."""

    def __init__(self, folder: Path, dtype: torch.dtype, score: ScoreConfig) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
        self.score = score
        self.ids = [self.tokenizer.convert_tokens_to_ids(t) for t in score.tokens]

    def __call__(self, q: str, docs: list[str]) -> list[float]:
        prompts = [self.score.render(q, d) for d in docs]
        batch = self.tokenizer(prompts, padding=True, return_tensors="pt")
        with torch.inference_mode():
            logits = self.model(**batch, logits_to_keep=1).logits[:, -1, self.ids].float()
        return torch.softmax(logits, dim=-1)[:, 1].tolist()


def run_case(folder: Path, dtype: str, repeats: int) -> list[tuple[str, int, float, float]]:
    llm = LLM(str(folder), task="score", dtype=dtype, quantization="none", max_model_len=1024,
              num_pages=2048, page_size=16, max_num_seqs=64)  # fmt: skip
    pooler = llm.engine.pooler
    assert pooler is not None and pooler.score is not None
    theirs = Transformers(folder, getattr(torch, dtype), pooler.score)
    rows = []
    for batch in (1, 32):
        q, docs = query(-batch), documents(batch, -batch)
        diff = max(abs(a - b) for a, b in zip(llm.score(q, docs), theirs(q, docs), strict=True))
        calls = itertools.count()

        def ours_call(calls: Any = calls, batch: int = batch) -> None:
            n = next(calls)
            llm.score(query(n), documents(batch, n))

        def theirs_call(calls: Any = calls, batch: int = batch) -> None:
            n = next(calls)
            theirs(query(n), documents(batch, n))

        ours_s, theirs_s = median_seconds((ours_call, theirs_call), repeats)
        rows.append((dtype, batch, batch / ours_s, batch / theirs_s))
        print(f"  {dtype} batch {batch}: ours {batch / ours_s:.1f} docs/s, transformers "
              f"{batch / theirs_s:.1f} docs/s, max |score difference| {diff:.2e}", flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", nargs="+", default=["float32"])
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen3-reranker-1024x8"
        write_tiny_reranker(folder, seed=0, **SHAPE)
        for dtype in args.dtypes:
            rows += run_case(folder, dtype, args.repeats)
    print(f"\nCPU: {cpu_model() or '?'} (ISA level {cpu_isa()}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; Qwen3-Reranker's template, medians of "
          f"{args.repeats}\n")  # fmt: skip
    print("| dtype | batch | pagedserve docs/s | transformers docs/s | ratio |")
    print("|---|---:|---:|---:|---:|")
    for dtype, batch, ours, theirs in rows:
        print(f"| {dtype} | {batch} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f}x |")


if __name__ == "__main__":
    main()
