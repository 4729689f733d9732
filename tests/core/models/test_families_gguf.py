"""The families llama.cpp defines, from GGUF files converted in the fixture with the `gguf`
package the way llama.cpp's converter lays them out (Mixtral as a "llama" with stacked
experts, Qwen3 q/k norms, Qwen MoE routers and shared experts): an F32 file holds the source
weights exactly, so its logits must equal the source transformers model's; a Q8_0 file must
stay within Q8_0's error of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.common.tiny_models import write_gguf_model
from pagedserve.core.attention.reference import TorchReferenceBackend
from pagedserve.core.models import load_model
from pagedserve.core.models.resolve import resolve_model
from tests.core.models.paged_driver import PagedBatch

PROMPT = [3, 17, 42, 99, 7, 250, 11, 64, 128, 5, 77, 31]
FAMILIES = {
    "qwen3": {},
    "qwen3_moe": {},
    "qwen2_moe": {},
    "mixtral": {},
}


def load(path: Path):
    return load_model(
        resolve_model(str(path)),
        dtype=torch.float32,
        device=torch.device("cpu"),
        attention=TorchReferenceBackend(),
        progress=False,
    )


@pytest.mark.parametrize("family", list(FAMILIES))
def test_f32_gguf_equals_its_source_model(tmp_path: Path, family: str) -> None:
    path = tmp_path / f"{family}.gguf"
    source = write_gguf_model(path, family, qtype="F32", seed=21, **FAMILIES[family])
    model, arch = load(path)
    assert arch.architecture == family
    with torch.no_grad():
        expected = source(torch.tensor([PROMPT])).logits[0].float()
    batch = PagedBatch(model, arch)
    got = torch.cat([batch.step([PROMPT[:8]])] + [batch.step([[t]]) for t in PROMPT[8:]])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_q8_gguf_experts_close_to_f32(tmp_path: Path, family: str) -> None:
    """Quantized [experts, out, in] tensors dequantize per expert: Q8_0 logits stay within
    Q8_0's error (5% of the logits' range) of the same model's F32 file."""
    logits = []
    for qtype in ("F32", "Q8_0"):
        path = tmp_path / f"{family}-{qtype}.gguf"
        write_gguf_model(path, family, qtype=qtype, seed=22, **FAMILIES[family])
        model, arch = load(path)
        logits.append(PagedBatch(model, arch).step([PROMPT]))
    f32, q8 = logits
    assert 0 < (q8 - f32).abs().max() < 0.05 * f32.abs().max()
