"""POST /v1/embeddings (issue 25) on a real server process serving a tiny random Qwen3 embedder
(tests/tiny_embedders.py, fp32) on a loopback port, through the OpenAI SDK (float and base64,
dimensions), LangChain's OpenAIEmbeddings (texts, and the token-id lists it sends by default)
and curl; every bad input a 400 in OpenAI's envelope; generation routes refused by task; the
metrics; a client that leaves aborts its inputs. The vectors are compared with
sentence-transformers' on the same folder."""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import orjson
import pytest
import torch
from starlette.testclient import TestClient

from bench.common.server import API_KEY, Server, start_server, stop_server
from bench.common.tiny_embedders import write_tiny_embedder
from pagedserve.openai_compat.app import create_app
from pagedserve.openai_compat.embeddings.protocol import MAX_INPUTS
from pagedserve.openai_compat.server_config import ServerConfig
from tests.openai_compat.fake_engine import FakeEngine
from tests.reliability.conftest import assert_envelope, wait_idle

TEXTS = [
    "the quick brown fox",
    "Hello world! Hello there, how are you today? The scheduler batches requests.",
    "x",
]
MAX_MODEL_LEN = 64
PROMPT = "query: "
HIDDEN = 64
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("embedder") / "tiny-qwen3-embedder"
    # A default prompt, as sentence-transformers applies it to every text (ids are taken as is).
    write_tiny_embedder(folder, seed=1, is_matryoshka=True, prompts={"query": PROMPT},
                        default_prompt_name="query")  # fmt: skip
    return folder


@pytest.fixture(scope="module")
def eserver(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = [str(folder), "--api-key", API_KEY, "--dtype", "float32", "--quantization", "none",
             "--max-model-len", str(MAX_MODEL_LEN), "--num-pages", "256", "--page-size", "8",
             "--max-num-seqs", "32", "--max-num-batched-tokens", "64", "--max-waiting", "64",
             "--no-ui"]  # fmt: skip
    srv = start_server(tmp_path_factory.mktemp("eserver"), *flags)
    yield srv
    assert stop_server(srv) == 0, srv.log()


@pytest.fixture(scope="module")
def reference(folder: Path) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return torch.tensor(model.encode(TEXTS, batch_size=len(TEXTS)), dtype=torch.float64)


@pytest.fixture(scope="module")
def client(eserver: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=eserver.base_url + "/v1", api_key=API_KEY, max_retries=0)


def post(server: Server, body: Any, path: str = "/v1/embeddings") -> httpx.Response:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=120)


def assert_close(vectors: Any, reference: torch.Tensor) -> None:
    got = torch.tensor(np.asarray(vectors, dtype=np.float64))
    cos = torch.nn.functional.cosine_similarity(got, reference, dim=1)
    assert bool((cos >= 1 - TOLERANCE).all()), cos.tolist()


def test_models_say_the_task(client: openai.OpenAI) -> None:
    card = client.models.list().data[0]
    assert card.task == "embed"  # type: ignore[attr-defined]


def test_sdk_float_and_base64_match_sentence_transformers(
    client: openai.OpenAI, eserver: Server, reference: torch.Tensor
) -> None:
    floats = client.embeddings.create(model=eserver.model, input=TEXTS, encoding_format="float")
    assert floats.object == "list" and floats.model == eserver.model
    assert [d.index for d in floats.data] == [0, 1, 2]
    assert all(d.object == "embedding" and len(d.embedding) == HIDDEN for d in floats.data)
    assert_close([d.embedding for d in floats.data], reference)
    # The SDK asks for base64 unless told otherwise, and decodes it itself.
    default = client.embeddings.create(model=eserver.model, input=TEXTS)
    assert [d.embedding for d in default.data] == [
        list(np.float32(x) for x in d.embedding) for d in floats.data
    ]
    usage = floats.usage
    assert usage.prompt_tokens == usage.total_tokens == default.usage.prompt_tokens > 3
    # Little-endian float32, as the SDK reads it.
    raw = post(eserver, {"input": "x", "encoding_format": "base64"}).json()["data"][0]
    decoded = np.frombuffer(base64.b64decode(raw["embedding"]), dtype="<f4")
    assert np.allclose(decoded, floats.data[2].embedding, atol=1e-7)


def test_single_text_and_token_ids(
    client: openai.OpenAI, eserver: Server, reference: torch.Tensor
) -> None:
    one = client.embeddings.create(model=eserver.model, input=TEXTS[0], encoding_format="float")
    assert len(one.data) == 1
    assert_close([one.data[0].embedding], reference[:1])
    ids = httpx.post(
        eserver.base_url + "/tokenize", json={"prompt": PROMPT + TEXTS[0]},
        headers={"Authorization": f"Bearer {API_KEY}"},
    ).json()["tokens"]  # fmt: skip
    as_ids = client.embeddings.create(model=eserver.model, input=ids, encoding_format="float")
    assert_close([as_ids.data[0].embedding], reference[:1])
    bare_ids = httpx.post(
        eserver.base_url + "/tokenize", json={"prompt": TEXTS[0]},
        headers={"Authorization": f"Bearer {API_KEY}"},
    ).json()["tokens"]  # fmt: skip
    bare = client.embeddings.create(model=eserver.model, input=bare_ids, encoding_format="float")
    cos = torch.nn.functional.cosine_similarity(
        torch.tensor([bare.data[0].embedding], dtype=torch.float64), reference[:1]
    )
    assert cos.item() < 0.9999  # without the prompt: another vector
    lists = client.embeddings.create(model=eserver.model, input=[ids, [5, 6, 7]])
    assert len(lists.data) == 2 and lists.usage.prompt_tokens == len(ids) + 3


def test_dimensions_truncate_and_renormalize(client: openai.OpenAI, eserver: Server) -> None:
    full = client.embeddings.create(model=eserver.model, input=TEXTS, encoding_format="float")
    short = client.embeddings.create(model=eserver.model, input=TEXTS, dimensions=16)
    expected = torch.nn.functional.normalize(
        torch.tensor([d.embedding[:16] for d in full.data], dtype=torch.float64), dim=1
    )
    assert all(len(d.embedding) == 16 for d in short.data)
    assert_close([d.embedding for d in short.data], expected)
    with pytest.raises(openai.BadRequestError) as bad:
        client.embeddings.create(model=eserver.model, input="x", dimensions=HIDDEN + 1)
    assert bad.value.body["param"] == "dimensions"  # type: ignore[index]


def test_langchain_texts(eserver: Server, reference: torch.Tensor) -> None:
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model=eserver.model, base_url=eserver.base_url + "/v1", api_key=API_KEY,
        check_embedding_ctx_length=False,
    )  # fmt: skip
    assert_close(embeddings.embed_documents(TEXTS), reference)
    assert_close([embeddings.embed_query(TEXTS[1])], reference[1:2])


def _byte_encoding() -> Any:
    """A tiktoken encoding of plain bytes (ids 0..255, in our tiny vocabulary): LangChain
    tokenizes with tiktoken by default, whose real vocabularies need a download."""
    import tiktoken

    ranks = {bytes([i]): i for i in range(256)}
    return tiktoken.Encoding("bytes", pat_str=r"[\s\S]", mergeable_ranks=ranks, special_tokens={})


def test_langchain_default_sends_token_ids(
    eserver: Server, client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tiktoken
    from langchain_openai import OpenAIEmbeddings

    encoding = _byte_encoding()

    def unknown_model(name: str) -> Any:
        raise KeyError(name)

    monkeypatch.setattr(tiktoken, "encoding_for_model", unknown_model)
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: encoding)
    # 32-token chunks: the longer text is split, embedded in pieces and averaged by LangChain.
    embeddings = OpenAIEmbeddings(
        model=eserver.model, base_url=eserver.base_url + "/v1", api_key=API_KEY,
        embedding_ctx_length=32,
    )  # fmt: skip
    got = embeddings.embed_documents(TEXTS)
    for text, vector in zip(TEXTS, got, strict=True):
        ids = list(text.encode())
        chunks = [ids[i : i + 32] for i in range(0, len(ids), 32)]
        data = client.embeddings.create(model=eserver.model, input=chunks).data
        average = np.average([d.embedding for d in data], axis=0, weights=[len(c) for c in chunks])
        expected = torch.from_numpy(average / np.linalg.norm(average))[None]
        assert_close([vector], expected)


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl(eserver: Server, reference: torch.Tensor) -> None:
    body = {"model": eserver.model, "input": TEXTS}
    out = subprocess.run(
        ["curl", "-sS", eserver.base_url + "/v1/embeddings", "-H", "Content-Type: application/json",
         "-H", f"Authorization: Bearer {API_KEY}", "-d", orjson.dumps(body).decode()],
        capture_output=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    response = orjson.loads(out)
    assert set(response) == {"object", "data", "model", "usage"}
    assert_close([d["embedding"] for d in response["data"]], reference)


BAD_BODIES = [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [""]}, "input"),
    ({"input": ["a", ""]}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [[1, 2], []]}, "input"),
    ({"input": ["x"] * 2049}, "input"),
    ({"input": [[1]] * 2049}, "input"),
    ({"input": 5}, "input"),
    ({"input": None}, "input"),
    ({"input": [1.5]}, "input"),
    ({"input": [True]}, "input"),
    ({"input": [["a"]]}, "input"),
    ({"input": ["a", 1]}, "input"),
    ({"input": "a\u0000b"}, "input"),
    ({"input": [10**9]}, "input"),
    ({"input": [-1]}, "input"),
    ({"input": [[1], [400000]]}, "input"),
    ({}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x", "dimensions": "8"}, "dimensions"),
    ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"input": "x", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"input": "x", "truncate_prompt_tokens": MAX_MODEL_LEN + 1}, "truncate_prompt_tokens"),
    ({"input": "x", "user": 5}, "user"),
    ({"input": "x", "stream": True}, "stream"),
]


@pytest.mark.parametrize(("body", "param"), BAD_BODIES, ids=lambda v: str(v)[:40])
def test_bad_input_is_a_400(eserver: Server, body: dict[str, Any], param: str) -> None:
    error = assert_envelope(post(eserver, body))
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_length_limit_and_truncation(eserver: Server) -> None:
    long_text = "the quick brown fox " * 40  # well over 64 tokens
    error = assert_envelope(post(eserver, {"input": ["x", long_text]}))
    assert error["code"] == "context_length_exceeded" and error["param"] == "input"
    assert str(MAX_MODEL_LEN) in error["message"]
    full = post(eserver, {"input": [long_text], "truncate_prompt_tokens": -1})
    assert full.status_code == 200 and full.json()["usage"]["prompt_tokens"] == MAX_MODEL_LEN
    body = {"input": [list(range(3, 90)), list(range(3, 20))], "truncate_prompt_tokens": 8}
    last8 = post(eserver, body)
    assert last8.json()["usage"]["prompt_tokens"] == 16
    same = post(eserver, {"input": [list(range(12, 20))]}).json()["data"][0]["embedding"]
    assert np.allclose(last8.json()["data"][1]["embedding"], same, atol=1e-6)  # the last 8


def test_model_name_and_many_inputs(eserver: Server) -> None:
    assert post(eserver, {"input": "x", "model": "other"}).status_code == 404
    many = post(eserver, {"input": [[i % 300 + 3] for i in range(2048)], "user": "u1"})
    assert many.status_code == 200, many.text[:300]
    data = many.json()["data"]
    assert [d["index"] for d in data] == list(range(2048))
    assert many.json()["usage"]["prompt_tokens"] == 2048
    # --max-waiting 64: the inputs went in waves, each vector still in its place.
    for i in (0, 5, 299, 1000, 2047):
        alone = post(eserver, {"input": [[i % 300 + 3]]}).json()["data"][0]["embedding"]
        assert np.allclose(data[i]["embedding"], alone, atol=1e-6), i


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_generation_routes_refused_naming_the_task(eserver: Server, path: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "a"}
    error = assert_envelope(post(eserver, body, path))
    assert "task embed" in error["message"] and path in error["message"], error
    assert error["param"] == "model"


def test_metrics_count_embedding_requests_and_tokens(eserver: Server) -> None:
    before = eserver.metrics()
    response = post(eserver, {"input": [[3, 4, 5], [6, 7]]})
    assert response.status_code == 200
    after = eserver.metrics()
    for name, delta in (("pagedserve:embedding_requests_total", 1),
                        ("pagedserve:embedding_inputs_total", 2),
                        ("vllm:prompt_tokens_total", 5)):  # fmt: skip
        assert eserver.metric(name, after) - eserver.metric(name, before) == delta, name
    assert eserver.metric("vllm:request_success_total", after) > eserver.metric(
        "vllm:request_success_total", before
    )


def _post_then_leave_while_running(server: Server, body: bytes) -> bool:
    """Sends the request on a raw socket, waits until the server holds some of its inputs
    (running or waiting), then closes the connection; False when the answer began before any
    was seen (a quiet machine embeds 2000 inputs in well under a second)."""
    host, port = server.base_url.removeprefix("http://").split(":")
    head = (f"POST /v1/embeddings HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode() + body)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            samples = server.metrics()
            if server.metric("vllm:num_requests_running", samples) + server.metric(
                "vllm:num_requests_waiting", samples
            ):
                return True  # leaving now: the with block closes the socket
            sock.settimeout(0.0)
            try:
                if sock.recv(1, socket.MSG_PEEK):
                    return False  # the answer has begun: nothing left to abort
            except BlockingIOError:
                pass
            time.sleep(0.005)
    return False


def _ended_by_reason(server: Server) -> tuple[float, float]:
    """(inputs ended normally, inputs aborted) so far, from one /metrics scrape."""
    samples = server.metrics()
    ended = [(k, v) for k, v in samples.items() if k.startswith("vllm:request_success_total{")]
    aborted = sum(v for k, v in ended if 'finished_reason="abort"' in k)
    return sum(v for _, v in ended) - aborted, aborted


def test_a_client_that_leaves_aborts_its_inputs(eserver: Server) -> None:
    """2048 inputs (the most one request may carry), 64 waiting at most: the client leaves
    while they run in waves; the inputs admitted and unfinished are aborted (at least one),
    the rest never start, and nothing is left running, waiting or holding pages. A fast machine may embed them
    all before it notices the client left: such a try shows nothing and is tried again."""
    inputs = MAX_INPUTS  # the most one request may carry
    body = orjson.dumps({"input": [list(range(3, 3 + MAX_MODEL_LEN))] * inputs})
    left_early = 0
    for _ in range(5):
        done_before, aborted_before = _ended_by_reason(eserver)
        if not _post_then_leave_while_running(eserver, body):
            continue
        assert not any(wait_idle(eserver).values())
        # wait_idle reads running + waiting as the event loop counts them (0 once the streams
        # close) and the pages from the engine's snapshot, which lags: inputs admitted just
        # before the leave may still sit in the engine thread's queue with their aborts. Read
        # the counters until the aborts land.
        deadline = time.monotonic() + 10
        while True:
            done, aborted = _ended_by_reason(eserver)
            done, aborted = done - done_before, aborted - aborted_before
            if aborted or done == inputs or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if done == inputs:
            continue  # it had finished before the server saw the client go
        assert aborted >= 1 and done + aborted < inputs, (done, aborted)
        left_early += 1
    assert left_early, "no try left before the server had embedded every input"
    assert post(eserver, {"input": "x"}).status_code == 200
    assert "Traceback" not in eserver.log()


def test_a_generation_server_answers_not_an_embedding_model() -> None:
    with TestClient(create_app(ServerConfig(), FakeEngine)) as fake:
        for _ in range(200):
            if fake.get("/health").status_code == 200:
                break
        response = fake.post("/v1/embeddings", json={"input": "hi"})
        error = assert_envelope(response)  # type: ignore[arg-type]
        assert "is not an embedding model" in error["message"] and error["param"] == "model"
        assert fake.get("/v1/models").json()["data"][0]["task"] == "generate"


def test_task_and_matryoshka_flags() -> None:
    from tests.openai_compat.test_cli import _configs

    _, engine = _configs(["m", "--task", "embed", "--matryoshka"])
    assert (engine.model.task, engine.model.matryoshka) == ("embed", True)
    _, engine = _configs(["m", "--no-matryoshka"])
    assert (engine.model.task, engine.model.matryoshka) == ("auto", False)
    assert _configs(["m"])[1].model.matryoshka is None
    with pytest.raises(SystemExit):
        _configs(["m", "--task", "classify"])
