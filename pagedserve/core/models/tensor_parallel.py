"""Megatron-style tensor parallelism for the shared decoder: which dimensions split, how each
weight is cut at load, and the layers whose outputs meet across ranks.

    check_divisible(arch, tp)        ValueError naming every size tp does not divide
    local = shard_arch(arch, tp)     the shape one rank builds (heads, widths, vocab / tp)
    parallelize(model, group)        swap in the parallel layers (model still on "meta")
    shard_weight(name, w, arch, ...) this rank's slice of one fused weight

Column-parallel (each rank computes its slice of the outputs, nothing to exchange): qkv_proj
(its own query and KV heads, so each rank's paged KV cache holds its KV heads only) and
gate_up_proj (its slice of the MLP width; of every expert's width in an MoE). Row-parallel (each
rank holds the input columns matching those slices and produces a partial sum): o_proj and the
MLP's down_proj, one all-reduce each per layer; a sparse MoE all-reduces once after its experts
and shared expert (every term is linear in the sharded width), not once per expert. The residual
and any output bias are added on rank 0 only, so the sum carries them once. The embedding is
vocab-parallel (each rank looks up the ids in its row range, zeros elsewhere, all-reduce) and so
is lm_head (each rank's vocabulary slice of the logits, gathered to rank 0, which alone
samples). Norms, routers and the shared expert's gate are replicated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.core.distributed.group import TPGroup
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.linear.dense import Linear
from pagedserve.core.models.linear.parallel import ParallelLMHead, RowParallelLinear
from pagedserve.core.models.llama import LlamaForCausalLM
from pagedserve.core.models.moe import DenseMLP, SparseMoE


def _split_sizes(arch: ArchConfig) -> dict[str, int]:
    """Every size tensor parallelism divides, by its ArchConfig name (the ones the model uses)."""
    sizes = {
        "num_heads": arch.num_heads,
        "num_kv_heads": arch.num_kv_heads,
        "vocab_size": arch.vocab_size,
    }
    if any(not arch.is_moe_layer(i) for i in range(arch.num_layers)):
        sizes["intermediate_size"] = arch.intermediate_size
    if arch.num_experts:
        sizes["moe_intermediate_size"] = arch.moe_intermediate_size
    if arch.shared_expert_intermediate_size:
        sizes["shared_expert_intermediate_size"] = arch.shared_expert_intermediate_size
    return sizes


def check_divisible(arch: ArchConfig, tp: int) -> None:
    """Refuse, naming the numbers, a model whose heads, vocabulary or widths tp does not divide."""
    bad = [f"{name} ({size})" for name, size in _split_sizes(arch).items() if size % tp]
    if bad:
        raise ValueError(
            f"tensor_parallel_size {tp} must divide the model's {', '.join(bad)}: each rank "
            f"holds an equal share of them (choose a size that divides every one, e.g. 1)"
        )


def shard_arch(arch: ArchConfig, tp: int) -> ArchConfig:
    """The decoder one rank builds: 1/tp of the heads, vocabulary and MLP widths."""
    check_divisible(arch, tp)
    shares: dict[str, Any] = {name: size // tp for name, size in _split_sizes(arch).items()}
    return dataclasses.replace(arch, **shares)


def _rows(w: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    size = w.shape[0] // tp
    return w[rank * size : (rank + 1) * size].clone()  # a copy: the full tensor can go


def _cols(w: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    size = w.shape[1] // tp
    return w[:, rank * size : (rank + 1) * size].contiguous()


def shard_weight(name: str, w: torch.Tensor, arch: ArchConfig, rank: int, tp: int) -> torch.Tensor:
    """Rank `rank`'s part of the fused weight `name` (our names, registry.fuse_weights')."""
    if name in ("embed_tokens.weight", "lm_head.weight"):
        return _rows(w, rank, tp)
    if name.endswith(("qkv_proj.weight", "qkv_proj.bias")):  # [q heads; k heads; v heads]
        d = arch.head_size
        sizes = [arch.num_heads * d, arch.num_kv_heads * d, arch.num_kv_heads * d]
        parts = torch.split(w, sizes)
        return torch.cat([_rows(p, rank, tp) for p in parts])
    if name.endswith("gate_up_proj.weight"):  # [gate; up], each split the same way
        return torch.cat([_rows(p, rank, tp) for p in w.chunk(2)])
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return _cols(w, rank, tp)
    if name.endswith("o_proj.bias"):  # added once, on rank 0
        return w if rank == 0 else torch.zeros_like(w)
    return w  # norms, routers, the shared expert's gate: every rank has them whole


class VocabParallelEmbedding(nn.Embedding):
    """Rows [rank * n, (rank + 1) * n) of the embedding; other ids give zeros, summed over
    ranks (exactly one rank contributes each row, so the sum is exact)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, group: TPGroup) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.group = group
        self.start = group.rank * num_embeddings

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [n] -> [n, hidden]
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.group.all_reduce(out.masked_fill_(outside.unsqueeze(1), 0))


class ParallelSparseMoE(SparseMoE):
    """Every expert (and the shared expert) over 1/tp of its width: partial sums, one
    all-reduce for the whole layer's MLP."""

    def __init__(self, arch: ArchConfig, group: TPGroup) -> None:
        super().__init__(arch)
        self.group = group

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        residual = residual if self.group.is_first else None
        return self.group.all_reduce(super().forward(x, residual))


def _row_parallel(linear: Linear, group: TPGroup) -> RowParallelLinear:
    return RowParallelLinear(
        linear.in_features, linear.out_features, linear.bias is not None, group
    )


def parallelize(model: LlamaForCausalLM, group: TPGroup) -> None:
    """Swap in the parallel layers; call on a model built (on "meta") from shard_arch's shape,
    before its weights are assigned. Layers then all-reduce between their halves, so the
    native decoder stack (all layers in one C++ call) steps aside for the per-layer path."""
    arch = model.arch
    model.embed_tokens = VocabParallelEmbedding(arch.vocab_size, arch.hidden_size, group)
    model.lm_head = ParallelLMHead(arch.hidden_size, arch.vocab_size, group)
    for index, layer in enumerate(model.decoder_layers()):
        layer.o_proj = _row_parallel(layer.o_proj, group)
        if isinstance(layer.mlp, DenseMLP):
            layer.mlp.down_proj = _row_parallel(layer.mlp.down_proj, group)
        else:
            assert arch.is_moe_layer(index)
            layer.mlp = ParallelSparseMoE(arch, group)
