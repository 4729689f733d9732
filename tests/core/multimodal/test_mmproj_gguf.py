"""A vision model from llama.cpp's two files (`--mmproj`): a tiny random Qwen2.5-VL written as
its converter writes the language model and the projector (bench/common/tiny_mmproj.py, held
byte-equal to the converter by test_mmproj_llama_cpp.py) gives, in f32, the greedy tokens of
transformers fp32 and of the HF folder, and in f16 those of transformers on the f16-rounded
weights, on prompts with one and with two images (one big enough for several attention
windows); the image processor comes from the projector's metadata alone. What does not go
together is refused by name at load, before any weight is read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from bench.common.tiny_mmproj import write_gguf_qwen2_5_vl
from bench.common.tiny_models import write_gguf_llama
from bench.common.tiny_vlm import MAX_PIXELS, MIN_PIXELS, random_image, write_tiny_qwen2_5_vl
from pagedserve.cli_args import build_parser, configs_from_args
from pagedserve.core.config import ModelConfig
from pagedserve.core.device_policy import every_linear_quantized
from pagedserve.core.engine.llm import LLM
from pagedserve.core.models.mmproj_gguf import DEFAULT_WINDOW, MAX_TOKENS, MIN_TOKENS
from pagedserve.core.models.registry import image_processor_for, read_arch
from pagedserve.core.models.resolve import resolve_model
from pagedserve.core.multimodal.processor import Qwen2VLImageProcessor
from tests.core.multimodal.vlm_driver import (
    Oracle,
    assert_pairs_give,
    chat_prompt,
    f16_rounded,
    greedy,
    load,
    write_pairs,
)

transformers = pytest.importorskip("transformers")

NUM_TOKENS = 8
# As llama.cpp's converter needs (it maps merger.mlp.2 through the block count) and as every
# real Qwen2.5-VL is: more than 2 blocks, 112-pixel windows (the converter does not write the
# window; llama.cpp's default is 112).
VISION = {"depth": 4, "window_size": DEFAULT_WINDOW, "fullatt_block_indexes": [1, 3]}
QUESTION = "What is it?"


# 200 x 150 -> 196 x 140 pixels: 7 x 5 tokens, 2 x 2 windows of 4 x 4; 60 x 130: 2 x 5 tokens.
IMAGES = [random_image(200, 150, 1), random_image(60, 130, 2)]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("qwen2_5_vl-hf")
    return folder, write_tiny_qwen2_5_vl(folder, seed=3, vision_shape=VISION)


@pytest.fixture(scope="module")
def files(written: tuple[Path, torch.nn.Module]) -> dict[str, tuple[Path, Path]]:
    """(language model, projector) per type."""
    return write_pairs(written[0], write_gguf_qwen2_5_vl)


def _hf_greedy(model: torch.nn.Module, ids: list[int], images: list[Image.Image],
               vocab_size: int) -> list[int]:  # fmt: skip
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    pixels = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)(
        images=images, return_tensors="pt"
    )
    token = model.config.image_token_id
    input_ids = torch.tensor([[token if t >= vocab_size else t for t in ids]])
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids, pixel_values=pixels["pixel_values"],
            image_grid_thw=pixels["image_grid_thw"], mm_token_type_ids=(input_ids == token).int(),
            attention_mask=torch.ones_like(input_ids), max_new_tokens=NUM_TOKENS, do_sample=False,
        )  # fmt: skip
    return out[0, input_ids.shape[1] :].tolist()


def test_greedy_tokens_equal_transformers_and_the_hf_folder(
    written: tuple[Path, torch.nn.Module], files: dict[str, tuple[Path, Path]]
) -> None:
    folder, hf_model = written
    assert_pairs_give(files, oracle(hf_model), IMAGES, QUESTION, NUM_TOKENS, folder)


def oracle(hf_model: torch.nn.Module) -> Oracle:
    """transformers' greedy tokens on the weights of a file of the type: f32, or f16-rounded."""
    models = {"F32": hf_model, "F16": f16_rounded(hf_model)}
    return lambda qtype, llm, ids, images: _hf_greedy(
        models[qtype], ids, images, llm.tokenizer.vocab_size
    )


def test_the_projector_gives_the_tower_and_the_processor(
    written: tuple[Path, torch.nn.Module], files: dict[str, tuple[Path, Path]]
) -> None:
    folder, hf_model = written
    lm, mmproj = files["F32"]
    resolved = resolve_model(str(lm), mmproj=str(mmproj))
    arch, hf_arch = read_arch(resolved), read_arch(resolve_model(str(folder)))
    assert arch.architecture == "qwen2_5_vl" and arch.mrope_section == hf_arch.mrope_section
    assert arch.vision == hf_arch.vision  # fullatt_block_indexes from n_wa_pattern, etc.
    processor = image_processor_for(resolved, arch)
    assert isinstance(processor, Qwen2VLImageProcessor)
    area = (14 * 2) ** 2  # llama.cpp's bounds: images of 8 to 4096 tokens
    assert (processor.min_pixels, processor.max_pixels) == (MIN_TOKENS * area, MAX_TOKENS * area)
    assert processor.image_token_id == hf_model.config.image_token_id
    # Only a language model of the family: text alone, the multimodal rope as plain rope.
    text_only = read_arch(resolve_model(str(lm)))
    assert text_only.architecture == "qwen2" and text_only.vision is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"clip.projector_type": "qwen2vl_merger"}, "clip.projector_type 'qwen2vl_merger'"),
        ({"clip.vision.projection_dim": 96}, "projection_dim 96 differs from"),
        ({"clip.vision.feature_layer": [1, 2]}, "'clip.vision.feature_layer' is not supported"),
        ({"clip.use_silu": False, "clip.use_gelu": True}, "SiLU"),
    ],
)
def test_a_projector_we_do_not_build_is_refused_by_name(
    written: tuple[Path, torch.nn.Module], tmp_path: Path, overrides: dict, message: str
) -> None:
    lm, mmproj = tmp_path / "lm.gguf", tmp_path / "mmproj.gguf"
    write_gguf_qwen2_5_vl(written[0], lm, mmproj, overrides=overrides)
    with pytest.raises(ValueError, match=message):
        read_arch(resolve_model(str(lm), mmproj=str(mmproj)))


def test_what_does_not_go_with_a_projector_is_refused_at_load(
    written: tuple[Path, torch.nn.Module], files: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    folder = written[0]
    lm, mmproj = files["F32"]
    llama = tmp_path / "llama.gguf"
    write_gguf_llama(llama)
    with pytest.raises(ValueError, match="is a text-only 'llama' model"):
        load(llama, mmproj)
    with pytest.raises(ValueError, match="HF folder"):
        load(folder, mmproj)
    with pytest.raises(ValueError, match="is not a projector file.*'qwen2vl'"):
        load(lm, lm)  # the two files swapped round
    with pytest.raises(FileNotFoundError, match="no such .gguf file"):
        load(lm, tmp_path / "missing.gguf")


def test_the_flag(tmp_path: Path) -> None:
    args = build_parser().parse_args(["serve", "lm.gguf", "--mmproj", "mmproj.gguf"])
    _, engine = configs_from_args(args, {})
    assert (engine.model.model, engine.model.mmproj) == ("lm.gguf", "mmproj.gguf")


def test_a_quantized_language_model_beside_its_tower(
    written: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """A Q8_0 language model keeps its blocks on the quantized kernels beside the projector's
    dense tower, and --dtype auto does not count it as every linear quantized (which would
    store bf16 between the layers on AVX2 and run the tower in bf16): the tower's linears are
    dense."""
    lm, mmproj = tmp_path / "lm-q8_0.gguf", tmp_path / "mmproj.gguf"
    write_gguf_qwen2_5_vl(written[0], lm, mmproj, qtype="Q8_0")
    config = ModelConfig(model=str(lm), mmproj=str(mmproj))
    assert every_linear_quantized(resolve_model(str(lm)), config, tensor_parallel=False)
    assert not every_linear_quantized(resolve_model(str(lm), mmproj=str(mmproj)), config, False)
    llm = LLM(str(lm), mmproj=str(mmproj), kv_cache_memory=0.02, page_size=16)
    assert "Q8_0" in llm.engine.model_runner.model.quantization
    ids, mm = chat_prompt(llm, IMAGES[:1], QUESTION)
    assert len(greedy(llm, ids, mm, NUM_TOKENS)) == NUM_TOKENS
