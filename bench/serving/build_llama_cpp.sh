#!/usr/bin/env bash
# Builds llama.cpp's llama-server, llama-bench and llama-quantize once, for CPU, into the
# git-ignored bench/.work/, from the llama.cpp sources vendored in the llama-cpp-python source
# distribution on PyPI (the only place these machines can get them: no GitHub, no curl at build).
# Idempotent: exits at once when the three binaries exist. Prints the bin folder on success.
#
#   bench/serving/build_llama_cpp.sh                     # foreground
#   nohup bench/serving/build_llama_cpp.sh > bench/.work/build.log 2>&1 &   # the build takes a while
#
# Env: LLAMA_CPP_PYTHON_VERSION (default 0.3.36), JOBS (default 2: the machine is shared),
# LLAMA_CPP_NATIVE=OFF: ggml's portable x86 flags instead of -march=native (AVX, AVX2, FMA, F16C,
# BMI2; no AVX-512), into bench/.work/llama.cpp-build-avx2: what llama.cpp runs on an AVX2-only
# CPU (Zen 1-3), for side-by-side runs with pagedserve --cpu-isa avx2 on a larger CPU.
# How it is built (say so beside any llama.cpp figure): Release, GGML_NATIVE=ON without AMX
# (-mno-amx-tile -mno-amx-int8 -mno-amx-bf16), static, no curl.
set -euo pipefail
cd "$(dirname "$0")/.."  # bench/: the work folder is bench/.work
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
jobs="${JOBS:-2}"
work="$PWD/.work"
src_root="$work/llama_cpp_python-$version"
native="${LLAMA_CPP_NATIVE:-ON}"
build="$work/llama.cpp-build$([[ "$native" == ON ]] || echo -avx2)"
bin="$build/bin"
targets=(llama-server llama-bench llama-quantize)

all_built() {
    local t
    for t in "${targets[@]}"; do [[ -x "$bin/$t" ]] || return 1; done
}

if all_built; then
    echo "$bin"
    exit 0
fi
mkdir -p "$work"
# Serialize concurrent callers (bench/engine/throughput.py, bench/serving/compare.sh) on one build.
exec 9>"$work/build.lock"
flock 9
all_built && { echo "$bin"; exit 0; }

if [[ ! -d "$src_root/vendor/llama.cpp" ]]; then
    sdist="$work/llama_cpp_python-$version.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        # --no-deps: only the sdist. pip prepares an sdist's metadata even to download it, so it
        # needs the sdist's build backend (scikit-build-core): in an isolated build environment
        # pip fetches it from PyPI, so this runs from any venv (./scripts/install.sh test's too).
        python3 -m pip download --no-deps --no-binary :all: \
            "llama-cpp-python==$version" -d "$work" -q
    fi
    tar -xzf "$sdist" -C "$work"
fi

# GGML_NATIVE: tuned for this CPU (AVX-512, BF16, VNNI), which is what a user here would build,
# minus AMX: ggml's AMX backend (compiled in when -march=native has AMX-INT8) crashed with SIGSEGV
# in ggml_backend_amx_mul_mat on Q4_1 on an Intel AMX machine, so the -mno-amx-* flags keep it out
# and the same script gives a working llama-server on Zen 4 and on Intel with AMX alike.
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$src_root/vendor/llama.cpp" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE="$native" \
    -DCMAKE_C_FLAGS="$no_amx" \
    -DCMAKE_CXX_FLAGS="$no_amx" \
    -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DBUILD_SHARED_LIBS=OFF
cmake --build "$build" --target "${targets[@]}" -j "$jobs"
all_built || { echo "build finished but a binary is missing in $bin" >&2; exit 1; }
echo "$bin"
