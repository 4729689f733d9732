"""The offline engine on the prompts a serving run sent: the "HTTP overhead" baseline (issue 5).

    python -m bench.serving.serving ... --concurrency 32 --dump-prompts /tmp/p.jsonl
    python -m bench.serving.serving_offline --prompts-jsonl /tmp/p.jsonl --max-num-seqs 32 \
        --output-tokens 128 --num-pages 640

`LLM.generate` runs every prompt with the engine's continuous batching capped at
--max-num-seqs running at once, which is what a server sees from --concurrency clients (minus
HTTP, SSE and the event loop). Greedy, ignore_eos, exactly --output-tokens each, like the
load generator asks of pagedserve. Prints one JSON object with output tokens/s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts-jsonl", required=True, help='lines of {"prompt": "..."}')
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--num-pages", type=int, default=0, help="KV pages (0: the default budget)")
    p.add_argument("--no-enable-prefix-caching", action="store_true")
    a = p.parse_args(argv)
    prompts = [json.loads(line)["prompt"] for line in Path(a.prompts_jsonl).read_text().split("\n")
               if line.strip()]  # fmt: skip
    if not prompts:
        print(f"serving_offline.py: --prompts-jsonl: {a.prompts_jsonl} is empty", file=sys.stderr)
        return 2

    from pagedserve import LLM, SamplingParams

    extra = {"num_pages": a.num_pages} if a.num_pages else {}
    llm = LLM(max_num_seqs=a.max_num_seqs, enable_prefix_caching=not a.no_enable_prefix_caching,
              **extra)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=a.output_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up, untimed
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    report = {
        "engine": "pagedserve LLM.generate (offline)",
        "num_prompts": len(prompts), "max_num_seqs": a.max_num_seqs,
        "prompt_tokens_mean": round(sum(len(o.prompt_token_ids) for o in outputs)
                                    / len(outputs), 1),
        "output_tokens_total": generated, "duration_s": round(seconds, 3),
        "output_tok_per_s": round(generated / seconds, 2),
    }  # fmt: skip
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
