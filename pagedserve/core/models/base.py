"""CausalLM: what the engine asks of a model, whatever its architecture.

The model runner, the device policy, the draft model and the tensor-parallel workers hold a model
only as this protocol; `models/registry.py`'s MODEL_CLASSES maps an architecture
(ArchConfig.architecture: HF's model_type, GGUF's names mapped to it) to the class the loader
builds. Every text family today is one class, `LlamaForCausalLM` (llama.py), switched by
ArchConfig's flags (families.py). A model of another shape is a class of its own there,
implementing this protocol (load_model's and MODEL_CLASSES' types then widen to it):

- a vision-language model: its vision tower and projector beside a Llama-shaped decoder, the
  image embeddings written into `forward`'s hidden states at their token positions (the runner
  hands them in; the processor that cuts images into tokens lives on the tokenizers side);
- an encoder (embeddings, rerankers): the same forward over bidirectional attention, the runner's
  pooler reading its hidden states;
- adapters (LoRA): beside the linear layers they modify (models/linear/), so every class above
  gets them without a change here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import torch
from torch import nn

from pagedserve.core.attention.base import AttentionMetadata
from pagedserve.core.lora.registry import LoraTarget
from pagedserve.core.lora.weights import LoraBatch
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.linear.dense import PackableLinear


class CausalLM(Protocol):
    arch: ArchConfig
    """This rank's shape (a tensor-parallel shard's heads and features)."""
    quantization: str
    """What runs the linears kept quantized ("" when none is)."""
    quantized_activations: str
    """What they take x as: int8, int16 or float (use_quantized_activations)."""
    has_lm_head: bool
    """False for an embedding backbone without lm_head.weight: it cannot generate."""

    def __call__(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[torch.Tensor],  # per layer [2, num_pages, num_kv_heads, page_size, d]
        meta: AttentionMetadata,
        lora: LoraBatch | None = None,  # the step's rows of each LoRA adapter
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden_size] -> [n, vocab_size] float32, for the rows that sample."""
        ...

    def pack_weights(self, keep_unpacked: bool = False) -> int:
        """Packs the dense linears for the native kernels; bytes kept unpacked for torch."""
        ...

    def use_amx(self, from_rows: int, int8_from_rows: int = 0, tile_order: bool = False) -> None:
        """Row counts from which the linears run on AMX tiles (device_policy decides)."""
        ...

    def use_quantized_activations(self, kind: str) -> None:
        """What the layers kept quantized take x as: int8, int16 or float (device_policy)."""
        ...

    def dense_projections(self) -> list[PackableLinear]:
        """The dense linears the CPU dispatch may route (models/linear/dispatch.py)."""
        ...

    def route_linears(self, torch_from: int | None) -> int:
        """Steps of at least `torch_from` tokens run the dense linears on torch; bytes kept."""
        ...

    def decoder_layers(self) -> Sequence[nn.Module]:
        """The decoder layers, in order (calibration runs one of them)."""
        ...

    def modules(self) -> Iterator[nn.Module]: ...

    def enable_lora(self, max_loras: int, max_rank: int) -> dict[tuple[int, str], LoraTarget]:
        """Zeroed adapter weights beside the projections; where each (layer, module) goes."""
        ...

    def weight_tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the weights occupy (the start-up line's memory: runner/memory.py)."""
        ...
