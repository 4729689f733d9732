#!/usr/bin/env bash
# Developer rebuild: an editable install whose native modules are rebuilt incrementally in
# build/dev. Serialized with a lock because several people (or agents) may share the tree.
# PAGEDSERVE_CUDA=OFF skips the CUDA module for a faster loop.
set -euo pipefail
cd "$(dirname "$0")/.."
exec flock /tmp/pagedserve-build.lock python3 -m pip install --no-build-isolation --no-deps \
    -Cbuild-dir=build/dev -Ccmake.define.PAGEDSERVE_CUDA="${PAGEDSERVE_CUDA:-AUTO}" -e . -q
