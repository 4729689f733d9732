"""Embeddings through the engine (issue 25) on tiny random Qwen3 embedders written here.

The oracle is sentence-transformers on the same folder (fp32), and for mean / cls pooling and
the GGUF path also transformers' hidden states pooled by hand (tests/tiny_embedders.py). Our
vectors must agree within 1e-5 cosine alone, batched with inputs of other lengths under chunked
prefill, and alongside generation requests, whose tokens must not change.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.common.tiny_embedders import (
    hidden_states,
    pool_by_hand,
    write_gguf_embedder,
    write_tiny_embedder,
)
from pagedserve import LLM, SamplingParams
from pagedserve.core.pooling_params import PoolingParams

TEXTS = [
    "the quick brown fox",
    "Hello world! Hello there, how are you today? A paged KV cache keeps every request's "
    "keys and values in fixed-size pages, and the scheduler batches requests continuously.",
    "x",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159",
]
TOLERANCE = 1e-5


def _llm(model: Path, **kwargs: object) -> LLM:
    # A 16-token step budget: the longer texts prefill in chunks, batched with the others.
    options = {"dtype": "float32", "quantization": "none", "num_pages": 64, "page_size": 8,
               "max_num_batched_tokens": 16, **kwargs}  # fmt: skip
    return LLM(str(model), **options)


def _assert_close(ours: list[list[float]], reference: torch.Tensor) -> None:
    got = torch.tensor(ours, dtype=torch.float64)
    cos = torch.nn.functional.cosine_similarity(got, reference.double(), dim=1)
    assert bool((cos >= 1 - TOLERANCE).all()), cos.tolist()
    assert torch.allclose(got.norm(dim=1), reference.double().norm(dim=1), atol=1e-4)


def _st_vectors(folder: Path, texts: list[str]) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return torch.tensor(model.encode(texts, batch_size=len(texts)))


@pytest.fixture(scope="module")
def last_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen3-embedder")
    write_tiny_embedder(folder, pooling="lasttoken", seed=1)
    return folder


@pytest.fixture(scope="module")
def last_llm(last_folder: Path) -> LLM:
    return _llm(last_folder)


def test_auto_task_reads_sentence_transformers_files(last_llm: LLM) -> None:
    pooler = last_llm.engine.pooler
    assert pooler is not None and (pooler.pooling, pooler.normalize) == ("last", True)
    assert pooler.dimensions == 64 and pooler.matryoshka_dimensions is None
    assert not last_llm.engine.can_generate  # a bare Qwen3Model: no LM head
    with pytest.raises(ValueError, match="no LM head"):
        last_llm.generate(["hi"], SamplingParams(max_tokens=2))


def test_last_token_matches_sentence_transformers_alone_and_batched(
    last_folder: Path, last_llm: LLM
) -> None:
    reference = _st_vectors(last_folder, TEXTS)
    batched = last_llm.embed(TEXTS)
    alone = [last_llm.embed(text)[0] for text in TEXTS]
    _assert_close(batched, reference)
    _assert_close(alone, reference)
    # Token ids in give the same vectors as the text they encode.
    ids = [last_llm.tokenizer.encode(t) for t in TEXTS]
    _assert_close(last_llm.embed(ids), reference)


def test_prefix_cache_hits_and_many_inputs_keep_the_vectors(last_llm: LLM) -> None:
    first = last_llm.embed(TEXTS[1])[0]  # its pages are cached now: last pooling reuses them
    again = last_llm.embed([TEXTS[1]] * 8 + TEXTS)
    _assert_close(again[:8], torch.tensor([first] * 8))
    hits = last_llm.engine.stats().prefix_hit_tokens
    assert hits > 0
    stats = last_llm.engine.stats()
    assert stats.num_used_pages == 0 and stats.num_running == 0


def test_matryoshka_dimensions(tmp_path: Path, last_llm: LLM) -> None:
    with pytest.raises(ValueError, match="dimensions"):
        last_llm.embed("hi", dimensions=16)
    folder = tmp_path / "matryoshka"
    write_tiny_embedder(folder, seed=1, matryoshka_dimensions=[16, 32])
    llm = _llm(folder)
    full = torch.tensor(llm.embed(TEXTS))
    short = llm.embed(TEXTS, dimensions=16)
    _assert_close(short, torch.nn.functional.normalize(full[:, :16], dim=1))
    with pytest.raises(ValueError, match=r"dimensions must be one of \[16, 32\]"):
        llm.embed("hi", dimensions=8)
    assert len(llm.embed("hi", dimensions=64)[0]) == 64  # the full width is always allowed


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_mean_and_cls_match_sentence_transformers_and_by_hand(tmp_path: Path, pooling: str) -> None:
    backbone = write_tiny_embedder(tmp_path, pooling=pooling, seed=2)
    llm = _llm(tmp_path)
    assert llm.engine.pooler is not None and llm.engine.pooler.pooling == pooling
    ours = llm.embed(TEXTS)
    _assert_close(ours, _st_vectors(tmp_path, TEXTS))
    by_hand = [
        pool_by_hand(hidden_states(backbone, llm.tokenizer.encode(t)), pooling) for t in TEXTS
    ]
    _assert_close(ours, torch.stack(by_hand))


def test_unnormalized_mean_keeps_the_length(tmp_path: Path) -> None:
    backbone = write_tiny_embedder(tmp_path, pooling="mean", normalize=False, seed=4)
    llm = _llm(tmp_path)
    ours = llm.embed(TEXTS)
    by_hand = [
        pool_by_hand(hidden_states(backbone, llm.tokenizer.encode(t)), "mean", normalize=False)
        for t in TEXTS
    ]
    _assert_close(ours, torch.stack(by_hand))


def test_embeddings_batch_with_generation_which_stays_the_same(tmp_path: Path) -> None:
    """A Qwen3ForCausalLM with sentence-transformers' files: task embed, and it still
    generates; both kinds of request share steps (chunked prefill, 16 tokens a step)."""
    write_tiny_embedder(tmp_path, pooling="lasttoken", lm_head=True, seed=3)
    llm = _llm(tmp_path)
    assert llm.engine.can_generate and llm.engine.pooler is not None
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone_tokens = [o.outputs[0].token_ids for o in llm.generate(TEXTS[:2], greedy)]
    alone_vectors = llm.embed(TEXTS)
    engine = llm.engine
    for i, text in enumerate(TEXTS[:2]):
        engine.add_request(f"gen-{i}", llm.tokenizer.encode(text), greedy)
    for i, text in enumerate(TEXTS):
        engine.add_request(f"emb-{i}", llm.tokenizer.encode(text), PoolingParams())
    ids = [f"gen-{i}" for i in range(2)] + [f"emb-{i}" for i in range(len(TEXTS))]
    outputs = llm._run(ids, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs[:2]] == alone_tokens
    vectors = [o.embedding for o in outputs[2:]]
    assert all(v is not None for v in vectors)
    _assert_close(vectors, torch.tensor(alone_vectors))  # type: ignore[arg-type]
    _assert_close(alone_vectors, _st_vectors(tmp_path, TEXTS))


def test_task_generate_refuses_embeddings(tmp_path: Path, last_folder: Path) -> None:
    with pytest.raises(ValueError, match="no LM head.*--task embed"):
        _llm(last_folder, task="generate")  # a bare backbone cannot generate
    write_tiny_embedder(tmp_path, lm_head=True, seed=3)
    llm = _llm(tmp_path, task="generate")
    assert llm.engine.pooler is None
    with pytest.raises(ValueError, match="not an embedding model"):
        llm.embed("hi")


def test_input_longer_than_the_context_is_refused(last_llm: LLM) -> None:
    from pagedserve.core.errors import ContextLengthError

    max_len = last_llm.engine.max_model_len
    assert len(last_llm.embed([[5] * max_len])[0]) == 64  # a prompt may fill the context
    with pytest.raises(ContextLengthError):
        last_llm.embed([[5] * (max_len + 1)])
    with pytest.raises(ValueError, match="must be in"):
        last_llm.embed([[last_llm.tokenizer.vocab_size]])


@pytest.mark.parametrize(("pooling_type", "pooling"), [(1, "mean"), (2, "cls"), (3, "last")])
def test_gguf_pooling_type(tmp_path: Path, pooling_type: int, pooling: str) -> None:
    path = tmp_path / "embedder.gguf"
    backbone = write_gguf_embedder(path, pooling_type, seed=6)
    llm = _llm(path)
    assert llm.engine.pooler is not None and llm.engine.pooler.pooling == pooling
    ours = llm.embed(TEXTS)
    by_hand = [
        pool_by_hand(hidden_states(backbone, llm.tokenizer.encode(t)), pooling) for t in TEXTS
    ]
    _assert_close(ours, torch.stack(by_hand))


def test_gguf_pooling_none_generates_and_rank_is_refused(tmp_path: Path) -> None:
    write_gguf_embedder(tmp_path / "none.gguf", 0, seed=6)
    assert _llm(tmp_path / "none.gguf").engine.pooler is None
    write_gguf_embedder(tmp_path / "rank.gguf", 4, seed=6)
    with pytest.raises(ValueError, match="pooling_type.*rank"):
        _llm(tmp_path / "rank.gguf")


def test_encoder_only_models_are_refused_by_name(tmp_path: Path) -> None:
    write_tiny_embedder(tmp_path, seed=1)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(model_type="bert", architectures=["BertModel"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="encoder-only"):
        _llm(tmp_path)


def test_task_embed_on_a_plain_causal_lm(tmp_path: Path) -> None:
    """No sentence-transformers files: auto generates; --task embed pools the last token and
    normalizes (as Qwen3-Embedding and gte-Qwen2 do)."""
    backbone = write_tiny_embedder(tmp_path, lm_head=True, sentence_transformers=False, seed=5)
    assert _llm(tmp_path).engine.pooler is None
    llm = _llm(tmp_path, task="embed")
    assert llm.engine.pooler is not None and llm.engine.can_generate
    by_hand = [
        pool_by_hand(hidden_states(backbone, llm.tokenizer.encode(t)), "last") for t in TEXTS
    ]
    _assert_close(llm.embed(TEXTS), torch.stack(by_hand))
