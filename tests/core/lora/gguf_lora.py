"""GGUF LoRA files written the way llama.cpp's convert_lora_to_gguf.py writes them, from a PEFT
folder, for tests:

    tensors = converted(peft_folder, "llama", num_heads=4, num_kv_heads=2)   name -> array
    write_gguf_lora(out, tensors, arch="llama", alpha=16.0, qtype="F32")

What the converter does: each `...layers.N.self_attn.q_proj.lora_A.weight` / `lora_B` pair is
named by the gguf package's tensor name map (`blk.N.attn_q.weight`) + `.lora_a` / `.lora_b`,
A kept [r, in], B [out, r], B's q / k rows permuted for llama.cpp's rotary layout on a "llama"
file (LlamaModel.permute: only B, a LoraTorchTensor's rows); metadata general.type "adapter",
adapter.type "lora", adapter.lora.alpha (lora_alpha alone: use_rslora is not carried). Tensors
that do not quantize to the requested type fall back to F16 (its QuantError path).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import load_file

from bench.common.tiny_models import finish_gguf, permute_rotary


def converted(
    peft_folder: Path, arch: str, *, num_heads: int, num_kv_heads: int
) -> dict[str, np.ndarray]:
    """The converter's tensors for the PEFT adapter: GGUF name -> float32 array."""
    model_arch = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}[arch]
    tensors = load_file(str(peft_folder / "adapter_model.safetensors"))
    layers = 1 + max(int(n.split(".layers.")[1].split(".")[0]) for n in tensors)
    names = gguf.get_tensor_name_map(model_arch, layers)
    out = {}
    for name, data in tensors.items():
        base = name.replace("base_model.model.", "")
        for peft, ours in ((".lora_A.weight", ".lora_a"), (".lora_B.weight", ".lora_b")):
            if base.endswith(peft):
                hf = base.removesuffix(peft) + ".weight"
                gguf_name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
                assert gguf_name is not None, hf
                if arch == "llama" and ours == ".lora_b" and ".q_proj." in hf:
                    data = permute_rotary(data, num_heads)
                elif arch == "llama" and ours == ".lora_b" and ".k_proj." in hf:
                    data = permute_rotary(data, num_kv_heads)
                out[gguf_name + ours] = data.astype(np.float32)
    return out


def write_gguf_lora(
    path: Path,
    tensors: dict[str, np.ndarray],
    *,
    arch: str = "llama",
    alpha: float | None = 16.0,
    qtype: str = "F32",
    fields: dict[str, Any] | None = None,
) -> Path:
    """A GGUF LoRA file holding `tensors` (alpha None: no adapter.lora.alpha key); `fields`
    replace or add string / float metadata (a value of None drops the key)."""
    writer = gguf.GGUFWriter(str(path), arch)
    metadata: dict[str, Any] = {"general.type": "adapter", "adapter.type": "lora"}
    if alpha is not None:
        metadata["adapter.lora.alpha"] = float(alpha)  # the converter writes a float32
    for key, value in {**metadata, **(fields or {})}.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
    quant = gguf.GGMLQuantizationType[qtype]
    for name, data in tensors.items():
        if quant == gguf.GGMLQuantizationType.F32 or data.ndim < 2:
            writer.add_tensor(name, np.ascontiguousarray(data))
            continue
        try:
            writer.add_tensor(name, gguf.quants.quantize(data, quant), raw_dtype=quant)
        except gguf.QuantError:
            f16 = gguf.GGMLQuantizationType.F16
            writer.add_tensor(name, gguf.quants.quantize(data, f16), raw_dtype=f16)
    finish_gguf(writer)
    return path


def gguf_from_peft(peft_folder: Path, path: Path, *, alpha: float, qtype: str = "F32") -> Path:
    """The tiny Llama's (4 heads, 2 KV heads) adapter at `peft_folder` as a GGUF LoRA file."""
    tensors = converted(peft_folder, "llama", num_heads=4, num_kv_heads=2)
    return write_gguf_lora(path, tensors, arch="llama", alpha=alpha, qtype=qtype)
