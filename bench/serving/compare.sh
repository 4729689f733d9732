#!/usr/bin/env bash
# pagedserve vs llama.cpp's llama-server on the same GGUF, same 2 threads, one server at a time
# on a free loopback port, the same bench/serving/serving.py grid on each (issue 5):
#   c1, c8, c32, c64: concurrency 1/8/32/64, 128-token prompts, 128 tokens out
#   long:   one 1,000-token prompt at a time, 16 out (prefill speed)
#   shared: 32 requests at once sharing one cold 1,000-token prompt, 32 out (prefix cache);
#           also on pagedserve with --no-enable-prefix-caching
#   mixed:  16 streams decoding (128-token prompts, 128 out) while 2,200-token prompts (16 out)
#           arrive 2 at a time, both for a fixed time (issue 12): the decoders' inter-token
#           latency under long prefills (mixed), the long prompts' TTFT (mixed_long)
# then llama-server again on a Q8_0 re-encode (llama-quantize), and serving vs the offline engine
# at c32 in alternating waves (bench/serving/serving_ratio.py: HTTP overhead). Appends a dated table to bench/RESULTS.md (bench/serving/compare_report.py) and
# draws PNG plots (bench/serving/plots.py: tok/s, TTFT, ITL vs concurrency) into bench/plots/<run>/ (with
# --no-write: into the run folder), shown in RESULTS.md next to the tables.
#
#   bench/serving/compare.sh            # full grid (~30-40 min on a quiet machine)
#   bench/serving/compare.sh --quick    # reduced grid while developing (~5-10 min)
#   bench/serving/compare.sh --tiny --no-write --no-llama   # plumbing check: tiny prompts and outputs
#   options: --no-write (print only), --no-llama (pagedserve side only), --build (build
#            llama.cpp with bench/serving/build_llama_cpp.sh when missing, instead of skipping it)
#   env: PAGEDSERVE_ARGS (more `pagedserve serve` flags, e.g. "--cpu-isa avx2"), LLAMA_BIN (the
#        llama.cpp bin folder, e.g. bench/.work/llama.cpp-build-avx2/bin: LLAMA_CPP_NATIVE=OFF
#        bench/serving/build_llama_cpp.sh): an AVX2-only CPU's pair of servers on a larger CPU.
#
# Memory is matched: each server gets the KV room of 32 slots x (prompt + output + 64): llama-server
# `-np 32 -c <that>`, pagedserve `--num-pages <that / 16>`; two configs, 128+128 and 1000+32.
set -euo pipefail
cd "$(dirname "$0")/../.."
quick=0 write=1 llama=1 build=0
p_short=128 o_short=128 p_long=1000 o_long=16 o_shared=32 p_mixed=2200
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        --tiny) quick=1 p_short=32 o_short=8 p_long=200 o_long=4 o_shared=4 p_mixed=300 ;;
        --no-write) write=0 ;;
        --no-llama) llama=0 ;;
        --build) build=1 ;;
        *) echo "compare.sh: unknown option $arg" >&2; exit 2 ;;
    esac
done
bin=${LLAMA_BIN:-bench/.work/llama.cpp-build/bin}
run_dir="bench/.work/compare-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$run_dir"
gguf=$(cd /tmp && python -c 'from pagedserve.core.models.resolve import resolve_model; print(resolve_model("").path)')
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
short_ctx=$((32 * (p_short + o_short + 64)))  # 10240 tokens
long_ctx=$((32 * (p_long + o_shared + 64)))   # 35072 tokens
mixed_ctx=$((18 * (p_mixed + o_short + 64)))  # 43056 tokens: 18 slots of the longest request
pid=""

free_port() { python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

stop_server() {
    [[ -n "$pid" ]] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
}
trap stop_server EXIT

# start_server NAME CMD...: launches from the run folder, waits for /health, sets pid and url.
start_server() {
    local name=$1; shift
    port=$(free_port)
    url="http://127.0.0.1:$port"
    (cd "$run_dir" && exec "$@" --port "$port" >"$name.log" 2>&1) &
    pid=$!
    for _ in $(seq 600); do
        kill -0 "$pid" 2>/dev/null || { echo "$name died:" >&2; tail -20 "$run_dir/$name.log" >&2; exit 1; }
        curl -sf "$url/health" >/dev/null 2>&1 && return 0
        sleep 1
    done
    echo "$name: not ready after 600 s" >&2; exit 1
}

# bench SERVER CASE KIND ARGS...: one serving.py run into RUN_DIR/SERVER__CASE.json.
bench() {
    local server=$1 case=$2 kind=$3; shift 3
    echo "== $server $case ($(cut -d' ' -f1 /proc/loadavg) load)" >&2
    python -m bench.serving.serving --base-url "$url/v1" --server-kind "$kind" --pid "$pid" \
        --max-seconds 600 "$@" >"$run_dir/${server}__$case.json" || echo "   ($server $case had failures)" >&2
}

n() { if ((quick)); then echo "$2"; else echo "$1"; fi; }  # n FULL QUICK

short_grid() {  # short_grid SERVER KIND
    bench "$1" warmup "$2" --concurrency 2 --num-requests 2 --output-tokens 8 --seed 900
    local sizes=(--prompt-tokens "$p_short" --output-tokens "$o_short")
    bench "$1" c1 "$2" --concurrency 1 --num-requests "$(n 6 2)" "${sizes[@]}"
    bench "$1" c8 "$2" --concurrency 8 --num-requests "$(n 24 8)" "${sizes[@]}"
    bench "$1" c32 "$2" --concurrency 32 --num-requests "$(n 64 32)" "${sizes[@]}" \
        --dump-prompts "$run_dir/prompts_c32_$1.jsonl"
    ((quick)) || bench "$1" c64 "$2" --concurrency 64 --num-requests 128 "${sizes[@]}"
    rm -f "$run_dir/${1}__warmup.json"
}

long_grid() {  # long_grid SERVER KIND: one prompt at a time, then the cold shared prefix
    bench "$1" long "$2" --concurrency 1 --num-requests "$(n 4 2)" --prompt-tokens "$p_long" \
        --output-tokens "$o_long" --seed 500
    shared_case "$1" "$2"
}

shared_case() {  # shared_case SERVER KIND: a fresh seed, so the prompt is cold on every server
    bench "$1" shared "$2" --concurrency 32 --num-requests 32 --prompt-tokens "$p_long" \
        --output-tokens "$o_shared" --shared-prefix --seed 700
}

mixed_case() {  # mixed_case SERVER KIND: both loads for the same fixed time, side by side
    local secs; secs=$(n 60 20)
    bench "$1" mixed_long "$2" --concurrency 2 --num-requests 1000 --max-seconds "$secs" \
        --prompt-tokens "$p_mixed" --output-tokens "$o_long" --seed 800 &
    local long=$!
    bench "$1" mixed "$2" --concurrency 16 --num-requests 1000 --max-seconds "$secs" \
        --prompt-tokens "$p_short" --output-tokens "$o_short" --seed 850
    wait "$long"
}

pagedserve_cmd() {  # pagedserve_cmd CTX_TOKENS [FLAGS...]
    local pages=$(($1 / 16)); shift
    echo python -m pagedserve serve "$gguf" --num-pages "$pages" --max-num-seqs 64 --max-model-len 2048 \
        ${PAGEDSERVE_ARGS:-} "$@"
}

llama_cmd() {  # llama_cmd GGUF CTX_TOKENS [SLOTS]: each slot gets CTX_TOKENS / SLOTS
    echo "$PWD/$bin/llama-server" -m "$1" --host 127.0.0.1 -np "${3:-32}" -cb -c "$2" -t 2 -tb 2 \
        --cache-ram 0 --no-webui
}

run_pagedserve() {
    # shellcheck disable=SC2046  # word splitting of the command is intended
    start_server pagedserve-short $(pagedserve_cmd "$short_ctx"); short_grid pagedserve pagedserve; stop_server
    # Serving / offline at c32: the machine drifts by more than the figure between two runs
    # minutes apart, so serving and offline waves alternate, each engine kept loaded. A
    # --cpu-isa in PAGEDSERVE_ARGS reaches both engines as the env cap (serving_ratio.py starts
    # them with its own flags).
    local isa=""
    [[ " ${PAGEDSERVE_ARGS:-} " =~ \ --cpu-isa[\ =]([a-z0-9_]+) ]] && isa="${BASH_REMATCH[1]}"
    PAGEDSERVE_MAX_CPU_ISA="${isa:-${PAGEDSERVE_MAX_CPU_ISA:-}}" python -m bench.serving.serving_ratio --pairs "$(n 8 4)" --num-requests "$(n 64 32)" \
        --prompt-tokens "$p_short" --output-tokens "$o_short" --work "$run_dir/serving_ratio" --json "$run_dir/serving_ratio.json" \
        >"$run_dir/serving_ratio.md" 2>"$run_dir/serving_ratio.log"
    # shellcheck disable=SC2046
    start_server pagedserve-long $(pagedserve_cmd "$long_ctx"); long_grid pagedserve pagedserve; stop_server
    # shellcheck disable=SC2046
    start_server pagedserve-nocache $(pagedserve_cmd "$long_ctx" --no-enable-prefix-caching)
    shared_case pagedserve-nocache pagedserve
    stop_server
    # shellcheck disable=SC2046
    start_server pagedserve-mixed $(pagedserve_cmd "$mixed_ctx" --max-model-len 4096)
    mixed_case pagedserve pagedserve
    stop_server
}

run_llama() {  # run_llama NAME GGUF
    # shellcheck disable=SC2046
    start_server "$1-short" $(llama_cmd "$2" "$short_ctx"); short_grid "$1" llamacpp; stop_server
    # shellcheck disable=SC2046
    start_server "$1-long" $(llama_cmd "$2" "$long_ctx"); long_grid "$1" llamacpp; stop_server
    # shellcheck disable=SC2046
    start_server "$1-mixed" $(llama_cmd "$2" "$mixed_ctx" 18); mixed_case "$1" llamacpp; stop_server
}

have_llama() { [[ -x "$bin/llama-server" && -x "$bin/llama-quantize" ]]; }
if ((llama)) && ! have_llama && ((build)); then bench/serving/build_llama_cpp.sh >/dev/null; fi
if ((llama)) && ! have_llama; then
    echo "compare.sh: no llama.cpp build in $bin (bench/serving/build_llama_cpp.sh, or --build): pagedserve only" >&2
    llama=0
fi

run_pagedserve
if ((llama)); then
    run_llama llama-q4_1 "$gguf"
    q8="bench/.work/$(basename "$gguf" .gguf).requant-Q8_0.gguf"
    [[ -f "$q8" ]] || "$bin/llama-quantize" --allow-requantize "$gguf" "$q8" Q8_0 >"$run_dir/quantize.log" 2>&1
    run_llama llama-q8_0 "$PWD/$q8"
fi

setup="Servers one at a time; prompts $p_short/$p_long tokens, outputs $o_short (c1-c64), $o_long (long), $o_shared (shared); KV room matched: 32 x (prompt + output + 64) tokens (llama-server -np 32 -cb -c $short_ctx or $long_ctx -t 2 -tb 2 --cache-ram 0; pagedserve --num-pages $((short_ctx / 16)) or $((long_ctx / 16)), --max-num-seqs 64). Mixed: 16 x ($p_short in, $o_short out) streams and $p_mixed-token prompts ($o_long out) at c=2 for the same $(n 60 20) s; 18 slots of $((mixed_ctx / 18)) tokens (llama-server -np 18 -c $mixed_ctx; pagedserve --num-pages $((mixed_ctx / 16)) --max-model-len 4096). Completions endpoint, streaming, greedy, fixed output length (ignore_eos). pagedserve flags: ${PAGEDSERVE_ARGS:-none}; llama.cpp: \`$bin\`. Runs: \`$run_dir\`."
python - "$run_dir" "$load_before" "$gguf" "$quick" "$setup" <<'EOF'
import datetime, json, sys
run_dir, load_before, gguf, quick, setup = sys.argv[1:]
cpu = next((l.partition(":")[2].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
meta = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "load_before": load_before, "cpu": cpu,
        "load_after": " ".join(open("/proc/loadavg").read().split()[:3]), "model": gguf,
        "quick": quick == "1", "setup": setup}
open(f"{run_dir}/meta.json", "w").write(json.dumps(meta))
EOF
if ((write)); then
    python -m bench.serving.plots "$run_dir" --out "bench/plots/$(basename "$run_dir")"
    python -m bench.serving.compare_report "$run_dir" --write
else
    python -m bench.serving.plots "$run_dir"
    python -m bench.serving.compare_report "$run_dir"
fi
