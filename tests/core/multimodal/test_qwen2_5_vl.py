"""Qwen2.5-VL against transformers fp32 on a tiny random checkpoint: the image processor's
pixels, the vision tower's embeddings, the multimodal rotary positions, and the engine's
greedy tokens on prompts with one and with several images (whole prefill, and prefill chunks
that cut through an image), plus the prefix cache keyed by the image."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bench.common.tiny_vlm import MAX_PIXELS, MIN_PIXELS, random_image, write_tiny_qwen2_5_vl
from pagedserve.core.engine.llm import LLM
from pagedserve.core.multimodal.mrope import mrope_positions
from pagedserve.core.multimodal.processor import Qwen2VLImageProcessor
from pagedserve.core.sampling_params import SamplingParams
from tests.core.multimodal.vlm_driver import chat_prompt, greedy, run

transformers = pytest.importorskip("transformers")

NUM_TOKENS = 12


IMAGES = [random_image(112, 84, 1), random_image(60, 130, 2), random_image(112, 84, 3)]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("qwen2_5_vl")
    return folder, write_tiny_qwen2_5_vl(folder)


@pytest.fixture(scope="module")
def folder(written: tuple[Path, torch.nn.Module]) -> Path:
    return written[0]


@pytest.fixture(scope="module")
def hf_model(written: tuple[Path, torch.nn.Module]) -> torch.nn.Module:
    return written[1]


@pytest.fixture(scope="module")
def llm(hf_model: torch.nn.Module, folder: Path) -> LLM:
    return LLM(str(folder), dtype="float32", kv_cache_memory=0.02, page_size=16)


@pytest.fixture(scope="module")
def chunked(hf_model: torch.nn.Module, folder: Path) -> LLM:
    """Prefill chunks of 16 tokens: they cut through every image."""
    return LLM(str(folder), dtype="float32", kv_cache_memory=0.02, page_size=16,
               max_num_batched_tokens=16, enable_prefix_caching=False)  # fmt: skip


def _processor(folder: Path) -> Qwen2VLImageProcessor:
    import json

    config = json.loads((folder / "config.json").read_text())
    return Qwen2VLImageProcessor.from_folder(folder, config)


def _hf_pixels(images: list[Image.Image]) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    hf = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    out = hf(images=images, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def _hf_greedy(hf_model: torch.nn.Module, ids: list[int], images: list[Image.Image],
               image_token: int, num: int) -> list[int]:  # fmt: skip
    pixels, grids = _hf_pixels(images)
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        out = hf_model.generate(
            input_ids=input_ids, pixel_values=pixels, image_grid_thw=grids,
            mm_token_type_ids=(input_ids == image_token).int(),
            attention_mask=torch.ones_like(input_ids), max_new_tokens=num, do_sample=False,
        )  # fmt: skip
    return out[0, len(ids) :].tolist()


def test_pixels_equal_transformers(folder: Path) -> None:
    processor = _processor(folder)
    pixels, grids = _hf_pixels(IMAGES[:2])
    ours = [processor.preprocess(im, b"h" * 16) for im in IMAGES[:2]]
    assert [list(f.grid_thw) for f in ours] == grids.tolist()
    np.testing.assert_allclose(np.concatenate([f.pixel_values for f in ours]), pixels.numpy(),
                               atol=1e-5)  # fmt: skip
    assert [f.num_tokens for f in ours] == [int(g.prod()) // 4 for g in grids]


def test_tower_equals_transformers(llm: LLM, hf_model: torch.nn.Module) -> None:
    pixels, grids = _hf_pixels(IMAGES[:2])
    with torch.no_grad():
        want = hf_model.model.get_image_features(pixels, grids).pooler_output
        model = llm.engine.model_runner.images.model  # type: ignore[union-attr]
        sizes = [int(g.prod()) for g in grids]
        got = model.encode_images(list(pixels.split(sizes)), [tuple(g) for g in grids.tolist()])
    want = torch.cat(list(want)) if isinstance(want, (list, tuple)) else want
    torch.testing.assert_close(torch.cat(got), want, atol=1e-5, rtol=1e-5)


def test_rotary_positions_equal_transformers(llm: LLM, folder: Path, hf_model) -> None:
    ids, mm = chat_prompt(llm, IMAGES[:2], "Compare them.")
    image_token = hf_model.config.image_token_id
    hf_ids = torch.tensor([[image_token if t >= llm.tokenizer.vocab_size else t for t in ids]])
    _, grids = _hf_pixels(IMAGES[:2])
    want, delta = hf_model.model.get_rope_index(
        hf_ids, (hf_ids == image_token).int(), image_grid_thw=grids
    )
    got, our_delta = mrope_positions(len(ids), mm, 2)
    np.testing.assert_array_equal(got, want[:, 0].numpy())
    assert our_delta == int(delta)


@pytest.mark.parametrize("num_images", [1, 2])
def test_greedy_tokens_equal_transformers(llm: LLM, chunked: LLM, folder: Path, hf_model,
                                          num_images: int) -> None:  # fmt: skip
    images = IMAGES[:num_images]
    ids, mm = chat_prompt(llm, images, "What is in the picture?")
    # the chunked engine's 16-token chunks cut through an image
    assert any(s // 16 != (e - 1) // 16 for s, e in mm.spans())
    image_token = hf_model.config.image_token_id
    hf_ids = [image_token if t >= llm.tokenizer.vocab_size else t for t in ids]
    want = _hf_greedy(hf_model, hf_ids, images, image_token, NUM_TOKENS)
    assert greedy(llm, ids, mm, NUM_TOKENS) == want
    assert greedy(chunked, ids, mm, NUM_TOKENS) == want


def test_prefix_cache_hits_the_same_image_only(llm: LLM, folder: Path) -> None:
    """The same image again reuses the cached pages past its tokens; another image of the
    same size reuses none of them (its placeholder ids differ)."""
    a, _, b = IMAGES  # a and b: the same size, other pixels
    text = "Describe the picture in a few words, please. " * 2
    ids_a, mm_a = chat_prompt(llm, [a], text)
    ids_b, mm_b = chat_prompt(llm, [b], text)
    assert len(ids_a) == len(ids_b) > 48 and ids_a != ids_b
    start, end = mm_a.spans()[0]
    assert ids_a[:start] == ids_b[:start] and ids_a[end:] == ids_b[end:]
    first = run(llm, ids_a, mm_a, 4)
    again = run(llm, ids_a, mm_a, 4)
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert again.metrics is not None and again.metrics.num_cached_tokens >= 48 > end
    other = run(llm, ids_b, mm_b, 4)
    assert other.metrics is not None and other.metrics.num_cached_tokens <= start


def test_n_outputs_and_a_batch_of_image_requests(llm: LLM, folder: Path, hf_model) -> None:
    """n = 2 greedy outputs of one image prompt are its greedy tokens twice, and requests with
    different images and text-only ones run in one batch, each with its own tokens."""
    ids, mm = chat_prompt(llm, IMAGES[1:2], "Describe it.")
    alone = greedy(llm, ids, mm, 6)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, n=2)
    llm.engine.add_request("vl-n2", ids, params, multimodal=mm)
    [out] = llm._run(["vl-n2"], False)
    assert [list(o.token_ids) for o in out.outputs] == [alone, alone]
    other_ids, other_mm = chat_prompt(llm, IMAGES[:2], "Compare.")
    other_alone = greedy(llm, other_ids, other_mm, 6)
    text_ids = llm.tokenizer.encode("Hello there, how are you today?")
    text_alone = list(llm.generate([text_ids], SamplingParams(temperature=0, max_tokens=6,
                                                              ignore_eos=True))[0]
                      .outputs[0].token_ids)  # fmt: skip
    single = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm.engine.add_request("vl-a", ids, single, multimodal=mm)
    llm.engine.add_request("vl-b", other_ids, single, multimodal=other_mm)
    llm.engine.add_request("vl-c", text_ids, single)
    a, b, c = llm._run(["vl-a", "vl-b", "vl-c"], False)
    assert list(a.outputs[0].token_ids) == alone
    assert list(b.outputs[0].token_ids) == other_alone
    assert list(c.outputs[0].token_ids) == text_alone


def test_preempted_image_requests_recompute_the_same_tokens(llm: LLM, folder: Path) -> None:
    """A KV cache too small for both requests: the newer is preempted and recomputed (its
    image embeddings again at their rows), and both still give their greedy tokens."""
    small = LLM(str(folder), dtype="float32", num_pages=6, page_size=16,
                enable_prefix_caching=False)  # fmt: skip
    prompts = [chat_prompt(llm, [image], "Tell me.") for image in IMAGES[:2]]
    alone = [greedy(llm, ids, mm, 40) for ids, mm in prompts]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i, (ids, mm) in enumerate(prompts):
        small.engine.add_request(f"small-{i}", ids, params, multimodal=mm)
    outs = small._run(["small-0", "small-1"], False)
    assert sum(len(ids) for ids, _ in prompts) + 80 > 6 * 16  # they cannot both fit
    assert small.engine.stats().num_preemptions > 0
    assert [list(o.outputs[0].token_ids) for o in outs] == alone
