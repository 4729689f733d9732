"""The app over a FakeEngine in a TestClient, once /health says it is ready."""

from __future__ import annotations

import time
from collections.abc import Iterator

from starlette.testclient import TestClient

from pagedserve.openai_compat.app import create_app
from pagedserve.openai_compat.server_config import ServerConfig
from tests.openai_compat.fake_engine import FakeEngine


def fake_client(engine: FakeEngine, config: ServerConfig | None = None) -> Iterator[TestClient]:
    """Yields one ready client (use as a fixture body: `yield from fake_client(...)`)."""
    app = create_app(config or ServerConfig(), lambda: engine)
    with TestClient(app) as client:
        for _ in range(200):
            if client.get("/health").status_code == 200:
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the app never became ready")
        yield client
