"""Gemma 3 with images: the shared decoder (Gemma 3's layers) with a SigLIP tower.

The language model is `LlamaForCausalLM` as for every family; this class adds the tower and
projector (vision_siglip.py) and two things to a step: the image embeddings written at their
token rows (`StepImages.rows`, not scaled by the embedding scale, as transformers does), and
attention that opens each image's block (`StepImages.blocks`: an image's tokens see each other
both ways; attention/image_blocks.py wraps the backend the layers call). Positions are the
plain ones.
"""

from __future__ import annotations

from typing import Any

import torch

from pagedserve.core.attention.base import AttentionBackend, AttentionMetadata
from pagedserve.core.attention.image_blocks import ImageBlockAttention, ImageBlockMetadata
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.llama import LlamaForCausalLM
from pagedserve.core.models.qwen2_5_vl import StepImages
from pagedserve.core.models.vision_qwen2_5 import Grid
from pagedserve.core.models.vision_siglip import Gemma3Projector, SiglipVisionTower


class Gemma3ForConditionalGeneration(LlamaForCausalLM):
    def __init__(
        self,
        arch: ArchConfig,
        attention: AttentionBackend,
        *,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int | None = None,
    ) -> None:
        blocks = ImageBlockAttention(attention)
        super().__init__(arch, blocks, dtype=dtype, device=device, max_positions=max_positions)
        if arch.vision is None or not arch.vision.tokens_per_image:
            raise ValueError("a Gemma 3 config with images needs vision_config")
        self.visual = SiglipVisionTower(arch.vision)
        # The soft embedding norm's offset is the language model's: 1 from an HF folder, 0 from
        # llama.cpp's files (their norms hold 1 + weight).
        self.projector = Gemma3Projector(arch.vision, norm_offset=arch.norm_offset)

    def encode_images(self, pixels: list[torch.Tensor], grids: list[Grid]) -> list[torch.Tensor]:
        """Each image's embeddings [tokens_per_image, hidden_size], all images in one call
        (every image has the tower's size: `grids` are all alike)."""
        weight = self.visual.embeddings.patch_embedding.weight
        patches = torch.stack(pixels).to(weight.device, weight.dtype)  # [images, patches, dim]
        tokens = self.projector(self.visual(patches))
        return list(tokens.to(self.norm.dtype).unbind(0))

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64; an image token's id is a placeholder
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        *args: Any,  # what the shared decoder takes beyond (adapters), passed on
        images: StepImages | None = None,
    ) -> torch.Tensor:
        if images is None:  # no image row in the step
            return super().forward(input_ids, positions, kv_caches, meta, *args)
        assert self.stack is None, "Gemma 3's layers never run in the native decoder stack"
        ids = input_ids.masked_fill(input_ids >= self.arch.vocab_size, 0)
        hidden = self.embed_tokens(ids)
        hidden = hidden * torch.tensor(self.arch.embed_scale, dtype=hidden.dtype)
        hidden[images.rows] = images.embeds.to(hidden.dtype)
        block_meta = ImageBlockMetadata.of(meta, images.blocks)
        return self.run_layers(hidden, self._ropes(positions), kv_caches, block_meta, *args)
