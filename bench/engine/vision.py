"""Images in: image-to-first-token time and images/s, pagedserve vs transformers, same weights.

A Qwen2.5-VL-shaped model with random weights (language model: hidden 512, 4 layers, 8 query /
2 KV heads of 64, intermediate 1536; vision tower: 8 blocks of width 320 (5 heads of 64), full
attention in blocks 3 and 7, 112-pixel windows elsewhere; the tiny BPE vocabulary of
bench/common/tiny_vlm.py) is written to a temporary folder; both libraries load it in one process
in float32. Each request is one 224 x 224 random image (64 image tokens after the 2 x 2 merger)
and a short question, answered with 1 token: from the decoded RGB image to the first token,
preprocessing included. Ours: the image processor, the placeholder expansion and the offline
engine (`LLM.engine`, every request added, then stepped to the end; every image new, so the
encoder cache does not help). Transformers: its PIL image processor and `generate(max_new_tokens=1)`,
the c=8 requests as one batch (the prompts have the same length: no padding). c=1: one request
per call; c=8: eight per call. Medians of `--repeats` calls after a warm-up, ours and theirs
alternating. Ours twice: from the HF folder and from llama.cpp's two files (the language model
and its --mmproj projector, written as its converter writes them: bench/common/tiny_mmproj.py).
Also: the bytes the encoder cache keeps per image.

Then, over HTTP on those two files, `pagedserve serve LM.gguf --mmproj MMPROJ.gguf` against
llama.cpp's `llama-server --mmproj` (where --llama-server names a binary; 2 threads each, one
server at a time, 8 slots): chat completions with one new PNG each (a data URL) and max_tokens 1,
c=1 (one request per call) and c=8 (eight at once); the medians of --repeats calls after a
warm-up, and the prompt tokens each server counted.

    flock /tmp/pagedserve-bench.lock nice -n 0 python -m bench.engine.vision --repeats 3 \
        --llama-server bench/.work/llama.cpp-build/bin/llama-server
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from bench.common.tiny_mmproj import write_gguf_qwen2_5_vl
from bench.common.tiny_vlm import MAX_PIXELS, write_tiny_qwen2_5_vl
from bench.engine.vision_serving import serving
from pagedserve import LLM
from pagedserve.core.multimodal.inputs import content_hash, expand_image_tokens
from pagedserve.core.ops.cpu_features import cpu_isa, cpu_model
from pagedserve.core.sampling_params import SamplingParams

TEXT = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                    "mrope_section": [8, 12, 12]})  # fmt: skip
VISION = dict(depth=8, hidden_size=320, num_heads=5, intermediate_size=1280, out_hidden_size=512,
              window_size=112, fullatt_block_indexes=[3, 7])  # fmt: skip
QUESTION = "What is in the picture?"
_SEEDS = itertools.count(1)


def images(n: int) -> list[Image.Image]:
    out = []
    for _ in range(n):
        rng = np.random.default_rng(next(_SEEDS))
        out.append(Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)))
    return out


class Ours:
    def __init__(self, model: Path, mmproj: Path | None = None) -> None:
        self.llm = LLM(str(model), mmproj=str(mmproj) if mmproj else None, dtype="float32",
                       kv_cache_memory=0.5)  # fmt: skip
        template, processor = self.llm.engine.chat_template, self.llm.engine.image_processor
        assert template is not None and processor is not None
        self.processor = processor
        parts = [{"type": "image"}, {"type": "text", "text": QUESTION}]
        text = template.render([{"role": "user", "content": parts}], add_generation_prompt=True)
        self.ids = self.llm.tokenizer.encode(text, add_special_tokens=False)
        self._ids = itertools.count()

    def __call__(self, batch: list[Image.Image]) -> None:
        params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        request_ids = []
        vocab = self.llm.tokenizer.vocab_size
        for image in batch:
            digest = content_hash("RGB", image.size, image.tobytes())
            features = [self.processor.preprocess(image, digest)]
            ids, mm = expand_image_tokens(self.ids, features, self.processor.image_token_id, vocab)
            request_id = f"bench-{next(self._ids)}"
            self.llm.engine.add_request(request_id, ids, params, multimodal=mm)
            request_ids.append(request_id)
        self.llm._run(request_ids, False)


class Transformers:
    def __init__(self, folder: Path, model: torch.nn.Module) -> None:
        from transformers import AutoTokenizer
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        self.model = model
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.processor = Qwen2VLImageProcessorPil(max_pixels=MAX_PIXELS)
        content = [{"type": "image"}, {"type": "text", "text": QUESTION}]
        self.text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )

    def __call__(self, batch: list[Image.Image]) -> None:
        pixels = self.processor(images=batch, return_tensors="pt")
        num = int(pixels["image_grid_thw"][0].prod()) // 4
        text = self.text.replace("<|image_pad|>", "<|image_pad|>" * num)
        ids = torch.tensor([self.tokenizer(text, add_special_tokens=False).input_ids] * len(batch))
        image_token = self.model.config.image_token_id
        with torch.inference_mode():
            self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1,
                pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"],
                mm_token_type_ids=(ids == image_token).int(), do_sample=False,
            )  # fmt: skip


def timed(fn: Any, batch: int) -> float:
    work = images(batch)
    start = time.perf_counter()
    fn(work)
    return time.perf_counter() - start


def offline(folder: Path, pair: tuple[Path, Path], model: torch.nn.Module, repeats: int) -> None:
    runs = {"pagedserve (HF folder)": Ours(folder), "pagedserve (GGUF + mmproj)": Ours(*pair),
            "transformers": Transformers(folder, model)}  # fmt: skip
    print("| c | what | " + " | ".join(runs) + " |\n|---|---|" + "---|" * len(runs))
    for c in (1, 8):
        for run in runs.values():
            timed(run, c)  # warm-up
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(repeats):  # alternating
            for name, run in runs.items():
                times[name].append(timed(run, c))
        medians = [statistics.median(t) for t in times.values()]
        what = "image to first token" if c == 1 else "8 images to first tokens"
        cells = " | ".join(f"{m * 1000:.0f} ms, {c / m:.2f} images/s" for m in medians)
        print(f"| {c} | {what} | {cells} |")
    for name in list(runs)[:2]:
        ours = runs[name]
        assert isinstance(ours, Ours)
        cache = ours.llm.engine.model_runner.images
        assert cache is not None
        per = cache.cache.used / max(len(cache.cache), 1)
        print(f"encoder cache, {name}: {len(cache.cache)} images, {per / 1024:.0f} KiB per "
              f"image (64 tokens x hidden 512 x fp32)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--llama-server", type=Path, default=None,
                        help="llama.cpp's llama-server binary: also compare over HTTP")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(2)
    load = os.getloadavg()
    print(f"CPU: {cpu_model()} (ISA level {cpu_isa()}), torch threads 2, float32; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen2_5_vl-bench"
        model = write_tiny_qwen2_5_vl(folder, text_shape=TEXT, vision_shape=VISION)
        pair = Path(tmp) / "lm-f32.gguf", Path(tmp) / "mmproj-f32.gguf"
        write_gguf_qwen2_5_vl(folder, *pair)
        offline(folder, pair, model, args.repeats)
        if args.llama_server is not None:
            serving(pair, args.llama_server.resolve(), Path(tmp), args.repeats)


if __name__ == "__main__":
    main()
