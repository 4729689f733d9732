from __future__ import annotations

import sys
from pathlib import Path

import pytest

# tests/ is not a package and the pytest config has no pythonpath: make `tests.*` importable.
_ROOT = str(Path(__file__).resolve().parents[3])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from pagedserve.core.models.resolve import ResolvedModel, resolve_model  # noqa: E402


@pytest.fixture(scope="session")
def default_model(request: pytest.FixtureRequest) -> ResolvedModel:
    """The bundled default GGUF, fetched once into pytest's cache folder (kept between runs)."""
    cache_dir = Path(request.config.cache.mkdir("pagedserve-models"))
    return resolve_model("", cache_dir=cache_dir)
