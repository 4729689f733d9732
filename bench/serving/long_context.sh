#!/usr/bin/env bash
# Long-context decode at c=1 (issue 41): pagedserve (its defaults) vs llama-server on the Q8_0
# re-encode (-fa on, f16 KV), one server at a time, 2 requests of ~4k and ~7.9k tokens, 64 out;
# prints serving.py's JSON per (server, context): TPOT p50 is the decode time per token there.
set -u
cd "$(dirname "$0")/../.."
M=/root/.cache/pagedserve/SmolLM2-135M-Instruct.Q4_1.gguf
Q8=bench/.work/SmolLM2-135M-Instruct.Q4_1.requant-Q8_0.gguf
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1-3 /proc/loadavg)"
wait_up() { for i in $(seq 1 120); do curl -sf "$1/health" >/dev/null && return 0; sleep 1; done; return 1; }
run() { # name url pid
  for ctx in 4000 7900; do
    python -m bench.serving.serving --base-url "$2/v1" --concurrency 1 --num-requests 2 --prompt-tokens $ctx --output-tokens 64 --server-kind $4 --endpoint completions --timeout 600 2>/dev/null | sed "s/^/$1 ctx=$ctx: /"
  done
}
python -m pagedserve serve "$M" --port 18111 --max-model-len 8192 --num-pages 1100 > /tmp/ps-long.log 2>&1 &
P=$!; wait_up http://127.0.0.1:18111 && run pagedserve http://127.0.0.1:18111 $P pagedserve; kill $P; wait $P 2>/dev/null
bench/.work/llama.cpp-build/bin/llama-server -m "$Q8" --port 18112 -t 2 -tb 2 -np 1 -c 8192 -fa on --cache-ram 0 > /tmp/ll-long.log 2>&1 &
L=$!; wait_up http://127.0.0.1:18112 && run llama-q8_0 http://127.0.0.1:18112 $L llamacpp; kill $L; wait $L 2>/dev/null
