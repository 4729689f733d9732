"""What the families do not implement is refused at load with an error naming the field,
never a model that loads and then produces wrong tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.common.tiny_models import write_hf_model
from pagedserve.core.attention.base import AttentionBackend
from pagedserve.core.models import load_model
from pagedserve.core.models.families import arch_from_hf_config
from pagedserve.core.models.resolve import resolve_model
from tests.core.models.test_arch_and_errors import BASE as ARCH_BASE

BASE = {**ARCH_BASE, "max_position_embeddings": 256}


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"model_type": "gpt2"}, "architecture 'gpt2' is not supported"),
        ({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
        ({"model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
         "rope_scaling type 'dynamic'"),
        ({"model_type": "llama", "hidden_act": "relu"}, "'hidden_act'"),
        ({"model_type": "llama", "mlp_bias": True}, "'mlp_bias'"),
        ({"model_type": "qwen3", "use_sliding_window": True, "sliding_window": 8},
         "'use_sliding_window'"),
        ({"model_type": "phi3", "partial_rotary_factor": 0.5}, "'partial_rotary_factor'"),
        ({"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 6},
         "num_experts_per_tok"),
        ({"model_type": "gemma2", "layer_types": ["sliding_attention", "chunked_attention"],
          "sliding_window": 8}, "layer_types"),
        ({"model_type": "gemma3_text", "sliding_window": 8, "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
         "'rope_parameters.sliding_attention'"),
        ({"model_type": "gemma3_text", "use_bidirectional_attention": True},
         "'use_bidirectional_attention'"),
    ],
)  # fmt: skip
def test_unsupported_config_fields_are_named(config: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        arch_from_hf_config({**BASE, **config})


class NoWindowBackend(AttentionBackend):
    """A backend whose kernels take no per-layer options (as every backend did before)."""

    name = "no-window"

    def forward(self, query, key, value, kv_cache, meta, scale):  # noqa: ANN001, ANN201
        raise AssertionError("never reached: the model must be refused at load")


def load_without_window(folder: Path) -> None:
    load_model(
        resolve_model(str(folder)),
        dtype=torch.float32,
        device=torch.device("cpu"),
        attention=NoWindowBackend(),
        progress=False,
    )


@pytest.mark.parametrize(
    ("family", "config", "field"),
    [
        ("mistral", {"sliding_window": 8}, "sliding_window"),
        ("gemma2", {"sliding_window": 4096, "attn_logit_softcapping": 50.0}, "logit_softcap"),
    ],
)
def test_window_refused_by_a_backend_without_it(
    tmp_path: Path, family: str, config: dict, field: str
) -> None:
    folder = write_hf_model(tmp_path / "m", family, seed=1, **config)
    with pytest.raises(ValueError, match=f"'{field}'"):
        load_without_window(folder)


def test_experts_in_an_unknown_layout_are_refused(tmp_path: Path) -> None:
    """A checkpoint with weights we have no slot for fails at load, naming the weight."""
    from safetensors.torch import save_file

    folder = write_hf_model(tmp_path / "m", "qwen3_moe", seed=2)
    save_file({"model.layers.0.mlp.experts.gate_up_proj": torch.zeros(4, 64, 64)},
              str(folder / "extra.safetensors"))  # fmt: skip
    with pytest.raises(ValueError, match="experts.gate_up_proj"):
        load_without_window(folder)
