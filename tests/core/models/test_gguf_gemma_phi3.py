"""Gemma 2, Gemma 3 (text) and Phi-3 from GGUF files written as llama.cpp's converter writes
them (tests/tiny_gguf_families.py): an F32 file's logits equal its source transformers model's;
through the engine (chunked prefill, a mixed batch, a prefix-cache hit, prompts shorter and
longer than the 8-token window) greedy tokens equal transformers'; Gemma's norms are not
offset twice (the file holds 1 + weight); what we do not implement is refused, naming the key;
the files' SentencePiece vocabularies tokenize as transformers reads them."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch

from bench.common.family_oracle import LONGROPE, PROMPT, assert_engine_matches
from bench.common.tiny_models import add_gguf_shape, finish_gguf, make_hf_model
from bench.common.tiny_tokenizers import TRICKY_TEXTS
from pagedserve import LLM
from pagedserve.core.models.loader_gguf import open_gguf
from pagedserve.core.tokenizers.load import load_tokenizer
from tests.core.models.paged_driver import PagedBatch
from tests.core.models.test_families import load, needs_window
from tests.tiny_gguf_families import write_gguf_family

pytestmark = needs_window
CASES = {
    "gemma2": ("gemma2", {}),  # window 8 on even layers, soft-caps 50 / 30
    "gemma3": ("gemma3_text", {}),  # five sliding layers (local rope 1e4), one global
    "phi3": ("phi3", {}),
    "phi3-window": ("phi3", {"sliding_window": 8}),
    "phi3-longrope": ("phi3", {"rope_scaling": LONGROPE, "original_max_position_embeddings": 8}),
}
ALL = [pytest.param(*v, id=k) for k, v in CASES.items()]


@pytest.mark.parametrize(("family", "config"), ALL)
def test_f32_gguf_logits_equal_its_source(tmp_path: Path, family: str, config: dict) -> None:
    path = tmp_path / f"{family}.gguf"
    source = write_gguf_family(path, family, seed=41, **config)
    model, arch = load(path)
    assert arch.architecture == family and arch.norm_offset == 0.0  # 1 + w is in the file
    with torch.no_grad():
        expected = source(torch.tensor([PROMPT])).logits[0].float()
    batch = PagedBatch(model, arch)
    got = torch.cat([batch.step([PROMPT[:8]])] + [batch.step([[t]]) for t in PROMPT[8:]])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_what_the_files_say(tmp_path: Path) -> None:
    """The metadata each file carries, read as llama.cpp reads it."""
    write_gguf_family(tmp_path / "g2.gguf", "gemma2", seed=1)
    g2, _ = open_gguf(tmp_path / "g2.gguf")
    assert (g2.attn_logit_softcap, g2.final_logit_softcap, g2.sliding_window) == (50.0, 30.0, 8)
    assert g2.layer_types == ("sliding_attention", "full_attention") and g2.tie_word_embeddings
    write_gguf_family(tmp_path / "g3.gguf", "gemma3_text", seed=1)
    g3, _ = open_gguf(tmp_path / "g3.gguf")
    assert (g3.rope_theta, g3.local_rope_theta, g3.qk_norm) == (1e6, 1e4, True)
    assert g3.layer_types.count("full_attention") == 1 and g3.layer_types[5] == "full_attention"
    for window, local in ((1024.0, 1e4), (0.0, 0.0)):  # past the 256 context; none at all
        path = tmp_path / f"g3-{window}.gguf"
        write_gguf_family(
            path, "gemma3_text", extra_keys={"gemma3.attention.sliding_window": window}
        )
        g3w, _ = open_gguf(path)
        assert (g3w.sliding_window, g3w.local_rope_theta) == (0, local)
        assert g3w.uses_local_rope(0) == bool(local) and not g3w.uses_local_rope(5)
    write_gguf_family(tmp_path / "p.gguf", "phi3", seed=1, rope_scaling=LONGROPE)
    phi3, _ = open_gguf(tmp_path / "p.gguf")
    assert phi3.rope_scaling is not None and phi3.rope_scaling["rope_type"] == "longrope"
    assert phi3.rope_scaling["long_factor"] == pytest.approx(LONGROPE["long_factor"])
    assert phi3.sliding_window == 0 and not phi3.attention_bias


@pytest.mark.parametrize(("family", "config"), [ALL[0], ALL[1], ALL[3]])
def test_engine_greedy_matches_transformers(tmp_path: Path, family: str, config: dict) -> None:
    path = tmp_path / f"{family}.gguf"
    source = write_gguf_family(path, family, seed=43, **config)
    # 8 tokens per step: chunked prefill; page_size 4: windows straddle pages.
    llm = LLM(str(path), dtype="float32", num_pages=64, page_size=4, max_num_batched_tokens=8)
    assert_engine_matches(llm, source, PROMPT)


@pytest.mark.parametrize(
    ("family", "config", "extra", "match"),
    [
        ("gemma2", {}, {"gemma2.attention.scale": 0.25}, "'gemma2.attention.scale'"),
        ("gemma3_text", {}, {"gemma3.attention.sliding_window_pattern": 2.0},
         "'gemma3.attention.sliding_window_pattern'"),
        ("phi3", {"partial_rotary_factor": 0.5}, {}, "'phi3.rope.dimension_count'"),
        ("phi3", {}, {"phi3.rope.scaling.yarn_log_multiplier": 0.1},
         "'phi3.rope.scaling.yarn_log_multiplier'"),
    ],
)  # fmt: skip
def test_unsupported_keys_are_refused_by_name(
    tmp_path: Path, family: str, config: dict, extra: dict, match: str
) -> None:
    path = tmp_path / f"{family}.gguf"
    write_gguf_family(path, family, seed=44, extra_keys=extra, **config)
    with pytest.raises(ValueError, match=match):
        open_gguf(path)


@pytest.mark.parametrize(("arch", "num_layers"), [("gemma2", 46), ("gemma3", 62)])
def test_gemma_27b_attention_scale_follows_llama_cpp(
    tmp_path: Path, arch: str, num_layers: int
) -> None:
    """llama.cpp scales Gemma 27B's queries by (hidden / heads) ** -0.5, the others' by
    head_size ** -0.5 (query_pre_attn_scalar is not in the file)."""
    cfg = make_hf_model("gemma2", num_hidden_layers=1, head_dim=32).config
    scales = []
    for layers in (num_layers, num_layers - 2):
        path = tmp_path / f"{arch}-{layers}.gguf"
        writer = gguf.GGUFWriter(str(path), arch)
        add_gguf_shape(writer, cfg)
        writer.add_block_count(layers)  # overwrites the source's count
        writer.add_key_length(cfg.head_dim)
        writer.add_sliding_window(8)
        writer.add_vocab_size(cfg.vocab_size)
        finish_gguf(writer)
        scales.append(open_gguf(path)[0].attn_scale)
    hidden_per_head = cfg.hidden_size // cfg.num_attention_heads
    assert scales == [hidden_per_head**-0.5, cfg.head_dim**-0.5]


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "phi3"])
def test_vocabulary_reads_as_transformers_reads_it(tmp_path: Path, family: str) -> None:
    """The files' `llama` vocabularies: Gemma's without a dummy prefix, Phi-3's with the `▁`
    prefix before every piece of text between special tokens (as llama.cpp and transformers
    read it); ids and text equal transformers' reading of the same GGUF."""
    from transformers import AutoTokenizer

    path = tmp_path / f"{family}.gguf"
    write_gguf_family(path, family, seed=45)
    ours, theirs = (
        load_tokenizer(path),
        AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name),
    )
    turns = "<start_of_turn>user\nhi<end_of_turn>" if family != "phi3" else "<|user|>\nhi<|end|>"
    for text in [*TRICKY_TEXTS, turns]:
        ids = theirs.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "phi3"])
def test_q8_gguf_equals_its_source_on_the_dequantized_weights(tmp_path: Path, family: str) -> None:
    """A Q8_0 file (norms and rope factors stay F32): logits equal transformers' on the source
    model whose 2-D weights went through the same Q8_0 round trip (random tiny models are too
    sensitive for a tolerance against the F32 logits to mean much)."""
    path = tmp_path / f"{family}-q8.gguf"
    source = write_gguf_family(path, family, qtype="Q8_0", seed=46)
    q8 = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for weight in source.parameters():  # a tied embedding is one parameter: once
            if weight.ndim >= 2:
                data = gguf.quants.quantize(weight.float().numpy(), q8)
                weight.copy_(torch.from_numpy(gguf.quants.dequantize(data, q8)).view(weight.shape))
        expected = source(torch.tensor([PROMPT])).logits[0].float()
    model, arch = load(path)
    got = PagedBatch(model, arch).step([PROMPT])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
