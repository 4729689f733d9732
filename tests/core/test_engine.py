"""The engine end to end on the default model: token-exact against transformers (fp32), and
the same greedy tokens whatever the batch, the chunking, the preemptions or the cache hits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from pagedserve import LLM, SamplingParams
from pagedserve.core.models.resolve import ResolvedModel

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "List three colors:\n1.",
]
GREEDY = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
CHATS = ["Write a haiku about the sea.", "Give me three tips for sleeping better."]
CHAT_TOKENS = 32


def make_llm(model: ResolvedModel, **kwargs: object) -> LLM:
    # The fp32 oracle runs on dequantized weights (--quantization none --dtype float32).
    options: dict[str, object] = {
        "dtype": "float32", "quantization": "none", "max_model_len": 1024, "num_pages": 512,
    }  # fmt: skip
    options.update(kwargs)
    return LLM(str(model.path), **options)


@pytest.fixture(scope="module")
def llm(default_model: ResolvedModel) -> LLM:
    return make_llm(default_model)


def token_lists(outputs: list) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@contextmanager
def one_thread() -> Iterator[None]:
    """The oracle's batch-1 decode on one torch thread: dozens of tiny ops per token, each
    waiting at a two-thread barrier that a busy 2-core machine makes slow (64 tokens took
    17-23 s on two threads, 6.4-6.9 s on one, the same tokens)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hf_greedy(llm: LLM, hf_default_model) -> list[list[int]]:
    """transformers' fp32 greedy tokens for PROMPTS (64 each), computed once."""
    tokens = []
    for prompt in PROMPTS:
        ids = torch.tensor([llm.tokenizer.encode(prompt)])
        with torch.no_grad(), one_thread():
            out = hf_default_model.generate(
                ids, do_sample=False, max_new_tokens=64, min_new_tokens=64, eos_token_id=None
            )
        tokens.append(out[0, ids.shape[1] :].tolist())
    return tokens


def chat_prompts(llm: LLM) -> list[list[int]]:
    """CHATS as the server renders them (the model's template: a system prompt, <|im_end|>)."""
    template = llm.engine.chat_template
    assert template is not None
    rendered = [template.render([{"role": "user", "content": c}], add_generation_prompt=True)
                for c in CHATS]  # fmt: skip
    return [llm.tokenizer.encode(r, add_special_tokens=False) for r in rendered]


@pytest.fixture(scope="module")
def hf_chat_greedy(llm: LLM, hf_default_model) -> list[list[int]]:
    """transformers' fp32 greedy tokens for the chat prompts (CHAT_TOKENS each). The prompts
    hold <|im_end|>, SmolLM2's pad token too: generate() masks pad tokens unless given a mask."""
    tokens = []
    for prompt in chat_prompts(llm):
        ids = torch.tensor([prompt])
        with torch.no_grad(), one_thread():
            out = hf_default_model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False,
                max_new_tokens=CHAT_TOKENS, min_new_tokens=CHAT_TOKENS, eos_token_id=None,
            )  # fmt: skip
        tokens.append(out[0, ids.shape[1] :].tolist())
    return tokens


def test_greedy_tokens_equal_transformers(llm: LLM, hf_greedy: list[list[int]]) -> None:
    ours = token_lists(llm.generate(PROMPTS, GREEDY))
    for prompt, got, want in zip(PROMPTS, ours, hf_greedy, strict=True):
        assert got == want, prompt


@pytest.mark.parametrize("activations", ["float", "int16", "auto"])
def test_quantized_weights_with_float_or_int16_activations_equal_transformers(
    default_model: ResolvedModel,
    hf_greedy: list[list[int]],
    hf_chat_greedy: list[list[int]],
    activations: str,
) -> None:
    """--quantized-activations float or int16 (issue 42 item 5): the Q4_1 blocks stay packed,
    the activations stay fp32 (or int16 per 32 features), so the greedy tokens are the
    dequantized model's: transformers' fp32 tokens, and the default model's first question
    answered right (int8 activations answer it "L'Étoile, la Marseillaise, ..."), and two chat
    prompts' tokens transformers' too. auto, with
    --dtype auto, is the default: int16 and float32 for this model, with fp16 KV pages
    (--kv-cache-dtype auto); the others keep float32 pages."""
    dtype = "auto" if activations == "auto" else "float32"
    llm = make_llm(default_model, quantization="auto", quantized_activations=activations,
                   dtype=dtype)  # fmt: skip
    try:
        model = llm.engine.model_runner.model
        assert model.quantization  # the blocks were kept
        assert model.quantized_activations == ("int16" if activations == "auto" else activations)
        assert model.rope_cos.dtype == torch.float32
        assert model.stack is not None  # every layer in one native call, in fp32
        kv = llm.engine.model_runner.kv_caches[0].dtype
        assert kv == (torch.float16 if activations == "auto" else torch.float32)
        test_greedy_tokens_equal_transformers(llm, hf_greedy)
        chats = llm.generate(chat_prompts(llm), SamplingParams(
            temperature=0, max_tokens=CHAT_TOKENS, ignore_eos=True))  # fmt: skip
        assert token_lists(chats) == hf_chat_greedy
        chat = [{"role": "user", "content": "What is the capital of France?"}]
        answer = llm.chat(chat, SamplingParams(temperature=0, max_tokens=12))
        assert "Paris" in answer.outputs[0].text, answer.outputs[0].text
    finally:
        llm.close()


def test_text_matches_tokens(llm: LLM) -> None:
    out = llm.generate(PROMPTS[:1], GREEDY)[0].outputs[0]
    assert out.text == llm.tokenizer.decode(out.token_ids)
    assert out.finish_reason == "length" and len(out.token_ids) == 64


def mixed_prompts(llm: LLM, count: int) -> list[list[int]]:
    """count prompts of varied lengths (8..~300 tokens) built from a fixed text."""
    base = llm.tokenizer.encode(
        "In the beginning the engine scheduled every request it could, decoding first and "
        "filling the rest of its budget with prefill chunks, page by page. " * 12
    )
    return [base[(7 * i) % 40 : (7 * i) % 40 + 8 + (37 * i) % 290] for i in range(count)]


@pytest.fixture(scope="module")
def batch_reference(llm: LLM) -> tuple[list[list[int]], list[list[int]]]:
    """32 mixed prompts and their greedy outputs in one big batch."""
    prompts = mixed_prompts(llm, 32)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    return prompts, token_lists(llm.generate(prompts, params))


def test_alone_equals_in_a_batch_of_32(llm: LLM, batch_reference) -> None:
    prompts, batched = batch_reference
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for i in (0, 5, 17, 31):
        assert token_lists(llm.generate([prompts[i]], params)) == [batched[i]], i


@pytest.mark.parametrize(
    "options",
    [
        {"max_num_batched_tokens": 32},  # chunked prefill
        {"num_pages": 48, "page_size": 16, "max_model_len": 512},  # preemption
        {"enable_prefix_caching": False},
        {"max_num_seqs": 5},
    ],
    ids=["chunked-prefill", "preemption", "no-prefix-cache", "few-seats"],
)
def test_batch_invariance(default_model: ResolvedModel, batch_reference, options) -> None:
    """12 of the 32 (the 8 longest, so the budget binds and pages run out, and 4 short ones)
    run under each option and give the tokens they had in the batch of 32."""
    prompts, expected = batch_reference
    longest = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))[:8]
    picked = [*longest, *(i for i in (0, 1, 5, 17) if i not in longest)]
    llm = make_llm(default_model, **options)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    got = token_lists(llm.generate([prompts[i] for i in picked], params))
    assert got == [expected[i] for i in picked]
    stats = llm.engine.stats()
    assert stats.num_used_pages == 0 and stats.num_running == 0 and stats.num_waiting == 0
    if "num_pages" in options:
        assert stats.num_preemptions > 0


@pytest.mark.parametrize("quantization", ["none", "auto"])
def test_bfloat16_prompts_longer_than_the_token_budget_complete(
    default_model: ResolvedModel, quantization: str
) -> None:
    """bf16 (what dtype="auto" picks from level avx2 for dense weights, and for quantized ones
    with int8 activations): steps whose prefill chunks all end mid-prompt
    sample nothing, and their empty logits product must not fail the request (it did: the
    native linear kernel refused the null pointer of torch's empty tensor); likewise on the
    quantized kernel (the default --quantization auto)."""
    llm = make_llm(default_model, dtype="bfloat16", quantization=quantization,
                   max_num_batched_tokens=32)  # fmt: skip
    prompts = mixed_prompts(llm, 6)
    assert max(len(p) for p in prompts) > 4 * 32  # several chunks each
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    # Alone (every step but the last samples nothing), then next to requests already decoding.
    for batch in ([prompts[-1]], prompts):
        for out in llm.generate(batch, params):
            assert out.outputs[0].finish_reason == "length"
            assert len(out.outputs[0].token_ids) == 8
    assert llm.engine.stats().num_used_pages == 0


def test_prefix_cache_hits_give_the_same_tokens(llm: LLM, batch_reference) -> None:
    prompts, expected = batch_reference
    before = llm.engine.stats().prefix_hit_tokens
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    # The same prompts again: their full pages are cached from the earlier run.
    assert token_lists(llm.generate(prompts[:8], params)) == expected[:8]
    assert llm.engine.stats().prefix_hit_tokens > before


def test_seeded_sampling_reproduces_across_batches(llm: LLM) -> None:
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    other = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    alone = llm.generate(PROMPTS[:1], seeded)[0].outputs[0].token_ids
    mixed = llm.generate([PROMPTS[1], PROMPTS[0], PROMPTS[3]], [other, seeded, other])
    reordered = llm.generate([PROMPTS[0], PROMPTS[2]], [seeded, other])
    assert mixed[1].outputs[0].token_ids == alone
    assert reordered[0].outputs[0].token_ids == alone


def test_n_outputs_share_the_prompt_pages(llm: LLM) -> None:
    prompt = mixed_prompts(llm, 32)[31]  # long enough to fill several pages
    before = llm.engine.stats().prefix_hit_tokens
    out = llm.generate([prompt], SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8))[0]
    assert sorted(o.index for o in out.outputs) == [0, 1, 2]
    assert all(len(o.token_ids) >= 1 for o in out.outputs)
    page_size = llm.engine.model_info.page_size
    shared = (len(prompt) - 1) // page_size * page_size
    assert llm.engine.stats().prefix_hit_tokens - before >= 2 * shared


def test_n_outputs_join_at_the_start_of_the_next_step(llm: LLM) -> None:
    """Output 0's first token queues outputs 1..n-1; the engine adds them to the scheduler when
    its next step starts (processing outputs never re-enters admission)."""
    engine = llm.engine
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=4, ignore_eos=True)
    engine.add_request("children", mixed_prompts(llm, 8)[7], params)
    first: list = []
    while not first:
        first = engine.step()
    assert [o.index for o in first[0].outputs] == [0]
    assert engine.scheduler.num_running + engine.scheduler.num_waiting == 1  # 1, 2 queued
    stats = engine.stats()
    assert stats.num_running + stats.num_waiting == 3  # the queued ones count as waiting
    outputs = engine.step()
    assert engine.scheduler.num_running + engine.scheduler.num_waiting == 3
    stats = engine.stats()
    assert stats.num_running + stats.num_waiting == 3
    while engine.has_unfinished():
        outputs += engine.step()
    assert sorted({o.index for out in outputs for o in out.outputs}) == [0, 1, 2]
    assert not engine.model_runner._seeds  # each seeded output's seed was released


def test_stop_string_and_stop_token(llm: LLM) -> None:
    full = llm.generate(PROMPTS[2:3], GREEDY)[0].outputs[0]
    # a stop string that spans the boundary between two generated tokens
    pieces = [llm.tokenizer.decode(full.token_ids[: i + 1]) for i in range(len(full.token_ids))]
    cut = next(i for i in range(3, len(pieces)) if len(pieces[i]) - len(pieces[i - 1]) >= 2)
    stop = pieces[cut][len(pieces[cut - 1]) - 1 : len(pieces[cut - 1]) + 1]
    params = SamplingParams(temperature=0, max_tokens=64, stop=(stop,), ignore_eos=True)
    out = llm.generate(PROMPTS[2:3], params)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert stop not in out.text and full.text.startswith(out.text)
    assert full.text.find(stop) == len(out.text)

    token = full.token_ids[5]
    params = SamplingParams(temperature=0, max_tokens=64, stop_token_ids=(token,), ignore_eos=True)
    out = llm.generate(PROMPTS[2:3], params)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == token
    assert out.token_ids == full.token_ids[: full.token_ids.index(token) + 1]


def test_logprobs_and_prompt_logprobs(llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=4, logprobs=3, prompt_logprobs=2)
    out = llm.generate(PROMPTS[:1], params)[0]
    prompt_len = len(out.prompt_token_ids)
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == prompt_len
    assert out.prompt_logprobs[0] is None
    for token_id, entry in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:], strict=True):
        assert entry is not None and entry.token_id == token_id and entry.logprob <= 0
        assert len(entry.top) == 2
    lps = out.outputs[0].logprobs
    assert lps is not None and len(lps) == 4
    for token_id, entry in zip(out.outputs[0].token_ids, lps, strict=True):
        assert entry.token_id == token_id and entry.rank == 1  # greedy picks the top token
        assert entry.top[0][0] == token_id and len(entry.top) == 3


def test_engine_fault_fails_the_step_and_frees_pages(llm: LLM, monkeypatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected fault")

    monkeypatch.setattr(llm.engine.model_runner, "execute", broken)
    out = llm.generate(PROMPTS[:2], GREEDY)
    assert all(o.error and "injected fault" in o.error for o in out)
    assert all(o.outputs[0].finish_reason == "error" for o in out)
    assert llm.engine.stats().num_used_pages == 0
    monkeypatch.undo()
    assert len(llm.generate(PROMPTS[:1], GREEDY)[0].outputs[0].token_ids) == 64
