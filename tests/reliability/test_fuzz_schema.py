"""A bounded schemathesis run (EXAMPLES per route and mode: 250 cases) against the live server's
/openapi.json: valid and schema-breaking bodies for every POST route (the Responses API's cancel
route: its path id). No response is a 5xx (nor a server-error frame inside a 200 stream),
every 4xx is the error envelope of the route's API (Anthropic's on /v1/messages), and the
server is healthy after. The 10,000-case run is bench/serving/fuzz_long.py."""

from __future__ import annotations

import httpx
import pytest
from schemathesis import GenerationMode

from bench.common.schema_fuzz import (
    FuzzReport,
    fuzz_operation,
    load_schema,
    post_operations,
)
from bench.common.server import Server
from tests.reliability.conftest import wait_idle

# Examples per (operation, mode): generation routes cost engine steps, the others do not.
EXAMPLES = {
    "/v1/chat/completions": 15,
    "/v1/completions": 15,
    "/infill": 10,
    "/tokenize": 10,
    "/detokenize": 10,
    "/v1/embeddings": 10,
    "/v1/responses": 15,
    "/v1/responses/{response_id}/cancel": 5,
    "/v1/messages": 15,
    "/v1/messages/count_tokens": 10,
    "/v1/rerank": 5,
    "/v2/rerank": 5,
    "/v1/score": 5,
    "/v1/load_lora_adapter": 5,
    "/v1/unload_lora_adapter": 5,
}


def test_published_schema_covers_every_post_route(rserver: Server) -> None:
    paths = {op.path for op in post_operations(load_schema(rserver.base_url))}
    assert paths == set(EXAMPLES)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_fuzz_no_5xx_and_envelopes(rserver: Server, mode: GenerationMode) -> None:
    report = FuzzReport()
    for op in post_operations(load_schema(rserver.base_url)):
        fuzz_operation(op, rserver.base_url, mode, EXAMPLES[op.path], report)
    assert not report.problems, "\n".join(report.problems)
    assert report.num_cases >= 30, report.statuses
    # A schema-breaking body that is served must at least be one that lax validation coerced
    # (test_bad_input.test_coercible_wrong_types); anything else means /openapi.json lies.
    assert not report.schema_gaps, "\n".join(report.schema_gaps)
    if mode is GenerationMode.POSITIVE:
        statuses = {status for (_, _, status) in report.statuses}
        assert 200 in statuses, report.statuses  # the generator reaches the engine
    assert httpx.get(rserver.base_url + "/health", timeout=10).status_code == 200
    assert not any(wait_idle(rserver).values())
    assert "Traceback" not in rserver.log()
