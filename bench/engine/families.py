"""Offline throughput of the newer families (issue 11): one MoE and one sliding-window config,
tiny but not toy (hidden 1024, 8 layers, random weights written by transformers), pagedserve's
LLM.generate vs transformers' generate() on the same folder, same dtype, side by side.

    python -m bench.engine.families                 # 64 prompts x 128 tokens, bf16, 3 repeats
    python -m bench.engine.families --quick         # 8 x 48 (past the window), 1 repeat
    python -m bench.engine.families --tiny          # hidden 128, 2 layers, 4 x 24: a smoke run only
    python -m bench.engine.families --num-prompts 16 --output-len 32   # a smaller grid

Each figure is the median over --repeats, after one short warm-up generate per engine, the two
engines interleaved within each repeat so a shared machine's load falls on both alike. Prints one JSON object (CPU model included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.engine.throughput import Theirs as _Theirs  # left padding, batched generate
from pagedserve.core.ops.cpu_features import cpu_model

SHAPE = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=4096,
    vocab_size=400,  # the tiny BPE tokenizer's vocabulary
    rms_norm_eps=1e-5,
)
CONFIGS = {
    # Mixtral-style MoE: 8 experts of width 1408, 2 per token.
    "mixtral-moe": ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 2,
                                "intermediate_size": 1408}),
    # Mistral with a 64-token sliding window (prompt + output run well past it).
    "mistral-window64": ("mistral", {"sliding_window": 64}),
}  # fmt: skip
# --tiny: the same configs shrunk to a smoke run (its figures rank nothing).
TINY_SHAPE = dict(SHAPE, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
TINY_EXTRA = {"mixtral-moe": {"intermediate_size": 64}, "mistral-window64": {"sliding_window": 16}}
PROMPT_LEN = 32


def write_model(folder: Path, family: str, extra: dict, shape: dict = SHAPE) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from bench.common.tiny_tokenizers import write_tiny_bpe

    write_tiny_bpe(folder)
    cfg = AutoConfig.for_model(family, **{**shape, **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.save_pretrained(folder)


class Ours:
    def __init__(self, folder: Path, dtype: str, num_prompts: int, output_len: int) -> None:
        from pagedserve import LLM

        self.llm = LLM(str(folder), dtype=dtype, max_model_len=PROMPT_LEN + output_len + 16,
                       page_size=16, num_pages=num_prompts * ((PROMPT_LEN + output_len) // 16 + 2),
                       max_num_seqs=num_prompts, max_num_batched_tokens=512,
                       enable_prefix_caching=False)  # fmt: skip

    def generate(self, prompts: list[list[int]], max_tokens: int) -> int:
        from pagedserve import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        return sum(len(o.outputs[0].token_ids) for o in self.llm.generate(prompts, params))


class Theirs(_Theirs):
    def __init__(self, folder: Path, dtype: str, batch: int) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
        self.model.eval()
        self.batch, self.pad_id = batch, 0


def tokens_per_s(engine, prompts: list[list[int]], max_tokens: int) -> float:  # noqa: ANN001
    start = time.perf_counter()
    n = engine.generate(prompts, max_tokens)
    return n / (time.perf_counter() - start)


def bench(name: str, args: argparse.Namespace) -> dict:
    family, extra = CONFIGS[name]
    if args.tiny:
        extra = {**extra, **TINY_EXTRA[name]}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / name
        write_model(folder, family, extra, TINY_SHAPE if args.tiny else SHAPE)
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(10, 390, (PROMPT_LEN,), generator=gen).tolist()
                   for _ in range(args.num_prompts)]  # fmt: skip
        ours = Ours(folder, args.dtype, args.num_prompts, args.output_len)
        theirs = Theirs(folder, args.dtype, args.hf_batch)
        for engine in (ours, theirs):  # warm-up: first-call costs are not throughput
            engine.generate(prompts[:2], 4)
        runs: dict[str, list[float]] = {"pagedserve": [], "transformers": []}
        for repeat in range(args.repeats):
            for label, engine in (("pagedserve", ours), ("transformers", theirs)):
                runs[label].append(tokens_per_s(engine, prompts, args.output_len))
                print(f"{name} repeat {repeat + 1}/{args.repeats} {label}: "
                      f"{runs[label][-1]:.1f} tok/s", file=sys.stderr, flush=True)  # fmt: skip
    medians = {k: statistics.median(v) for k, v in runs.items()}
    return {"config": name, "family": family, **extra, "output_tok_s": medians,
            "ratio": medians["pagedserve"] / medians["transformers"], "runs": runs}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hf-batch", type=int, default=64)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    args = parser.parse_args()
    if args.quick or args.tiny:
        args.num_prompts, args.output_len, args.repeats = (4, 24, 1) if args.tiny else (8, 48, 1)
    results = [bench(name, args) for name in args.configs]
    print(json.dumps({"cpu": cpu_model(), "threads": torch.get_num_threads(),
                      "num_prompts": args.num_prompts, "prompt_len": PROMPT_LEN,
                      "output_len": args.output_len, "dtype": args.dtype, "tiny": args.tiny,
                      "results": results}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
