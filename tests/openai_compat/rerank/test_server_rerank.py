"""POST /v1/rerank, /v2/rerank and /v1/score (issue 40) on a real server process serving a tiny
random Qwen3-Reranker-style checkpoint (bench/common/tiny_rerankers.py, fp32, --task score) on a
loopback port: the scores equal transformers' (the same template, softmax of the no / yes logits
at the last position, fp32) within 1e-5; Cohere's body from httpx (ordering, top_n,
return_documents, documents as objects); vLLM's score one-to-many and pairwise; LangChain's
CohereRerank (cohere's v2 client) pointed at the server; every bad input a 400 in OpenAI's
envelope naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from starlette.testclient import TestClient

from bench.common.server import API_KEY, Server, start_server, stop_server
from bench.common.tiny_rerankers import transformers_scores, write_tiny_reranker
from pagedserve.core.pooling_params import ScoreConfig
from pagedserve.openai_compat.app import create_app
from pagedserve.openai_compat.server_config import ServerConfig
from tests.openai_compat.fake_engine import FakeEngine
from tests.reliability.conftest import assert_envelope, wait_idle

QUERY = "What does a paged KV cache keep?"
DOCUMENTS = [
    "A paged KV cache keeps every request's keys and values in fixed-size pages.",
    "The quick brown fox jumps over the lazy dog.",
    "Numbers: 0 1 2 3 4 5",
    "yes",
    "Once upon a time, there was a little model that could serve many users at once.",
]
MAX_MODEL_LEN = 320
TOLERANCE = 1e-5
"""|ours - transformers'| on a probability, both fp32 (measured: ~1e-7)."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("reranker") / "tiny-qwen3-reranker"
    model = write_tiny_reranker(folder, seed=3, max_position_embeddings=512)
    return folder, model


@pytest.fixture(scope="module")
def sserver(
    folder: tuple[Path, torch.nn.Module], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    flags = [str(folder[0]), "--task", "score", "--api-key", API_KEY, "--dtype", "float32",
             "--quantization", "none", "--max-model-len", str(MAX_MODEL_LEN),
             "--num-pages", "512", "--page-size", "16", "--max-num-seqs", "32",
             "--max-num-batched-tokens", "1024", "--no-ui"]  # fmt: skip
    srv = start_server(tmp_path_factory.mktemp("sserver"), *flags)
    yield srv
    assert stop_server(srv) == 0, srv.log()


def oracle(folder: tuple[Path, torch.nn.Module], query: str, documents: list[str]) -> list[float]:
    score = ScoreConfig(token_ids=(0, 0))  # the default template and tokens; ids looked up
    return transformers_scores(folder[0], folder[1], query, documents, score)


def post(server: Server, path: str, body: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=120)


def test_score_one_to_many_and_pairwise_match_transformers(
    sserver: Server, folder: tuple[Path, torch.nn.Module]
) -> None:
    reference = oracle(folder, QUERY, DOCUMENTS)
    response = post(sserver, "/v1/score", {"model": sserver.model, "text_1": QUERY,
                                           "text_2": DOCUMENTS})  # fmt: skip
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["model"] == sserver.model
    assert body["id"].startswith("score-")
    assert [d["index"] for d in body["data"]] == list(range(len(DOCUMENTS)))
    assert all(d["object"] == "score" for d in body["data"])
    scores = [d["score"] for d in body["data"]]
    assert max(abs(a - b) for a, b in zip(scores, reference, strict=True)) <= TOLERANCE
    assert len(set(scores)) == len(scores)  # distinct, so the ordering below is meaningful
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 200 * len(DOCUMENTS)
    # Many to many: pairwise (text_1[i] with text_2[i]).
    queries = ["Hello world", QUERY]
    pairwise = post(sserver, "/v1/score", {"text_1": queries, "text_2": DOCUMENTS[:2]}).json()
    expected = [oracle(folder, q, [d])[0] for q, d in zip(queries, DOCUMENTS[:2], strict=True)]
    got = [d["score"] for d in pairwise["data"]]
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= TOLERANCE
    # One text_1 in a list broadcasts; one text_2 as a string.
    one = post(sserver, "/v1/score", {"text_1": [QUERY], "text_2": DOCUMENTS[0]}).json()
    assert abs(one["data"][0]["score"] - reference[0]) <= TOLERANCE
    assert not any(wait_idle(sserver).values())


def test_rerank_cohere_body(sserver: Server, folder: tuple[Path, torch.nn.Module]) -> None:
    reference = oracle(folder, QUERY, DOCUMENTS)
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -reference[i])
    documents: list[Any] = [*DOCUMENTS[:2], *({"text": d, "id": f"doc{i}"}
                                              for i, d in enumerate(DOCUMENTS[2:], 2))]  # fmt: skip
    body = {"model": sserver.model, "query": QUERY, "documents": documents, "top_n": 3,
            "return_documents": True}  # fmt: skip
    response = post(sserver, "/v1/rerank", body)
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["id"].startswith("rerank-") and out["model"] == sserver.model
    results = out["results"]
    assert [r["index"] for r in results] == order[:3]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    for r in results:
        assert abs(r["relevance_score"] - reference[r["index"]]) <= TOLERANCE
        sent = documents[r["index"]]
        assert r["document"] == (sent if isinstance(sent, dict) else {"text": sent})
    assert out["usage"]["total_tokens"] > 200 * len(DOCUMENTS)
    assert out["meta"]["billed_units"]["search_units"] == 1
    # No top_n: every document; return_documents false: no document; /v2/rerank alike.
    bare = post(sserver, "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS,
                                        "return_documents": False, "top_n": 99}).json()  # fmt: skip
    assert [r["index"] for r in bare["results"]] == order
    assert all(set(r) == {"index", "relevance_score"} for r in bare["results"])
    # Cohere v2's max_tokens_per_doc cuts each document before it is scored.
    cut = post(sserver, "/v1/rerank", {"query": QUERY, "documents": [DOCUMENTS[0]],
                                       "max_tokens_per_doc": 3}).json()  # fmt: skip
    assert abs(cut["results"][0]["relevance_score"] - reference[0]) > 1e-6


def test_langchain_cohere_rerank(sserver: Server, folder: tuple[Path, torch.nn.Module]) -> None:
    """LangChain's CohereRerank speaks Cohere's v2 API through the cohere SDK's ClientV2,
    pointed at the server by base_url (it posts to /v2/rerank)."""
    pytest.importorskip("langchain_cohere")
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reference = oracle(folder, QUERY, DOCUMENTS)
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -reference[i])
    reranker = CohereRerank(base_url=sserver.base_url, model=sserver.model,
                            cohere_api_key=API_KEY, top_n=2)  # fmt: skip
    results = reranker.rerank(DOCUMENTS, QUERY, top_n=4)
    assert [r["index"] for r in results] == order[:4]
    assert abs(results[0]["relevance_score"] - reference[order[0]]) <= TOLERANCE
    kept = reranker.compress_documents([Document(d) for d in DOCUMENTS], QUERY)
    assert [d.page_content for d in kept] == [DOCUMENTS[i] for i in order[:2]]
    assert all("relevance_score" in d.metadata for d in kept)


BAD_BODIES = [
    ("/v1/rerank", {"query": QUERY, "documents": []}, "documents"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a", ""]}, "documents"),
    ("/v1/rerank", {"query": QUERY, "documents": "a"}, "documents"),
    ("/v1/rerank", {"query": QUERY, "documents": [{"title": "no text"}]}, "documents"),
    ("/v1/rerank", {"query": QUERY, "documents": [5]}, "documents"),
    ("/v1/rerank", {"query": 3, "documents": ["a"]}, "query"),
    ("/v1/rerank", {"documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"], "top_n": 0}, "top_n"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"], "top_n": "2"}, "top_n"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"], "return_documents": 1},
     "return_documents"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
    ("/v1/score", {"text_1": "a", "text_2": []}, "text_2"),
    ("/v1/score", {"text_1": "a"}, "text_2"),
    ("/v1/score", {"text_1": "a", "text_2": [1, 2]}, "text_2"),
]  # fmt: skip


def test_bad_bodies_are_400s_naming_the_field(sserver: Server) -> None:
    for path, body, param in BAD_BODIES:
        error = assert_envelope(post(sserver, path, body))
        # The field, or an item of it (documents[1], documents[0].text).
        assert error["param"].split("[")[0].split(".")[0] == param, (path, body, error)
    long = "the scheduler batches requests " * 60
    response = post(sserver, "/v1/rerank", {"query": QUERY, "documents": ["a", long]})
    assert response.status_code == 400
    error = assert_envelope(response)
    assert error["param"] == "documents" and "maximum context length" in error["message"]
    assert "pair 1" in error["message"]
    error = assert_envelope(post(sserver, "/v1/score", {"text_1": long, "text_2": "a"}))
    assert error["code"] == "context_length_exceeded"
    missing = post(sserver, "/v1/rerank", {"model": "other", "query": "q", "documents": ["a"]})
    assert missing.status_code == 404
    # The other tasks' routes, on a score server: a 400 naming the task.
    chat = post(sserver, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert "serves task score" in assert_envelope(chat)["message"]
    embed = assert_envelope(post(sserver, "/v1/embeddings", {"input": "hi"}))
    assert "task score" in embed["message"] and embed["param"] == "model"
    card = httpx.get(sserver.base_url + "/v1/models",
                     headers={"Authorization": f"Bearer {API_KEY}"}).json()  # fmt: skip
    assert card["data"][0]["task"] == "score"
    assert not any(wait_idle(sserver).values())
    assert "Traceback" not in sserver.log()


def test_a_generation_server_cannot_score() -> None:
    with TestClient(create_app(ServerConfig(), FakeEngine)) as fake:
        for _ in range(200):
            if fake.get("/health").status_code == 200:
                break
        for path, body in [("/v1/rerank", {"query": "q", "documents": ["a"]}),
                           ("/v1/score", {"text_1": "q", "text_2": "a"})]:  # fmt: skip
            error = assert_envelope(fake.post(path, json=body))  # type: ignore[arg-type]
            assert error["param"] == "model" and "cannot score" in error["message"]
            assert "--task score" in error["message"]
