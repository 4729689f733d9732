"""Gemma 3 from llama.cpp's two files (`--mmproj`): a tiny random Gemma 3 written as its
converter writes the `gemma3` language model and the `gemma3` projector
(bench/common/tiny_mmproj.py, held byte-equal to the converter by test_mmproj_llama_cpp.py)
gives, in f32, the greedy tokens of transformers fp32 and of the HF folder, and in f16 those of
transformers on the f16-rounded weights (all of two dimensions or more but the tower's patch
and position embeddings, which the converter keeps in f32), on prompts with one and with two
images; the prompt ids are transformers' processor's. The image processor comes from the two
files alone. What does not go together is refused by name at load."""

from __future__ import annotations

import copy
import itertools
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
from pagedserve.core.multimodal.inputs import MultiModalInputs, content_hash, expand_image_tokens
from pagedserve.core.sampling_params import SamplingParams

transformers = pytest.importorskip("transformers")

NUM_TOKENS = 8
QUESTION = "What is in the picture?"
# Resized (70 x 40, stretched as transformers does) and already square.
IMAGES = [random_image(70, 40, 1), random_image(IMAGE_SIZE, IMAGE_SIZE, 2)]
_IDS = itertools.count()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("gemma3-hf")
    return folder, write_tiny_gemma3_vl(folder, seed=3, llama_cpp=True)


@pytest.fixture(scope="module")
def files(written: tuple[Path, torch.nn.Module]) -> dict[str, tuple[Path, Path]]:
    """(language model, projector) per type."""
    folder = written[0]
    out = {}
    for qtype in ("F32", "F16"):
        pair = folder.parent / f"lm-{qtype}.gguf", folder.parent / f"mmproj-{qtype}.gguf"
        write_gguf_gemma3_vl(folder, *pair, qtype=qtype)
        out[qtype] = pair
    return out


def f16_rounded(model: torch.nn.Module) -> torch.nn.Module:
    """The weights an f16 file holds: every one of two dimensions or more rounded to f16 but
    the tower's patch and position embeddings (the converter keeps them in f32)."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in rounded.named_parameters():
            if param.ndim >= 2 and ".embeddings." not in name:
                param.copy_(param.half().float())
    return rounded


def _llm(model: Path, mmproj: Path | None = None, **kwargs: Any) -> LLM:
    return LLM(str(model), mmproj=str(mmproj) if mmproj else None, dtype="float32",
               kv_cache_memory=0.02, page_size=16, **kwargs)  # fmt: skip


def _messages(images: list[Image.Image], text: str) -> list[dict[str, Any]]:
    parts = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    return [{"role": "user", "content": parts}]


def prompt(llm: LLM, images: list[Image.Image]) -> tuple[list[int], MultiModalInputs]:
    """The chat path on the model's own files: its template with image parts, its processor's
    prompt text, tokenized, each image token expanded into the image's placeholder ids."""
    template, processor = llm.engine.chat_template, llm.engine.image_processor
    assert template is not None and processor is not None
    rendered = template.render(_messages(images, QUESTION), add_generation_prompt=True)
    ids = llm.tokenizer.encode(processor.expand_prompt(rendered), add_special_tokens=False)
    features = [processor.preprocess(im, content_hash("RGB", im.size, im.tobytes()))
                for im in images]  # fmt: skip
    return expand_image_tokens(ids, features, processor.image_token_id, llm.tokenizer.vocab_size)


def greedy(llm: LLM, ids: list[int], mm: MultiModalInputs, num: int = NUM_TOKENS) -> list[int]:
    request_id = f"g3-mmproj-{next(_IDS)}"
    params = SamplingParams(temperature=0, max_tokens=num, ignore_eos=True)
    llm.engine.add_request(request_id, ids, params, multimodal=mm)
    [out] = llm._run([request_id], False)
    return list(out.outputs[0].token_ids)


def hf_greedy(model: torch.nn.Module, folder: Path, images: list[Image.Image]) -> Any:
    """transformers' processor and greedy tokens: (its input ids, the tokens)."""
    processor = transformers.AutoProcessor.from_pretrained(folder)
    text = processor.apply_chat_template(_messages(images, QUESTION), add_generation_prompt=True,
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
    oracles = {"F32": hf_model, "F16": f16_rounded(hf_model)}
    from_folder = _llm(folder)
    for qtype, (lm, mmproj) in files.items():
        llm = _llm(lm, mmproj)
        for num_images in (1, 2):
            images = IMAGES[:num_images]
            ids, mm = prompt(llm, images)
            folder_ids, folder_mm = prompt(from_folder, images)
            assert (ids, mm.spans()) == (folder_ids, folder_mm.spans())
            hf_ids, want = hf_greedy(oracles[qtype], folder, images)
            token = llm.engine.image_processor.image_token_id  # type: ignore[union-attr]
            assert [token if t >= llm.tokenizer.vocab_size else t for t in ids] == hf_ids
            assert greedy(llm, ids, mm) == want, (qtype, num_images)
            if qtype == "F32":
                assert greedy(from_folder, ids, mm) == want


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
