"""LoRA adapters behind a real `pagedserve serve` process, with the OpenAI SDK: --lora-modules,
a request picking its adapter by `model`, /v1/models' adapter cards (parent: the base model),
vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter (a PEFT folder or a GGUF LoRA file),
and their 400s / 404s (the server keeps serving after each)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from bench.common.server import API_KEY, Server, start_server, stop_server
from bench.common.tiny_lora import ATTENTION, MLP, write_peft_adapter
from bench.common.tiny_models import make_hf_model, write_gguf_llama
from bench.common.tiny_tokenizers import write_tiny_bpe
from tests.core.lora.gguf_lora import converted, gguf_from_peft, write_gguf_lora

pytest.importorskip("peft")
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("lora-server")
    base = root / "base"
    write_tiny_bpe(base)
    model = make_hf_model("llama", seed=3, vocab_size=len(AutoTokenizer.from_pretrained(base)))
    model.save_pretrained(base, safe_serialization=True)
    paths = {"base": base}
    paths["attn"] = write_peft_adapter(model, root / "attn", r=8, targets=ATTENTION, seed=1)
    paths["mlp"] = write_peft_adapter(model, root / "mlp", r=4, targets=MLP, seed=2)
    paths["rank32"] = write_peft_adapter(model, root / "rank32", r=32, targets=ATTENTION, seed=3)
    paths["broken"] = root / "broken"
    shutil.copytree(paths["mlp"], paths["broken"])
    (paths["broken"] / "adapter_model.safetensors").write_bytes(b"not safetensors" * 10)
    paths["saves"] = root / "saves"
    shutil.copytree(paths["mlp"], paths["saves"])
    config = json.loads((paths["saves"] / "adapter_config.json").read_text())
    config["modules_to_save"] = ["lm_head"]
    (paths["saves"] / "adapter_config.json").write_text(json.dumps(config))
    paths["attn.gguf"] = gguf_from_peft(paths["attn"], root / "attn.gguf", alpha=16.0)
    paths["model.gguf"] = root / "model.gguf"  # a model, not an adapter
    write_gguf_llama(paths["model.gguf"], seed=1)
    tensors = converted(paths["attn"], "qwen2", num_heads=4, num_kv_heads=2)
    paths["qwen2.gguf"] = write_gguf_lora(root / "qwen2.gguf", tensors, arch="qwen2")
    return paths


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, adapters: dict[str, Path]) -> Iterator[Server]:
    flags = [str(adapters["base"]), "--lora-modules", f"attn={adapters['attn']}",
             "--max-loras", "3", "--max-lora-rank", "16", "--allow-runtime-lora-updating",
             "--api-key", API_KEY, "--dtype", "float32", "--quantization", "none",
             "--max-model-len", "256", "--num-pages", "64"]  # fmt: skip
    srv = start_server(tmp_path_factory.mktemp("server"), *flags)
    yield srv
    assert stop_server(srv) == 0, srv.log()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def complete(client: openai.OpenAI, model: str) -> openai.types.Completion:
    return client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)


def post(server: Server, path: str, body: dict[str, str]) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, headers=HEADERS, timeout=60)


def test_an_adapter_is_a_model_whose_parent_is_the_base(
    client: openai.OpenAI, server: Server
) -> None:
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {server.model, "attn"}
    assert cards["attn"].model_extra is not None
    assert cards["attn"].model_extra["parent"] == server.model
    base, adapted = complete(client, server.model), complete(client, "attn")
    assert adapted.model == "attn"
    assert adapted.choices[0].text != base.choices[0].text
    assert complete(client, "attn").choices[0].text == adapted.choices[0].text


def test_an_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        complete(client, "no-such-adapter")
    assert info.value.code == "model_not_found"


def test_load_use_and_unload_at_run_time(
    client: openai.OpenAI, server: Server, adapters: dict[str, Path]
) -> None:
    loaded = post(server, "/v1/load_lora_adapter", {"lora_name": "mlp",
                                                    "lora_path": str(adapters["mlp"])})  # fmt: skip
    assert loaded.status_code == 200, loaded.text
    assert "mlp" in {m.id for m in client.models.list().data}
    mlp = client.chat.completions.create(
        model="mlp", messages=[{"role": "user", "content": PROMPT}], max_tokens=8, temperature=0
    )
    assert mlp.model == "mlp"
    unloaded = post(server, "/v1/unload_lora_adapter", {"lora_name": "mlp"})
    assert unloaded.status_code == 200, unloaded.text
    with pytest.raises(openai.NotFoundError):
        complete(client, "mlp")
    again = post(server, "/v1/unload_lora_adapter", {"lora_name": "mlp"})
    assert again.status_code == 404 and again.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("name", "names_in_error"),
    [
        ("rank32", "max-lora-rank"),
        ("broken", "safetensors"),
        ("saves", "modules_to_save"),
        ("model.gguf", "not a LoRA adapter"),
        ("qwen2.gguf", "general.architecture is 'qwen2'"),
    ],
)
def test_a_bad_adapter_is_a_400_naming_why_and_the_server_keeps_serving(
    client: openai.OpenAI, server: Server, adapters: dict[str, Path], name: str,
    names_in_error: str,
) -> None:  # fmt: skip
    body = {"lora_name": name, "lora_path": str(adapters[name])}
    response = post(server, "/v1/load_lora_adapter", body)
    assert response.status_code == 400, response.text
    assert names_in_error in response.json()["error"]["message"]
    assert name not in {m.id for m in client.models.list().data}
    assert complete(client, "attn").choices[0].text


def test_a_gguf_file_of_an_adapter_answers_as_its_peft_folder(
    client: openai.OpenAI, server: Server, adapters: dict[str, Path]
) -> None:
    body = {"lora_name": "attn-gguf", "lora_path": str(adapters["attn.gguf"])}
    loaded = post(server, "/v1/load_lora_adapter", body)
    assert loaded.status_code == 200, loaded.text
    assert complete(client, "attn-gguf").choices[0].text == complete(client, "attn").choices[0].text
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "attn-gguf"}).status_code == 200


def test_a_missing_folder_and_a_taken_name_are_400s(
    server: Server, adapters: dict[str, Path]
) -> None:
    missing = post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/nonexistent"})
    assert missing.status_code == 400 and "/nonexistent" in missing.json()["error"]["message"]
    taken = post(server, "/v1/load_lora_adapter", {"lora_name": "attn",
                                                   "lora_path": str(adapters["mlp"])})  # fmt: skip
    assert taken.status_code == 400 and "already loaded" in taken.json()["error"]["message"]
