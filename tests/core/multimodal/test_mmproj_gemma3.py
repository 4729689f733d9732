"""Gemma 3 from llama.cpp's two files (`--mmproj`): a tiny random Gemma 3 written as its
converter writes the `gemma3` language model and the `gemma3` projector
(bench/common/tiny_mmproj.py, held byte-equal to the converter by test_mmproj_llama_cpp.py)
gives, in f32, the greedy tokens of transformers fp32 and of the HF folder, and in f16 those of
transformers on the f16-rounded weights (all of two dimensions or more but the tower's patch
and position embeddings, which the converter keeps in f32), on prompts with one and with two
images; the prompt ids are transformers' processor's. The image processor comes from the two
files alone. What does not go together is refused by name at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from bench.common.tiny_gemma3_vl import IMAGE_SIZE, write_tiny_gemma3_vl
from bench.common.tiny_mmproj import write_gguf_gemma3_vl, write_gguf_qwen2_5_vl
from bench.common.tiny_vlm import random_image, write_tiny_qwen2_5_vl
from pagedserve.core.engine.llm import LLM
from pagedserve.core.models.registry import image_processor_for, read_arch
from pagedserve.core.models.resolve import resolve_model
from pagedserve.core.multimodal.gemma3 import Gemma3ImageProcessor
from tests.core.multimodal import vlm_driver
from tests.core.multimodal.vlm_driver import (
    Oracle,
    assert_pairs_give,
    chat_prompt,
    greedy,
    load,
    messages,
    write_pairs,
)

transformers = pytest.importorskip("transformers")

NUM_TOKENS = 8
QUESTION = "What is in the picture?"
# Resized (70 x 40, stretched as transformers does) and already square.
IMAGES = [random_image(70, 40, 1), random_image(IMAGE_SIZE, IMAGE_SIZE, 2)]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("gemma3-hf")
    return folder, write_tiny_gemma3_vl(folder, seed=3, llama_cpp=True)


@pytest.fixture(scope="module")
def files(written: tuple[Path, torch.nn.Module]) -> dict[str, tuple[Path, Path]]:
    """(language model, projector) per type."""
    return write_pairs(written[0], write_gguf_gemma3_vl)


def f16_rounded(model: torch.nn.Module) -> torch.nn.Module:
    """The weights of the f16 pair: the tower's patch and position embeddings stay f32."""
    return vlm_driver.f16_rounded(model, kept=(".embeddings.",))


def hf_greedy(model: torch.nn.Module, folder: Path, images: list[Image.Image]) -> Any:
    """transformers' processor and greedy tokens: (its input ids, the tokens)."""
    processor = transformers.AutoProcessor.from_pretrained(folder)
    text = processor.apply_chat_template(messages(images, QUESTION), add_generation_prompt=True,
                                         tokenize=False)  # fmt: skip
    inputs = processor(text=text, images=images, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NUM_TOKENS, do_sample=False)
    num_prompt = inputs["input_ids"].shape[1]
    return inputs["input_ids"][0].tolist(), out[0, num_prompt:].tolist()


def test_greedy_tokens_equal_transformers_and_the_hf_folder(
    written: tuple[Path, torch.nn.Module], files: dict[str, tuple[Path, Path]]
) -> None:
    folder, hf_model = written
    assert_pairs_give(files, oracle(written), IMAGES, QUESTION, NUM_TOKENS, folder)


def oracle(written: tuple[Path, torch.nn.Module]) -> Oracle:
    """transformers' greedy tokens on the weights of a file of the type (f32, or f16-rounded),
    on the prompt ids its processor builds, which must be ours."""
    folder, hf_model = written
    models = {"F32": hf_model, "F16": f16_rounded(hf_model)}

    def tokens(qtype: str, llm: LLM, ids: list[int], images: list[Image.Image]) -> list[int]:
        hf_ids, want = hf_greedy(models[qtype], folder, images)
        token = llm.engine.image_processor.image_token_id  # type: ignore[union-attr]
        assert [token if t >= llm.tokenizer.vocab_size else t for t in ids] == hf_ids
        return want

    return tokens


def test_the_projector_gives_the_tower_and_the_processor(
    written: tuple[Path, torch.nn.Module], files: dict[str, tuple[Path, Path]]
) -> None:
    folder, hf_model = written
    lm, mmproj = files["F32"]
    resolved = resolve_model(str(lm), mmproj=str(mmproj))
    arch, hf_arch = read_arch(resolved), read_arch(resolve_model(str(folder)))
    assert arch.architecture == hf_arch.architecture == "gemma3"
    assert arch.vision == hf_arch.vision  # the pool from projector.scale_factor, etc.
    assert arch.layer_types == hf_arch.layer_types and arch.norm_offset == 0.0
    processor = image_processor_for(resolved, arch)
    assert isinstance(processor, Gemma3ImageProcessor)
    assert (processor.image_size, processor.num_tokens) == (IMAGE_SIZE, 4)
    assert processor.image_token_id == hf_model.config.image_token_index
    # The language model alone: Gemma 3's text.
    text_only = read_arch(resolve_model(str(lm)))
    assert text_only.architecture == "gemma3_text" and text_only.vision is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"clip.vision.projection_dim": 96}, "projection_dim 96 differs from"),
        ({"clip.vision.n_wa_pattern": 2}, "'clip.vision.n_wa_pattern' is not supported for a "
                                          "'gemma3' projector"),
        ({"clip.use_gelu": False, "clip.use_silu": True}, "must be GELU"),
        ({"clip.vision.projector.scale_factor": 3}, "does not pool 3 x 3"),
        ({"clip.has_audio_encoder": True}, "audio is not supported"),
    ],
)  # fmt: skip
def test_a_projector_we_do_not_build_is_refused_by_name(
    written: tuple[Path, torch.nn.Module], tmp_path: Path, overrides: dict, message: str
) -> None:
    lm, mmproj = tmp_path / "lm.gguf", tmp_path / "mmproj.gguf"
    write_gguf_gemma3_vl(written[0], lm, mmproj, overrides=overrides)
    with pytest.raises(ValueError, match=message):
        read_arch(resolve_model(str(lm), mmproj=str(mmproj)))


def test_the_other_familys_files_are_refused(
    files: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """A Gemma 3 projector beside a Qwen2-VL language model and the other way round."""
    qwen = tmp_path / "qwen"
    write_tiny_qwen2_5_vl(qwen, vision_shape={"depth": 4, "fullatt_block_indexes": [1, 3]})
    qwen_lm, qwen_mmproj = tmp_path / "qwen-lm.gguf", tmp_path / "qwen-mmproj.gguf"
    write_gguf_qwen2_5_vl(qwen, qwen_lm, qwen_mmproj)
    lm, mmproj = files["F32"]
    with pytest.raises(ValueError, match="for a 'gemma3' language model.*'qwen2vl' model"):
        read_arch(resolve_model(str(qwen_lm), mmproj=str(mmproj)))
    with pytest.raises(ValueError, match="for a 'qwen2vl' language model.*'gemma3' model"):
        read_arch(resolve_model(str(lm), mmproj=str(qwen_mmproj)))


def test_a_quantized_language_model_beside_its_tower(
    written: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """A Q8_0 Gemma 3 language model keeps its blocks on the quantized kernels beside the
    projector's dense tower (--dtype auto), and answers an image."""
    lm, mmproj = tmp_path / "lm-q8_0.gguf", tmp_path / "mmproj.gguf"
    write_gguf_gemma3_vl(written[0], lm, mmproj, qtype="Q8_0")
    llm = LLM(str(lm), mmproj=str(mmproj), kv_cache_memory=0.02, page_size=16)
    assert "Q8_0" in llm.engine.model_runner.model.quantization
    ids, mm = chat_prompt(llm, IMAGES[:1], QUESTION)
    assert len(greedy(llm, ids, mm, NUM_TOKENS)) == NUM_TOKENS


def test_older_files_with_the_mlp_names_swapped(
    written: tuple[Path, torch.nn.Module], files: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """A projector whose fc1 is named ffn_down and fc2 ffn_up (older files; llama.cpp tells
    them by shape) gives the same tokens as the converter's names."""
    lm, mmproj = tmp_path / "lm.gguf", tmp_path / "mmproj-swapped.gguf"
    write_gguf_gemma3_vl(written[0], lm, mmproj, swapped_mlp=True)
    swapped, today = load(lm, mmproj), load(*files["F32"])
    ids, mm = chat_prompt(today, IMAGES[:1], QUESTION)
    assert greedy(swapped, ids, mm, NUM_TOKENS) == greedy(today, ids, mm, NUM_TOKENS)
