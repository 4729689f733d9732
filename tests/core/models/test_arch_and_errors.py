"""ArchConfig parsing from both config.json generations, rope tables, and loader errors."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from bench.common.tiny_models import permute_rotary
from pagedserve.core.models.families import arch_from_hf_config
from pagedserve.core.models.layers import rope_inv_freq
from pagedserve.core.models.loader_gguf import iter_gguf_weights, open_gguf, unpermute_rotary

BASE = {
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def test_transformers_4_style_rope_keys() -> None:
    arch = arch_from_hf_config({**BASE, "rope_theta": 5e5, "rope_scaling": LLAMA3})
    assert arch.rope_theta == 5e5 and arch.rope_scaling["rope_type"] == "llama3"
    assert (arch.head_size, arch.num_kv_heads, arch.attention_bias) == (16, 2, False)


def test_transformers_5_style_rope_parameters() -> None:
    arch = arch_from_hf_config({**BASE, "rope_parameters": {"rope_theta": 1e6, **LLAMA3}})
    assert arch.rope_theta == 1e6 and arch.rope_scaling["factor"] == 8.0
    plain = arch_from_hf_config(
        {**BASE, "rope_parameters": {"rope_theta": 1e4, "rope_type": "default"}}
    )
    assert plain.rope_scaling is None


def test_qwen2_has_qkv_bias_and_mistral_is_llama() -> None:
    assert arch_from_hf_config({**BASE, "model_type": "qwen2"}).attention_bias
    mistral = arch_from_hf_config({**BASE, "model_type": "mistral", "sliding_window": None})
    assert mistral.architecture == "mistral" and not mistral.attention_bias


@pytest.mark.parametrize(
    "override,match",
    [
        ({"model_type": "gpt2"}, "architecture 'gpt2' is not supported"),
        ({"num_key_value_heads": 3}, "num_kv_heads"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ],
)
def test_unsupported_configs(override: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        arch_from_hf_config({**BASE, **override})


def test_llama3_inv_freq_matches_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(**{k: v for k, v in BASE.items() if k != "model_type"},
                         rope_scaling=LLAMA3, rope_theta=5e5)  # fmt: skip
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    got = rope_inv_freq(16, 5e5, LLAMA3)
    torch.testing.assert_close(got, expected.float())
    assert not torch.equal(got, rope_inv_freq(16, 5e5, None))  # scaling did something


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    weight = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    permuted = torch.from_numpy(permute_rotary(weight, 8))
    assert not torch.equal(permuted, torch.from_numpy(weight))
    assert torch.equal(unpermute_rotary(permuted, 8), torch.from_numpy(weight))


def write_gguf(path: Path, arch: str, tensors: dict[str, np.ndarray]) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in [("embedding_length", 8), ("feed_forward_length", 16), ("block_count", 1),
                       ("context_length", 32), ("vocab_size", 4)]:  # fmt: skip
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_unsupported_architecture(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", "gpt2", {"x.weight": np.zeros(8, np.float32)})
    with pytest.raises(ValueError, match="GGUF architecture 'gpt2' is not supported"):
        open_gguf(path)


def test_gguf_unsupported_tensor_type(tmp_path: Path) -> None:
    tensors = {"token_embd.weight": np.zeros((4, 8), np.int32)}
    arch, reader = open_gguf(write_gguf(tmp_path / "m.gguf", "llama", tensors))
    with pytest.raises(ValueError, match="'token_embd.weight' has unsupported type I32"):
        list(iter_gguf_weights(reader, arch))


def test_gguf_unknown_tensor_name(tmp_path: Path) -> None:
    tensors = {"blk.0.attn_qkv.weight": np.zeros((8, 8), np.float32)}
    arch, reader = open_gguf(write_gguf(tmp_path / "m.gguf", "llama", tensors))
    with pytest.raises(ValueError, match="attn_qkv"):
        list(iter_gguf_weights(reader, arch))
