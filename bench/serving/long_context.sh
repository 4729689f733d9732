#!/usr/bin/env bash
# Long-context decode (issue 41): pagedserve vs llama-server on the Q8_0 re-encode, one server at a
# time, at c=1 (2 requests per context) and c=8 (8 requests at once), each request one synthetic
# prompt of ~CTX tokens (no shared prefix) and OUT tokens out; prints serving.py's JSON per
# (server, c, context): TPOT p50 is the decode time per token there.
#
# Servers: pagedserve with its defaults (fp16 KV pages) and with --kv-cache-dtype int8;
# llama-server with -fa on and f16 KV, and with -ctk q8_0 -ctv q8_0 (its 8-bit KV).
#
#   flock /tmp/pagedserve-bench.lock bench/serving/long_context.sh
#
# Environment: LLAMA_SERVER (default bench/.work/llama.cpp-build/bin/llama-server), PS_ARGS
# (extra pagedserve flags, e.g. "--cpu-isa avx2" to compare with an AVX2 llama.cpp build on a
# larger CPU), C1_CONTEXTS (default "1000 4000 7900"), C8_CONTEXTS (default "1000 4000"),
# OUT (default 64), SERVERS (default "ps ps-int8 llama llama-q8").
set -u
cd "$(dirname "$0")/../.."
M=/root/.cache/pagedserve/SmolLM2-135M-Instruct.Q4_1.gguf
Q8=bench/.work/SmolLM2-135M-Instruct.Q4_1.requant-Q8_0.gguf
LLAMA_SERVER=${LLAMA_SERVER:-bench/.work/llama.cpp-build/bin/llama-server}
C1_CONTEXTS=${C1_CONTEXTS:-1000 4000 7900}
C8_CONTEXTS=${C8_CONTEXTS:-1000 4000}
OUT=${OUT:-64}
SERVERS=${SERVERS:-ps ps-int8 llama llama-q8}
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "llama-server: $LLAMA_SERVER; pagedserve extra flags: ${PS_ARGS:-none}"
wait_up() { for _ in $(seq 1 180); do curl -sf "$1/health" >/dev/null && return 0; sleep 1; done; return 1; }
run() { # name url kind
  for ctx in $C1_CONTEXTS; do
    python -m bench.serving.serving --base-url "$2/v1" --concurrency 1 --num-requests 2 --prompt-tokens "$ctx" --output-tokens "$OUT" --server-kind "$3" --endpoint completions --timeout 900 2>/dev/null | sed "s/^/$1 c=1 ctx=$ctx: /"
  done
  for ctx in $C8_CONTEXTS; do
    python -m bench.serving.serving --base-url "$2/v1" --concurrency 8 --num-requests 8 --prompt-tokens "$ctx" --output-tokens "$OUT" --server-kind "$3" --endpoint completions --timeout 900 --seed 100 2>/dev/null | sed "s/^/$1 c=8 ctx=$ctx: /"
  done
}
pagedserve() { # name extra-flags...
  local name=$1; shift
  # 8 x 8,192 tokens of KV room (4,096 pages of 16) at c=8.
  # shellcheck disable=SC2086
  python -m pagedserve serve "$M" --port 18111 --max-model-len 8192 --num-pages 4200 ${PS_ARGS:-} "$@" > "/tmp/ps-long-$name.log" 2>&1 &
  local pid=$!
  wait_up http://127.0.0.1:18111 && run "$name" http://127.0.0.1:18111 pagedserve
  kill $pid; wait $pid 2>/dev/null
}
llama() { # name extra-flags...
  local name=$1; shift
  "$LLAMA_SERVER" -m "$Q8" --port 18112 -t 2 -tb 2 -np 8 -c 65536 -fa on --cache-ram 0 "$@" > "/tmp/ll-long-$name.log" 2>&1 &
  local pid=$!
  wait_up http://127.0.0.1:18112 && run "$name" http://127.0.0.1:18112 llamacpp
  kill $pid; wait $pid 2>/dev/null
}
for s in $SERVERS; do
  case $s in
    ps) pagedserve pagedserve ;;
    ps-int8) pagedserve pagedserve-int8 --kv-cache-dtype int8 ;;
    llama) llama llama-f16 ;;
    llama-q8) llama llama-q8_0kv -ctk q8_0 -ctv q8_0 ;;
  esac
done
