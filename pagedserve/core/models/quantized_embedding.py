"""A GGUF token embedding kept in its quantized blocks, rows dequantized as they are looked up.

    embed = QuantizedEmbedding(blocks, ggml_type, hidden_size, dtype)   blocks: uint8 [vocab, row bytes]
    hidden = embed(input_ids)                                          [num_tokens, hidden_size]

A GGUF's token_embd is usually quantized (Q8_0 in the default model: 28 MB of blocks where the
float32 table takes 113 MB). Where nothing else needs the dense table (the LM head reads the
quantized rows, or the head is a tensor of its own: models/linear/quantized.py decides), the
model keeps only the blocks. A step looks up a few rows (a prompt's at most), dequantized with
gguf's own dequantize, the loader's (loader_gguf.py), so they are the dense table's bits; Q8_0
takes a torch path with the same products (d x q, exact in float32).
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from torch import nn

_Q8_0_BLOCK = 34  # fp16 d, then 32 int8 values


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
