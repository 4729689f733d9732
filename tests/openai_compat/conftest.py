"""The session's shared server: a real `python -m pagedserve serve` (bench/common/server.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.common.server import API_KEY, Server, start_server, stop_server

BODY_LIMIT = 1024 * 1024


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp_dir = tmp_path_factory.mktemp("server")
    flags = ["--api-key", API_KEY, "--max-model-len", "1024", "--num-pages", "512",
             "--max-num-seqs", "64", "--max-body-bytes", str(BODY_LIMIT)]  # fmt: skip
    srv = start_server(tmp_dir, *flags)
    yield srv
    code = stop_server(srv)
    assert code == 0, srv.log()
