#!/usr/bin/env bash
# Builds llama.cpp's llama-server, llama-bench and llama-quantize once, for CPU, into the
# git-ignored bench/.work/, from the llama.cpp sources vendored in the llama-cpp-python source
# distribution on PyPI (the only place these machines can get them: no GitHub, no curl at build).
# Idempotent: exits at once when the three binaries exist. Prints the bin folder on success.
#
#   bench/build_llama_cpp.sh                     # foreground
#   nohup bench/build_llama_cpp.sh > bench/.work/build.log 2>&1 &   # the build takes a while
#
# Env: LLAMA_CPP_PYTHON_VERSION (default 0.3.36), JOBS (default 2: the machine is shared).
set -euo pipefail
cd "$(dirname "$0")"
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
jobs="${JOBS:-2}"
work="$PWD/.work"
src_root="$work/llama_cpp_python-$version"
build="$work/llama.cpp-build"
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
# Serialize concurrent callers (bench/throughput.py, bench/compare.sh) on one build.
exec 9>"$work/build.lock"
flock 9
all_built && { echo "$bin"; exit 0; }

if [[ ! -d "$src_root/vendor/llama.cpp" ]]; then
    sdist="$work/llama_cpp_python-$version.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        # --no-deps: only the sdist; its build dependencies are never installed here.
        python3 -m pip download --no-deps --no-binary :all: --no-build-isolation \
            "llama-cpp-python==$version" -d "$work" -q
    fi
    tar -xzf "$sdist" -C "$work"
fi

# GGML_NATIVE: tuned for this CPU (AVX-512, BF16), which is what a user here would build.
cmake -S "$src_root/vendor/llama.cpp" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DBUILD_SHARED_LIBS=OFF
cmake --build "$build" --target "${targets[@]}" -j "$jobs"
all_built || { echo "build finished but a binary is missing in $bin" >&2; exit 1; }
echo "$bin"
