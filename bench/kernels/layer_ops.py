"""Native layer ops vs the torch expressions they replace, then one whole engine decode step.

    python -m bench.kernels.layer_ops [--dtype bfloat16] [--repeats 200] [--steps 10] [--threads N]
                              [--no-engine]

Part 1 times each op (median of `repeats`, both sides in the same run, interleaved) at decode
(64 tokens) and prefill (512 tokens) shapes of SmolLM2-135M (hidden 576, 9 + 3 heads of 64,
intermediate 1536). Part 2 times a batch-64 decode step of the default model through the engine
as it runs (in bf16 on an AVX512-BF16 CPU: the native decoder stack, one call per step), then
layer by layer with layer_ops forced onto its torch fallback (the exact expressions llama.py
ran before; the linear layers stay native), interleaved in one process. Prints the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from pagedserve.core.ops import layer_ops
from pagedserve.core.ops.layer_ops import apply_rotary

HIDDEN, HEADS, KV_HEADS, HEAD, INTER = 576, 9, 3, 64, 1536


def median_pair_us(
    first: Callable[[], object], second: Callable[[], object], repeats: int
) -> tuple[float, float]:
    """Median microseconds of each, the two alternating so that load spikes hit both alike."""
    for _ in range(5):
        first(), second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, acc in ((first, times[0]), (second, times[1])):
            start = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - start)
    return statistics.median(times[0]) * 1e6, statistics.median(times[1]) * 1e6


def op_pairs(n: int, dtype: torch.dtype) -> dict[str, tuple[Callable, Callable]]:
    x, w = torch.randn(n, HIDDEN, dtype=dtype), torch.randn(HIDDEN, dtype=dtype)
    qkv = torch.randn(n, (HEADS + 2 * KV_HEADS) * HEAD, dtype=dtype)
    qk = qkv[:, : (HEADS + KV_HEADS) * HEAD].view(n, HEADS + KV_HEADS, HEAD)
    cos, sin = torch.randn(n, 1, HEAD, dtype=dtype), torch.randn(n, 1, HEAD, dtype=dtype)
    gate_up = torch.randn(n, 2 * INTER, dtype=dtype)
    return {
        "rms_norm": (
            lambda: F.rms_norm(x, (HIDDEN,), w, 1e-5),
            lambda: layer_ops.rms_norm(x, w, 1e-5),
        ),
        "rotary": (lambda: apply_rotary(qk, cos, sin), lambda: layer_ops.rotary(qk, cos, sin)),
        "silu_and_mul": (
            lambda: F.silu(gate_up[:, :INTER]) * gate_up[:, INTER:],
            lambda: layer_ops.silu_and_mul(gate_up),
        ),
    }


def bench_ops(dtype: torch.dtype, repeats: int) -> None:
    print(f"{'op':<14}{'tokens':>7}{'torch us':>10}{'native us':>11}{'speedup':>9}")
    for n in (64, 512):
        for name, (torch_fn, native_fn) in op_pairs(n, dtype).items():
            t_torch, t_native = median_pair_us(torch_fn, native_fn, repeats)
            print(f"{name:<14}{n:>7}{t_torch:>10.1f}{t_native:>11.1f}{t_torch / t_native:>8.2f}x")


def decode_step_times(engine: object, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()  # type: ignore[attr-defined]
        times.append(time.perf_counter() - start)
    return times


def bench_engine(dtype: str, steps: int) -> None:
    from pagedserve.core.config import CacheConfig, EngineConfig, ModelConfig  # noqa: PLC0415
    from pagedserve.core.engine.llm_engine import LLMEngine  # noqa: PLC0415
    from pagedserve.core.sampling_params import SamplingParams  # noqa: PLC0415

    config = EngineConfig(
        model=ModelConfig(dtype=dtype, device="cpu"),
        cache=CacheConfig(num_pages=64 * 8, enable_prefix_caching=False),
    )
    engine = LLMEngine.from_config(config)
    model = engine.model_runner.model
    stack = model.stack
    rounds = 4  # native and torch alternate, `steps` decode steps each per round
    params = SamplingParams(max_tokens=2 * rounds * (steps + 1) + 8, temperature=0.0,
                            ignore_eos=True)  # fmt: skip
    for i in range(64):
        engine.add_request(f"r{i}", [1 + i, 2, 3, 4, 5, 6, 7, 8], params)
    engine.step()  # the prefill step
    native = "native stack" if stack is not None else "native ops"
    times: dict[str, list[float]] = {native: [], "torch ops, layer by layer": []}
    for _ in range(rounds):
        for label, fallback in zip(times, (False, True), strict=True):
            layer_ops._native = (lambda t: False) if fallback else _native  # noqa: SLF001
            model.stack = None if fallback else stack
            engine.step()  # warm-up after the switch
            times[label] += decode_step_times(engine, steps)
    layer_ops._native = _native  # noqa: SLF001
    model.stack = stack
    for label, values in times.items():
        median, low = statistics.median(values) * 1e3, min(values) * 1e3
        print(f"decode step, batch 64, {dtype}, {label}: median {median:.1f} ms, min {low:.1f} ms")


_native = layer_ops._native  # noqa: SLF001


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-engine", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # the native ops use as many
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()}")
    bench_ops(getattr(torch, args.dtype), args.repeats)
    if not args.no_engine:
        bench_engine(args.dtype, args.steps)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
