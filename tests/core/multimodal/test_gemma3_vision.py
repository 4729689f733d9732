"""Gemma 3 with images against transformers fp32 on a tiny random checkpoint: the processor's
pixels and prompt ids (chat template, image sequence), the SigLIP tower and projector, and the
engine's greedy tokens with one and two images at every ISA level this CPU runs (whole
prefill, and small step budgets whose chunks would cut an image but never do), an image
request batched with a text one, the prefix cache by image (a hit that ends inside an image
included) and preemption."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from bench.common.tiny_gemma3_vl import write_tiny_gemma3_vl
from bench.common.tiny_vlm import random_image
from pagedserve.core.engine.llm import LLM
from pagedserve.core.multimodal.gemma3 import Gemma3ImageProcessor
from pagedserve.core.multimodal.inputs import ImageFeatures, content_hash, expand_image_tokens
from pagedserve.core.sampling_params import SamplingParams
from tests.core.multimodal.vlm_driver import chat_prompt, greedy, messages, run

transformers = pytest.importorskip("transformers")

NUM_TOKENS = 10
QUESTION = "What is in the picture?"


IMAGES = [random_image(70, 40, 1), random_image(56, 56, 2), random_image(70, 40, 3)]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("gemma3_vl")
    return folder, write_tiny_gemma3_vl(folder)


@pytest.fixture(scope="module")
def folder(written: tuple[Path, torch.nn.Module]) -> Path:
    return written[0]


@pytest.fixture(scope="module")
def hf_model(written: tuple[Path, torch.nn.Module]) -> Any:
    return written[1]


@pytest.fixture(scope="module")
def hf_processor(folder: Path) -> Any:
    return transformers.AutoProcessor.from_pretrained(folder)


@pytest.fixture(scope="module")
def llm(folder: Path) -> LLM:
    return LLM(str(folder), dtype="float32", kv_cache_memory=0.02, page_size=16)


def _processor(folder: Path) -> Gemma3ImageProcessor:
    config = json.loads((folder / "config.json").read_text())
    return Gemma3ImageProcessor.from_folder(folder, config)


def _features(folder: Path, images: list[Image.Image]) -> list[ImageFeatures]:
    processor = _processor(folder)
    return [processor.preprocess(im, content_hash("RGB", im.size, im.tobytes())) for im in images]


def _hf_inputs(hf_processor: Any, images: list[Image.Image], text: str) -> Any:
    rendered = hf_processor.apply_chat_template(messages(images, text),
                                                add_generation_prompt=True, tokenize=False)  # fmt: skip
    return hf_processor(text=rendered, images=images, return_tensors="pt")


def _hf_greedy(hf_model: Any, inputs: Any, num: int) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(**inputs, max_new_tokens=num, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def test_pixels_equal_transformers(folder: Path, hf_processor: Any) -> None:
    """Resized (70 x 40) and already square images: the patches of transformers' pixels."""
    want = hf_processor.image_processor(IMAGES[:2], return_tensors="np")["pixel_values"]
    ours = _features(folder, IMAGES[:2])
    p = 14
    for got, pixels in zip(ours, want, strict=True):
        grid = pixels.shape[1] // p
        patches = pixels.reshape(3, grid, p, grid, p).transpose(1, 3, 0, 2, 4)
        np.testing.assert_allclose(got.pixel_values, patches.reshape(grid * grid, -1), atol=1e-5)
        assert got.grid_thw == (1, grid, grid) and got.num_tokens == 4


@pytest.mark.parametrize("num_images", [1, 2])
def test_prompt_ids_equal_transformers(llm: LLM, folder: Path, hf_processor: Any,
                                       num_images: int) -> None:  # fmt: skip
    """The template's text and the processor's ids: each <start_of_image> becomes the image
    sequence, whose image tokens are our placeholders (at transformers' token_type_ids)."""
    images = IMAGES[:num_images]
    ids, mm = chat_prompt(llm, images, QUESTION)
    hf = _hf_inputs(hf_processor, images, QUESTION)
    image_token = _processor(folder).image_token_id
    ours = [image_token if t >= llm.tokenizer.vocab_size else t for t in ids]
    assert ours == hf["input_ids"][0].tolist()
    in_image = np.zeros(len(ids), dtype=np.int64)
    for s, e in mm.spans():
        in_image[s:e] = 1
    np.testing.assert_array_equal(in_image, hf["token_type_ids"][0].numpy())


def test_tower_equals_transformers(llm: LLM, folder: Path, hf_model: Any,
                                   hf_processor: Any) -> None:  # fmt: skip
    pixels = hf_processor.image_processor(IMAGES[:2], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        want = hf_model.model.get_image_features(pixels).pooler_output
        model = llm.engine.model_runner.images.model  # type: ignore[union-attr]
        got = model.encode_images([torch.from_numpy(f.pixel_values)
                                   for f in _features(folder, IMAGES[:2])], [(1, 4, 4)] * 2)  # fmt: skip
    torch.testing.assert_close(torch.stack(got), want, atol=1e-5, rtol=1e-5)


def test_image_tokens_attend_both_ways_in_transformers(hf_model: Any, hf_processor: Any) -> None:
    """The oracle is sensitive to the mask: without token_type_ids (causal image tokens)
    transformers' logits move."""
    inputs = _hf_inputs(hf_processor, IMAGES[:1], QUESTION)
    with torch.no_grad():
        both_ways = hf_model(**inputs).logits[0, -1]
        causal = hf_model(**{k: v for k, v in inputs.items() if k != "token_type_ids"}).logits
    assert (both_ways - causal[0, -1]).abs().max() > 1e-3


@pytest.fixture(scope="module")
def hf_greedy(hf_model: Any, hf_processor: Any) -> dict[int, list[int]]:
    """transformers' greedy tokens with 1 and 2 images."""
    return {n: _hf_greedy(hf_model, _hf_inputs(hf_processor, IMAGES[:n], QUESTION), NUM_TOKENS)
            for n in (1, 2)}  # fmt: skip


def test_greedy_tokens_equal_transformers(cpu_isa: str, folder: Path,
                                          hf_greedy: dict[int, list[int]]) -> None:  # fmt: skip
    """At each ISA level, one and two images: whole prefills, and steps of 5 tokens, whose
    chunks would cut every image (the scheduler keeps each whole)."""
    whole = LLM(str(folder), dtype="float32", cpu_isa=cpu_isa, num_pages=32, page_size=16)
    chunked = LLM(str(folder), dtype="float32", cpu_isa=cpu_isa, num_pages=32, page_size=16,
                  max_num_batched_tokens=5, max_prefill_tokens_while_decoding=5,
                  enable_prefix_caching=False)  # fmt: skip
    for num_images, want in hf_greedy.items():
        ids, mm = chat_prompt(whole, IMAGES[:num_images], QUESTION)
        assert all(s // 5 != (e - 1) // 5 for s, e in mm.spans())  # 5-token chunks would cut
        assert greedy(whole, ids, mm, NUM_TOKENS) == want
        assert greedy(chunked, ids, mm, NUM_TOKENS) == want


def test_a_batch_of_an_image_request_and_a_text_request(llm: LLM, folder: Path) -> None:
    """Requests with images (one and two) and a text-only one in one batch, each with its own
    greedy tokens."""
    one, one_mm = chat_prompt(llm, IMAGES[1:2], "Describe it.")
    two, two_mm = chat_prompt(llm, IMAGES[:2], "Compare them.")
    text_ids = llm.tokenizer.encode("<bos>Hello there, how are you today?")
    alone = [greedy(llm, one, one_mm, 6), greedy(llm, two, two_mm, 6),
             greedy(llm, text_ids, None, 6)]  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm.engine.add_request("g3-a", one, params, multimodal=one_mm)
    llm.engine.add_request("g3-b", two, params, multimodal=two_mm)
    llm.engine.add_request("g3-c", text_ids, params)
    outs = llm._run(["g3-a", "g3-b", "g3-c"], False)
    assert [list(o.outputs[0].token_ids) for o in outs] == alone


def test_prefix_cache_by_image_and_a_hit_inside_anrandom_image(folder: Path, hf_model: Any) -> None:
    """page_size 4, an image near the prompt's end: the same prompt again hits every page but
    the last token's, and they end inside the image (its tokens' KV there were computed with
    the whole image) and its embeddings come from the encoder cache; the tokens stay
    transformers'. Another image of the same size hits no page past its start."""
    llm = LLM(str(folder), dtype="float32", num_pages=64, page_size=4)
    processor = _processor(folder)
    a, _, b = IMAGES
    vocab = llm.tokenizer.vocab_size
    text = processor.expand_prompt("<bos>Look at this: <start_of_image>")
    base = llm.tokenizer.encode(text, add_special_tokens=False)
    features = _features(folder, [a])
    for pad in range(4):  # text before the image, so that the last full page ends inside it
        ids = base[:1] + base[1:2] * pad + base[1:]
        ids_a, mm_a = expand_image_tokens(ids, features, processor.image_token_id, vocab)
        start, end = mm_a.spans()[0]
        if start < (len(ids_a) - 1) // 4 * 4 < end:
            break
    else:
        pytest.fail("no padding puts a page boundary inside the image")
    hf_ids = torch.tensor([[processor.image_token_id if t >= vocab else t for t in ids_a]])
    token_types = torch.zeros_like(hf_ids)
    token_types[0, start:end] = 1
    hf = {"input_ids": hf_ids, "attention_mask": torch.ones_like(hf_ids),
          "token_type_ids": token_types,
          "pixel_values": torch.from_numpy(_pixels(features[0]))[None]}  # fmt: skip
    want = _hf_greedy(hf_model, hf, 6)
    assert greedy(llm, ids_a, mm_a, 6) == want
    images = llm.engine.model_runner.images
    assert images is not None and images.cache.misses == 1
    again = run(llm, ids_a, mm_a, 6)
    assert again.metrics is not None and start < again.metrics.num_cached_tokens < end
    assert images.cache.hits == 1 and images.cache.misses == 1  # the encoder cache's embeddings
    assert list(again.outputs[0].token_ids) == want
    ids_b, mm_b = expand_image_tokens(ids, _features(folder, [b]), processor.image_token_id, vocab)
    other = run(llm, ids_b, mm_b, 6)
    assert other.metrics is not None and other.metrics.num_cached_tokens <= start


def _pixels(features: ImageFeatures, p: int = 14) -> np.ndarray:
    """Our patches back to transformers' pixel_values [3, side, side]."""
    grid = features.grid_thw[1]
    x = features.pixel_values.reshape(grid, grid, 3, p, p).transpose(2, 0, 3, 1, 4)
    return np.ascontiguousarray(x.reshape(3, grid * p, grid * p))


def test_preempted_image_requests_recompute_the_same_tokens(llm: LLM, folder: Path) -> None:
    """A KV cache too small for both requests: the newer is preempted and recomputed (its
    image again in one chunk), and both still give their greedy tokens."""
    small = LLM(str(folder), dtype="float32", num_pages=5, page_size=16,
                enable_prefix_caching=False)  # fmt: skip
    prompts = [chat_prompt(llm, [image], "Tell me.") for image in IMAGES[:2]]
    alone = [greedy(llm, ids, mm, 30) for ids, mm in prompts]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    for i, (ids, mm) in enumerate(prompts):
        small.engine.add_request(f"small-{i}", ids, params, multimodal=mm)
    outs = small._run(["small-0", "small-1"], False)
    assert sum(len(ids) for ids, _ in prompts) + 60 > 5 * 16  # they cannot both fit
    assert small.engine.stats().num_preemptions > 0
    assert [list(o.outputs[0].token_ids) for o in outs] == alone


def test_refusals_name_what_does_not_run(folder: Path, tmp_path: Path) -> None:
    """Step budgets that cannot hold one image, and pan-and-scan, are refused at load by name;
    tensor parallel is refused as for every model with images."""
    with pytest.raises(ValueError, match=r"max_prefill_tokens_while_decoding \(2\) must be at"):
        LLM(str(folder), dtype="float32", num_pages=8, max_prefill_tokens_while_decoding=2)
    with pytest.raises(ValueError, match=r"gemma3 \(images\) runs at tensor_parallel_size 1"):
        LLM(str(folder), dtype="float32", num_pages=8, tensor_parallel_size=2)
    copy = tmp_path / "pan"
    copy.mkdir()
    for path in folder.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    pre = json.loads((copy / "preprocessor_config.json").read_text())
    (copy / "preprocessor_config.json").write_text(json.dumps({**pre, "do_pan_and_scan": True}))
    with pytest.raises(ValueError, match="do_pan_and_scan"):
        LLM(str(copy), dtype="float32", num_pages=8)


@pytest.mark.parametrize("caching", [True, False], ids=["prefix-cache", "no-cache"])
def test_n_outputs_of_an_image_request_are_each_the_single_requests(
    folder: Path, caching: bool
) -> None:
    """n = 2 with an image: greedy, both outputs are the single request's tokens; seeded
    sampling, output i is the single request seeded seed + i. With the prefix cache the
    second output joins on the first's pages (the image's among them); without, both compute
    the whole prompt, image included."""
    llm = LLM(str(folder), dtype="float32", num_pages=64, page_size=4,
              enable_prefix_caching=caching)  # fmt: skip
    ids, mm = chat_prompt(llm, IMAGES[:1], QUESTION)
    assert mm.spans()[0][1] <= (len(ids) - 1) // 4 * 4  # the image lies in full pages

    def outputs(**params: Any) -> list[list[int]]:
        out = run(llm, ids, mm, NUM_TOKENS, **params)
        return [list(o.token_ids) for o in sorted(out.outputs, key=lambda o: o.index)]

    [single] = outputs()
    assert outputs(n=2) == [single, single]
    both = outputs(n=2, seed=7, temperature=1.0)
    assert both == [outputs(seed=7 + i, temperature=1.0)[0] for i in range(2)]
    assert both[0] != both[1]  # the two outputs did draw apart
