"""The decoder every family shares: Llama's layer, plus the few options ArchConfig switches on
(families.py says which family sets which):

- q/k per-head RMSNorm before rotary (Qwen3, Gemma 3); o_proj bias (attention_bias);
- sandwich norms on the attention and MLP outputs before each residual add (Gemma 2/3);
- GeGLU instead of SwiGLU, embedding scale, final-logit soft-capping (Gemma);
- per-layer sliding window, attention soft-capping and a local rope base (Mistral, Gemma);
- a sparse MoE MLP in place of the dense one (Mixtral, Qwen MoE; moe.py).

The batch is flattened: every tensor is [num_tokens, ...] with no padding; which request a
token belongs to lives only in AttentionMetadata. Weights are fused at load time (q/k/v into
qkv_proj, gate/up into gate_up_proj), each residual add rides on the matmul before it, and on
CPU the norms and rotary are native ops. pack_weights() moves the linear layers onto the native
bf16 kernel where it applies (models/linear/dense.py), and where every layer is then a plain Llama
layer running natively it hands the whole stack to one native call per step
(models/decoder_stack/stack.py), with the same results bit for bit.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from pagedserve.core.attention.base import AttentionBackend, AttentionMetadata
from pagedserve.core.lora.parallel import LoraShard
from pagedserve.core.lora.registry import LoraTarget
from pagedserve.core.lora.weights import LoraBatch, LoraWeights
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.decoder_stack.stack import DecoderStack
from pagedserve.core.models.layers import rope_attention_factor, rope_inv_freq, rope_tables
from pagedserve.core.models.linear.dense import GateUpLinear, Linear, PackableLinear
from pagedserve.core.models.linear.parallel import RowParallelLinear
from pagedserve.core.models.linear.quantized import QuantizedGateUpLinear, QuantizedLinear
from pagedserve.core.models.moe import DenseMLP, SparseMoE
from pagedserve.core.ops import layer_ops
from pagedserve.core.ops.linear_quant import quant_linear_path_for

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, signed_sin), each [n, 1, head_size]


def _norm_weight(size: int, present: bool = True) -> nn.Parameter | None:
    return nn.Parameter(torch.empty(size)) if present else None


def check_attention_options(arch: ArchConfig, attention: AttentionBackend) -> None:
    """Refuse, naming the field, a model whose per-layer attention options the backend's
    kernels do not take (never a model that silently attends over the whole context)."""
    accepted = inspect.signature(attention.forward).parameters
    for name, value in (("sliding_window", arch.sliding_window),
                        ("logit_softcap", arch.attn_logit_softcap)):  # fmt: skip
        if value and name not in accepted:
            raise ValueError(
                f"config field {name!r} ({value}): the {attention.name!r} attention backend's "
                "kernels do not take it yet"
            )


class LlamaDecoderLayer(nn.Module):
    def __init__(self, arch: ArchConfig, attention: AttentionBackend, index: int = 0) -> None:
        super().__init__()
        hidden, head = arch.hidden_size, arch.head_size
        self.num_heads, self.num_kv_heads, self.head_size = arch.num_heads, arch.num_kv_heads, head
        self.intermediate_size = arch.intermediate_size
        self.eps = arch.rms_norm_eps
        self.scale = arch.attn_scale
        self.sliding_window = arch.layer_window(index)
        self.logit_softcap = arch.attn_logit_softcap
        self.rope_index = 1 if arch.uses_local_rope(index) else 0
        self.attention = attention
        qkv_size = (arch.num_heads + 2 * arch.num_kv_heads) * head
        self.input_layernorm = nn.Parameter(torch.empty(hidden))
        self.qkv_proj = Linear(hidden, qkv_size, bias=arch.attention_bias)
        self.q_norm = _norm_weight(head, arch.qk_norm)
        self.k_norm = _norm_weight(head, arch.qk_norm)
        self.o_proj = Linear(arch.num_heads * head, hidden, bias=arch.o_proj_bias)
        self.post_attn_norm = _norm_weight(hidden, arch.sandwich_norms)
        self.post_attention_layernorm = nn.Parameter(torch.empty(hidden))  # before the MLP
        self.post_mlp_norm = _norm_weight(hidden, arch.sandwich_norms)
        self.mlp: DenseMLP | SparseMoE
        if arch.is_moe_layer(index):
            self.mlp = SparseMoE(arch)
        else:
            self.mlp = DenseMLP(hidden, arch.intermediate_size, arch.hidden_act)

    @property
    def llama_shaped(self) -> bool:
        """Llama's layer, a window or soft-cap aside (what the native decoder stack runs)."""
        return (
            self.q_norm is None
            and self.post_attn_norm is None
            and isinstance(self.mlp, DenseMLP)
            and self.mlp.gate_up_proj.activation == "silu"
            and self.o_proj.bias is None
            and self.rope_index == 0
            # tensor parallel: an all-reduce inside the layer (kept quantized: the stack runs it)
            and type(self.o_proj) in (Linear, QuantizedLinear)
        )

    def _qkv(self, qkv: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, ...]:
        """[n, qkv_size] -> q [n, heads, d], k and v [n, kv_heads, d], q and k rotated."""
        n, heads, kv_heads, d = qkv.shape[0], self.num_heads, self.num_kv_heads, self.head_size
        qk_size = (heads + kv_heads) * d
        if self.q_norm is None:
            qk = qkv[:, :qk_size].view(n, heads + kv_heads, d)
        else:  # per-head norms: each head's d values are one row
            assert self.q_norm is not None and self.k_norm is not None
            q = layer_ops.rms_norm(qkv[:, : heads * d].reshape(n * heads, d), self.q_norm, self.eps)
            k = qkv[:, heads * d : qk_size].reshape(n * kv_heads, d)
            k = layer_ops.rms_norm(k, self.k_norm, self.eps)
            qk = torch.cat((q.view(n, heads, d), k.view(n, kv_heads, d)), dim=1)
        # q and k sit side by side, so one rotary call covers both (in place on CPU).
        qk = layer_ops.rotary(qk, *rope)
        return qk[:, :heads], qk[:, heads:], qkv[:, qk_size:].view(n, kv_heads, d)

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        options: dict[
            str, Any
        ] = {}  # only what the layer uses: check_attention_options vetted the backend
        if self.sliding_window:
            options["sliding_window"] = self.sliding_window
        if self.logit_softcap:
            options["logit_softcap"] = self.logit_softcap
        return self.attention.forward(q, k, v, kv_cache, meta, self.scale, **options)

    def forward(
        self,
        hidden: torch.Tensor,  # [n, hidden_size], the residual stream
        rope: Rope,  # this layer's (cos, signed_sin), each [n, 1, head_size]
        kv_cache: torch.Tensor,  # [2, num_pages, num_kv_heads, page_size, head_size]
        meta: AttentionMetadata,
        lora: LoraBatch | None = None,  # the step's adapter rows (None: base rows only)
    ) -> torch.Tensor:
        n = hidden.shape[0]
        x = layer_ops.rms_norm(hidden, self.input_layernorm, self.eps)
        q, k, v = self._qkv(self.qkv_proj(x, lora=lora), rope)
        attn = self._attend(q, k, v, kv_cache, meta).reshape(n, -1)
        if self.post_attn_norm is None:
            hidden = self.o_proj(attn, residual=hidden, lora=lora)
            x = layer_ops.rms_norm(hidden, self.post_attention_layernorm, self.eps)
            return self._mlp(x, hidden, lora)
        assert self.post_attn_norm is not None and self.post_mlp_norm is not None
        attn = self.o_proj(attn, lora=lora)
        hidden = hidden + layer_ops.rms_norm(attn, self.post_attn_norm, self.eps)
        x = layer_ops.rms_norm(hidden, self.post_attention_layernorm, self.eps)
        return hidden + layer_ops.rms_norm(self._mlp(x, None, lora), self.post_mlp_norm, self.eps)

    def _mlp(
        self, x: torch.Tensor, residual: torch.Tensor | None, lora: LoraBatch | None
    ) -> torch.Tensor:
        # adapters sit on dense MLPs only (enable_lora installs none on experts)
        out: torch.Tensor
        if lora is not None and isinstance(self.mlp, DenseMLP):
            out = self.mlp(x, residual=residual, lora=lora)
        else:
            out = self.mlp(x, residual=residual)
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
        check_attention_options(arch, attention)
        self.arch = arch
        # Given its (uninitialized) weight, nn.Embedding skips its random init, which on "meta"
        # runs through torch._refs and imports torch._dynamo: seconds of every start-up.
        table = torch.empty(arch.vocab_size, arch.hidden_size)
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size, _weight=table)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(arch, attention, i) for i in range(arch.num_layers)
        )
        self.norm = nn.Parameter(torch.empty(arch.hidden_size))
        self.lm_head = Linear(arch.hidden_size, arch.vocab_size)
        positions = max_positions or arch.max_position_embeddings
        inv_freq = rope_inv_freq(arch.head_size, arch.rope_theta, arch.rope_scaling, positions)
        factor = rope_attention_factor(arch.rope_scaling)
        cos, signed_sin = rope_tables(inv_freq, positions, dtype, device, factor)
        self.rope_cos: torch.Tensor  # [max_positions, head_size]
        self.rope_signed_sin: torch.Tensor
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_signed_sin", signed_sin, persistent=False)
        self.local_rope: Rope | None = None  # the sliding layers' own tables (Gemma 3)
        if arch.local_rope_theta:
            local = rope_inv_freq(arch.head_size, arch.local_rope_theta, None)
            self.local_rope = rope_tables(local, positions, dtype, device)
        self.stack: DecoderStack | None = None  # set by pack_weights() where it applies
        self.quantization = ""  # what runs the linears kept quantized (models/linear/quantized.py)
        self.torch_from: int | None = None  # route_linears(): rows from which torch runs them
        self.amx_from = 0  # use_amx(): rows from which the native bf16 kernel takes AMX tiles
        self.amx_int8_from = 0  # and the quantized kernel AMX-INT8 tiles
        self.amx_tile_order = False  # bf16 steps below amx_from sum in the tiles' order
        self.quantized_activations = "int8"  # what the quantized layers take x as (use_...)
        self.linear_steps = {"native": 0, "torch": 0}  # forwards per path (route_linears)
        self.has_lm_head = True  # False: an embedding backbone's stand-in head (load_model)

    def tie_weights(self) -> None:
        weight = self.embed_tokens.weight
        assert isinstance(weight, nn.Parameter)
        self.lm_head.weight = weight

    def pack_weights(self, keep_unpacked: bool = False) -> int:
        """Repack every linear layer for the native kernel where it applies (CPU, bfloat16 or
        float32, ISA level avx2 and up) and build the native decoder stack where every layer then runs natively;
        returns how many layers were packed. Call once, after the weights are loaded.
        keep_unpacked: the decoder layers' projections keep their weights too (route_linears)."""
        kept = {id(p) for p in self.dense_projections()} if keep_unpacked else set()
        packed = sum(m.pack(keep_weight=id(m) in kept) for m in self.modules()
                      if isinstance(m, PackableLinear))  # fmt: skip
        self.stack = DecoderStack.build(self.decoder_layers())
        self.use_amx(self.amx_from, self.amx_int8_from, self.amx_tile_order)
        self.use_quantized_activations(self.quantized_activations)
        return packed

    def use_amx(self, from_rows: int, int8_from_rows: int = 0, tile_order: bool = False) -> None:
        """Native bf16 products of at least `from_rows` rows (0: never, 1: every one) run on
        AMX-BF16 tiles (fewer rows in the tiles' order with tile_order), quantized ones of at
        least `int8_from_rows` on AMX-INT8 tiles, where the CPU grants them: every layer's,
        lm_head's and the decoder stack's (models/linear/dispatch.py decides)."""
        for m in self.modules():
            if isinstance(m, PackableLinear):
                m.use_amx(from_rows, tile_order)
            elif isinstance(m, QuantizedLinear | QuantizedGateUpLinear):
                m.use_amx(int8_from_rows)
        if self.stack is not None:
            self.stack.amx_from_rows = from_rows
            self.stack.amx_int8_from_rows = int8_from_rows
            self.stack.amx_tile_order = tile_order
        self.amx_from, self.amx_int8_from = from_rows, int8_from_rows
        self.amx_tile_order = tile_order

    def use_quantized_activations(self, kind: str) -> None:
        """What the layers kept quantized take x as (--quantized-activations: int8, int16 or
        float; models/linear/quantized.py's ACTIVATIONS), the decoder stack's included. Set it
        before the first step: pages the prefix cache holds were computed with the activations
        of their time."""
        for m in self.modules():
            if isinstance(m, QuantizedLinear | QuantizedGateUpLinear):
                m.use_activations(kind)
        if self.stack is not None:
            self.stack.quant_float_activations = kind == "float"
            self.stack.quant_int16_activations = kind == "int16"
        # The summary names the kernel's path, which the activations choose (int16 rows run the
        # AVX2 kernel on AVX-512 levels too).
        was = f"(native {quant_linear_path_for(self.quantized_activations)})"
        self.quantization = self.quantization.replace(
            was, f"(native {quant_linear_path_for(kind)})"
        )
        self.quantized_activations = kind

    def dense_projections(self) -> list[PackableLinear]:
        """Every decoder layer's dense projections (qkv, o, gate_up, down); [] unless every
        layer has all four packable (no experts, no quantized or tensor-parallel layers)."""
        found: list[PackableLinear] = []
        for layer in self.decoder_layers():
            mlp = layer.mlp
            if not isinstance(mlp, DenseMLP):
                return []
            found += [layer.qkv_proj, layer.o_proj, mlp.gate_up_proj, mlp.down_proj]
        return found if all(type(p) in (Linear, GateUpLinear) for p in found) else []

    def route_linears(self, torch_from: int | None) -> int:
        """Steps of at least `torch_from` rows run the layers one by one with torch's matmul
        in every dense projection (models/linear/dispatch.py); fewer keep the native kernel and
        the decoder stack. Needs pack_weights(keep_unpacked=True); returns the bytes the kept
        weights take. None: native at every row count."""
        projections = self.dense_projections()
        if torch_from is not None and not projections:
            raise ValueError("cpu_linear: only dense bf16/fp32 decoder layers can run torch")
        for p in projections:
            p.route(torch_from)
        self.torch_from = torch_from
        kept = [p.weight for p in projections if p.packed is not None and p.weight is not None]
        return sum(w.numel() * w.element_size() for w in kept) if torch_from else 0

    def enable_lora(self, max_loras: int, max_rank: int) -> dict[tuple[int, str], LoraTarget]:
        """Zeroed adapter stacks of `max_loras` slots beside every decoder layer's projections
        (attention's, and the MLP's where it is dense); returns where each (layer, HF module
        name) of an adapter goes. The native decoder stack, where it applies, takes them too.
        Under tensor parallelism (self.arch is a rank's share) each stack is this rank's share
        of the layer's, and each target says which cut of an adapter it takes (lora/parallel.py):
        B's rows on the column-parallel q/k/v and gate/up, A's columns on the row-parallel o and
        down."""
        arch, dtype = self.arch, self.rope_cos.dtype
        q, kv = arch.num_heads * arch.head_size, arch.num_kv_heads * arch.head_size
        targets: dict[tuple[int, str], LoraTarget] = {}
        for i, layer in enumerate(self.decoder_layers()):
            group = layer.o_proj.group if isinstance(layer.o_proj, RowParallelLinear) else None
            found: list[tuple[Any, tuple[str, ...], list[int]]] = [
                (layer.qkv_proj, ("q_proj", "k_proj", "v_proj"), [q, kv, kv]),
                (layer.o_proj, ("o_proj",), [arch.hidden_size]),
            ]
            if isinstance(layer.mlp, DenseMLP):
                width = layer.intermediate_size
                found += [(layer.mlp.gate_up_proj, ("gate_proj", "up_proj"), [width, width]),
                          (layer.mlp.down_proj, ("down_proj",), [arch.hidden_size])]  # fmt: skip
            for module, names, parts in found:
                module.lora = LoraWeights(module.in_features, parts, max_loras, max_rank, dtype)
                shard = None
                if group is not None:  # row-parallel: A's columns; column-parallel: B's rows
                    row = isinstance(module, RowParallelLinear)
                    shard = LoraShard("in" if row else "out", group.rank, group.world_size)
                targets.update({(i, n): LoraTarget(module.lora, p, shard)
                                for p, n in enumerate(names)})  # fmt: skip
        if self.stack is not None:
            self.stack.attach_lora(self.decoder_layers())
        return targets

    def decoder_layers(self) -> list[LlamaDecoderLayer]:
        return [layer for layer in self.layers if isinstance(layer, LlamaDecoderLayer)]

    def weight_tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the weights occupy: parameters, buffers (packed weights, rope tables)
        and the GGUF blocks of the layers kept quantized, which are plain attributes."""
        yield from self.parameters()
        yield from self.buffers()
        for m in self.modules():
            if isinstance(m, QuantizedLinear):
                yield from (segment.packed for segment in m.segments)
            elif isinstance(m, QuantizedGateUpLinear):
                yield m.packed

    def _apply(
        self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> LlamaForCausalLM:
        # .to() and friends may move the weights the native stack points at: drop it (the
        # layers run one by one until pack_weights() builds it again).
        self.stack = None
        if self.local_rope is not None:
            self.local_rope = (fn(self.local_rope[0]), fn(self.local_rope[1]))
        # torch's Module._apply carries no annotations.
        module: LlamaForCausalLM = super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        return module

    def _ropes(self, positions: torch.Tensor) -> list[Rope]:
        """Each rope table's rows for these positions, [num_tokens, 1, head_size] each."""
        tables = [(self.rope_cos, self.rope_signed_sin)]
        if self.local_rope is not None:
            tables.append(self.local_rope)
        return [(cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)) for cos, sin in tables]

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[torch.Tensor],  # per layer [2, num_pages, num_kv_heads, page_size, d]
        meta: AttentionMetadata,
        lora: LoraBatch | None = None,  # the step's adapter rows (None: base rows only)
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        hidden = self.embed_tokens(input_ids)
        if self.arch.embed_scale != 1.0:  # Gemma: the scale rounded to the model's dtype first
            hidden = hidden * torch.tensor(self.arch.embed_scale, dtype=hidden.dtype)
        return self.run_layers(hidden, self._ropes(positions), kv_caches, meta, lora)

    def run_layers(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden_size], the embedded inputs
        ropes: list[Rope],  # each rope table's rows for the tokens (_ropes)
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        """The decoder layers and the final norm (a model of another shape embeds its own
        inputs, e.g. images, and calls this)."""
        routed = self.torch_from is not None and hidden.shape[0] >= self.torch_from
        self.linear_steps["torch" if routed else "native"] += 1
        # A step with adapter rows stays on the native stack where it holds the adapters' stacks.
        native = self.stack is not None and not routed
        native = native and (lora is None or (self.stack is not None and self.stack.has_lora))
        if native and not torch.compiler.is_compiling():
            assert self.stack is not None
            hidden = self.stack(hidden, *ropes[0], kv_caches, meta, lora)
        else:
            for layer, kv_cache in zip(self.decoder_layers(), kv_caches, strict=True):
                hidden = layer(hidden, ropes[layer.rope_index], kv_cache, meta, lora)
        return layer_ops.rms_norm(hidden, self.norm, self.arch.rms_norm_eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden_size] -> [n, vocab_size] float32; call it only on rows that sample."""
        logits: torch.Tensor = self.lm_head(hidden, out_dtype=torch.float32)
        cap = self.arch.final_logit_softcap
        if cap:  # tanh(logits / cap) * cap, in the new logits: no [n, vocab] copies (same bits)
            logits.div_(cap).tanh_().mul_(cap)
        return logits
