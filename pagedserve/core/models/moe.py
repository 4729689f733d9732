"""The MLPs: the dense gated MLP every family has, and the sparse mixture of experts.

    mlp = DenseMLP(hidden, width, "silu")      down(act(gate(x)) * up(x)) (+ residual)
    moe = SparseMoE(arch)                      router softmax -> top-k -> experts, batched

SparseMoE groups the token rows routed to each expert and runs that expert once over its
group (one product per expert and step, not one per token); each expert is a DenseMLP, so on a
bf16 CPU from ISA level avx2 its products are the packed native kernel over the grouped rows.
Routing follows transformers: softmax in float32 over all experts, top-k, renormalized to sum
1 only where the config says so (norm_topk_prob; Mixtral always), and an optional shared
expert behind a sigmoid gate (Qwen2-MoE).
"""

from __future__ import annotations

import torch
from torch import nn

from pagedserve.core.lora.weights import LoraBatch
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.linear.dense import GateUpLinear, Linear


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, width: int, activation: str) -> None:
        super().__init__()
        self.gate_up_proj = GateUpLinear(hidden, width, activation)
        self.down_proj = Linear(width, hidden)

    def forward(
        self,
        x: torch.Tensor,  # [m, hidden]
        residual: torch.Tensor | None = None,  # [m, hidden]
        lora: LoraBatch | None = None,  # the step's adapter rows (None: base rows only)
    ) -> torch.Tensor:  # [m, hidden]
        gated = self.gate_up_proj(x, lora=lora)
        out: torch.Tensor = self.down_proj(gated, residual=residual, lora=lora)
        return out


class SparseMoE(nn.Module):
    def __init__(self, arch: ArchConfig) -> None:
        super().__init__()
        hidden, width = arch.hidden_size, arch.moe_intermediate_size
        self.top_k, self.norm_topk_prob = arch.num_experts_per_tok, arch.norm_topk_prob
        self.router = Linear(hidden, arch.num_experts)
        self.experts = nn.ModuleList(
            DenseMLP(hidden, width, arch.hidden_act) for _ in range(arch.num_experts)
        )
        shared = arch.shared_expert_intermediate_size
        self.shared_expert = DenseMLP(hidden, shared, arch.hidden_act) if shared else None
        self.shared_expert_gate = Linear(hidden, 1) if shared else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [m, k] float32, experts [m, k] int64) for each row of x [m, hidden]."""
        probs = self.router(x, out_dtype=torch.float32).softmax(dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, experts

    def forward(
        self,
        x: torch.Tensor,  # [m, hidden]
        residual: torch.Tensor | None = None,  # [m, hidden]
    ) -> torch.Tensor:  # [m, hidden]
        weights, experts = self.route(x)
        flat = experts.flatten()  # row r's j-th choice sits at r * top_k + j
        order = flat.argsort(stable=True)  # grouped by expert
        rows = order // self.top_k
        row_weights = weights.flatten()[order]
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        out = torch.zeros_like(x)
        start = 0
        for expert, count in zip(self.experts, counts, strict=True):
            if count:
                group = rows[start : start + count]  # [count]
                y = expert(x[group]) * row_weights[start : start + count, None]
                out.index_add_(0, group, y.to(out.dtype))
                start += count
        if self.shared_expert is not None:
            assert self.shared_expert_gate is not None
            gate = torch.sigmoid(self.shared_expert_gate(x))  # [m, 1]
            out = out + gate * self.shared_expert(x)
        return out if residual is None else residual + out
