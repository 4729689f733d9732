"""A GGUF LoRA file, as llama.cpp's convert_lora_to_gguf.py writes it, as plain tensors.

    adapter = read_gguf_lora(path, base)     the AdapterWeights read_peft gives for the PEFT
                                             folder the file was converted from

The file (llama.cpp's src/llama-adapter.cpp reads the same): general.type "adapter",
adapter.type "lora", adapter.lora.alpha, general.architecture (llama.cpp's name of the base:
it must be the served model's), and per adapted projection `blk.N.<llama.cpp name>.weight.lora_a`
(A [r, in]) and `.lora_b` (B [out, r]), f32, f16, bf16 or q8_0 (dequantized to float32).
llama.cpp's names map back to HF's through the gguf package's tensor name map, the one the
converter maps with. The scaling is llama.cpp's: alpha / r, or 1 where alpha is 0 or missing
(the converter writes lora_alpha alone: an rsLoRA adapter loses its sqrt, in llama.cpp too).
In a "llama" file the rows of q's and k's B are in llama.cpp's rotary order (the converter
permutes them as it permutes the base's q/k weights): they go back to HF's.

Refused with a LoRAError naming it: a GGUF that is not a LoRA adapter (a model, a control
vector), another architecture than the base's, activated LoRA (invocation tokens), tensors of
anything but the decoder projections (token_embd, output, norms, experts), an A without its B,
shapes that are not [r, in] and [out, r].
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf.quants import dequantize

from pagedserve.core.gguf_reader import gguf_reader
from pagedserve.core.lora.peft import TARGET_MODULES, AdapterWeights
from pagedserve.core.lora_request import LoRAError

LLAMA_CPP_ARCHITECTURES = {
    "llama": "llama",
    "mistral": "llama",  # convert_hf_to_gguf.py's LlamaModel converts all three
    "mixtral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen2_moe": "qwen2moe",
    "qwen3_moe": "qwen3moe",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",  # with images: the language model converts as gemma3 too
    "phi3": "phi3",
    "qwen2_5_vl": "qwen2vl",
}
"""Each family (ArchConfig.architecture) -> the general.architecture llama.cpp's converter
writes for it (the GGUF loader's GGUF_ARCHITECTURES is the other way; a test holds them equal)."""

ROTARY_PERMUTED = "llama"
"""The llama.cpp architecture whose q/k rows the converter permutes (LlamaModel.undo_permute)."""

_TENSOR = re.compile(r"^(.*\.weight)\.lora_([ab])$")
_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class LoraBase:
    """What reading a GGUF adapter needs of the served model."""

    family: str
    """ArchConfig.architecture (the HF model_type)."""
    num_heads: int
    num_kv_heads: int


def read_gguf_lora(path: str | Path, base: LoraBase) -> AdapterWeights:
    """The adapter in a GGUF LoRA file for `base`; LoRAError naming what is wrong."""
    file = Path(path)
    if not file.is_file():
        raise LoRAError(f"lora_path {str(path)!r} is not a file (a GGUF adapter's)")
    try:
        reader = gguf_reader(file)
    except (ValueError, OSError, IndexError, KeyError) as e:
        raise LoRAError(f"{file}: not a readable GGUF file ({e})") from e
    alpha, arch = _check_header(reader, file, base)
    adapter = AdapterWeights(rank=0)
    for (layer, module), (a, b) in sorted(_pairs(reader, file, arch).items()):
        if arch == ROTARY_PERMUTED and module in ("q_proj", "k_proj"):
            b = b[_hf_rows(b.shape[0], base.num_heads if module == "q_proj" else base.num_kv_heads)]
        adapter.add((layer, module), a, b, lambda r: alpha / r if alpha else 1.0)
    if not adapter.modules:
        raise LoRAError(f"{file}: the adapter holds no LoRA weights")
    return adapter


def _field(reader: Any, key: str) -> Any:
    """A scalar or string metadata value, or None."""
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    if field.types and field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(value).decode("utf-8", errors="replace")
    return value.item() if value.size == 1 else value.tolist()


def _check_header(reader: Any, file: Path, base: LoraBase) -> tuple[float, str]:
    """The adapter's alpha and llama.cpp architecture, after checking the file is a LoRA
    adapter for the base's."""
    kind = _field(reader, "general.type")
    if kind != "adapter":
        what = "missing" if kind is None else repr(kind)
        raise LoRAError(f"{file}: general.type is {what}, not 'adapter': a model GGUF, "
                        "not a LoRA adapter")  # fmt: skip
    adapter_type = _field(reader, "adapter.type")
    if adapter_type != "lora":
        raise LoRAError(f"{file}: adapter.type {adapter_type!r}: only 'lora' is supported")
    if reader.fields.get("adapter.alora.invocation_tokens") is not None:
        raise LoRAError(f"{file}: adapter.alora.invocation_tokens (activated LoRA) is not "
                        "supported")  # fmt: skip
    arch, want = _field(reader, "general.architecture"), LLAMA_CPP_ARCHITECTURES.get(base.family)
    if want is None:
        raise LoRAError(f"GGUF adapters are not supported for the model's family {base.family!r}")
    if arch != want:
        raise LoRAError(f"{file}: the adapter's general.architecture is {arch!r}, the served "
                        f"model's is {want!r} ({base.family})")  # fmt: skip
    alpha = _field(reader, "adapter.lora.alpha")
    if alpha is not None and not isinstance(alpha, int | float):
        raise LoRAError(f"{file}: adapter.lora.alpha must be a number, got {alpha!r}")
    return float(alpha or 0.0), str(arch)


def _pairs(
    reader: Any, file: Path, arch: str
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """(layer, HF module) -> (A, B) as float32, every tensor's name checked."""
    blocks = [int(m[1]) for t in reader.tensors if (m := _BLOCK.match(t.name))]
    modules = _hf_modules(arch, 1 + max(blocks, default=-1))
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for tensor in reader.tensors:
        match = _TENSOR.match(tensor.name)
        if match is None:
            raise LoRAError(f"adapter tensor {tensor.name!r}: not a lora_a or lora_b weight")
        key = modules.get(match[1])
        if key is None:
            raise LoRAError(f"adapter tensor {tensor.name!r}: {match[1]} is not a decoder "
                            f"projection that takes adapters ({', '.join(TARGET_MODULES)})")  # fmt: skip
        halves.setdefault(key, {})[match[2]] = _to_tensor(tensor, file)
    pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), half in halves.items():
        if set(half) != {"a", "b"}:
            raise LoRAError(f"layer {layer} {module}: lora_a and lora_b must both be present")
        pairs[(layer, module)] = (half["a"], half["b"])
    return pairs


@functools.lru_cache(maxsize=8)
def _hf_modules(arch: str, num_blocks: int) -> dict[str, tuple[int, str]]:
    """llama.cpp's tensor name (`blk.N.attn_q.weight`) -> (N, HF module) for the projections
    that take adapters, as the converter names them (the gguf package's map for `arch`)."""
    known = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in known:
        return {}
    names = gguf.get_tensor_name_map(known[arch], num_blocks)
    found: dict[str, tuple[int, str]] = {}
    for layer in range(num_blocks):
        for module in TARGET_MODULES:
            for parent in ("self_attn", "mlp"):  # HF Llama's (peft.py's) two parents
                name = names.get_name(f"model.layers.{layer}.{parent}.{module}")
                if name is not None:
                    found[f"{name}.weight"] = (layer, module)
    return found


def _to_tensor(tensor: Any, file: Path) -> torch.Tensor:
    """A GGUF tensor dequantized to float32, in torch's order (GGUF lists dims innermost first)."""
    try:
        qtype = gguf.GGMLQuantizationType(tensor.tensor_type)
        values = dequantize(tensor.data, qtype)
    except (ValueError, NotImplementedError) as e:
        raise LoRAError(f"{file}: tensor {tensor.name!r} has an unsupported type ({e})") from e
    shape = tuple(int(d) for d in reversed(tensor.shape))
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))


def _hf_rows(num_rows: int, num_heads: int) -> torch.Tensor:
    """The permutation taking llama.cpp's rotary row order back to HF's: within each head, HF
    row (half s, index j) is stored at row 2 j + s (LlamaModel.permute in the converter)."""
    head = num_rows // num_heads
    if head * num_heads != num_rows or head % 2:
        raise LoRAError(f"lora_b has {num_rows} rows: not {num_heads} heads of an even size")
    order = torch.arange(num_rows).reshape(num_heads, head // 2, 2)
    return order.transpose(1, 2).reshape(-1)
