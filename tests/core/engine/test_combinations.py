"""The feature combinations start-up refuses (engine/combinations.py): each is named before any
weights load, and the combinations that do run pass."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pagedserve.core.config import (
    EngineConfig,
    LoRAConfig,
    ParallelConfig,
    SpeculativeConfig,
)
from pagedserve.core.engine.combinations import refuse_unsupported
from pagedserve.core.models.arch import ArchConfig, VisionConfig
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.pooling_params import PoolerConfig

TEXT = ArchConfig(
    architecture="LlamaForCausalLM", vocab_size=64, hidden_size=16, intermediate_size=32,
    num_layers=2, num_heads=2, num_kv_heads=1, head_size=8, rms_norm_eps=1e-6,
    rope_theta=1e4, rope_scaling=None, max_position_embeddings=128,
    tie_word_embeddings=True, attention_bias=False,
)  # fmt: skip
VISION = replace(
    TEXT,
    architecture="Qwen2_5_VLForConditionalGeneration",
    vision=VisionConfig(
        depth=1, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=16
    ),  # fmt: skip
)
HF = ResolvedModel("hf", Path("model"), "model")
GGUF = ResolvedModel("gguf", Path("model.gguf"), "model")
GGUF_MMPROJ = ResolvedModel("gguf", Path("model.gguf"), "model", mmproj=Path("mmproj.gguf"))
TP2 = ParallelConfig(tensor_parallel_size=2)
DRAFT = SpeculativeConfig(speculative_method="draft", speculative_model="draft")
LORA = LoRAConfig(enable_lora=True)
EMBED = PoolerConfig()


@pytest.mark.parametrize(
    ("config", "resolved", "arch", "pooler", "message"),
    [
        (EngineConfig(parallel=TP2), HF, TEXT, EMBED, "task embed runs at tensor_parallel_size 1"),
        (EngineConfig(parallel=TP2, speculative=DRAFT), HF, TEXT, None,
         "speculative_method draft runs at tensor_parallel_size 1"),
        (EngineConfig(parallel=TP2), HF, VISION, None, "(images) runs at tensor_parallel_size 1"),
        (EngineConfig(), HF, VISION, EMBED, "(images) serves task generate, not embed"),
        (EngineConfig(speculative=DRAFT), HF, VISION, None,
         "(images) does not take speculative_method draft"),
    ],
)  # fmt: skip
def test_refused_combinations_are_named(
    config: EngineConfig,
    resolved: ResolvedModel,
    arch: ArchConfig,
    pooler: PoolerConfig | None,
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        refuse_unsupported(config, resolved, arch, pooler)


@pytest.mark.parametrize(
    ("config", "resolved", "arch", "pooler"),
    [
        (EngineConfig(parallel=TP2), GGUF, TEXT, None),
        (EngineConfig(parallel=TP2, lora=LORA), HF, TEXT, None),  # adapters sharded per rank
        (EngineConfig(parallel=TP2, lora=LORA), GGUF, TEXT, None),
        (EngineConfig(lora=LORA, speculative=DRAFT), GGUF, TEXT, None),
        (EngineConfig(), HF, TEXT, EMBED),
        (EngineConfig(lora=LORA), GGUF_MMPROJ, VISION, None),  # llama.cpp's two files
    ],
)
def test_combinations_that_run_pass(
    config: EngineConfig, resolved: ResolvedModel, arch: ArchConfig, pooler: PoolerConfig | None
) -> None:
    refuse_unsupported(config, resolved, arch, pooler)
