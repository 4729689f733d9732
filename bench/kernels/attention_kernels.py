"""Paged-attention kernel benchmark: native ops vs the torch reference, side by side, one run.

    python -m bench.kernels.attention_kernels [--threads 1]        # CPU: decode 32 x 1024, prefill 4 x 512, and
                                                 # the engine's shapes (decode 64 x 130, 64 x 512;
                                                 # one 512-token chunk at context 1000)
    python -m bench.kernels.attention_kernels --device cuda        # + decode 64 x 4096 bandwidth vs the device peak
    python -m bench.kernels.attention_kernels --cases decode:64:1:130,prefill:1:512:1000 --models smollm2-135m

Prints one JSON object: per case the median milliseconds of each implementation, native's
speed-up over the reference and over a batched-SDPA baseline (gather the pages into dense K/V,
then one scaled_dot_product_attention call), and for decode the K/V bytes read per second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from pagedserve.core.attention import ops
from pagedserve.core.attention.reference import paged_attention_reference

MODELS = {"smollm2-135m": (9, 3, 64), "llama-8b": (32, 8, 128)}  # heads, kv heads, head_size
PAGE_SIZE = 16
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def make_case(
    num_reqs: int, q_len: int, ctx: int, model: str, dtype: torch.dtype, device: str
) -> dict:
    heads, kv_heads, d = MODELS[model]
    pages_per_req = -(-ctx // PAGE_SIZE)
    num_pages = num_reqs * pages_per_req
    perm = torch.randperm(num_pages, dtype=torch.int32)  # scattered pages, as in serving
    qsl = torch.arange(0, (num_reqs + 1) * q_len, q_len, dtype=torch.int32)
    return {
        "query": torch.randn(num_reqs * q_len, heads, d, dtype=dtype, device=device),
        "kv_cache": torch.randn(2, num_pages, kv_heads, PAGE_SIZE, d, dtype=dtype, device=device),
        "page_table": perm.reshape(num_reqs, pages_per_req).to(device),
        "seq_lens": torch.full((num_reqs,), ctx, dtype=torch.int32, device=device),
        "query_start_loc": qsl.to(device),
        "q_len": q_len,
        "ctx": ctx,
        "scale": d**-0.5,
    }


def run_native(c: dict) -> Callable[[], object]:
    out = torch.empty_like(c["query"])
    args = (
        out,
        c["query"],
        c["kv_cache"],
        c["page_table"],
        c["seq_lens"],
        c["query_start_loc"],
        c["q_len"],
        c["ctx"],
        c["scale"],
    )
    return lambda: ops.paged_attention(*args)


def run_reference(c: dict) -> Callable[[], object]:
    args = (
        c["query"],
        c["kv_cache"],
        c["page_table"],
        c["seq_lens"],
        c["query_start_loc"],
        c["scale"],
    )
    return lambda: paged_attention_reference(*args)


def run_sdpa(c: dict) -> Callable[[], object]:
    """All requests share q_len and ctx here, so one gather + one batched SDPA call does it."""
    num_reqs = c["page_table"].shape[0]

    def step() -> torch.Tensor:
        kv = c["kv_cache"][:, c["page_table"].long()]  # [2, R, P, KH, page_size, D]
        kv = kv.permute(0, 1, 3, 2, 4, 5).flatten(3, 4)[:, :, :, : c["ctx"]]  # [2, R, KH, ctx, D]
        q = c["query"].unflatten(0, (num_reqs, c["q_len"])).transpose(1, 2)  # [R, H, q_len, D]
        mask = None
        if c["q_len"] > 1:  # causal, with the query at the end of the context
            pos = torch.arange(c["ctx"], device=q.device)
            mask = pos[None, :] <= pos[c["ctx"] - c["q_len"] :, None]
        return F.scaled_dot_product_attention(
            q, kv[0], kv[1], attn_mask=mask, scale=c["scale"], enable_gqa=True
        )

    return step


def median_ms(fn: Callable[[], object], repeats: int, device: str) -> float:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fn()  # warm-up
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def bench_case(name: str, c: dict, repeats: int, device: str, with_reference: bool) -> dict:
    row: dict = {"case": name, "native_ms": median_ms(run_native(c), repeats, device)}
    row["sdpa_ms"] = median_ms(run_sdpa(c), repeats, device)
    row["native_vs_sdpa"] = round(row["sdpa_ms"] / row["native_ms"], 2)
    if with_reference:
        row["reference_ms"] = median_ms(run_reference(c), repeats, device)
        row["native_vs_reference"] = round(row["reference_ms"] / row["native_ms"], 2)
    if c["q_len"] == 1:  # decode reads the whole K/V context once: memory-bound
        kv_bytes = 2 * c["page_table"].numel() * c["kv_cache"][0, 0].numel()
        kv_bytes *= c["kv_cache"].element_size()
        row["native_kv_gb_per_s"] = round(kv_bytes / row["native_ms"] / 1e6, 1)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


def cases(device: str, spec: str) -> list[tuple[str, int, int, int]]:
    """spec: comma-separated kind:num_reqs:q_len:ctx, or "" for the built-in list."""
    if spec:
        parsed = [item.split(":") for item in spec.split(",")]
        return [(kind, int(reqs), int(q_len), int(ctx)) for kind, reqs, q_len, ctx in parsed]
    shapes = [("decode", 32, 1, 1024), ("prefill", 4, 512, 512)]
    if device == "cuda":
        shapes.append(("decode", 64, 1, 4096))
    else:  # a batch-64 decode step and a chunked 1,000-token prefill of the small model
        shapes += [("decode", 64, 1, 130), ("decode", 64, 1, 512), ("prefill", 1, 512, 1000)]
    return shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--models", default=",".join(MODELS), help=f"some of {list(MODELS)}")
    parser.add_argument(
        "--cases", default="", help="kind:num_reqs:q_len:ctx,... (default: built-in)"
    )
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    parser.add_argument(
        "--peak-gb-per-s",
        type=float,
        default=4800.0,
        help="device memory bandwidth for the decode efficiency figure (H200)",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rows = []
    for model in args.models.split(","):
        for dtype_name in args.dtypes.split(","):
            for kind, reqs, q_len, ctx in cases(args.device, args.cases):
                c = make_case(reqs, q_len, ctx, model, DTYPES[dtype_name], args.device)
                shape = f"{reqs}x{ctx}" if q_len in (1, ctx) else f"{reqs}x{q_len}@{ctx}"
                name = f"{kind} {shape} {model} {dtype_name}"
                row = bench_case(name, c, args.repeats, args.device, with_reference=ctx <= 1024)
                if args.device == "cuda" and "native_kv_gb_per_s" in row:
                    row["peak_fraction"] = round(row["native_kv_gb_per_s"] / args.peak_gb_per_s, 3)
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = {"device": args.device, "threads": torch.get_num_threads(), "results": rows}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
