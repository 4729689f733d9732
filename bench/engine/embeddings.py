"""Embeddings per second, pagedserve vs sentence-transformers, on the same random weights.

A Qwen3-shaped embedder (hidden 1024, 8 layers, 16 query / 8 KV heads of 128, intermediate
3072: Qwen3-Embedding-0.6B's widths, 8 of its 28 layers) with random weights and
sentence-transformers' files (last-token pooling, normalized) is written to a temporary folder;
both libraries load that folder in one process, in the same dtype. Inputs are
random token ids, 128 per input (the same for both), so tokenization is not measured: ours gets
the ids (`LLM.embed`), sentence-transformers gets the padded tensors its `encode` would build
(`forward` under inference_mode; equal lengths, so no padding). Batch 1: one input at a time;
batch 32: 32 inputs in one call. Each figure is the median of `--repeats` timed calls after one
warm-up, ours and theirs alternating call by call; the vectors of the two are checked to agree
(cosine) before timing.

    flock /tmp/pagedserve-bench.lock python -m bench.engine.embeddings --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from bench.common.tiny_embedders import write_tiny_embedder
from pagedserve import LLM
from pagedserve.core.ops.cpu_features import cpu_isa, cpu_model

SHAPE = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
             num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             max_position_embeddings=4096)  # fmt: skip
NUM_TOKENS = 128


def median_seconds(fns: tuple[Callable[[], object], ...], repeats: int) -> tuple[float, ...]:
    """Median seconds of each fn, the calls interleaved (a, b, a, b, ...) so that a load that
    comes and goes on a shared machine falls on both alike; one warm-up call each first."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, seconds in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - start)
    return tuple(statistics.median(seconds) for seconds in times)


def inputs(batch: int, vocab_size: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (batch, NUM_TOKENS), generator=gen)
    return ids.tolist()


def st_forward(model: object, ids: list[list[int]]) -> torch.Tensor:
    tensor = torch.tensor(ids)
    features = {"input_ids": tensor, "attention_mask": torch.ones_like(tensor)}
    with torch.inference_mode():
        return model.forward(features)["sentence_embedding"]  # type: ignore[attr-defined]


def run_case(folder: Path, dtype: str, repeats: int) -> list[tuple[str, int, float, float]]:
    from sentence_transformers import SentenceTransformer

    torch_dtype = getattr(torch, dtype)
    llm = LLM(str(folder), dtype=dtype, quantization="none", max_model_len=1024,
              num_pages=1024, page_size=16, max_num_seqs=64)  # fmt: skip
    st = SentenceTransformer(str(folder), device="cpu", model_kwargs={"dtype": torch_dtype})
    vocab = llm.tokenizer.vocab_size
    rows = []
    for batch in (1, 32):
        ids = inputs(batch, vocab, seed=batch)
        ours_vec = torch.tensor(llm.embed(ids))
        theirs_vec = st_forward(st, ids).float()
        cos = torch.nn.functional.cosine_similarity(ours_vec, theirs_vec, dim=1).min().item()
        ours_s, theirs_s = median_seconds((partial(llm.embed, ids), partial(st_forward, st, ids)),
                                          repeats)  # fmt: skip
        rows.append((dtype, batch, batch / ours_s, batch / theirs_s))
        print(f"  {dtype} batch {batch}: ours {batch / ours_s:.1f}/s, sentence-transformers "
              f"{batch / theirs_s:.1f}/s, min cosine {cos:.6f}", flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen3-embedder-1024x8"
        write_tiny_embedder(folder, seed=0, **SHAPE)
        for dtype in args.dtypes:
            rows += run_case(folder, dtype, args.repeats)
    print(f"\nCPU: {cpu_model() or '?'} (ISA level {cpu_isa()}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {NUM_TOKENS}-token inputs, medians of "
          f"{args.repeats}\n")  # fmt: skip
    print("| dtype | batch | pagedserve emb/s | sentence-transformers emb/s | ratio |")
    print("|---|---:|---:|---:|---:|")
    for dtype, batch, ours, theirs in rows:
        print(f"| {dtype} | {batch} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f}x |")


if __name__ == "__main__":
    main()
