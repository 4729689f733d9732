"""Gemma 3's vision side: the SigLIP tower and the multimodal projector.

SigLIP is a plain ViT over a fixed square image (config `image_size`): each patch_size x
patch_size patch is embedded linearly (the checkpoint's Conv2d weight, read as a matrix), a
learned position embedding is added per patch, then pre-LayerNorm blocks of bidirectional
attention and a GELU-tanh MLP, and a final LayerNorm. The projector average-pools the patch
grid to tokens_per_image tokens (a square), normalizes them with Gemma's RMSNorm (scale 1 +
weight; llama.cpp's files store 1 + weight itself: offset 0) and maps them to the language
model's width. Every image has the same size, so a step's
images run as one batch. Plain torch (it runs once per image; the encoder cache keeps the
result).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.core.models.arch import VisionConfig


class SiglipAttention(nn.Module):
    def __init__(self, hidden: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [images, patches, hidden]
        b, n, _ = x.shape
        q, k, v = (p(x).view(b, n, self.num_heads, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        out = F.scaled_dot_product_attention(q, k, v)  # [images, heads, patches, d]
        projected: torch.Tensor = self.out_proj(out.transpose(1, 2).reshape(b, n, -1))
        return projected


class SiglipMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate)
        self.fc2 = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
        return out


class SiglipEncoderLayer(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.layer_norm1 = nn.LayerNorm(hidden, eps=eps)
        self.self_attn = SiglipAttention(hidden, config.num_heads)
        self.layer_norm2 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = SiglipMLP(hidden, config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        out: torch.Tensor = x + self.mlp(self.layer_norm2(x))
        return out


class SiglipEmbeddings(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        p, hidden = config.patch_size, config.hidden_size
        self.patch_embedding = nn.Conv2d(config.in_channels, hidden, p, stride=p)
        num_patches = (config.image_size // p) ** 2
        table = torch.empty(num_patches, hidden)  # no random init (on meta it is slow)
        self.position_embedding = nn.Embedding(num_patches, hidden, _weight=table)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[images, patches, channels * p * p] (each patch channel-major, as the conv's weight)
        -> [images, patches, hidden]."""
        weight = self.patch_embedding.weight
        embedded = F.linear(patches, weight.flatten(1), self.patch_embedding.bias)
        return embedded + self.position_embedding.weight


class SiglipEncoder(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SiglipEncoderLayer(config) for _ in range(config.depth))


class SiglipVisionTower(nn.Module):
    """Patches of images of one size -> the last hidden states [images, patches, hidden]."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        if not config.image_size:
            raise ValueError("a SigLIP tower needs vision_config.image_size")
        self.config = config
        self.embeddings = SiglipEmbeddings(config)
        self.encoder = SiglipEncoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(patches)
        for layer in self.encoder.layers:
            x = layer(x)
        out: torch.Tensor = self.post_layernorm(x)
        return out


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (offset + weight), in float32 (Gemma's form: an HF checkpoint stores
    weight, offset 1; a GGUF stores 1 + weight, offset 0)."""

    def __init__(self, size: int, eps: float, offset: float = 1.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (self.offset + self.weight.float())).to(x.dtype)


class Gemma3Projector(nn.Module):
    """The tower's patches -> tokens_per_image tokens of the language model's width."""

    def __init__(self, config: VisionConfig, norm_offset: float = 1.0) -> None:
        super().__init__()
        self.side = config.image_size // config.patch_size  # patches per side
        self.pool = config.spatial_merge_size  # patches per side of one token
        self.mm_input_projection_weight = nn.Parameter(
            torch.empty(config.hidden_size, config.out_hidden_size)
        )
        self.mm_soft_emb_norm = GemmaRMSNorm(config.hidden_size, config.layer_norm_eps, norm_offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[images, side * side, vision hidden] -> [images, tokens, text hidden]."""
        b, _, hidden = x.shape
        grid = x.transpose(1, 2).reshape(b, hidden, self.side, self.side)
        pooled = F.avg_pool2d(grid, self.pool, self.pool).flatten(2).transpose(1, 2)
        normed = self.mm_soft_emb_norm(pooled)
        return torch.matmul(normed, self.mm_input_projection_weight).to(x.dtype)
