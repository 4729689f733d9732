"""Qwen2.5-VL: the shared decoder (Qwen2's layers) with a vision tower and multimodal rotary.

The language model is `LlamaForCausalLM` as for every family; this class adds the tower
(vision_qwen2_5.py) and two things to a step: the image embeddings written at their token
rows (`StepImages.rows`), and multimodal rotary positions. Each token has three positions
(temporal, height, width): text tokens have the same one thrice, an image's tokens their grid
row and column (core/multimodal/mrope.py computes them); the head's frequency pairs are split
by `mrope_section` among the three, so a token's rotary row is gathered column by column from
the ordinary tables. The KV cache and the causal mask keep the plain positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from pagedserve.core.attention.base import AttentionBackend, AttentionMetadata
from pagedserve.core.attention.image_blocks import ImageBlock
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.llama import LlamaForCausalLM, Rope
from pagedserve.core.models.vision_qwen2_5 import Grid, Qwen2_5VisionTower


@dataclass
class StepImages:
    """What a step's forward needs of its images (built by the model runner)."""

    rows: torch.Tensor
    """int64 [k]: rows of the step whose input is an image token."""
    embeds: torch.Tensor
    """[k, hidden_size]: the image embeddings those rows take."""
    rope_positions: torch.Tensor
    """int64 [3, num_tokens]: every row's (temporal, height, width) rotary position."""
    blocks: list[ImageBlock] = field(default_factory=list)
    """Gemma 3: each image's rows in the step, whose tokens attend to each other both ways."""


class Qwen2_5_VLForConditionalGeneration(LlamaForCausalLM):
    def __init__(
        self,
        arch: ArchConfig,
        attention: AttentionBackend,
        *,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int | None = None,
    ) -> None:
        super().__init__(arch, attention, dtype=dtype, device=device, max_positions=max_positions)
        if arch.vision is None or len(arch.mrope_section) != 3:
            raise ValueError("a Qwen2.5-VL config needs vision_config and a 3-part mrope_section")
        if sum(arch.mrope_section) * 2 != arch.head_size:
            raise ValueError(f"mrope_section {arch.mrope_section} does not cover head_size / 2")
        self.visual = Qwen2_5VisionTower(arch.vision, device)
        half = [i for i, n in enumerate(arch.mrope_section) for _ in range(n)]
        columns = torch.tensor(half + half, dtype=torch.long, device=device)
        self.mrope_columns: torch.Tensor  # [head_size]: which of the 3 positions each column uses
        self.register_buffer("mrope_columns", columns, persistent=False)

    def encode_images(self, pixels: list[torch.Tensor], grids: list[Grid]) -> list[torch.Tensor]:
        """Each image's embeddings [its tokens, hidden_size], all images in one tower call."""
        weight = self.visual.patch_embed.proj.weight
        merged = self.visual(torch.cat(pixels).to(weight.device), grids)
        unit = self.visual.config.spatial_merge_size**2
        sizes = [t * h * w // unit for t, h, w in grids]
        return list(merged.to(self.norm.dtype).split(sizes))

    def _mropes(self, positions3: torch.Tensor) -> list[Rope]:
        """Rotary rows of (temporal, height, width) positions [3, n], column by column."""
        n = positions3.shape[1]
        pick = self.mrope_columns.view(1, 1, -1).expand(1, n, -1)
        cos = self.rope_cos[positions3].gather(0, pick)[0].unsqueeze(1)  # [n, 1, head_size]
        sin = self.rope_signed_sin[positions3].gather(0, pick)[0].unsqueeze(1)
        return [(cos, sin)]

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64; an image token's id is a placeholder
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        *args: Any,  # what the shared decoder takes beyond (adapters), passed on
        images: StepImages | None = None,
    ) -> torch.Tensor:
        if images is None:  # text only: the three positions are one
            return super().forward(input_ids, positions, kv_caches, meta, *args)
        ids = input_ids.masked_fill(input_ids >= self.arch.vocab_size, 0)
        hidden = self.embed_tokens(ids)
        hidden[images.rows] = images.embeds.to(hidden.dtype)
        ropes = self._mropes(images.rope_positions)
        return self.run_layers(hidden, ropes, kv_caches, meta, *args)
