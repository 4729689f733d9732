"""Fill-in-the-middle through a real server process (a tiny random Llama whose BPE vocabulary
has Qwen2.5-Coder's FIM tokens, on a loopback port): `suffix` on /v1/completions through the
OpenAI SDK, plain and streamed, and llama.cpp's POST /infill through httpx, plain and streamed,
with input_extra as repository context; the prompt ids checked against the tokenizer by
usage / tokens_evaluated and by the builders themselves; the 400s (no FIM tokens on the fake
engine's byte vocabulary, echo with suffix, bad bodies) in OpenAI's envelope."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from starlette.testclient import TestClient

from bench.common.server import API_KEY, Server, parse_sse, start_server, stop_server
from bench.common.tiny_models import write_hf_model
from pagedserve.core.tokenizers.load import Tokenizer, load_tokenizer
from pagedserve.openai_compat.completions.fim import fim_prompt
from pagedserve.openai_compat.infill.prompt import infill_prompt
from pagedserve.openai_compat.infill.protocol import InfillRequest
from tests.core.test_fim_tokens import QWEN_FIM, write_bpe_folder
from tests.openai_compat.fake_app import fake_client
from tests.openai_compat.fake_engine import FakeEngine
from tests.reliability.conftest import assert_envelope

PREFIX = "def add(a, b):\n"
SUFFIX = "\n    return c\n"
MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_bpe_folder(tmp_path_factory.mktemp("fim") / "tiny-coder", QWEN_FIM)
    vocab_size = load_tokenizer(folder).vocab_size
    write_hf_model(folder, "llama", seed=7, vocab_size=vocab_size)
    return folder


@pytest.fixture(scope="module")
def tokenizer(folder: Path) -> Tokenizer:
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def fim_server(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = [str(folder), "--api-key", API_KEY, "--dtype", "float32", "--max-model-len",
             str(MAX_MODEL_LEN), "--num-pages", "128", "--max-num-seqs", "8", "--no-ui"]  # fmt: skip
    srv = start_server(tmp_path_factory.mktemp("fim-server"), *flags)
    yield srv
    assert stop_server(srv) == 0, srv.log()


@pytest.fixture(scope="module")
def client(fim_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=fim_server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def post(server: Server, path: str, body: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=120)


def expected_psm(tok: Tokenizer, prefix: str, suffix: str) -> list[int]:
    fim = tok.fim
    assert fim is not None
    return [fim.prefix_id, *tok.encode_plain(prefix), fim.suffix_id, *tok.encode_plain(suffix),
            fim.middle_id]  # fmt: skip


def test_fim_prompt_is_psm_in_ids(tokenizer: Tokenizer) -> None:
    fim = tokenizer.fim
    assert fim is not None and not tokenizer.add_bos_token
    prefix = PREFIX + "<|fim_middle|>"  # marker text in the code stays text
    built = fim_prompt(
        tokenizer, fim, tokenizer.encode_plain(prefix), tokenizer.encode_plain(SUFFIX)
    )
    assert built == expected_psm(tokenizer, prefix, SUFFIX)
    assert built.count(fim.middle_id) == 1


def test_completions_suffix(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    out = client.completions.create(
        model=client.models.list().data[0].id, prompt=PREFIX, suffix=SUFFIX, max_tokens=6,
        temperature=0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert out.usage is not None
    assert out.usage.prompt_tokens == len(expected_psm(tokenizer, PREFIX, SUFFIX))
    assert out.usage.completion_tokens == 6 and out.choices[0].finish_reason == "length"
    text = out.choices[0].text
    streamed = client.completions.create(
        model=out.model, prompt=PREFIX, suffix=SUFFIX, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == out.usage.prompt_tokens
    )
    plain = client.completions.create(model=out.model, prompt=PREFIX, max_tokens=1)
    assert plain.usage is not None and plain.usage.prompt_tokens == len(tokenizer.encode(PREFIX))


def test_completions_suffix_stops_at_fim_end_tokens(
    client: openai.OpenAI, tokenizer: Tokenizer
) -> None:
    """Forcing <|file_sep|> (a FIM end token) first: the middle ends at once, as a stop."""
    fim = tokenizer.fim
    assert fim is not None and fim.file_sep_id is not None
    out = client.completions.create(
        model=client.models.list().data[0].id, prompt=PREFIX, suffix=SUFFIX, max_tokens=8,
        logit_bias={str(fim.file_sep_id): 100},
    )  # fmt: skip
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == ""
    assert out.usage is not None and out.usage.completion_tokens == 1


def test_completions_suffix_refusals(client: openai.OpenAI, fim_server: Server) -> None:
    body = {"prompt": PREFIX, "suffix": SUFFIX, "echo": True}
    assert assert_envelope(post(fim_server, "/v1/completions", body))["param"] == "echo"
    body = {"prompt": PREFIX, "suffix": 3}
    assert assert_envelope(post(fim_server, "/v1/completions", body))["param"] == "suffix"


def test_infill(fim_server: Server, tokenizer: Tokenizer) -> None:
    fim = tokenizer.fim
    assert fim is not None and fim.repo_id is not None and fim.file_sep_id is not None
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "    c = ",
            "input_extra": [{"filename": "util.py", "text": "X = 1\n"}],
            "n_predict": 5, "temperature": 0, "ignore_eos": True,
            "cache_prompt": True, "samplers": ["top_k", "top_p", "infill"], "t_max_prompt_ms": 500}  # fmt: skip
    r = post(fim_server, "/infill", body)
    assert r.status_code == 200, r.text
    out = r.json()
    enc = tokenizer.encode_plain
    context = [fim.repo_id, *enc("myproject\n"), fim.file_sep_id, *enc("util.py\n"), *enc("X = 1\n"),
               fim.file_sep_id, *enc("filename\n")]  # fmt: skip
    expected = [*context, fim.prefix_id, *enc(PREFIX), *enc("    c = "), fim.suffix_id,
                *enc(SUFFIX), fim.middle_id]  # fmt: skip
    request = InfillRequest.model_validate(body)
    assert infill_prompt(tokenizer, fim, request, MAX_MODEL_LEN).token_ids == expected
    assert out["tokens_evaluated"] == len(expected) and out["tokens_predicted"] == 5
    assert out["stop"] is True and out["stop_type"] == "limit" and out["truncated"] is False
    assert out["content"] == tokenizer.decode(out["tokens"])
    r = post(fim_server, "/infill", {**body, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    lines = parse_sse(r.content)  # `data: {...}` frames, and no [DONE]
    assert all(isinstance(line, dict) for line in lines)
    assert [line["stop"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert "".join(line["content"] for line in lines) == out["content"]
    assert lines[-1]["tokens_predicted"] == 5 and lines[-1]["stop_type"] == "limit"


def test_infill_cuts_to_the_context(fim_server: Server, tokenizer: Tokenizer) -> None:
    """Too long for the context: the oldest extra context and the prefix's start go first."""
    body = {"input_prefix": "x = 1\n" * 200, "input_suffix": SUFFIX, "n_predict": 4,
            "input_extra": [{"filename": "a.py", "text": "y = 2\n" * 200}], "temperature": 0}  # fmt: skip
    out = post(fim_server, "/infill", body).json()
    assert out["truncated"] is True and out["tokens_evaluated"] <= MAX_MODEL_LEN - 4
    warm = post(fim_server, "/infill", {**body, "n_predict": 0}).json()
    assert (warm["content"], warm["tokens_predicted"], warm["stop_type"]) == ("", 0, "limit")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input_prefix": 1}, "input_prefix"),
        ({"input_extra": [{"filename": "a", "text": 2}]}, "input_extra[0].text"),
        ({"input_extra": {"text": "a"}}, "input_extra"),
        ({"n_predict": -2}, "n_predict"),
        ({"nonsense": True}, "nonsense"),
    ],
)
def test_infill_bad_bodies(fim_server: Server, body: dict, param: str) -> None:
    error = assert_envelope(post(fim_server, "/infill", body))
    assert error["type"] == "invalid_request_error" and error["param"] == param


@pytest.fixture(scope="module")
def fake() -> Iterator[TestClient]:
    yield from fake_client(FakeEngine())


def test_no_fim_tokens_is_a_400(fake: TestClient) -> None:
    """The fake engine's byte vocabulary has no FIM tokens: suffix and /infill are refused."""
    r = fake.post("/v1/completions", json={"prompt": "a", "suffix": "b"})
    error = assert_envelope(r)  # type: ignore[arg-type]
    assert error["param"] == "suffix" and "fill-in-the-middle" in error["message"]
    assert fake.post("/v1/completions", json={"prompt": "a", "suffix": ""}).status_code == 200
    error = assert_envelope(fake.post("/infill", json={"input_prefix": "a"}))  # type: ignore[arg-type]
    assert "fill-in-the-middle" in error["message"] and error["type"] == "invalid_request_error"
    body = json.dumps({"input_prefix": "a"})
    r = fake.post("/infill", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
