"""What the image tests share, for every family: the chat path's prompt on a loaded model (its
own template and processor), a request run to its end, and llama.cpp's file pairs written per
type."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from pagedserve.core.engine.llm import LLM
from pagedserve.core.multimodal.inputs import MultiModalInputs, content_hash, expand_image_tokens
from pagedserve.core.outputs import RequestOutput
from pagedserve.core.sampling_params import SamplingParams

_IDS = itertools.count()


def load(model: Path, mmproj: Path | None = None, **config: Any) -> LLM:
    """An fp32 engine on a folder, or on a GGUF and its projector; small KV cache."""
    config = {"kv_cache_memory": 0.02, "page_size": 16} | config
    return LLM(str(model), mmproj=str(mmproj) if mmproj else None, dtype="float32", **config)


def messages(images: list[Image.Image], text: str) -> list[dict[str, Any]]:
    """One user message: an image part per image, then the text."""
    parts = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    return [{"role": "user", "content": parts}]


def chat_prompt(
    llm: LLM, images: list[Image.Image], text: str
) -> tuple[list[int], MultiModalInputs]:
    """The chat path on the model's own files: its template with image parts, its processor's
    prompt text (Gemma 3's image sequences; Qwen2-VL's text as it is), tokenized, each image
    token expanded into the image's placeholder ids."""
    template, processor = llm.engine.chat_template, llm.engine.image_processor
    assert template is not None and processor is not None
    rendered = template.render(messages(images, text), add_generation_prompt=True)
    ids = llm.tokenizer.encode(processor.expand_prompt(rendered), add_special_tokens=False)
    features = [processor.preprocess(im, content_hash("RGB", im.size, im.tobytes()))
                for im in images]  # fmt: skip
    return expand_image_tokens(ids, features, processor.image_token_id, llm.tokenizer.vocab_size)


def run(
    llm: LLM, ids: list[int], mm: MultiModalInputs | None, num: int, **params: Any
) -> RequestOutput:
    """One request to its end: greedy over `num` tokens unless `params` say otherwise."""
    request_id = f"vlm-{next(_IDS)}"
    sampling = SamplingParams(**({"temperature": 0, "ignore_eos": True} | params), max_tokens=num)
    llm.engine.add_request(request_id, ids, sampling, multimodal=mm)
    [out] = llm._run([request_id], False)
    return out


def greedy(llm: LLM, ids: list[int], mm: MultiModalInputs | None, num: int) -> list[int]:
    return list(run(llm, ids, mm, num).outputs[0].token_ids)


def f16_rounded(model: torch.nn.Module, kept: tuple[str, ...] = ()) -> torch.nn.Module:
    """The weights an f16 file holds: every one of two dimensions or more rounded to f16, but
    those whose names hold one of `kept` (which the converter keeps in f32)."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in rounded.named_parameters():
            if param.ndim >= 2 and not any(k in name for k in kept):
                param.copy_(param.half().float())
    return rounded


def write_pairs(
    folder: Path, write: Callable[..., None], qtypes: tuple[str, ...] = ("F32", "F16")
) -> dict[str, tuple[Path, Path]]:
    """(language model, projector) per type, written by `write` (bench/common/tiny_mmproj.py)
    beside the folder."""
    out = {}
    for qtype in qtypes:
        pair = folder.parent / f"lm-{qtype}.gguf", folder.parent / f"mmproj-{qtype}.gguf"
        write(folder, *pair, qtype=qtype)
        out[qtype] = pair
    return out


Oracle = Callable[[str, LLM, list[int], list[Image.Image]], list[int]]
"""(file type, the engine, the prompt's ids, its images) -> the greedy tokens it must give."""


def assert_pairs_give(
    pairs: dict[str, tuple[Path, Path]],
    oracle: Oracle,
    images: list[Image.Image],
    question: str,
    num: int,
    folder: Path | None = None,
) -> None:
    """Each pair's greedy tokens on the chat prompt with the first one and the first two
    `images` are the oracle's; with `folder`, the folder's chat prompt is the same and, from
    the f32 pair, so are its greedy tokens."""
    from_folder = load(folder) if folder is not None else None
    for qtype, (lm, mmproj) in pairs.items():
        llm = load(lm, mmproj)
        for num_images in (1, 2):
            ids, mm = chat_prompt(llm, images[:num_images], question)
            want = oracle(qtype, llm, ids, images[:num_images])
            assert greedy(llm, ids, mm, num) == want, (qtype, num_images)
            if from_folder is None:
                continue
            folder_ids, folder_mm = chat_prompt(from_folder, images[:num_images], question)
            assert (ids, mm.spans()) == (folder_ids, folder_mm.spans())
            if qtype == "F32":
                assert greedy(from_folder, ids, mm, num) == want
