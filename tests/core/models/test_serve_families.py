"""`pagedserve serve` on tiny family models, through a real server process and the OpenAI SDK:
a Qwen3-MoE folder (q/k norms and routed experts in one model) and a Gemma 2 GGUF file (sandwich
norms, soft-caps, a window, a SentencePiece vocabulary). /v1/completions gives the offline
engine's greedy text, /v1/chat/completions renders the model's own chat template (the folder's,
or the GGUF's tokenizer.chat_template)."""

from __future__ import annotations

from pathlib import Path

from openai import OpenAI

from bench.common.server import start_server, stop_server
from bench.common.tiny_models import write_hf_model
from bench.common.tiny_tokenizers import CHATML_TEMPLATE, write_tiny_bpe
from pagedserve import LLM, SamplingParams
from tests.tiny_gguf_families import write_gguf_family

PROMPT = "the quick brown fox"


def check_serves(tmp_path: Path, model: str) -> None:
    flags = ["--dtype", "float32", "--max-model-len", "128", "--num-pages", "64"]
    llm = LLM(model, dtype="float32", max_model_len=128, num_pages=64)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    offline = llm.generate([PROMPT], greedy)[0].outputs[0].text
    messages = [{"role": "user", "content": "hello world"}]
    template = llm.engine.chat_template
    assert template is not None
    rendered = template.render(messages, add_generation_prompt=True)
    chat_prompt_tokens = len(llm.tokenizer.encode(rendered, add_special_tokens=False))
    server = start_server(tmp_path, model, *flags)
    try:
        client = OpenAI(base_url=server.base_url + "/v1", api_key="unused")
        completion = client.completions.create(
            model=server.model, prompt=PROMPT, max_tokens=8, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert completion.choices[0].text == offline
        assert completion.usage.completion_tokens == 8
        chat = client.chat.completions.create(
            model=server.model, messages=messages, max_tokens=4, temperature=0
        )
        assert chat.choices[0].message.role == "assistant"
        assert chat.usage.prompt_tokens == chat_prompt_tokens  # the model's own template
    finally:
        assert stop_server(server) == 0, server.log()


def test_serve_qwen3_moe_folder(tmp_path: Path) -> None:
    folder = tmp_path / "qwen3-moe"
    write_tiny_bpe(folder, chat_template=CHATML_TEMPLATE)
    write_hf_model(folder, "qwen3_moe", seed=31)
    check_serves(tmp_path, str(folder))


def test_serve_gemma2_gguf(tmp_path: Path) -> None:
    path = tmp_path / "tiny-gemma2.gguf"
    write_gguf_family(path, "gemma2", seed=32)
    llm_template = LLM(str(path), dtype="float32", max_model_len=128, num_pages=8)
    rendered = llm_template.engine.chat_template.render(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    ids = llm_template.tokenizer.encode(rendered, add_special_tokens=False)
    turn = llm_template.tokenizer.encode("<start_of_turn>", add_special_tokens=False)
    assert len(turn) == 1 and ids.count(turn[0]) == 2  # control tokens match whole
    check_serves(tmp_path, str(path))
