"""The long schemathesis run (issue 6): 10,000 generated requests against a pagedserve server.

Same contract as tests/reliability/test_fuzz_schema.py (no 5xx, no server-error frame in a 200
stream, every 4xx in OpenAI's error envelope, /health 200 after), with random (not
derandomized) generation. Kept out of CI. Prints one JSON line.

    python -m bench.serving.fuzz_long                         # starts its own server, 10,000 cases
    python -m bench.serving.fuzz_long --tiny                  # the same on a tiny random model
    python -m bench.serving.fuzz_long --url http://127.0.0.1:8000 --cases 2000
    python -m bench.serving.fuzz_long --tiny --paths /v1/responses '/v1/responses/{response_id}/cancel'
    python -m bench.serving.fuzz_long --embed --paths /v1/embeddings   # a tiny embedding model

On the default model 10,000 cases take hours on 2 CPU cores, nearly all of it in prefill of the
generated prompts. `--tiny` serves a tiny random Llama GGUF (tests/tiny_models.py: its own BPE
tokenizer and ChatML template) through the same server code, so the time goes to the HTTP,
validation, admission and streaming paths the fuzzer is for.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
from schemathesis import GenerationMode

from bench.common.schema_fuzz import (
    FuzzReport,
    fuzz_operation,
    load_schema,
    post_operations,
)
from bench.common.server import start_server, stop_server
from bench.common.tiny_embedders import write_tiny_embedder
from bench.common.tiny_models import write_gguf_llama


def fuzz(base_url: str, cases: int, paths: list[str] | None = None) -> dict:
    ops = post_operations(load_schema(base_url))
    if paths:
        ops = [op for op in ops if op.path in paths]
    modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    per_run = max(1, cases // (len(ops) * len(modes)))
    report = FuzzReport()
    start = time.monotonic()
    for op in ops:
        for mode in modes:
            fuzz_operation(op, base_url, mode, per_run, report, derandomize=False)
    health = httpx.get(base_url + "/health", timeout=30).status_code
    by_status: dict[str, int] = {}
    for (label, mode, status), count in sorted(report.statuses.items()):
        key = f"{label} {mode} {status}"
        by_status[key] = by_status.get(key, 0) + count
    return {
        "cases": report.num_cases,
        "seconds": round(time.monotonic() - start, 1),
        "problems": report.problems,
        "schema_gaps": report.schema_gaps,
        "coerced": len(report.coerced),
        "health_after": health,
        "statuses": by_status,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--tiny", action="store_true", help="serve a tiny random model")
    parser.add_argument("--embed", action="store_true",
                        help="serve a tiny random embedding model (tests/tiny_embedders.py)")  # fmt: skip
    parser.add_argument("--paths", nargs="+", metavar="PATH", help="only these POST routes")
    args = parser.parse_args()
    server = None
    if args.url is None:
        folder = Path(tempfile.mkdtemp(prefix="fuzz_long-"))
        flags = ["--max-model-len", "1024", "--num-pages", "512", "--max-body-bytes", "2097152"]
        if args.tiny:
            write_gguf_llama(folder / "tiny.gguf")
            flags = [str(folder / "tiny.gguf"), "--dtype", "float32", *flags]
            flags[flags.index("--max-model-len") + 1] = "256"  # the tiny model's context
        elif args.embed:
            write_tiny_embedder(folder / "embedder", seed=1, is_matryoshka=True)
            flags = [str(folder / "embedder"), "--dtype", "float32", "--max-waiting", "4096",
                     *flags]  # fmt: skip
            flags[flags.index("--max-model-len") + 1] = "256"
        server = start_server(folder, *flags)
    try:
        result = fuzz(args.url or server.base_url, args.cases, args.paths)
    finally:
        if server is not None:
            result_code = stop_server(server)
            print(f"server exit code {result_code}", file=sys.stderr)
    print(json.dumps(result))
    return 0 if not result["problems"] and result["health_after"] == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
