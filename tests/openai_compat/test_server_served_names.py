"""--served-model-name with several names (vLLM's NAME [NAME ...]): a real `pagedserve serve`
process on loopback and the OpenAI SDK, a tiny Llama with one LoRA adapter. Requests naming any
of the names run the model and carry the first; /v1/models has a card per name (the adapter's
parent the first); /metrics labels everything with the first; any other name is a 404."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from bench.common.server import API_KEY, Server, start_server, stop_server
from bench.common.tiny_lora import ATTENTION, write_peft_adapter
from bench.common.tiny_models import make_hf_model
from bench.common.tiny_tokenizers import write_tiny_bpe

pytest.importorskip("peft")
NAMES = ("tiny-llama", "gpt-4o-mini")  # the first is the one responses carry
ASK = [{"role": "user", "content": "the quick brown fox"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("served-names")
    base = root / "base"
    write_tiny_bpe(base)
    model = make_hf_model("llama", seed=5, vocab_size=len(AutoTokenizer.from_pretrained(base)))
    model.save_pretrained(base, safe_serialization=True)
    adapter = write_peft_adapter(model, root / "attn", r=8, targets=ATTENTION, seed=1)
    # MODEL right after the names: the flag's last word, as `--served-model-name NAME MODEL`
    srv = start_server(tmp_path_factory.mktemp("server"), "--served-model-name", *NAMES,
                       str(base), "--lora-modules", f"attn={adapter}", "--api-key", API_KEY,
                       "--max-model-len", "256", "--num-pages", "64")  # fmt: skip
    yield srv
    assert stop_server(srv) == 0, srv.log()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def _complete(client: openai.OpenAI, model: str) -> openai.types.Completion:
    return client.completions.create(model=model, prompt="the quick brown fox", max_tokens=8,
                                     temperature=0, extra_body={"ignore_eos": True})  # fmt: skip


def test_every_name_runs_the_model_and_responses_carry_the_first(client: openai.OpenAI) -> None:
    texts, replies = [], []
    for name in NAMES:
        completion = _complete(client, name)
        chat = client.chat.completions.create(model=name, messages=ASK, max_tokens=8,
                                              temperature=0)  # fmt: skip
        stream = list(client.chat.completions.create(model=name, messages=ASK, max_tokens=4,
                                                     stream=True))  # fmt: skip
        assert completion.model == chat.model == NAMES[0]
        assert stream and {chunk.model for chunk in stream} == {NAMES[0]}
        assert completion.usage is not None and completion.usage.completion_tokens == 8
        texts.append(completion.choices[0].text)
        replies.append(chat.choices[0].message.content)
    assert texts[0] == texts[1] and replies[0] == replies[1]  # one model, whatever its name


def test_models_has_a_card_per_name_and_the_adapter_s_parent_is_the_first(
    client: openai.OpenAI, server: Server
) -> None:
    cards = client.models.list().data
    assert [card.id for card in cards] == [*NAMES, "attn"]
    assert server.model == NAMES[0]
    first, second, adapter = (card.model_dump() for card in cards)
    for card in (first, second):
        assert card["parent"] is None and card["status"] == {"value": "loaded"}
        assert card["max_model_len"] == 256 and card["task"] == "generate"
    assert {k: v for k, v in second.items() if k != "id"} == \
        {k: v for k, v in first.items() if k != "id"}  # fmt: skip
    assert adapter["parent"] == NAMES[0]
    assert client.models.retrieve(NAMES[1]).id == NAMES[1]
    adapted = _complete(client, "attn")  # the adapter still runs by its own name
    assert adapted.model == "attn"
    assert adapted.choices[0].text != _complete(client, NAMES[1]).choices[0].text


def test_metrics_are_labelled_with_the_first_name(client: openai.OpenAI, server: Server) -> None:
    key = f'vllm:prompt_tokens_total{{model_name="{NAMES[0]}"}}'
    before = server.metrics().get(key, 0.0)
    completion = _complete(client, NAMES[1])
    assert completion.usage is not None
    after = server.metrics()
    assert after[key] == before + completion.usage.prompt_tokens
    text = httpx.get(server.base_url + "/metrics").text
    assert f'model_name="{NAMES[1]}"' not in text


@pytest.mark.parametrize("name", ["gpt-4o", NAMES[0].upper(), f"{NAMES[0]} {NAMES[1]}"])
def test_any_other_name_is_a_404_in_openai_s_envelope(
    client: openai.OpenAI, server: Server, name: str
) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model=name, messages=ASK, max_tokens=2)
    assert info.value.code == "model_not_found"
    response = httpx.post(server.base_url + "/v1/completions",
                          headers={"Authorization": f"Bearer {API_KEY}"},
                          json={"model": name, "prompt": "hi", "max_tokens": 2})  # fmt: skip
    assert response.status_code == 404
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "model_not_found" and name in error["message"]
