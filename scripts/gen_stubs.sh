#!/usr/bin/env bash
# Regenerate the type stubs of the compiled modules (pagedserve/_core.pyi, _cuda.pyi) from the
# built modules, after changing cpp/bindings/. Needs pybind11-stubgen (pip install
# pybind11-stubgen) and a build (./scripts/dev_build.sh). tests/native/test_stubs.py fails
# while a stub and its module disagree.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for module in _core _cuda; do
    python -c "import pagedserve.$module" 2>/dev/null || { echo "skip $module (not built)"; continue; }
    pybind11-stubgen "pagedserve.$module" -o "$out" >/dev/null
    {
        echo "# Type stubs of the compiled module pagedserve.$module (cpp/bindings/), for mypy."
        echo "# Generated with \`pybind11-stubgen pagedserve.$module\` from the built module, then formatted with"
        echo "# ruff; regenerate after changing the bindings (scripts/gen_stubs.sh). tests/native/test_stubs.py"
        echo "# checks that the stub and the built module name the same things."
        sed 's/^KV_CACHE_DIMS: tuple = /KV_CACHE_DIMS: tuple[str, ...] = /' "$out/pagedserve/$module.pyi"
    } > "pagedserve/$module.pyi"
    ruff format -q "pagedserve/$module.pyi"
    ruff check --fix -q "pagedserve/$module.pyi"
    echo "wrote pagedserve/$module.pyi"
done
