"""The bundled SmolLM2-135M-Instruct GGUF (Q4_1): pagedserve in fp32 against transformers in fp32
on the same file, which dequantizes and un-permutes the weights by its own code."""

from __future__ import annotations

import pytest
import torch

from pagedserve.core.attention.reference import TorchReferenceBackend
from pagedserve.core.models import load_model
from pagedserve.core.models.resolve import DEFAULT_NAME, ResolvedModel
from tests.core.models.paged_driver import PagedBatch, greedy_generate

# The chat template applied to "What is the capital of France?" (37 tokens) and a plain text
# prefix (17 tokens), as the GGUF's own tokenizer encodes them.
CHAT_PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
               411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47,
               2, 198, 1, 520, 9531, 198]  # fmt: skip
TEXT_PROMPT = [504, 273, 2450, 659, 70, 13842, 7821, 8889, 284, 2396, 281, 6450, 29, 2961, 5158,
               588, 338]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Batch-1 decode is dozens of tiny ops per layer; on a shared 2-core machine every
    multithreaded tiny op can wait milliseconds at its barrier, so one thread is both faster
    and steadier here."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def models(default_model: ResolvedModel, hf_default_model, one_thread):
    ours, arch = load_model(
        default_model,
        dtype=torch.float32,
        device=torch.device("cpu"),
        attention=TorchReferenceBackend(),
        progress=False,
    )
    return ours, arch, hf_default_model


def test_default_model_resolves(default_model: ResolvedModel) -> None:
    assert default_model.format == "gguf"
    assert default_model.name == DEFAULT_NAME
    assert default_model.path.is_file()


def test_arch_of_default_model(models) -> None:
    _, arch, _ = models
    assert (arch.architecture, arch.num_layers, arch.hidden_size) == ("llama", 30, 576)
    assert (arch.num_heads, arch.num_kv_heads, arch.head_size) == (9, 3, 64)
    assert arch.tie_word_embeddings and arch.vocab_size == 49152


def test_prefill_and_decode_logits_match_transformers(models) -> None:
    ours, arch, theirs = models
    prefill, decode = TEXT_PROMPT[:14], TEXT_PROMPT[14:]
    batch = PagedBatch(ours, arch)
    got = torch.cat([batch.step([prefill])] + [batch.step([[t]]) for t in decode])
    with torch.no_grad():
        expected = theirs(torch.tensor([TEXT_PROMPT])).logits[0]
    assert (got - expected).abs().max() < 1e-3
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_greedy_generation_matches_transformers(models) -> None:
    ours, arch, theirs = models
    with torch.no_grad():
        out = theirs.generate(torch.tensor([CHAT_PROMPT]), do_sample=False, max_new_tokens=64)
    expected = out[0, len(CHAT_PROMPT) :].tolist()
    assert len(expected) == 64
    assert greedy_generate(ours, arch, CHAT_PROMPT, 64) == expected
