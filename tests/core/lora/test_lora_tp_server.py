"""A real `pagedserve serve --tensor-parallel-size 2` process (gloo, float32) with an adapter from
--lora-modules and one loaded at run time, through the OpenAI SDK: each adapter's greedy text
is TP=1's (whose tokens are transformers + PEFT's); unloaded, an adapter is a 404
model_not_found; a file that does not parse is a 400 naming it; both ranks keep serving
(fixtures in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from bench.common.server import API_KEY, Server, start_server, stop_server
from pagedserve import LLM
from tests.core.lora.oracle import GREEDY, NUM_TOKENS, PROMPTS, request

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def _text(client: openai.OpenAI, model: str) -> str:
    out = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=NUM_TOKENS,
                                    temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
    assert out.model == model
    return out.choices[0].text


def _post(server: Server, path: str, body: dict[str, str]) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, headers=HEADERS, timeout=60)


def test_adapters_at_tp2_behind_the_openai_api(
    model: tuple[Path, dict[str, Path]],
    llm: LLM,
    oracle: dict[str | None, list[list[int]]],
    tmp_path: Path,
) -> None:
    folder, adapters = model
    want = {}  # TP=1's text, whose tokens are PEFT's
    for name in ("attn", "mlp"):
        (out,) = llm.generate(PROMPTS[:1], GREEDY, lora_request=request(adapters, name))
        assert list(out.outputs[0].token_ids) == oracle[name][0]
        want[name] = out.outputs[0].text
    server = start_server(
        tmp_path, str(folder), "--tensor-parallel-size", "2", "--dtype", "float32",
        "--quantization", "none", "--num-pages", "64", "--distributed-timeout", "60",
        "--api-key", API_KEY, "--lora-modules", f"attn={adapters['attn']}", "--max-loras", "2",
        "--allow-runtime-lora-updating",
    )  # fmt: skip
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
    try:
        assert "tensor_parallel_size 2" in server.log()
        cards = {m.id: m for m in client.models.list().data}
        assert cards["attn"].model_extra and cards["attn"].model_extra["parent"] == server.model
        assert _text(client, "attn") == want["attn"]
        body = {"lora_name": "mlp", "lora_path": str(adapters["mlp"])}
        assert _post(server, "/v1/load_lora_adapter", body).status_code == 200
        assert _text(client, "mlp") == want["mlp"]
        assert _post(server, "/v1/unload_lora_adapter", {"lora_name": "mlp"}).status_code == 200
        with pytest.raises(openai.NotFoundError) as info:
            _text(client, "mlp")
        assert info.value.code == "model_not_found"
        broken = tmp_path / "broken.gguf"
        broken.write_bytes(b"not a gguf file" * 10)
        refused = _post(
            server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(broken)}
        )
        assert refused.status_code == 400 and "broken.gguf" in refused.json()["error"]["message"]
        assert _text(client, "attn") == want["attn"]  # both ranks still serving
    finally:
        assert stop_server(server) == 0, server.log()
