"""Qwen2.5-VL's vision tower: patches -> the language model's image embeddings.

A ViT over 14-pixel patches (two frames of a still image, a linear patch embedding), 2-D
rotary positions (height and width), RMSNorm + SwiGLU blocks; blocks attend within windows of
`window_size` pixels except the `fullatt_block_indexes` ones, which see the whole image; the
merger folds each 2 x 2 group of patches into one language-model token. Tokens are reordered
window by window before the blocks and back after the merger, as the checkpoint was trained.
Several images run in one call, each attending only to itself. Plain torch (it runs once per
image; the encoder cache keeps the result).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.core.models.arch import VisionConfig

Grid = tuple[int, int, int]  # patches along time, height, width


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class VisionMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate)
        self.up_proj = nn.Linear(hidden, intermediate)
        self.down_proj = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [n, heads, d] rotated by rotate_half in fp32 (cos, sin [n, d])."""
    h = x.float()
    half = h.shape[-1] // 2
    rotated = torch.cat((-h[..., half:], h[..., :half]), dim=-1)
    return (h * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)).to(x.dtype)


class VisionAttention(nn.Module):
    def __init__(self, hidden: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(
        self, x: torch.Tensor, cu_seqlens: list[int], rope: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, 3, self.num_heads, -1).unbind(1)  # each [n, heads, d]
        q, k = _rotate(q, *rope), _rotate(k, *rope)
        out = torch.empty_like(q)
        for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):
            # [heads, len, d]: one window (or one image) attends to itself, both ways
            qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
            out[start:end] = F.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1)
        projected: torch.Tensor = self.proj(out.reshape(n, -1))
        return projected


class VisionBlock(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(config.hidden_size)
        self.norm2 = RMSNorm(config.hidden_size)
        self.attn = VisionAttention(config.hidden_size, config.num_heads)
        self.mlp = VisionMLP(config.hidden_size, config.intermediate_size)

    def forward(
        self, x: torch.Tensor, cu_seqlens: list[int], rope: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cu_seqlens, rope)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class PatchMerger(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.width = config.hidden_size * config.spatial_merge_size**2
        self.ln_q = RMSNorm(config.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(self.width, self.width),
            nn.GELU(),
            nn.Linear(self.width, config.out_hidden_size),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mlp(self.ln_q(x).view(-1, self.width))
        return out


class PatchEmbed(nn.Module):
    """The checkpoint's Conv3d (stride = kernel) over each patch: one linear map of its pixels."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        p, t = config.patch_size, config.temporal_patch_size
        kernel = (t, p, p)
        self.proj = nn.Conv3d(config.in_channels, config.hidden_size, kernel, kernel, bias=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:  # [n, C * t * p * p]
        weight = self.proj.weight  # [hidden, C, t, p, p]
        return pixels.to(weight.dtype) @ weight.reshape(weight.shape[0], -1).t()


class Qwen2_5VisionTower(nn.Module):
    def __init__(self, config: VisionConfig, device: torch.device) -> None:
        """Parameters where the ambient default device says (the loader's meta); the rotary
        frequencies straight on `device`."""
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"vision_config hidden_act {config.hidden_act!r} is not supported")
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(config)
        head = config.hidden_size // config.num_heads
        quarter = torch.arange(0, head // 2, 2, dtype=torch.float, device="cpu") / (head // 2)
        self.inv_freq: torch.Tensor
        inv_freq = (1.0 / (10000.0**quarter)).to(device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, pixels: torch.Tensor, grids: list[Grid]) -> torch.Tensor:
        """pixels [sum of patches, patch_dim] of `grids`' images in order -> [sum of tokens,
        out_hidden_size]: each image's tokens in its prompt order."""
        unit = self.config.spatial_merge_size**2
        order, cu_windows = self._windows(grids)
        cu_images = [0]
        for t, h, w in grids:
            for _ in range(t):  # each frame attends to itself
                cu_images.append(cu_images[-1] + h * w)
        x = self.patch_embed(pixels)
        n = x.shape[0]
        x = x.reshape(n // unit, unit, -1)[order].reshape(n, -1)
        freqs = self._rope_freqs(grids).reshape(n // unit, unit, -1)[order].reshape(n, -1)
        emb = torch.cat((freqs, freqs), dim=-1)
        rope = (emb.cos(), emb.sin())
        for i, block in enumerate(self.blocks):
            full = i in self.config.fullatt_block_indexes
            x = block(x, cu_images if full else cu_windows, rope)
        merged: torch.Tensor = self.merger(x)
        return merged[torch.argsort(order)]

    def _rope_freqs(self, grids: list[Grid]) -> torch.Tensor:
        """[patches, head / 2]: each patch's (row, column) angles, merge group by merge group."""
        m = self.config.spatial_merge_size
        rows = []
        for t, h, w in grids:
            hpos = torch.arange(h).unsqueeze(1).expand(h, w)
            wpos = torch.arange(w).unsqueeze(0).expand(h, w)
            shape = (h // m, m, w // m, m)
            hpos = hpos.reshape(shape).transpose(1, 2).flatten()
            wpos = wpos.reshape(shape).transpose(1, 2).flatten()
            rows.append(torch.stack([hpos, wpos], dim=-1).repeat(t, 1))
        pos = torch.cat(rows).float()  # [patches, 2]
        freqs = pos.unsqueeze(-1) * self.inv_freq.float()  # [patches, 2, head / 4]
        return freqs.flatten(1).to(self.inv_freq.device)

    def _windows(self, grids: list[Grid]) -> tuple[torch.Tensor, list[int]]:
        """The merge groups' order window by window, and the windows' cumulative patch counts."""
        m = self.config.spatial_merge_size
        size = self.config.window_size // m // self.config.patch_size  # groups per window side
        order: list[torch.Tensor] = []
        cu = [0]
        first = 0
        for t, h, w in grids:
            gh, gw = h // m, w // m
            index = torch.arange(t * gh * gw).reshape(t, gh, gw)
            pad_h, pad_w = -gh % size, -gw % size
            padded = F.pad(index, (0, pad_w, 0, pad_h), value=-1)
            nh, nw = (gh + pad_h) // size, (gw + pad_w) // size
            windows = padded.reshape(t, nh, size, nw, size).permute(0, 1, 3, 2, 4)
            windows = windows.reshape(t * nh * nw, size * size)
            for window in windows:
                kept = window[window >= 0]
                if len(kept):
                    order.append(kept + first)
                    cu.append(cu[-1] + len(kept) * m * m)
            first += t * gh * gw
        return torch.cat(order), cu
