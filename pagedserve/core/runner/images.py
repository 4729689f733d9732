"""The model runner's images: which rows of a step are image tokens, their embeddings (the
vision tower run once per image, batched over the images a step needs), and every row's
multimodal rotary positions; an LRU of recent images' embeddings under a byte budget.

A prefill chunk may start or end inside an image: the chunk takes the rows of the image's
embeddings it covers (the whole image is encoded once and kept in the cache). Rows of requests
without images take their plain position thrice. Gemma 3 has plain positions, and its images'
tokens attend to each other both ways: the step names each image's rows (`ImageBlock`), and
the scheduler never ends a chunk inside such an image (`whole_images`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from pagedserve.core.attention.image_blocks import ImageBlock
from pagedserve.core.models.gemma3_vl import Gemma3ForConditionalGeneration
from pagedserve.core.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration, StepImages
from pagedserve.core.multimodal.inputs import ImageFeatures, MultiModalInputs
from pagedserve.core.multimodal.mrope import mrope_positions
from pagedserve.core.sched.scheduler import StepPlan


class EncoderCache:
    """Image embeddings by content hash, least recently used first out, under `budget` bytes
    (an image larger than the budget is still used by the step that needs it)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.used = 0
        self._entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: bytes) -> torch.Tensor | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: bytes, embeds: torch.Tensor) -> None:
        if key in self._entries:
            return
        self._entries[key] = embeds
        self.used += _nbytes(embeds)
        while self.used > self.budget and len(self._entries) > 1:
            _, old = self._entries.popitem(last=False)
            self.used -= _nbytes(old)

    def __len__(self) -> int:
        return len(self._entries)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class _SeqImages:
    inputs: MultiModalInputs
    positions: np.ndarray | None  # int64 [3, num_prompt]; None: the plain ones (no mrope)
    delta: int


VisionLanguageModel = Qwen2_5_VLForConditionalGeneration | Gemma3ForConditionalGeneration


class ImageRunner:
    def __init__(self, model: VisionLanguageModel, device: torch.device, budget_bytes: int) -> None:
        assert model.arch.vision is not None
        self.model = model
        self.device = device
        self.merge_size = model.arch.vision.spatial_merge_size
        self.mrope = bool(model.arch.mrope_section)
        self.whole_images = isinstance(model, Gemma3ForConditionalGeneration)
        """An image's tokens attend to each other both ways (each chunk holds its end)."""
        self.cache = EncoderCache(budget_bytes)
        self._seqs: dict[int, _SeqImages] = {}

    def add(self, seq_id: int, inputs: MultiModalInputs, num_prompt: int) -> None:
        if not self.mrope:
            self._seqs[seq_id] = _SeqImages(inputs, None, 0)
            return
        positions, delta = mrope_positions(num_prompt, inputs, self.merge_size)
        self._seqs[seq_id] = _SeqImages(inputs, positions, delta)

    def release(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def step(self, plan: StepPlan) -> StepImages | None:
        """The step's image rows, embeddings and rotary positions (None: no row of the step
        belongs to a request with images, so plain positions are exact)."""
        seq_ids = plan.seq_ids.tolist()
        if not any(s in self._seqs for s in seq_ids):
            return None
        positions = np.repeat(plan.positions.astype(np.int64)[None, :], 3, axis=0)
        starts = plan.query_start_loc.tolist()
        computed = plan.num_computed_tokens.tolist()
        wanted: list[tuple[int, ImageFeatures, int, int]] = []  # (first row, image, lo, hi)
        blocks: list[ImageBlock] = []
        for r, seq_id in enumerate(seq_ids):
            seq = self._seqs.get(seq_id)
            if seq is None:
                continue
            lo, hi, row0 = computed[r], computed[r] + starts[r + 1] - starts[r], starts[r]
            if seq.positions is not None:
                self._mrope_rows(positions, seq, lo, hi, row0)
            for (s, e), image in zip(seq.inputs.spans(), seq.inputs.images, strict=True):
                if s < hi and e > lo:  # the chunk covers image tokens [max(s,lo), min(e,hi))
                    a, b = max(s, lo), min(e, hi)
                    wanted.append((row0 + a - lo, image, a - s, b - s))
                    if self.whole_images:
                        assert b == e, "the scheduler ends no chunk inside a whole image"
                        blocks.append(ImageBlock(r, a, e, row0 + a - lo))
        if not wanted and not self.mrope:
            return None
        embeds = self._embeddings([image for _, image, _, _ in wanted])
        rows = [torch.arange(r, r + hi - lo) for r, _, lo, hi in wanted]
        parts = [embeds[im.content_hash][lo:hi] for _, im, lo, hi in wanted]
        hidden = self.model.arch.hidden_size
        return StepImages(
            rows=(torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)).to(self.device),
            embeds=torch.cat(parts) if parts else torch.zeros(0, hidden, device=self.device),
            rope_positions=torch.from_numpy(positions).to(self.device),
            blocks=blocks,
        )

    @staticmethod
    def _mrope_rows(positions: np.ndarray, seq: _SeqImages, lo: int, hi: int, row0: int) -> None:
        """The rotary positions of a chunk's rows [row0, row0 + hi - lo) (prompt tokens
        [lo, hi)): the prompt's from `seq.positions`, the output's shifted by its delta."""
        assert seq.positions is not None
        prompt = seq.positions.shape[1]
        in_prompt = min(hi, prompt)
        if lo < in_prompt:
            positions[:, row0 : row0 + in_prompt - lo] = seq.positions[:, lo:in_prompt]
        if hi > prompt:
            first = row0 + max(prompt - lo, 0)
            positions[:, first : row0 + hi - lo] += seq.delta

    def _embeddings(self, images: list[ImageFeatures]) -> dict[bytes, torch.Tensor]:
        """Each image's embeddings: from the cache, the rest in one tower call."""
        found: dict[bytes, torch.Tensor] = {}
        missing: dict[bytes, ImageFeatures] = {}
        for image in images:
            key = image.content_hash
            cached = found.get(key)
            if cached is None:
                cached = self.cache.get(key)
            if cached is not None:
                found[key] = cached
                self.cache.hits += 1
            elif key not in missing:
                missing[key] = image
                self.cache.misses += 1
        if missing:
            todo = list(missing.values())
            pixels = [torch.from_numpy(im.pixel_values) for im in todo]
            outs = self.model.encode_images(pixels, [im.grid_thw for im in todo])
            for image, out in zip(todo, outs, strict=True):
                found[image.content_hash] = out
                self.cache.put(image.content_hash, out)
        return found
