"""A vision model from llama.cpp's two files (`--mmproj`): a tiny random Qwen2.5-VL written as
its converter writes the language model and the projector (bench/common/tiny_mmproj.py, held
byte-equal to the converter by test_mmproj_llama_cpp.py) gives, in f32, the greedy tokens of
transformers fp32 and of the HF folder, and in f16 those of transformers on the f16-rounded
weights, on prompts with one and with two images (one big enough for several attention
windows); the image processor comes from the projector's metadata alone. What does not go
together is refused by name at load, before any weight is read."""

from __future__ import annotations

import copy
import itertools
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
from pagedserve.core.multimodal.inputs import MultiModalInputs, content_hash, expand_image_tokens
from pagedserve.core.multimodal.processor import Qwen2VLImageProcessor
from pagedserve.core.sampling_params import SamplingParams

transformers = pytest.importorskip("transformers")

NUM_TOKENS = 8
# As llama.cpp's converter needs (it maps merger.mlp.2 through the block count) and as every
# real Qwen2.5-VL is: more than 2 blocks, 112-pixel windows (the converter does not write the
# window; llama.cpp's default is 112).
VISION = {"depth": 4, "window_size": DEFAULT_WINDOW, "fullatt_block_indexes": [1, 3]}
_IDS = itertools.count()


# 200 x 150 -> 196 x 140 pixels: 7 x 5 tokens, 2 x 2 windows of 4 x 4; 60 x 130: 2 x 5 tokens.
IMAGES = [random_image(200, 150, 1), random_image(60, 130, 2)]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("qwen2_5_vl-hf")
    return folder, write_tiny_qwen2_5_vl(folder, seed=3, vision_shape=VISION)


@pytest.fixture(scope="module")
def files(written: tuple[Path, torch.nn.Module]) -> dict[str, tuple[Path, Path]]:
    """(language model, projector) per type."""
    folder = written[0]
    out = {}
    for qtype in ("F32", "F16"):
        pair = folder.parent / f"lm-{qtype}.gguf", folder.parent / f"mmproj-{qtype}.gguf"
        write_gguf_qwen2_5_vl(folder, *pair, qtype=qtype)
        out[qtype] = pair
    return out


def _llm(model: Path, mmproj: Path | None = None) -> LLM:
    return LLM(str(model), mmproj=str(mmproj) if mmproj else None, dtype="float32",
               kv_cache_memory=0.02, page_size=16)  # fmt: skip


def _prompt(llm: LLM, images: list[Image.Image]) -> tuple[list[int], MultiModalInputs]:
    """The chat path: the model's template with image parts, its processor, expanded ids."""
    template, processor = llm.engine.chat_template, llm.engine.image_processor
    assert template is not None and processor is not None
    parts = [{"type": "image"} for _ in images] + [{"type": "text", "text": "What is it?"}]
    rendered = template.render([{"role": "user", "content": parts}], add_generation_prompt=True)
    ids = llm.tokenizer.encode(rendered, add_special_tokens=False)
    features = [processor.preprocess(im, content_hash("RGB", im.size, im.tobytes()))
                for im in images]  # fmt: skip
    return expand_image_tokens(ids, features, processor.image_token_id, llm.tokenizer.vocab_size)


def _greedy(llm: LLM, ids: list[int], mm: MultiModalInputs) -> list[int]:
    request_id = f"mmproj-{next(_IDS)}"
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
    llm.engine.add_request(request_id, ids, params, multimodal=mm)
    [out] = llm._run([request_id], False)
    return list(out.outputs[0].token_ids)


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


def _f16_rounded(model: torch.nn.Module) -> torch.nn.Module:
    """The weights an f16 file holds: every one of two dimensions or more rounded to f16."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for param in rounded.parameters():
            if param.ndim >= 2:
                param.copy_(param.half().float())
    return rounded


def test_greedy_tokens_equal_transformers_and_the_hf_folder(
    written: tuple[Path, torch.nn.Module], files: dict[str, tuple[Path, Path]]
) -> None:
    folder, hf_model = written
    oracles = {"F32": hf_model, "F16": _f16_rounded(hf_model)}
    from_folder = _llm(folder)
    for qtype, (lm, mmproj) in files.items():
        llm = _llm(lm, mmproj)
        assert llm.engine.image_processor is not None
        for num_images in (1, 2):
            images = IMAGES[:num_images]
            ids, mm = _prompt(llm, images)
            folder_ids, folder_mm = _prompt(from_folder, images)
            assert (ids, mm.spans()) == (folder_ids, folder_mm.spans())
            want = _hf_greedy(oracles[qtype], ids, images, llm.tokenizer.vocab_size)
            assert _greedy(llm, ids, mm) == want, (qtype, num_images)
            if qtype == "F32":
                assert _greedy(from_folder, ids, mm) == want


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
        _llm(llama, mmproj)
    with pytest.raises(ValueError, match="HF folder"):
        _llm(folder, mmproj)
    with pytest.raises(ValueError, match="is not a projector file.*'qwen2vl'"):
        _llm(lm, lm)  # the two files swapped round
    with pytest.raises(FileNotFoundError, match="no such .gguf file"):
        _llm(lm, tmp_path / "missing.gguf")


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
    ids, mm = _prompt(llm, IMAGES[:1])
    assert len(_greedy(llm, ids, mm)) == NUM_TOKENS
