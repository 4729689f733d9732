"""Llama-family decoder (Llama, Mistral without sliding window, Qwen2 with q/k/v bias).

The batch is flattened: every tensor is [num_tokens, ...] with no padding; which request a
token belongs to lives only in AttentionMetadata. Weights are fused at load time (q/k/v into
qkv_proj, gate/up into gate_up_proj, whose forward applies SiLU-and-mul), each residual add
rides on the matmul before it, and on CPU the norms and rotary are native ops: a layer is 8
calls. pack_weights() moves the linear layers onto the native bf16 kernel where it applies
(models/linear.py; SiLU-and-mul then runs in the gate_up kernel's epilogue), and where
then every layer runs natively (bf16 on such a CPU, native attention) it hands the whole stack
to one native call per step (models/decoder_stack.py), with the same results bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pagedserve.core.attention.base import AttentionBackend, AttentionMetadata
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.decoder_stack import DecoderStack
from pagedserve.core.models.layers import rope_inv_freq, rope_tables
from pagedserve.core.models.linear import GateUpLinear, Linear, PackableLinear
from pagedserve.core.ops import layer_ops


class LlamaDecoderLayer(nn.Module):
    def __init__(self, arch: ArchConfig, attention: AttentionBackend) -> None:
        super().__init__()
        hidden, head = arch.hidden_size, arch.head_size
        self.num_heads, self.num_kv_heads, self.head_size = arch.num_heads, arch.num_kv_heads, head
        self.intermediate_size = arch.intermediate_size
        self.eps = arch.rms_norm_eps
        self.scale = head**-0.5
        # Per-layer attention options (0 = off), set by families that use them: keys older than
        # position - sliding_window are masked; scores are soft-capped (see attention/base.py).
        self.sliding_window = 0
        self.logit_softcap = 0.0
        self.attention = attention
        qkv_size = (arch.num_heads + 2 * arch.num_kv_heads) * head
        self.input_layernorm = nn.Parameter(torch.empty(hidden))
        self.qkv_proj = Linear(hidden, qkv_size, bias=arch.attention_bias)
        self.o_proj = Linear(arch.num_heads * head, hidden)
        self.post_attention_layernorm = nn.Parameter(torch.empty(hidden))
        self.gate_up_proj = GateUpLinear(hidden, arch.intermediate_size)
        self.down_proj = Linear(arch.intermediate_size, hidden)

    def forward(
        self,
        hidden: torch.Tensor,  # [n, hidden_size], the residual stream
        cos: torch.Tensor,  # [n, 1, head_size]
        signed_sin: torch.Tensor,  # [n, 1, head_size]
        kv_cache: torch.Tensor,  # [2, num_pages, num_kv_heads, page_size, head_size]
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        n, heads, kv_heads = hidden.shape[0], self.num_heads, self.num_kv_heads
        x = layer_ops.rms_norm(hidden, self.input_layernorm, self.eps)
        qkv = self.qkv_proj(x)  # [n, (heads + 2 * kv_heads) * head_size]
        qk_size = (heads + kv_heads) * self.head_size
        # q and k sit side by side in qkv, so one rotary call covers both (in place on CPU).
        qk = layer_ops.rotary(qkv[:, :qk_size].view(n, heads + kv_heads, -1), cos, signed_sin)
        v = qkv[:, qk_size:].view(n, kv_heads, -1)
        attn = self.attention.forward(qk[:, :heads], qk[:, heads:], v, kv_cache, meta, self.scale,
                                      self.sliding_window, self.logit_softcap)  # fmt: skip
        hidden = self.o_proj(attn.reshape(n, -1), residual=hidden)
        x = layer_ops.rms_norm(hidden, self.post_attention_layernorm, self.eps)
        mlp = self.gate_up_proj(x)  # silu(gate) * up: [n, intermediate_size]
        out: torch.Tensor = self.down_proj(mlp, residual=hidden)
        return out


class LlamaForCausalLM(nn.Module):
    def __init__(
        self,
        arch: ArchConfig,
        attention: AttentionBackend,
        *,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int | None = None,
    ) -> None:
        """Parameters are created wherever the ambient default device says (the loader builds
        on "meta" and assigns real weights); the rotary tables go straight to `device`."""
        super().__init__()
        self.arch = arch
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(arch, attention) for _ in range(arch.num_layers)
        )
        self.norm = nn.Parameter(torch.empty(arch.hidden_size))
        self.lm_head = Linear(arch.hidden_size, arch.vocab_size)
        inv_freq = rope_inv_freq(arch.head_size, arch.rope_theta, arch.rope_scaling)
        cos, signed_sin = rope_tables(
            inv_freq, max_positions or arch.max_position_embeddings, dtype, device
        )
        self.rope_cos: torch.Tensor  # [max_positions, head_size]
        self.rope_signed_sin: torch.Tensor
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_signed_sin", signed_sin, persistent=False)
        self.stack: DecoderStack | None = None  # set by pack_weights() where it applies

    def tie_weights(self) -> None:
        weight = self.embed_tokens.weight
        assert isinstance(weight, nn.Parameter)
        self.lm_head.weight = weight

    def pack_weights(self) -> int:
        """Repack every linear layer for the native kernel where it applies (CPU, bfloat16,
        AVX512-BF16) and build the native decoder stack where every layer then runs natively;
        returns how many layers were packed. Call once, after the weights are loaded."""
        packed = sum(m.pack() for m in self.modules() if isinstance(m, PackableLinear))
        self.stack = DecoderStack.build(self.decoder_layers())
        return packed

    def decoder_layers(self) -> list[LlamaDecoderLayer]:
        return [layer for layer in self.layers if isinstance(layer, LlamaDecoderLayer)]

    def _apply(
        self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> LlamaForCausalLM:
        # .to() and friends may move the weights the native stack points at: drop it (the
        # layers run one by one until pack_weights() builds it again).
        self.stack = None
        # torch's Module._apply carries no annotations.
        module: LlamaForCausalLM = super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        return module

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[torch.Tensor],  # per layer [2, num_pages, num_kv_heads, page_size, d]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        hidden = self.embed_tokens(input_ids)
        cos = self.rope_cos[positions].unsqueeze(1)  # [num_tokens, 1, head_size]
        signed_sin = self.rope_signed_sin[positions].unsqueeze(1)
        if self.stack is not None and not torch.compiler.is_compiling():
            hidden = self.stack(hidden, cos, signed_sin, kv_caches, meta)
        else:
            for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
                hidden = layer(hidden, cos, signed_sin, kv_cache, meta)
        return layer_ops.rms_norm(hidden, self.norm, self.arch.rms_norm_eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden_size] -> [n, vocab_size] float32; call it only on rows that sample."""
        logits: torch.Tensor = self.lm_head(hidden, out_dtype=torch.float32)
        return logits
