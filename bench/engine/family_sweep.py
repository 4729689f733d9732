"""The families' transformers oracle over many weight draws (issue 24's Zen 3 disagreement).

    python -m bench.engine.family_sweep gemma3,qwen3-window,mistral-window --seeds 30-39 [--tree DIR]
    qemu-x86_64 -cpu EPYC-Milan $(python -c 'import sys; print(sys.executable)') \\
        -m bench.engine.family_sweep gemma3 --seeds 1-8    # as a Zen 3 runs it (torch at AVX2)

For each family (CASES / WINDOW_CASES ids of bench/common/family_oracle.py, which
tests/core/models/test_families.py runs) and seed: a tiny random checkpoint written by
transformers, then the families' engine oracle (three prompts shorter and longer than
the window, a mixed batch, a prefix-cache hit; greedy tokens equal to transformers' fp32 up to the
first top-2 gap below 1e-3). --tree runs another checkout's pagedserve with its own `_core` build
(this checkout's cases and oracle), as bench/engine/engine_ab.py does. Prints the level our kernels and torch ran at, one line
per draw and the draws that disagreed; exits 1 if any did.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.common import ROOT, import_pagedserve_from


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("families", help="comma-separated case ids of bench/common/family_oracle.py")
    ap.add_argument("--seeds", default="21-23", help="FIRST-LAST, inclusive")
    ap.add_argument("--tree", help="a checkout with its own _core build (default: this one)")
    a = ap.parse_args()
    if a.tree:  # its own build, not the editable install's
        import_pagedserve_from(a.tree)
    root = a.tree or str(ROOT)

    import torch

    from bench.common.family_oracle import (
        CASES,
        PROMPT,
        WINDOW_CASES,
        assert_engine_matches,
        load_hf,
    )
    from bench.common.tiny_models import write_hf_model
    from bench.common.tiny_tokenizers import write_tiny_bpe
    from pagedserve import LLM, _core

    level = _core.cpu_isa() if hasattr(_core, "cpu_isa") else "(no ISA levels in this tree)"
    print(f"tree {root}: level {level}, torch {torch.backends.cpu.get_cpu_capability()}")
    first, last = (int(s) for s in a.seeds.split("-"))
    cases, bad = {**CASES, **WINDOW_CASES}, []
    for name in a.families.split(","):
        family, config = cases[name]
        for seed in range(first, last + 1):
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp) / "m"
                write_tiny_bpe(folder)
                write_hf_model(folder, family, seed=seed, **config)
                llm = LLM(str(folder), dtype="float32", num_pages=64, page_size=4,
                          max_num_batched_tokens=8)  # fmt: skip
                try:
                    assert_engine_matches(llm, load_hf(folder), PROMPT)
                    print(name, seed, "agrees", flush=True)
                except AssertionError as e:
                    print(name, seed, "DISAGREES", str(e)[:400], flush=True)
                    bad.append(f"{name}-seed{seed}")
    print("disagreeing draws:", bad or "none")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
