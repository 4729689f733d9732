"""Task score (issue 40) in the engine: the reranker's template and yes / no tokens read from
the model's files (core/models/score_config.py), and LLM.score against transformers on a tiny
random Qwen3 checkpoint (fp32, within 1e-5), chunked prefill and shared prefix pages included;
what cannot score is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.common.tiny_embedders import write_tiny_embedder
from bench.common.tiny_rerankers import transformers_scores, write_tiny_reranker
from pagedserve.core.engine.llm import LLM
from pagedserve.core.models.resolve import resolve_model
from pagedserve.core.models.score_config import resolve_scorer
from pagedserve.core.pooling_params import QWEN3_RERANKER_TEMPLATE, PoolerConfig, ScoreConfig
from pagedserve.core.tokenizers.load import load_tokenizer

TEMPLATE = "<|im_start|>{instruction}\nQ: {query}\nD: {document}<|im_end|>\nAnswer:"
QUERY = "What does the scheduler do?"
DOCUMENTS = [
    "The scheduler batches requests continuously; the model runner executes the plan.",
    "Hello world!",
    "def add(a, b):\n    return a + b\n",
    "{query} {document}",  # placeholders inside a document stay text
]


def test_render_fills_the_template_once() -> None:
    score = ScoreConfig(token_ids=(1, 2), template="[{query}|{document}|{instruction}]",
                        instruction="be brief")  # fmt: skip
    assert score.render("{document}", "{query}") == "[{document}|{query}|be brief]"
    assert "<Query>: q\n<Document>: d<|im_end|>" in ScoreConfig((1, 2)).render("q", "d")
    with pytest.raises(ValueError, match="score template"):
        ScoreConfig(token_ids=(1, 2), template="{query} only")
    with pytest.raises(ValueError, match="last token"):
        PoolerConfig(pooling="mean", normalize=False, score=ScoreConfig((1, 2)))


def test_scorer_reads_the_model_files(tmp_path: Path) -> None:
    folder = tmp_path / "reranker"
    write_tiny_reranker(folder, classifier_from_token=["yes", "no"], score_template=TEMPLATE,
                        score_instruction="Judge.")  # fmt: skip
    tokenizer = load_tokenizer(folder)
    pooler = resolve_scorer(resolve_model(str(folder)), tokenizer)
    assert pooler.task == "score" and pooler.score is not None
    yes, no = tokenizer.token_id("yes"), tokenizer.token_id("no")
    assert pooler.score.tokens == ("yes", "no") and pooler.score.token_ids == (yes, no)
    assert pooler.score.render("q", "d") == "<|im_start|>Judge.\nQ: q\nD: d<|im_end|>\nAnswer:"
    # Nothing said: Qwen3-Reranker's template and tokens.
    config = json.loads((folder / "config.json").read_text())
    for key in ("classifier_from_token", "score_template", "score_instruction"):
        config.pop(key)
    config["classifier_from_token"] = ["no", "maybe"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'maybe'"):
        resolve_scorer(resolve_model(str(folder)), tokenizer)
    config.pop("classifier_from_token")
    (folder / "config.json").write_text(json.dumps(config))
    default = resolve_scorer(resolve_model(str(folder)), tokenizer).score
    assert default is not None and default.template == QWEN3_RERANKER_TEMPLATE
    assert default.token_ids == (no, yes)


def test_llm_score_matches_transformers(tmp_path: Path) -> None:
    folder = tmp_path / "reranker"
    model = write_tiny_reranker(folder, seed=5, score_template=TEMPLATE)
    # A 32-token step budget: each prompt prefills in chunks, batched with the others, and the
    # documents after the first find the query's pages in the prefix cache.
    llm = LLM(str(folder), task="score", dtype="float32", quantization="none", num_pages=64,
              page_size=8, max_num_batched_tokens=32)  # fmt: skip
    assert llm.engine.model_info.task == "score"
    score = llm.engine.pooler.score if llm.engine.pooler is not None else None
    assert score is not None and score.template == TEMPLATE
    ours = llm.score(QUERY, DOCUMENTS)
    reference = transformers_scores(folder, model, QUERY, DOCUMENTS, score)
    assert max(abs(a - b) for a, b in zip(ours, reference, strict=True)) <= 1e-5, (ours, reference)
    assert llm.engine.scheduler.stats().prefix_hit_tokens > 0


def test_what_cannot_score_is_refused(tmp_path: Path) -> None:
    backbone = tmp_path / "backbone"
    write_tiny_reranker(backbone).model.save_pretrained(backbone)  # a bare Qwen3Model
    with pytest.raises(ValueError, match="no LM head"):
        LLM(str(backbone), task="score", dtype="float32", num_pages=16)
    no_yes = tmp_path / "embedder"
    write_tiny_embedder(no_yes, lm_head=True)  # its vocabulary has no "yes" token
    with pytest.raises(ValueError, match=r"tokens \['no', 'yes'\] are not in"):
        LLM(str(no_yes), task="score", dtype="float32", num_pages=16)
