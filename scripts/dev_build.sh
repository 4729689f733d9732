#!/usr/bin/env bash
# Developer rebuild: an editable install whose native modules are rebuilt incrementally in
# build/dev. Serialized with a lock because several people (or agents) may share the tree.
# PAGEDSERVE_CUDA=OFF skips the CUDA module for a faster loop.
set -euo pipefail
cd "$(dirname "$0")/.."
# --no-build-isolation builds with this environment's own build requirements (pyproject.toml's
# [build-system] requires): a fresh machine has them only inside pip's isolated builds.
python3 -c "import scikit_build_core, pybind11" 2>/dev/null ||
    python3 -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.12" ninja
exec flock /tmp/pagedserve-build.lock python3 -m pip install --no-build-isolation --no-deps \
    -Cbuild-dir=build/dev -Ccmake.define.PAGEDSERVE_CUDA="${PAGEDSERVE_CUDA:-AUTO}" -e . -q
