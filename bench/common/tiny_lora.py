"""Random LoRA adapters written by PEFT itself, for tests and benchmarks:

    write_peft_adapter(base, out, r=8, alpha=16, targets=("q_proj", "v_proj"), seed=1)

The adapter's A and B are both random (PEFT initializes B to zero, which would make every
adapter the base model): the adapted model's tokens really differ from the base's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def write_peft_adapter(
    base: Path | torch.nn.Module,
    out: Path,
    *,
    r: int = 8,
    alpha: float = 16,
    targets: Sequence[str] = ATTENTION,
    seed: int = 1,
    rslora: bool = False,
    std: float = 0.05,
) -> Path:
    """A PEFT folder (adapter_config.json + adapter_model.safetensors) for the HF model at
    `base` (or the module itself); returns `out`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = (
        base
        if isinstance(base, torch.nn.Module)
        else AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    )
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), use_rslora=rslora,
                        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")  # fmt: skip
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    peft_model.save_pretrained(out, safe_serialization=True)
    peft_model.unload()  # the base module back as it was, for the next adapter
    return out
