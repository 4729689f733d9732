"""Decode attention by KV page dtype: the CPU paged-attention op alone, one step of c requests at a
context of ctx tokens, SmolLM2's shapes (9 query / 3 KV heads of 64, page size 16), for every
cache the engine can hold under float32 activations (the default model's: fp32, fp16, int8 and
fp8_e4m3 pages) and bf16 pages under bf16 activations, at each ISA level asked for.

    flock /tmp/pagedserve-bench.lock python -m bench.kernels.attention_kv_dtype \
        [--levels avx2,avx512_bf16] [--contexts 1024,4096,8192] [--concurrency 1,8] [--threads 2]

Each case prints the median of --repeats timed steps after a warm-up (ms), and the KV bytes the
step reads per ms (GB/s: every page of every request, keys and values, scales included). The
CPU model is the first line.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.common.attention_batches import make_batch
from pagedserve.core.attention import ops, reference
from pagedserve.core.ops.cpu_features import cpu_model, forced_cpu_isa

# name: (activation dtype, how the random fp32 history is stored)
CACHES = {
    "fp32": (torch.float32, lambda c: c),
    "fp16": (torch.float32, torch.Tensor.half),
    "int8": (torch.float32, reference.quantize_rows),
    "fp8_e4m3": (torch.float32, lambda c: reference.quantize_rows(c, torch.float8_e4m3fn)),
    "bf16": (torch.bfloat16, lambda c: c),
}


def step_ms(cache: str, c: int, ctx: int, repeats: int) -> tuple[float, int]:
    dtype, store = CACHES[cache]
    b = make_batch([1] * c, [ctx] * c, num_kv_heads=3, group=3, head_size=64, page_size=16,
                   dtype=dtype)  # fmt: skip
    b.kv_cache = store(b.kv_cache)
    m, out = b.meta, torch.empty_like(b.query)
    args = (out, b.query, b.kv_cache, m.page_table, m.seq_lens, m.query_start_loc,
            m.max_query_len, m.max_seq_len, b.scale)  # fmt: skip
    ops.paged_attention(*args)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ops.paged_attention(*args)
        times.append((time.perf_counter() - t0) * 1e3)
    pages_bytes = b.kv_cache[:, 0].numel() * b.kv_cache.element_size()  # keys + values of a page
    read = c * -(-ctx // 16) * pages_bytes
    return statistics.median(times), read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="avx2")
    parser.add_argument("--contexts", default="1024,4096,8192")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--caches", default=",".join(CACHES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_model()}, {args.threads} threads")
    caches = args.caches.split(",")
    print("| level | c | ctx | " + " | ".join(f"{k} ms (GB/s)" for k in caches) + " |")
    print("|---|---:|---:|" + "---:|" * len(caches))
    for level in args.levels.split(","):
        with forced_cpu_isa(level):
            for c in map(int, args.concurrency.split(",")):
                for ctx in map(int, args.contexts.split(",")):
                    cells = []
                    for cache in caches:
                        ms, read = step_ms(cache, c, ctx, args.repeats)
                        cells.append(f"{ms:.3f} ({read / ms / 1e6:.1f})")
                    print(f"| {level} | {c} | {ctx} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
