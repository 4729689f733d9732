"""Schemathesis on an embedding server (issue 25): valid and schema-breaking bodies for
POST /v1/embeddings (the generation server of test_fuzz_schema.py answers every one with a 400,
so the engine is reached only here). No 5xx, every 4xx in OpenAI's envelope, a 200 for some
valid bodies, no schema gap, and the server idle and healthy after; the generation routes of
this server are fuzzed too (each a 400 naming the task)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from schemathesis import GenerationMode

from bench.common.schema_fuzz import (
    FuzzReport,
    fuzz_operation,
    load_schema,
    post_operations,
)
from bench.common.server import Server, start_server, stop_server
from bench.common.tiny_embedders import write_tiny_embedder
from tests.reliability.conftest import wait_idle

EXAMPLES = {"/v1/embeddings": 60, "/v1/chat/completions": 5, "/v1/completions": 5}


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("fuzz-embedder") / "embedder"
    write_tiny_embedder(folder, seed=1, is_matryoshka=True)
    flags = [str(folder), "--max-model-len", "256", "--num-pages", "512", "--page-size", "8",
             "--max-num-seqs", "64", "--max-waiting", "4096", "--access-log"]  # fmt: skip
    srv = start_server(tmp_path_factory.mktemp("fuzz-eserver"), *flags)
    yield srv
    assert stop_server(srv) == 0, srv.log()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_fuzz_embeddings_no_5xx(embed_server: Server, mode: GenerationMode) -> None:
    report = FuzzReport()
    for op in post_operations(load_schema(embed_server.base_url)):
        if op.path in EXAMPLES:
            fuzz_operation(op, embed_server.base_url, mode, EXAMPLES[op.path], report)
    assert not report.problems, "\n".join(report.problems)
    assert not report.schema_gaps, "\n".join(report.schema_gaps)
    statuses = {status for (label, _, status) in report.statuses if "embeddings" in label}
    if mode is GenerationMode.POSITIVE:
        assert 200 in statuses, report.statuses  # the generator reaches the engine
    generation = {s for (label, _, s) in report.statuses if "embeddings" not in label}
    assert generation <= {400, 413, 422}, report.statuses
    assert httpx.get(embed_server.base_url + "/health", timeout=10).status_code == 200
    assert not any(wait_idle(embed_server).values())
    assert "Traceback" not in embed_server.log()
