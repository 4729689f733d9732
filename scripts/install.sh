#!/usr/bin/env bash
# Installs pagedserve (and, with the argument "test", its test dependencies) into the current
# Python environment. Without an NVIDIA GPU it first installs the CPU build of torch, so that
# pip does not pull a CUDA build of several GB; with a GPU it keeps the torch you have (or lets
# pip choose one).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    python3 -m pip install torch==2.13.0
fi
if [[ "${1:-}" == "test" ]]; then
    # The page's browser tests drive Debian's Chromium through Playwright (Playwright's own
    # browser download needs a network these machines lack). Installed when missing and we are
    # root with apt-get (CI); elsewhere the tests skip and say why.
    if ! command -v chromium >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends chromium fonts-dejavu-core >/dev/null \
            || echo "install.sh: chromium could not be installed; the browser tests will skip" >&2
    fi
    # tests/native/test_cpp_aarch64.py cross-builds the C++ tests for aarch64 and runs them under
    # qemu-user (the cross g++ brings the arm64 libc, libstdc++ and libgomp). Installed likewise.
    if ! { command -v aarch64-linux-gnu-g++ && command -v qemu-aarch64; } >/dev/null 2>&1 \
        && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends g++-aarch64-linux-gnu qemu-user >/dev/null \
            || echo "install.sh: no aarch64 cross toolchain; test_cpp_aarch64.py will skip" >&2
    fi
    # Editable, so the tests (which import helpers from the source tree) and the installed
    # package are one and the same code. Its build folder (build/<wheel tag>) builds the C++
    # tests too, which tests/native/test_cpp_x86_64_qemu.py runs under qemu there (the library
    # compiles once); without build isolation, so that the folder still builds after pip returns
    # (an isolated build's pybind11 is deleted with it). The build requirements first, those
    # pip would fetch for an isolated build (scikit-build-core lists them: ninja, and cmake where
    # the system's is missing or too old).
    python3 -m pip install "scikit-build-core>=0.10"
    mapfile -t requires < <(python3 -m scikit_build_core.build requires |
        python3 -c 'import json, sys; print(*json.load(sys.stdin), sep="\n")')
    python3 -m pip install "${requires[@]}"
    PAGEDSERVE_BUILD_TESTS=ON python3 -m pip install --no-build-isolation -e ".[test]"
    # The chart tests (tests/deploy) render deploy/helm/pagedserve with a pinned helm binary.
    ./deploy/tools/install_helm.sh >/dev/null \
        || echo "install.sh: no helm binary (see above); tests/deploy will fail" >&2
else
    python3 -m pip install .
fi
