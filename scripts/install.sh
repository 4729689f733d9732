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
    # Editable, so the tests (which import helpers from the source tree) and the installed
    # package are one and the same code.
    python3 -m pip install -e ".[test]"
    # The chart tests (tests/deploy) render deploy/helm/pagedserve with a pinned helm binary.
    ./deploy/tools/install_helm.sh >/dev/null \
        || echo "install.sh: no helm binary (see above); tests/deploy will fail" >&2
else
    python3 -m pip install .
fi
