"""Paged attention of two source trees side by side (issue 16's kernel-level cost).

    python -m bench.kernels.attention_ab BASE_TREE CANDIDATE_TREE [--rounds 3] [--isa avx2]

Each tree (a source checkout with its own `_core` build, as bench/engine/determinism_cost.py describes,
or the editable install's tree) runs in a fresh process, alternating, at ISA level --isa (default:
the CPU's best), at SmolLM2 shapes (9 query / 3 KV heads, head size 64, page size 16, bf16, 1
thread): a decode step of 32 x 600 and a 1024-token prefill. Each process
prints the fastest of its calls (robust to a shared machine's descheduling), in ms.
"""

from __future__ import annotations

import os
import subprocess
import sys

WORKER = """
import sys, time
import glob
base, isa = sys.argv[1], sys.argv[2]
if glob.glob(base + "/pagedserve/_core*.so"):  # a tree with its own build; else the editable one
    sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
    sys.path[:0] = [base]
import importlib.util, os
import torch
# The tree's own random batches, loaded by path (bench/common/ since issue 37, tests/ before).
for batches in ("/bench/common/attention_batches.py", "/tests/core/attention/attention_batches.py"):
    if os.path.exists(base + batches):
        spec = importlib.util.spec_from_file_location("attention_batches", base + batches)
        batches_module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(batches_module)
        make_batch = batches_module.make_batch
        break
try:  # the op module's home since issue 15
    from pagedserve.core.attention import ops
except ImportError:  # trees before it
    from pagedserve.core.attention import ops
torch.set_num_threads(1)
if isa != "auto":
    from pagedserve.core.ops.cpu_features import set_cpu_isa
    set_cpu_isa(isa)
res = {}
for name, q, s, calls in [("decode 32 x 600", [1] * 32, [600] * 32, 40),
                          ("prefill 1 x 1024", [1024], [1024], 8)]:
    b = make_batch(q, s, num_kv_heads=3, group=3, head_size=64, page_size=16,
                   dtype=torch.bfloat16)
    m, out = b.meta, torch.empty_like(b.query)
    args = (out, b.query, b.kv_cache, m.page_table, m.seq_lens, m.query_start_loc,
            m.max_query_len, m.max_seq_len, b.scale)
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        ops.paged_attention_eager(*args)
        times.append(time.perf_counter() - t)
    res[name] = round(min(times) * 1e3, 3)
print(base, res)
"""


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    isa = sys.argv[sys.argv.index("--isa") + 1] if "--isa" in sys.argv else "auto"
    from pagedserve.core.ops.cpu_features import cpu_model

    print(f"CPU: {cpu_model()}; isa {isa}; load average {os.getloadavg()}")
    for _ in range(rounds):
        for tree in sys.argv[1:3]:
            subprocess.run([sys.executable, "-c", WORKER, tree, isa], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
