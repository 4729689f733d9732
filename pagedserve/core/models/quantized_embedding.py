"""A GGUF token embedding kept in its quantized blocks, rows dequantized as they are looked up.

    embed = QuantizedEmbedding(blocks, ggml_type, hidden_size, dtype)   blocks: uint8 [vocab, row bytes]
    hidden = embed(input_ids)                                          [num_tokens, hidden_size]

A GGUF's token_embd is usually quantized (Q8_0 in the default model: 28 MB of blocks where the
float32 table takes 113 MB). Where nothing else needs the dense table (the LM head reads the
quantized rows, or the head is a tensor of its own: models/linear/quantized.py decides), the
model keeps only the blocks. A step looks up a few rows (a prompt's at most), dequantized with
gguf's own dequantize, the loader's (loader_gguf.py), so they are the dense table's bits; Q8_0
takes a torch path with the same products (d x q, exact in float32).

    embed = TiedQ8Embedding(head_packed, hidden_size, dtype)   the LM head's Q8_0 tiles

A Q8_0 embedding tied to an LM head the quantized kernels run (the default model's) reads its
rows out of the head's packed tiles instead: one copy of the table (28.7 MiB for the default
model) serves both. Its values are the same bits: the tiles hold u = q + 128 and the block's d
(exact in fp16), so (u - 128) d is the same product q d.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from torch import nn

_Q8_0_BLOCK = 34  # fp16 d, then 32 int8 values
# cpp/src/linear_quant/layout.hpp's 8-bit tiles (one scale per 32 features, fp16 scales): per tile
# of 32 columns and block of 32 features, 1024 bytes u[s][h][c][j] (column 16 h + c, feature
# 4 s + j), then the 32 columns' scales, then their mins.
_TILE_N, _BLOCK_K = 32, 32
_QUANT_BYTES = _TILE_N * _BLOCK_K
_TILE_BLOCK_BYTES = _QUANT_BYTES + 2 * _TILE_N * 2


class QuantizedEmbedding(nn.Module):
    def __init__(
        self, blocks: torch.Tensor, ggml_type: int, hidden_size: int, dtype: torch.dtype
    ) -> None:
        super().__init__()
        if blocks.dtype != torch.uint8 or blocks.dim() != 2:
            raise ValueError(
                f"blocks must be uint8 [vocab, row bytes], got {blocks.dtype} {blocks.shape}"
            )
        self.ggml_type = GGMLQuantizationType(ggml_type)
        self.num_embeddings, self.embedding_dim = int(blocks.shape[0]), hidden_size
        self.dtype = dtype
        self.blocks: torch.Tensor
        # Not persistent: the loader never fills it from a state dict (the blocks come from the
        # GGUF's tensor directly), and a strict load must not ask for it.
        self.register_buffer("blocks", blocks, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.blocks.index_select(0, input_ids.reshape(-1))
        if self.ggml_type == GGMLQuantizationType.Q8_0:
            grouped = rows.view(rows.shape[0], -1, _Q8_0_BLOCK)
            d = grouped[..., :2].contiguous().view(torch.float16).float()
            q = grouped[..., 2:].contiguous().view(torch.int8).float()
            dense = (q * d).view(rows.shape[0], self.embedding_dim)
        else:
            dense = torch.from_numpy(dequantize(rows.numpy(), self.ggml_type))
        return dense.to(self.dtype).view(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.ggml_type.name}"


class TiedQ8Embedding(nn.Module):
    """Lookups of a Q8_0 token embedding in the packed tiles of the LM head it is tied to
    (ops/linear_quant.pack_quant_weight of its rows in token order): column t of the head is
    token t's row."""

    def __init__(self, packed: torch.Tensor, num_embeddings: int, hidden_size: int,
                 dtype: torch.dtype) -> None:  # fmt: skip
        super().__init__()
        num_tiles = -(-num_embeddings // _TILE_N)
        blocks = hidden_size // _BLOCK_K
        if (
            packed.dtype != torch.uint8
            or hidden_size % _BLOCK_K
            or packed.numel() != num_tiles * blocks * _TILE_BLOCK_BYTES
        ):
            raise ValueError(
                f"packed must be the uint8 Q8_0 tiles of [{num_embeddings}, {hidden_size}], "
                f"got {packed.dtype} x {packed.numel()}"
            )
        self.num_embeddings, self.embedding_dim, self.dtype = num_embeddings, hidden_size, dtype
        self.packed: torch.Tensor
        # Not persistent (the head's tiles, built by the loader); the same storage as the head's.
        self.register_buffer("packed", packed, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # numpy's indexing: a decode step's one or few rows cost a few microseconds, not the
        # ~90 us of torch's per-op overhead over the same ~15 operations. Same bits: the int8
        # value times its block's fp16 scale, both exact in float32, one product.
        ids = input_ids.reshape(-1).numpy()
        if ids.size and not 0 <= int(ids.min()) <= int(ids.max()) < self.num_embeddings:
            raise IndexError(f"token ids must be in [0, {self.num_embeddings})")
        blocks = self.embedding_dim // _BLOCK_K
        tiles = self.packed.numpy().reshape(-1, blocks, _TILE_BLOCK_BYTES)
        tile, col = np.divmod(ids, _TILE_N)
        quants = tiles[..., :_QUANT_BYTES].reshape(-1, blocks, 8, 2, 16, 4)
        u = quants[tile, :, :, col // 16, col % 16, :]  # [m, blocks, 8 steps, 4]
        scales = tiles[..., _QUANT_BYTES:].view(np.float16)  # [tiles, blocks, 32 d, 32 mins]
        d = scales[tile, :, col].astype(np.float32)[..., None]  # [m, blocks, 1]
        q = u.reshape(ids.size, blocks, _BLOCK_K).astype(np.float32) - 128  # the GGUF's int8
        dense = torch.from_numpy((q * d).reshape(-1, self.embedding_dim))
        return dense.to(self.dtype).view(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, Q8_0 tied to the LM head's tiles"
