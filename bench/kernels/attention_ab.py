"""Paged attention of two source trees side by side (issue 16's kernel-level cost).

    python -m bench.kernels.attention_ab BASE_TREE CANDIDATE_TREE [--rounds 3] [--isa avx2]

Each tree (a source checkout with its own `_core` build beside its sources or under its build/, as
bench/engine/determinism_cost.py describes, or the editable install's tree: `.`) runs in a fresh
process (bench/common/in_tree.py: either module layout), alternating, at ISA level --isa (default:
the CPU's best), at SmolLM2 shapes (9 query / 3 KV heads, head size 64, page size 16, bf16, 1
thread): a decode step of 32 x 600 and a 1024-token prefill. Each process
prints the fastest of its calls (robust to a shared machine's descheduling), in ms.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT, in_tree


def worker(argv: list[str]) -> int:
    """One tree's process (bench.common.in_tree loaded its pagedserve): tree, ISA."""
    import importlib.util
    import time

    import torch

    from bench.common.in_tree import first_module

    tree, isa = Path(argv[0] or ROOT), argv[1]
    # The tree's own random batches, loaded by path (bench/common/ since issue 37, tests/ before).
    for batches in (
        "bench/common/attention_batches.py",
        "tests/core/attention/attention_batches.py",
    ):
        if (tree / batches).exists():
            spec = importlib.util.spec_from_file_location("attention_batches", tree / batches)
            assert spec is not None and spec.loader is not None
            batches_module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(batches_module)
            make_batch = batches_module.make_batch
            break
    else:
        sys.exit(f"{tree}: no attention_batches.py")
    # The op module's home since issue 37, then before it.
    ops = first_module("pagedserve.core.attention.ops", "pagedserve.core.ops.attention")
    torch.set_num_threads(1)
    if isa != "auto":
        from pagedserve.core.ops.cpu_features import set_cpu_isa

        set_cpu_isa(isa)
    res = {}
    for name, q, s, calls in [("decode 32 x 600", [1] * 32, [600] * 32, 40),
                              ("prefill 1 x 1024", [1024], [1024], 8)]:  # fmt: skip
        b = make_batch(q, s, num_kv_heads=3, group=3, head_size=64, page_size=16,
                       dtype=torch.bfloat16)  # fmt: skip
        m, out = b.meta, torch.empty_like(b.query)
        args = (out, b.query, b.kv_cache, m.page_table, m.seq_lens, m.query_start_loc,
                m.max_query_len, m.max_seq_len, b.scale)  # fmt: skip
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            ops.paged_attention_eager(*args)
            times.append(time.perf_counter() - t)
        res[name] = round(min(times) * 1e3, 3)
    print(argv[0], res, flush=True)
    return 0


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    isa = sys.argv[sys.argv.index("--isa") + 1] if "--isa" in sys.argv else "auto"
    from pagedserve.core.ops.cpu_features import cpu_model

    print(f"CPU: {cpu_model()}; isa {isa}; load average {os.getloadavg()}")
    for _ in range(rounds):
        for tree in [str(Path(t).resolve()) for t in sys.argv[1:3]]:
            subprocess.run(in_tree(tree, "bench.kernels.attention_ab:worker", tree, isa),
                           check=True, cwd=ROOT)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
