"""A PEFT LoRA folder (`adapter_config.json` + `adapter_model.safetensors`) as plain tensors.

    adapter = read_peft(path)      AdapterWeights: per (layer, module) the (A [r, in], B [out, r])
                                   pair and its scaling (lora_alpha / r, or / sqrt(r) with rsLoRA)

Only what the batched product computes is accepted: plain LoRA on the decoder layers'
q/k/v/o/gate/up/down projections. Anything else (modules_to_save, DoRA, a bias, embedding or
LM-head targets, alpha patterns) is refused with a LoRAError naming it, never ignored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pagedserve.core.lora_request import LoRAError

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The projections an adapter may target (HF Llama names)."""

_TENSOR = re.compile(
    r"^(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$"
)


@dataclass
class AdapterWeights:
    """What an adapter adds: (layer, module) -> (A [r, in], B [out, r], scaling), float32."""

    rank: int
    """The largest rank of any module."""
    modules: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, float]] = field(
        default_factory=dict
    )

    @property
    def target_modules(self) -> set[str]:
        return {name for _, name in self.modules}

    def add(
        self,
        key: tuple[int, str],
        a: torch.Tensor,
        b: torch.Tensor,
        scaling: Callable[[int], float],
    ) -> None:
        """Record (layer, module)'s A [r, in] and B [out, r] (LoRAError when they are not),
        scaled by scaling(r)."""
        r = a.shape[0] if a.dim() else 0
        if a.dim() != 2 or b.dim() != 2 or b.shape[1] != r:
            raise LoRAError(f"layer {key[0]} {key[1]}: lora_A {tuple(a.shape)} and lora_B "
                            f"{tuple(b.shape)} are not [r, in] and [out, r]")  # fmt: skip
        self.modules[key] = (a, b, scaling(r))
        self.rank = max(self.rank, r)


def read_peft(path: str | Path) -> AdapterWeights:
    """The adapter in a PEFT folder; LoRAError naming what is missing, unparsable or unsupported."""
    folder = Path(path)
    if not folder.is_dir():
        raise LoRAError(f"lora_path {str(path)!r} is not a folder (a PEFT adapter's)")
    config = _read_config(folder / "adapter_config.json")
    alpha, rslora = _numbers(config)
    tensors = _read_tensors(folder)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = _TENSOR.match(name)
        if match is None:
            raise LoRAError(f"adapter tensor {name!r}: not a LoRA weight of a decoder projection")
        layer, module, which = int(match[1]), match[2], match[3]
        if module not in TARGET_MODULES:
            raise LoRAError(f"target module {module!r} is not supported (only {TARGET_MODULES})")
        pairs.setdefault((layer, module), {})[which] = tensor
    adapter = AdapterWeights(rank=0)
    for key, pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise LoRAError(f"layer {key[0]} {key[1]}: lora_A and lora_B must both be present")
        # rank_pattern may give a module its own r (the tensors say which); alpha stays global.
        adapter.add(key, pair["A"].float(), pair["B"].float(),
                    lambda r: alpha / (math.sqrt(r) if rslora else r))  # fmt: skip
    if not adapter.modules:
        raise LoRAError(f"{folder}: the adapter holds no LoRA weights")
    return adapter


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise LoRAError(f"{path.name} is missing in {str(path.parent)!r}")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoRAError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(config, dict):
        raise LoRAError(f"{path}: not a JSON object")
    kind = config.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise LoRAError(f"adapter_config.json peft_type {kind!r}: only LORA is supported")
    refused = {
        "modules_to_save": "whole modules trained beside the adapter",
        "use_dora": "DoRA",
        "alpha_pattern": "per-module alphas",
        "layer_replication": "layer replication",
        "lora_bias": "a bias on lora_B",
        "trainable_token_indices": "trained token embeddings",
        "target_parameters": "adapted parameters (not modules)",
    }
    for name, what in refused.items():
        if config.get(name):
            raise LoRAError(f"adapter_config.json {name} ({what}) is not supported: "
                            f"{config[name]!r}")  # fmt: skip
    if config.get("bias", "none") != "none":
        raise LoRAError(f"adapter_config.json bias {config['bias']!r}: only 'none' is supported")
    if config.get("fan_in_fan_out"):
        raise LoRAError("adapter_config.json fan_in_fan_out (Conv1D weights) is not supported")
    targets = config.get("target_modules")
    if isinstance(targets, list):
        for name in targets:
            if name not in TARGET_MODULES:
                raise LoRAError(f"target module {name!r} is not supported "
                                f"(only {', '.join(TARGET_MODULES)})")  # fmt: skip
    return config


def _numbers(config: dict[str, Any]) -> tuple[float, bool]:
    """lora_alpha and use_rslora, after checking r (each module's rank is its tensors')."""
    rank, alpha = config.get("r", 8), config.get("lora_alpha", 8)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise LoRAError(f"adapter_config.json r must be a positive integer, got {rank!r}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise LoRAError(f"adapter_config.json lora_alpha must be a number, got {alpha!r}")
    return float(alpha), bool(config.get("use_rslora", False))


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    path = folder / "adapter_model.safetensors"
    if not path.is_file():
        found = "adapter_model.bin (a pickle: not loaded)" if (
            folder / "adapter_model.bin").is_file() else "nothing"  # fmt: skip
        raise LoRAError(f"adapter_model.safetensors is missing in {str(folder)!r} ({found})")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise LoRAError(f"{path}: not a readable safetensors file ({e})") from e
