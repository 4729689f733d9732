"""models.decoder_stack: the whole stack in one native call gives the per-layer path's hidden
states bit for bit, applies only where every layer runs natively, and refuses bad steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.common.tiny_models import write_hf_model
from pagedserve.core.attention.native import NativeAttentionBackend
from pagedserve.core.attention.reference import TorchReferenceBackend
from pagedserve.core.models import load_model
from pagedserve.core.models.decoder_stack.stack import DecoderStack
from pagedserve.core.models.resolve import resolve_model
from pagedserve.core.ops.linear import native_linear_available
from tests.core.models.paged_driver import PagedBatch

needs_kernel = pytest.mark.skipif(
    not native_linear_available(), reason="no native linear kernel below ISA level avx2"
)
PROMPTS = ([3, 17, 42, 99, 7, 250, 11, 64, 128], [5, 77, 31, 2, 9])


def load(folder: Path, dtype: torch.dtype, attention=None):
    return load_model(
        resolve_model(str(folder)),
        dtype=dtype,
        device=torch.device("cpu"),
        attention=attention or NativeAttentionBackend(),
        progress=False,
    )


def hidden_states(model, arch, dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    """Final hidden rows (before the lm_head) of three steps over two requests: both prefill,
    a decode next to a prefill chunk, then two decodes (the KV cache in dtype)."""
    batch = PagedBatch(model, arch, num_reqs=2, page_size=4, dtype=dtype)
    outputs = []
    real_forward = model.forward

    def capture(*args):
        hidden = real_forward(*args)
        outputs.append(hidden.clone())
        return hidden

    model.forward = capture
    try:
        batch.step([PROMPTS[0][:6], PROMPTS[1][:3]])
        batch.step([[PROMPTS[0][6]], PROMPTS[1][3:]])
        batch.step([[PROMPTS[0][7]], [PROMPTS[1][0]]])
    finally:
        del model.forward  # the class's method again
    return outputs


@needs_kernel
@pytest.mark.parametrize("architecture", ["llama", "qwen2"])  # qwen2: q/k/v bias
def test_stack_equals_the_layers_one_by_one(tmp_path: Path, architecture: str) -> None:
    model, arch = load(write_hf_model(tmp_path / "m", architecture, seed=8), torch.bfloat16)
    assert model.stack is not None
    fused = hidden_states(model, arch)
    stack, model.stack = model.stack, None
    by_layer = hidden_states(model, arch)
    assert len(fused) == len(by_layer) == 3
    for got, want in zip(fused, by_layer, strict=True):
        assert torch.equal(got, want)
    model.stack = stack


def test_stack_only_where_every_layer_runs_natively(tmp_path: Path) -> None:
    folder = write_hf_model(tmp_path / "m", "llama", seed=9)
    fp32, _ = load(folder, torch.float32)
    assert fp32.stack is None  # the transformers oracle path stays layer by layer in torch
    reference, _ = load(folder, torch.bfloat16, TorchReferenceBackend())
    assert reference.stack is None
    native, _ = load(folder, torch.bfloat16)
    assert (native.stack is not None) == native_linear_available()
    native.to(torch.float32)  # moves the weights the stack pointed at
    assert native.stack is None


@needs_kernel
def test_bad_step_is_refused(tmp_path: Path) -> None:
    model, arch = load(write_hf_model(tmp_path / "m", "llama", seed=10), torch.bfloat16)
    batch = PagedBatch(model, arch, num_reqs=1, page_size=4, dtype=torch.bfloat16)
    batch.step([PROMPTS[0][:4]])
    stack = model.stack
    hidden = torch.zeros(1, arch.hidden_size, dtype=torch.bfloat16)
    cos = model.rope_cos[:1].unsqueeze(1)
    meta_args = dict(
        slot_mapping=torch.tensor([4], dtype=torch.int64),
        page_table=batch.page_table,
        seq_lens=torch.tensor([5], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        max_query_len=1,
        max_seq_len=5,
    )
    from pagedserve.core.attention.base import AttentionMetadata

    good = AttentionMetadata(**meta_args)
    stack(hidden.clone(), cos, cos, batch.kv_caches, good)  # valid
    with pytest.raises(ValueError, match="hidden"):
        stack(hidden.float(), cos, cos, batch.kv_caches, good)
    with pytest.raises(ValueError, match="kv caches"):
        stack(hidden.clone(), cos, cos, batch.kv_caches[:-1], good)
    with pytest.raises(ValueError, match="seq_lens"):
        stack(hidden.clone(), cos, cos, batch.kv_caches,
              AttentionMetadata(**{**meta_args, "seq_lens": torch.tensor([5])}))  # fmt: skip
    slots = batch.kv_caches[0].shape[1] * batch.kv_caches[0].shape[3]
    with pytest.raises(ValueError, match="slot"):  # the native cache write's own check
        stack(hidden.clone(), cos, cos, batch.kv_caches,
              AttentionMetadata(**{**meta_args, "slot_mapping": torch.tensor([slots])}))  # fmt: skip


@needs_kernel
def test_stack_takes_each_layers_window_and_softcap(tmp_path: Path) -> None:
    """Per-layer attention options (issue 11) reach the native stack as they reach the
    per-layer path: alternating local (window 3, under the 4-token page) and capped layers."""
    model, arch = load(write_hf_model(tmp_path / "m", "llama", seed=9), torch.bfloat16)
    plain = hidden_states(model, arch)
    for i, layer in enumerate(model.layers):
        layer.sliding_window = 3 if i % 2 == 0 else 0
        layer.logit_softcap = 0.0 if i % 2 == 0 else 0.5
    model.stack = DecoderStack.build(model.layers)
    assert model.stack is not None
    fused = hidden_states(model, arch)
    model.stack = None
    by_layer = hidden_states(model, arch)
    for got, want in zip(fused, by_layer, strict=True):
        assert torch.equal(got, want)
    assert not torch.equal(fused[0], plain[0])  # the options took effect
