"""Start-up time: `pagedserve serve` on the default model from the process's start to /health
answering 200, and the server's own "loaded in" figure (the model's load inside it).

    python -m bench.serving.startup [--repeats 5] [-- extra serve flags]

Medians over the repeats (one server at a time). The CPU model and the load average are
printed: a figure is compared only within one run.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

from bench.common.server import start_server, stop_server
from pagedserve.core.ops.cpu_features import cpu_model

LOADED = re.compile(r"loaded in ([0-9.]+) s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("flags", nargs="*", help="extra `serve` flags (after --)")
    args = parser.parse_args()
    flags = args.flags or ["--max-model-len", "1024", "--num-pages", "512"]
    ready, loaded = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            start = time.perf_counter()
            server = start_server(Path(tmp), *flags)
            ready.append(time.perf_counter() - start)
            found = LOADED.search(server.log())
            loaded.append(float(found.group(1)) if found else float("nan"))
            stop_server(server)
    print(f"CPU: {cpu_model()}; load average before the last start: {os.getloadavg()[0]:.2f}")
    print(f"serve {' '.join(flags)}, {args.repeats} starts")
    print("| figure | median | min | max |")
    print("|---|---:|---:|---:|")
    for name, values in (("process start -> /health 200 (s)", ready),
                         ("server's 'loaded in' (s)", loaded)):  # fmt: skip
        low, mid, high = min(values), statistics.median(values), max(values)
        print(f"| {name} | {mid:.2f} | {low:.2f} | {high:.2f} |")


if __name__ == "__main__":
    main()
