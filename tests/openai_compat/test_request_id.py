"""X-Request-Id on every response (errors included) and on every log line of the request, and
the access log (`--access-log`), over the fake engine."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from pagedserve.openai_compat.common.request_log import RequestIdFilter
from pagedserve.openai_compat.server_config import ServerConfig
from tests.openai_compat.fake_app import fake_client
from tests.openai_compat.fake_engine import FakeEngine

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def client() -> Iterator[TestClient]:
    yield from fake_client(FakeEngine(), ServerConfig(access_log=True))


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/v1/chat/completions", CHAT, 200),
        ("POST", "/v1/chat/completions", {**CHAT, "stream": True}, 200),
        ("POST", "/v1/chat/completions", {**CHAT, "n": 0}, 400),
        ("GET", "/v1/models/nope", None, 404),
        ("GET", "/no/such/route", None, 404),
        ("GET", "/metrics", None, 200),
    ],
)
def test_client_id_echoed_on_every_response(
    client: TestClient, method: str, path: str, body: dict | None, status: int
) -> None:
    r = client.request(method, path, json=body, headers={"X-Request-Id": "trace-7f3a"})
    assert r.status_code == status, r.text
    assert r.headers["x-request-id"] == "trace-7f3a"


def test_generated_id_when_absent_or_unusable(client: TestClient) -> None:
    ids = []
    for headers in ({}, {"X-Request-Id": "x" * 129}, {"X-Request-Id": "has space"}):
        r = client.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 200
        ids.append(r.headers["x-request-id"])
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids) and len(set(ids)) == 3


def test_refused_by_the_api_key_still_carries_the_id() -> None:
    for client in fake_client(FakeEngine(), ServerConfig(api_key="k")):
        r = client.get("/v1/models", headers={"X-Request-Id": "no-key-1"})
        assert r.status_code == 401 and r.headers["x-request-id"] == "no-key-1"


def test_log_lines_carry_the_request_id(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The access line and the failure line of a request both carry its id (the 500's message
    through the filter the CLI installs on its log handler."""
    caplog.handler.addFilter(RequestIdFilter())
    engine: FakeEngine = client.app.state.server.engine  # type: ignore[attr-defined]
    engine.fail_requests = True
    with caplog.at_level(logging.INFO):
        r = client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "boom-42"})
        client.get("/health", headers={"X-Request-Id": "other-1"})
    assert r.status_code == 500 and r.headers["x-request-id"] == "boom-42"
    mine = [rec for rec in caplog.records if getattr(rec, "request_id", None) == "boom-42"]
    assert {rec.name for rec in mine} >= {"pagedserve.server", "pagedserve.access"}, mine
    access = [rec.getMessage() for rec in mine if rec.name == "pagedserve.access"]
    assert len(access) == 1 and '"POST /v1/chat/completions" 500' in access[0], access
    others = [rec for rec in caplog.records if getattr(rec, "request_id", None) == "other-1"]
    assert [rec.name for rec in others] == ["pagedserve.access"]


def test_no_access_log_unless_asked(caplog: pytest.LogCaptureFixture) -> None:
    for client in fake_client(FakeEngine()):
        with caplog.at_level(logging.INFO):
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert not [rec for rec in caplog.records if rec.name == "pagedserve.access"]
